package couponq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/climit"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// free is a limiter that never holds back.
type free struct{}

func (free) Allow() bool { return true }
func (free) Wait(ctx context.Context) error {
	return ctx.Err()
}

// store is what a drop needs of a store.
type store interface {
	storage.Grouper // the budget and coupon ops, storage.AcceptCoupon
	storage.Reader
}

// drop is one engine over st with two batches of one group (stock a, b)
// and a third without a group.
type drop struct {
	t       *testing.T
	st      store
	cat     *couponbatch.Catalog
	stock   *BudgetStock
	pre     string
	a, b, c string // batch IDs
}

func newDrop(t *testing.T, st store, stockA, stockB, stockC int64) *drop {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	d := &drop{t: t, st: st, pre: pre, a: pre + "-a", b: pre + "-b", c: pre + "-c"}
	cat, err := couponbatch.Parse(fmt.Appendf(nil, `batches:
  - {id: %s, stock: %d, face_value: 500, per_person_limit: 2, group: %s-g}
  - {id: %s, stock: %d, face_value: 300, per_person_limit: 1, group: %s-g}
  - {id: %s, stock: %d, face_value: 100, per_person_limit: 1}
risk: {per_device_per_min: 1000000, per_ip_per_min: 1000000, per_act_per_min: 1000000}
`, d.a, stockA, pre, d.b, stockB, pre, d.c, stockC), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d.cat = cat
	d.stock = &BudgetStock{Budgets: st, Holder: "test/coupons"}
	if err := d.stock.Sync(context.Background(), cat); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *drop) engine(l1, l2 Limiter) *Engine { return d.engineWith(l1, l2, func(*Config) {}) }

// runEngine runs e (Engine.Run) in the background until stop, which ends
// ctx, Run's context, and waits for Run to return.
func runEngine(e *Engine) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	return ctx, func() { cancel(); <-done }
}

// engineWith is engine with its config changed by set first.
func (d *drop) engineWith(l1, l2 Limiter, set func(*Config)) *Engine {
	cfg := Config{Store: d.st, Stock: d.stock, Catalog: func() *couponbatch.Catalog { return d.cat },
		Layer1: l1, Layer2: l2, DBs: func() []int {
			dbs := make([]int, model.ShardCount/10)
			for i := range dbs {
				dbs[i] = i
			}
			return dbs
		}, MergeMax: 16, StaleAfter: time.Hour}
	set(&cfg)
	e, err := New(cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	return e
}

// requests makes n requests by persons of a pool of p, over the three
// batches, a few retried with the same serial.
func (d *drop) requests(n, p int, seed uint64) []model.CouponRequest {
	rng := rand.New(rand.NewPCG(seed, 7))
	batches := []string{d.a, d.a, d.b, d.c}
	out := make([]model.CouponRequest, n)
	for i := range out {
		act := fmt.Sprintf("%s-p%d", d.pre, rng.IntN(p))
		out[i] = model.CouponRequest{App: "pay", Serial: fmt.Sprintf("%s-s%d", d.pre, i), ActID: act, Shard: sharding.ShardOfAct(act),
			Batch: batches[rng.IntN(len(batches))], DeviceID: fmt.Sprintf("dev%d", rng.IntN(50))}
	}
	return out
}

// accept sends every request (some twice) with a few at once.
func accept(t *testing.T, e *Engine, rs []model.CouponRequest, greenEvery int) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				r := rs[i]
				r.Green = greenEvery > 0 && i%greenEvery == 0
				got, _, err := e.Accept(context.Background(), r)
				if err != nil {
					t.Errorf("accept %s: %v", r.Serial, err)
					continue
				}
				if r.Green && !got.State.Final() {
					t.Errorf("green %s answered %s, want a final state", r.Serial, got.State)
				}
				if i%7 == 0 { // a client's retry
					if again, repeat, err := e.Accept(context.Background(), rs[i]); err != nil || !repeat || again.Serial != r.Serial {
						t.Errorf("retry of %s: %+v repeat %v %v", r.Serial, again, repeat, err)
					}
				}
			}
		})
	}
	for i := range rs {
		next <- i
	}
	close(next)
	wg.Wait()
}

