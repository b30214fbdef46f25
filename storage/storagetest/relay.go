package storagetest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

// The relay's side of the store (storage.ClaimsAfterQuery and the relay's ops): a claim is its own
// outbox row. ClaimsAfter lists claims as the credits they owe, whether
// credited or not (nothing marks them); ApplyCredits books each once
// however often it is delivered; SendTo records where a credit went; the
// relay's positions are saved per database.

func init() {
	register("ContractCreditsExactlyOnce", contractCreditsExactlyOnce)
	register("ContractClaimsAfterPages", contractClaimsAfterPages)
	register("ContractCrossCellCredit", contractCrossCellCredit)
	register("ContractLedgerSeesDoubleCredit", contractLedgerSeesDoubleCredit)
	register("ContractCreditDest", contractCreditDest)
	register("ContractRelayPositions", contractRelayPositions)
}

// posOf is the relay position of claim c.
func posOf(c model.Claim) model.ClaimPos {
	return model.ClaimPos{CreatedMS: c.CreatedMS, PacketID: c.PacketID, Seq: c.Seq}
}

// A new claim's row names the cell its credit goes to as the store's
// SetCreditDest names it (from the claimant's shard) when the claim is
// made, by OpenBatch or in a group; ClaimsAfter gives it (Credit.Dest), and
// the Ledger and the reconciliation window read it back (Claim.Dest).
// SendTo changes it on the claims named, credited or not, and on no other;
// a claim not found is skipped; a malformed claim ID is ErrInvalidArgument
// and changes nothing.
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
	_, ref := f.send(sA, sendReq("ann", "s1", 900, 5), time.Hour)
	f.h.Clock.Advance(time.Millisecond)
	res, _ := f.open(ref, 7, opener("bob", sB), opener("cy", sC), opener("dee", sA))
	f.h.Clock.Advance(time.Millisecond)
	// A claim made in a group gets its Dest as well.
	gop := openOp(ref, 8, opener("eve", sC)).op().(*storage.OpenOp)
	if err := grouperOf(t, f.h).CommitGroup(f.ctx, []storage.Op{gop}); err != nil || len(gop.Results) != 1 || gop.Results[0].Err != nil {
		t.Fatalf("group open: %v, %s", err, describe(gop.Results))
	}
	f.h.Clock.Advance(time.Millisecond)
	b, c, a, e := res[0].Claim.ID, res[1].Claim.ID, res[2].Claim.ID, gop.Results[0].Claim.ID
	// dests reads every claim's Dest three ways and fails unless they agree.
	dests := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, cr := range f.owed(sA.DB(), 100) {
			out[cr.ClaimID] = cr.Dest
		}
		l := f.ledger()
		w, err := storage.ReconWindow(f.ctx, f.s, sA.DB(), []model.ShardID{sA}, []int{ref.Day}, 0, f.nowMS()+1, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Claims) != len(out) || len(w.Claims) != len(out) {
			t.Fatalf("%d claims in ClaimsAfter, %d in the ledger, %d in the window", len(out), len(l.Claims), len(w.Claims))
		}
		for id, dest := range out {
			if l.Claims[id].Dest != dest || w.Claims[id].Dest != dest {
				t.Fatalf("claim %s: Dest %q in ClaimsAfter, %q in the ledger, %q in the window", id, dest, l.Claims[id].Dest, w.Claims[id].Dest)
			}
		}
		return out
	}
	cell := func(sh model.ShardID) string { return fmt.Sprintf("cell-%d", sh) }
	if got, want := dests(), map[string]string{b: cell(sB), c: cell(sC), a: cell(sA), e: cell(sC)}; !maps.Equal(got, want) {
		t.Fatalf("new claims' dests %v, want %v", got, want)
	}
	cs := []model.Credit{creditOf(res[0].Claim, sB), creditOf(res[1].Claim, sC), creditOf(res[2].Claim, sA)}
	if err := storage.SendTo(f.ctx, f.s, cs[:2], "cell-x"); err != nil {
		t.Fatal(err)
	}
	if got, want := dests(), map[string]string{b: "cell-x", c: "cell-x", a: cell(sA), e: cell(sC)}; !maps.Equal(got, want) {
		t.Fatalf("dests after SendTo: %v, want %v", got, want)
	}
	// Credited: SendTo still records it (nothing marks a claim delivered).
	if n := f.applyCredits(cs[:1]); n != 1 {
		t.Fatalf("applied %d of 1", n)
	}
	unknown := []model.Credit{{ClaimID: model.ClaimID(ref.ID, 9)}, {ClaimID: model.ClaimID(model.NewPacketID(sB, f.h.Clock.Now()), 1)}}
	if err := storage.SendTo(f.ctx, f.s, append(slices.Clone(cs[:1]), unknown...), "cell-y"); err != nil {
		t.Fatalf("SendTo with claims not found: %v", err)
	}
	if err := storage.SendTo(f.ctx, f.s, nil, "cell-z"); err != nil {
		t.Fatalf("SendTo of nothing: %v", err)
	}
	err := storage.SendTo(f.ctx, f.s, []model.Credit{{ClaimID: "x"}}, "cell-z")
	wantCode(t, "SendTo of a malformed claim ID", err, model.ErrInvalidArgument)
	// A claim made after the dest function changed takes the new one; the
	// others keep theirs.
	d.SetCreditDest(func(sh model.ShardID) string { return fmt.Sprintf("new-%d", sh) })
	res2, _ := f.open(ref, 9, opener("fay", sB))
	f.h.Clock.Advance(time.Millisecond)
	want := map[string]string{b: "cell-y", c: "cell-x", a: cell(sA), e: cell(sC), res2[0].Claim.ID: "new-125"}
	if got := dests(); !maps.Equal(got, want) {
		t.Fatalf("dests after the last SendTo: %v, want %v", got, want)
	}
}

