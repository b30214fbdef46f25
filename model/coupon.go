package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"redcell/internal/invariant"
)

// Coupons: the decisions of a coupon drop, as Douyin Pay ran its Spring
// Festival one. An issue request is accepted and stored first, then decided
// behind in two layers: the activity decision (per-person limit, batch-group
// exclusion, risk) and the asset step (stock). Requests of one batch that
// wait together deduct the stock once, by their number or by what is left
// (a merged deduction), and the coupons are then assigned in arrival order,
// each person's holding checked again under the row locks of the issuing
// transaction, so the limits hold even when two requests of one person are
// merged together. The functions below are pure (state in, decision out);
// the stores lock the rows, call them, and write what they answer.

// CouponState is where an issue request is: accepted → deciding → issued or
// refused (with a reason).
type CouponState string

// The states of an issue request.
const (
	CouponAccepted CouponState = "accepted" // stored, not decided yet
	CouponDeciding CouponState = "deciding" // taken by a layer; re-driven if stuck
	CouponIssued   CouponState = "issued"   // the person holds the coupon
	CouponRefused  CouponState = "refused"  // final, with a CouponReason
)

// Final reports whether s is final.
func (s CouponState) Final() bool { return s == CouponIssued || s == CouponRefused }

// CouponReason is why a request was refused: a stable code.
type CouponReason string

// The reasons of a refusal.
const (
	ReasonLimit       CouponReason = "PER_PERSON_LIMIT" // the person holds the batch's limit already
	ReasonGroup       CouponReason = "GROUP_HELD"       // the person holds a coupon of another batch of the group
	ReasonRisk        CouponReason = "RISK"             // the risk check refused the request
	ReasonSoldOut     CouponReason = "SOLD_OUT"         // the batch's stock is spent
	ReasonBatchClosed CouponReason = "BATCH_CLOSED"     // outside the batch's window, or no such batch
	// ReasonWrittenOff: the seed's rule for a request whose stock deduction
	// lost its answer: the unit stays deducted and no coupon is issued for
	// it. The model's drop property (TestCouponDropProperty) checks the books
	// close with it; the engine (cell/couponq) does not refuse with it: a
	// lost deduction's units stay with its lease, the request is decided
	// again, and the audit counts the units written off per batch
	// (CouponBatchLine) until the lease is settled by its coupons.
	ReasonWrittenOff CouponReason = "WRITTEN_OFF"
)

// CouponRule is the part of a batch a decision needs.
type CouponRule struct {
	Batch string // stock ID
	Limit int    // coupons of the batch one person may hold, >= 1
	Group string // batch group, "" none
}

// CouponHolding is what one person holds, as a decision reads it: coupons
// per batch, and for each group the batch held in it.
type CouponHolding struct {
	ByBatch map[string]int
	Groups  map[string]string // group → the batch of it the person holds
}

// add records one more coupon of rule's batch.
// Plus is h with one more coupon of r's batch: a copy, h unchanged.
func (h CouponHolding) Plus(r CouponRule) CouponHolding {
	c := CouponHolding{ByBatch: make(map[string]int, len(h.ByBatch)+1), Groups: make(map[string]string, len(h.Groups)+1)}
	for k, v := range h.ByBatch {
		c.ByBatch[k] = v
	}
	for k, v := range h.Groups {
		c.Groups[k] = v
	}
	c.add(r)
	return c
}

func (h *CouponHolding) add(r CouponRule) {
	if h.ByBatch == nil {
		h.ByBatch = map[string]int{}
	}
	h.ByBatch[r.Batch]++
	if r.Group != "" {
		if h.Groups == nil {
			h.Groups = map[string]string{}
		}
		h.Groups[r.Group] = r.Batch
	}
}

// DecideCoupon is the activity decision for one more coupon of rule's batch
// to a person holding h: "" when it may be issued, else ReasonLimit or
// ReasonGroup. (Risk is decided before it, on the request's own counts.)
func DecideCoupon(r CouponRule, h CouponHolding) CouponReason {
	invariant.That(r.Limit >= 1, "a coupon rule's limit is >= 1")
	if h.ByBatch[r.Batch] >= r.Limit {
		return ReasonLimit
	}
	if r.Group != "" {
		if b, ok := h.Groups[r.Group]; ok && b != r.Batch {
			return ReasonGroup
		}
	}
	return ""
}

// CouponAsk is one request in a merged deduction: whose, and the batch's rule.
type CouponAsk struct {
	Serial string
	ActID  string
	Rule   CouponRule
}

// CouponDecision is the asset step's answer for one ask: issued, or refused
// with a reason.
type CouponDecision struct {
	Serial string
	Issued bool
	Reason CouponReason // "" when issued
	App    string       // the request's app, set by the stores (AssignCoupons leaves it "")
}

