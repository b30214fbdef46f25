package model

import (
	"fmt"
	"sort"
)

// CellAudit is what one cell can prove from its own rows alone (AuditCell).
// Money that crossed to another cell (a claim credited there, a credit for a
// claim made there) is checked only on this cell's side; `redcell audit`
// reads every cell and checks both.
type CellAudit struct {
	Cell          string `json:"cell"`
	Deposits      Cents  `json:"deposits"`       // deposit flows
	CreditsIn     Cents  `json:"credits"`        // credit flows: claims booked into this cell's wallets
	RefundFlows   Cents  `json:"refunds"`        // refund flows
	Sends         Cents  `json:"sends"`          // send flows, as a positive amount
	Balances      Cents  `json:"balances"`       // wallet balances
	PacketTotals  Cents  `json:"packet_totals"`  // packet amounts
	Claimed       Cents  `json:"claimed"`        // claims of this cell's packets
	RefundAmounts Cents  `json:"refund_amounts"` // packets' refund_amount
	OpenRemaining Cents  `json:"open_remaining"` // money still inside packets
	Packets       int64  `json:"packets"`
	Claims        int    `json:"claims"`
	OutboxPending int    `json:"outbox_pending"` // claims the relay has not delivered yet
	// CreditsElsewhere counts credits booked here for claims made in other
	// cells: their claims are not in these rows.
	CreditsElsewhere int `json:"credits_elsewhere"`
	// Difference is deposits + credits + refunds - sends - balances: every
	// balance change is a flow row, so it must be 0.
	Difference  Cents          `json:"difference"`
	Differences map[string]int `json:"differences"` // kind (DiffKinds) -> count
	Problems    []string       `json:"problems"`
}

// OK reports whether the cell's books hold with no problem.
func (a CellAudit) OK() bool { return a.Difference == 0 && len(a.Problems) == 0 }

// AuditCell checks one cell's ledger by itself. owns tells which shards are
// the cell's: a delivered claim whose claimant's shard is owned must be
// credited here, and a credit for a claim of an owned packet shard must match
// that claim here. It checks:
//   - the ledger's row-level problems (balance != its flows, packet sums off);
//   - deposits + credits + refunds - sends = balances (Difference);
//   - send flows = packet totals, refund flows = packets' refunds, and packet
//     totals = claims + refunds + remainders;
//   - every claim has its outbox row with the same account and amount, and
//     every outbox row its claim;
//   - for its own claimants: every delivered claim is credited, to the same
//     account with the same amount; every credit of an owned packet has its claim.
func AuditCell(l Ledger, owns func(ShardID) bool) CellAudit {
	a := CellAudit{Cell: l.Cell, Deposits: l.Deposits, RefundFlows: l.RefundFlows, Sends: l.Sends, Balances: l.Balances,
		PacketTotals: l.PacketTotals, RefundAmounts: l.RefundAmounts, OpenRemaining: l.OpenRemaining,
		Packets: l.Packets, Claims: len(l.Claims), Differences: map[string]int{}}
	a.Problems = append(a.Problems, l.Problems...)
	for _, c := range l.Claims {
		a.Claimed += c.Amount
	}
	for _, c := range l.Credits {
		a.CreditsIn += c.Amount
	}
	a.Difference = a.Deposits + a.CreditsIn + a.RefundFlows - a.Sends - a.Balances
	if a.Difference != 0 {
		a.Problems = append(a.Problems, fmt.Sprintf("deposits %d + credits %d + refunds %d - sends %d != balances %d",
			a.Deposits, a.CreditsIn, a.RefundFlows, a.Sends, a.Balances))
	}
	if l.Sends != l.PacketTotals {
		a.Problems = append(a.Problems, fmt.Sprintf("send flows %d != packet totals %d", l.Sends, l.PacketTotals))
	}
	if l.RefundFlows != l.RefundAmounts {
		a.Problems = append(a.Problems, fmt.Sprintf("refund flows %d != packets' refunds %d", l.RefundFlows, l.RefundAmounts))
	}
	if l.PacketTotals != a.Claimed+l.RefundAmounts+l.OpenRemaining {
		a.Problems = append(a.Problems, fmt.Sprintf("packet totals %d != claims %d + refunds %d + remaining %d",
			l.PacketTotals, a.Claimed, l.RefundAmounts, l.OpenRemaining))
	}
	ob := CompareOutbox(l.Claims, l.Outbox)
	a.OutboxPending = len(ob.Pending)
	diffs := ob.Diffs
	var local []Credit
	checked := map[string]bool{} // credits compared from the outbox side
	for _, c := range ob.Delivered {
		if owns(c.Shard) {
			local = append(local, c)
			checked[c.ClaimID] = true
		}
	}
	diffs.Merge(CompareCredits(local, l.Credits).Diffs)
	for id, cr := range l.Credits {
		ref, _, err := ParseClaimID(id)
		if err == nil && !owns(ref.Shard) {
			a.CreditsElsewhere++ // its claim lives in the cell its packet was sent in
			continue
		}
		c, ok := l.Claims[id]
		switch {
		case err != nil || !ok:
			diffs.Add(DiffCreditOrphan, id)
		case (c.ActID != cr.ActID || c.Amount != cr.Amount) && !checked[id]:
			diffs.Add(DiffCreditMismatch, id)
		}
	}
	for k, ids := range diffs {
		a.Differences[k] = len(ids)
	}
	a.Problems = append(a.Problems, diffs.Problems()...)
	sort.Strings(a.Problems)
	if a.Problems == nil {
		a.Problems = []string{} // JSON [] rather than null: a list, empty
	}
	return a
}
