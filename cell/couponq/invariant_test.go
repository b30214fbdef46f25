package couponq

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
)

// The merger's stock-unit invariants fire on states only a bug can make:
// each test builds the state by hand (no store, no home) and shows the
// assertion's panic, then the same step on a sound state passing.

// greedyStock grants more units than asked: a broken home.
type greedyStock struct{ extra int64 }

func (g greedyStock) Grant(_ context.Context, _ string, want int64) (string, int64, error) {
	return "lease-g", want + g.extra, nil
}

func (greedyStock) Return(context.Context, string, string, int64) error { return nil }

// bareMerger is a merger with nothing held, over stock.
func bareMerger(stock Stock) *merger {
	cfg := Config{Stock: stock, Observe: noObserver{}, Log: slog.New(slog.DiscardHandler)}
	return newMerger(layerOf(cfg, 1, clock.Or(nil), nil, catalogOf(nil), &Stats{}), cfg, &handoff[queued]{ch: make(chan queued, 1)})
}

// heldOf makes m hold a lease of 5 units of batch b with 2 out with a
// merge (taken by keep, as a merge's deduction with prefetch does).
func heldOf(m *merger) *heldLease {
	return m.keep("b", "lease-1", 5, 2, time.Now())
}

func TestHeldLeaseConserved(t *testing.T) {
	testenv.WantPanic(t, "a unit lost", "granted = spent + unknown + left + out", func() {
		h := &heldLease{granted: 5, spent: 1, left: 2, out: 1}
		h.check()
	})
	testenv.WantPanic(t, "a unit made up", "granted = spent + unknown + left + out", func() {
		h := &heldLease{granted: 5, spent: 1, left: 4, out: 1}
		h.check()
	})
	testenv.WantPanic(t, "negative left", "units went negative", func() {
		h := &heldLease{granted: 5, spent: 6, left: -1}
		h.check()
	})
	(&heldLease{granted: 5, spent: 1, unknown: 1, left: 2, out: 1}).check()
}

func TestHeldLeaseMergeSpendsWhatItHolds(t *testing.T) {
	testenv.WantPanic(t, "ends more than it took", "0 <= unused <= n <= out", func() {
		m := bareMerger(greedyStock{})
		m.endHeld(heldOf(m), 3, 0, false) // the merge took 2
	})
	testenv.WantPanic(t, "gives back more than it took", "0 <= unused <= n <= out", func() {
		m := bareMerger(greedyStock{})
		m.endHeld(heldOf(m), 2, 3, false)
	})
	testenv.WantPanic(t, "spends more than it took", "0 <= unused <= n <= out", func() {
		m := bareMerger(greedyStock{})
		m.endHeld(heldOf(m), 2, -1, false)
	})
	testenv.WantPanic(t, "kept without units beyond the merge's", "granted > n >= 1", func() {
		m := bareMerger(greedyStock{})
		m.keep("b", "lease-1", 2, 2, time.Now())
	})
	m := bareMerger(greedyStock{})
	h := heldOf(m)
	if open := m.endHeld(h, 2, 1, false); open != 0 || h.spent != 1 || h.left != 4 || h.out != 0 {
		t.Fatalf("a merge that spent 1 of its 2: open %d, lease %+v; want spent 1, left 4, out 0", open, *h)
	}
	if got := m.fromHeld("b", 4); got != h || h.left != 0 || h.out != 4 {
		t.Fatalf("a merge of 4 from the lease: %p (want %p), lease %+v", got, h, *h)
	}
	if open := m.endHeld(h, 4, 0, true); open != 4 || h.unknown != 4 {
		t.Fatalf("a lost answer: open %d, lease %+v; want 4 open, 4 unknown", open, *h)
	}
}

func TestHeldLeaseClosedWhole(t *testing.T) {
	testenv.WantPanic(t, "returned off", "granted = spent + returned", func() {
		m := bareMerger(greedyStock{})
		h := heldOf(m)
		m.endHeld(h, 2, 0, false)
		h.left-- // a unit gone from the books: the return would lose it
		m.closeHeld(context.Background(), true)
	})
	m := bareMerger(greedyStock{})
	m.endHeld(heldOf(m), 2, 0, false)
	m.closeHeld(context.Background(), true)
	if len(m.held) != 0 {
		t.Fatalf("held leases after closing all: %d", len(m.held))
	}
}

func TestInflightCoversHeld(t *testing.T) {
	testenv.WantPanic(t, "inflight below out", "inflight >= out >= 0", func() {
		m := bareMerger(greedyStock{})
		heldOf(m)
		m.mu.Lock()
		m.inflight["b"]-- // a merge's units forgotten while its issue runs
		m.checkInflightLocked("b")
	})
	m := bareMerger(greedyStock{})
	heldOf(m)
	m.mu.Lock()
	m.checkInflightLocked("b")
	m.mu.Unlock()
}

func TestDeductionAndIssueAnswers(t *testing.T) {
	// A home's answer beyond what was asked is refused as an error (it may
	// be another cell's), never asserted.
	if _, granted, _, err := bareMerger(greedyStock{extra: 1}).grant(context.Background(), "b", 3, 3, false); err == nil || granted != 0 {
		t.Fatalf("a grant of 4 for 3 asked: %d %v, want an error", granted, err)
	}
	if _, granted, _, err := bareMerger(greedyStock{}).grant(context.Background(), "b", 3, 3, false); err != nil || granted != 3 {
		t.Fatalf("a grant of 3: %d %v", granted, err)
	}
	issued := []model.CouponDecision{{Issued: true}, {Issued: true}, {Reason: model.ReasonLimit}}
	testenv.WantPanic(t, "a coupon without its unit", "coupons + unused = units", func() {
		checkIssued(2, 1, issued) // 2 coupons and 1 unused of 2 units
	})
	testenv.WantPanic(t, "a unit lost", "coupons + unused = units", func() {
		checkIssued(4, 1, issued)
	})
	testenv.WantPanic(t, "negative unused", "coupons + unused = units", func() {
		checkIssued(1, -1, issued)
	})
	checkIssued(3, 1, issued)
	testenv.WantPanic(t, "more requests than units", "1 <= n <= granted", func() {
		m := bareMerger(greedyStock{})
		reqs := []model.CouponRequest{{Batch: "b"}, {Batch: "b"}}
		_ = m.issueGranted(context.Background(), model.CouponRule{Batch: "b"}, reqs, "lease-1", 1, true)
	})
}
