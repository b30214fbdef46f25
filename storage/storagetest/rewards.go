package storagetest

import (
	"errors"
	"fmt"
	"redcell/storage"
	"sync"
	"testing"
	"time"

	"redcell/model"
)

func init() {
	register("ContractRewardIssue", contractRewardIssue)
	register("ContractRewardIssueConcurrent", contractRewardIssueConcurrent)
	register("ContractRewardBooking", contractRewardBooking)
	register("ContractRewardBookingCommitFault", contractRewardBookingCommitFault)
	register("ContractRewardWithdraw", contractRewardWithdraw)
	register("ContractRewardFlowListing", contractRewardFlowListing)
	register("ContractRewardLeaseSpent", contractRewardLeaseSpent)
	register("ContractGroupRewards", contractGroupRewards)
	register("ContractRewardRecon", contractRewardRecon)
	register("ContractGroupIssue", contractGroupIssue)
	register("ContractTakeBesideIssue", contractTakeBesideIssue)
}

// reward is a reward of act in shard s as the cell builds it.
func reward(s model.ShardID, act, scene, rain, award, stage string, amount model.Cents) model.Reward {
	r := model.Reward{ActID: act, Shard: s, App: "chat", Parent: "fest", Child: "fest-" + stage, Stage: stage,
		Scene: scene, Rain: rain, AwardType: award, Amount: amount, Token: "tok-" + rain}
	if award != model.AwardCash {
		r.TemplateID = "tpl-1"
	}
	r.OrderNo = model.RewardOrderNo(act, scene, rain, award, stage)
	return r
}

func (f *fixture) issue(r model.Reward) (model.Reward, bool) {
	f.t.Helper()
	got, repeat, err := storage.IssueReward(f.ctx, f.s, r)
	if err != nil {
		f.t.Fatalf("issue %s: %v", r.OrderNo, err)
	}
	return got, repeat
}

