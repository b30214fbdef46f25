package model

import (
	"reflect"
	"testing"
)

func TestCompareCredits(t *testing.T) {
	want := []Credit{{ClaimID: "c1", ActID: "a", Amount: 10}, {ClaimID: "c2", ActID: "b", Amount: 20}, {ClaimID: "c3", ActID: "c", Amount: 30}}
	found := map[string]Credit{"c1": {ClaimID: "c1", ActID: "a", Amount: 10}, "c3": {ClaimID: "c3", ActID: "c", Amount: 31}}
	r := CompareCredits(want, found)
	if r.Matched != (Tally{1, 10}) || len(r.Diffs[DiffCreditMissing]) != 1 || r.Diffs[DiffCreditMissing][0] != "c2" ||
		len(r.Diffs[DiffCreditMismatch]) != 1 || r.Diffs[DiffCreditMismatch][0] != "c3" {
		t.Fatalf("%+v", r)
	}
}

// cellLedger is the books of a cell owning shards 0-499: alice deposited 1000
// and sent a packet of 300; bob (shard 100, here) claimed 100, credited here;
// carol (shard 700, another cell) claimed 150, credited there (not in these
// rows); dave (shard 101, here) claimed 50, not credited yet. Bob also got a
// credit of 40 from a packet of another cell (shard 600).
func cellLedger() (Ledger, PacketID, PacketID) {
	p, far := PacketID("20261129005"+"0123456789abcdef"), PacketID("20261129600"+"fedcba9876543210")
	l := NewLedger("cell-a")
	l.Deposits, l.Sends, l.PacketTotals = 1000, 300, 300
	l.Balances = 700 + 100 + 40
	for seq, c := range []struct {
		act   string
		shard ShardID
		amt   Cents
	}{{"bob", 100, 100}, {"carol", 700, 150}, {"dave", 101, 50}} {
		id := ClaimID(p, int64(seq+1))
		l.Claims[id] = Claim{ID: id, PacketID: p, Seq: int64(seq + 1), ActID: c.act, Amount: c.amt, ActShard: c.shard}
	}
	l.Credits[ClaimID(p, 1)] = Credit{ClaimID: ClaimID(p, 1), ActID: "bob", Shard: 100, Amount: 100}
	l.Credits[ClaimID(far, 1)] = Credit{ClaimID: ClaimID(far, 1), ActID: "bob", Shard: 100, Amount: 40}
	return l, p, far
}

func owns0to499(s ShardID) bool { return s < 500 }

// TestAuditCell: the clean books count dave's claim pending (its claimant is
// served here, no credit yet) and not carol's (credited in her cell); a
// claim not credited is never a difference, and each fault between claims
// and credits is named with its kind.
func TestAuditCell(t *testing.T) {
	l, p, _ := cellLedger()
	a := AuditCell(l, owns0to499)
	if !a.OK() || a.Claimed != 300 || a.CreditsIn != 140 || a.CreditsPending != 1 || a.CreditsElsewhere != 1 || a.Claims != 3 ||
		len(a.Differences) != 0 {
		t.Fatalf("clean books: %+v", a)
	}
	for name, c := range map[string]struct {
		fault   func(l *Ledger)
		kind    string // "": the books hold
		pending int
	}{
		// The cell cannot tell a lost credit from one not delivered yet:
		// reconciliation re-drives it, and the receiver books it once.
		"credit row deleted": {func(l *Ledger) { delete(l.Credits, ClaimID(p, 1)); l.Balances -= 100 }, "", 2},
		"dave credited":      {func(l *Ledger) { l.Credits[ClaimID(p, 3)] = Credit{ActID: "dave", Amount: 50}; l.Balances += 50 }, "", 0},
		"claim amount changed": {func(l *Ledger) {
			c := l.Claims[ClaimID(p, 1)]
			c.Amount--
			l.Claims[ClaimID(p, 1)] = c
			l.OpenRemaining++ // the packet still adds up
		}, DiffCreditMismatch, 1},
		"claim of another cell's claimant credited here to another account": {func(l *Ledger) {
			l.Credits[ClaimID(p, 2)] = Credit{ActID: "mallory", Amount: 150}
			l.Balances += 150
		}, DiffCreditMismatch, 1},
		"invented credit": {func(l *Ledger) {
			id := ClaimID(p, 9)
			l.Credits[id] = Credit{ClaimID: id, ActID: "bob", Amount: 5}
			l.Balances += 5
		}, DiffCreditOrphan, 1},
		"credit of another amount": {func(l *Ledger) {
			l.Credits[ClaimID(p, 1)] = Credit{ClaimID: ClaimID(p, 1), ActID: "bob", Amount: 101}
			l.Balances++
		}, DiffCreditMismatch, 1},
		"dave credited to another account": {func(l *Ledger) {
			l.Credits[ClaimID(p, 3)] = Credit{ActID: "eve", Amount: 50}
			l.Balances += 50
		}, DiffCreditMismatch, 0},
	} {
		l, _, _ := cellLedger()
		c.fault(&l)
		a := AuditCell(l, owns0to499)
		ok := a.OK() && len(a.Differences) == 0
		if c.kind != "" {
			ok = !a.OK() && a.Differences[c.kind] == 1 && len(a.Differences) == 1 && a.Difference == 0
		}
		if !ok || a.CreditsPending != c.pending {
			t.Errorf("%s: %+v", name, a)
		}
	}
	// A balance changed without its flow row, and a send flow without its packet.
	l, _, _ = cellLedger()
	l.Balances++
	if a := AuditCell(l, owns0to499); a.OK() || a.Difference != -1 {
		t.Errorf("a cent without a flow: %+v", a)
	}
	l, _, _ = cellLedger()
	l.Sends, l.Balances, l.PacketTotals = 400, 740, 300
	if a := AuditCell(l, owns0to499); a.OK() {
		t.Errorf("a send without its packet: %+v", a)
	}
}

// TestAuditCellRewardsAndWithdrawals: a cell's own audit counts reward flows
// in and withdraw flows out; one booked without its balance change is a
// difference of exactly its amount, named in the problem line.
func TestAuditCellRewardsAndWithdrawals(t *testing.T) {
	l, _, _ := cellLedger()
	l.Rewards, l.Withdrawals = 500, 200
	l.Balances += 500 - 200 // bob rewarded 500, alice withdrew 200
	a := AuditCell(l, owns0to499)
	if !a.OK() || a.Rewards != 500 || a.Withdrawals != 200 || a.Balances != 1140 || a.Difference != 0 {
		t.Fatalf("balanced books: %+v", a)
	}
	l.Balances -= 500 // the reward's flow row stands, its balance change is gone
	a = AuditCell(l, owns0to499)
	want := "deposits 1000 + rewards 500 + credits 140 + refunds 0 - sends 300 - withdrawals 200 != balances 640"
	if a.OK() || a.Difference != 500 || !reflect.DeepEqual(a.Problems, []string{want}) {
		t.Fatalf("a reward without its balance change: %+v", a)
	}
	l, _, _ = cellLedger()
	l.Withdrawals = 200 // a withdraw flow whose debit never happened
	if a := AuditCell(l, owns0to499); a.OK() || a.Difference != -200 {
		t.Fatalf("a withdrawal without its debit: %+v", a)
	}
}
