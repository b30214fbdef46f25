package model

import (
	"fmt"
	"sort"
	"strings"
)

// Ledger is what one cell's rows say about money, read in one consistent
// snapshot of that cell's database (storage.MySQL.Ledger). All amounts are cents.
type Ledger struct {
	Cell          string
	Deposits      Cents             // sum of deposit flows
	Rewards       Cents             // sum of reward flows: official-stage cash booked from an activity's budget
	Withdrawals   Cents             // sum of withdraw flows (as a positive amount): money out to the person's bank
	Balances      Cents             // sum of wallet balances
	Sends         Cents             // sum of send flows (as a positive amount)
	PacketTotals  Cents             // sum of packet amounts
	OpenRemaining Cents             // money still inside packets (not claimed, not refunded)
	RefundFlows   Cents             // sum of refund flows
	RefundAmounts Cents             // sum of packets' refund_amount
	Packets       int64             // packet rows read
	Claims        map[string]Claim  // every claim made in this cell, by claim ID
	Credits       map[string]Credit // every claim credited in this cell, by claim ID
	Problems      []string          // row-level breaks: balance != its flows, packet sums off, ...
	// The reward rows (t_reward) and the budgets homed in the cell
	// (t_budget, t_budget_lease): cash in cents, coupon kinds only counted.
	RewardRows RewardRows
	// The coupon requests, an issued one holding its coupon (t_coupon_req); the
	// batches' stock rows are among RewardRows.Budgets.
	CouponRows CouponRows
	// Exported is what the retention export took out of the tables
	// (storage.ExportPass). Exported flows other than credits are inside
	// the flow sums above, exported packets inside the packet sums; the
	// exported claims and credits are only here (Claims and Credits hold
	// the rows still in the tables).
	Exported Exported
}

// NewLedger returns an empty ledger of cell, its maps made.
func NewLedger(cell string) Ledger {
	return Ledger{Cell: cell, Claims: map[string]Claim{}, Credits: map[string]Credit{}}
}

// Merge adds part's sums, rows and problems to l. A claim credited in both is
// kept as a problem: one claim ID is credited at most once in a cell.
func (l *Ledger) Merge(part Ledger) {
	l.Deposits += part.Deposits
	l.Rewards += part.Rewards
	l.Withdrawals += part.Withdrawals
	l.Balances += part.Balances
	l.Sends += part.Sends
	l.PacketTotals += part.PacketTotals
	l.OpenRemaining += part.OpenRemaining
	l.RefundFlows += part.RefundFlows
	l.RefundAmounts += part.RefundAmounts
	l.Packets += part.Packets
	for id, c := range part.Claims {
		l.Claims[id] = c
	}
	for id, c := range part.Credits {
		if prev, dup := l.Credits[id]; dup {
			l.Problems = append(l.Problems, fmt.Sprintf("claim %s credited twice (to %s and %s)", id, prev.ActID, c.ActID))
			c.Amount += prev.Amount
		}
		l.Credits[id] = c
	}
	l.Problems = append(l.Problems, part.Problems...)
	l.RewardRows.merge(part.RewardRows)
	l.CouponRows.merge(part.CouponRows)
	l.Exported.Add(part.Exported)
}

// AuditReport is the conservation check of DESIGN.md §2 across cells:
// deposits + rewards - withdrawals = balances + money inside open packets +
// claims not yet credited. Rewards and withdrawals are money that crosses the
// books' edge like deposits: in from an activity's budget, out to a bank.
type AuditReport struct {
	Cells         []string `json:"cells"`
	Deposits      Cents    `json:"deposits"`
	Rewards       Cents    `json:"rewards"`     // reward flows
	Withdrawals   Cents    `json:"withdrawals"` // withdraw flows, as a positive amount
	Balances      Cents    `json:"balances"`
	OpenRemaining Cents    `json:"open_remaining"`
	InFlight      Cents    `json:"in_flight"` // claimed, not yet credited to the claimant
	InFlightCount int      `json:"in_flight_count"`
	Packets       int64    `json:"packets"`
	ClaimsCount   int      `json:"claims"`
	CreditsCount  int      `json:"credits"`
	Difference    Cents    `json:"difference"` // deposits + rewards - withdrawals - (balances + open + in flight); must be 0
	Problems      []string `json:"problems"`
	// RewardRows sums the reward rows and lists the budgets (auditRewards).
	RewardRows RewardReport `json:"reward_rows"`
	// Coupons checks the coupon rows against the batches' stock rows
	// (auditCoupons; CheckCoupons adds the limits).
	Coupons CouponReport `json:"coupons"`
	// Exported is what the cells' retention exports took out of the
	// tables, counted in the sums above: claims and credits dated before
	// Exported.Horizon are compared by sums (InFlight holds what their
	// claims exceed their credits by), not row by row.
	Exported Exported `json:"exported"`
	// Copies are the databases found on a cell's server that the cell does
	// not own by the cluster's shard map: none of their rows is in the sums
	// above (AddCopies).
	Copies []DBCopy `json:"copies"`
}