// A reward is stored pending at the store's time; the same order number
// again answers the stored one as a repeat, whatever time or token the retry
// carries; another amount or activity under it is ORDER_CONFLICT; rewards are
// read back one by one, listed newest first with a cursor that pages through
// rewards of one millisecond, by stage, and summed per stage.
func contractRewardIssue(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	r1 := reward(sA, "alice_1", "rain", "r1", model.AwardCash, "official", 500)
	got, repeat := f.issue(r1)
	want := r1
	want.CreatedMS, want.Status = now, model.RewardPending
	if repeat || got != want {
		t.Fatalf("first issue: %+v repeat %v, want %+v", got, repeat, want)
	}
	f.h.Clock.Advance(time.Second)
	again := r1
	again.Token = "another"
	if got, repeat := f.issue(again); !repeat || got != want {
		t.Fatalf("repeat: %+v repeat %v, want the first %+v", got, repeat, want)
	}
	for name, change := range map[string]func(*model.Reward){
		"amount": func(r *model.Reward) { r.Amount = 501 },
		"parent": func(r *model.Reward) { r.Parent = "other" },
		"child":  func(r *model.Reward) { r.Child = "other" },
	} {
		bad := r1
		change(&bad)
		if _, _, err := storage.IssueReward(f.ctx, f.s, bad); !errors.Is(err, model.ErrOrderConflict) {
			t.Errorf("same order number, another %s: %v, want ORDER_CONFLICT", name, err)
		}
	}
	if r, err := storage.Reward(f.ctx, f.s, sA, r1.OrderNo); err != nil || r != want {
		t.Fatalf("Reward: %+v %v, want %+v", r, err, want)
	}
	if _, err := storage.Reward(f.ctx, f.s, sA, r1.OrderNo+"x"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("Reward of an unknown order number: %v, want NOT_FOUND", err)
	}
	// Three more in one millisecond, one of them gray, one a coupon kind.
	f.h.Clock.Advance(time.Second)
	for _, r := range []model.Reward{
		reward(sA, "alice_1", "rain", "r2", model.AwardCash, "official", 200),
		reward(sA, "alice_1", "rain", "r2", model.AwardCash, "gray", 300),
		reward(sA, "alice_1", "card", "r2", "coupon", "official", 1),
		reward(sB, "bob", "rain", "r2", model.AwardCash, "official", 700), // another person, same database
	} {
		f.issue(r)
	}
	var seen []string
	cur := model.FlowCursor{}
	for range 10 {
		page, err := storage.RewardsOf(f.ctx, f.s, sA, "alice_1", "", cur, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		seen = append(seen, page[0].OrderNo)
		cur = model.FlowCursor{CreatedMS: page[0].CreatedMS, ID: page[0].OrderNo}
	}
	wantOrder := []string{"alice_1_rain_r2_cash_official", "alice_1_rain_r2_cash_gray", "alice_1_card_r2_coupon_official", r1.OrderNo}
	if fmt.Sprint(seen) != fmt.Sprint(wantOrder) {
		t.Fatalf("paged listing %v, want %v", seen, wantOrder)
	}
	gray, err := storage.RewardsOf(f.ctx, f.s, sA, "alice_1", "gray", model.FlowCursor{}, 10)
	if err != nil || len(gray) != 1 || gray[0].Amount != 300 {
		t.Fatalf("gray listing: %+v %v", gray, err)
	}
	sums, err := storage.RewardSums(f.ctx, f.s, sA, "alice_1")
	wantSums := []model.StageSums{{Stage: "gray", Pending: 300, Income: 300, PendingCount: 1},
		{Stage: "official", Pending: 700, Income: 700, PendingCount: 3}}
	if err != nil || fmt.Sprint(sums) != fmt.Sprint(wantSums) {
		t.Fatalf("sums %+v %v, want %+v", sums, err, wantSums)
	}
}

// Concurrent issues of one order number store one reward; every other call
// answers it as a repeat.
func contractRewardIssueConcurrent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	r := reward(sC, "carol", "rain", "r9", model.AwardCash, "official", 88)
	var wg sync.WaitGroup
	var mu sync.Mutex
	fresh, repeats := 0, 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, repeat, err := storage.IssueReward(f.ctx, f.s, r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("concurrent issue: %v", err)
			case repeat:
				repeats++
			default:
				fresh++
			}
		}()
	}
	wg.Wait()
	if fresh != 1 || repeats != 7 {
		t.Fatalf("8 concurrent issues: %d stored, %d repeats; want 1 and 7", fresh, repeats)
	}
}

