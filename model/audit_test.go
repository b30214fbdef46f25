package model

import (
	"strings"
	"testing"
)

func TestAuditConservation(t *testing.T) {
	c1 := Ledger{Cell: "a", Deposits: 1000, Balances: 600, Sends: 400, PacketTotals: 400, OpenRemaining: 100,
		Claims:  map[string]Claim{"p1c1": {Amount: 200}, "p1c2": {Amount: 100}},
		Credits: map[string]Cents{"p1c1": 200}}
	c2 := Ledger{Cell: "b", Balances: 0, Claims: map[string]Claim{}, Credits: map[string]Cents{}}
	// a: 1000 deposited, 400 sent; 300 claimed: 200 credited back in a, 100 in flight.
	c1.Balances = 600 + 200
	r := Audit([]Ledger{c1, c2})
	if !r.OK() || r.InFlight != 100 || r.InFlightCount != 1 || r.Difference != 0 {
		t.Fatalf("clean books reported %+v", r)
	}
	// Invented money: a credit without a claim.
	c2.Credits["p9c1"] = 50
	c2.Balances = 50
	r = Audit([]Ledger{c1, c2})
	if r.OK() || r.Difference != 0 && len(r.Problems) == 0 {
		t.Fatalf("orphan credit not reported: %+v", r)
	}
	if !strings.Contains(strings.Join(r.Problems, ";"), "p9c1") {
		t.Fatalf("problems %v", r.Problems)
	}
	// Lost money: a balance lower than the books say.
	delete(c2.Credits, "p9c1")
	c2.Balances = 0
	c1.Balances -= 1
	r = Audit([]Ledger{c1, c2})
	if r.OK() || r.Difference != 1 {
		t.Fatalf("a lost cent not reported: %+v", r)
	}
}
