package budget

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

const testKey = "cny/official/rain-1"

var start = time.Date(2027, 2, 9, 20, 0, 0, 0, time.UTC)

// storeRows is Rows over a store's lease ops.
type storeRows struct{ g storage.Grouper }

func (r storeRows) GrantLease(ctx context.Context, s model.ShardID, key, holder string, want, reserve, expiresMS int64) (model.Lease, error) {
	return storage.GrantLease(ctx, r.g, s, key, holder, want, reserve, expiresMS)
}

func (r storeRows) ReturnLease(ctx context.Context, s model.ShardID, leaseID string, unspent int64) (model.Lease, error) {
	return storage.ReturnLease(ctx, r.g, s, leaseID, unspent)
}

// home is the scene's home over memstore's budget ops (which passes the store
// contract, storage/storagetest), counting grants; with gate set, each grant
// waits for a receive from it.
type home struct {
	Home
	grants atomic.Int64
	gate   chan struct{}
}

func (h *home) Grant(ctx context.Context, key, holder string, want, reserve int64, ttl time.Duration) (model.Lease, error) {
	h.grants.Add(1)
	if h.gate != nil {
		<-h.gate
	}
	return h.Home.Grant(ctx, key, holder, want, reserve, ttl)
}

type rig struct {
	t     *testing.T
	clk   *clock.Manual
	store *memstore.Store
	home  *home
}

func newRig(t *testing.T, total int64) *rig {
	clk := clock.NewManual(start)
	store := memstore.New(clk)
	if _, err := storage.SetBudget(context.Background(), store, sharding.BudgetShard(testKey), testKey, total); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, clk: clk, store: store, home: &home{Home: LocalHome(storeRows{store}, clk)}}
}

func (r *rig) pool(holder string, cfg Config) *Pool {
	return NewPool(holder, func(string) Home { return r.home }, r.clk, cfg)
}

// rows reads the budget and its leases by ID.
func (r *rig) rows() (model.Budget, map[string]model.Lease) {
	r.t.Helper()
	b, ls, err := storage.Budget(context.Background(), r.store, sharding.BudgetShard(testKey), testKey)
	if err != nil {
		r.t.Fatal(err)
	}
	byID := map[string]model.Lease{}
	for _, l := range ls {
		byID[l.ID] = l
	}
	return b, byID
}

// ledger records what Takes answered, by lease.
type ledger struct {
	mu      sync.Mutex
	byLease map[string]int64
	sum     int64
}

func (l *ledger) add(id string, amount int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byLease == nil {
		l.byLease = map[string]int64{}
	}
	l.byLease[id] += amount
	l.sum += amount
}

// Eight goroutines on two cells take random amounts until the budget is
// exhausted: they never take more than the budget minus the reserve, no
// lease gives more than its amount, and after both cells drain, the home has
// exactly what they took out (ReturnAll gave back exactly the rest).
func TestTakeNeverPassesTheBudget(t *testing.T) {
	const total = 10_000 // default reserve 1,000, chunk 50
	r := newRig(t, total)
	pools := []*Pool{r.pool("cell-a", Config{}), r.pool("cell-b", Config{})}
	var took ledger
	var wg sync.WaitGroup
	for g := range 8 {
		p := pools[g%2]
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 1))
			for {
				amount := 1 + rnd.Int64N(30)
				id, err := p.Take(context.Background(), testKey, total, amount)
				switch {
				case errors.Is(err, model.ErrBudgetExhausted):
					return
				case errors.Is(err, model.ErrOverloaded):
					continue
				case err != nil:
					t.Error(err)
					return
				}
				took.add(id, amount)
			}
		})
	}
	wg.Wait()
	b, leases := r.rows()
	if took.sum > total-total/10 || b.Granted != total-total/10 {
		t.Fatalf("took %d, the home granted %d; want at most %d taken and all of it granted", took.sum, b.Granted, total-total/10)
	}
	for id, n := range took.byLease {
		if l, ok := leases[id]; !ok || n > l.Amount {
			t.Errorf("lease %s (%+v) gave %d", id, l, n)
		}
	}
	if got := pools[0].Spent(testKey) + pools[1].Spent(testKey); got != took.sum {
		t.Errorf("Spent says %d, the takes %d", got, took.sum)
	}
	for _, p := range pools {
		if err := p.ReturnAll(context.Background()); err != nil {
			t.Fatal(err)
		}
		if ls := p.Leases(); len(ls) != 0 {
			t.Errorf("leases held after ReturnAll: %+v", ls)
		}
	}
	b, leases = r.rows()
	if b.Outstanding() != took.sum {
		t.Fatalf("after draining: %d out at the home, %d taken", b.Outstanding(), took.sum)
	}
	for id, l := range leases {
		if l.State != model.LeaseReturned || l.Amount-l.Unspent != took.byLease[id] {
			t.Errorf("lease %+v: %d taken from it", l, took.byLease[id])
		}
	}
	t.Logf("%d taken in %d leases (%d grants asked)", took.sum, len(leases), r.home.grants.Load())
}

