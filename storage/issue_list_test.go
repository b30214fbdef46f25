package storage

// Tests of the grouped issue's one-round-trip path (issueAll) and where it
// must fall back to a locking read and an INSERT per database: a stored
// order number in the group, and an order number another transaction holds
// a lock on. The rows are checked as stored.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"redcell/model"
)

// issueReward is a new cash reward of act in shard s, token tok.
func issueReward(s model.ShardID, act, rain, tok string, amount model.Cents, now int64) model.Reward {
	r := model.Reward{ActID: act, Shard: s, App: "chat", Parent: "fest", Child: "fest-official", Stage: model.StageOfficial,
		Scene: "rain", Rain: rain, AwardType: model.AwardCash, Amount: amount, Token: tok, CreatedMS: now}
	r.OrderNo = model.RewardOrderNo(act, r.Scene, rain, r.AwardType, r.Stage)
	return r
}

// issueOps makes one IssueOp per reward.
func issueOps(rs []model.Reward) []*IssueOp {
	ops := make([]*IssueOp, len(rs))
	for i, r := range rs {
		ops[i] = &IssueOp{Reward: r}
	}
	return ops
}

// checkIssued asserts each reward of rs is stored once, with its token and
// amount, pending.
func checkIssued(t *testing.T, m *MySQL, rs []model.Reward) {
	t.Helper()
	for _, r := range rs {
		var n int
		var tok string
		var amount int64
		var status int
		err := m.db.QueryRow("SELECT COUNT(*), MAX(token), MAX(amount), MAX(status) FROM "+m.rewardTable(r.Shard.DB())+
			" WHERE order_no = ?", r.OrderNo).Scan(&n, &tok, &amount, &status)
		if err != nil || n != 1 || tok != r.Token || amount != int64(r.Amount) || status != int(model.RewardPending) {
			t.Fatalf("%s: %d rows, token %q amount %d status %d, %v; want 1 row %q %d pending", r.OrderNo, n, tok, amount, status, err, r.Token, r.Amount)
		}
	}
}

