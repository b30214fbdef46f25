package storagetest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/model"
)

func init() {
	register("ContractCreditsExactlyOnce", contractCreditsExactlyOnce)
	register("ContractPendingCreditsPages", contractPendingCreditsPages)
	register("ContractCrossCellCredit", contractCrossCellCredit)
	register("ContractLedgerSeesDoubleCredit", contractLedgerSeesDoubleCredit)
	register("ContractCreditDest", contractCreditDest)
}

// A new outbox row names the cell its credit goes to as the store's
// SetCreditDest names it when the claim is made, and PendingCredits gives it
// (Credit.Dest); SendTo changes it on pending rows only; MarkDelivered
// records the Dest it is given, and keeps the row's when given "". The
// reconciliation window reads it back (OutboxRow.Dest).
func contractCreditDest(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	d, ok := f.s.(interface {
		SetCreditDest(func(model.ShardID) string)
	})
	if !ok {
		t.Fatalf("%T does not name where credits go (SetCreditDest)", f.s)
	}
	d.SetCreditDest(func(sh model.ShardID) string { return fmt.Sprintf("cell-%d", sh) })
	t.Cleanup(func() { d.SetCreditDest(nil) })
	f.deposit(sA, "ann", "d1", 1000)
	_, ref := f.send(sA, sendReq("ann", "s1", 900, 3), time.Hour)
	f.h.Clock.Advance(time.Millisecond)
	res, _ := f.open(ref, 7, opener("bob", sB), opener("cy", sC), opener("dee", sA))
	f.h.Clock.Advance(time.Millisecond)
	dests := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, c := range f.pending(sA.DB(), 100) {
			out[c.ClaimID] = c.Dest
		}
		return out
	}
	b, c, a := res[0].Claim.ID, res[1].Claim.ID, res[2].Claim.ID
	if got, want := dests(), map[string]string{b: fmt.Sprintf("cell-%d", sB), c: fmt.Sprintf("cell-%d", sC), a: fmt.Sprintf("cell-%d", sA)}; !maps.Equal(got, want) {
		t.Fatalf("pending credits' dests %v, want %v", got, want)
	}
	cs := []model.Credit{creditOf(res[0].Claim, sB), creditOf(res[1].Claim, sC), creditOf(res[2].Claim, sA)}
	if err := f.s.SendTo(f.ctx, cs[:2], "cell-x"); err != nil {
		t.Fatal(err)
	}
	if got, want := dests(), map[string]string{b: "cell-x", c: "cell-x", a: fmt.Sprintf("cell-%d", sA)}; !maps.Equal(got, want) {
		t.Fatalf("dests after SendTo: %v, want %v", got, want)
	}
	cs[0].Dest, cs[1].Dest = "cell-y", ""
	f.markDelivered(cs[:2])
	if err := f.s.SendTo(f.ctx, cs[:2], "cell-z"); err != nil { // delivered: kept
		t.Fatal(err)
	}
	if err := f.s.SendTo(f.ctx, []model.Credit{{ClaimID: "x"}}, "cell-z"); err == nil {
		t.Fatal("SendTo of a malformed claim ID: no error")
	}
	w, err := f.s.ReconWindow(f.ctx, sA.DB(), []model.ShardID{sA}, []int{ref.Day}, 0, f.nowMS()+1, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for id, o := range w.Outbox {
		got[id] = o.Dest
	}
	if want := map[string]string{b: "cell-y", c: "cell-x", a: fmt.Sprintf("cell-%d", sA)}; !maps.Equal(got, want) {
		t.Fatalf("outbox rows' dests after the marks %v, want %v", got, want)
	}
}

