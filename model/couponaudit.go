package model

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// CouponStockPrefix starts the budget key of a coupon batch's stock row
// ("coupon/<batch>"); reward budgets are "parent/child/scene".
const CouponStockPrefix = "coupon/"

// CouponCount is how many coupons of a batch one person holds.
type CouponCount struct {
	ActID string `json:"act_id"`
	Batch string `json:"batch_id"`
	N     int64  `json:"n"`
}

// CouponRows is what one cell's coupon requests and coupons say, for the
// audit (its stock rows are budget rows: RewardRows.Budgets).
type CouponRows struct {
	Requests        map[CouponState]int64 // requests by state
	RefusedNoReason int64                 // refused without a reason
	OldestOpenMS    int64                 // accepted_ms of the oldest request not final; 0: none
	OldestTakenMS   int64                 // taken_ms of the deciding request taken longest ago; 0: none
	IssuedNoCoupon  int64                 // issued requests without their coupon (no coupon ID or lease; in an earlier version's tables, no coupon row)
	CouponNoRequest int64                 // coupons without their issued request (a coupon ID on a request not issued; a coupon of an earlier version's table whose request is not issued)
	ByBatch         map[string]int64      // coupons by batch
	LeaseSpent      map[string]int64      // coupons by the deduction (lease) they came from
	Multi           []CouponCount         // persons holding more than one coupon of a batch
	GroupClash      []string              // "act_id holds batches a, b of group g"
}

func (c *CouponRows) merge(p CouponRows) {
	addCounts(&c.Requests, p.Requests)
	c.RefusedNoReason += p.RefusedNoReason
	if p.OldestOpenMS > 0 && (c.OldestOpenMS == 0 || p.OldestOpenMS < c.OldestOpenMS) {
		c.OldestOpenMS = p.OldestOpenMS
	}
	if p.OldestTakenMS > 0 && (c.OldestTakenMS == 0 || p.OldestTakenMS < c.OldestTakenMS) {
		c.OldestTakenMS = p.OldestTakenMS
	}
	c.IssuedNoCoupon += p.IssuedNoCoupon
	c.CouponNoRequest += p.CouponNoRequest
	addCounts(&c.ByBatch, p.ByBatch)
	addCounts(&c.LeaseSpent, p.LeaseSpent)
	c.Multi = append(c.Multi, p.Multi...)
	c.GroupClash = append(c.GroupClash, p.GroupClash...)
}

// CouponBatchLine is one batch of the coupon audit: Stock = Issued + Left +
// WrittenOff, where Left is the stock no deduction took and WrittenOff
// what deductions took and no coupon carries (held by a deduction not
// settled yet, or lost with an answer: under-issued, never over).
type CouponBatchLine struct {
	Batch       string `json:"batch_id"`
	Stock       int64  `json:"stock"`
	Issued      int64  `json:"issued"`
	Left        int64  `json:"left"`
	WrittenOff  int64  `json:"written_off"`
	Outstanding int64  `json:"outstanding"` // taken by deductions: Issued + WrittenOff
}

// CouponReport is the coupon part of the audit.
type CouponReport struct {
	Requests     map[string]int64 `json:"requests"` // by state
	Open         int64            `json:"open"`     // accepted or deciding
	OldestOpenMS int64            `json:"oldest_open_ms,omitempty"`
	// OldestTakenMS is when the deciding request taken longest ago was
	// taken: one held past two stale ages is held by nobody (CheckCoupons).
	OldestTakenMS int64             `json:"oldest_taken_ms,omitempty"`
	Batches       []CouponBatchLine `json:"batches"`
	multi         []CouponCount
}

