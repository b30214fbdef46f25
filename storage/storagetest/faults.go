package storagetest

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractCommitFaultDeposit", contractCommitFaultDeposit)
	register("ContractCommitFaultSend", contractCommitFaultSend)
	register("ContractCommitFaultOpen", contractCommitFaultOpen)
	register("ContractCommitFaultRefund", contractCommitFaultRefund)
	register("ContractCommitFaultCredits", contractCommitFaultCredits)
}

// The promise on a COMMIT that fails or whose answer is lost, for every call
// that writes money: when the COMMIT did not apply, the call answers an error
// matching storage.ErrCommitUnknown and nothing is written, and a retry
// applies it once; when it applied but the answer was lost, the call either
// answers success (it found out by re-reading) or that error, and a retry with
// the same order number (packet, claim) finds it applied: never twice.

// arm arms the harness's commit fault and returns a check, to call after the
// call that must meet it, that it fired exactly once.
func (f *fixture) arm(lostAnswer bool) (fired func()) {
	before := f.h.CommitFaults()
	f.h.FailNextCommit(lostAnswer)
	return func() {
		f.t.Helper()
		if n := f.h.CommitFaults() - before; n != 1 {
			f.t.Fatalf("the armed commit fault fired %d times, want 1", n)
		}
	}
}

// failedCommit checks the answer of a call whose COMMIT was made to fail.
func failedCommit(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("%s whose COMMIT failed: error %v, want storage.ErrCommitUnknown", what, err)
	}
}

// lostAnswer checks the answer of a call whose COMMIT applied but whose answer
// was lost: success, or ErrCommitUnknown. It reports whether it was success.
func lostAnswer(t *testing.T, what string, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("%s whose COMMIT answer was lost: error %v, want success or storage.ErrCommitUnknown", what, err)
	}
	return err == nil
}

func contractCommitFaultDeposit(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d0", 10)
	fired := f.arm(false)
	_, err := storage.Deposit(f.ctx, f.s, sA, "ann", "d1", 100)
	fired()
	failedCommit(t, "deposit", err)
	f.check(books{deposits: 10, balances: 10})
	if d := f.deposit(sA, "ann", "d1", 100); d.Repeat || d.Balance != 110 {
		t.Fatalf("retry of a failed deposit: %+v", d)
	}
	f.check(books{deposits: 110, balances: 110})

	fired = f.arm(true)
	d, err := storage.Deposit(f.ctx, f.s, sA, "ann", "d2", 50)
	fired()
	if lostAnswer(t, "deposit", err) && (d.Repeat || d.Balance != 160) {
		t.Fatalf("deposit whose answer was lost answered %+v", d)
	}
	f.check(books{deposits: 160, balances: 160})
	if d := f.deposit(sA, "ann", "d2", 50); !d.Repeat || d.Balance != 160 {
		t.Fatalf("retry of a deposit whose answer was lost: %+v", d)
	}
	f.check(books{deposits: 160, balances: 160})
}

func contractCommitFaultSend(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d0", 1000)
	id := model.NewPacketID(sA, f.h.Clock.Now())
	ref, _ := model.ParsePacketID(string(id))
	exp := f.nowMS() + time.Hour.Milliseconds()
	fired := f.arm(false)
	_, _, err := storage.Send(f.ctx, f.s, sA, sendReq("ann", "s1", 300, 3), id, exp)
	fired()
	failedCommit(t, "send", err)
	_, err = storage.Packet(f.ctx, f.s, ref)
	wantCode(t, "packet of a send whose COMMIT failed", err, model.ErrNotFound)
	f.check(books{deposits: 1000, balances: 1000})
	if p, repeat, err := storage.Send(f.ctx, f.s, sA, sendReq("ann", "s1", 300, 3), id, exp); err != nil || repeat || p.ID != id {
		t.Fatalf("retry of a failed send: %+v repeat %v, %v", p, repeat, err)
	}
	f.check(books{deposits: 1000, balances: 700, open: 300, sends: 300, packets: 1})

	id2 := model.NewPacketID(sA, f.h.Clock.Now())
	fired = f.arm(true)
	p, repeat, err := storage.Send(f.ctx, f.s, sA, sendReq("ann", "s2", 200, 2), id2, exp)
	fired()
	if lostAnswer(t, "send", err) && (repeat || p.ID != id2 || p.Amount != 200) {
		t.Fatalf("send whose answer was lost answered %+v repeat %v", p, repeat)
	}
	f.check(books{deposits: 1000, balances: 500, open: 500, sends: 500, packets: 2})
	// The retry carries a new packet ID, as a caller that lost the answer would.
	p, repeat, err = storage.Send(f.ctx, f.s, sA, sendReq("ann", "s2", 200, 2), model.NewPacketID(sA, f.h.Clock.Now()), exp)
	if err != nil || !repeat || p.ID != id2 {
		t.Fatalf("retry of a send whose answer was lost: %+v repeat %v, %v; want packet %s", p, repeat, err, id2)
	}
	f.check(books{deposits: 1000, balances: 500, open: 500, sends: 500, packets: 2})
}

