package storagetest

import (
	"fmt"
	"sync"
	"testing"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractGroupFreshOnce", contractGroupFreshOnce)
	register("ContractWithdrawFreshOnce", contractWithdrawFreshOnce)
}

// A withdrawal of the whole balance, sent by 8 callers at once, is made
// once and every other answer repeats it: a caller that finds the wallet
// emptied by its own order's first run is answered that run (Repeat), never
// INSUFFICIENT_BALANCE.
func contractWithdrawFreshOnce(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	rs := f.s
	for round := range 5 {
		f.deposit(sA, "wes", fmt.Sprintf("in-%d", round), 40)
		var mu sync.Mutex
		fresh, repeats := 0, 0
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				w, err := storage.Withdraw(f.ctx, rs, sA, "wes", fmt.Sprintf("out-%d", round), 40)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("round %d: withdraw: %v", round, err)
				case w.Balance != 0 || w.Amount != 40:
					t.Errorf("round %d: withdrawal %+v, want 40 taken and 0 left", round, w)
				case w.Repeat:
					repeats++
				default:
					fresh++
				}
			})
		}
		wg.Wait()
		if fresh != 1 || repeats != 7 {
			t.Fatalf("round %d: 8 withdrawals at once of one order: %d made, %d repeats; want 1 and 7", round, fresh, repeats)
		}
	}
	if got := f.balance(sA, "wes"); got != 0 {
		t.Fatalf("balance %d, want 0", got)
	}
}

// Each idempotency key is stored fresh once, whatever the concurrency:
// groups carrying the very same issue, accept, deposit and send (one token,
// one time: what retries sent in one millisecond look like), committed one
// after another and then by 8 writers at once, each alongside the
// single-op calls, answer exactly one op per key new; every other answer is
// a repeat of it. The verdict is the inserting statement's, never a
// comparison of what a stored row holds.
func contractGroupFreshOnce(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "fay", "seed", 10_000)
	now := f.nowMS()
	ops := func(round int) []storage.MoneyOp {
		r := reward(sC, "fay", "rain", fmt.Sprintf("f%d", round), model.AwardCash, "official", 7)
		r.CreatedMS = now
		cr := couponReq(sA, "fay", fmt.Sprintf("fs%d", round), "demo-batch")
		cr.AcceptedMS = now
		send := sendReq("fay", fmt.Sprintf("send-%d", round), 10, 2)
		return []storage.MoneyOp{
			&storage.IssueOp{Reward: r},
			&storage.AcceptOp{Coupon: cr},
			&storage.DepositOp{Shard: sA, ActID: "fay", OrderNo: fmt.Sprintf("dep-%d", round), Amount: 3},
			&storage.SendOp{Shard: sA, Req: send, PacketID: model.NewPacketID(sA, f.h.Clock.Now()), ExpiresMS: now + 60_000},
		}
	}
	type verdicts struct {
		mu    sync.Mutex
		fresh [4]int
		seen  [4]int
	}
	record := func(v *verdicts, group []storage.MoneyOp) {
		v.mu.Lock()
		defer v.mu.Unlock()
		for i, o := range group {
			op := answeredOf(o)
			if op.Err != nil {
				t.Errorf("%s op: %v", op.Kind, op.Err)
				continue
			}
			v.seen[i]++
			if !op.Repeat && !op.Deposit.Repeat {
				v.fresh[i]++
			}
		}
	}
	commit := func(v *verdicts, round int) {
		group := ops(round)
		if err := f.s.CommitGroup(f.ctx, storage.Ops(group)); err != nil {
			t.Errorf("group of round %d: %v", round, err)
			return
		}
		record(v, group)
	}
	check := func(v *verdicts, what string) {
		t.Helper()
		for i, n := range v.fresh {
			if n != 1 {
				t.Errorf("%s: %s answered new %d times of %d, want once", what, ops(0)[i].Kind(), n, v.seen[i])
			}
		}
	}

	// One after another: the second group finds every key stored.
	var seq verdicts
	commit(&seq, 0)
	commit(&seq, 0)
	check(&seq, "two groups in turn")

	// At once, for a few rounds: 8 groups of the same ops.
	for round := 1; round <= 4; round++ {
		var v verdicts
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { commit(&v, round) })
		}
		wg.Wait()
		check(&v, fmt.Sprintf("8 groups at once, round %d", round))
	}
	if t.Failed() {
		return
	}
	// 5 rounds of one deposit of 3 and one send of 10 each, once.
	if got := f.balance(sA, "fay"); got != 10_000+5*(3-10) {
		t.Fatalf("fay's balance %d, want %d", got, 10_000+5*(3-10))
	}
}