// The booker takes pending rewards oldest first (processing), takes a
// processing one again only once it is stale, and books each once: official
// cash into the wallet (one reward flow), gray cash and coupon kinds by
// their state alone; a second booking changes nothing.
func contractRewardBooking(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	off := reward(sA, "dave", "rain", "r1", model.AwardCash, "official", 500)
	f.issue(off)
	f.h.Clock.Advance(time.Millisecond)
	gray := reward(sA, "dave", "rain", "r1", model.AwardCash, "gray", 300)
	f.issue(gray)
	f.h.Clock.Advance(time.Millisecond)
	card := reward(sB, "erin", "card", "r1", "coupon", "official", 1)
	f.issue(card)
	other := reward(sC, "frank", "rain", "r1", model.AwardCash, "official", 40) // database 56
	f.issue(other)
	taken, err := storage.TakeRewards(f.ctx, f.s, sA.DB(), f.nowMS()-60_000, 10)
	if err != nil || len(taken) != 3 || taken[0].OrderNo != off.OrderNo || taken[1].OrderNo != gray.OrderNo || taken[2].OrderNo != card.OrderNo {
		t.Fatalf("take: %+v %v; want the three rewards of database 12, oldest first", taken, err)
	}
	for _, r := range taken {
		if r.Status != model.RewardProcessing || r.ClaimedMS != f.nowMS() {
			t.Fatalf("taken %s: status %v claimed %d", r.OrderNo, r.Status, r.ClaimedMS)
		}
	}
	if again, err := storage.TakeRewards(f.ctx, f.s, sA.DB(), f.nowMS()-60_000, 10); err != nil || len(again) != 0 {
		t.Fatalf("take again before they are stale: %+v %v, want none", again, err)
	}
	f.h.Clock.Advance(2 * time.Minute)
	if again, err := storage.TakeRewards(f.ctx, f.s, sA.DB(), f.nowMS()-60_000, 2); err != nil || len(again) != 2 {
		t.Fatalf("take stale ones, limit 2: %d %v, want 2", len(again), err)
	}
	pend, err := storage.PendingRewardsOf(f.ctx, f.s, sA, "dave", 10)
	if err != nil || len(pend) != 2 {
		t.Fatalf("pending of dave: %+v %v, want 2", pend, err)
	}
	booked, err := storage.BookRewards(f.ctx, f.s, append(taken, off))
	if err != nil || booked != 3 {
		t.Fatalf("book: %d %v, want 3", booked, err)
	}
	if b := f.balance(sA, "dave"); b != 500 {
		t.Fatalf("dave's wallet after booking: %d, want 500 (the official cash only)", b)
	}
	if b := f.balance(sB, "erin"); b != 0 {
		t.Fatalf("erin's wallet after a coupon kind: %d, want 0", b)
	}
	if booked, err := storage.BookRewards(f.ctx, f.s, taken); err != nil || booked != 0 {
		t.Fatalf("book again: %d %v, want 0", booked, err)
	}
	if b := f.balance(sA, "dave"); b != 500 {
		t.Fatalf("dave's wallet after booking twice: %d, want 500", b)
	}
	r, err := storage.Reward(f.ctx, f.s, sA, off.OrderNo)
	if err != nil || r.Status != model.RewardBooked || r.BookedMS != f.nowMS() {
		t.Fatalf("booked reward: %+v %v", r, err)
	}
	sums, err := storage.RewardSums(f.ctx, f.s, sA, "dave")
	wantSums := []model.StageSums{{Stage: "gray", Booked: 300, Income: 300}, {Stage: "official", Booked: 500, Income: 500}}
	if err != nil || fmt.Sprint(sums) != fmt.Sprint(wantSums) {
		t.Fatalf("sums %+v %v, want %+v", sums, err, wantSums)
	}
	if pend, err := storage.PendingRewardsOf(f.ctx, f.s, sA, "dave", 10); err != nil || len(pend) != 0 {
		t.Fatalf("pending of dave after booking: %+v %v", pend, err)
	}
	// The untouched database's reward is still pending.
	if r, err := storage.Reward(f.ctx, f.s, sC, other.OrderNo); err != nil || r.Status != model.RewardPending {
		t.Fatalf("reward of database 56: %+v %v, want pending", r, err)
	}
}

// A booking whose COMMIT fails books nothing and a retry books it once; one
// whose answer is lost is booked, and the retry books nothing more.
func contractRewardBookingCommitFault(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	r := reward(sA, "gina", "rain", "r1", model.AwardCash, "official", 250)
	f.issue(r)
	fired := f.arm(false)
	_, err := storage.BookRewards(f.ctx, f.s, []model.Reward{r})
	fired()
	failedCommit(t, "book rewards", err)
	if b := f.balance(sA, "gina"); b != 0 {
		t.Fatalf("wallet after a failed booking: %d, want 0", b)
	}
	if n, err := storage.BookRewards(f.ctx, f.s, []model.Reward{r}); err != nil || n != 1 {
		t.Fatalf("retry: %d %v, want 1", n, err)
	}
	r2 := reward(sA, "gina", "rain", "r2", model.AwardCash, "official", 50)
	f.issue(r2)
	fired = f.arm(true)
	_, err = storage.BookRewards(f.ctx, f.s, []model.Reward{r2})
	fired()
	lostAnswer(t, "book rewards", err)
	if n, err := storage.BookRewards(f.ctx, f.s, []model.Reward{r2}); err != nil || n != 0 {
		t.Fatalf("retry after a lost answer: %d %v, want 0 (booked already)", n, err)
	}
	if b := f.balance(sA, "gina"); b != 300 {
		t.Fatalf("wallet: %d, want 300: each reward once", b)
	}
}

