package model

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// CellAudit is what one cell can prove from its own rows alone (AuditCell).
// Money that crossed to another cell (a claim credited there, a credit for a
// claim made there) is checked only on this cell's side; `redcell audit`
// reads every cell and checks both.
type CellAudit struct {
	Cell          string `json:"cell"`
	Deposits      Cents  `json:"deposits"`       // deposit flows
	Rewards       Cents  `json:"rewards"`        // reward flows: official-stage cash booked into wallets
	CreditsIn     Cents  `json:"credits"`        // credit flows: claims booked into this cell's wallets
	RefundFlows   Cents  `json:"refunds"`        // refund flows
	Sends         Cents  `json:"sends"`          // send flows, as a positive amount
	Withdrawals   Cents  `json:"withdrawals"`    // withdraw flows, as a positive amount
	Balances      Cents  `json:"balances"`       // wallet balances
	PacketTotals  Cents  `json:"packet_totals"`  // packet amounts
	Claimed       Cents  `json:"claimed"`        // claims of this cell's packets
	RefundAmounts Cents  `json:"refund_amounts"` // packets' refund_amount
	OpenRemaining Cents  `json:"open_remaining"` // money still inside packets
	Packets       int64  `json:"packets"`
	Claims        int    `json:"claims"`
	// CreditsPending counts claims of this cell's packets whose claimants
	// this cell serves and that are not credited here yet: the relay's lag.
	CreditsPending int `json:"credits_pending"`
	// CreditsElsewhere counts credits booked here for claims made in other
	// cells: their claims are not in these rows.
	CreditsElsewhere int `json:"credits_elsewhere"`
	// Difference is deposits + rewards + credits + refunds - sends -
	// withdrawals - balances: every balance change is a flow row, so it must be 0.
	Difference  Cents          `json:"difference"`
	Differences map[string]int `json:"differences"` // kind (DiffKinds) -> count
	Problems    []string       `json:"problems"`
	// Exported is what the retention export took out of the tables, inside
	// the sums above. A claim without its credit, or a credit without its
	// claim, where the missing row may have been exported (its horizons) is
	// neither pending nor a difference.
	Exported Exported `json:"exported"`
}

// OK reports whether the cell's books hold with no problem.
func (a CellAudit) OK() bool { return a.Difference == 0 && len(a.Problems) == 0 }

// AuditCell checks one cell's ledger by itself. owns tells which shards are
// the cell's: a credit of a claim whose claimant's shard is owned must match
// it here, and a credit for a claim of an owned packet shard must match
// that claim here. It checks:
//   - the ledger's row-level problems (balance != its flows, packet sums off);
//   - deposits + rewards + credits + refunds - sends - withdrawals = balances
//     (Difference);
//   - send flows = packet totals, refund flows = packets' refunds, and packet
//     totals = claims + refunds + remainders;
//   - for its own claimants: every claim credited is credited to the same
//     account with the same amount (one not credited yet is counted
//     pending); every credit of an owned packet has its claim.
//
// It is CellBooks.Audit over what it derives from l (CellBooksOf): a store
// that sums its rows in place fills CellBooks itself and gets the same report.
func AuditCell(l Ledger, owns func(ShardID) bool) CellAudit {
	return CellBooksOf(l, owns).Audit()
}

// CellBooks is what a cell's audit is computed from: the sums of its rows,
// the row-level problems, and the differences between claims and credits, counted by kind with a few claim IDs each. All amounts are cents.
type CellBooks struct {
	Cell             string
	Deposits         Cents // deposit flows
	Rewards          Cents // reward flows
	CreditsIn        Cents // credit flows
	RefundFlows      Cents // refund flows
	Sends            Cents // send flows, as a positive amount
	Withdrawals      Cents // withdraw flows, as a positive amount
	Balances         Cents // wallet balances
	PacketTotals     Cents // packet amounts
	Claimed          Cents // claims of this cell's packets
	RefundAmounts    Cents // packets' refund_amount
	OpenRemaining    Cents // money still inside packets
	Packets          int64
	Claims           int
	CreditsPending   int      // claims of owned claimants not credited here yet
	CreditsElsewhere int      // credits of claims whose packet shard is not owned
	Problems         []string // row-level problems (Ledger.Problems)
	Diffs            DiffTally
	Exported         Exported // exported rows, inside the sums above (Claimed and CreditsIn with theirs)
}

