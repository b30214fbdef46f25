package model

import (
	"fmt"
	"sort"
	"strings"
)

// RewardRows is what one cell's reward and budget rows say, for the audit:
// cash sums in cents (coupon kinds are counted, not summed).
type RewardRows struct {
	Count    int64 // reward rows of every award type
	Issued   Cents // cash rewards of every stage and status
	Booked   Cents // cash rewards booked (every stage)
	Pending  Cents // cash rewards pending or processing
	IntoWall Cents // booked official-stage cash: what the cell's reward flows must sum to
	// LeaseSpent sums the rewards (cents or pieces) issued from each lease.
	LeaseSpent map[string]int64
	// Budgets and Leases are the budget rows homed in the cell and all
	// their leases.
	Budgets []Budget
	Leases  []Lease
}

func (r *RewardRows) merge(p RewardRows) {
	r.Count += p.Count
	r.Issued += p.Issued
	r.Booked += p.Booked
	r.Pending += p.Pending
	r.IntoWall += p.IntoWall
	addCounts(&r.LeaseSpent, p.LeaseSpent)
	r.Budgets = append(r.Budgets, p.Budgets...)
	r.Leases = append(r.Leases, p.Leases...)
}

// addCounts adds each count of from to *into, making *into first when it
// is nil and from holds a count.
func addCounts[K comparable](into *map[K]int64, from map[K]int64) {
	for k, v := range from {
		if *into == nil {
			*into = map[K]int64{}
		}
		(*into)[k] += v
	}
}

// AddReward counts one reward row.
func (r *RewardRows) AddReward(x Reward) {
	r.Count++
	if x.LeaseID != "" {
		if r.LeaseSpent == nil {
			r.LeaseSpent = map[string]int64{}
		}
		r.LeaseSpent[x.LeaseID] += int64(x.Amount)
	}
	if !x.Cash() {
		return
	}
	r.Issued += x.Amount
	if x.Status == RewardBooked {
		r.Booked += x.Amount
		if x.IntoWallet() {
			r.IntoWall += x.Amount
		}
	} else {
		r.Pending += x.Amount
	}
}

// BudgetLine is one budget in the audit report: Issued is what its leases'
// rewards sum to across cells, Unissued = Total − Issued, Outstanding what
// its leases hold or spent (Granted − Returned).
type BudgetLine struct {
	Key         string `json:"key"`
	Total       int64  `json:"total"`
	Issued      int64  `json:"issued"`
	Unissued    int64  `json:"unissued"`
	Outstanding int64  `json:"outstanding"`
}

// RewardReport is the reward part of the audit.
type RewardReport struct {
	Count    int64        `json:"count"`
	Issued   Cents        `json:"issued"`
	Booked   Cents        `json:"booked"`
	Pending  Cents        `json:"pending"`
	IntoWall Cents        `json:"into_wallets"` // booked official cash; the reward flows must sum to it
	Budgets  []BudgetLine `json:"budgets"`
}