// A withdrawal debits the wallet under the caller's order number, once;
// another amount under it, or a deposit's order number, is ORDER_CONFLICT; a
// withdrawal above the balance is INSUFFICIENT_BALANCE and leaves its order
// number free.
func contractRewardWithdraw(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "hank", "d1", 1000)
	w, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w1", 300)
	if err != nil || w != (model.Withdrawal{ActID: "hank", OrderNo: "w1", Amount: 300, Balance: 700}) {
		t.Fatalf("withdraw: %+v %v", w, err)
	}
	if w, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w1", 300); err != nil || !w.Repeat || w.Balance != 700 {
		t.Fatalf("repeat: %+v %v", w, err)
	}
	if w, found, err := storage.WithdrawalOf(f.ctx, f.s, sA, "hank", "w1"); err != nil || !found ||
		w != (model.Withdrawal{ActID: "hank", OrderNo: "w1", Amount: 300, Balance: 700, Repeat: true}) {
		t.Fatalf("WithdrawalOf w1: %+v %v %v", w, found, err)
	}
	for _, order := range []string{"d1", "nope"} { // a deposit's order number, and none
		if w, found, err := storage.WithdrawalOf(f.ctx, f.s, sA, "hank", order); err != nil || found {
			t.Fatalf("WithdrawalOf %s: %+v %v %v, want none", order, w, found, err)
		}
	}
	if _, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w1", 301); !errors.Is(err, model.ErrOrderConflict) {
		t.Fatalf("another amount: %v, want ORDER_CONFLICT", err)
	}
	if _, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "d1", 1000); !errors.Is(err, model.ErrOrderConflict) {
		t.Fatalf("a deposit's order number: %v, want ORDER_CONFLICT", err)
	}
	if _, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w2", 701); !errors.Is(err, model.ErrInsufficientBalance) {
		t.Fatalf("above the balance: %v, want INSUFFICIENT_BALANCE", err)
	}
	if w, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w2", 700); err != nil || w.Balance != 0 || w.Repeat {
		t.Fatalf("the refused order number again, for the whole balance: %+v %v", w, err)
	}
	// COMMIT faults: a failed one writes nothing and the retry applies it;
	// a lost answer applied it, and the retry is a repeat.
	f.deposit(sA, "hank", "d2", 10)
	fired := f.arm(false)
	_, err = storage.Withdraw(f.ctx, f.s, sA, "hank", "w3", 4)
	fired()
	failedCommit(t, "withdraw", err)
	if b := f.balance(sA, "hank"); b != 10 {
		t.Fatalf("balance after a failed withdrawal: %d, want 10", b)
	}
	if w, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w3", 4); err != nil || w.Repeat || w.Balance != 6 {
		t.Fatalf("retry: %+v %v", w, err)
	}
	fired = f.arm(true)
	_, err = storage.Withdraw(f.ctx, f.s, sA, "hank", "w4", 6)
	fired()
	lostAnswer(t, "withdraw", err)
	if w, err := storage.Withdraw(f.ctx, f.s, sA, "hank", "w4", 6); err != nil || !w.Repeat || w.Balance != 0 {
		t.Fatalf("retry after a lost answer: %+v %v, want a repeat at 0", w, err)
	}
}