// Every claim is credited exactly once through outbox → ApplyCredits →
// MarkDelivered: the outbox lists each new claim as a pending credit owed to
// the shard its open named; ApplyCredits books each once (a credit delivered
// again, or twice in one batch, changes nothing); MarkDelivered takes it out
// of the pending list (marking twice is harmless); OutboxLag counts what is
// pending and the age of the oldest.
func contractCreditsExactlyOnce(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	f.deposit(sB, "bob", "d1", 5)
	_, ref := f.send(sA, sendReq("ann", "s1", 1000, 4), time.Hour)
	f.h.Clock.Advance(time.Millisecond)
	res, _ := f.open(ref, 11, opener("bob", sB), opener("cy", sC), opener("dee", sA))
	credits := []model.Credit{creditOf(res[0].Claim, sB), creditOf(res[1].Claim, sC), creditOf(res[2].Claim, sA)}
	claimed := sum(credits[0].Amount, credits[1].Amount, credits[2].Amount)
	f.h.Clock.Advance(5 * time.Millisecond)
	if n, age, err := f.s.OutboxLag(f.ctx, sA.DB()); err != nil || n != 3 || age != 5 {
		t.Fatalf("outbox lag: %d rows, oldest %d ms, %v; want 3, 5", n, age, err)
	}
	if n, age, err := f.s.OutboxLag(f.ctx, sC.DB()); err != nil || n != 0 || age != 0 {
		t.Fatalf("outbox lag of an empty database: %d, %d, %v", n, age, err)
	}
	if got := f.pending(sA.DB(), 100); !slices.Equal(got, credits) {
		t.Fatalf("pending credits %+v, want %+v", got, credits)
	}
	if got := f.pending(sC.DB(), 100); len(got) != 0 {
		t.Fatalf("pending credits of db 56 (the outbox is the packet's): %+v", got)
	}
	f.check(books{deposits: 1005, balances: 5, open: 1000 - claimed, inFlight: claimed, sends: 1000, packets: 1, claims: 3})

	if n := f.applyCredits(credits); n != 3 {
		t.Fatalf("applied %d of 3 new credits", n)
	}
	want := map[string]model.Cents{"bob": 5 + credits[0].Amount, "cy": credits[1].Amount, "dee": credits[2].Amount}
	shardOf := map[string]model.ShardID{"bob": sB, "cy": sC, "dee": sA}
	for act, b := range want {
		if got := f.balance(shardOf[act], act); got != b {
			t.Fatalf("%s's balance %d, want %d", act, got, b)
		}
	}
	f.check(books{deposits: 1005, balances: 5 + claimed, open: 1000 - claimed, sends: 1000, packets: 1, claims: 3, credits: 3})
	if n := f.applyCredits(append(slices.Clone(credits), credits[1])); n != 0 {
		t.Fatalf("credits delivered again: %d applied", n)
	}
	// Booked but not marked: still pending (the relay marks after the receiver answers).
	if got := f.pending(sA.DB(), 100); len(got) != 3 {
		t.Fatalf("pending before the mark: %+v", got)
	}
	f.markDelivered(credits)
	f.markDelivered(credits)
	if got := f.pending(sA.DB(), 100); len(got) != 0 {
		t.Fatalf("pending after the mark: %+v", got)
	}
	if n, age, err := f.s.OutboxLag(f.ctx, sA.DB()); err != nil || n != 0 || age != 0 {
		t.Fatalf("outbox lag after delivery: %d, %d, %v", n, age, err)
	}
	for act, b := range want {
		if got := f.balance(shardOf[act], act); got != b {
			t.Fatalf("%s's balance %d after redelivery, want %d", act, got, b)
		}
	}
	l := f.check(books{deposits: 1005, balances: 5 + claimed, open: 1000 - claimed, sends: 1000, packets: 1, claims: 3, credits: 3})
	for _, c := range credits {
		if o := l.Outbox[c.ClaimID]; !o.Delivered || o.Amount != c.Amount || o.Shard != c.Shard {
			t.Fatalf("outbox row after delivery %+v, credit %+v", o, c)
		}
		if cr := l.Credits[c.ClaimID]; cr.ClaimID != c.ClaimID || cr.ActID != c.ActID || cr.Amount != c.Amount {
			t.Fatalf("ledger credit %+v, want %+v", cr, c)
		}
	}

	// CreditsOf finds the booked credits by claim ID, and nothing for a claim never credited.
	never := model.Credit{ClaimID: model.ClaimID(ref.ID, 4), PacketID: ref.ID, ActID: "eve", Shard: sB, Amount: 1}
	found, err := f.s.CreditsOf(f.ctx, append(slices.Clone(credits), never))
	if err != nil || len(found) != 3 {
		t.Fatalf("credits of: %+v, %v", found, err)
	}
	for _, c := range credits {
		if got := found[c.ClaimID]; got.ClaimID != c.ClaimID || got.ActID != c.ActID || got.Amount != c.Amount {
			t.Fatalf("credits of %s: %+v", c.ClaimID, got)
		}
	}
	if _, err := f.s.CreditsOf(f.ctx, make([]model.Credit, 10_001)); err == nil {
		t.Fatal("credits of 10,001 claims: no error")
	}
	if _, err := f.s.CreditsOf(f.ctx, []model.Credit{{ClaimID: credits[0].ClaimID, ActID: "bob", Shard: model.ShardCount}}); err == nil {
		t.Fatal("credits of a claimant in shard 1000: no error")
	}
}

