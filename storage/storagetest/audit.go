package storagetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractAuditRewardsAndWithdrawals", contractAuditRewardsAndWithdrawals)
}

// The audits count reward flows as money in and withdraw flows as money out:
// deposits + rewards - withdrawals = balances + open + in flight, in the
// Ledger (model.Audit, model.AuditCell) and in the store's own CellAudit
// alike, with no "unknown flow kind". The rows are written straight into the
// tables (Harness.PutFlow), so the audits are tested apart from the calls
// that will write them. A reward flow without its balance change, and a
// withdraw flow without its debit, are each reported: the account's balance
// against its flows, and a difference of exactly their amounts.
func contractAuditRewardsAndWithdrawals(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	if f.h.PutFlow == nil {
		t.Fatal("the harness has no PutFlow: this store's audits of reward and withdraw flows go untested")
	}
	// A reward whose balance change happens (delta = amount) is issued and
	// booked through the store, so its row and flow agree (the reward audit
	// checks them); one whose change never happened is a flow alone.
	reward := func(s model.ShardID, act, orderNo string, amount, delta model.Cents) {
		t.Helper()
		r := model.Reward{OrderNo: orderNo, ActID: act, Shard: s, Parent: "p", Child: "c", Stage: model.StageOfficial, Scene: "s1",
			Rain: "r1", AwardType: model.AwardCash, Amount: amount}
		if delta == amount {
			f.issue(r)
			if n, err := storage.BookRewards(f.ctx, f.s, []model.Reward{r}); err != nil || n != 1 {
				t.Fatalf("book %s: %d %v", orderNo, n, err)
			}
			return
		}
		fl, ok := model.RewardFlow(r, f.nowMS())
		if !ok {
			t.Fatalf("reward %s is not booked into the wallet", orderNo)
		}
		f.h.PutFlow(s, fl, delta)
	}
	withdraw := func(s model.ShardID, act, orderNo string, amount, delta model.Cents) {
		t.Helper()
		out, err := model.ApplyWithdraw(model.WithdrawInput{ActID: act, OrderNo: orderNo, Amount: amount,
			Balance: f.balance(s, act), NowMS: f.nowMS()})
		if err != nil {
			t.Fatalf("withdraw %d from %s: %v", amount, act, err)
		}
		f.h.PutFlow(s, out.Flow, delta)
	}

	f.deposit(sA, "ann", "d1", 1000)
	reward(sA, "ann", "ann_s1_r1_cash_official", 250, 250)
	reward(sC, "bob", "bob_s1_r1_cash_official", 300, 300) // a wallet the reward opens
	withdraw(sA, "ann", "w1", 400, -400)
	f.check(books{deposits: 1000, rewards: 550, withdrawals: 400, balances: 850 + 300})
	if got := f.balance(sA, "ann"); got != 850 {
		t.Fatalf("ann's balance %d, want 1000 + 250 - 400", got)
	}
	// With a packet and a claim in flight the four terms meet:
	// 1000 + 550 - 400 = balances 550 + 300 + open (300 - c) + in flight c.
	_, ref := f.send(sA, sendReq("ann", "s1", 300, 2), time.Hour)
	res, _ := f.open(ref, 3, opener("dee", sC))
	c := res[0].Claim.Amount
	l := f.check(books{deposits: 1000, rewards: 550, withdrawals: 400, balances: 550 + 300, open: 300 - c, inFlight: c,
		sends: 300, packets: 1, claims: 1})
	a := f.sameCellAudit(l)
	if !a.OK() || a.Rewards != 550 || a.Withdrawals != 400 || a.Deposits != 1000 || a.Sends != 300 || a.Balances != 850 {
		t.Fatalf("the store's cell audit: %+v", a)
	}

	// A reward flow whose balance change never happened: 70 cents the
	// activity's budget paid that no wallet holds.
	reward(sC, "bob", "bob_s2_r1_cash_official", 70, 0)
	f.wantBroken(70, "account bob (shard 567): balance 300, flows sum to 370")
	// And a withdraw flow without its debit: 50 cents paid out twice.
	withdraw(sA, "ann", "w2", 50, 0)
	f.wantBroken(70-50, "account ann (shard 123): balance 550, flows sum to 500")
}

// wantBroken reads the books and checks that the cluster audit, the cell's
// audit of the Ledger and the store's own CellAudit all fail with exactly
// difference diff, that the account line problem is among the problems, and
// that no flow kind is unknown.
func (f *fixture) wantBroken(diff model.Cents, problem string) {
	f.t.Helper()
	l, err := f.s.Ledger(f.ctx, f.cell)
	if err != nil {
		f.t.Fatalf("ledger: %v", err)
	}
	r := model.Audit([]model.Ledger{l})
	a := f.sameCellAudit(l)
	for _, ps := range [][]string{l.Problems, r.Problems, a.Problems} {
		for _, p := range ps {
			if strings.Contains(p, "unknown flow kind") {
				f.t.Fatalf("problem %q", p)
			}
		}
	}
	if r.OK() || r.Difference != diff || !slices.Contains(l.Problems, problem) {
		f.t.Fatalf("audit: difference %d (want %d), ledger problems %q (want %q)", r.Difference, diff, l.Problems, problem)
	}
	if a.OK() || a.Difference != diff || !slices.Contains(a.Problems, problem) {
		f.t.Fatalf("cell audit: difference %d (want %d), problems %q (want %q)", a.Difference, diff, a.Problems, problem)
	}
}
