package model

import (
	"strings"
	"testing"
)

// TestAuditRewardRows: the reward rows against their flows and budgets. A
// booked official reward without its flow, a flow without its reward, a
// lease whose rewards pass its amount or what it kept when returned, and a
// budget whose leases pass it are each reported; clean books are not.
func TestAuditRewardRows(t *testing.T) {
	rows := func() (Ledger, Ledger) {
		a, b := NewLedger("a"), NewLedger("b")
		for _, r := range []Reward{
			{AwardType: AwardCash, Stage: StageOfficial, Amount: 300, Status: RewardBooked, LeaseID: "L1"},
			{AwardType: AwardCash, Stage: "gray", Amount: 50, Status: RewardBooked, LeaseID: "L2"},
			{AwardType: AwardCash, Stage: StageOfficial, Amount: 20, Status: RewardPending, LeaseID: "L1"},
			{AwardType: "coupon", Stage: StageOfficial, Amount: 1, Status: RewardBooked},
		} {
			a.RewardRows.AddReward(r)
		}
		a.Rewards, a.Balances, a.Deposits = 300, 300, 0
		b.RewardRows.AddReward(Reward{AwardType: AwardCash, Stage: StageOfficial, Amount: 80, Status: RewardPending, LeaseID: "L1"})
		b.RewardRows.Budgets = []Budget{{Key: "f/o/rain", Total: 1000, Granted: 600, Returned: 100}, {Key: "f/g/rain", Total: 50, Granted: 50}}
		b.RewardRows.Leases = []Lease{
			{ID: "L1", Key: "f/o/rain", Amount: 500, State: LeaseReturned, Unspent: 100},
			{ID: "L3", Key: "f/o/rain", Amount: 100, State: LeaseOpen},
			{ID: "L2", Key: "f/g/rain", Amount: 50, State: LeaseExpired},
		}
		return a, b
	}
	a, b := rows()
	r := Audit([]Ledger{a, b})
	want := []BudgetLine{{Key: "f/g/rain", Total: 50, Issued: 50, Unissued: 0, Outstanding: 50}, {Key: "f/o/rain", Total: 1000, Issued: 400, Unissued: 600, Outstanding: 500}}
	if !r.OK() || r.RewardRows.Count != 5 || r.RewardRows.Issued != 450 || r.RewardRows.Booked != 350 || r.RewardRows.Pending != 100 ||
		r.RewardRows.IntoWall != 300 || len(r.RewardRows.Budgets) != 2 || r.RewardRows.Budgets[0] != want[0] || r.RewardRows.Budgets[1] != want[1] {
		t.Fatalf("clean reward books: %+v", r)
	}
	for _, c := range []struct {
		name, problem string
		fault         func(a, b *Ledger)
	}{
		{"a booked official reward without its flow", "reward flows 0 != booked official cash rewards 300", func(a, b *Ledger) { a.Rewards, a.Balances = 0, 0 }},
		{"a reward flow without its reward", "reward flows 310 != booked official cash rewards 300", func(a, b *Ledger) { a.Rewards, a.Balances = 310, 310 }},
		{"a returned lease spent past what it kept", "above the 400 it kept", func(a, b *Ledger) { a.RewardRows.LeaseSpent["L1"] += 1 }},
		{"a lease spent past its amount", "above its amount 100", func(a, b *Ledger) {
			a.RewardRows.LeaseSpent["L3"] = 101
		}},
		{"leases past the budget", "issued passes what it may", func(a, b *Ledger) { b.RewardRows.Budgets[0].Granted = 1200 }},
	} {
		a, b := rows()
		c.fault(&a, &b)
		r := Audit([]Ledger{a, b})
		if r.OK() || !strings.Contains(strings.Join(r.Problems, ";"), c.problem) {
			t.Errorf("%s: %q, want a problem with %q", c.name, r.Problems, c.problem)
		}
	}
}
