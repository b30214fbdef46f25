package couponq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// flakyStock is a Stock whose calls fail at random: before the grant (no
// lease), after it (a lease granted and its answer lost), and returns
// likewise.
type flakyStock struct {
	inner *BudgetStock
	mu    sync.Mutex
	rng   *rand.Rand
	fail  atomic.Bool // on while the drop runs; off to settle
}

var errFlaky = errors.New("flaky stock: no answer")

func (f *flakyStock) roll() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(10)
}

func (f *flakyStock) Grant(ctx context.Context, batch string, want int64) (string, int64, error) {
	if f.fail.Load() {
		switch f.roll() {
		case 0:
			return "", 0, errFlaky // never reached the stock
		case 1:
			_, _, _ = f.inner.Grant(ctx, batch, want) // granted, the answer lost
			return "", 0, errFlaky
		}
	}
	return f.inner.Grant(ctx, batch, want)
}

func (f *flakyStock) Return(ctx context.Context, batch, leaseID string, unused int64) error {
	if f.fail.Load() && f.roll() == 0 {
		return errFlaky
	}
	return f.inner.Return(ctx, batch, leaseID, unused)
}

// TestLayersProperty: random interleavings of accepts, retries of a
// serial, the green channel, stock calls that fail or lose their answer,
// engines stopped mid-drop (their queues released) and new ones started
// over the same store never over-issue: after each seed's drop settles,
// every request is final, every coupon has its issued request, no batch
// passes its stock, no person a limit or a group, and no deduction holds
// more coupons than it kept (model.Audit over the in-memory store's rows).
func TestLayersProperty(t *testing.T) {
	seeds := 4
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			st := memstore.New(nil)
			d := newDrop(t, st, 40+rng.Int64N(80), 20+rng.Int64N(40), 30+rng.Int64N(60))
			stock := &flakyStock{inner: d.stock, rng: rand.New(rand.NewPCG(seed, 5))}
			stock.fail.Store(true)
			mk := func() *Engine {
				var prefetch int64 // held leases in half the engines
				if rng.IntN(2) == 0 {
					prefetch = 1 + rng.Int64N(16)
				}
				var gather [2]time.Duration // gatherers that wait in half the engines
				if rng.IntN(2) == 0 {
					gather = [2]time.Duration{time.Duration(rng.IntN(10)) * time.Millisecond, time.Duration(rng.IntN(30)) * time.Millisecond}
				}
				e, err := New(Config{Store: st, Stock: stock, Catalog: d.engine(free{}, free{}).cfg.Catalog, Layer1: free{}, Layer2: free{},
					DBs: d.engine(free{}, free{}).cfg.DBs, MergeMax: 1 + rng.IntN(24), Mergers: 1 + rng.IntN(4), QueueLen: 16 + rng.IntN(64),
					Prefetch: prefetch, Gather: gather, StaleAfter: 31 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			rs := make([]model.CouponRequest, 200+rng.IntN(200))
			batches := []string{d.a, d.a, d.b, d.c, d.c}
			for i := range rs {
				act := fmt.Sprintf("%s-p%d", d.pre, rng.IntN(60))
				rs[i] = model.CouponRequest{App: "pay", Serial: fmt.Sprintf("%s-s%d", d.pre, i), ActID: act, Shard: sharding.ShardOfAct(act),
					Batch: batches[rng.IntN(len(batches))], Green: rng.IntN(8) == 0}
			}
			// The drop in three parts, each by an engine of its own that is
			// stopped at a random moment; the client retries some serials
			// on the next engine.
			next := 0
			for part := range 3 {
				e := mk()
				_, stop := runEngine(e)
				end := min(len(rs), next+len(rs)/3+1)
				if part == 2 {
					end = len(rs)
				}
				var wg sync.WaitGroup
				work := make(chan int)
				for range 6 {
					wg.Go(func() {
						for i := range work {
							_, _, _ = e.Accept(context.Background(), rs[i]) // a green decision may fail with the stock: the request stays
							if i%5 == 0 {
								_, _, _ = e.Accept(context.Background(), rs[i]) // the client's retry
							}
						}
					})
				}
				for i := next; i < end; i++ {
					work <- i
				}
				close(work)
				wg.Wait()
				next = end
				time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
				stop()
			}
			// Settle with a steady stock, on a last engine; its first sweep
			// takes whatever an earlier one left deciding.
			stock.fail.Store(false)
			e := mk()
			_, stop := runEngine(e)
			var open int64
			if !testenv.Until(20*time.Second, func() bool {
				l, err := st.Ledger(context.Background(), "mem")
				if err != nil {
					t.Fatal(err)
				}
				open = l.CouponRows.Requests[model.CouponAccepted] + l.CouponRows.Requests[model.CouponDeciding]
				return open == 0
			}) {
				t.Fatalf("%d requests still open after 20 s", open)
			}
			stop()
			// Leases left open by lost answers are settled by their coupons,
			// as the cell does once they expire.
			settleOpenLeases(t, st, d)
			l, err := st.Ledger(context.Background(), "mem")
			if err != nil {
				t.Fatal(err)
			}
			rep := model.Audit([]model.Ledger{l})
			rep.CheckCoupons(map[string]int{d.a: 2, d.b: 1, d.c: 1}, time.Now().Add(time.Hour))
			if !rep.OK() {
				t.Fatalf("audit: %v", rep.Problems)
			}
			var issued, refused int64 = rep.Coupons.Requests["issued"], rep.Coupons.Requests["refused"]
			if issued+refused != int64(len(rs)) || issued == 0 {
				t.Fatalf("%d requests: %d issued, %d refused", len(rs), issued, refused)
			}
			for _, b := range rep.Coupons.Batches {
				if b.WrittenOff != 0 || b.Left < 0 {
					t.Errorf("batch %s after settling: %+v", b.Batch, b)
				}
			}
			t.Logf("%d requests: %d issued, %d refused; batches %+v", len(rs), issued, refused, rep.Coupons.Batches)
		})
	}
}

// settleOpenLeases returns what the leases still open did not spend,
// counting their coupons.
func settleOpenLeases(t *testing.T, st *memstore.Store, d *drop) {
	ctx := context.Background()
	dbs := make([]int, model.ShardCount/10)
	for i := range dbs {
		dbs[i] = i
	}
	for _, id := range []string{d.a, d.b, d.c} {
		sh, k := d.stock.home(id)
		_, ls, err := storage.Budget(ctx, st, sh, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.State == model.LeaseReturned {
				continue
			}
			spent, err := storage.CouponLeaseSpent(ctx, st, dbs, l.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := storage.ReturnLease(ctx, st, sh, l.ID, l.Amount-spent); err != nil {
				t.Fatal(err)
			}
		}
	}
}