// The flow listing: the person's flows but reward ones, newest first, ties
// in one millisecond by the row's place, paged by the cursor without a row
// lost or shown twice while rows are added.
func contractRewardFlowListing(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ivy", "d1", 100)
	f.deposit(sA, "ivy", "d2", 200)
	f.deposit(sA, "jack", "d1", 999) // another person in the same table
	f.h.Clock.Advance(time.Millisecond)
	if _, err := storage.Withdraw(f.ctx, f.s, sA, "ivy", "w1", 50); err != nil {
		t.Fatal(err)
	}
	r := reward(sA, "ivy", "rain", "r1", model.AwardCash, "official", 70)
	f.issue(r)
	if _, err := storage.BookRewards(f.ctx, f.s, []model.Reward{r}); err != nil {
		t.Fatal(err)
	}
	var got []string
	cur := model.FlowCursor{}
	for i := range 10 {
		page, err := storage.FlowsOf(f.ctx, f.s, sA, "ivy", cur, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		fl := page[0]
		if fl.Seq <= 0 || fl.ActID != "ivy" {
			t.Fatalf("flow %+v: no Seq or another person", fl)
		}
		got = append(got, fmt.Sprintf("%s:%s:%d", fl.Kind, fl.OrderNo, fl.Amount))
		cur = model.FlowCursor{CreatedMS: fl.CreatedMS, ID: model.FlowItemID(fl.Seq)}
		if i == 0 { // a row added while paging comes first, never inside the pages left
			f.h.Clock.Advance(time.Millisecond)
			f.deposit(sA, "ivy", "d3", 1)
		}
	}
	want := "[withdraw:w1:-50 deposit:d2:200 deposit:d1:100]"
	if fmt.Sprint(got) != want {
		t.Fatalf("pages %v, want %s (reward flows are listed from the rewards)", got, want)
	}
	if b := f.balance(sA, "ivy"); b != 100+200-50+70+1 {
		t.Fatalf("balance %d", b)
	}
	// A cursor at a reward's ID in the same millisecond as flows: flows'
	// IDs ("f:...") sort below an act ID that starts with a letter after 'f'.
	all, err := storage.FlowsOf(f.ctx, f.s, sA, "ivy", model.FlowCursor{CreatedMS: Start.UnixMilli(), ID: "zz"}, 10)
	if err != nil || len(all) != 2 {
		t.Fatalf("flows at the first millisecond below a reward ID: %d %v, want 2", len(all), err)
	}
	none, err := storage.FlowsOf(f.ctx, f.s, sA, "ivy", model.FlowCursor{CreatedMS: Start.UnixMilli(), ID: "a"}, 10)
	if err != nil || len(none) != 0 {
		t.Fatalf("flows at the first millisecond below ID \"a\": %d %v, want 0", len(none), err)
	}
}

// LeaseSpent sums the rewards issued from one lease across databases.
func contractRewardLeaseSpent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	for i, x := range []struct {
		s     model.ShardID
		lease string
		amt   model.Cents
	}{{sA, "L1", 10}, {sB, "L1", 20}, {sC, "L1", 40}, {sA, "L2", 80}} {
		r := reward(x.s, fmt.Sprintf("p%d", i), "rain", "r1", model.AwardCash, "official", x.amt)
		r.LeaseID = x.lease
		f.issue(r)
	}
	if n, err := storage.LeaseSpent(f.ctx, f.s, []int{sA.DB(), sC.DB()}, "L1"); err != nil || n != 70 {
		t.Fatalf("L1 over both databases: %d %v, want 70", n, err)
	}
	if n, err := storage.LeaseSpent(f.ctx, f.s, []int{sA.DB()}, "L2"); err != nil || n != 80 {
		t.Fatalf("L2: %d %v, want 80", n, err)
	}
	if n, err := storage.LeaseSpent(f.ctx, f.s, []int{sA.DB()}, "L3"); err != nil || n != 0 {
		t.Fatalf("an unknown lease: %d %v, want 0", n, err)
	}
}