// GrantStock is the merged deduction of one batch: want units asked of left
// in stock grants min(want, left) (what the store's conditional UPDATE takes).
func GrantStock(left, want int64) int64 {
	invariant.That(want >= 0, "a deduction asks for >= 0 units")
	return max(min(want, left), 0)
}

// AssignCoupons decides the asks of one batch that shared a deduction of
// granted units, in arrival order: each ask is checked again against its
// person's holding (DecideCoupon), which is updated as coupons are assigned,
// so two asks of one person in one merge respect the limit and the group;
// the first passing asks get the granted units, the rest are SOLD_OUT.
// unused is the granted units no ask took (refused by the re-check): the
// store gives them back to the stock in the same transaction. holdings maps
// each act_id to its holding as read under lock; it is updated in place.
//
// It asserts granted is 0..len(asks) before, and after (checkAssign) that
// the units are conserved: issued + unused = granted.
func AssignCoupons(granted int64, asks []CouponAsk, holdings map[string]*CouponHolding) (out []CouponDecision, unused int64) {
	invariant.That(granted >= 0 && granted <= int64(len(asks)), "granted is 0..the asks")
	out = make([]CouponDecision, len(asks))
	left, issued := granted, int64(0)
	for i, a := range asks {
		out[i].Serial = a.Serial
		h := holdings[a.ActID]
		if h == nil {
			h = &CouponHolding{}
			holdings[a.ActID] = h
		}
		if reason := DecideCoupon(a.Rule, *h); reason != "" {
			out[i].Reason = reason
			continue
		}
		if left == 0 {
			out[i].Reason = ReasonSoldOut
			continue
		}
		left--
		h.add(a.Rule)
		out[i].Issued = true
		issued++
	}
	checkAssign(granted, issued, left)
	return out, left
}

// checkAssign asserts AssignCoupons's postcondition: the granted units are
// conserved, issued + unused = granted with unused >= 0 (no coupon without
// its unit of stock, no unit lost: the audit's CouponBatchBooks close on it).
func checkAssign(granted, issued, unused int64) {
	invariant.That(unused >= 0 && issued+unused == granted, "coupon units must be conserved: issued + unused = granted (AssignCoupons)")
}

// MergeAsks groups asks by batch in order of each batch's first ask, each
// group in arrival order: the deductions of one pass of the asset layer.
func MergeAsks(asks []CouponAsk) [][]CouponAsk {
	idx := map[string]int{}
	var groups [][]CouponAsk
	for _, a := range asks {
		i, ok := idx[a.Rule.Batch]
		if !ok {
			i = len(groups)
			idx[a.Rule.Batch] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], a)
	}
	return groups
}

// CouponBatchBooks is one batch's books for the audit: stock = issued + left
// + written off.
type CouponBatchBooks struct {
	Batch      string
	Stock      int64 // the configured total
	Issued     int64 // coupon rows
	Left       int64 // the stock row's remaining count
	WrittenOff int64 // requests refused WRITTEN_OFF (the model's drop; the audit's line is CouponBatchLine)
}

// Difference is Stock − (Issued + Left + WrittenOff): 0 when the books
// close; above 0, units lost without a record; below 0, over-issued.
func (b CouponBatchBooks) Difference() int64 {
	return b.Stock - (b.Issued + b.Left + b.WrittenOff)
}

// HeldCoupon is one issued coupon, as the audit reads it.
type HeldCoupon struct {
	ActID string
	Rule  CouponRule
}

// CouponHoldingProblems checks issued coupons against their rules: no
// person over a batch's limit, no person holding two batches of one group.
// It returns each problem found, sorted.
func CouponHoldingProblems(cs []HeldCoupon) []string {
	type pb struct{ act, batch string }
	type pg struct{ act, group string }
	n := map[pb]int{}
	limit := map[pb]int{}
	groups := map[pg]map[string]bool{}
	for _, c := range cs {
		k := pb{c.ActID, c.Rule.Batch}
		n[k]++
		limit[k] = max(limit[k], c.Rule.Limit) // a batch's limit only grows (couponbatch.CheckIssued)
		if c.Rule.Group != "" {
			g := pg{c.ActID, c.Rule.Group}
			if groups[g] == nil {
				groups[g] = map[string]bool{}
			}
			groups[g][c.Rule.Batch] = true
		}
	}
	var ps []string
	for k, v := range n {
		if v > limit[k] {
			ps = append(ps, fmt.Sprintf("%s holds %d coupons of batch %s, over its limit of %d", k.act, v, k.batch, limit[k]))
		}
	}
	for g, bs := range groups {
		if len(bs) > 1 {
			names := make([]string, 0, len(bs))
			for b := range bs {
				names = append(names, b)
			}
			slices.Sort(names)
			ps = append(ps, fmt.Sprintf("%s holds batches %v of group %s", g.act, names, g.group))
		}
	}
	slices.Sort(ps)
	return ps
}