// auditRewards checks the reward rows of every cell against their flows and
// budgets, adding to r's problems:
//   - issued = booked + pending (cash), in each cell;
//   - each cell's reward flows sum to its booked official cash: every such
//     reward is in the wallet once, and no reward flow lacks its reward;
//   - budget = issued + unissued with issued never above the budget: no
//     lease's rewards pass its amount, none of a returned lease pass what it
//     kept (Amount − Unspent), and a budget's leases hold no more than it.
func auditRewards(ledgers []Ledger, r *AuditReport) {
	spent := map[string]int64{}
	for _, l := range ledgers {
		rr := l.RewardRows
		r.RewardRows.Count += rr.Count
		r.RewardRows.Issued += rr.Issued
		r.RewardRows.Booked += rr.Booked
		r.RewardRows.Pending += rr.Pending
		r.RewardRows.IntoWall += rr.IntoWall
		if rr.Issued != rr.Booked+rr.Pending {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: cash rewards issued %d != booked %d + pending %d", l.Cell, rr.Issued, rr.Booked, rr.Pending))
		}
		if l.Rewards != rr.IntoWall {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: reward flows %d != booked official cash rewards %d", l.Cell, l.Rewards, rr.IntoWall))
		}
		for id, n := range rr.LeaseSpent {
			spent[id] += n
		}
	}
	r.RewardRows.Budgets = []BudgetLine{}
	for _, l := range ledgers {
		// A budget row's leases are in its own cell's rows (its home);
		// rewards spending them may be in any cell.
		byKey := map[string]int64{}
		for _, ls := range l.RewardRows.Leases {
			if strings.HasPrefix(ls.Key, CouponStockPrefix) {
				continue // a coupon batch's deduction: auditCoupons
			}
			n := spent[ls.ID]
			byKey[ls.Key] += n
			switch {
			case n > ls.Amount:
				r.Problems = append(r.Problems, fmt.Sprintf("lease %s of %s: rewards %d above its amount %d", ls.ID, ls.Key, n, ls.Amount))
			case ls.State == LeaseReturned && n > ls.Amount-ls.Unspent:
				r.Problems = append(r.Problems, fmt.Sprintf("lease %s of %s: rewards %d above the %d it kept when returned", ls.ID, ls.Key, n, ls.Amount-ls.Unspent))
			}
		}
		for _, b := range l.RewardRows.Budgets {
			if strings.HasPrefix(b.Key, CouponStockPrefix) {
				continue
			}
			line := BudgetLine{Key: b.Key, Total: b.Total, Issued: byKey[b.Key], Unissued: b.Total - byKey[b.Key], Outstanding: b.Outstanding()}
			r.RewardRows.Budgets = append(r.RewardRows.Budgets, line)
			if line.Issued > b.Total || line.Outstanding > b.Total || line.Issued > line.Outstanding {
				r.Problems = append(r.Problems, fmt.Sprintf("budget %s: total %d, issued %d, outstanding %d: issued passes what it may", b.Key, b.Total, line.Issued, line.Outstanding))
			}
		}
	}
	sort.Slice(r.RewardRows.Budgets, func(i, j int) bool { return r.RewardRows.Budgets[i].Key < r.RewardRows.Budgets[j].Key })
}

// RewardRecon is one reconciliation window of one database's rewards
// against the reward flows booked for them (storage.RewardReconQuery).
// Booking writes a reward's flow with the reward's booked time as its
// creation time, so within any window the two sides match exactly.
type RewardRecon struct {
	DB              int
	FromMS, ToMS    int64
	Booked          int64    // booked official cash rewards with booked_ms in the window
	BookedCents     Cents    // their sum
	FlowsCounted    bool     // Flows and FlowCents were read (the full pass)
	Flows           int64    // reward flows created in the window
	FlowCents       Cents    // their sum
	Missing         []string // booked official cash rewards without their flow (order numbers, at most 20)
	Pending         int64    // rewards not booked (any age)
	StalePending    int64    // rewards not booked, issued before the window's end less the stale age
	OldestPendingMS int64    // issue time of the oldest reward not booked (0: none)
}

// Problems lists what is off in the window.
func (r RewardRecon) Problems() []string {
	var ps []string
	if len(r.Missing) > 0 {
		ps = append(ps, fmt.Sprintf("db %d: %d booked rewards without their flow (%v)", r.DB, len(r.Missing), r.Missing))
	}
	if r.FlowsCounted && (r.Booked != r.Flows || r.BookedCents != r.FlowCents) {
		ps = append(ps, fmt.Sprintf("db %d: %d rewards of %d cents booked into wallets in [%d, %d), but %d reward flows of %d cents",
			r.DB, r.Booked, r.BookedCents, r.FromMS, r.ToMS, r.Flows, r.FlowCents))
	}
	return ps
}
