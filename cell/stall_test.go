package cell_test

import (
	"database/sql"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// stallProxy listens on its own port and, while stalled, accepts connections
// and never answers on them (a cell that hangs). Released, it drops the
// connections it held and forwards new ones to its target.
type stallProxy struct {
	ln      net.Listener
	to      string
	stalled atomic.Bool
	mu      sync.Mutex // guards held, open
	held    []net.Conn // accepted while stalled
	open    []net.Conn // every connection, closed at the end of the test
}

func newStallProxy(t *testing.T, to string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, to: to}
	p.stalled.Store(true)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) track(c net.Conn, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = append(p.open, c)
	if held {
		p.held = append(p.held, c)
	}
}

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		stalled := p.stalled.Load()
		p.track(c, stalled)
		if !stalled {
			go p.pipe(c)
		}
	}
}

func (p *stallProxy) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.to, time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.track(up, false)
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

// release ends the stall: the held connections are closed, new ones forwarded.
func (p *stallProxy) release() {
	p.stalled.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.Close()
	}
}

// TestRelayStalledDestination: the shard map names a third cell, cell-c,
// owner of shards 800-999, at an address that accepts connections and never
// answers. Credits to the sending cell's own wallets and to the healthy other
// cell are applied within a second each; cell-c's wait, held by the relay, and when
// it answers again (its address now forwards to the cell holding those
// wallets) each is delivered exactly once.
func TestRelayStalledDestination(t *testing.T) {
	peers := &staticPeers{}
	a := startCell(t, "cell-a", "0-499", 1, peers, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken })
	b := startCell(t, "cell-b", "500-999", 2, peers, nil)
	stall := newStallProxy(t, b.addr)
	healthy, _ := sharding.ParseRanges("500-799")
	stalled, _ := sharding.ParseRanges("800-999")
	m, _ := sharding.NewMap([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: a.cfg.Shards},
		{Name: b.name, Addr: b.addr, Shards: healthy}, {Name: "cell-c", Addr: stall.addr(), Shards: stalled}})
	peers.m.Store(m)

	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	groups := map[string][]string{
		"local":   actsInShard(t, pre+"-l", 123, 6),
		"healthy": actsInShard(t, pre+"-h", 678, 6),
		"stalled": actsInShard(t, pre+"-x", 901, 4),
	}
	a.balance(t, groups["local"][0]) // the claimants' tables exist before the clock runs
	b.balance(t, groups["healthy"][0])
	kind, db := map[string]string{}, map[string]*sql.DB{}
	n := 0
	for k, acts := range groups {
		for _, act := range acts {
			kind[act], db[act] = k, b.db
			if k == "local" {
				db[act] = a.db
			}
			n++
		}
	}
	a.deposit(t, sender, 100_000)
	id := a.send(t, sender, int64(n)*100, int64(n), "snd-1")
	w := watchCredits(t)
	claims := w.open(t, a, id, interleave(groups["stalled"], groups["local"], groups["healthy"]), kind, db)
	others := only(claims, "local", "healthy")

	w.until(12*time.Second, allCredited(others))
	for _, c := range only(claims, "stalled") {
		if w.seen(c) {
			t.Errorf("%s credited while its cell was stalled", c.act)
		}
	}
	if held, want := creditsPending(t, a, "real"), len(groups["stalled"]); held < float64(want) {
		t.Errorf("%v credits held by the relay while cell-c stalls, want at least its %d", held, want)
	}
	// An operator sees the stuck lane: what it holds, and that it backs off.
	lane := `{dest="cell-c",kind="remote",space="real"}`
	// A claim opened while the lane backed off is held by the relay and
	// offered to it again within about two relay intervals.
	waitFor(t, 5*time.Second, func() bool {
		return metric(t, a, "redcell_cell_relay_lane_credits"+lane) == float64(len(groups["stalled"]))
	}, fmt.Sprintf("cell-c's lane to hold its %d credits", len(groups["stalled"])))
	// The lane backs off once an attempt failed: the first one waits for
	// its 5 s timeout; 20 s is far above that on a loaded machine.
	waitFor(t, 20*time.Second, func() bool { return metric(t, a, "redcell_cell_relay_lane_backoff_seconds"+lane) > 0 }, "cell-c's lane backing off")
	released := time.Now()
	stall.release()
	if !w.until(15*time.Second, allCredited(claims)) {
		t.Errorf("not every claim credited within 15 s of the stall's end")
	}
	w.halt()
	var back time.Duration
	for _, c := range only(claims, "stalled") {
		back = max(back, c.credited.Sub(released))
	}
	t.Logf("the stalled cell's credits applied within %s of its return", back.Round(time.Millisecond))
	report(t, "credit delay, other credits while one destination stalls", others, creditedAt)
	report(t, "  of which in the sending cell", only(claims, "local"), creditedAt)
	report(t, "  of which in the healthy cell", only(claims, "healthy"), creditedAt)
	checkExactlyOnce(t, claims, a)
}