// Every claim is owed and credited exactly once: ClaimsAfter lists each new
// claim as the credit owed to the shard its open named; ApplyCredits books
// each once (a credit delivered again, or twice in one batch, changes
// nothing); a credited claim is still listed (nothing marks it); the books
// count a claim pending until its credit is booked, and the Ledger's claims
// carry their claimant's shard.
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
	if got := f.owed(sA.DB(), 100); !slices.Equal(got, credits) {
		t.Fatalf("claims after: %+v, want %+v", got, credits)
	}
	if got := f.owed(sC.DB(), 100); len(got) != 0 {
		t.Fatalf("claims of db 56 (a claim is listed in its packet's database): %+v", got)
	}
	l := f.check(books{deposits: 1005, balances: 5, open: 1000 - claimed, inFlight: claimed, sends: 1000, packets: 1, claims: 3})
	for _, c := range credits {
		if lc := l.Claims[c.ClaimID]; lc.ActShard != c.Shard || lc.ActID != c.ActID || lc.Amount != c.Amount || lc.Dest != "" {
			t.Fatalf("ledger claim %+v, its credit %+v", lc, c)
		}
	}
	if a := f.sameCellAudit(l); a.CreditsPending != 3 {
		t.Fatalf("cell audit before the credits: %d pending, want 3", a.CreditsPending)
	}

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
	// Booked: still listed, as after a relay's restart.
	if got := f.owed(sA.DB(), 100); !slices.Equal(got, credits) {
		t.Fatalf("claims after, once credited: %+v, want %+v", got, credits)
	}
	for act, b := range want {
		if got := f.balance(shardOf[act], act); got != b {
			t.Fatalf("%s's balance %d after redelivery, want %d", act, got, b)
		}
	}
	l = f.check(books{deposits: 1005, balances: 5 + claimed, open: 1000 - claimed, sends: 1000, packets: 1, claims: 3, credits: 3})
	for _, c := range credits {
		if cr := l.Credits[c.ClaimID]; cr.ClaimID != c.ClaimID || cr.ActID != c.ActID || cr.Amount != c.Amount {
			t.Fatalf("ledger credit %+v, want %+v", cr, c)
		}
	}
	if a := f.sameCellAudit(l); a.CreditsPending != 0 || a.CreditsIn != claimed {
		t.Fatalf("cell audit after the credits: %d pending, %d credited; want 0, %d", a.CreditsPending, a.CreditsIn, claimed)
	}

	// CreditsOf finds the booked credits by claim ID, and nothing for a claim never credited.
	never := model.Credit{ClaimID: model.ClaimID(ref.ID, 4), PacketID: ref.ID, ActID: "eve", Shard: sB, Amount: 1}
	found, err := storage.CreditsOf(f.ctx, f.s, append(slices.Clone(credits), never))
	if err != nil || len(found) != 3 {
		t.Fatalf("credits of: %+v, %v", found, err)
	}
	for _, c := range credits {
		if got := found[c.ClaimID]; got.ClaimID != c.ClaimID || got.ActID != c.ActID || got.Amount != c.Amount {
			t.Fatalf("credits of %s: %+v", c.ClaimID, got)
		}
	}
	if _, err := storage.CreditsOf(f.ctx, f.s, make([]model.Credit, 10_001)); err == nil {
		t.Fatal("credits of 10,001 claims: no error")
	}
	if _, err := storage.CreditsOf(f.ctx, f.s, []model.Credit{{ClaimID: credits[0].ClaimID, ActID: "bob", Shard: model.ShardCount}}); err == nil {
		t.Fatal("credits of a claimant in shard 1000: no error")
	}
}

