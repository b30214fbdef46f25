package couponq

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// take is one TakeCouponRequests call of the feeder: the clock when it
// was called (the feeder read it at or before), the sweep's staleMS (-1:
// accepted requests only) and the serials it took.
type take struct {
	at      time.Time
	staleMS int64
	dbs     []int
	serials []string
}

// takesSeen passes every call to the store and keeps what the feeder asked
// and got.
type takesSeen struct {
	store
	clock clock.Clock
	took  chan struct{} // a take returned (capacity 1)
	mu    sync.Mutex
	takes []take
}

// CommitGroup keeps the takes (storage.CouponTake); every other op passes
// through.
func (s *takesSeen) CommitGroup(ctx context.Context, list []storage.Op) error {
	var op *storage.CouponTake
	if len(list) == 1 {
		op, _ = list[0].(*storage.CouponTake)
	}
	if op == nil {
		return s.store.CommitGroup(ctx, list)
	}
	at := s.clock.Now()
	err := s.store.CommitGroup(ctx, list)
	tk := take{at: at, staleMS: op.StaleMS, dbs: slices.Clone(op.DBs)}
	for _, r := range op.Taken {
		tk.serials = append(tk.serials, r.Serial)
	}
	s.mu.Lock()
	s.takes = append(s.takes, tk)
	s.mu.Unlock()
	select {
	case s.took <- struct{}{}:
	default:
	}
	return err
}

// all returns every take so far.
func (s *takesSeen) all() []take {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.takes)
}

// sweeps returns the full sweeps so far (those that take stale deciding
// requests too).
func (s *takesSeen) sweeps() []take {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []take
	for _, tk := range s.takes {
		if tk.staleMS >= 0 {
			out = append(out, tk)
		}
	}
	return out
}