// A group books rewards (storage.BookOp) as BookRewards does, beside a deposit of
// the same wallet: each reward once, official cash into the wallet; a
// reward listed in two ops of one group, or booked before, is booked by
// neither again.
func contractGroupRewards(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	a := reward(sA, "kim", "rain", "r1", model.AwardCash, "official", 120)
	b := reward(sA, "kim", "rain", "r2", model.AwardCash, "official", 30)
	g := reward(sA, "kim", "rain", "r1", model.AwardCash, "gray", 7)
	c := reward(sC, "lee", "rain", "r1", model.AwardCash, "official", 9) // another database
	for _, r := range []model.Reward{a, b, g, c} {
		f.issue(r)
	}
	if n, err := storage.BookRewards(f.ctx, f.s, []model.Reward{b}); err != nil || n != 1 {
		t.Fatalf("book b alone: %d %v", n, err)
	}
	dep := &storage.DepositOp{Shard: sA, ActID: "kim", OrderNo: "d1", Amount: 1000}
	op1 := &storage.BookOp{Rewards: []model.Reward{a, b, g}}
	op2 := &storage.BookOp{Rewards: []model.Reward{a, c}}
	if err := f.s.CommitGroup(f.ctx, []storage.Op{op1, dep, op2}); err != nil {
		t.Fatal(err)
	}
	if dep.Err != nil || dep.Deposit.Balance != 1030 || op1.Applied != 2 || op2.Applied != 1 || op1.Err != nil || op2.Err != nil {
		t.Fatalf("group: deposit %+v %v, rewards %d %v and %d %v; want the deposit at 1030 (it does not see the bookings), 2 and 1",
			dep.Deposit, dep.Err, op1.Applied, op1.Err, op2.Applied, op2.Err)
	}
	if bal := f.balance(sA, "kim"); bal != 1000+120+30 {
		t.Fatalf("kim's wallet %d, want 1150: the deposit, a and b once, not the gray reward", bal)
	}
	if bal := f.balance(sC, "lee"); bal != 9 {
		t.Fatalf("lee's wallet %d, want 9", bal)
	}
	again := &storage.BookOp{Rewards: []model.Reward{a, b, g, c}}
	if err := f.s.CommitGroup(f.ctx, []storage.Op{again}); err != nil || again.Applied != 0 {
		t.Fatalf("the same rewards again: %d %v, want 0", again.Applied, err)
	}
	if bal := f.balance(sA, "kim"); bal != 1150 {
		t.Fatalf("kim's wallet after a second group: %d, want 1150", bal)
	}
}

// RewardRecon matches a window's booked official cash rewards with the
// reward flows booked for them, by booked time, and counts the rewards left
// unbooked since before the stale time; a reward flow with no reward (made
// here with PutFlow) shows as a count that does not match.
func contractRewardRecon(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	start := f.nowMS()
	off := reward(sA, "mia", "rain", "r1", model.AwardCash, "official", 40)
	gray := reward(sA, "mia", "rain", "r1", model.AwardCash, "gray", 60)
	late := reward(sB, "ned", "rain", "r1", model.AwardCash, "official", 5)
	for _, r := range []model.Reward{off, gray, late} {
		f.issue(r)
	}
	f.h.Clock.Advance(time.Second)
	if _, err := storage.BookRewards(f.ctx, f.s, []model.Reward{off, gray}); err != nil {
		t.Fatal(err)
	}
	f.h.Clock.Advance(time.Second)
	r, err := storage.RewardRecon(f.ctx, f.s, sA.DB(), start, f.nowMS(), start+1, true)
	if err != nil || r.Booked != 1 || r.BookedCents != 40 || r.Flows != 1 || r.FlowCents != 40 || len(r.Missing) != 0 ||
		r.Pending != 1 || r.StalePending != 1 || r.OldestPendingMS != start || len(r.Problems()) != 0 {
		t.Fatalf("recon: %+v %v; want one booked official reward of 40 with its flow, one reward pending since %d", r, err, start)
	}
	if r, err := storage.RewardRecon(f.ctx, f.s, sA.DB(), f.nowMS(), f.nowMS()+1000, start, true); err != nil || r.Booked != 0 || r.Flows != 0 || r.StalePending != 0 || r.Pending != 1 {
		t.Fatalf("a later window: %+v %v; want nothing but the reward pending (not stale)", r, err)
	}
	if r, err := storage.RewardRecon(f.ctx, f.s, sC.DB(), start, f.nowMS(), f.nowMS(), true); err != nil || r.Booked != 0 || r.Flows != 0 || r.StalePending != 0 || r.Pending != 0 || len(r.Missing) != 0 {
		t.Fatalf("a database without rewards: %+v %v", r, err)
	}
	if f.h.PutFlow == nil {
		t.Fatal("the harness has no PutFlow")
	}
	fl, _ := model.RewardFlow(reward(sA, "oz", "rain", "r9", model.AwardCash, "official", 9), f.nowMS()-500)
	f.h.PutFlow(sA, fl, 9)
	if r, err := storage.RewardRecon(f.ctx, f.s, sA.DB(), start, f.nowMS(), start, true); err != nil || r.Flows != 2 || r.Booked != 1 || len(r.Problems()) != 1 {
		t.Fatalf("with a reward flow that has no reward: %+v %v, want its count off", r, err)
	}
	// A window pass without the flow scan sees the booked side only.
	if r, err := storage.RewardRecon(f.ctx, f.s, sA.DB(), start, f.nowMS(), start, false); err != nil || r.Flows != 0 || r.Booked != 1 || len(r.Problems()) != 0 {
		t.Fatalf("a pass without counting flows: %+v %v", r, err)
	}
}