// ClaimsAfter pages through the claims of one database (every shard of it,
// every day) in (created_ms, packet_id, seq) order: from fromMS and up to
// beforeMS, both included; strictly after the position it is given (none
// for the zero position); up to limit; next is the last one's position, or
// the position given when there is none. The claims of another database
// are not listed, and a database never used reads empty.
func contractClaimsAfterPages(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	cp := makeClaimsPages(t, f)
	t1, t2, t3, p1, p4, claims, all := cp.t1, cp.t2, cp.t3, cp.p1, cp.p4, cp.claims, cp.all

	db := sA.DB()
	read := func(what string, fromMS int64, after model.ClaimPos, beforeMS int64, limit int, want []model.Credit, wantNext model.ClaimPos) {
		t.Helper()
		got, next, err := storage.ClaimsAfter(f.ctx, f.s, db, fromMS, after, beforeMS, limit)
		if err != nil || !slices.Equal(got, want) || next != wantNext {
			t.Fatalf("%s: %+v next %+v, %v;\nwant %+v next %+v", what, got, next, err, want, wantNext)
		}
	}
	zero := model.ClaimPos{}
	// Paging through all of it.
	read("first page", 0, zero, t3, 2, all[:2], posOf(claims[1]))
	read("second page", 0, posOf(claims[1]), t3, 2, all[2:4], posOf(claims[3]))
	read("third page", 0, posOf(claims[3]), t3, 10, all[4:], posOf(claims[5]))
	read("past the end", 0, posOf(claims[5]), t3, 10, nil, posOf(claims[5]))
	read("limit 0", 0, posOf(claims[1]), t3, 0, nil, posOf(claims[1]))
	// beforeMS is included.
	read("up to t2", 0, zero, t2, 10, all[:4], posOf(claims[3]))
	read("up to t1", 0, zero, t1, 10, all[:3], posOf(claims[2]))
	read("before anything", 0, zero, t1-1, 10, nil, zero)
	// fromMS is included.
	read("from t2", t2, zero, t3, 10, all[3:], posOf(claims[5]))
	read("from t3", t3, zero, t3+5, 10, all[4:], posOf(claims[5]))
	read("from t2+1", t2+1, zero, t3, 10, all[4:], posOf(claims[5]))
	// after is excluded, compared as (created_ms, packet_id, seq).
	read("after the first", 0, posOf(claims[0]), t3, 10, all[1:], posOf(claims[5]))
	read("after t1's start", 0, model.ClaimPos{CreatedMS: t1}, t3, 10, all, posOf(claims[5]))
	read("after a seq not taken", 0, model.ClaimPos{CreatedMS: t1, PacketID: p1.ID, Seq: 99}, t3, 10, all[2:], posOf(claims[5]))
	read("after all of t1", 0, model.ClaimPos{CreatedMS: t1, PacketID: p4.ID}, t3, 10, all[3:], posOf(claims[5]))
	// Both bounds: the later one holds.
	read("from t2, after the first", t2, posOf(claims[0]), t3, 10, all[3:], posOf(claims[5]))
	read("from t1, after the fourth", t1, posOf(claims[3]), t3, 10, all[4:], posOf(claims[5]))
	read("from t1, after the fourth, up to t2", t1, posOf(claims[3]), t2, 10, nil, posOf(claims[3]))

	// Database 56 holds p3's claim only.
	got, next, err := storage.ClaimsAfter(f.ctx, f.s, sC.DB(), 0, zero, f.nowMS(), 10)
	if want := []model.Credit{creditOf(cp.r3, sA)}; err != nil || !slices.Equal(got, want) || next != posOf(cp.r3) {
		t.Fatalf("claims of db 56: %+v next %+v, %v; want %+v", got, next, err, want)
	}
	far := model.ClaimPos{CreatedMS: 5, PacketID: "x", Seq: 1}
	if got, next, err := storage.ClaimsAfter(f.ctx, f.s, 77, 0, far, f.nowMS(), 10); err != nil || len(got) != 0 || next != far {
		t.Fatalf("claims of a database never used: %+v next %+v, %v", got, next, err)
	}

	// Credited claims are listed still.
	f.applyCredits(all[:2])
	read("after two credits", 0, zero, t3, 10, all, posOf(claims[5]))
	var claimed model.Cents
	for _, c := range append(slices.Clone(claims), cp.r3) {
		claimed += c.Amount
	}
	f.check(books{deposits: 1500, balances: 500 + all[0].Amount + all[1].Amount, open: 1000 - claimed,
		inFlight: claimed - all[0].Amount - all[1].Amount, sends: 1000, packets: 4, claims: 7, credits: 2})
}