// auditCoupons checks the coupon rows of every cell against the batches'
// stock rows, adding to r's problems:
//   - per batch, issued never above what its deductions took, nor that above
//     its stock (issued + left + written off = stock);
//   - no deduction's coupons above its amount, nor above what it kept when
//     returned;
//   - every issued request has its coupon and every coupon its issued
//     request; every refusal has a reason;
//   - no person holds two batches of one group.
//
// The per-person limits and the requests left unanswered are checked by
// CheckCoupons, which needs the batches file and the time.
func auditCoupons(ledgers []Ledger, r *AuditReport) {
	var all CouponRows
	for _, l := range ledgers {
		all.merge(l.CouponRows)
	}
	cr := &r.Coupons
	cr.Requests = map[string]int64{}
	for st, n := range all.Requests {
		cr.Requests[string(st)] = n
		if !st.Final() {
			cr.Open += n
		}
	}
	cr.OldestOpenMS, cr.OldestTakenMS = all.OldestOpenMS, all.OldestTakenMS
	cr.multi = all.Multi
	bad := func(format string, args ...any) {
		r.Problems = append(r.Problems, fmt.Sprintf("coupons: "+format, args...))
	}
	if all.RefusedNoReason > 0 {
		bad("%d refused requests without a reason", all.RefusedNoReason)
	}
	if all.IssuedNoCoupon > 0 {
		bad("%d issued requests without their coupon", all.IssuedNoCoupon)
	}
	if all.CouponNoRequest > 0 {
		bad("%d coupons without their issued request (invented)", all.CouponNoRequest)
	}
	for _, g := range all.GroupClash {
		bad("%s", g)
	}
	cr.Batches = []CouponBatchLine{}
	seen := map[string]bool{}
	for _, l := range ledgers {
		for _, ls := range l.RewardRows.Leases {
			if !strings.HasPrefix(ls.Key, CouponStockPrefix) {
				continue
			}
			n := all.LeaseSpent[ls.ID]
			switch {
			case n > ls.Amount:
				bad("deduction %s of %s: %d coupons above its amount %d", ls.ID, ls.Key, n, ls.Amount)
			case ls.State == LeaseReturned && n > ls.Amount-ls.Unspent:
				bad("deduction %s of %s: %d coupons above the %d it kept when returned", ls.ID, ls.Key, n, ls.Amount-ls.Unspent)
			}
		}
		for _, b := range l.RewardRows.Budgets {
			id, ok := strings.CutPrefix(b.Key, CouponStockPrefix)
			if !ok {
				continue
			}
			seen[id] = true
			out := b.Outstanding()
			line := CouponBatchLine{Batch: id, Stock: b.Total, Issued: all.ByBatch[id], Left: b.Total - out, Outstanding: out}
			line.WrittenOff = out - line.Issued
			cr.Batches = append(cr.Batches, line)
			if line.Issued > out || out > b.Total {
				bad("batch %s: stock %d, taken by deductions %d, issued %d: over-issued", id, b.Total, out, line.Issued)
			}
		}
	}
	for id, n := range all.ByBatch {
		if !seen[id] && n > 0 {
			bad("batch %s: %d coupons and no stock row in any cell", id, n)
		}
	}
	sort.Slice(cr.Batches, func(i, j int) bool { return cr.Batches[i].Batch < cr.Batches[j].Batch })
}

// CheckCoupons adds the checks that need the batches file and the time:
// no person holds more coupons of a batch than its per-person limit
// (limits by batch ID; a batch not listed is not checked), and no request
// is deciding since before takenBefore: taken by an engine that is gone
// and not taken again (lost). Requests waiting accepted are not lost: a
// backlog, or issuing held by the coupon_issue switch.
func (r *AuditReport) CheckCoupons(limits map[string]int, takenBefore time.Time) {
	for _, m := range r.Coupons.multi {
		if lim, ok := limits[m.Batch]; ok && m.N > int64(lim) {
			r.Problems = append(r.Problems, fmt.Sprintf("coupons: %s holds %d coupons of %s, above its limit %d", m.ActID, m.N, m.Batch, lim))
		}
	}
	if r.Coupons.OldestTakenMS > 0 && r.Coupons.OldestTakenMS < takenBefore.UnixMilli() {
		r.Problems = append(r.Problems, fmt.Sprintf("coupons: a request deciding since %s, held by nobody (%d requests open)",
			time.UnixMilli(r.Coupons.OldestTakenMS).UTC().Format(time.RFC3339), r.Coupons.Open))
	}
}