// A group stores issued rewards (storage.IssueOp) as IssueReward does: a new one is
// stored; the same order number again — stored before, or by an earlier op
// of the same group — answers the stored reward as a repeat, or
// ORDER_CONFLICT for another amount, writing nothing; a group whose COMMIT
// answer is lost is settled, and its retry is a repeat.
func contractGroupIssue(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	at := func(r model.Reward, token string) model.Reward {
		r.CreatedMS, r.Token = f.nowMS(), token
		return r
	}
	a := at(reward(sA, "pam", "rain", "r1", model.AwardCash, "official", 70), "tok-a1")
	aAgain := at(reward(sA, "pam", "rain", "r1", model.AwardCash, "official", 70), "tok-a2")
	aOther := at(reward(sA, "pam", "rain", "r1", model.AwardCash, "official", 71), "tok-a3")
	b := at(reward(sC, "quinn", "card", "r1", "coupon", "gray", 1), "tok-b")
	pre := at(reward(sB, "ray", "rain", "r1", model.AwardCash, "official", 5), "tok-pre")
	f.issue(pre)
	preAgain := at(reward(sB, "ray", "rain", "r1", model.AwardCash, "official", 5), "tok-pre2")
	ops := []*storage.IssueOp{}
	for _, r := range []model.Reward{a, aAgain, aOther, b, preAgain} {
		ops = append(ops, &storage.IssueOp{Reward: r})
	}
	if err := f.s.CommitGroup(f.ctx, storage.Ops(ops)); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		token  string
		repeat bool
		err    error
	}{{"tok-a1", false, nil}, {"tok-a1", true, nil}, {"", false, model.ErrOrderConflict}, {"tok-b", false, nil}, {"tok-pre", true, nil}}
	for i, w := range want {
		op := ops[i]
		if w.err != nil {
			if !errors.Is(op.Err, w.err) {
				t.Fatalf("op %d: %v, want %v", i, op.Err, w.err)
			}
			continue
		}
		if op.Err != nil || op.Issued.Token != w.token || op.Repeat != w.repeat || op.Issued.Status != model.RewardPending {
			t.Fatalf("op %d: %+v repeat %v err %v; want token %s repeat %v", i, op.Issued, op.Repeat, op.Err, w.token, w.repeat)
		}
	}
	if got, repeat := f.issue(aAgain); !repeat || got.Token != "tok-a1" || got.Amount != 70 {
		t.Fatalf("IssueReward after the group: %+v repeat %v", got, repeat)
	}
	if r, err := storage.Reward(f.ctx, f.s, sC, b.OrderNo); err != nil || r.Token != "tok-b" || r.Stage != "gray" || r.TemplateID != "tpl-1" {
		t.Fatalf("b as stored: %+v %v", r, err)
	}
	// A lost answer: the group is settled (or answers ErrCommitUnknown), and
	// its retry finds the reward.
	c := at(reward(sA, "sal", "rain", "r1", model.AwardCash, "official", 3), "tok-c")
	fired := f.arm(true)
	op := &storage.IssueOp{Reward: c}
	err := f.s.CommitGroup(f.ctx, []storage.Op{op})
	fired()
	if lostAnswer(t, "group issue", err) && (op.Issued.Token != "tok-c" || op.Repeat) {
		t.Fatalf("settled issue: %+v repeat %v", op.Issued, op.Repeat)
	}
	retry := &storage.IssueOp{Reward: at(reward(sA, "sal", "rain", "r1", model.AwardCash, "official", 3), "tok-c2")}
	if err := f.s.CommitGroup(f.ctx, []storage.Op{retry}); err != nil || !retry.Repeat || retry.Issued.Token != "tok-c" {
		t.Fatalf("retry after a lost answer: %+v repeat %v %v", retry.Issued, retry.Repeat, err)
	}
}

