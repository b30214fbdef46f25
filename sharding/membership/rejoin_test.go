package membership

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// The rejoin tests run real memberlist nodes on loopback: a router-like node
// and two cells, as redcell runs them. A cell (or the router) is crashed —
// memberlist shut down without a leave, so the others must find out by probing
// — or leaves, and a new process comes back under the same name. The router's
// map must name the new process within rejoinLimit of the start of its Join,
// and never the old one again, not even when memberlist finally declares the
// old one dead.

// rejoinLimit is what docs/operations.md promises: a cell restarted under its
// name, on any address, serves its shards within 3 s.
const rejoinLimit = 3 * time.Second

// measureLimit bounds how long a failing test keeps waiting, to report how
// late the map caught up (memberlist's suspicion timeout is 18 s at most here).
const measureLimit = 45 * time.Second

// logBuffer collects a node's log; a failing test prints it.
type logBuffer = testenv.Buffer

// mapLog records every Map a node publishes, in order.
type mapLog struct {
	mu   sync.Mutex // guards maps
	maps []*sharding.Map
}

func (l *mapLog) add(m *sharding.Map) {
	l.mu.Lock()
	l.maps = append(l.maps, m)
	l.mu.Unlock()
}

func (l *mapLog) all() []*sharding.Map {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*sharding.Map(nil), l.maps...)
}

// testCluster is one test's members, by a label of the test's choosing.
type testCluster struct {
	t     *testing.T
	seeds []string
	logs  map[string]*logBuffer
	nodes []*Node
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, logs: map[string]*logBuffer{}}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			_ = n.Shutdown()
		}
		if t.Failed() {
			for label, b := range c.logs {
				t.Logf("--- log of %s ---\n%s", label, b.String())
			}
		}
	})
	return c
}

// join starts a member; label names its log (e.g. "cell-1 (second)").
func (c *testCluster) join(label, name string, gossipPort int, meta Meta, onChange func(*sharding.Map)) *Node {
	c.t.Helper()
	buf := &logBuffer{}
	c.logs[label] = buf
	n, err := Join(Config{
		Name: name, Bind: fmt.Sprintf("127.0.0.1:%d", gossipPort), Seeds: c.seeds, Meta: meta,
		Log:      slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("proc", label),
		onChange: onChange,
	})
	if err != nil {
		c.t.Fatalf("join %s: %v", label, err)
	}
	c.nodes = append(c.nodes, n)
	return n
}

func cellMeta(httpPort int, shards string) Meta {
	return Meta{Role: RoleCell, Addr: fmt.Sprintf("127.0.0.1:%d", httpPort), Shards: shards, Version: 1}
}

// waitMap checks ok on n's map each time n publishes a new one (and every
// 20 ms, for conditions on more than the map, such as the member count) until
// it holds or limit passes; it returns how long that took and whether ok held.
func waitMap(n *Node, limit time.Duration, ok func(*sharding.Map) bool) (time.Duration, bool) {
	start := time.Now()
	deadline := time.NewTimer(max(limit, 0))
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		changed := n.Changed()
		if ok(n.Map()) {
			return time.Since(start), true
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-deadline.C:
			return time.Since(start), ok(n.Map())
		}
	}
}

// waitRejoin waits up to rejoinLimit for n's map to satisfy ok, measured from
// start. When it does not, it keeps waiting up to measureLimit to report how
// long it did take, and fails the test.
func waitRejoin(t *testing.T, n *Node, what string, start time.Time, ok func(*sharding.Map) bool) time.Duration {
	t.Helper()
	if _, hit := waitMap(n, rejoinLimit-time.Since(start), ok); hit {
		return time.Since(start)
	}
	_, hit := waitMap(n, measureLimit, ok)
	if hit {
		t.Errorf("%s after %s, want within %s", what, time.Since(start).Round(time.Millisecond), rejoinLimit)
	} else {
		t.Errorf("%s: not after %s", what, time.Since(start).Round(time.Millisecond))
	}
	return time.Since(start)
}

