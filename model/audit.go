package model

import (
	"fmt"
	"sort"
)

// Ledger is what one cell's rows say about money, read in one consistent
// snapshot of that cell's database (storage.MySQL.Ledger). All amounts are cents.
type Ledger struct {
	Cell          string
	Deposits      Cents                // sum of deposit flows
	Rewards       Cents                // sum of reward flows: official-stage cash booked from an activity's budget
	Withdrawals   Cents                // sum of withdraw flows (as a positive amount): money out to the person's bank
	Balances      Cents                // sum of wallet balances
	Sends         Cents                // sum of send flows (as a positive amount)
	PacketTotals  Cents                // sum of packet amounts
	OpenRemaining Cents                // money still inside packets (not claimed, not refunded)
	RefundFlows   Cents                // sum of refund flows
	RefundAmounts Cents                // sum of packets' refund_amount
	Packets       int64                // packet rows read
	Claims        map[string]Claim     // every claim made in this cell, by claim ID
	Credits       map[string]Credit    // every claim credited in this cell, by claim ID
	Outbox        map[string]OutboxRow // every outbox row of this cell, by claim ID
	Problems      []string             // row-level breaks: balance != its flows, packet sums off, ...
	// The reward rows (t_reward) and the budgets homed in the cell
	// (t_budget, t_budget_lease): cash in cents, coupon kinds only counted.
	RewardRows RewardRows
	// The coupon requests and coupons (t_coupon_req, t_coupon); the
	// batches' stock rows are among RewardRows.Budgets.
	CouponRows CouponRows
}

// NewLedger returns an empty ledger of cell, its maps made.
func NewLedger(cell string) Ledger {
	return Ledger{Cell: cell, Claims: map[string]Claim{}, Credits: map[string]Credit{}, Outbox: map[string]OutboxRow{}}
}

// OutboxRow is a claim's row in the outbox of the claim's cell: whom the claim
// is owed to, how much, and whether the relay has delivered it.
type OutboxRow struct {
	ClaimID   string
	ActID     string
	Shard     ShardID // the claimant's shard
	Amount    Cents
	Delivered bool
	CreatedMS int64
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
	for id, o := range part.Outbox {
		l.Outbox[id] = o
	}
	l.Problems = append(l.Problems, part.Problems...)
	l.RewardRows.merge(part.RewardRows)
	l.CouponRows.merge(part.CouponRows)
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
}

// OK reports whether the books balance with no row-level problem.
func (r AuditReport) OK() bool { return r.Difference == 0 && len(r.Problems) == 0 }

// Audit combines the cells' ledgers. It proves conservation and lists every
// broken invariant it finds: per-cell sums that must match, claims without
// their outbox row (or the other way round, or differing), credits without a
// claim (invented money), credits of the wrong amount, a claim in two cells, a
// claim marked delivered but never credited.
func Audit(ledgers []Ledger) AuditReport {
	var r AuditReport
	claims := map[string]Claim{}
	credits := map[string]Credit{}
	delivered := map[string]bool{}
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
			if _, dup := claims[id]; dup {
				r.Problems = append(r.Problems, "claim "+id+" is stored in two cells")
			}
			claims[id] = c
		}
		for id, c := range l.Credits {
			if _, dup := credits[id]; dup {
				r.Problems = append(r.Problems, "claim "+id+" was credited in two cells")
			}
			credits[id] = c
		}
		// A claim and its outbox row are written in one transaction of one
		// cell, so each cell's claims must match its own outbox rows.
		for _, p := range CompareOutbox(l.Claims, l.Outbox).Diffs.Problems() {
			r.Problems = append(r.Problems, l.Cell+": "+p)
		}
		for id, o := range l.Outbox {
			if o.Delivered {
				delivered[id] = true
			}
		}
	}
	// A credit must match its claim in account and amount. The difference below
	// is computed from the rows as they are, so money credited without a claim, or
	// more than claimed, shows there too.
	for id, cr := range credits {
		c, ok := claims[id]
		switch {
		case !ok:
			r.Problems = append(r.Problems, fmt.Sprintf("credit %s of %d to %s has no claim", id, cr.Amount, cr.ActID))
		case c.Amount != cr.Amount || c.ActID != cr.ActID:
			r.Problems = append(r.Problems, fmt.Sprintf("credit %s is %d to %s, its claim %d to %s", id, cr.Amount, cr.ActID, c.Amount, c.ActID))
		}
	}
	for id, c := range claims {
		if _, ok := credits[id]; ok {
			continue
		}
		r.InFlight += c.Amount
		r.InFlightCount++
		if delivered[id] {
			r.Problems = append(r.Problems, fmt.Sprintf("claim %s is marked delivered but was never credited", id))
		}
	}
	r.ClaimsCount, r.CreditsCount = len(claims), len(credits)
	r.Difference = r.Deposits + r.Rewards - r.Withdrawals - (r.Balances + r.OpenRemaining + r.InFlight)
	auditRewards(ledgers, &r)
	auditCoupons(ledgers, &r)
	sort.Strings(r.Problems)
	return r
}