// A booker's batch (BookOp with a RewardTake) in the same group as an
// issue into its database books the rewards stored before the group, never
// the group's own issue, which is answered and stored pending; a take whose
// IssuedByMS is before that issue leaves it too, and the next take books
// it; RewardsDueQuery tells the database has one due then, and none once it
// is booked.
func contractTakeBesideIssue(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	older := reward(sA, "tia", "rain", "r1", model.AwardCash, "official", 40)
	older.CreatedMS, older.Token = f.nowMS(), "tok-older"
	f.issue(older)
	f.h.Clock.Advance(time.Second)
	fresh := reward(sA, "uma", "rain", "r1", model.AwardCash, "official", 9)
	fresh.CreatedMS, fresh.Token = f.nowMS(), "tok-fresh"
	take := func() *storage.BookOp {
		return &storage.BookOp{Take: &storage.RewardTake{DB: sA.DB(), StaleMS: f.nowMS(), IssuedByMS: f.nowMS(), Limit: 10}}
	}
	issue, tk := &storage.IssueOp{Reward: fresh}, take()
	if err := f.s.CommitGroup(f.ctx, []storage.Op{issue, tk}); err != nil || issue.Err != nil || tk.Err != nil {
		t.Fatal(err, issue.Err, tk.Err)
	}
	if tk.Applied != 1 || len(tk.Rewards) != 1 || tk.Rewards[0].OrderNo != older.OrderNo || tk.Rewards[0].Status != model.RewardBooked {
		t.Fatalf("the take beside an issue booked %d: %+v; want the older reward alone", tk.Applied, tk.Rewards)
	}
	if issue.Repeat || issue.Issued.Status != model.RewardPending {
		t.Fatalf("the issue beside a take: %+v repeat %v; want new, pending", issue.Issued, issue.Repeat)
	}
	if r, err := storage.Reward(f.ctx, f.s, sA, fresh.OrderNo); err != nil || r.Status != model.RewardPending {
		t.Fatalf("the issue as stored: %+v %v; want pending", r, err)
	}
	due := &storage.RewardsDueQuery{DB: sA.DB(), StaleMS: f.nowMS()}
	if err := f.s.Read(f.ctx, due); err != nil || !due.Due {
		t.Fatalf("rewards due after the group: %v %v; want one", due.Due, err)
	}
	// A batch begun before the issue (IssuedByMS earlier than its time)
	// leaves it: a booking switched off while such a batch was queued books
	// nothing issued after.
	early := take()
	early.Take.IssuedByMS = fresh.CreatedMS - 1
	if err := f.s.CommitGroup(f.ctx, []storage.Op{early}); err != nil || early.Applied != 0 || len(early.Rewards) != 0 {
		t.Fatalf("a take begun before the issue booked %d: %+v %v; want none", early.Applied, early.Rewards, err)
	}
	next := take()
	if err := f.s.CommitGroup(f.ctx, []storage.Op{next}); err != nil || next.Applied != 1 || next.Rewards[0].OrderNo != fresh.OrderNo {
		t.Fatalf("the next take: %+v %v; want the group's issue booked", next.Rewards, err)
	}
	for _, r := range []model.Reward{older, fresh} {
		if a, err := storage.Account(f.ctx, f.s, sA, r.ActID); err != nil || a.Balance != r.Amount {
			t.Fatalf("%s: balance %d %v, want %d", r.ActID, a.Balance, err, r.Amount)
		}
	}
	if err := f.s.Read(f.ctx, due); err != nil || due.Due {
		t.Fatalf("rewards due once all are booked: %v %v; want none", due.Due, err)
	}
}