// waitFor checks ok (testenv.Until) until it holds or limit passes, and
// answers how long that took.
func waitFor(limit time.Duration, ok func() bool) (time.Duration, bool) {
	start := time.Now()
	held := testenv.Until(limit, ok)
	return time.Since(start), held
}

// metaOf is the metadata of other's memberlist node as n last heard it, or
// nil when n does not know it.
func metaOf(n, other *Node) []byte {
	for _, m := range n.ml.Members() {
		if m.Name == other.node {
			return m.Meta
		}
	}
	return nil
}

// routesTo reports whether m sends shards from, to and one between to process
// n, which serves HTTP at addr.
func routesTo(m *sharding.Map, from, to model.ShardID, n *Node, addr string) bool {
	for _, s := range []model.ShardID{from, (from + to) / 2, to} {
		c, ok := m.Owner(s)
		if !ok || c.Name != n.cfg.Name || c.Addr != addr || c.Started != n.started {
			return false
		}
	}
	return true
}

// since returns the maps published from the first one that satisfies ok on,
// and false if none does.
func since(maps []*sharding.Map, ok func(*sharding.Map) bool) ([]*sharding.Map, bool) {
	for i, m := range maps {
		if ok(m) {
			return maps[i:], true
		}
	}
	return nil, false
}

func TestCellRejoin(t *testing.T) {
	for _, tc := range []struct {
		name      string
		graceful  bool // leave first (SIGTERM), else crash (kill -9)
		samePorts bool // the new process binds the old gossip and HTTP ports
	}{
		{"crash_new_ports", false, false},
		{"crash_same_ports", false, true},
		{"leave_new_ports", true, false},
		{"leave_same_ports", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cellRejoin(t, tc.graceful, tc.samePorts)
		})
	}
}

func cellRejoin(t *testing.T, graceful, samePorts bool) {
	p := testenv.FreePorts(t, 7)
	routerG, c1G, c1H, c2G, c2H, newG, newH := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	if samePorts {
		newG, newH = c1G, c1H
	}
	c := newTestCluster(t)
	c.seeds = []string{fmt.Sprintf("127.0.0.1:%d", routerG), fmt.Sprintf("127.0.0.1:%d", c1G), fmt.Sprintf("127.0.0.1:%d", c2G)}
	var seen mapLog
	router := c.join("router", "router-127.0.0.1:8080", routerG, Meta{Role: RoleRouter}, seen.add)
	old := c.join("cell-1", "cell-1", c1G, cellMeta(c1H, "0-499"), nil)
	cell2 := c.join("cell-2", "cell-2", c2G, cellMeta(c2H, "500-999"), nil)
	for _, n := range []*Node{router, old, cell2} {
		if _, ok := waitMap(n, 10*time.Second, func(m *sharding.Map) bool { return m.Uncovered() == 0 }); !ok {
			t.Fatalf("the cluster never formed: %d shards uncovered", n.Map().Uncovered())
		}
	}
	newAddr, c2Addr := fmt.Sprintf("127.0.0.1:%d", newH), fmt.Sprintf("127.0.0.1:%d", c2H)

	if graceful {
		if err := old.Leave(time.Second); err != nil {
			t.Fatalf("leave: %v", err)
		}
		if d, ok := waitMap(router, rejoinLimit, func(m *sharding.Map) bool { return m.Uncovered() == 500 }); !ok {
			t.Fatalf("cell-1 left and the router still routes to it after %s", d)
		}
	} else if err := old.Shutdown(); err != nil {
		t.Fatalf("crash: %v", err)
	}

	start := time.Now()
	fresh := c.join("cell-1 (new)", "cell-1", newG, cellMeta(newH, "0-499"), nil)
	joined := time.Since(start)
	isNew := func(m *sharding.Map) bool {
		return routesTo(m, 0, 499, fresh, newAddr) && routesTo(m, 500, 999, cell2, c2Addr)
	}
	took := waitRejoin(t, router, "the router's map names the new cell-1", start, isNew)
	waitRejoin(t, cell2, "cell-2's map names the new cell-1", start, isNew)
	waitRejoin(t, fresh, "the new cell-1's own map names it", start, isNew)

	// Until memberlist has declared the old process dead (or seen it leave),
	// and when it does, the map keeps naming the new one.
	gone, ok := waitMap(router, measureLimit, func(*sharding.Map) bool { return router.Members() == 3 })
	if !ok {
		t.Errorf("the router still counts %d members %s after the new cell-1 joined, want 3 (the old one declared dead)", router.Members(), gone)
	}
	after, found := since(seen.all(), isNew)
	if !found {
		t.Fatalf("no map the router published names the new cell-1")
	}
	for i, m := range after {
		if !isNew(m) {
			c, _ := m.Owner(0)
			t.Errorf("map %d after the new cell-1 came in routes shard 0 to %+v", i, c)
		}
	}
	for _, n := range []*Node{router, cell2, fresh} {
		if !isNew(n.Map()) {
			t.Errorf("once the old cell-1 is gone a map does not name the new one: %+v", n.Map().Cells())
		}
	}
	t.Logf("new cell-1 at %s: Join took %s; the router's map named it %s after Join began; the old one was gone from the router's members %s after that; %d maps published since, all naming the new one",
		newAddr, joined.Round(time.Millisecond), took.Round(time.Millisecond), gone.Round(time.Millisecond), len(after))
}

