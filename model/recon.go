package model

import (
	"fmt"
	"sort"
	"strings"
)

// Kinds of difference between rows that must agree. Reconciliation
// (cell/recon.go), the cell's own audit (AuditCell) and the cluster audit
// (Audit) name what they find with these; they are the label values of
// redcell_recon_differences_total.
const (
	// DiffCreditMissing: a claim whose credit the claimant's wallet does
	// not have although the relay was told it was applied (reconciliation
	// names a claim uncredited past its settle time lag, and re-drives it).
	DiffCreditMissing = "credit_missing"
	// DiffCreditMismatch: a credit whose account or amount is not its claim's.
	DiffCreditMismatch = "credit_mismatch"
	// DiffCreditOrphan: a credit whose claim does not exist (invented money).
	DiffCreditOrphan = "credit_orphan"
	// DiffCreditElsewhere: the claimant's wallet has no credit for a claim,
	// but the cell the credit was sent to (Credit.Dest) has it in its copy
	// of the claimant's database, which it no longer serves: the database
	// was handed over without that row.
	DiffCreditElsewhere = "credit_elsewhere"
)

// DiffKinds lists every kind of difference, in a fixed order.
var DiffKinds = [...]string{DiffCreditMissing, DiffCreditMismatch, DiffCreditOrphan, DiffCreditElsewhere}

// Tally counts rows and the cents they hold.
type Tally struct {
	Count int64 `json:"count"`
	Cents Cents `json:"cents"`
}

// Add counts one row of c cents.
func (t *Tally) Add(c Cents) { t.Count++; t.Cents += c }

// Plus returns the sum of t and o.
func (t Tally) Plus(o Tally) Tally { return Tally{Count: t.Count + o.Count, Cents: t.Cents + o.Cents} }

// Diffs maps a kind of difference (DiffKinds) to the claim IDs found with it.
type Diffs map[string][]string

// Add records claim id under kind.
func (d Diffs) Add(kind, id string) { d[kind] = append(d[kind], id) }

// Merge adds o's claim IDs to d.
func (d Diffs) Merge(o Diffs) {
	for k, ids := range o {
		d[k] = append(d[k], ids...)
	}
}

// Count returns how many differences d holds, all kinds together.
func (d Diffs) Count() int {
	n := 0
	for _, ids := range d {
		n += len(ids)
	}
	return n
}

// diffSamples is how many claim IDs a problem line names; the count is always whole.
const diffSamples = 10

// Sample returns up to n claim IDs of kind, sorted, so a log line stays short.
func (d Diffs) Sample(kind string, n int) []string {
	ids := append([]string(nil), d[kind]...)
	sort.Strings(ids)
	return ids[:min(n, len(ids))]
}

// Problems renders d as one line per kind, naming up to 10 claim IDs each.
func (d Diffs) Problems() []string {
	var out []string
	for _, k := range DiffKinds {
		if n := len(d[k]); n > 0 {
			out = append(out, fmt.Sprintf("%s: %d claims (%s)", k, n, strings.Join(d.Sample(k, diffSamples), ", ")))
		}
	}
	return out
}

// CreditCheck is delivered claims compared with the credits booked for them.
type CreditCheck struct {
	Matched Tally // claims credited to the right account with the right amount
	Diffs   Diffs // DiffCreditMissing, DiffCreditMismatch
}

// CompareCredits checks that each credit in want (a delivered claim) is booked
// in found (credit flows by claim ID) to the same account with the same amount.
func CompareCredits(want []Credit, found map[string]Credit) CreditCheck {
	r := CreditCheck{Diffs: Diffs{}}
	for _, w := range want {
		f, ok := found[w.ClaimID]
		switch {
		case !ok:
			r.Diffs.Add(DiffCreditMissing, w.ClaimID)
		case f.ActID != w.ActID || f.Amount != w.Amount:
			r.Diffs.Add(DiffCreditMismatch, w.ClaimID)
		default:
			r.Matched.Add(w.Amount)
		}
	}
	return r
}

// ReconWindow is what reconciliation reads of one database for one window of
// time: the claims created in [FromMS, ToMS), each with its ActShard and
// Dest. ToMS may be below what was asked for when the window held more rows
// than a read may take; the next window starts there.
type ReconWindow struct {
	FromMS, ToMS int64
	Claims       map[string]Claim
}
