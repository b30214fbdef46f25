package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// hungCell accepts connections on addr (a free one for "") and never
// answers, as a stopped or wedged cell process does; stop closes it.
func hungCell(t *testing.T, addr string) (string, func()) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read
		}
	}()
	stop := func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// TestProberDropsAHungCell: a cell that accepts connections but never
// answers is out of the router's map after Failures probes, so its shards
// are answered 503 CELL_UNAVAILABLE at once instead of after the request
// timeout, and /healthz names it; once it answers again (even 503, a cell
// whose database is down) it is back after Recoveries probes; the other
// cell is served throughout.
func TestProberDropsAHungCell(t *testing.T) {
	var aHits, bHits atomic.Int64
	signer := api.NewSigner(testSecret)
	a := serveCell(t, func(rc *fasthttp.RequestCtx) {
		if string(rc.Path()) == api.LivePath { // the probes: unsigned, as a load balancer's
			rc.SetStatusCode(200)
			return
		}
		aHits.Add(1)
		if !signer.VerifyRequest(&rc.Request, time.Now()) {
			t.Errorf("router forwarded %s %s without a valid signature", rc.Method(), rc.RequestURI())
		}
		rc.SetBodyString(`{}`)
	})
	b, stopHung := hungCell(t, "")
	low, _ := sharding.ParseRanges("0-499")
	high, _ := sharding.ParseRanges("500-999")
	gossip := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: a, Shards: low, Version: 3}, {Name: "b", Addr: b, Shards: high, Version: 3}})
	gossip.m.Store(m)
	reg := prometheus.NewRegistry()
	p, err := NewProber(gossip, ProbeConfig{Interval: 50 * time.Millisecond, Timeout: 30 * time.Millisecond, Failures: 3, Recoveries: 2},
		reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if p.Map() != m {
		t.Fatal("with no probe run yet the map is not gossip's own")
	}
	url := startRouterWith(t, p, func(c *Config) { c.RequestTimeout = 2 * time.Second }, nil)
	probes, stopProbes := context.WithCancel(t.Context())
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		clock.Every(probes, clock.Real{}, 50*time.Millisecond, func(int) { p.probeAll(t.Context()) })
	}()
	defer func() { stopProbes(); <-probed }()

	waitFor := func(what string, ok func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		testenv.WaitFor(t, 10*time.Second, what, ok)
		return time.Since(start)
	}
	took := waitFor("the hung cell out of the map", func() bool { _, ok := p.Map().Owner(663); return !ok })
	if _, ok := p.Map().Owner(27); !ok {
		t.Fatal("the live cell left the map too")
	}
	if p.Map().Version != 3 || p.Map().Uncovered() != 500 {
		t.Fatalf("map without the hung cell: version %d, %d uncovered", p.Map().Version, p.Map().Uncovered())
	}
	start := time.Now()
	if st, code := get(t, url+"/v1/accounts/u1"); st != 503 || code != "CELL_UNAVAILABLE" || time.Since(start) > time.Second { // u1: shard 663
		t.Fatalf("a shard of the hung cell: %d %s after %s; want 503 CELL_UNAVAILABLE at once", st, code, time.Since(start))
	}
	if st, _ := get(t, url+"/v1/accounts/bob"); st != 200 || aHits.Load() != 1 { // bob: shard 27
		t.Fatalf("the live cell: %d, %d hits", st, aHits.Load())
	}
	var h struct {
		Out       []string `json:"cells_out"`
		Uncovered int      `json:"uncovered_shards"`
	}
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if len(h.Out) != 1 || h.Out[0] != "b" || h.Uncovered != 500 {
		t.Fatalf("router /healthz: %+v; want cell b out and 500 shards uncovered", h)
	}
	if v := testutil.ToFloat64(p.healthy.WithLabelValues("b")); v != 0 {
		t.Fatalf("healthy{b} %v", v)
	}
	if v := testutil.ToFloat64(p.drops); v != 1 {
		t.Fatalf("drops %v", v)
	}
	if bHits.Load() != 0 {
		t.Fatal("the hung cell was reached")
	}

	// A new process of b (a later start stamp from gossip), at the same
	// address: probed afresh, in the map at once, out again when it does
	// not answer either.
	m2, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: a, Shards: low, Version: 3}, {Name: "b", Addr: b, Shards: high, Version: 3, Started: 99}})
	gossip.m.Store(m2)
	if _, ok := p.Map().Owner(663); !ok {
		t.Fatal("a restarted process was held out for its predecessor's failures")
	}
	waitFor("the new hung process out of the map", func() bool { _, ok := p.Map().Owner(663); return !ok })
	m = m2

	// It answers again, 503 (its database down): that is alive.
	stopHung()
	ln, err := net.Listen("tcp", b)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) { bHits.Add(1); rc.SetStatusCode(503) }}
	go srv.Serve(ln)
	defer srv.Shutdown()
	back := waitFor("the cell back in the map", func() bool { _, ok := p.Map().Owner(663); return ok })
	if p.Map() != m {
		t.Fatal("with every cell answering the map is not gossip's own")
	}
	if v := testutil.ToFloat64(p.healthy.WithLabelValues("b")); v != 1 {
		t.Fatalf("healthy{b} %v after it answered", v)
	}
	t.Logf("out of the map %s after the probes began (3 failures at 50 ms), back %s after it answered (2 probes)", took.Round(time.Millisecond), back.Round(time.Millisecond))

	// A cell gossip no longer lists is forgotten.
	only, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: a, Shards: low}})
	gossip.m.Store(only)
	waitFor("the departed cell forgotten", func() bool { return p.Map() == only && testutil.CollectAndCount(p.healthy) == 1 })
}

// TestProbeConfig: the bounds Validate enforces.
func TestProbeConfig(t *testing.T) {
	if err := DefaultProbeConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (ProbeConfig{}).Validate(); err != nil {
		t.Fatalf("probes off: %v", err)
	}
	for _, bad := range []ProbeConfig{
		{Interval: 5 * time.Millisecond, Timeout: time.Millisecond, Failures: 1, Recoveries: 1},
		{Interval: time.Second, Timeout: 2 * time.Second, Failures: 1, Recoveries: 1},
		{Interval: time.Second, Timeout: time.Millisecond, Failures: 0, Recoveries: 1},
		{Interval: time.Second, Timeout: time.Millisecond, Failures: 1, Recoveries: 101},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