// CouponRequest is one issue request as the person's cell stores it: the
// calling app's serial number is its idempotency key (one request per app
// and serial), accepted at once and decided behind.
type CouponRequest struct {
	App      string // the calling app (its API key's app); "" for an internal caller
	Serial   string // the caller's serial number, unique per app
	ActID    string
	Shard    ShardID // the act_id's shard
	Batch    string
	Green    bool   // green channel: decided in the request, ahead of the queue
	DeviceID string // as the caller reports it, for the risk check; may be ""
	ClientIP string // as the caller reports it; may be ""

	State      CouponState
	Reason     CouponReason // set when refused
	CouponID   string       // set when issued
	AcceptedMS int64
	TakenMS    int64 // when a layer last took it (deciding)
	DecidedMS  int64 // when it became final
}

// CompareCouponRequests orders requests as the stores take them: by
// AcceptedMS, then App, then Serial (the primary key), for slices.SortFunc.
func CompareCouponRequests(a, b CouponRequest) int {
	return cmp.Or(cmp.Compare(a.AcceptedMS, b.AcceptedMS), cmp.Compare(a.App, b.App), cmp.Compare(a.Serial, b.Serial))
}

// ReplayCouponRequest decides a request whose app and serial are stored
// already: nil when prior asked for the same person and batch (the caller
// answers prior, a repeat), else ErrOrderConflict.
func ReplayCouponRequest(prior, want CouponRequest) error {
	if prior.ActID != want.ActID || prior.Batch != want.Batch {
		return Errorf(ErrOrderConflict, "serial %s was used for %s in batch %s", prior.Serial, prior.ActID, prior.Batch)
	}
	return nil
}

// ValidateCouponRequest checks a request's caller-set fields. Errors:
// ErrInvalidArgument.
func ValidateCouponRequest(r CouponRequest) error {
	if r.App != "" {
		if err := ValidateApp(r.App); err != nil {
			return err
		}
	}
	if err := validateToken("serial_no", r.Serial); err != nil {
		return err
	}
	if err := ValidateActID(r.ActID); err != nil {
		return err
	}
	if !r.Shard.Valid() {
		return Invalidf("shard %d out of range", r.Shard)
	}
	if err := validateToken("batch_id", r.Batch); err != nil {
		return err
	}
	if r.DeviceID != "" {
		if err := validateToken("device_id", r.DeviceID); err != nil {
			return err
		}
	}
	if r.ClientIP != "" {
		if a, err := netip.ParseAddr(r.ClientIP); err != nil || a.String() != r.ClientIP || a.Zone() != "" {
			return Invalidf("client_ip %q must be an IPv4 or IPv6 address in its canonical form, without a zone", r.ClientIP)
		}
	}
	return nil
}

// RefusedAtAccept is r to be stored already decided: refused SOLD_OUT in
// its accept, because the cell's local copy of the batch's stock showed
// nothing left (cell/couponq). An accept stores it refused, decided when
// it was accepted, and no queue takes it; a serial stored before still
// answers the stored request.
func RefusedAtAccept(r CouponRequest) CouponRequest {
	r.State, r.Reason = CouponRefused, ReasonSoldOut
	return r
}

// AcceptedForm is r as an accept stores it, once AcceptedMS is set:
// accepted with nothing decided, or, for a request refused at its accept
// (RefusedAtAccept), refused SOLD_OUT with DecidedMS its AcceptedMS. Any
// other state the caller set is ignored: an accept never stores a request
// issued or deciding.
func AcceptedForm(r CouponRequest) CouponRequest {
	refused := r.State == CouponRefused && r.Reason == ReasonSoldOut
	r.State, r.Reason, r.CouponID, r.TakenMS, r.DecidedMS = CouponAccepted, "", "", 0, 0
	if refused {
		r.State, r.Reason, r.DecidedMS = CouponRefused, ReasonSoldOut, r.AcceptedMS
	}
	return r
}

// Coupon is one issued coupon.
type Coupon struct {
	ID       string // CouponID(App, Serial, ActID): one coupon per request
	ActID    string
	Shard    ShardID
	Batch    string
	Group    string
	App      string
	Serial   string
	LeaseID  string // the stock deduction it came from
	IssuedMS int64
}

// CouponID is the ID of the coupon issued for app's request serial of
// actID: 32 hex digits of a hash of the three. A request holds one coupon
// at most; a serial an app reused for another person (stored in another
// database, where it is not seen as a repeat) gets another ID.
func CouponID(app, serial, actID string) string {
	return RequestHash("coupon", app, serial, actID)
}
