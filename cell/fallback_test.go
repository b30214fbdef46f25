package cell_test

import (
	"fmt"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
)

// TestMemcachedDownAndBack: memcached stops (its port closes) while a cell
// serves: opens go on under the in-process transaction cap, grab answers from
// the database and then from the in-process copy, and the metrics say both
// fall back. Memcached comes back: within seconds both use it again, and the
// grab cache does not serve a copy from before the outage.
func TestMemcachedDownAndBack(t *testing.T) {
	proxy := testenv.NewProxy(testenv.Memcached(t))
	proxy.Start(t)
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.Memcached = []string{proxy.Addr()}
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		cfg.OpenStrategy = cell.StrategyBatched // every batch takes the memcached slot (grouped skips it for a lone open)
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
	// The open's worker writes the copy after it has answered: a grab
	// waits for it (the count drops to want), then must come from src.
	grabAfterOpen := func(want int64, src, what string) {
		t.Helper()
		var g api.GrabResponse
		waitFor(t, 5*time.Second, func() bool { g = grab(); return g.Remaining == want }, fmt.Sprintf("%s: remaining %d", what, want))
		if src != "" && g.Source != src {
			t.Fatalf("%s: %+v, want source %s", what, g, src)
		}
	}
	openOne(t, c, nil, id, pre+"-u1")
	grabAfterOpen(4, "cache", "grab with memcached up")

	proxy.Stop()
	openOne(t, c, nil, id, pre+"-u2") // the transaction cap counts in-process
	grabAfterOpen(3, "", "first grab with memcached down")
	if g := grab(); g.Remaining != 3 || g.Source == "cache" {
		t.Fatalf("first grab with memcached down: %+v", g)
	}
	openOne(t, c, nil, id, pre+"-u3")
	grabAfterOpen(2, "local", "grab from the in-process copy")
	m := scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_memcached_fallback{use="slots"}`, "1")
	wantMetric(t, m, `redcell_memcached_fallback{use="grab_cache"}`, "1")
	if metricValue(t, m, `redcell_grab_cache_fallbacks_total`) == "0" || metricValue(t, m, `redcell_memcached_fallbacks_total`) == "0" {
		t.Fatal("fallbacks not counted")
	}

	proxy.Start(t) // the same port: memcached is back
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