// TestRouterRejoin: a router crashed and started again under its name on a
// new gossip port hears of the cluster's changes at once (here: a cell
// leaving), not only after memberlist has declared the old router dead.
func TestRouterRejoin(t *testing.T) {
	p := testenv.FreePorts(t, 6)
	routerG, c1G, c1H, c2G, c2H, newG := p[0], p[1], p[2], p[3], p[4], p[5]
	c := newTestCluster(t)
	c.seeds = []string{fmt.Sprintf("127.0.0.1:%d", routerG), fmt.Sprintf("127.0.0.1:%d", c1G), fmt.Sprintf("127.0.0.1:%d", c2G)}
	old := c.join("router", "router-127.0.0.1:8080", routerG, Meta{Role: RoleRouter}, nil)
	c.join("cell-1", "cell-1", c1G, cellMeta(c1H, "0-499"), nil)
	cell2 := c.join("cell-2", "cell-2", c2G, cellMeta(c2H, "500-999"), nil)
	if _, ok := waitMap(old, 10*time.Second, func(m *sharding.Map) bool { return m.Uncovered() == 0 }); !ok {
		t.Fatalf("the cluster never formed")
	}
	// Routers counts the routers alone (the shared limits' N), on every member.
	if d, ok := waitFor(5*time.Second, func() bool { return old.Routers() == 1 && cell2.Routers() == 1 && cell2.Members() == 3 }); !ok {
		t.Fatalf("after %s: Routers %d and %d, want 1 of 3 members", d, old.Routers(), cell2.Routers())
	}
	if err := old.Shutdown(); err != nil {
		t.Fatal(err)
	}
	c.seeds = append(c.seeds, fmt.Sprintf("127.0.0.1:%d", newG))
	start := time.Now()
	fresh := c.join("router (new)", "router-127.0.0.1:8080", newG, Meta{Role: RoleRouter}, nil)
	took := waitRejoin(t, fresh, "the new router's map covers every shard", start, func(m *sharding.Map) bool { return m.Uncovered() == 0 })
	// Once cell-2 knows the new router, cell-2 leaves: the new router must
	// hear of it as any member would.
	if d, ok := waitFor(5*time.Second, func() bool { return metaOf(cell2, fresh) != nil }); !ok {
		t.Fatalf("cell-2 does not know the new router after %s", d)
	}
	if err := cell2.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	gone := waitRejoin(t, fresh, "the new router's map drops cell-2, which left", left, func(m *sharding.Map) bool { return m.Uncovered() == 500 })
	t.Logf("the new router's map was complete %s after Join began; it dropped cell-2 %s after cell-2's Leave returned",
		took.Round(time.Millisecond), gone.Round(time.Millisecond))
}

