package membership

import (
	"fmt"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestMapVersions runs real memberlist nodes on loopback: when two cells
// announce one shard range, every member's map gives it to the higher map
// version (a tie to the name sorting first), the map carries the highest
// version announced, and when the winner leaves, the range goes back to the
// other claimant at once, without waiting for any timeout.
func TestMapVersions(t *testing.T) {
	p := testenv.FreePorts(t, 7)
	routerG, aG, aH, bG, bH, cG, cH := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	c := newTestCluster(t)
	c.seeds = []string{fmt.Sprintf("127.0.0.1:%d", routerG), fmt.Sprintf("127.0.0.1:%d", aG)}
	var seen mapLog
	router := c.join("router", "router-test", routerG, Meta{Role: RoleRouter}, seen.add)
	a := c.join("cell-a", "cell-a", aG, Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", aH), Shards: "0-499", Version: 1}, nil)
	owner := func(m *sharding.Map, s model.ShardID) string {
		o, ok := m.Owner(s)
		if !ok {
			return ""
		}
		return o.Name
	}
	if d, ok := waitMap(router, 10*time.Second, func(m *sharding.Map) bool { return owner(m, 0) == "cell-a" }); !ok {
		t.Fatalf("cell-a not in the router's map after %s", d)
	}

	// cell-b claims 400-999 under version 2: it takes 400-499 from cell-a.
	b := c.join("cell-b", "cell-b", bG, Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", bH), Shards: "400-999", Version: 2}, nil)
	wantB := func(m *sharding.Map) bool {
		return m.Version == 2 && owner(m, 399) == "cell-a" && owner(m, 400) == "cell-b" && owner(m, 499) == "cell-b" &&
			owner(m, 999) == "cell-b" && m.Uncovered() == 0
	}
	for _, n := range []*Node{router, a, b} {
		if d, ok := waitMap(n, 10*time.Second, wantB); !ok {
			m := n.Map()
			t.Fatalf("%s after %s: version %d, shard 400 to %q, 399 to %q; want v2, cell-b, cell-a", n.cfg.Name, d, m.Version, owner(m, 400), owner(m, 399))
		}
	}

	// cell-c claims 900-999 under version 2 too: the tie goes to cell-b, the
	// name sorting first, on every member.
	cc := c.join("cell-c", "cell-c", cG, Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", cH), Shards: "900-999", Version: 2}, nil)
	for _, n := range []*Node{router, a, b, cc} {
		if d, ok := waitMap(n, 10*time.Second, func(m *sharding.Map) bool { return len(m.Cells()) == 3 }); !ok {
			t.Fatalf("%s does not see cell-c after %s", n.cfg.Name, d)
		}
		if got := owner(n.Map(), 950); got != "cell-b" {
			t.Errorf("%s: shard 950 (v2 tie between cell-b and cell-c) goes to %q, want cell-b", n.cfg.Name, got)
		}
	}

	// cell-b leaves: 400-499 goes back to cell-a (v1) and 900-999 to cell-c.
	start := time.Now()
	if err := b.Leave(time.Second); err != nil {
		t.Fatalf("leave: %v", err)
	}
	back := func(m *sharding.Map) bool {
		return owner(m, 450) == "cell-a" && owner(m, 950) == "cell-c" && owner(m, 600) == "" && m.Uncovered() == 400
	}
	if d, ok := waitMap(router, rejoinLimit, back); !ok {
		m := router.Map()
		t.Fatalf("after cell-b left (%s): shard 450 to %q, 950 to %q, 600 to %q, %d uncovered", d, owner(m, 450), owner(m, 950), owner(m, 600), m.Uncovered())
	}
	t.Logf("the router's map changed back %s after cell-b's leave began; %d maps published in all", time.Since(start).Round(time.Millisecond), len(seen.all()))

	// Every map the router published is one the rules allow: versions never
	// go down while cell-b is in, and no shard ever has two owners (Map
	// guarantees one; check it routes 400 to a claimant).
	for i, m := range seen.all() {
		if o := owner(m, 400); o != "" && o != "cell-a" && o != "cell-b" {
			t.Errorf("map %d routes shard 400 to %q, which never claimed it", i, o)
		}
	}
}

// TestAnnounceHandsOver: a database handed over by a move (the new owner
// announces it under a higher version, then the old one announces its ranges
// without it) reaches every member's map, the announcing nodes' own maps
// included, within a second on loopback.
func TestAnnounceHandsOver(t *testing.T) {
	p := testenv.FreePorts(t, 5)
	routerG, aG, aH, bG, bH := p[0], p[1], p[2], p[3], p[4]
	c := newTestCluster(t)
	c.seeds = []string{fmt.Sprintf("127.0.0.1:%d", routerG)}
	router := c.join("router", "router-test", routerG, Meta{Role: RoleRouter}, nil)
	a := c.join("cell-a", "cell-a", aG, Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", aH), Shards: "0-499", Version: 1}, nil)
	b := c.join("cell-b", "cell-b", bG, Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", bH), Shards: "500-999", Version: 1}, nil)
	owner := func(m *sharding.Map, s model.ShardID) string {
		o, _ := m.Owner(s)
		return o.Name
	}
	for _, n := range []*Node{router, a, b} {
		if d, ok := waitMap(n, 10*time.Second, func(m *sharding.Map) bool { return m.Uncovered() == 0 }); !ok {
			t.Fatalf("%s: map not whole after %s", n.cfg.Name, d)
		}
	}
	// db_49 (shards 490-499) moves from cell-a to cell-b under version 2.
	if err := b.Announce("490-999", 2); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Node{router, a, b} {
		if d, ok := waitMap(n, time.Second, func(m *sharding.Map) bool { return owner(m, 495) == "cell-b" && owner(m, 489) == "cell-a" }); !ok {
			t.Fatalf("%s: db_49 not with cell-b %s after the adoption: %q", n.cfg.Name, d, owner(n.Map(), 495))
		}
	}
	if err := a.Announce("0-489", 2); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Node{router, a, b} {
		if d, ok := waitMap(n, time.Second, func(m *sharding.Map) bool {
			ca, _ := m.Owner(0)
			return ca.Shards.String() == "0-489" && ca.Version == 2 && owner(m, 495) == "cell-b" && m.Version == 2 && m.Uncovered() == 0
		}); !ok {
			t.Fatalf("%s: cell-a's release not seen after %s", n.cfg.Name, d)
		}
	}
}
