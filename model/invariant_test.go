package model

import (
	"errors"
	"testing"

	"redcell/internal/testenv"
)

// The reward, withdrawal, credit, budget and coupon decisions assert their
// invariants: each case hands a decision (or its postcondition check) a state
// only a bug can produce and wants the panic naming the rule.

// wantPanic runs f and fails t unless it panics with a message holding want.

func TestApplyWithdraw(t *testing.T) {
	in := WithdrawInput{ActID: "ann", OrderNo: "w1", Amount: 300, Balance: 1000, NowMS: 5}
	out, err := ApplyWithdraw(in)
	if err != nil || out.Withdrawal.Balance != 700 || out.Flow.Amount != -300 || out.Flow.BalanceAfter != 700 {
		t.Fatalf("%+v %v", out, err)
	}
	in.Amount = 1001
	if _, err := ApplyWithdraw(in); !errors.Is(err, ErrInsufficientBalance) {
		t.Fatalf("above the balance: %v", err)
	}
	in.Amount = 1000
	if out, err := ApplyWithdraw(in); err != nil || out.Withdrawal.Balance != 0 {
		t.Fatalf("the whole balance: %+v %v", out, err)
	}
}

func TestWithdrawInvariants(t *testing.T) {
	in := WithdrawInput{ActID: "ann", OrderNo: "w1", Amount: 300, Balance: 1000, NowMS: 5}
	bad := in
	bad.Amount = 0
	testenv.WantPanic(t, "amount 0", "withdrawal of an unchecked amount", func() { _, _ = ApplyWithdraw(bad) })
	bad = in
	bad.Balance = -1
	testenv.WantPanic(t, "negative balance", "negative balance before a withdrawal", func() { _, _ = ApplyWithdraw(bad) })

	out, _ := ApplyWithdraw(in)
	lost := out
	lost.Withdrawal.Balance = 701 // a cent made up
	testenv.WantPanic(t, "balance not conserved", "balance before − amount", func() { checkWithdraw(in, lost) })
	wrongFlow := out
	wrongFlow.Flow.Amount = -299
	testenv.WantPanic(t, "flow off", "flow must move exactly −amount", func() { checkWithdraw(in, wrongFlow) })
}

func TestRewardFlowInvariants(t *testing.T) {
	r := Reward{OrderNo: "ann_s_r_cash_official", ActID: "ann", Stage: StageOfficial, Scene: "s", AwardType: AwardCash, Amount: 9}
	if f, ok := RewardFlow(r, 5); !ok || f.Amount != 9 || f.Kind != FlowReward {
		t.Fatalf("%+v %v", f, ok)
	}
	booked := r
	booked.Status = RewardBooked
	testenv.WantPanic(t, "booked twice", "a booked reward booked again", func() { RewardFlow(booked, 6) })
	empty := r
	empty.Amount = 0
	testenv.WantPanic(t, "no amount", "reward of no amount", func() { RewardFlow(empty, 6) })
	f, _ := RewardFlow(r, 5)
	f.Amount++
	testenv.WantPanic(t, "flow off", "credit exactly the reward's cents", func() { checkRewardFlow(r, f) })
}

func TestCreditInvariants(t *testing.T) {
	in := CreditInput{Credit: Credit{ClaimID: "c1", PacketID: testPacketID, ActID: "bob", Amount: 7}, NowMS: 3}
	out := ApplyCredit(in)
	booked := in
	booked.Booked = true
	testenv.WantPanic(t, "booked twice", "a credit booked twice", func() { checkCredit(booked, out) })
	off := out
	off.Flow.Amount = 8
	testenv.WantPanic(t, "flow off", "exactly its claim's cents", func() { checkCredit(in, off) })
}

func TestBudgetInvariants(t *testing.T) {
	broken := Budget{Key: "k", Total: 50, Granted: 90, Returned: 10} // 80 out of 50: no decision leads there
	testenv.WantPanic(t, "set on a broken row", "budget would be passed", func() { _, _ = SetBudgetTotal(broken, 100, 1) })
	testenv.WantPanic(t, "grant on a broken row", "budget would be passed",
		func() { _, _, _ = GrantLease(GrantInput{Budget: broken, ID: "l", Holder: "c", Want: 1}) })

	in := GrantInput{Budget: Budget{Key: "k", Total: 100}, ID: "l1", Holder: "c", Want: 70, Reserve: 10, NowMS: 5, ExpiresMS: 65}
	b, l, err := GrantLease(in)
	if err != nil {
		t.Fatal(err)
	}
	more := b
	more.Granted++ // a unit granted twice
	testenv.WantPanic(t, "granted off", "raise Granted by exactly its lease's units", func() { checkGrant(in, more, l) })
	big := l
	big.Amount = 71
	testenv.WantPanic(t, "above want", "a lease of 1..Want units", func() { checkGrant(in, b, big) })
	in.Reserve = 40 // the same grant against a larger reserve took some of it
	testenv.WantPanic(t, "reserve taken", "a grant took the reserve", func() { checkGrant(in, b, l) })

	other := l
	other.Key = "k2"
	testenv.WantPanic(t, "lease of another budget", "a lease of another budget", func() { _, _, _, _ = ReturnLease(b, other, 0, 6) })
	lost := b
	lost.Returned = 20 // Outstanding 50 < the open lease's 70
	testenv.WantPanic(t, "lease not outstanding", "an unreturned lease's units are not outstanding",
		func() { _, _, _, _ = ReturnLease(lost, l, 0, 6) })

	after, al, _, err := ReturnLease(b, l, 30, 7)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WantPanic(t, "returned twice", "a lease returned twice", func() { checkReturn(b, al, after, al) })
	skew := after
	skew.Returned++
	testenv.WantPanic(t, "returned off", "raise Returned by exactly the unspent units", func() { checkReturn(b, l, skew, al) })
}

func TestAssignCouponsInvariant(t *testing.T) {
	testenv.WantPanic(t, "a unit lost", "issued + unused = granted", func() { checkAssign(3, 1, 1) })
	testenv.WantPanic(t, "a coupon without stock", "issued + unused = granted", func() { checkAssign(1, 2, -1) })
	checkAssign(3, 2, 1)
}