// PendingCredits pages in (created_ms, claim ID) order after the position it
// is given, returns only rows created at or before beforeMS, and names the
// last row's position as next.
func contractPendingCreditsPages(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 500)
	f.deposit(sB, "eve", "d1", 500)
	_, p1 := f.send(sA, sendReq("ann", "s1", 500, 5), time.Hour)
	_, p2 := f.send(sB, sendReq("eve", "s1", 500, 5), time.Hour) // same database, another shard
	f.h.Clock.Advance(time.Millisecond)
	t1 := f.nowMS()
	r1, _ := f.open(p1, 1, opener("bob", sB))
	r2, _ := f.open(p2, 2, opener("cy", sC))
	f.h.Clock.Advance(time.Millisecond)
	t2 := f.nowMS()
	r3, _ := f.open(p1, 3, opener("dee", sA))
	at1 := []model.Credit{creditOf(r1[0].Claim, sB), creditOf(r2[0].Claim, sC)}
	slices.SortFunc(at1, func(a, b model.Credit) int { return strings.Compare(a.ClaimID, b.ClaimID) })
	all := append(slices.Clone(at1), creditOf(r3[0].Claim, sA))

	db := sA.DB()
	page, next, err := f.s.PendingCredits(f.ctx, db, t2, 0, "", 2)
	if err != nil || !slices.Equal(page, all[:2]) || next != (model.OutboxPos{CreatedMS: t1, ClaimID: all[1].ClaimID}) {
		t.Fatalf("first page: %+v next %+v, %v; want %+v", page, next, err, all[:2])
	}
	page, next, err = f.s.PendingCredits(f.ctx, db, t2, next.CreatedMS, next.ClaimID, 2)
	if err != nil || !slices.Equal(page, all[2:]) || next != (model.OutboxPos{CreatedMS: t2, ClaimID: all[2].ClaimID}) {
		t.Fatalf("second page: %+v next %+v, %v", page, next, err)
	}
	page, next, err = f.s.PendingCredits(f.ctx, db, t2, next.CreatedMS, next.ClaimID, 2)
	if err != nil || len(page) != 0 || next != (model.OutboxPos{}) {
		t.Fatalf("past the end: %+v next %+v, %v", page, next, err)
	}
	page, _, err = f.s.PendingCredits(f.ctx, db, t1, 0, "", 10)
	if err != nil || !slices.Equal(page, at1) {
		t.Fatalf("created at or before %d: %+v, %v", t1, page, err)
	}
	page, _, err = f.s.PendingCredits(f.ctx, db, t2, t1, at1[0].ClaimID, 10)
	if err != nil || !slices.Equal(page, all[1:]) {
		t.Fatalf("after the first row: %+v, %v", page, err)
	}
	claimed := sum(all[0].Amount, all[1].Amount, all[2].Amount)
	f.check(books{deposits: 1000, open: 1000 - claimed, inFlight: claimed, sends: 1000, packets: 2, claims: 3})
}