// The kinds of DBCopy.
const (
	CopyHandedOver = "handed_over" // the cell handed it over (a move's release); kept until its move_grace ends
	CopyFrozen     = "frozen"      // frozen by a move that has not released it yet (sealed: Version > 0)
	CopyMovingIn   = "moving_in"   // a move's replication channel is copying it onto the server
	CopyUnrecorded = "unrecorded"  // no move record names it: left by hand, or by a config changed by hand
)

// DBCopy is a database (db_XX) found on a cell's server that the cell does
// not own by the cluster's shard map: another cell's money, or nobody's.
type DBCopy struct {
	Cell    string `json:"cell"` // the cell whose server holds it
	DB      int    `json:"db"`
	Kind    string `json:"kind"`              // CopyHandedOver, CopyFrozen, CopyMovingIn or CopyUnrecorded
	Version int64  `json:"version,omitempty"` // the map version of its hand-over (handed over, or frozen and sealed)
	Owner   string `json:"owner"`             // the cell that owns it by the map; "" none
	// Rows and Changed: of a copy handed over only, read with its digest:
	// its rows in all, and whether they differ from the digest recorded
	// when it was handed over (a write reached it after the freeze).
	Rows    int64 `json:"rows,omitempty"`
	Changed bool  `json:"changed,omitempty"`
}

// String is the copy as the audit lists it.
func (c DBCopy) String() string {
	owner := c.Owner
	if owner == "" {
		owner = "no cell"
	}
	s := fmt.Sprintf("%s: db_%02d, owned by %s by the map, ", c.Cell, c.DB, owner)
	switch c.Kind {
	case CopyHandedOver:
		state := "unchanged since"
		if c.Changed {
			state = "CHANGED after the hand-over"
		}
		return s + fmt.Sprintf("copy handed over under map version %d, %d rows, %s", c.Version, c.Rows, state)
	case CopyFrozen:
		if c.Version > 0 {
			return s + fmt.Sprintf("frozen copy of a hand-over under map version %d, not released yet", c.Version)
		}
		return s + "frozen by a move in progress"
	case CopyMovingIn:
		return s + "being copied onto this server by a move"
	}
	return s + "copy with no move record"
}

// AddCopies lists copies in r. A copy handed over that changed after the
// hand-over is a problem (money may have been written where nobody counts
// it), and so is a copy of a database no cell owns by the map (its rows are
// in nobody's books); the others are listed only: the cell that owns each by
// the map counts its rows.
func (r *AuditReport) AddCopies(copies []DBCopy) {
	for _, c := range copies {
		r.Copies = append(r.Copies, c)
		switch {
		case c.Kind == CopyHandedOver && c.Changed:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: db_%02d, handed over under map version %d, changed after the hand-over (%d rows now): compare it with %s's",
				c.Cell, c.DB, c.Version, c.Rows, ownerOr(c.Owner)))
		case c.Owner == "":
			r.Problems = append(r.Problems, fmt.Sprintf("%s: db_%02d is on the cell's server but no cell owns it by the map: its rows are in nobody's books", c.Cell, c.DB))
		}
	}
	sort.Slice(r.Copies, func(i, j int) bool {
		if r.Copies[i].Cell != r.Copies[j].Cell {
			return r.Copies[i].Cell < r.Copies[j].Cell
		}
		return r.Copies[i].DB < r.Copies[j].DB
	})
	sort.Strings(r.Problems)
}

func ownerOr(owner string) string {
	if owner == "" {
		return "the owner"
	}
	return owner
}

// OK reports whether the books balance with no row-level problem.
func (r AuditReport) OK() bool { return r.Difference == 0 && len(r.Problems) == 0 }

