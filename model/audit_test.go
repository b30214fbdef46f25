package model

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func ledgers() (Ledger, Ledger) {
	// Cell a: 1000 deposited, 400 sent in one packet; 300 claimed: 200 by x (in a,
	// credited), 100 by y (in b, not yet credited); 100 still in the packet.
	a := Ledger{Cell: "a", Deposits: 1000, Balances: 600 + 200, Sends: 400, PacketTotals: 400, OpenRemaining: 100,
		Claims:  map[string]Claim{"p1c1": {ActID: "x", Amount: 200, ActShard: 1}, "p1c2": {ActID: "y", Amount: 100, ActShard: 700, Dest: "b"}},
		Credits: map[string]Credit{"p1c1": {ActID: "x", Amount: 200}}}
	b := NewLedger("b")
	return a, b
}

func TestAuditConservation(t *testing.T) {
	a, b := ledgers()
	r := Audit([]Ledger{a, b})
	if !r.OK() || r.InFlight != 100 || r.InFlightCount != 1 || r.Difference != 0 {
		t.Fatalf("clean books reported %+v", r)
	}
	// The relay delivers y's claim: still balanced, nothing in flight.
	b.Credits["p1c2"] = Credit{ActID: "y", Amount: 100}
	b.Balances = 100
	if r = Audit([]Ledger{a, b}); !r.OK() || r.InFlight != 0 {
		t.Fatalf("after delivery %+v", r)
	}
}

func TestAuditFindsInventedMoney(t *testing.T) {
	a, b := ledgers()
	b.Credits["p9c1"] = Credit{ActID: "z", Amount: 50} // a credit without a claim
	b.Balances = 50
	r := Audit([]Ledger{a, b})
	if r.OK() || r.Difference != -50 || !strings.Contains(strings.Join(r.Problems, ";"), "p9c1") {
		t.Fatalf("orphan credit: %+v", r)
	}
	a, b = ledgers()
	b.Credits["p1c2"] = Credit{ActID: "y", Amount: 130} // credited more than claimed
	b.Balances = 130
	if r = Audit([]Ledger{a, b}); r.OK() || r.Difference != -30 {
		t.Fatalf("over-credit: %+v", r)
	}
	a, b = ledgers()
	b.Credits["p1c2"] = Credit{ActID: "mallory", Amount: 100} // credited to the wrong account
	b.Balances = 100
	if r = Audit([]Ledger{a, b}); r.OK() || r.Difference != 0 || !strings.Contains(strings.Join(r.Problems, ";"), "mallory") {
		t.Fatalf("wrong account: %+v", r)
	}
}

func TestAuditFindsLostMoney(t *testing.T) {
	a, b := ledgers()
	a.Balances--
	if r := Audit([]Ledger{a, b}); r.OK() || r.Difference != 1 {
		t.Fatalf("a lost cent: %+v", r)
	}
	a, b = ledgers()
	delete(a.Claims, "p1c2") // a claim row lost: its 100 cents are neither in the packet nor owed
	if r := Audit([]Ledger{a, b}); r.OK() || r.Difference != 100 || r.InFlight != 0 {
		t.Fatalf("a lost claim row: %+v", r)
	}
	a, b = ledgers()
	b.Claims["p1c2"] = a.Claims["p1c2"] // the claim stored in both cells
	if r := Audit([]Ledger{a, b}); r.OK() || !strings.Contains(strings.Join(r.Problems, ";"), "claim p1c2 is stored in 2 cells") {
		t.Fatalf("a claim in two cells passed: %+v", r)
	}
	a, b = ledgers()
	a.Sends = 500 // a send flow without its packet
	if r := Audit([]Ledger{a, b}); r.OK() {
		t.Fatalf("send without packet passed: %+v", r)
	}
}