// Give puts an amount back in the lease it came from: the next Take spends
// it again, and what the pool counts as spent drops.
func TestGiveRestores(t *testing.T) { synctest.Test(t, testGiveRestores) }

func testGiveRestores(t *testing.T) {
	r := newRig(t, 1000)
	p := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 100 }})
	ctx := context.Background()
	id, err := p.Take(ctx, testKey, 1000, 60)
	if err != nil {
		t.Fatal(err)
	}
	p.Give(testKey, id, 60)
	if s := p.Spent(testKey); s != 0 {
		t.Fatalf("spent %d after Give, want 0", s)
	}
	if ls := p.Leases(); len(ls) != 1 || ls[0].ID != id || ls[0].Unspent != 100 {
		t.Fatalf("leases after Give: %+v; want %s with all 100 left", ls, id)
	}
	if g := r.home.grants.Load(); g != 1 {
		t.Fatalf("%d grants before the second take, want 1", g)
	}
	again, err := p.Take(ctx, testKey, 1000, 100)
	if err != nil || again != id {
		t.Fatalf("take of the whole lease after Give: %s, %v; want %s", again, err, id)
	}
	// The take emptied the lease, which starts one refill in the background
	// (RefillBelow): once it is in, the home granted exactly twice, the
	// first lease and that refill, never a lease for the take itself.
	synctest.Wait()
	if len(p.Leases()) < 2 {
		t.Fatalf("no refill once the lease was emptied and the pool settled: leases %+v", p.Leases())
	}
	if g := r.home.grants.Load(); g != 2 {
		t.Fatalf("%d grants, want 2 (the first lease and the refill after it was emptied)", g)
	}
	p.Give("other/key/x", id, 5) // an unknown key: nothing happens
}

// A lease past its TTL is not spent from: the next Take takes a new one, and
// Sweep returns the old one's unspent part. A Give to it after that is lost
// (under-issue, never over-issue).
func TestExpiredLeaseIsNotSpentFrom(t *testing.T) {
	r := newRig(t, 1000)
	cfg := Config{Chunk: func(int64) int64 { return 100 }, TTL: 10 * time.Second}
	p := r.pool("cell-a", cfg)
	ctx := context.Background()
	first, err := p.Take(ctx, testKey, 1000, 30)
	if err != nil {
		t.Fatal(err)
	}
	r.clk.Advance(10 * time.Second)
	second, err := p.Take(ctx, testKey, 1000, 30)
	if err != nil || second == first {
		t.Fatalf("take after the TTL: %s, %v; want a new lease, not %s", second, err, first)
	}
	p.Sweep(ctx)
	_, leases := r.rows()
	if l := leases[first]; l.State != model.LeaseReturned || l.Unspent != 70 {
		t.Fatalf("the expired lease after Sweep: %+v; want returned with 70", l)
	}
	if l := leases[second]; l.State != model.LeaseOpen {
		t.Fatalf("the new lease after Sweep: %+v; want open", l)
	}
	p.Give(testKey, first, 30)
	if ls := p.Leases(); len(ls) != 1 || ls[0].ID != second || ls[0].Unspent != 70 {
		t.Fatalf("leases held: %+v; want only %s with 70 left", ls, second)
	}
}

// Issuing stops at the reserve with BUDGET_EXHAUSTED; after that the home is
// not asked again until ExhaustedWait passes. A scene without a reserve
// spends all of it.
func TestExhaustedAtTheReserve(t *testing.T) {
	r := newRig(t, 100) // default reserve: 10
	p := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 20 }})
	ctx := context.Background()
	for i := range 9 {
		if _, err := p.Take(ctx, testKey, 100, 10); err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
	}
	grants := r.home.grants.Load()
	for range 3 {
		if _, err := p.Take(ctx, testKey, 100, 10); !errors.Is(err, model.ErrBudgetExhausted) {
			t.Fatalf("take past the reserve: %v, want BUDGET_EXHAUSTED", err)
		}
	}
	if g := r.home.grants.Load(); g > grants+1 {
		t.Fatalf("%d grants asked after exhaustion, want at most 1", g-grants)
	}
	r.clk.Advance(time.Second)
	grants = r.home.grants.Load()
	if _, err := p.Take(ctx, testKey, 100, 10); !errors.Is(err, model.ErrBudgetExhausted) || r.home.grants.Load() != grants+1 {
		t.Fatalf("take a second later: %v with %d grants; want the home asked once, still exhausted", err, r.home.grants.Load()-grants)
	}
	if b, _ := r.rows(); b.Granted != 90 {
		t.Fatalf("granted %d, want 90", b.Granted)
	}

	r = newRig(t, 100)
	p = r.pool("cell-a", Config{Chunk: func(int64) int64 { return 20 }, Reserve: func(string, int64) int64 { return 0 }})
	for i := range 10 {
		if _, err := p.Take(ctx, testKey, 100, 10); err != nil {
			t.Fatalf("take %d without a reserve: %v", i, err)
		}
	}
	if _, err := p.Take(ctx, testKey, 100, 1); !errors.Is(err, model.ErrBudgetExhausted) {
		t.Fatalf("take past the budget: %v", err)
	}
}

