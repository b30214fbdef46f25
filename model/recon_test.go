package model

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestCompareOutbox(t *testing.T) {
	p := NewPacketID(7, time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	claim := func(seq int64, act string, amount Cents) Claim {
		return Claim{ID: ClaimID(p, seq), PacketID: p, Seq: seq, ActID: act, Amount: amount}
	}
	claims := map[string]Claim{}
	outbox := map[string]OutboxRow{}
	for i, c := range []Claim{claim(1, "a", 10), claim(2, "b", 20), claim(3, "c", 30), claim(4, "d", 40), claim(5, "e", 50)} {
		claims[c.ID] = c
		outbox[c.ID] = OutboxRow{ClaimID: c.ID, ActID: c.ActID, Shard: 900, Amount: c.Amount, Delivered: i%2 == 0}
	}
	r := CompareOutbox(claims, outbox)
	if r.Diffs.Count() != 0 || r.Matched != (Tally{5, 150}) || r.Claims != r.Matched || r.Outbox != r.Matched ||
		len(r.Delivered) != 3 || len(r.Pending) != 2 || r.Delivered[0].ClaimID != ClaimID(p, 1) || r.Delivered[0].Shard != 900 {
		t.Fatalf("clean rows: %+v", r)
	}
	delete(outbox, ClaimID(p, 1))                                                    // claim without its row
	outbox[ClaimID(p, 9)] = OutboxRow{ClaimID: ClaimID(p, 9), ActID: "z", Amount: 5} // row without its claim
	o := outbox[ClaimID(p, 2)]
	o.Amount++ // row of another amount
	outbox[ClaimID(p, 2)] = o
	c := claims[ClaimID(p, 3)]
	c.ActID = "mallory" // claim of another account than its row
	claims[ClaimID(p, 3)] = c
	r = CompareOutbox(claims, outbox)
	want := Diffs{DiffOutboxMissing: {ClaimID(p, 1)}, DiffOutboxOrphan: {ClaimID(p, 9)}, DiffOutboxMismatch: {ClaimID(p, 2), ClaimID(p, 3)}}
	for _, k := range DiffKinds {
		if strings.Join(r.Diffs.Sample(k, 10), ",") != strings.Join(want.Sample(k, 10), ",") {
			t.Errorf("%s: %v, want %v", k, r.Diffs[k], want[k])
		}
	}
	if r.Matched != (Tally{2, 90}) || r.Claims != (Tally{5, 150}) || r.Outbox != (Tally{5, 146}) {
		t.Fatalf("tallies with faults: %+v", r)
	}
	if got := strings.Join(r.Diffs.Problems(), "; "); !strings.Contains(got, "outbox_missing: 1 claims ("+ClaimID(p, 1)+")") {
		t.Fatalf("problems: %s", got)
	}
}

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
// and sent a packet of 300; bob (shard 100, here) claimed 100, delivered and
// credited; carol (shard 700, another cell) claimed 150, delivered there; dave
// (shard 101) claimed 50, not delivered yet. Bob also got a credit of 40 from
// a packet of another cell (shard 600).
func cellLedger() (Ledger, PacketID, PacketID) {
	p, far := PacketID("20261129005"+"0123456789abcdef"), PacketID("20261129600"+"fedcba9876543210")
	l := NewLedger("cell-a")
	l.Deposits, l.Sends, l.PacketTotals = 1000, 300, 300
	l.Balances = 700 + 100 + 40
	for seq, c := range []struct {
		act   string
		shard ShardID
		amt   Cents
		done  bool
	}{{"bob", 100, 100, true}, {"carol", 700, 150, true}, {"dave", 101, 50, false}} {
		id := ClaimID(p, int64(seq+1))
		l.Claims[id] = Claim{ID: id, PacketID: p, Seq: int64(seq + 1), ActID: c.act, Amount: c.amt}
		l.Outbox[id] = OutboxRow{ClaimID: id, ActID: c.act, Shard: c.shard, Amount: c.amt, Delivered: c.done}
	}
	l.Credits[ClaimID(p, 1)] = Credit{ClaimID: ClaimID(p, 1), ActID: "bob", Amount: 100}
	l.Credits[ClaimID(far, 1)] = Credit{ClaimID: ClaimID(far, 1), ActID: "bob", Amount: 40}
	return l, p, far
}

func owns0to499(s ShardID) bool { return s < 500 }

func TestAuditCell(t *testing.T) {
	l, p, _ := cellLedger()
	a := AuditCell(l, owns0to499)
	if !a.OK() || a.Claimed != 300 || a.CreditsIn != 140 || a.OutboxPending != 1 || a.CreditsElsewhere != 1 || a.Claims != 3 {
		t.Fatalf("clean books: %+v", a)
	}
	for name, c := range map[string]struct {
		fault func(l *Ledger)
		kind  string
	}{
		"credit row deleted": {func(l *Ledger) { delete(l.Credits, ClaimID(p, 1)); l.Balances -= 100 }, DiffCreditMissing},
		"outbox row dropped": {func(l *Ledger) { delete(l.Outbox, ClaimID(p, 3)) }, DiffOutboxMissing},
		"claim amount changed": {func(l *Ledger) {
			c := l.Claims[ClaimID(p, 2)]
			c.Amount--
			l.Claims[ClaimID(p, 2)] = c
		}, DiffOutboxMismatch},
		"invented credit": {func(l *Ledger) {
			id := ClaimID(p, 9)
			l.Credits[id] = Credit{ClaimID: id, ActID: "bob", Amount: 5}
			l.Balances += 5
		}, DiffCreditOrphan},
		"credit of another amount": {func(l *Ledger) {
			l.Credits[ClaimID(p, 1)] = Credit{ClaimID: ClaimID(p, 1), ActID: "bob", Amount: 101}
			l.Balances++
		}, DiffCreditMismatch},
	} {
		l, _, _ := cellLedger()
		c.fault(&l)
		a := AuditCell(l, owns0to499)
		if a.OK() || a.Differences[c.kind] != 1 {
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