// TestAuditRewardsAndWithdrawals: reward flows are money in (from an
// activity's budget) and withdraw flows money out (to a bank), summed across
// cells: deposits + rewards - withdrawals = balances + open + in flight.
// A reward or withdrawal booked on one side only is off by exactly its amount.
func TestAuditRewardsAndWithdrawals(t *testing.T) {
	books := func() (Ledger, Ledger) {
		a, b := ledgers()
		a.Withdrawals, a.Balances = 120, a.Balances-120 // x takes 120 of its 800 to the bank
		b.Rewards, b.Balances = 250, b.Balances+250     // a claimant in b is rewarded 250
		b.RewardRows = RewardRows{Count: 1, Issued: 250, Booked: 250, IntoWall: 250}
		return a, b
	}
	a, b := books()
	r := Audit([]Ledger{a, b})
	if !r.OK() || r.Deposits != 1000 || r.Rewards != 250 || r.Withdrawals != 120 || r.Balances != 680+250 ||
		r.OpenRemaining != 100 || r.InFlight != 100 || r.Difference != 0 {
		t.Fatalf("balanced books with rewards and withdrawals: %+v", r)
	}
	for _, c := range []struct {
		name  string
		fault func(a, b *Ledger)
		diff  Cents
	}{
		{"a reward flow without its balance change", func(a, b *Ledger) { b.Balances -= 250 }, 250},
		{"a reward paid without its flow", func(a, b *Ledger) { b.Rewards = 0 }, -250},
		{"a withdraw flow without its debit", func(a, b *Ledger) { a.Balances += 120 }, -120},
		{"a debit without its withdraw flow", func(a, b *Ledger) { a.Withdrawals = 0 }, 120},
		{"a second reward flow of 7 in a, no balance", func(a, b *Ledger) { a.Rewards += 7 }, 7},
	} {
		a, b := books()
		c.fault(&a, &b)
		if r := Audit([]Ledger{a, b}); r.OK() || r.Difference != c.diff {
			t.Errorf("%s: difference %d, want %d: %+v", c.name, r.Difference, c.diff, r)
		}
	}
}

func TestLedgerMerge(t *testing.T) {
	l := NewLedger("")
	l.Merge(Ledger{Deposits: 5, Rewards: 9, Withdrawals: 4, Balances: 3, Credits: map[string]Credit{"c1": {ActID: "a", Amount: 2}}})
	l.Merge(Ledger{Deposits: 1, Rewards: 1, Withdrawals: 2, Credits: map[string]Credit{"c1": {ActID: "b", Amount: 2}}, Problems: []string{"p"}})
	if l.Deposits != 6 || l.Rewards != 10 || l.Withdrawals != 6 || l.Balances != 3 || l.Credits["c1"].Amount != 4 || len(l.Problems) != 2 {
		t.Fatalf("merged %+v", l)
	}
}

// TestDiffTally: a tally keeps whole counts and the 10 smallest claim IDs of
// each kind however they arrive, merges as if one had seen every ID, and
// renders the problem lines Diffs renders of the same IDs.
func TestDiffTally(t *testing.T) {
	var all, a, b DiffTally
	d := Diffs{}
	r := rand.New(rand.NewPCG(7, 9))
	for i, n := range r.Perm(57) {
		id := fmt.Sprintf("claim-%03d", n)
		kind := DiffKinds[n%2]
		all.Add(kind, id)
		d.Add(kind, id)
		if i%3 == 0 {
			a.Add(kind, id)
		} else {
			b.Add(kind, id)
		}
	}
	a.Merge(b)
	for _, tt := range []DiffTally{all, a} {
		if !reflect.DeepEqual(tt.Problems(), d.Problems()) {
			t.Fatalf("problems %q, want %q", tt.Problems(), d.Problems())
		}
		for _, k := range DiffKinds[:2] {
			if tt.Count[k] != len(d[k]) || !reflect.DeepEqual(tt.Sample[k], d.Sample(k, 10)) {
				t.Fatalf("%s: count %d sample %v, want %d %v", k, tt.Count[k], tt.Sample[k], len(d[k]), d.Sample(k, 10))
			}
		}
	}
	var empty DiffTally
	if empty.Problems() != nil {
		t.Fatalf("empty tally: %q", empty.Problems())
	}
}