// settle waits (bounded) until every request is final, then checks the
// books (check).
func (d *drop) settle(rs []model.CouponRequest, within time.Duration) (issued map[string]int64) {
	d.t.Helper()
	d.waitFinal(rs, within)
	return d.check(rs)
}

// waitFinal waits (bounded) until every request is final.
func (d *drop) waitFinal(rs []model.CouponRequest, within time.Duration) {
	d.t.Helper()
	ctx := context.Background()
	var open int
	testenv.Until(within, func() bool {
		open = 0
		for _, r := range rs {
			got, err := storage.CouponRequestOf(ctx, d.st, r.Shard, r.App, r.Serial)
			if err != nil {
				d.t.Fatal(err)
			}
			if !got.State.Final() {
				open++
			}
		}
		return open == 0
	})
	if open > 0 {
		var states []string
		for _, r := range rs {
			got, _ := storage.CouponRequestOf(ctx, d.st, r.Shard, r.App, r.Serial)
			if !got.State.Final() && len(states) < 5 {
				states = append(states, fmt.Sprintf("%s %s taken %d accepted %d", got.Serial, got.State, got.TakenMS, got.AcceptedMS))
			}
		}
		d.t.Fatalf("%d of %d requests not final after %v: %v", open, len(rs), within, states)
	}
}

// check checks the books: no batch over its stock, every lease closed with
// its coupons, no person over a limit or holding two batches of the group.
func (d *drop) check(rs []model.CouponRequest) (issued map[string]int64) {
	d.t.Helper()
	ctx := context.Background()
	rules := map[string]model.CouponRule{}
	for _, b := range d.cat.Batches() {
		rules[b.ID] = ruleOf(b)
	}
	var held []model.HeldCoupon
	issued = map[string]int64{}
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r.ActID] {
			continue
		}
		seen[r.ActID] = true
		cs, err := storage.CouponsOf(ctx, d.st, r.Shard, r.ActID, model.FlowCursor{}, 100)
		if err != nil {
			d.t.Fatal(err)
		}
		for _, c := range cs {
			held = append(held, model.HeldCoupon{ActID: c.ActID, Rule: rules[c.Batch]})
			issued[c.Batch]++
		}
	}
	if ps := model.CouponHoldingProblems(held); len(ps) > 0 {
		d.t.Fatalf("holdings: %v", ps)
	}
	for _, b := range d.cat.Batches() {
		sh, k := d.stock.home(b.ID)
		bud, leases, err := storage.Budget(ctx, d.st, sh, k)
		if err != nil {
			d.t.Fatal(err)
		}
		for _, l := range leases {
			if l.State != model.LeaseReturned {
				d.t.Fatalf("batch %s: lease %s still %s", b.ID, l.ID, l.State)
			}
		}
		if bud.Outstanding() != issued[b.ID] || issued[b.ID] > b.Stock {
			d.t.Fatalf("batch %s: %d out of the stock row, %d coupons, stock %d", b.ID, bud.Outstanding(), issued[b.ID], b.Stock)
		}
	}
	return issued
}

// runDrop drops n requests of a pool of persons on one engine, prefetch
// units beyond each merge's own asked for at each grant (0: none), and
// checks the books once every request is final and the engine stopped.
func runDrop(t *testing.T, st store, n, persons int, prefetch int64) {
	d := newDrop(t, st, 150, 40, 1000)
	e := d.engine(free{}, free{})
	e.SetPrefetch(prefetch)
	_, stop := runEngine(e)
	rs := d.requests(n, persons, 1)
	accept(t, e, rs, 13)
	d.waitFinal(rs, 60*time.Second)
	stop() // a stopped engine has closed its held leases
	issued := d.check(rs)
	if issued[d.a] != 150 || issued[d.b] == 0 || issued[d.b] > 40 {
		t.Fatalf("issued %v: want batch a sold out (150), some of b (<= 40)", issued)
	}
	// Each request went into layer 1 once: at its accept or from a take.
	if e.Stats.Issued.Load() == 0 || e.Stats.Deductions.Load() == 0 || e.Stats.Fed.Load()+e.Stats.Queued.Load() < int64(len(rs)) {
		t.Fatalf("stats: issued %d deductions %d fed %d queued at accept %d, of %d requests", e.Stats.Issued.Load(), e.Stats.Deductions.Load(),
			e.Stats.Fed.Load(), e.Stats.Queued.Load(), len(rs))
	}
	held := e.Stats.HeldDeductions.Load()
	if (prefetch > 0) != (held > 0) {
		t.Fatalf("prefetch %d: %d merges deducted from held leases", prefetch, held)
	}
	t.Logf("prefetch %d: %d grants, %d merges from held leases, issued %v", prefetch, e.Stats.Deductions.Load(), held, issued)
}

