package groupcommit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"redcell/cell/relay"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// TestMemstoreMoney: many goroutines deposit, send, open and credit through
// the committer into storage/memstore, one lane per database: every answer
// is right, the balances are exact and the books balance.
func TestMemstoreMoney(t *testing.T) {
	st := memstore.New(nil)
	var groups, requests int
	var mu sync.Mutex
	c := New(Config{Max: 32, Wait: time.Millisecond, QueueMax: 10_000, CommitTimeout: 5 * time.Second,
		Commit: func(ctx context.Context, _ Lane, ops []storage.MoneyOp) error {
			return st.CommitGroup(ctx, storage.Ops(ops))
		},
		Observe: func(g Group) {
			mu.Lock()
			groups, requests = groups+1, requests+g.Requests
			mu.Unlock()
		}})
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	ctx := context.Background()
	laneOf := func(sh model.ShardID) Lane { return Lane{ID: sh.DB()} }
	submit := func(sh model.ShardID, op storage.MoneyOp) error {
		if err := c.Submit(ctx, laneOf(sh), op); err != nil {
			return err
		}
		return op.Failed()
	}

	// 24 senders deposit five times and send one packet of it all.
	const senders, openers = 24, 40
	now := time.Now()
	packets := make([]model.PacketRef, senders)
	var wg sync.WaitGroup
	for i := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			act := fmt.Sprintf("gc-s%d", i)
			sh := sharding.ShardOfAct(act)
			for d := range 5 {
				op := &storage.DepositOp{Shard: sh, ActID: act, OrderNo: fmt.Sprintf("d%d", d), Amount: 100}
				if err := submit(sh, op); err != nil || op.Deposit.Balance != model.Cents(100*(d+1)) {
					t.Errorf("deposit %d of %s: %v %+v", d, act, err, op.Deposit)
					return
				}
			}
			id := model.NewPacketID(sh, now)
			op := &storage.SendOp{Shard: sh, PacketID: id, ExpiresMS: now.Add(time.Hour).UnixMilli(),
				Req: model.SendRequest{Sender: act, Amount: 500, Count: 10, Kind: model.KindRandom, OrderNo: "s1"}}
			if err := submit(sh, op); err != nil {
				t.Errorf("send of %s: %v", act, err)
				return
			}
			over := &storage.SendOp{Shard: sh, PacketID: model.NewPacketID(sh, now), ExpiresMS: now.Add(time.Hour).UnixMilli(),
				Req: model.SendRequest{Sender: act, Amount: 1, Count: 1, Kind: model.KindRandom, OrderNo: "s2"}}
			if err := submit(sh, over); err == nil {
				t.Errorf("a send from an empty wallet of %s went through", act)
			}
			ref, err := model.ParsePacketID(string(id))
			if err != nil {
				t.Error(err)
			}
			packets[i] = ref
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// 40 openers open every packet (10 shares each), then their credits are
	// booked through the claimants' lanes.
	var cmu sync.Mutex
	var credits []model.Credit
	owed := map[string]model.Cents{}
	for u := range openers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			act := fmt.Sprintf("gc-u%d", u)
			r := rand.New(rand.NewPCG(uint64(u), 7))
			for _, ref := range packets {
				req := model.OpenRequest{ActID: act, Shard: sharding.ShardOfAct(act)}
				op := &storage.OpenOp{Ref: ref, Reqs: []model.OpenRequest{req}, Rand: r}
				if err := submit(ref.Shard, op); err != nil {
					t.Errorf("open: %v", err)
					return
				}
				res := op.Results[0]
				if res.Err != nil {
					continue // sold out
				}
				cmu.Lock()
				credits = append(credits, relay.NewCredits(op.Results)...)
				owed[act] += res.Claim.Amount
				cmu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(credits) != senders*10 {
		t.Fatalf("%d claims, want %d", len(credits), senders*10)
	}
	byLane := map[Lane][]model.Credit{}
	for _, cr := range credits {
		byLane[laneOf(cr.Shard)] = append(byLane[laneOf(cr.Shard)], cr)
	}
	applied := 0
	for ln, cs := range byLane {
		op := &storage.CreditsOp{Credits: cs}
		if err := c.Submit(ctx, ln, op); err != nil || op.Err != nil || len(op.Deferred) != 0 {
			t.Fatalf("credits: %v %v %v", err, op.Err, op.Deferred)
		}
		applied += op.Applied
	}
	if applied != len(credits) {
		t.Fatalf("%d credits applied, want %d", applied, len(credits))
	}
	for act, want := range owed {
		a, err := storage.Account(ctx, st, sharding.ShardOfAct(act), act)
		if err != nil || a.Balance != want {
			t.Fatalf("%s: balance %d, want %d (%v)", act, a.Balance, want, err)
		}
	}
	l, err := st.Ledger(ctx, "mem")
	if err != nil {
		t.Fatal(err)
	}
	if rep := model.Audit([]model.Ledger{l}); !rep.OK() {
		t.Fatalf("audit: %+v", rep)
	}
	c.Stop()
	stopped = true
	mu.Lock()
	defer mu.Unlock()
	if want := senders*(5+2) + openers*senders + len(credits); requests != want {
		t.Fatalf("%d requests in %d groups, want %d", requests, groups, want)
	}
	t.Logf("%d requests in %d groups", requests, groups)
}