// TestAuditNamesWhere: a claim credited in two cells is named with both
// cells, the databases, the act_ids and the amounts of each credit and of
// the claim; a credit without a claim names its cell and database too, and
// a claim never credited is in flight, not a problem.
func TestAuditNamesWhere(t *testing.T) {
	at := time.UnixMilli(1_760_000_000_000)
	id := ClaimID(NewPacketID(123, at), 1) // a packet of shard 123: db_12
	claim := Claim{ID: id, ActID: "alice", Amount: 250}
	a := Ledger{Cell: "cell-1", Deposits: 1000, Balances: 750, Sends: 250, PacketTotals: 250,
		Claims: map[string]Claim{id: claim}}
	b := NewLedger("cell-2")
	b.Credits[id] = Credit{ClaimID: id, ActID: "alice", Shard: 557, Amount: 250}
	b.Balances = 250
	c := NewLedger("cell-3")
	c.Credits[id] = Credit{ClaimID: id, ActID: "alice", Shard: 557, Amount: 250}
	c.Balances = 250
	r := Audit([]Ledger{a, b, c})
	want := "claim " + id + " was credited in 2 cells: cell-2, db_55 credited 250 cents to alice, cell-3, db_55 credited 250 cents to alice; " +
		"its claim: cell-1, db_12 (250 cents to alice)"
	if r.OK() || r.Difference != -250 || !slices.Contains(r.Problems, want) {
		t.Fatalf("double credit: want difference -250 and the problem\n%s\ngot %d and\n%s", want, r.Difference, strings.Join(r.Problems, "\n"))
	}

	b = NewLedger("cell-2")
	b.Credits[id+"9"] = Credit{ClaimID: id + "9", ActID: "mallory", Shard: 801, Amount: 77}
	b.Balances = 77
	r = Audit([]Ledger{a, b})
	want = "credit " + id + "9 of 77 cents to mallory (cell-2, db_80) has no claim"
	if !reflect.DeepEqual(r.Problems, []string{want}) || r.InFlight != 250 || r.InFlightCount != 1 || r.Difference != -77 {
		t.Errorf("want the problem\n%s\nalone, 250 cents in flight and a difference of -77, got %+v", want, r)
	}
}

// TestAddCopies: copies are listed and never change the sums; one handed
// over that changed since is a problem, and so is one no cell owns.
func TestAddCopies(t *testing.T) {
	a, b := ledgers()
	r := Audit([]Ledger{a, b})
	before := r.Difference
	r.AddCopies([]DBCopy{
		{Cell: "a", DB: 38, Kind: CopyFrozen, Version: 7, Owner: "b"},
		{Cell: "a", DB: 12, Kind: CopyHandedOver, Version: 5, Owner: "b", Rows: 40},
	})
	if !r.OK() || r.Difference != before || len(r.Copies) != 2 || r.Copies[0].DB != 12 {
		t.Fatalf("copies listed: %+v", r)
	}
	if s := r.Copies[1].String(); s != "a: db_38, owned by b by the map, frozen copy of a hand-over under map version 7, not released yet" {
		t.Errorf("frozen copy listed as %q", s)
	}
	r.AddCopies([]DBCopy{{Cell: "b", DB: 12, Kind: CopyHandedOver, Version: 6, Owner: "a", Rows: 41, Changed: true},
		{Cell: "b", DB: 90, Kind: CopyUnrecorded}})
	for _, want := range []string{
		"b: db_12, handed over under map version 6, changed after the hand-over (41 rows now): compare it with a's",
		"b: db_90 is on the cell's server but no cell owns it by the map: its rows are in nobody's books",
	} {
		if !slices.Contains(r.Problems, want) {
			t.Errorf("want the problem %q, got %q", want, r.Problems)
		}
	}
}
