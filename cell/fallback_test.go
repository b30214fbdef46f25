package cell_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"redcell/cell"
	"redcell/cell/api"
	"redcell/internal/testenv"
)

// tcpProxy forwards a loopback port to a target; stopping it closes the port
// and every connection, as a memcached that stops would, and starting it
// again serves the same port.
type tcpProxy struct {
	addr, target string

	mu    sync.Mutex // guards ln, conns
	ln    net.Listener
	conns map[net.Conn]bool
}

func (p *tcpProxy) start(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln, p.addr, p.conns = ln, ln.Addr().String(), map[net.Conn]bool{}
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *tcpProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// TestMemcachedDownAndBack: memcached stops (its port closes) while a cell
// serves: opens go on under the in-process transaction cap, grab answers from
// the database and then from the in-process copy, and the metrics say both
// fall back. Memcached comes back: within seconds both use it again, and the
// grab cache does not serve a copy from before the outage.
func TestMemcachedDownAndBack(t *testing.T) {
	proxy := &tcpProxy{addr: "127.0.0.1:0", target: testenv.Memcached(t)}
	proxy.start(t)
	defer proxy.stop()
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.Memcached = []string{proxy.addr}
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 1000)
	id := c.send(t, sender, 1000, 5, "snd-1")
	grab := func() api.GrabResponse {
		var g api.GrabResponse
		if st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/grab", api.ActRequest{ActID: pre + "-g"}, &g); st != 200 {
			t.Fatalf("grab: %d %s", st, code)
		}
		return g
	}
	openOne(t, c, nil, id, pre+"-u1")
	if g := grab(); g.Source != "cache" || g.Remaining != 4 {
		t.Fatalf("grab with memcached up: %+v", g)
	}

	proxy.stop()
	openOne(t, c, nil, id, pre+"-u2") // the transaction cap counts in-process
	if g := grab(); g.Remaining != 3 || g.Source == "cache" {
		t.Fatalf("first grab with memcached down: %+v", g)
	}
	openOne(t, c, nil, id, pre+"-u3")
	if g := grab(); g.Source != "local" || g.Remaining != 2 {
		t.Fatalf("grab from the in-process copy: %+v", g)
	}
	m := scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_memcached_fallback{use="slots"}`, "1")
	wantMetric(t, m, `redcell_memcached_fallback{use="grab_cache"}`, "1")
	if metricValue(t, m, `redcell_grab_cache_fallbacks_total`) == "0" || metricValue(t, m, `redcell_memcached_fallbacks_total`) == "0" {
		t.Fatal("fallbacks not counted")
	}

	proxy.start(t) // the same port: memcached is back
	waitFor(t, 10*time.Second, func() bool {
		openOne(t, c, nil, id, pre+"-u4") // once: later calls repeat the claim
		return grab().Source == "cache"
	}, "grab served by memcached again")
	if g := grab(); g.Remaining != 1 {
		t.Fatalf("grab after memcached came back: %+v (a copy from before the outage?)", g)
	}
	m = scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_memcached_fallback{use="slots"}`, "0")
	wantMetric(t, m, `redcell_memcached_fallback{use="grab_cache"}`, "0")
}