// claimsPages is what makeClaimsPages made for contractClaimsAfterPages.
type claimsPages struct {
	t1, t2, t3 int64           // the claims' creation times
	p1, p4     model.PacketRef // the first packet of day 14 and the packet of day 15
	claims     []model.Claim   // the claims of database sA.DB(), in list order
	all        []model.Credit  // their credits
	r3         model.Claim     // the claim of database 56
}

// makeClaimsPages makes claims across midnight (day 14 to 15) and three
// packets of two databases, opened out of packet order, for
// contractClaimsAfterPages, and checks their creation times.
func makeClaimsPages(t *testing.T, f *fixture) claimsPages {
	f.h.Clock.Advance(14*time.Hour - 10*time.Millisecond) // 23:59:59.990 of day 14
	f.deposit(sA, "ann", "d1", 500)
	f.deposit(sB, "eve", "d1", 500)
	f.deposit(sC, "zed", "d1", 500)
	_, p1 := f.send(sA, sendReq("ann", "s1", 300, 5), time.Hour)
	_, p2 := f.send(sB, sendReq("eve", "s1", 300, 5), time.Hour) // same database, another shard
	_, p3 := f.send(sC, sendReq("zed", "s1", 300, 5), time.Hour) // database 56
	f.h.Clock.Advance(time.Millisecond)
	t1 := f.nowMS()
	// Opened out of packet order: the list is in (created_ms, packet_id, seq)
	// order, not in the order of the commits.
	r2, _ := f.open(p2, 1, opener("dee", sA))
	r1, _ := f.open(p1, 2, opener("bob", sB), opener("cy", sC))
	r3, _ := f.open(p3, 3, opener("ann", sA))
	f.h.Clock.Advance(time.Millisecond)
	t2 := f.nowMS()
	r1b, _ := f.open(p1, 4, opener("eve", sB))
	f.h.Clock.Advance(10 * time.Millisecond) // 00:00:00.001 of day 15
	t3 := f.nowMS()
	_, p4 := f.send(sA, sendReq("ann", "s2", 100, 2), time.Hour)
	if p4.Day != 15 || p1.Day != 14 {
		t.Fatalf("packets of days %d and %d, want 14 and 15", p1.Day, p4.Day)
	}
	r4, _ := f.open(p4, 5, opener("fay", sC))
	r2b, _ := f.open(p2, 6, opener("gus", sA)) // a packet of day 14, a claim of day 15
	if p1.ID >= p2.ID || p2.ID >= p4.ID {
		t.Fatalf("packet IDs out of the expected order: %s %s %s", p1.ID, p2.ID, p4.ID)
	}
	claims := []model.Claim{r1[0].Claim, r1[1].Claim, r2[0].Claim, r1b[0].Claim, r2b[0].Claim, r4[0].Claim}
	all := []model.Credit{creditOf(claims[0], sB), creditOf(claims[1], sC), creditOf(claims[2], sA), creditOf(claims[3], sB),
		creditOf(claims[4], sA), creditOf(claims[5], sC)}
	for i, at := range []int64{t1, t1, t1, t2, t3, t3} {
		if claims[i].CreatedMS != at {
			t.Fatalf("claim %d created at %d, want %d", i, claims[i].CreatedMS, at)
		}
	}
	f.h.Clock.Advance(time.Millisecond)
	return claimsPages{t1, t2, t3, p1, p4, claims, all, r3[0].Claim}
}

