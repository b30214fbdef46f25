package budget

import (
	"context"
	"errors"
	"strings"
	"testing"

	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// A cell dies holding leases; restarted, it finds them (LeasesOf, open and
// expired alike), learns what its issues spent from each, and Settle gives
// the rest back: the home then has exactly the spent amount out. Settling
// again changes nothing.
func TestSettleReturnsWhatWasNotSpent(t *testing.T) {
	r := newRig(t, 10_000)
	ctx := context.Background()
	dead := r.pool("cell-a", Config{Chunk: func(int64) int64 { return 100 }})
	var took ledger
	for i := range 40 { // 155 in all: more than a chunk, so two leases at least
		id, err := dead.Take(ctx, testKey, 10_000, int64(1+i%7))
		if err != nil {
			t.Fatal(err)
		}
		took.add(id, int64(1+i%7))
	}
	if err := dead.waitFetches(ctx); err != nil { // a refill in flight lands before the "crash"
		t.Fatal(err)
	}
	// The home expires what is due meanwhile; expired leases are settled too.
	s := sharding.BudgetShard(testKey)
	if _, err := storage.ExpireLeases(ctx, r.store, s, testKey, start.Add(dead.cfg.TTL).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	found, err := storage.LeasesOf(ctx, r.store, s, "cell-a")
	if err != nil || len(found) < 2 {
		t.Fatalf("leases of the dead cell: %+v, %v; want at least 2", found, err)
	}
	var granted int64
	for _, l := range found {
		granted += l.Amount
	}
	spent := func(id string) (int64, error) { return took.byLease[id], nil }
	homes := func(string) Home { return r.home }
	returned, err := Settle(ctx, homes, found, spent)
	if err != nil || returned != granted-took.sum {
		t.Fatalf("settle: %d returned, %v; want %d (granted %d, spent %d)", returned, err, granted-took.sum, granted, took.sum)
	}
	b, leases := r.rows()
	if b.Outstanding() != took.sum {
		t.Fatalf("after settling: %d out, %d spent", b.Outstanding(), took.sum)
	}
	if left, err := storage.LeasesOf(ctx, r.store, s, "cell-a"); err != nil || len(left) != 0 {
		t.Fatalf("leases left to settle: %+v, %v", left, err)
	}
	// Again, with the stale list: the homes change nothing.
	if _, err := Settle(ctx, homes, found, spent); err != nil {
		t.Fatal(err)
	}
	if b2, _ := r.rows(); b2 != b {
		t.Fatalf("a second settle moved the budget: %+v, then %+v", b, b2)
	}
	for _, l := range leases {
		if l.State != model.LeaseReturned {
			t.Errorf("lease %+v not returned", l)
		}
	}
}

// A lease whose issues add up to more than its amount is closed with nothing
// returned and reported; a lease whose spending cannot be read is left for a
// later settle; the others are settled.
func TestSettleReportsWhatItCannotSettle(t *testing.T) {
	r := newRig(t, 1000)
	ctx := context.Background()
	s := sharding.BudgetShard(testKey)
	var ls []model.Lease
	for range 3 {
		l, err := storage.GrantLease(ctx, r.store, s, testKey, "cell-a", 100, 0, start.UnixMilli()+60_000)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	broken := errors.New("reward rows unreadable")
	spent := func(id string) (int64, error) {
		switch id {
		case ls[0].ID:
			return 130, nil
		case ls[1].ID:
			return 0, broken
		}
		return 40, nil
	}
	returned, err := Settle(ctx, func(string) Home { return r.home }, ls, spent)
	if returned != 60 || !errors.Is(err, broken) || !strings.Contains(err.Error(), "130 issued") {
		t.Fatalf("settle: %d returned, %v; want 60, and both problems reported", returned, err)
	}
	_, leases := r.rows()
	if l := leases[ls[0].ID]; l.State != model.LeaseReturned || l.Unspent != 0 {
		t.Errorf("the overspent lease: %+v; want closed with 0 back", l)
	}
	if l := leases[ls[1].ID]; l.State != model.LeaseOpen {
		t.Errorf("the unreadable lease: %+v; want still open", l)
	}
	if l := leases[ls[2].ID]; l.Unspent != 60 {
		t.Errorf("the settled lease: %+v; want 60 back", l)
	}
}