// A claim made in one cell for a claimant of another cell is credited there:
// the claim's cell lists it pending, the claimant's cell books it, the claim's
// cell marks it delivered. Each cell's own audit passes (the claimant's cell
// counts a credit whose claim lives elsewhere) and so does the audit of both.
func contractCrossCellCredit(t *testing.T, newStore func(t *testing.T) Harness) {
	a := newFixture(t, newStore)
	b := newFixture(t, newStore)
	b.cell = "b"
	a.owns = func(s model.ShardID) bool { return s.DB() == sA.DB() }
	b.owns = func(s model.ShardID) bool { return s.DB() == sC.DB() }
	a.deposit(sA, "ann", "d1", 1000)
	_, ref := a.send(sA, sendReq("ann", "s1", 600, 2), time.Hour)
	res, _ := a.open(ref, 4, opener("cy", sC))
	credit := creditOf(res[0].Claim, sC)
	pending := a.pending(sA.DB(), 10)
	if !slices.Equal(pending, []model.Credit{credit}) {
		t.Fatalf("pending in the claim's cell: %+v", pending)
	}
	if n := b.applyCredits(pending); n != 1 {
		t.Fatalf("booked %d in the claimant's cell", n)
	}
	a.markDelivered(pending)
	if n := b.applyCredits(pending); n != 0 { // the relay delivered twice
		t.Fatalf("booked %d again", n)
	}
	la, lb := a.ledger(), b.ledger()
	if ca := model.AuditCell(lb, b.owns); ca.CreditsElsewhere != 1 || ca.CreditsIn != credit.Amount || ca.Balances != credit.Amount {
		t.Fatalf("claimant's cell audit: %+v", ca)
	}
	r := model.Audit([]model.Ledger{la, lb})
	if !r.OK() || r.InFlight != 0 || r.Deposits != 1000 || r.Balances != 400+credit.Amount || r.OpenRemaining != 600-credit.Amount ||
		r.ClaimsCount != 1 || r.CreditsCount != 1 {
		t.Fatalf("audit of both cells: %+v", r)
	}
	if got := b.balance(sC, "cy"); got != credit.Amount {
		t.Fatalf("claimant's balance %d, want %d", got, credit.Amount)
	}
	found, err := b.s.CreditsOf(b.ctx, pending)
	if err != nil || found[credit.ClaimID].Amount != credit.Amount || found[credit.ClaimID].ActID != "cy" {
		t.Fatalf("credits of, claimant's cell: %+v, %v", found, err)
	}
	if found, err := a.s.CreditsOf(a.ctx, pending); err != nil || len(found) != 0 {
		t.Fatalf("credits of, claim's cell: %+v, %v", found, err)
	}
}

// The Ledger reports one claim credited to two accounts (as a buggy or
// forged delivery would book it: the order number is per account) as a
// problem, so the audits fail; CreditsOf reports the two amounts summed.
func contractLedgerSeesDoubleCredit(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 100)
	_, ref := f.send(sA, sendReq("ann", "s1", 100, 2), time.Hour)
	res, _ := f.open(ref, 1, opener("bob", sB))
	good := creditOf(res[0].Claim, sB)
	forged := good
	forged.ActID = "eve"
	if n := f.applyCredits([]model.Credit{good, forged}); n != 2 {
		t.Fatalf("applied %d", n)
	}
	l, err := f.s.Ledger(f.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	twice := false
	for _, p := range l.Problems {
		twice = twice || strings.Contains(p, good.ClaimID) && strings.Contains(p, "credited twice")
	}
	if !twice {
		t.Fatalf("ledger problems %q name no double credit of %s", l.Problems, good.ClaimID)
	}
	if a := model.AuditCell(l, ownsAll); a.OK() {
		t.Fatalf("cell audit passed a double credit: %+v", a)
	}
	if a := f.sameCellAudit(l); a.OK() {
		t.Fatalf("the store's cell audit passed a double credit: %+v", a)
	}
	if r := model.Audit([]model.Ledger{l}); r.OK() {
		t.Fatalf("audit passed a double credit: %+v", r)
	}
	found, err := f.s.CreditsOf(f.ctx, []model.Credit{good, forged})
	if err != nil || found[good.ClaimID].Amount != 2*good.Amount {
		t.Fatalf("credits of a claim booked twice: %+v, %v", found, err)
	}
}