// Audit combines the cells' ledgers. It proves conservation and lists every
// broken invariant it finds: per-cell sums that must match, credits without a
// claim (invented money), credits of the wrong amount, a claim in two cells, a
// claim credited in two cells. Claims not credited yet are in flight. A problem between rows names
// where each row is (its cell and database), the act_ids and the amounts in
// cents, so that an operator can find the rows.
//
// A credit found without its claim where the claim may have been exported
// (Exported.ClaimMayBeExported), and a claim found without its credit where
// the credit may have been (CreditMayBeExported), are not reported one by
// one: their sums, with the exported claims' and credits', must match (a
// difference either way is a problem; what is claimed beyond the credited
// is in flight). Claims found with their credits are compared as always.
func Audit(ledgers []Ledger) AuditReport {
	var r AuditReport
	for _, l := range ledgers {
		r.Exported.Add(l.Exported)
	}
	// A claim whose credit, or a credit whose claim, may be in an export
	// file is summed with the exported ones.
	x := r.Exported
	oldClaims, oldCredits := x.ClaimCents, x.CreditCents
	rows := auditLedgerSums(ledgers, &r)
	auditDuplicateRows(rows, &r)
	oldCredits += auditCredits(rows, x, &r)
	oldClaims += auditInFlight(rows, x, &r)
	auditExportedSides(oldClaims, oldCredits, &r)
	r.InFlight += oldClaims - oldCredits
	r.ClaimsCount, r.CreditsCount = len(rows.claims), len(rows.credits)
	r.Difference = r.Deposits + r.Rewards - r.Withdrawals - (r.Balances + r.OpenRemaining + r.InFlight)
	auditRewards(ledgers, &r)
	auditCoupons(ledgers, &r)
	sort.Strings(r.Problems)
	return r
}

// auditRows are the claim and credit rows of all the cells, gathered by
// auditLedgerSums: by claim ID the last row read, and every row with its cell.
type auditRows struct {
	claims   map[string]Claim
	credits  map[string]Credit
	claimAt  map[string][]placed[Claim]  // every claim row, by claim ID: where it is
	creditAt map[string][]placed[Credit] // every credit row, by claim ID: where it is
}

// auditLedgerSums adds each ledger's sums and problems to r, checks the
// per-cell sums that must match, and gathers the claim and credit rows.
func auditLedgerSums(ledgers []Ledger, r *AuditReport) auditRows {
	claims := map[string]Claim{}
	credits := map[string]Credit{}
	claimAt := map[string][]placed[Claim]{}   // every claim row, by claim ID: where it is
	creditAt := map[string][]placed[Credit]{} // every credit row, by claim ID: where it is
	for _, l := range ledgers {
		r.Cells = append(r.Cells, l.Cell)
		r.Deposits += l.Deposits
		r.Rewards += l.Rewards
		r.Withdrawals += l.Withdrawals
		r.Balances += l.Balances
		r.OpenRemaining += l.OpenRemaining
		r.Packets += l.Packets
		for _, p := range l.Problems {
			r.Problems = append(r.Problems, l.Cell+": "+p)
		}
		if l.Sends != l.PacketTotals {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: send flows %d != packet totals %d", l.Cell, l.Sends, l.PacketTotals))
		}
		if l.RefundFlows != l.RefundAmounts {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: refund flows %d != packets' refunds %d", l.Cell, l.RefundFlows, l.RefundAmounts))
		}
		for id, c := range l.Claims {
			claimAt[id] = append(claimAt[id], placed[Claim]{l.Cell, c})
			claims[id] = c
		}
		for id, c := range l.Credits {
			creditAt[id] = append(creditAt[id], placed[Credit]{l.Cell, c})
			credits[id] = c
		}
	}
	return auditRows{claims: claims, credits: credits, claimAt: claimAt, creditAt: creditAt}
}

// auditDuplicateRows reports a claim stored in more than one cell and a
// claim credited in more than one cell.
func auditDuplicateRows(rows auditRows, r *AuditReport) {
	claimAt, creditAt := rows.claimAt, rows.creditAt
	for id, at := range claimAt {
		if len(at) > 1 {
			r.Problems = append(r.Problems, fmt.Sprintf("claim %s is stored in %d cells: %s", id, len(at), joinPlaced(at, claimAtText(id))))
		}
	}
	for id, at := range creditAt {
		if len(at) > 1 {
			r.Problems = append(r.Problems, fmt.Sprintf("claim %s was credited in %d cells: %s; %s", id, len(at),
				joinPlaced(at, creditAtText), claimOf(id, claimAt[id])))
		}
	}
}