// TestStaleDecidingTakenAgain: a request left deciding by a cell that died
// is taken again by a running engine once it has been deciding longer than
// StaleAfter, and not before. The engine and the store run on a manual
// clock; the requests are stored as a cell stores them and set deciding in
// their rows as a dead cell's take leaves them. A marker deciding for a
// second before the engine starts is taken by its first sweep (which takes
// every deciding request: a cell restarting over its databases); then one
// row deciding longer than StaleAfter is taken and issued by a later sweep
// while one deciding for a second stays deciding through it; that one is
// taken by the first sweep that finds it StaleAfter old. Each is issued
// once, and the batch's stock row accounts for every unit.
func TestStaleDecidingTakenAgain(t *testing.T) {
	dsn := testenv.MySQLDSN(t, 1)
	st, err := storage.Open(dsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	clk := clock.NewManual(time.Now())
	st.SetClock(clk)
	d := newDrop(t, st, 10, 10, 10)
	const staleAfter = 30 * time.Second
	seen := &takesSeen{store: st, clock: clk, took: make(chan struct{}, 1)}

	// Three persons of one database: the engine decides that database alone.
	var acts []string
	home := -1
	for i := 0; len(acts) < 3; i++ {
		act := fmt.Sprintf("%s-p%d", d.pre, i)
		if db := sharding.ShardOfAct(act).DB(); home < 0 || db == home {
			home = db
			acts = append(acts, act)
		}
	}
	req := func(name, act string) model.CouponRequest {
		return model.CouponRequest{App: "pay", Serial: d.pre + "-" + name, ActID: act, Shard: sharding.ShardOfAct(act), Batch: d.c}
	}
	marker, old, recent := req("marker", acts[0]), req("old", acts[1]), req("recent", acts[2])
	ctx := context.Background()
	// leftDeciding stores r and leaves it deciding since takenMS, as the
	// take of a cell that died leaves it.
	leftDeciding := func(r model.CouponRequest, takenMS int64) {
		t.Helper()
		if _, repeat, err := storage.AcceptCoupon(ctx, st, r); err != nil || repeat {
			t.Fatalf("accept %s: repeat %v, %v", r.Serial, repeat, err)
		}
		res, err := db.Exec(fmt.Sprintf("UPDATE db_%02d.t_coupon_req SET state = ?, taken_ms = ? WHERE app = ? AND serial_no = ? AND state = ?", r.Shard.DB()),
			string(model.CouponDeciding), takenMS, r.App, r.Serial, string(model.CouponAccepted))
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s: %d rows set deciding, want 1", r.Serial, n)
		}
	}
	stateOf := func(r model.CouponRequest) model.CouponRequest {
		t.Helper()
		got, err := storage.CouponRequestOf(ctx, st, r.Shard, r.App, r.Serial)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tookIt := func(tk take, r model.CouponRequest) bool { return slices.Contains(tk.serials, r.Serial) }
	var sweep time.Duration // the engine's sweepEvery, once it is made
	// driveUntilTaken moves the clock a full sweep's interval at a time
	// until a sweep takes r, each time waiting (briefly) for the feeder's
	// take: a move made before the feeder waited on the clock wakes nobody,
	// and is made again. The clock stays where that sweep ran.
	driveUntilTaken := func(r model.CouponRequest) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !slices.ContainsFunc(seen.sweeps(), func(tk take) bool { return tookIt(tk, r) }) {
			if time.Now().After(deadline) {
				t.Fatalf("clock at %s: no sweep took %s; sweeps %+v", clk.Now().Format(time.TimeOnly), r.Serial, seen.sweeps())
			}
			clk.Advance(sweep)
			select {
			case <-seen.took:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	// issue waits, the clock standing, until the engine has decided r,
	// and checks that it issued it.
	issue := func(r model.CouponRequest) {
		t.Helper()
		d.waitFinal([]model.CouponRequest{r}, 30*time.Second)
		if got := stateOf(r); got.State != model.CouponIssued {
			t.Fatalf("%s: %s %s, want issued", r.Serial, got.State, got.Reason)
		}
	}

	leftDeciding(marker, clk.Now().Add(-time.Second).UnixMilli())
	e, err := New(Config{Store: seen, Stock: d.stock, Catalog: func() *couponbatch.Catalog { return d.cat }, Layer1: free{}, Layer2: free{},
		DBs: func() []int { return []int{home} }, StaleAfter: staleAfter, Workers: 1, Mergers: 1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if sweep = e.feeder.sweepEvery(); sweep != 5*time.Second {
		t.Fatalf("sweep every %v with StaleAfter %v, want a sixth", sweep, staleAfter)
	}
	_, stop := runEngine(e)
	defer stop()

	driveUntilTaken(marker)
	issue(marker)
	if sw := seen.sweeps(); len(sw) == 0 || !tookIt(sw[0], marker) {
		t.Fatalf("the marker, deciding for 1 s, was not taken by the first sweep: %+v", sw)
	}

	now := clk.Now()
	leftDeciding(old, now.Add(-staleAfter-time.Second).UnixMilli())
	recentMS := now.Add(-time.Second).UnixMilli()
	leftDeciding(recent, recentMS)
	before := len(seen.sweeps())
	driveUntilTaken(old)
	issue(old)
	sw := seen.sweeps()[before:]
	if len(sw) == 0 || !slices.ContainsFunc(sw, func(tk take) bool { return tookIt(tk, old) }) {
		t.Fatalf("the old request was issued but no sweep after it was planted took it: %+v", sw)
	}
	if got := stateOf(recent); got.State != model.CouponDeciding || got.TakenMS != recentMS {
		t.Fatalf("the request deciding for a second, after a sweep: %s taken %d, want deciding taken %d", got.State, got.TakenMS, recentMS)
	}

	// Jump to a little before the recent one turns stale, then tick on.
	clk.Set(time.UnixMilli(recentMS).Add(staleAfter - 2*time.Second))
	driveUntilTaken(recent)
	issue(recent)
	// No sweep took it while the clock said it had been deciding less than
	// StaleAfter (the feeder read the clock at or before the take's at);
	// the one that took it ran within a tick or two of it turning stale.
	for _, tk := range seen.sweeps()[before:] {
		took := tookIt(tk, recent)
		if !took && tk.staleMS >= recentMS {
			t.Fatalf("a sweep of requests deciding since %d or before left the one deciding since %d", tk.staleMS, recentMS)
		}
		if !took {
			continue
		}
		if tk.at.Add(-staleAfter).UnixMilli() < recentMS {
			t.Fatalf("taken again at %d after %v deciding, before StaleAfter (%v)", tk.at.UnixMilli(), tk.at.Sub(time.UnixMilli(recentMS)), staleAfter)
		}
		if late := tk.at.Sub(time.UnixMilli(recentMS)) - staleAfter; late > 2*sweep {
			t.Fatalf("taken again %v after it turned stale, want within two sweeps (%v)", late, 2*sweep)
		}
		break
	}

	stop()
	// Each request was issued once: one coupon, the request's; the batch's
	// stock row counts the three units out and every lease closed.
	for _, r := range []model.CouponRequest{marker, old, recent} {
		got := stateOf(r)
		cs, err := storage.CouponsOf(ctx, st, r.Shard, r.ActID, model.FlowCursor{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 1 || cs[0].Serial != r.Serial || cs[0].Batch != d.c || got.CouponID != cs[0].ID {
			t.Fatalf("%s: coupons %+v, request %+v; want one coupon, the request's", r.Serial, cs, got)
		}
	}
	issuedNow := d.check([]model.CouponRequest{marker, old, recent})
	sh, k := d.stock.home(d.c)
	bud, _, err := storage.Budget(ctx, st, sh, k)
	if err != nil {
		t.Fatal(err)
	}
	if left := bud.Total - bud.Outstanding(); issuedNow[d.c] != 3 || bud.Total != 10 || issuedNow[d.c]+left != bud.Total {
		t.Fatalf("batch %s: %d issued + %d left, stock %d; want 3 + 7 = 10", d.c, issuedNow[d.c], left, bud.Total)
	}
}

// TestIdleFeederReadsNothing: with nothing accepted, the feeder takes
// nothing between its sweeps (an idle cell does not read its databases'
// queues every tick); a change of the databases it decides (a move) makes
// the next tick a sweep of the new list; the sweep after comes sweepEvery
// later. Times are the manual clock's, as each take read it.
func TestIdleFeederReadsNothing(t *testing.T) {
	st, err := storage.Open(testenv.MySQLDSN(t, 1), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := clock.NewManual(time.Now())
	st.SetClock(clk)
	d := newDrop(t, st, 10, 10, 10)
	seen := &takesSeen{store: st, clock: clk, took: make(chan struct{}, 1)}
	var mu sync.Mutex
	dbs := []int{1, 2, 3}
	// StaleAfter 6 s: a sweep every second, twenty ticks.
	e, err := New(Config{Store: seen, Stock: d.stock, Catalog: func() *couponbatch.Catalog { return d.cat }, Layer1: free{}, Layer2: free{},
		DBs: func() []int { mu.Lock(); defer mu.Unlock(); return slices.Clone(dbs) }, StaleAfter: 6 * time.Second, Workers: 1, Mergers: 1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sweep := e.feeder.sweepEvery()
	if sweep != time.Second {
		t.Fatalf("sweep every %v with StaleAfter 6s, want 1s", sweep)
	}
	_, stop := runEngine(e)
	defer stop()

	// tick moves the clock one feeder tick and gives the feeder a moment
	// to take (a tick it misses only moves the clock further).
	tick := func() {
		clk.Advance(feedTick)
		select {
		case <-seen.took:
		case <-time.After(20 * time.Millisecond):
		}
	}
	untilTakes := func(n int) []take {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); len(seen.all()) < n; tick() {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d takes within 30 s: %+v", n, seen.all())
			}
		}
		return seen.all()
	}
	isSweep := func(tk take, want []int) bool { return tk.staleMS >= 0 && slices.Equal(tk.dbs, want) }

	first := untilTakes(1)[0]
	if !isSweep(first, []int{1, 2, 3}) {
		t.Fatalf("first take %+v: want a sweep of databases 1-3", first)
	}
	for range 5 { // idle ticks
		tick()
	}
	mu.Lock()
	dbs = []int{1, 2, 3, 4} // a move brings database 4
	mu.Unlock()
	takes := untilTakes(2)
	if tk := takes[1]; !isSweep(tk, []int{1, 2, 3, 4}) || tk.at.Sub(first.at) >= sweep {
		t.Fatalf("take after the move %+v (%v after the first): want a sweep of databases 1-4 before the next was due (%v)", tk, tk.at.Sub(first.at), sweep)
	}
	takes = untilTakes(3)
	if len(takes) != 3 {
		t.Fatalf("takes %+v: want three, sweeps all", takes)
	}
	gap := takes[2].at.Sub(takes[1].at)
	if !isSweep(takes[2], []int{1, 2, 3, 4}) || gap < sweep || gap > sweep+10*feedTick {
		t.Fatalf("third take %+v, %v after the second: want the next sweep, %v after it (the idle ticks between took nothing)", takes[2], gap, sweep)
	}
}