// CellBooksOf derives a cell's books from its ledger: the checks of
// AuditCell between claims and credits, row by row.
func CellBooksOf(l Ledger, owns func(ShardID) bool) CellBooks {
	b := CellBooks{Cell: l.Cell, Deposits: l.Deposits, Rewards: l.Rewards, RefundFlows: l.RefundFlows, Sends: l.Sends,
		Withdrawals: l.Withdrawals, Balances: l.Balances, PacketTotals: l.PacketTotals, RefundAmounts: l.RefundAmounts,
		OpenRemaining: l.OpenRemaining, Packets: l.Packets, Claims: len(l.Claims), Problems: l.Problems, Exported: l.Exported,
		Claimed: l.Exported.ClaimCents, CreditsIn: l.Exported.CreditCents}
	for _, c := range l.Claims {
		b.Claimed += c.Amount
	}
	for _, c := range l.Credits {
		b.CreditsIn += c.Amount
	}
	diffs := Diffs{}
	checked := map[string]bool{} // credits compared from the claim side
	for id, c := range l.Claims {
		if !owns(c.ActShard) {
			continue // its claimant's cell checks the credit (recon, redcell audit)
		}
		cr, ok := l.Credits[id]
		switch {
		case !ok && l.Exported.CreditMayBeExported(id, c.ActShard.DB()):
			// its credit may be in an export file
		case !ok:
			b.CreditsPending++
		case cr.ActID != c.ActID || cr.Amount != c.Amount:
			diffs.Add(DiffCreditMismatch, id)
		}
		checked[id] = true
	}
	for id, cr := range l.Credits {
		ref, _, err := ParseClaimID(id)
		if err == nil && !owns(ref.Shard) {
			b.CreditsElsewhere++ // its claim lives in the cell its packet was sent in
			continue
		}
		c, ok := l.Claims[id]
		switch {
		case !ok && l.Exported.ClaimMayBeExported(id):
			// its claim may be in an export file
		case err != nil || !ok:
			diffs.Add(DiffCreditOrphan, id)
		case (c.ActID != cr.ActID || c.Amount != cr.Amount) && !checked[id]:
			diffs.Add(DiffCreditMismatch, id)
		}
	}
	for k, ids := range diffs {
		for _, id := range ids {
			b.Diffs.Add(k, id)
		}
	}
	return b
}

// Audit checks the books: the sums against each other, and the row-level
// problems and differences as found.
func (b CellBooks) Audit() CellAudit {
	a := CellAudit{Cell: b.Cell, Deposits: b.Deposits, Rewards: b.Rewards, CreditsIn: b.CreditsIn, RefundFlows: b.RefundFlows,
		Sends: b.Sends, Withdrawals: b.Withdrawals, Balances: b.Balances, PacketTotals: b.PacketTotals, Claimed: b.Claimed, RefundAmounts: b.RefundAmounts,
		OpenRemaining: b.OpenRemaining, Packets: b.Packets, Claims: b.Claims, CreditsPending: b.CreditsPending,
		CreditsElsewhere: b.CreditsElsewhere, Differences: map[string]int{}, Exported: b.Exported}
	a.Problems = append(a.Problems, b.Problems...)
	a.Difference = a.Deposits + a.Rewards + a.CreditsIn + a.RefundFlows - a.Sends - a.Withdrawals - a.Balances
	if a.Difference != 0 {
		a.Problems = append(a.Problems, fmt.Sprintf("deposits %d + rewards %d + credits %d + refunds %d - sends %d - withdrawals %d != balances %d",
			a.Deposits, a.Rewards, a.CreditsIn, a.RefundFlows, a.Sends, a.Withdrawals, a.Balances))
	}
	if b.Sends != b.PacketTotals {
		a.Problems = append(a.Problems, fmt.Sprintf("send flows %d != packet totals %d", b.Sends, b.PacketTotals))
	}
	if b.RefundFlows != b.RefundAmounts {
		a.Problems = append(a.Problems, fmt.Sprintf("refund flows %d != packets' refunds %d", b.RefundFlows, b.RefundAmounts))
	}
	if b.PacketTotals != b.Claimed+b.RefundAmounts+b.OpenRemaining {
		a.Problems = append(a.Problems, fmt.Sprintf("packet totals %d != claims %d + refunds %d + remaining %d",
			b.PacketTotals, b.Claimed, b.RefundAmounts, b.OpenRemaining))
	}
	for k, n := range b.Diffs.Count {
		if n > 0 {
			a.Differences[k] = n
		}
	}
	a.Problems = append(a.Problems, b.Diffs.Problems()...)
	sort.Strings(a.Problems)
	if a.Problems == nil {
		a.Problems = []string{} // JSON [] rather than null: a list, empty
	}
	return a
}

// DiffTally counts differences by kind (DiffKinds) and keeps, of each kind,
// the diffSamples smallest claim IDs: what a problem line shows, in memory
// bounded however many there are. The zero value is ready to use.
type DiffTally struct {
	Count  map[string]int
	Sample map[string][]string // sorted, at most diffSamples
}

// Add counts claim id under kind.
func (t *DiffTally) Add(kind, id string) {
	if t.Count == nil {
		t.Count, t.Sample = map[string]int{}, map[string][]string{}
	}
	t.Count[kind]++
	s := t.Sample[kind]
	i, found := slices.BinarySearch(s, id)
	if found || (len(s) == diffSamples && i == len(s)) {
		return
	}
	s = slices.Insert(s, i, id)
	t.Sample[kind] = s[:min(len(s), diffSamples)]
}

// Problems renders t as Diffs.Problems does: one line per kind, naming up to
// 10 claim IDs each.
func (t DiffTally) Problems() []string {
	var out []string
	for _, k := range DiffKinds {
		if n := t.Count[k]; n > 0 {
			out = append(out, fmt.Sprintf("%s: %d claims (%s)", k, n, strings.Join(t.Sample[k], ", ")))
		}
	}
	return out
}

// Merge adds o's counts and samples to t.
func (t *DiffTally) Merge(o DiffTally) {
	for k, n := range o.Count {
		if t.Count == nil {
			t.Count, t.Sample = map[string]int{}, map[string][]string{}
		}
		t.Count[k] += n - len(o.Sample[k])
		for _, id := range o.Sample[k] {
			t.Add(k, id)
		}
	}
}