// A claim made in one cell for a claimant of another cell is credited there:
// the claim's cell lists it (ClaimsAfter), the claimant's cell books it
// once. The claim's cell does not count it pending (its claimant is not
// its own) but would if it served the claimant; each cell's own audit
// passes (the claimant's cell counts a credit whose claim lives elsewhere)
// and so does the audit of both.
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
	owed := a.owed(sA.DB(), 10)
	if !slices.Equal(owed, []model.Credit{credit}) {
		t.Fatalf("claims in the claim's cell: %+v", owed)
	}
	la := a.ledger()
	if ca := a.sameCellAudit(la); ca.CreditsPending != 0 || ca.Claims != 1 {
		t.Fatalf("claim's cell audit: %+v; want 1 claim, none pending (its claimant is another cell's)", ca)
	}
	a.owns = ownsAll
	if ca := a.sameCellAudit(la); ca.CreditsPending != 1 {
		t.Fatalf("claim's cell audit, owning every shard: %+v; want 1 pending", ca)
	}
	a.owns = func(s model.ShardID) bool { return s.DB() == sA.DB() }
	if r := model.Audit([]model.Ledger{la}); !r.OK() || r.InFlight != credit.Amount || r.InFlightCount != 1 {
		t.Fatalf("audit of the claim's cell alone: %+v", r)
	}
	if n := b.applyCredits(owed); n != 1 {
		t.Fatalf("booked %d in the claimant's cell", n)
	}
	if n := b.applyCredits(owed); n != 0 { // the relay delivered twice
		t.Fatalf("booked %d again", n)
	}
	la, lb := a.ledger(), b.ledger()
	if ca := b.sameCellAudit(lb); ca.CreditsElsewhere != 1 || ca.CreditsIn != credit.Amount || ca.Balances != credit.Amount || ca.CreditsPending != 0 {
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
	found, err := storage.CreditsOf(b.ctx, b.s, owed)
	if err != nil || found[credit.ClaimID].Amount != credit.Amount || found[credit.ClaimID].ActID != "cy" {
		t.Fatalf("credits of, claimant's cell: %+v, %v", found, err)
	}
	if found, err := storage.CreditsOf(a.ctx, a.s, owed); err != nil || len(found) != 0 {
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
	found, err := storage.CreditsOf(f.ctx, f.s, []model.Credit{good, forged})
	if err != nil || found[good.ClaimID].Amount != 2*good.Amount {
		t.Fatalf("credits of a claim booked twice: %+v, %v", found, err)
	}
}

// The relay's positions read back as saved, per database asked about (a
// database without one is absent); a save may move one back; a database
// out of 0..99 is an error and saves nothing. They are not
// reconciliation's positions, and moving the clock or making claims does
// not move them. (The relay saves only databases that hold claims: the
// databases saved here are made first. MariaDB skips one that does not
// exist: TestRelaySkipsMissingDatabases.)
func contractRelayPositions(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	for _, db := range []int{0, 12, 56, 99} {
		if err := f.s.EnsureShard(f.ctx, model.ShardID(db*10)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dbs ...int) map[int]int64 {
		t.Helper()
		pos, err := storage.RelayPositions(f.ctx, f.s, dbs)
		if err != nil {
			t.Fatalf("relay positions of %v: %v", dbs, err)
		}
		return pos
	}
	save := func(pos map[int]int64) {
		t.Helper()
		if err := storage.SaveRelayPositions(f.ctx, f.s, pos); err != nil {
			t.Fatalf("save relay positions %v: %v", pos, err)
		}
	}
	if pos := read(0, 12, 56, 99); len(pos) != 0 {
		t.Fatalf("a new store's relay positions: %v", pos)
	}
	if pos := read(); len(pos) != 0 {
		t.Fatalf("relay positions of no database: %v", pos)
	}
	save(map[int]int64{})
	t0 := f.nowMS()
	save(map[int]int64{12: t0, 56: t0 + 100})
	save(map[int]int64{12: t0, 56: t0 + 100}) // again
	if pos := read(12, 56, 3); !maps.Equal(pos, map[int]int64{12: t0, 56: t0 + 100}) {
		t.Fatalf("relay positions %v", pos)
	}
	if pos := read(56); !maps.Equal(pos, map[int]int64{56: t0 + 100}) {
		t.Fatalf("relay position of db 56 alone: %v", pos)
	}
	save(map[int]int64{12: t0 - 50, 0: 5, 99: 7}) // 12 moves back
	want := map[int]int64{0: 5, 12: t0 - 50, 56: t0 + 100, 99: 7}
	if pos := read(0, 12, 56, 99); !maps.Equal(pos, want) {
		t.Fatalf("relay positions after a move back %v, want %v", pos, want)
	}
	for _, bad := range []int{-1, 100} {
		if err := storage.SaveRelayPositions(f.ctx, f.s, map[int]int64{bad: 1, 4: 1, 12: 1}); err == nil {
			t.Fatalf("save of database %d: no error", bad)
		}
	}
	if err := storage.SaveReconPositions(f.ctx, f.s, map[int]int64{12: t0 + 999}); err != nil {
		t.Fatal(err)
	}
	f.deposit(sA, "ann", "d1", 100)
	_, ref := f.send(sA, sendReq("ann", "s1", 100, 2), time.Hour)
	f.h.Clock.Advance(time.Second)
	f.open(ref, 1, opener("bob", sB))
	if pos := read(0, 4, 12, 56, 99); !maps.Equal(pos, want) {
		t.Fatalf("relay positions after refused saves, a recon save and a claim: %v, want %v", pos, want)
	}
	if rp, err := storage.ReconPositions(f.ctx, f.s); err != nil || !maps.Equal(rp, map[int]int64{12: t0 + 999}) {
		t.Fatalf("recon positions after the relay's saves: %v, %v", rp, err)
	}
}