// An amount is never split across leases: a lease with less left than the
// amount stays for smaller takes, and a budget that cannot grant the amount
// whole is exhausted for it.
func TestAmountIsNeverSplit(t *testing.T) {
	r := newRig(t, 100)
	p := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 50 }, Reserve: func(string, int64) int64 { return 0 }})
	ctx := context.Background()
	a, _ := p.Take(ctx, testKey, 100, 40) // lease A: 10 left
	b, err := p.Take(ctx, testKey, 100, 40)
	if err != nil || b == a {
		t.Fatalf("40 more: %s, %v; want a second lease", b, err)
	}
	if _, err := p.Take(ctx, testKey, 100, 20); !errors.Is(err, model.ErrBudgetExhausted) {
		t.Fatalf("20 with 10 left in each lease: %v, want BUDGET_EXHAUSTED", err)
	}
	if id, err := p.Take(ctx, testKey, 100, 10); err != nil || id != a {
		t.Fatalf("10: %s, %v; want the oldest lease %s", id, err, a)
	}
}

// Concurrent Takes that need a lease share one home call; the Take that
// leaves the leases low starts the next fetch in the background.
func TestOneFetchInFlight(t *testing.T) { synctest.Test(t, testOneFetchInFlight) }

func testOneFetchInFlight(t *testing.T) {
	r := newRig(t, 100_000)
	r.home.gate = make(chan struct{})
	p := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 100 }})
	ctx := context.Background()
	const takers = 7 // 70 of the chunk of 100: 30 left, not low yet
	ids := make(chan string, takers)
	var wg sync.WaitGroup
	for range takers {
		wg.Go(func() {
			id, err := p.Take(ctx, testKey, 100_000, 10)
			if err != nil {
				t.Error(err)
			}
			ids <- id
		})
	}
	synctest.Wait() // one Take's fetch waits at the gate, the others queue behind it
	if g := r.home.grants.Load(); g != 1 {
		t.Fatalf("%d grants asked while %d takes wait for a lease, want 1", g, takers)
	}
	r.home.gate <- struct{}{}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Fatalf("takes answered leases %s and %s; want one", first, id)
		}
	}
	if g := r.home.grants.Load(); g != 1 {
		t.Fatalf("%d grants for %d takes of one chunk, want 1", g, takers)
	}
	// 10 more leaves 20, below a quarter of the chunk: the next lease is
	// fetched ahead of need, and this Take does not wait for it.
	if id, err := p.Take(ctx, testKey, 100_000, 10); err != nil || id != first {
		t.Fatalf("take that leaves the lease low: %s, %v", id, err)
	}
	synctest.Wait() // the fetch ahead of need waits at the gate
	if g := r.home.grants.Load(); g != 2 {
		t.Fatalf("%d grants once the lease is low, want 2 (the fetch ahead of need)", g)
	}
	r.home.gate <- struct{}{}
	synctest.Wait()
	if ls := p.Leases(); len(ls) < 2 {
		t.Fatalf("leases %+v after the fetch ahead of need was granted, want 2", ls)
	}
	if id, err := p.Take(ctx, testKey, 100_000, 20); err != nil || id != first {
		t.Fatalf("take of the old lease's last 20: %s, %v; want the oldest lease spent first", id, err)
	}
}

// A Take that waits for the home gives up with its ctx; the fetch goes on
// and its lease serves the next Take.
func TestTakeHonoursItsContext(t *testing.T) {
	r := newRig(t, 1000)
	r.home.gate = make(chan struct{})
	p := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 100 }})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Take(ctx, testKey, 1000, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("take with a canceled ctx: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Take(ctx, testKey, 1000, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take while the home hangs: %v", err)
	}
	r.home.gate <- struct{}{}
	if _, err := p.Take(context.Background(), testKey, 1000, 10); err != nil || r.home.grants.Load() != 1 {
		t.Fatalf("take after the fetch ended: %v, %d grants", err, r.home.grants.Load())
	}
}

func TestTakeRefusesBadAmounts(t *testing.T) {
	r := newRig(t, 1000)
	p := r.pool("cell-a", Config{})
	for _, c := range [][2]int64{{1000, 0}, {1000, -5}, {0, 1}} {
		if _, err := p.Take(context.Background(), testKey, c[0], c[1]); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("take %d of %d: %v, want INVALID_ARGUMENT", c[1], c[0], err)
		}
	}
	if _, err := p.Take(context.Background(), "no/such/scene", 1000, 1); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("take of a budget never set: %v, want NOT_FOUND", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, c := range []Config{{TTL: time.Millisecond}, {RefillBelow: 1}, {FetchTimeout: time.Minute}, {ExhaustedWait: -1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v passed", c)
		}
	}
}
