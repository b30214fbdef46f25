package model

import (
	"strings"
	"testing"
	"time"
)

// couponLedgers: cell a homes batch x (stock 10) with two deductions, one
// returned keeping 3 and one expired holding 2; cell b holds the coupons.
func couponLedgers(coupons map[string]int64, byBatch int64) []Ledger {
	a, b := NewLedger("a"), NewLedger("b")
	a.RewardRows.Budgets = []Budget{{Key: CouponStockPrefix + "x", Total: 10, Granted: 9, Returned: 4}}
	a.RewardRows.Leases = []Lease{
		{ID: "l1", Key: CouponStockPrefix + "x", Amount: 7, Unspent: 4, State: LeaseReturned},
		{ID: "l2", Key: CouponStockPrefix + "x", Amount: 2, State: LeaseExpired},
	}
	b.CouponRows = CouponRows{Requests: map[CouponState]int64{CouponIssued: byBatch, CouponRefused: 1}, ByBatch: map[string]int64{"x": byBatch},
		LeaseSpent: coupons, Multi: []CouponCount{{ActID: "ann", Batch: "x", N: 2}}}
	return []Ledger{a, b}
}

func TestAuditCoupons(t *testing.T) {
	r := Audit(couponLedgers(map[string]int64{"l1": 3, "l2": 1}, 4))
	if !r.OK() {
		t.Fatalf("clean books: %v", r.Problems)
	}
	want := CouponBatchLine{Batch: "x", Stock: 10, Issued: 4, Left: 5, WrittenOff: 1, Outstanding: 5}
	if len(r.Coupons.Batches) != 1 || r.Coupons.Batches[0] != want || r.Coupons.Requests["issued"] != 4 || r.Coupons.Open != 0 {
		t.Fatalf("report %+v", r.Coupons)
	}
	if len(r.RewardRows.Budgets) != 0 {
		t.Fatalf("a batch's stock listed as a reward budget: %+v", r.RewardRows.Budgets)
	}
	// The limit: ann's two coupons of x pass a limit of 1, not one of 2.
	r.CheckCoupons(map[string]int{"x": 2}, time.UnixMilli(0))
	if !r.OK() {
		t.Fatalf("limit 2: %v", r.Problems)
	}
	r.CheckCoupons(map[string]int{"x": 1}, time.UnixMilli(0))
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "ann holds 2 coupons of x, above its limit 1") {
		t.Fatalf("limit 1: %v", r.Problems)
	}

	for name, c := range map[string]struct {
		spent   map[string]int64
		byBatch int64
		edit    func(ls []Ledger)
		problem string
	}{
		"returned lease over what it kept": {map[string]int64{"l1": 4, "l2": 1}, 5, nil, "deduction l1 of coupon/x: 4 coupons above the 3 it kept"},
		"lease over its amount":            {map[string]int64{"l1": 3, "l2": 3}, 6, nil, "deduction l2 of coupon/x: 3 coupons above its amount 2"},
		"over-issued batch":                {map[string]int64{"l1": 3, "l2": 2, "": 1}, 6, nil, "batch x: stock 10, taken by deductions 5, issued 6: over-issued"},
		"group clash": {map[string]int64{"l1": 3}, 3, func(ls []Ledger) { ls[1].CouponRows.GroupClash = []string{"bob holds batches x,y of group g"} },
			"coupons: bob holds batches x,y of group g"},
		"invented coupon": {map[string]int64{"l1": 3}, 3, func(ls []Ledger) { ls[1].CouponRows.CouponNoRequest = 1 }, "1 coupons without their issued request"},
		"no stock row":    {map[string]int64{"l1": 3}, 3, func(ls []Ledger) { ls[1].CouponRows.ByBatch["z"] = 2 }, "batch z: 2 coupons and no stock row"},
	} {
		ls := couponLedgers(c.spent, c.byBatch)
		if c.edit != nil {
			c.edit(ls)
		}
		r := Audit(ls)
		if r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), c.problem) {
			t.Errorf("%s: problems %v, want %q", name, r.Problems, c.problem)
		}
	}

	// A request deciding since before the cut is lost; one accepted long
	// ago (a backlog, issuing held) is not.
	ls := couponLedgers(map[string]int64{"l1": 3}, 3)
	ls[1].CouponRows.Requests[CouponDeciding] = 2
	ls[1].CouponRows.Requests[CouponAccepted] = 5
	ls[1].CouponRows.OldestOpenMS = 100
	ls[1].CouponRows.OldestTakenMS = 1_000
	r = Audit(ls)
	r.CheckCoupons(nil, time.UnixMilli(500))
	if !r.OK() || r.Coupons.Open != 7 {
		t.Fatalf("taken after the cut: %v %+v", r.Problems, r.Coupons)
	}
	r.CheckCoupons(nil, time.UnixMilli(2_000))
	if r.OK() || !strings.Contains(r.Problems[0], "held by nobody (7 requests open)") {
		t.Fatalf("taken before the cut: %v", r.Problems)
	}
}