func TestIssueStatementList(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	shards := []model.ShardID{5, 15, 125, 999} // databases 0, 1, 12, 99
	var fresh []model.Reward
	for i := range 24 {
		s := shards[i%len(shards)]
		fresh = append(fresh, issueReward(s, fmt.Sprintf("il-%d-%d", s, i), "r1", fmt.Sprintf("tok-%d", i), model.Cents(1+i), now))
	}

	t.Run("new order numbers in one round trip", func(t *testing.T) {
		bulk, fb := m.issues.Bulk.Load(), m.issues.Fallback.Load()
		ops := issueOps(fresh)
		if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
			t.Fatal(err)
		}
		if m.issues.Bulk.Load() != bulk+1 || m.issues.Fallback.Load() != fb {
			t.Fatalf("paths: bulk %d→%d fallback %d→%d; want one bulk", bulk, m.issues.Bulk.Load(), fb, m.issues.Fallback.Load())
		}
		for i, op := range ops {
			if op.Err != nil || op.Repeat || op.Issued.OrderNo != fresh[i].OrderNo || op.Issued.Token != fresh[i].Token ||
				op.Issued.Status != model.RewardPending || op.Issued.Amount != fresh[i].Amount {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Issued, op.Repeat, op.Err)
			}
		}
		checkIssued(t, m, fresh)
	})

	t.Run("a stored order number falls back and writes nothing twice", func(t *testing.T) {
		bulk, fb := m.issues.Bulk.Load(), m.issues.Fallback.Load()
		again := fresh[7]
		again.Token = "tok-again" // a retry: another token, the same order number and amount
		conflict := fresh[8]
		conflict.Token, conflict.Amount = "tok-conflict", fresh[8].Amount+1
		var more []model.Reward
		for i := range 6 {
			s := shards[i%len(shards)]
			more = append(more, issueReward(s, fmt.Sprintf("il2-%d-%d", s, i), "r1", fmt.Sprintf("tok2-%d", i), 9, now))
		}
		ops := issueOps(append([]model.Reward{more[0], again, more[1], conflict}, more[2:]...))
		if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
			t.Fatal(err)
		}
		if m.issues.Bulk.Load() != bulk || m.issues.Fallback.Load() != fb+1 {
			t.Fatalf("paths: bulk %d→%d fallback %d→%d; want one fallback", bulk, m.issues.Bulk.Load(), fb, m.issues.Fallback.Load())
		}
		if op := ops[1]; op.Err != nil || !op.Repeat || op.Issued.Token != fresh[7].Token {
			t.Fatalf("the retry: %+v repeat %v err %v; want the first reward, repeat", op.Issued, op.Repeat, op.Err)
		}
		if op := ops[3]; !errors.Is(op.Err, model.ErrOrderConflict) {
			t.Fatalf("another amount: %v; want ORDER_CONFLICT", op.Err)
		}
		for _, i := range []int{0, 2, 4, 5, 6, 7} {
			if op := ops[i]; op.Err != nil || op.Repeat || op.Issued.Token != op.Reward.Token {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Issued, op.Repeat, op.Err)
			}
		}
		checkIssued(t, m, append(more, fresh...))
	})

	t.Run("an order number locked by another transaction falls back and waits", func(t *testing.T) {
		bulk, fb := m.issues.Bulk.Load(), m.issues.Fallback.Load()
		var rs []model.Reward
		for i := range 8 {
			s := shards[i%len(shards)]
			rs = append(rs, issueReward(s, fmt.Sprintf("il3-%d-%d", s, i), "r1", fmt.Sprintf("tok3-%d", i), 4, now))
		}
		// Another transaction locks one of the new order numbers (its gap: the
		// row does not exist yet) and commits, without writing, once the group waits for it.
		other, err := m.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := other.QueryRow("SELECT COUNT(*) FROM "+m.rewardTable(rs[5].Shard.DB())+" WHERE order_no = ? FOR UPDATE", rs[5].OrderNo).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the other transaction's lock: %d %v", n, err)
		}
		released := commitOnceWaitedFor(m, other, m.rewardTable(rs[5].Shard.DB()))
		ops := issueOps(rs)
		err = m.CommitGroup(ctx, Ops(ops))
		if rerr := <-released; rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.issues.Bulk.Load() != bulk || m.issues.Fallback.Load() != fb+1 {
			t.Fatalf("paths: bulk %d→%d fallback %d→%d; want one fallback", bulk, m.issues.Bulk.Load(), fb, m.issues.Fallback.Load())
		}
		for i, op := range ops {
			if op.Err != nil || op.Repeat || op.Issued.Token != rs[i].Token {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Issued, op.Repeat, op.Err)
			}
		}
		checkIssued(t, m, rs)
	})

	t.Run("groups repeating one stored order number at once do not deadlock", func(t *testing.T) {
		stored := issueReward(shards[1], "il4-stored", "r1", "tok-stored", 6, now)
		if err := m.CommitGroup(ctx, Ops(issueOps([]model.Reward{stored}))); err != nil {
			t.Fatal(err)
		}
		deadlocks := func() int64 {
			var name string
			var n int64
			if err := m.db.QueryRow("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := deadlocks()
		for round := range 20 {
			var wg sync.WaitGroup
			errs := make([]error, 4)
			groups := make([][]*IssueOp, 4)
			for g := range groups {
				retry := stored
				retry.Token = fmt.Sprintf("tok-retry-%d-%d", round, g)
				rs := []model.Reward{retry}
				for i := range 3 {
					s := shards[(i+g)%len(shards)]
					rs = append(rs, issueReward(s, fmt.Sprintf("il4-%d-%d-%d", round, g, i), "r1", "tok4", 2, now))
				}
				groups[g] = issueOps(rs)
				wg.Go(func() { errs[g] = m.CommitGroup(ctx, Ops(groups[g])) })
			}
			wg.Wait()
			for g, err := range errs {
				if err != nil {
					t.Fatalf("round %d group %d: %v", round, g, err)
				}
				if op := groups[g][0]; op.Err != nil || !op.Repeat || op.Issued.Token != stored.Token {
					t.Fatalf("round %d group %d: the retry answered %+v repeat %v %v", round, g, op.Issued, op.Repeat, op.Err)
				}
				var rs []model.Reward
				for _, op := range groups[g][1:] {
					rs = append(rs, op.Reward)
				}
				checkIssued(t, m, rs)
			}
		}
		if d := deadlocks() - before; d != 0 {
			t.Fatalf("%d deadlocks in MariaDB (each a group retried)", d)
		}
	})
}

// A group of issues alone runs its list without a SAVEPOINT (fresh); a
// stored order number in it answers errBulkUnfit, and CommitGroup then runs
// the group again on the savepoint path, deciding the repeat.
func TestIssueFreshWithoutSavepoint(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	var rs []model.Reward
	for i := range 6 {
		s := model.ShardID(7 + 100*i)
		rs = append(rs, issueReward(s, fmt.Sprintf("if-%d", i), "r1", fmt.Sprintf("tokf-%d", i), 3, now))
		if err := m.ensureRewards(ctx, s.DB()); err != nil {
			t.Fatal(err)
		}
	}
	// In a transaction of inTx (execCounted needs one), rolled back.
	run := func(rs []model.Reward, fresh bool) (n int64, err error) {
		rollback := errors.New("roll back")
		if ierr := m.inTx(ctx, func(tx *sql.Tx) error {
			before := comSavepoints(t, tx)
			_, err = m.issueRewardsTx(ctx, tx, issueOps(rs), fresh)
			n = comSavepoints(t, tx) - before
			return rollback
		}); !errors.Is(ierr, rollback) {
			t.Fatal(ierr)
		}
		return n, err
	}
	if n, err := run(rs, true); err != nil || n != 0 {
		t.Errorf("fresh: %d savepoints, %v; want none", n, err)
	}
	if n, err := run(rs, false); err != nil || n != 1 {
		t.Errorf("not fresh: %d savepoints, %v; want one", n, err)
	}
	if err := m.CommitGroup(ctx, Ops(issueOps(rs[:1]))); err != nil {
		t.Fatal(err)
	}
	if _, err := run(rs, true); !errors.Is(err, errBulkUnfit) {
		t.Errorf("fresh over a stored order number: %v, want errBulkUnfit", err)
	}
	ops := issueOps(rs)
	if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		if op.Err != nil || op.Repeat != (i == 0) {
			t.Errorf("op %d: repeat %v err %v", i, op.Repeat, op.Err)
		}
	}
	checkIssued(t, m, rs)
}