func TestDropMemory(t *testing.T) {
	t.Run("a grant per merge", func(t *testing.T) { runDrop(t, memstore.New(nil), 1500, 400, 0) })
	t.Run("held leases", func(t *testing.T) { runDrop(t, memstore.New(nil), 1500, 400, 8) })
}

func TestDropMySQL(t *testing.T) {
	st, err := storage.Open(testenv.MySQLDSN(t, 1), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t.Run("a grant per merge", func(t *testing.T) { runDrop(t, st, 800, 250, 0) })
	t.Run("held leases", func(t *testing.T) { runDrop(t, st, 800, 250, 8) })
}

// Stopped with full queues, the engine leaves the rest accepted (not
// deciding), and the next one decides them: nothing lost, nothing twice.
func TestDrainHandsOver(t *testing.T) {
	st := memstore.New(nil)
	d := newDrop(t, st, 100, 100, 100)
	slow, err := climit.New(climit.Config{Name: "l1", Rate: 100}, nil, nil) // layer 1 at 100/s
	if err != nil {
		t.Fatal(err)
	}
	e := d.engine(slow, free{})
	_, stop := runEngine(e)
	rs := d.requests(400, 300, 2)
	accept(t, e, rs, 0)
	// Stopped once about 50 are decided (layer 1 at 100/s: half a second).
	testenv.WaitFor(t, 30*time.Second, "50 decisions", func() bool { return e.Stats.Issued.Load()+e.Stats.Refused.Load() >= 50 })
	stop()
	var accepted, deciding, final int
	for _, r := range rs {
		got, _ := storage.CouponRequestOf(context.Background(), st, r.Shard, r.App, r.Serial)
		switch {
		case got.State == model.CouponAccepted:
			accepted++
		case got.State == model.CouponDeciding:
			deciding++
		default:
			final++
		}
	}
	if deciding != 0 || accepted == 0 || final == 0 || e.Stats.Released.Load() == 0 {
		t.Fatalf("after the stop: %d accepted, %d deciding, %d final, %d released; want none deciding, some of each other",
			accepted, deciding, final, e.Stats.Released.Load())
	}
	next := d.engine(free{}, free{})
	_, stop2 := runEngine(next)
	d.settle(rs, 30*time.Second)
	stop2()
}

// Layer 1 never runs faster than its limiter.
func TestLayerRate(t *testing.T) {
	st := memstore.New(nil)
	d := newDrop(t, st, 10000, 10000, 10000)
	l1, err := climit.New(climit.Config{Name: "l1", Rate: 200}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := d.engine(l1, free{})
	_, stop := runEngine(e)
	rs := d.requests(2000, 2000, 3)
	accept(t, e, rs, 0)
	start := time.Now()
	// About a second of deciding at 200/s, however slow the machine.
	testenv.WaitFor(t, 30*time.Second, "200 decisions", func() bool { return e.Stats.Issued.Load()+e.Stats.Refused.Load() >= 200 })
	stop()
	// Never faster than the limiter (its one-token burst, and a few
	// decisions in flight when the clock was read); some progress.
	elapsed := time.Since(start)
	n := e.Stats.Issued.Load() + e.Stats.Refused.Load()
	if most := int64(200*elapsed.Seconds()) + 1 + 8; n > most || n == 0 {
		t.Fatalf("layer 1 at 200/s decided %d in %v, want 1..%d", n, elapsed, most)
	}
}

// failing is a store whose issues (storage.CouponIssue) fail while fail is
// set: with unknown, as a COMMIT whose answer was lost; else before
// anything is written. Every other op passes through.
type failing struct {
	store
	mu            sync.Mutex
	fail, unknown bool
}

func (f *failing) CommitGroup(ctx context.Context, list []storage.Op) error {
	if len(list) == 1 {
		if op, ok := list[0].(*storage.CouponIssue); ok {
			f.mu.Lock()
			fail, unknown := f.fail, f.unknown
			f.mu.Unlock()
			switch {
			case fail && unknown:
				op.Decisions, op.Unused = nil, 0
				return fmt.Errorf("issue: %w", storage.ErrCommitUnknown)
			case fail:
				op.Decisions, op.Unused = nil, 0
				return fmt.Errorf("issue: connection refused")
			}
		}
	}
	return f.store.CommitGroup(ctx, list)
}

// An issue that wrote nothing gives its lease's units back at once; one
// whose answer was lost leaves the lease open, its units counted out
// (never over-issue); either way the requests are decided later.
func TestFailedIssueAndItsLease(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		t.Run(fmt.Sprintf("unknown=%v", unknown), func(t *testing.T) {
			f := &failing{store: memstore.New(nil), fail: true, unknown: unknown}
			d := newDrop(t, f, 5, 5, 5)
			obs := &openCounter{}
			e := d.engineWith(free{}, free{}, func(c *Config) { c.Observe = obs })
			r := d.requests(1, 1, 4)[0]
			r.Batch, r.Green = d.c, true
			if _, _, err := e.Accept(context.Background(), r); err == nil {
				t.Fatal("a green request whose issue failed answered no error")
			}
			// The lost answer's unit is reported written off; a failure
			// that wrote nothing gave it back.
			if want := map[bool]int64{true: 1, false: 0}[unknown]; obs.of(d.c) != want {
				t.Fatalf("units reported left open: %d, want %d", obs.of(d.c), want)
			}
			sh, k := d.stock.home(d.c)
			b, leases, err := storage.Budget(context.Background(), f, sh, k)
			if err != nil || len(leases) != 1 {
				t.Fatalf("stock row %+v leases %+v %v", b, leases, err)
			}
			if unknown {
				if leases[0].State != model.LeaseOpen || b.Outstanding() != 1 {
					t.Fatalf("after a lost answer: lease %+v, %d out; want it open, 1 out", leases[0], b.Outstanding())
				}
			} else if leases[0].State != model.LeaseReturned || leases[0].Unspent != 1 || b.Outstanding() != 0 {
				t.Fatalf("after a failed issue: lease %+v, %d out; want it returned whole, 0 out", leases[0], b.Outstanding())
			}
			f.mu.Lock()
			f.fail = false
			f.mu.Unlock()
			got, repeat, err := e.Accept(context.Background(), r) // the client asks again, green
			if err != nil || !repeat || got.State != model.CouponIssued {
				t.Fatalf("green again: %+v repeat %v %v; want issued", got, repeat, err)
			}
		})
	}
}

// A merge's deduction with prefetch keeps the units it did not need as a
// held lease; the next merge deducts from it without a grant, its coupon
// carrying the same lease. An issue from it whose answer was lost leaves
// it open for settlement (never returned, never deducted from again); a
// held lease closed when the engine stops gives back exactly what no
// coupon took.
func TestHeldLease(t *testing.T) {
	ctx := context.Background()
	f := &failing{store: memstore.New(nil)}
	d := newDrop(t, f, 5, 5, 20)
	obs := &openCounter{}
	e := d.engineWith(free{}, free{}, func(c *Config) { c.Observe = obs })
	e.SetPrefetch(4)
	sh, k := d.stock.home(d.c)
	rs := d.requests(4, 4, 9)
	green := func(i int) (model.CouponRequest, error) {
		r := rs[i]
		r.ActID = fmt.Sprintf("%s-held-%d", d.pre, i) // four persons: no limit in the way
		r.Shard = sharding.ShardOfAct(r.ActID)
		r.Batch, r.Green = d.c, true
		got, _, err := e.Accept(ctx, r)
		return got, err
	}
	leases := func() []model.Lease {
		t.Helper()
		_, ls, err := storage.Budget(ctx, f, sh, k)
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	if got, err := green(0); err != nil || got.State != model.CouponIssued {
		t.Fatalf("first: %+v %v", got, err)
	}
	ls := leases()
	if len(ls) != 1 || ls[0].Amount != 5 || ls[0].State != model.LeaseOpen || e.Stats.Deductions.Load() != 1 {
		t.Fatalf("after the first merge: leases %+v, %d grants; want one open lease of 1+4", ls, e.Stats.Deductions.Load())
	}
	first := ls[0].ID
	if got, err := green(1); err != nil || got.State != model.CouponIssued {
		t.Fatalf("second: %+v %v", got, err)
	}
	if e.Stats.Deductions.Load() != 1 || e.Stats.HeldDeductions.Load() != 1 || len(leases()) != 1 {
		t.Fatalf("the second merge: %d grants, %d from held leases, leases %+v; want it from the held lease", e.Stats.Deductions.Load(),
			e.Stats.HeldDeductions.Load(), leases())
	}
	dbs := make([]int, model.ShardCount/10)
	for i := range dbs {
		dbs[i] = i
	}
	if n, err := storage.CouponLeaseSpent(ctx, f, dbs, first); err != nil || n != 2 {
		t.Fatalf("coupons of the held lease: %d %v; want 2", n, err)
	}
	// A lost answer: the lease stays open, and is deducted from no more.
	f.mu.Lock()
	f.fail, f.unknown = true, true
	f.mu.Unlock()
	if _, err := green(2); !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("an issue whose answer was lost: %v", err)
	}
	// Of the lease's 5 units two carry coupons: the lost issue's one and
	// the two never given out are written off until settled.
	if n := obs.of(d.c); n != 3 {
		t.Fatalf("units reported left open: %d, want 3", n)
	}
	f.mu.Lock()
	f.fail = false
	f.mu.Unlock()
	e.merger.closeHeld(ctx, true)
	if ls := leases(); len(ls) != 1 || ls[0].State != model.LeaseOpen {
		t.Fatalf("the lease of a lost answer: %+v; want it left open", ls)
	}
	if got, err := green(3); err != nil || got.State != model.CouponIssued {
		t.Fatalf("after the lost answer: %+v %v", got, err)
	}
	ls = leases()
	if len(ls) != 2 || e.Stats.Deductions.Load() != 2 {
		t.Fatalf("after the lost answer: leases %+v, %d grants; want a new grant", ls, e.Stats.Deductions.Load())
	}
	e.merger.closeHeld(ctx, true)
	for _, l := range leases() {
		switch {
		case l.ID == first && l.State != model.LeaseOpen:
			t.Fatalf("the lost answer's lease was closed: %+v", l)
		case l.ID != first && (l.State != model.LeaseReturned || l.Unspent != 4):
			t.Fatalf("the second held lease: %+v; want returned with its 4 units no coupon took", l)
		}
	}
	if b, _, err := storage.Budget(ctx, f, sh, k); err != nil || b.Outstanding() != 5+1 {
		t.Fatalf("stock row %+v %v: want 6 out (the open lease's 5, the second's 1 coupon)", b, err)
	}
}

// A grant of fewer units than a merge's requests refuses none of the rest
// SOLD_OUT while units are still held (here by a held lease of the same
// engine): they are parked, and get the units once the lease is closed.
func TestShortGrantParks(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(nil)
	d := newDrop(t, st, 5, 5, 10)
	e := d.engine(free{}, free{})
	e.SetPrefetch(4)
	req := func(i int, green bool) model.CouponRequest {
		act := fmt.Sprintf("%s-short-%d", d.pre, i)
		return model.CouponRequest{App: "pay", Serial: fmt.Sprintf("%s-short-s%d", d.pre, i), ActID: act, Shard: sharding.ShardOfAct(act),
			Batch: d.c, Green: green}
	}
	if got, _, err := e.Accept(ctx, req(0, true)); err != nil || got.State != model.CouponIssued {
		t.Fatalf("green: %+v %v", got, err) // a lease of 1+4: 4 held, 5 left at the home
	}
	var merge []model.CouponRequest
	for i := 1; i <= 8; i++ {
		if _, _, err := e.Accept(ctx, req(i, false)); err != nil {
			t.Fatal(err)
		}
	}
	taken, err := storage.TakeCouponRequests(ctx, st, uniqueDBsOf(t), -1, 100)
	if err != nil || len(taken) != 8 {
		t.Fatalf("take: %d %v", len(taken), err)
	}
	merge = append(merge, taken...)
	rule := ruleOf(mustBatch(t, d, d.c))
	if err := e.merger.issueBatch(ctx, rule, merge, true, false); err != nil {
		t.Fatal(err)
	}
	states := func() map[string]int {
		out := map[string]int{}
		for _, r := range merge {
			got, err := storage.CouponRequestOf(ctx, st, r.Shard, r.App, r.Serial)
			if err != nil {
				t.Fatal(err)
			}
			out[string(got.State)+":"+string(got.Reason)]++
		}
		return out
	}
	if s := states(); s["issued:"] != 5 || s["deciding:"] != 3 {
		t.Fatalf("after a grant of 5 for 8: %v; want 5 issued, 3 still deciding (parked)", s)
	}
	parked := 0
	for _, r := range merge {
		if e.feeder.isParked(r) {
			parked++
		}
	}
	if parked != 3 {
		t.Fatalf("%d requests parked, want 3", parked)
	}
	e.merger.closeHeld(ctx, true) // the held lease's 4 back at the home
	var rest []model.CouponRequest
	for _, r := range merge {
		if e.feeder.isParked(r) {
			rest = append(rest, r)
		}
	}
	e.feeder.unpark(time.Time{}, true)
	if err := e.merger.issueBatch(ctx, rule, rest, true, false); err != nil {
		t.Fatal(err)
	}
	if s := states(); s["issued:"] != 8 {
		t.Fatalf("after the held units came back: %v; want all 8 issued", s)
	}
}

func uniqueDBsOf(t *testing.T) []int {
	dbs := make([]int, model.ShardCount/10)
	for i := range dbs {
		dbs[i] = i
	}
	return dbs
}

func mustBatch(t *testing.T, d *drop, id string) couponbatch.Batch {
	t.Helper()
	b, ok := d.cat.Batch(id)
	if !ok {
		t.Fatalf("no batch %s", id)
	}
	return b
}

// mergeCounter counts the deductions (merges) an engine makes.
type mergeCounter struct {
	noObserver
	n atomic.Int64
}

func (m *mergeCounter) Merged(string, int) { m.n.Add(1) }

// openCounter sums the units an engine reports left open (Observer.LeftOpen).
type openCounter struct {
	noObserver
	mu    sync.Mutex
	units map[string]int64 // by batch
}

func (o *openCounter) LeftOpen(batch string, units int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.units == nil {
		o.units = map[string]int64{}
	}
	o.units[batch] += units
}

func (o *openCounter) of(batch string) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.units[batch]
}