// TestDuplicateCell: two live processes announce one cell name (started twice
// by mistake). The later one gets the routes at once; the earlier one keeps
// gossiping but never comes back into the map while the later one lives, and
// both it and the others say so in their logs. When the later one leaves, the
// earlier one, still alive, gets the routes back.
func TestDuplicateCell(t *testing.T) {
	p := testenv.FreePorts(t, 7)
	routerG, c1G, c1H, c2G, c2H, newG, newH := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	c := newTestCluster(t)
	c.seeds = []string{fmt.Sprintf("127.0.0.1:%d", routerG), fmt.Sprintf("127.0.0.1:%d", c1G), fmt.Sprintf("127.0.0.1:%d", c2G)}
	var seen mapLog
	router := c.join("router", "router-127.0.0.1:8080", routerG, Meta{Role: RoleRouter}, seen.add)
	first := c.join("cell-1", "cell-1", c1G, cellMeta(c1H, "0-499"), nil)
	cell2 := c.join("cell-2", "cell-2", c2G, cellMeta(c2H, "500-999"), nil)
	if _, ok := waitMap(router, 10*time.Second, func(m *sharding.Map) bool { return m.Uncovered() == 0 }); !ok {
		t.Fatalf("the cluster never formed")
	}
	firstAddr, newAddr, c2Addr := fmt.Sprintf("127.0.0.1:%d", c1H), fmt.Sprintf("127.0.0.1:%d", newH), fmt.Sprintf("127.0.0.1:%d", c2H)
	start := time.Now()
	second := c.join("cell-1 (second)", "cell-1", newG, cellMeta(newH, "0-499"), nil)
	isSecond := func(m *sharding.Map) bool {
		return routesTo(m, 0, 499, second, newAddr) && routesTo(m, 500, 999, cell2, c2Addr)
	}
	waitRejoin(t, router, "the router's map names the second cell-1", start, isSecond)
	waitRejoin(t, first, "the first cell-1's map names the second", start, isSecond)

	// Both keep gossiping. The first cell-1 announces itself again, with new
	// metadata (a higher map version); once the router has taken that in, its
	// map could have moved back: it must not have.
	m := cellMeta(c1H, "0-499")
	m.Name, m.Started, m.Version = "cell-1", first.started, 2
	b, _ := json.Marshal(m)
	first.mu.Lock()
	first.meta = b
	first.mu.Unlock()
	if err := first.ml.UpdateNode(time.Second); err != nil {
		t.Fatalf("re-announce the first cell-1: %v", err)
	}
	if d, ok := waitFor(5*time.Second, func() bool { return bytes.Equal(metaOf(router, first), b) }); !ok {
		t.Fatalf("the router did not hear the first cell-1 announce itself again within %s", d)
	}
	if n := router.Members(); n != 4 {
		t.Fatalf("the router counts %d live members, want 4 (both cell-1 processes alive)", n)
	}
	after, _ := since(seen.all(), isSecond)
	for i, m := range after {
		if !isSecond(m) {
			c, _ := m.Owner(0)
			t.Errorf("map %d after the second cell-1 came in routes shard 0 to %+v", i, c)
		}
	}
	if !strings.Contains(c.logs["cell-1"].String(), "another process announces this cell and started later") {
		t.Errorf("the first cell-1 did not log that it was superseded")
	}
	if !strings.Contains(c.logs["router"].String(), "a later process announces a cell") {
		t.Errorf("the router did not log that it ignores the first cell-1")
	}
	router.alarmSuperseded(time.Now().Add(supersededAlarm + time.Second))
	if !strings.Contains(c.logs["router"].String(), "two live processes announce one cell") {
		t.Errorf("the router did not raise the alarm about two live cell-1 processes")
	}

	left := time.Now()
	if err := second.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitRejoin(t, router, "the router's map names the first cell-1 again once the second left", left, func(m *sharding.Map) bool {
		return routesTo(m, 0, 499, first, firstAddr)
	})
	t.Logf("%d maps published while both ran, all naming the second", len(after))
}