func contractCommitFaultOpen(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d0", 1000)
	_, ref := f.send(sA, sendReq("ann", "s1", 1000, 4), time.Hour)
	fired := f.arm(false)
	_, _, err := storage.OpenBatch(f.ctx, f.s, ref, []model.OpenRequest{opener("bob", sB)}, rand.New(rand.NewPCG(1, 1)))
	fired()
	failedCommit(t, "open", err)
	if held, err := storage.ClaimsOf(f.ctx, f.s, ref, []model.OpenRequest{opener("bob", sB)}); err != nil || len(held) != 0 {
		t.Fatalf("claims after a failed open: %+v, %v", held, err)
	}
	if p := f.packet(ref); p.RemainingCount != 4 || p.RemainingAmount != 1000 {
		t.Fatalf("packet after a failed open: %+v", p)
	}
	f.check(books{deposits: 1000, open: 1000, sends: 1000, packets: 1})
	res, _ := f.open(ref, 1, opener("bob", sB))
	if res[0].Err != nil || res[0].Repeat || res[0].Claim.Seq != 1 {
		t.Fatalf("retry of a failed open: %s", describe(res))
	}
	bob := res[0].Claim.Amount

	fired = f.arm(true)
	first, _, err := storage.OpenBatch(f.ctx, f.s, ref, []model.OpenRequest{opener("cy", sC)}, rand.New(rand.NewPCG(2, 2)))
	fired()
	ok := lostAnswer(t, "open", err)
	if ok && (len(first) != 1 || first[0].Err != nil || first[0].Repeat || first[0].Claim.Seq != 2) {
		t.Fatalf("open whose answer was lost answered %s", describe(first))
	}
	res, _ = f.open(ref, 3, opener("cy", sC))
	if res[0].Err != nil || !res[0].Repeat || res[0].Claim.Seq != 2 || ok && res[0].Claim != first[0].Claim {
		t.Fatalf("retry of an open whose answer was lost: %s", describe(res))
	}
	cy := res[0].Claim.Amount
	f.check(books{deposits: 1000, open: 1000 - bob - cy, inFlight: bob + cy, sends: 1000, packets: 1, claims: 2})
}

func contractCommitFaultRefund(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d0", 1000)
	_, p1 := f.send(sA, sendReq("ann", "s1", 300, 3), time.Hour)
	_, p2 := f.send(sA, sendReq("ann", "s2", 200, 2), time.Hour)
	f.h.Clock.Advance(time.Hour)
	fired := f.arm(false)
	_, err := storage.Refund(f.ctx, f.s, p1)
	fired()
	failedCommit(t, "refund", err)
	if p := f.packet(p1); p.Status != model.StatusOpen || p.RemainingAmount != 300 {
		t.Fatalf("packet after a failed refund: %+v", p)
	}
	f.check(books{deposits: 1000, balances: 500, open: 500, sends: 500, packets: 2})
	if c := f.refund(p1); c != 300 {
		t.Fatalf("retry of a failed refund: %d", c)
	}
	f.check(books{deposits: 1000, balances: 800, open: 200, sends: 500, refunds: 300, packets: 2})

	fired = f.arm(true)
	c, err := storage.Refund(f.ctx, f.s, p2)
	fired()
	if lostAnswer(t, "refund", err) && c != 200 {
		t.Fatalf("refund whose answer was lost answered %d", c)
	}
	f.check(books{deposits: 1000, balances: 1000, sends: 500, refunds: 500, packets: 2})
	if c := f.refund(p2); c != 0 {
		t.Fatalf("retry of a refund whose answer was lost: %d, want 0 (applied already)", c)
	}
	if p := f.packet(p2); p.Status != model.StatusRefunded || p.RefundAmount != 200 {
		t.Fatalf("packet after the retry: %+v", p)
	}
	f.check(books{deposits: 1000, balances: 1000, sends: 500, refunds: 500, packets: 2})
}

func contractCommitFaultCredits(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d0", 100)
	_, ref := f.send(sA, sendReq("ann", "s1", 100, 2), time.Hour)
	res, _ := f.open(ref, 1, opener("bob", sB), opener("cy", sC))
	c1, c2 := creditOf(res[0].Claim, sB), creditOf(res[1].Claim, sC)
	fired := f.arm(false)
	_, _, err := storage.ApplyCredits(f.ctx, f.s, []model.Credit{c1})
	fired()
	failedCommit(t, "credit", err)
	if b := f.balance(sB, "bob"); b != 0 {
		t.Fatalf("balance %d after a failed credit", b)
	}
	f.check(books{deposits: 100, inFlight: 100, sends: 100, packets: 1, claims: 2})
	if n := f.applyCredits([]model.Credit{c1}); n != 1 {
		t.Fatalf("retry of a failed credit: %d applied", n)
	}
	f.check(books{deposits: 100, balances: c1.Amount, inFlight: c2.Amount, sends: 100, packets: 1, claims: 2, credits: 1})

	fired = f.arm(true)
	n, deferred, err := storage.ApplyCredits(f.ctx, f.s, []model.Credit{c2})
	fired()
	if lostAnswer(t, "credit", err) && (n != 1 || len(deferred) != 0) {
		t.Fatalf("credit whose answer was lost: %d applied, deferred %v", n, deferred)
	}
	f.check(books{deposits: 100, balances: 100, sends: 100, packets: 1, claims: 2, credits: 2})
	if n := f.applyCredits([]model.Credit{c2}); n != 0 {
		t.Fatalf("retry of a credit whose answer was lost: %d applied", n)
	}
	if b := f.balance(sC, "cy"); b != c2.Amount {
		t.Fatalf("cy's balance %d, want %d", b, c2.Amount)
	}
	f.check(books{deposits: 100, balances: 100, sends: 100, packets: 1, claims: 2, credits: 2})
}