// auditCredits reports the credits that have no claim or do not match
// theirs. It returns the cents credited by the credits whose claim may have
// been exported (x.ClaimMayBeExported): those are compared by sums only.
func auditCredits(rows auditRows, x Exported, r *AuditReport) (oldCredits Cents) {
	claims, credits, claimAt, creditAt := rows.claims, rows.credits, rows.claimAt, rows.creditAt
	// A credit must match its claim in account and amount. The difference below
	// is computed from the rows as they are, so money credited without a claim, or
	// more than claimed, shows there too.
	for id, cr := range credits {
		c, ok := claims[id]
		if !ok && x.ClaimMayBeExported(id) {
			oldCredits += cr.Amount
			continue
		}
		at := creditAt[id][len(creditAt[id])-1]
		switch {
		case !ok:
			r.Problems = append(r.Problems, fmt.Sprintf("credit %s of %d cents to %s (%s) has no claim", id, cr.Amount, cr.ActID, creditWhere(at)))
		case c.Amount != cr.Amount || c.ActID != cr.ActID:
			r.Problems = append(r.Problems, fmt.Sprintf("credit %s is %d cents to %s (%s), its claim %d cents to %s (%s)",
				id, cr.Amount, cr.ActID, creditWhere(at), c.Amount, c.ActID, claimWhere(id, claimAt[id][len(claimAt[id])-1].cell)))
		}
	}
	return oldCredits
}

// auditInFlight adds the claims not credited yet to r.InFlight. It returns
// the cents of those whose credit may have been exported
// (x.CreditMayBeExported), which are compared by sums only.
func auditInFlight(rows auditRows, x Exported, r *AuditReport) (oldClaims Cents) {
	claims, credits := rows.claims, rows.credits
	for id, c := range claims {
		if _, ok := credits[id]; ok {
			continue
		}
		if x.CreditMayBeExported(id, c.ActShard.DB()) {
			oldClaims += c.Amount
			continue
		}
		r.InFlight += c.Amount
		r.InFlightCount++
	}
	return oldClaims
}

// auditExportedSides compares the sums of the claims and the credits of
// which one side was exported (the exported rows' own sums included) and
// reports a difference either way.
func auditExportedSides(oldClaims, oldCredits Cents, r *AuditReport) {
	// Every exported claim's credit is booked (the export waits for the
	// relay and reconciliation), so these sums match on healthy books.
	switch {
	case oldCredits > oldClaims:
		r.Problems = append(r.Problems, fmt.Sprintf("claims and credits of which one side was exported: credits %d cents, claims %d: more credited than claimed",
			oldCredits, oldClaims))
	case oldClaims > oldCredits:
		r.Problems = append(r.Problems, fmt.Sprintf("claims and credits of which one side was exported: claims %d cents, credits %d: %d cents claimed and never credited (a credit delivered after its claimant's database exported that date is not booked)",
			oldClaims, oldCredits, oldClaims-oldCredits))
	}
}

// placed is a row of a ledger with the cell it was read from.
type placed[T any] struct {
	cell string
	row  T
}

func joinPlaced[T any](at []placed[T], text func(placed[T]) string) string {
	parts := make([]string, len(at))
	for i, p := range at {
		parts[i] = text(p)
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// claimWhere names the cell and database of claim id (its packet's
// database; the cell alone when the ID does not parse).
func claimWhere(id, cell string) string {
	if ref, _, err := ParseClaimID(id); err == nil {
		return fmt.Sprintf("%s, db_%02d", cell, ref.Shard.DB())
	}
	return cell
}

// creditWhere names the cell and database of a credit row (its claimant's).
func creditWhere(p placed[Credit]) string {
	return fmt.Sprintf("%s, db_%02d", p.cell, p.row.Shard.DB())
}

// claimAtText describes a row of claim id (a Claim's ID may be unset).
func claimAtText(id string) func(placed[Claim]) string {
	return func(p placed[Claim]) string {
		return fmt.Sprintf("%s (%d cents to %s)", claimWhere(id, p.cell), p.row.Amount, p.row.ActID)
	}
}

func creditAtText(p placed[Credit]) string {
	return fmt.Sprintf("%s credited %d cents to %s", creditWhere(p), p.row.Amount, p.row.ActID)
}

// claimOf says where the claim of a claim credited in several cells is.
func claimOf(id string, at []placed[Claim]) string {
	if len(at) == 0 {
		return "no cell holds its claim"
	}
	return "its claim: " + joinPlaced(at, claimAtText(id))
}
