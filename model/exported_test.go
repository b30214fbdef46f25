package model

import (
	"strings"
	"testing"
)

// TestAuditAcrossExports: cell a holds packets of database 1 (shard 10), cell
// b the wallets of database 7 (shard 70). Claims dated 20270301 leave a's
// database 1 (claims horizon 20270305) and their credits b's database 7
// (credits horizon 20270305), in either order. A claim whose credit, or a
// credit whose claim, may have left is summed with the exported ones, not
// reported; the sums must match; a claim and credit both still there are
// compared row by row whatever their date; and a claim never credited, or
// credited twice, before the horizons is found.
func TestAuditAcrossExports(t *testing.T) {
	pid := "20270301010" + "0123456789abcdef" // database 1's shard 10, dated 20270301
	c1, c2 := pid+"c1", pid+"c2"
	// Two claims of 300 and 200 to x and y (shard 70), 500 sent from a's
	// 1000; both credited.
	base := func() (Ledger, Ledger) {
		a := Ledger{Cell: "a", Deposits: 1000, Balances: 500, Sends: 500, PacketTotals: 500, Packets: 1,
			Claims:  map[string]Claim{c1: {ActID: "x", Amount: 300, ActShard: 70}, c2: {ActID: "y", Amount: 200, ActShard: 70}},
			Credits: map[string]Credit{}}
		b := Ledger{Cell: "b", Balances: 500, Claims: map[string]Claim{},
			Credits: map[string]Credit{c1: {ActID: "x", Amount: 300, Shard: 70}, c2: {ActID: "y", Amount: 200, Shard: 70}}}
		return a, b
	}
	exportClaims := func(a *Ledger, ids ...string) {
		a.Exported.SetHorizon(1, true, "20270305")
		for _, id := range ids {
			a.Exported.Claims++
			a.Exported.ClaimCents += a.Claims[id].Amount
			delete(a.Claims, id)
		}
	}
	exportCredits := func(b *Ledger, ids ...string) {
		b.Exported.SetHorizon(7, false, "20270305")
		for _, id := range ids {
			b.Exported.Credits++
			b.Exported.CreditCents += b.Credits[id].Amount
			delete(b.Credits, id)
		}
	}
	for _, tc := range []struct {
		name    string
		change  func(a, b *Ledger)
		problem string // "" clean
	}{
		{"nothing exported", func(a, b *Ledger) {}, ""},
		{"claims left first", func(a, b *Ledger) { exportClaims(a, c1, c2) }, ""},
		{"credits left first", func(a, b *Ledger) { exportCredits(b, c1, c2) }, ""},
		{"both left", func(a, b *Ledger) { exportClaims(a, c1, c2); exportCredits(b, c1, c2) }, ""},
		{"one of each", func(a, b *Ledger) { exportClaims(a, c1); exportCredits(b, c2) }, ""},
		{"a claim never credited, the others exported", func(a, b *Ledger) {
			delete(b.Credits, c2)
			b.Balances -= 200
			exportClaims(a, c1, c2)
			exportCredits(b, c1)
		}, "200 cents claimed and never credited"},
		{"a claim credited twice: once exported, once again", func(a, b *Ledger) {
			exportCredits(b, c1)
			b.Credits[c1] = Credit{ActID: "x", Amount: 300, Shard: 70}
			b.Balances += 300
			exportClaims(a, c1)
		}, "more credited than claimed"},
		{"both rows there, credited to another account", func(a, b *Ledger) {
			exportClaims(a)
			exportCredits(b)
			b.Credits[c1] = Credit{ActID: "mallory", Amount: 300, Shard: 70}
		}, "to mallory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := base()
			tc.change(&a, &b)
			r := Audit([]Ledger{a, b})
			if r.Difference != 0 && tc.problem == "" {
				t.Fatalf("difference %d: %+v", r.Difference, r)
			}
			got := strings.Join(r.Problems, "; ")
			if tc.problem == "" && len(r.Problems) > 0 || tc.problem != "" && !strings.Contains(got, tc.problem) {
				t.Fatalf("problems %q, want %q", got, tc.problem)
			}
			if tc.problem == "" && (r.InFlight != 0 || r.Exported.Horizon != map[bool]string{true: "", false: "20270305"}[len(a.Exported.ClaimsHorizons)+len(b.Exported.CreditsHorizons) == 0]) {
				t.Fatalf("in flight %d, horizon %q", r.InFlight, r.Exported.Horizon)
			}
			// The cell audit of a (claims' side) and of b (credits' side)
			// owning both databases: clean where the whole audit is.
			both := NewLedger("ab")
			both.Merge(a)
			both.Merge(b)
			ca := AuditCell(both, func(ShardID) bool { return true })
			if tc.problem == "" && !ca.OK() {
				t.Fatalf("cell audit %+v", ca)
			}
			if tc.name == "both rows there, credited to another account" && ca.Differences[DiffCreditMismatch] != 1 {
				t.Fatalf("cell audit missed the mismatch: %+v", ca)
			}
		})
	}
}
