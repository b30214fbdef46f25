package couponq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// TestStockCopy drives the local copy of a batch's stock on a manual clock,
// with no engine running (the copy is refreshed by hand, as keepCopy does
// every copyEvery): a batch whose units are all held by a deduction is not
// refused (they may come back); once they are spent, a request is stored
// refused SOLD_OUT in its accept, decided when accepted, queued nowhere, and
// a repeat answers it as stored; a copy older than copyMaxAge, issuing held
// off, and a stock raised by a reload let requests through again. Only
// batches a request asked about within copyActive are read: none before
// the first request, none once the requests stopped that long ago.
func TestStockCopy(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(time.Now())
	st := memstore.New(clk)
	d := newDrop(t, st, 10, 10, 3)
	paused := false
	var levelReads []int // batches read by each Levels call
	levels := func(ctx context.Context, batches []string) (map[string]Level, error) {
		levelReads = append(levelReads, len(batches))
		return d.stock.Levels(ctx, batches)
	}
	e, err := New(Config{Store: st, Stock: d.stock, Catalog: func() *couponbatch.Catalog { return d.cat },
		Layer1: free{}, Layer2: free{}, DBs: func() []int { return nil }, Clock: clk, Levels: levels,
		Paused: func() bool { return paused }})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	req := func() model.CouponRequest {
		n++
		act := fmt.Sprintf("%s-p%d", d.pre, n)
		return model.CouponRequest{App: "pay", Serial: fmt.Sprintf("%s-s%d", d.pre, n), ActID: act, Shard: sharding.ShardOfAct(act), Batch: d.c}
	}
	acceptAs := func(what string, r model.CouponRequest, want model.CouponState) model.CouponRequest {
		t.Helper()
		queued := len(e.decider.in.ch)
		got, repeat, err := e.Accept(ctx, r)
		if err != nil || repeat || got.State != want {
			t.Fatalf("%s: %+v repeat %v %v; want %s", what, got, repeat, err, want)
		}
		if q := len(e.decider.in.ch) - queued; (want == model.CouponAccepted && !paused) != (q == 1) {
			t.Fatalf("%s: %d queued at its accept", what, q)
		}
		return got
	}

	e.refreshCopy(ctx)
	if len(levelReads) != 0 {
		t.Fatalf("levels read %v before any request asked", levelReads)
	}
	acceptAs("before any copy", req(), model.CouponAccepted)
	// All three units held by one deduction: none left, but they may come back.
	lease, granted, err := d.stock.Grant(ctx, d.c, 3)
	if err != nil || granted != 3 {
		t.Fatalf("grant: %d %v", granted, err)
	}
	e.refreshCopy(ctx)
	if l, ok := e.CopyOf(d.c); !ok || l != (Level{Left: 0, Held: 3}) {
		t.Fatalf("copy with the units held: %+v %v", l, ok)
	}
	acceptAs("units held", req(), model.CouponAccepted)
	// Spent: nothing left, nothing held.
	if err := d.stock.Return(ctx, d.c, lease, 0); err != nil {
		t.Fatal(err)
	}
	e.refreshCopy(ctx)
	clk.Advance(copyMaxAge) // as old as the copy may be and still refuse
	r := req()
	got := acceptAs("sold out", r, model.CouponRefused)
	if got.Reason != model.ReasonSoldOut || got.DecidedMS != got.AcceptedMS || got.AcceptedMS != clk.Now().UnixMilli() {
		t.Fatalf("refused at accept: %+v", got)
	}
	if stored, err := storage.CouponRequestOf(ctx, st, r.Shard, r.App, r.Serial); err != nil || stored != got {
		t.Fatalf("stored %+v %v; answered %+v", stored, err, got)
	}
	again, repeat, err := e.Accept(ctx, r)
	if err != nil || !repeat || again != got {
		t.Fatalf("repeat: %+v repeat %v %v; want %+v", again, repeat, err, got)
	}
	green := req()
	green.Green = true
	if g := acceptAs("green, sold out", green, model.CouponRefused); g.Reason != model.ReasonSoldOut {
		t.Fatalf("green: %+v", g)
	}
	if e.Stats.RefusedAtAccept.Load() != 2 || e.Stats.Refused.Load() != 2 || e.Stats.Accepted.Load() != 4 {
		t.Fatalf("stats: refused at accept %d, refused %d, accepted %d; want 2, 2, 4", e.Stats.RefusedAtAccept.Load(), e.Stats.Refused.Load(), e.Stats.Accepted.Load())
	}
	// Issuing held off: requests wait, accepted (for the feeder, not queued
	// at their accept), for the fix.
	paused = true
	acceptAs("issuing off", req(), model.CouponAccepted)
	paused = false
	// A copy too old refuses nothing.
	clk.Advance(time.Millisecond)
	acceptAs("copy too old", req(), model.CouponAccepted)
	// Raised by a reload (the home's row): the next refresh lets requests in.
	if _, err := storage.SetBudget(ctx, st, sharding.BudgetShard(StockKey(d.c)), StockKey(d.c), 5); err != nil {
		t.Fatal(err)
	}
	e.refreshCopy(ctx)
	if l, ok := e.CopyOf(d.c); !ok || l != (Level{Left: 2, Held: 0}) {
		t.Fatalf("copy after the stock was raised: %+v %v", l, ok)
	}
	acceptAs("stock raised", req(), model.CouponAccepted)
	if last := levelReads[len(levelReads)-1]; last != 1 {
		t.Fatalf("the last refresh read %d batches, want 1: the one asked about", last)
	}
	// No request for longer than copyActive: the copy is not read again.
	reads := len(levelReads)
	clk.Advance(copyActive + time.Millisecond)
	e.refreshCopy(ctx)
	if len(levelReads) != reads {
		t.Fatalf("levels read %v after %v without a request", levelReads[reads:], copyActive)
	}
}
