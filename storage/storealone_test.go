package storage

// Tests of a group of one issue or accept (storeAlone): one statement in
// autocommit, with the answers of the transactional path, the rows checked
// as stored.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"redcell/model"
)

// A lone issue is one round trip and stores its row; a retry of it (another
// token, same order number and amount) is one more and answers the first
// reward, repeat; another amount under the order number is ORDER_CONFLICT,
// nothing stored; a lone accept behaves the same. Two groups of two take
// the transaction's path, not this one.
func TestStoreAlone(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	first := issueReward(125, "sa-ann", "r1", "tok-1", 7, now)
	// Make the tables first (the reward table, the wallet tables an issue
	// makes sure of): their DDL is not the op's work.
	if err := m.ensureRewards(ctx, first.Shard.DB()); err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureShard(ctx, first.Shard); err != nil {
		t.Fatal(err)
	}
	one := func(name string, op MoneyOp, wantTrips int64) {
		t.Helper()
		alone, trips := m.issuePathsOf(op.Kind()).Alone.Load(), m.RoundTrips()
		if err := m.CommitGroup(ctx, []Op{op}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := m.RoundTrips() - trips; got != wantTrips {
			t.Errorf("%s: %d round trips, want %d", name, got, wantTrips)
		}
		if m.issuePathsOf(op.Kind()).Alone.Load() != alone+1 {
			t.Errorf("%s: not stored alone", name)
		}
	}

	op := &IssueOp{Reward: first}
	one("new issue", op, 1)
	if op.Err != nil || op.Repeat || op.Issued.Token != "tok-1" || op.Issued.Status != model.RewardPending {
		t.Fatalf("new issue: %+v repeat %v err %v", op.Issued, op.Repeat, op.Err)
	}
	checkIssued(t, m, []model.Reward{first})

	retry := first
	retry.Token = "tok-retry"
	op = &IssueOp{Reward: retry}
	one("a retry", op, 2) // the INSERT counts 0, the stored row is read
	if op.Err != nil || !op.Repeat || op.Issued.Token != "tok-1" {
		t.Fatalf("retry: %+v repeat %v err %v; want the first reward, repeat", op.Issued, op.Repeat, op.Err)
	}
	conflict := first
	conflict.Token, conflict.Amount = "tok-other", 8
	op = &IssueOp{Reward: conflict}
	one("another amount", op, 2)
	if !errors.Is(op.Err, model.ErrOrderConflict) {
		t.Fatalf("another amount: %v; want ORDER_CONFLICT", op.Err)
	}
	checkIssued(t, m, []model.Reward{first}) // token and amount as first stored

	// A reward of CreatedMS 0 takes the store's time.
	timeless := issueReward(125, "sa-bo", "r1", "tok-2", 3, 0)
	op = &IssueOp{Reward: timeless}
	one("an issue without a time", op, 1)
	if op.Err != nil || op.Issued.CreatedMS == 0 {
		t.Fatalf("issue without a time: %+v err %v", op.Issued, op.Err)
	}

	// Accepts.
	if err := m.ensureCoupons(ctx, 12); err != nil {
		t.Fatal(err)
	}
	req := model.CouponRequest{App: "pay", Serial: "sa-s1", ActID: "sa-cy", Shard: 125, Batch: "b1", AcceptedMS: now}
	acc := &AcceptOp{Coupon: req}
	one("new accept", acc, 1)
	if acc.Err != nil || acc.Repeat || acc.Accepted.State != model.CouponAccepted || acc.Accepted.ActID != "sa-cy" {
		t.Fatalf("new accept: %+v repeat %v err %v", acc.Accepted, acc.Repeat, acc.Err)
	}
	acc = &AcceptOp{Coupon: req}
	acc.Coupon.AcceptedMS = now + 5 // a retry, later
	one("an accept's retry", acc, 2)
	if acc.Err != nil || !acc.Repeat || acc.Accepted.AcceptedMS != now {
		t.Fatalf("accept retry: %+v repeat %v err %v; want the first, repeat", acc.Accepted, acc.Repeat, acc.Err)
	}
	other := req
	other.ActID = "sa-dee"
	acc = &AcceptOp{Coupon: other}
	one("another person under the serial", acc, 2)
	if !errors.Is(acc.Err, model.ErrOrderConflict) {
		t.Fatalf("another person under the serial: %v; want ORDER_CONFLICT", acc.Err)
	}
	got, err := m.couponRequestOf(ctx, 125, "pay", "sa-s1")
	if err != nil || got.ActID != "sa-cy" || got.AcceptedMS != now {
		t.Fatalf("stored request: %+v %v", got, err)
	}
	bad := &AcceptOp{Coupon: model.CouponRequest{App: "pay", Serial: "", ActID: "x", Shard: 125, Batch: "b1"}}
	if err := m.CommitGroup(ctx, []Op{bad}); err != nil || !errors.Is(bad.Err, model.ErrInvalidArgument) {
		t.Fatalf("invalid accept: %v, op %v", err, bad.Err)
	}

	// Two ops are a transaction's group, not this path.
	alone := m.issues.Alone.Load()
	two := issueOps([]model.Reward{issueReward(125, "sa-two-1", "r1", "t", 1, now), issueReward(999, "sa-two-2", "r1", "t", 1, now)})
	if err := m.CommitGroup(ctx, Ops(two)); err != nil || two[0].Err != nil || two[1].Err != nil {
		t.Fatal(err)
	}
	if m.issues.Alone.Load() != alone {
		t.Fatal("a group of two went alone")
	}
}

// Lone issues of one order number at once: exactly one is new, every other
// answers it as a repeat, and one row is stored.
func TestStoreAloneRace(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	r := issueReward(5, "sa-race", "r1", "tok", 2, now)
	if err := m.ensureRewards(ctx, r.Shard.DB()); err != nil {
		t.Fatal(err)
	}
	const n = 8
	ops := make([]*IssueOp, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range ops {
		rr := r
		rr.Token = fmt.Sprintf("tok-%d", i)
		ops[i] = &IssueOp{Reward: rr}
		wg.Add(1)
		go func() { defer wg.Done(); errs <- m.CommitGroup(ctx, []Op{ops[i]}) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fresh, winner := 0, ""
	for _, op := range ops {
		if op.Err != nil {
			t.Fatalf("op: %v", op.Err)
		}
		if !op.Repeat {
			fresh++
			winner = op.Issued.Token
		}
	}
	if fresh != 1 {
		t.Fatalf("%d new answers, want 1", fresh)
	}
	for _, op := range ops {
		if op.Issued.Token != winner {
			t.Fatalf("an answer holds token %q, the stored one is %q", op.Issued.Token, winner)
		}
	}
	r.Token = winner
	checkIssued(t, m, []model.Reward{r})
}

// A booker's take (OpRewards with a RewardTake) in a process that has not
// made sure of a reward's wallet tables (the reward issued before a start,
// here by another store on the same databases, before those tables were
// made) leaves that reward pending, answered in Deferred, makes the tables
// after its transaction, and books it at the next take; the rewards whose
// tables it knows it books at once.
func TestTakeLeavesRewardsOfUnknownTables(t *testing.T) {
	issuer := ownNamespaceStore(t)
	booker := openStore(t)
	booker.ns = issuer.ns
	ctx := context.Background()
	now := time.Now().UnixMilli()
	known := issueReward(125, "tk-known", "r1", "t1", 5, now)
	unknown := issueReward(129, "tk-unknown", "r1", "t2", 7, now+1) // shard 129: database 12, as 125
	for _, r := range []model.Reward{known, unknown} {
		if err := issuer.CommitGroup(ctx, []Op{&IssueOp{Reward: r}}); err != nil {
			t.Fatal(err)
		}
	}
	// The issuer made both shards' tables; drop the second's wallet tables,
	// as a database from before they were made would have them missing.
	for _, q := range []string{"DROP TABLE " + issuer.flowTable(129), "DROP TABLE " + issuer.accountTable(129)} {
		if _, err := issuer.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := booker.EnsureShard(ctx, 125); err != nil { // the booker knows shard 125's tables
		t.Fatal(err)
	}
	take := func() *BookOp {
		t.Helper()
		op := &BookOp{Take: &RewardTake{DB: 12, StaleMS: now, IssuedByMS: now + 1, Limit: 10}}
		if err := booker.CommitGroup(ctx, []Op{op}); err != nil || op.Err != nil {
			t.Fatal(err, op.Err)
		}
		return op
	}
	op := take()
	if op.Applied != 1 || len(op.Rewards) != 1 || op.Rewards[0].OrderNo != known.OrderNo || op.Rewards[0].Status != model.RewardBooked ||
		len(op.Deferred) != 1 || op.Deferred[0] != unknown.OrderNo {
		t.Fatalf("first take: applied %d %+v, deferred %v; want the known one booked, the other deferred", op.Applied, op.Rewards, op.Deferred)
	}
	if !booker.ensuredOK(ensureKey{shard: 129}) {
		t.Fatal("shard 129's tables not made after the take")
	}
	op = take()
	if op.Applied != 1 || op.Rewards[0].OrderNo != unknown.OrderNo || len(op.Deferred) != 0 {
		t.Fatalf("second take: applied %d %+v, deferred %v; want the deferred one booked", op.Applied, op.Rewards, op.Deferred)
	}
	for _, r := range []model.Reward{known, unknown} {
		a, err := booker.account(ctx, r.Shard, r.ActID)
		if err != nil || a.Balance != r.Amount {
			t.Fatalf("%s: balance %d %v, want %d", r.ActID, a.Balance, err, r.Amount)
		}
	}
	if op := take(); op.Applied != 0 || len(op.Deferred) != 0 {
		t.Fatalf("third take: %+v", op)
	}
}
