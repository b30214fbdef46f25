package storagetest

import (
	"math/rand/v2"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractOpenCreditsHere", contractOpenCreditsHere)
}

// An open's same-cell claimants (storage.OpenOp.CreditHere) are credited in
// the open's own transaction: a new claim of such a shard is booked as the
// relay's credit would be (under its claim's order number, once) and its
// result is marked Credited; a claimant of a shard CreditHere refuses, and
// one whose wallet row another transaction holds, are not, and a later
// delivery books those alone.
func contractOpenCreditsHere(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	if f.h.HoldWallet == nil {
		t.Fatal("the harness has no HoldWallet")
	}
	f.deposit(sA, "ann", "d1", 400)
	_, ref := f.send(sA, model.SendRequest{Sender: "ann", Amount: 400, Count: 4, Kind: model.KindFixed, OrderNo: "s1"}, time.Hour)
	f.deposit(sC, "eve", "d1", 1) // eve's wallet row, held below
	_, release := f.h.HoldWallet(sC, "eve")
	defer release()
	asked := map[model.ShardID]int{}
	op := &storage.OpenOp{Ref: ref, Rand: rand.New(rand.NewPCG(3, 4)),
		Reqs:       []model.OpenRequest{opener("bob", sB), opener("cy", sC), opener("eve", sC), opener("cy", sC)},
		CreditHere: func(sh model.ShardID) bool { asked[sh]++; return sh != sB }}
	if err := grouperOf(t, f.h).CommitGroup(f.ctx, []storage.Op{op}); err != nil || op.Err != nil {
		t.Fatal(err, op.Err)
	}
	release()
	if asked[sB] == 0 || asked[sC] == 0 {
		t.Fatalf("CreditHere asked of shards %v; want of bob's and cy's", asked)
	}
	wantCredited := []bool{false, true, false, true} // cy's second listing repeats the credited claim
	for i, r := range op.Results {
		if r.Err != nil || r.Credited != wantCredited[i] || r.Repeat != (i == 3) {
			t.Fatalf("result %d (%s): %+v; want credited %v", i, op.Reqs[i].ActID, r, wantCredited[i])
		}
	}
	if b := f.balance(sC, "cy"); b != 100 {
		t.Fatalf("cy's balance after the open %d, want 100 (credited in the open)", b)
	}
	if b := f.balance(sC, "eve"); b != 1 {
		t.Fatalf("eve's balance after the open %d, want 1 (her wallet was held)", b)
	}
	f.check(books{deposits: 401, balances: 101, open: 100, inFlight: 200, sends: 400, packets: 1, claims: 3, credits: 1})
	// The relay's delivery of every claim books bob's and eve's alone.
	cs := []model.Credit{creditOf(op.Results[0].Claim, sB), creditOf(op.Results[1].Claim, sC), creditOf(op.Results[2].Claim, sC)}
	applied, deferred, err := storage.ApplyCredits(f.ctx, f.s, cs)
	if err != nil || applied != 2 || len(deferred) != 0 {
		t.Fatalf("delivery after the open: applied %d, deferred %v, %v; want 2 (bob's, eve's)", applied, deferred, err)
	}
	if b := f.balance(sC, "cy"); b != 100 {
		t.Fatalf("cy's balance after the delivery %d, want 100: credited twice", b)
	}
	f.check(books{deposits: 401, balances: 301, open: 100, sends: 400, packets: 1, claims: 3, credits: 3})
}