// Layer 2's gatherer waits Gather for more requests, so requests that
// trickle in are merged together; a merge bound of 1 is full at once and
// waits for nothing.
func TestGather(t *testing.T) { synctest.Test(t, testGather) }

// testGather runs in a synctest bubble: the requests' 5 ms spacing and the
// engine's gathering are on its fake clock, so a slow machine does not
// spread the requests over more merges.
func testGather(t *testing.T) {
	seed := uint64(0)
	run := func(gather time.Duration, mergeMax int) (merges int64, took time.Duration) {
		t.Helper()
		d := newDrop(t, memstore.New(nil), 1000, 1000, 1000)
		seed++
		rs := d.requests(20, 1_000_000, seed)
		for i := range rs {
			rs[i].Serial = fmt.Sprintf("%s-g%d-%d", d.pre, seed, i)
			rs[i].Batch = d.a
		}
		m := &mergeCounter{}
		e := d.engineWith(free{}, free{}, func(c *Config) { c.Gather, c.Observe = [2]time.Duration{0, gather}, m })
		e.SetMergeMax(mergeMax)
		e.SetPrefetch(0)
		ctx, stop := runEngine(e)
		start := time.Now()
		for _, r := range rs {
			if _, _, err := e.Accept(ctx, r); err != nil {
				t.Fatal(err)
			}
			testenv.Advance(5 * time.Millisecond)
		}
		d.waitFinal(rs, 30*time.Second)
		took = time.Since(start)
		stop()
		if got := d.check(rs); got[d.a] == 0 {
			t.Fatalf("nothing issued: %v", got)
		}
		return m.n.Load(), took
	}
	if merges, _ := run(300*time.Millisecond, 64); merges > 2 {
		t.Errorf("gathering 300 ms: %d merges of 20 requests sent over about 100 ms, want 1 or 2", merges)
	}
	if merges, _ := run(0, 64); merges < 5 {
		t.Errorf("not gathering: %d merges of 20 requests sent 5 ms apart, want one per request or two", merges)
	}
	if merges, took := run(300*time.Millisecond, 1); merges != 20 || took > 2*time.Second {
		t.Errorf("merge bound 1, gathering 300 ms: %d merges in %v, want 20, well within 20 × 300 ms", merges, took)
	}
}

// gate is a limiter that gives nothing until open is closed.
type gate struct{ open chan struct{} }

func (g gate) Allow() bool {
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}

func (g gate) Wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// While requests wait in their rows (layer 1's queue was full), a new
// accept does not jump them: it is left for the feeder, which takes the
// oldest first; once nothing waits, accepts are queued at once again.
func TestNoQueueJumping(t *testing.T) { synctest.Test(t, testNoQueueJumping) }

// testNoQueueJumping runs in a synctest bubble: the feeder's ticks are on
// its fake clock, and what the feeder did not take is checked once every
// goroutine has settled.
func testNoQueueJumping(t *testing.T) {
	st := memstore.New(nil)
	d := newDrop(t, st, 1000, 1000, 1000)
	g := gate{open: make(chan struct{})} // layer 1 takes nothing until it opens
	e := d.engine(g, free{})
	e.decider.in.ch = make(chan model.CouponRequest, 4) // the feeder's queue too: one handoff
	ctx, stop := runEngine(e)
	rs := d.requests(14, 1_000_000, 11)
	for i, r := range rs {
		if _, _, err := e.Accept(ctx, r); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			testenv.Advance(120 * time.Millisecond) // the feeder's ticks meet a full queue
		}
	}
	testenv.Advance(120 * time.Millisecond) // two more ticks: the feeder takes nothing while the queue is full
	if q, f := e.Stats.Queued.Load(), e.Stats.Fed.Load(); q != 4 || f != 0 {
		t.Fatalf("layer 1 held: %d queued at their accept, %d taken by the feeder; want the queue's 4 and none", q, f)
	}
	// Room in the queue (as if layer 1 took the four), ten still in their
	// rows: three new accepts are left to the feeder, behind the ten.
	held := []model.CouponRequest{<-e.decider.in.ch, <-e.decider.in.ch, <-e.decider.in.ch, <-e.decider.in.ch}
	extra := d.requests(3, 1_000_000, 13)
	for i := range extra {
		extra[i].Serial += "-extra"
		if _, _, err := e.Accept(ctx, extra[i]); err != nil {
			t.Fatal(err)
		}
	}
	if q := e.Stats.Queued.Load(); q != 4 {
		t.Errorf("%d queued at their accept, want 4: a new accept jumped the ten waiting", q)
	}
	go func() { // back into the queue, behind whatever the feeder put there
		for _, r := range held {
			e.decider.in.ch <- r
		}
	}()
	close(g.open)
	rs = append(rs, extra...)
	d.waitFinal(rs, 30*time.Second)
	if f := e.Stats.Fed.Load(); f != 13 {
		t.Errorf("the feeder took %d, want the 13 that waited in their rows", f)
	}
	testenv.Advance(200 * time.Millisecond) // the feeder's next passes find nothing left
	later := d.requests(5, 1_000_000, 12)
	for i := range later {
		later[i].Serial += "-later"
		if _, _, err := e.Accept(ctx, later[i]); err != nil {
			t.Fatal(err)
		}
		testenv.Advance(30 * time.Millisecond)
	}
	d.waitFinal(later, 30*time.Second)
	stop()
	if n := e.Stats.Queued.Load() - 4; n < 4 {
		t.Errorf("after the backlog: %d of 5 requests queued at their accept, want them all (or all but one)", n)
	}
	d.check(append(rs, later...))
}
