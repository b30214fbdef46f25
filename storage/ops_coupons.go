package storage

import (
	"context"

	"redcell/model"
)

// The coupon ops and queries (op.go): the person side of coupon issuance,
// the issue requests and the coupons, in the act_id's database. The stock is
// a Budgets row of the batch's home shard, and a merged deduction a lease of
// it (GrantLease with no reserve, as many units as requests): coupons carry
// their lease, so a lease whose holder died is settled by counting them
// (CouponLeaseSpentQuery). A request is stored by a group's AcceptOp
// (AcceptCoupon: a group of one).

// CouponTake moves up to Limit requests of databases DBs that are accepted,
// or deciding and taken at or before StaleMS, to deciding (TakenMS now) and
// answers them in Taken, oldest accepted first
// (model.CompareCouponRequests), in one transaction. A request taken twice
// is harmless: CouponIssue and CouponRefusal decide it once. A StaleMS
// below 0 takes accepted requests only; a Limit below 1 or no DBs takes
// none.
type CouponTake struct {
	DBs     []int
	StaleMS int64
	Limit   int

	Taken []model.CouponRequest // the answer
}

// CouponIssue decides Reqs, requests of Rule's batch (any databases of this
// store) that share a deduction of Granted units from lease LeaseID, in one
// transaction: it locks their persons, leaves out the requests already
// final (decided before, by another taker), and decides the rest in order
// with model.AssignCoupons against the persons' holdings: state issued, the
// request holding its coupon (model.CouponID, Rule's group, LeaseID), or
// state refused with the reason. It answers the decisions made, in order, in
// Decisions, and in Unused the granted units no request took, for the caller
// to return to the lease. Errors: ErrInvalidArgument (Granted above 0 with
// no LeaseID; nothing written), ErrNotFound (a request not stored; nothing
// written), ErrCommitUnknown (each request is then final or still deciding;
// the lease is settled by its coupons).
type CouponIssue struct {
	Rule    model.CouponRule
	LeaseID string
	Granted int64 // units, >= 0
	Reqs    []model.CouponRequest

	Decisions []model.CouponDecision // the answer
	Unused    int64                  // the answer: units
}

// CouponRefusal sets the requests Reqs names that are not final yet refused
// with Reason (not empty); final ones are left as they are.
type CouponRefusal struct {
	Reqs   []model.CouponRequest
	Reason model.CouponReason
}

// CouponRelease sets the requests Reqs names that are deciding back to
// accepted (a draining cell's queued requests, for the next owner to take at
// once); others are left as they are.
type CouponRelease struct {
	Reqs []model.CouponRequest
}

// CouponRequestQuery reads the request of App and Serial in shard Shard's
// database into Request. Errors: ErrNotFound.
type CouponRequestQuery struct {
	Shard       model.ShardID
	App, Serial string

	Request model.CouponRequest // the answer
}

// HoldingQuery reads ActID's holding (coupons per batch, the batch held in
// each group) in shard Shard's database into Holding, without a lock: the
// activity layer's early decision; CouponIssue decides again under lock.
type HoldingQuery struct {
	Shard model.ShardID
	ActID string

	Holding model.CouponHolding // the answer
}

// HoldingsQuery reads the holdings of the persons of Reqs (their act_ids
// and shards) at once into Holdings, by act_id; a person without coupons
// has an empty holding.
type HoldingsQuery struct {
	Reqs []model.CouponRequest

	Holdings map[string]model.CouponHolding // the answer
}

// CouponsQuery lists ActID's coupons in shard Shard's database into
// Coupons, newest first (issued_ms, then coupon_id, descending), up to
// Limit, after the cursor After (the zero cursor: from the newest; else
// only coupons older than its CreatedMS, as issued_ms, and ID, as
// coupon_id).
type CouponsQuery struct {
	Shard model.ShardID
	ActID string
	After model.FlowCursor
	Limit int

	Coupons []model.Coupon // the answer
}

// CouponLeaseSpentQuery counts the coupons issued from LeaseID in databases
// DBs into Spent.
type CouponLeaseSpentQuery struct {
	DBs     []int
	LeaseID string

	Spent int64 // the answer: coupons
}

func (*CouponTake) isOp()    {}
func (*CouponIssue) isOp()   {}
func (*CouponRefusal) isOp() {}
func (*CouponRelease) isOp() {}

func (*CouponRequestQuery) isQuery()    {}
func (*HoldingQuery) isQuery()          {}
func (*HoldingsQuery) isQuery()         {}
func (*CouponsQuery) isQuery()          {}
func (*CouponLeaseSpentQuery) isQuery() {}

// couponOps runs the coupon ops of CommitGroup.
func (m *MySQL) couponOps(ctx context.Context, op Op) (bool, error) {
	var err error
	switch o := op.(type) {
	case *CouponTake:
		o.Taken, err = m.takeCouponRequests(ctx, o.DBs, o.StaleMS, o.Limit)
	case *CouponIssue:
		o.Decisions, o.Unused, err = m.issueCoupons(ctx, o.Rule, o.LeaseID, o.Granted, o.Reqs)
	case *CouponRefusal:
		err = m.refuseCoupons(ctx, o.Reqs, o.Reason)
	case *CouponRelease:
		err = m.releaseCouponRequests(ctx, o.Reqs)
	default:
		return false, nil
	}
	return true, err
}

// couponReads answers the coupon queries of Read.
func (m *MySQL) couponReads(ctx context.Context, q Query) (bool, error) {
	var err error
	switch x := q.(type) {
	case *CouponRequestQuery:
		x.Request, err = m.couponRequestOf(ctx, x.Shard, x.App, x.Serial)
	case *HoldingQuery:
		x.Holding, err = m.holdingOf(ctx, x.Shard, x.ActID)
	case *HoldingsQuery:
		x.Holdings, err = m.holdingsOf(ctx, x.Reqs)
	case *CouponsQuery:
		x.Coupons, err = m.couponsOf(ctx, x.Shard, x.ActID, x.After, x.Limit)
	case *CouponLeaseSpentQuery:
		x.Spent, err = m.couponLeaseSpent(ctx, x.DBs, x.LeaseID)
	default:
		return false, nil
	}
	return true, err
}

// TakeCouponRequests commits a CouponTake of dbs, staleMS and limit, and
// answers what it took.
func TakeCouponRequests(ctx context.Context, g Grouper, dbs []int, staleMS int64, limit int) ([]model.CouponRequest, error) {
	op := &CouponTake{DBs: dbs, StaleMS: staleMS, Limit: limit}
	if err := g.CommitGroup(ctx, []Op{op}); err != nil {
		return nil, err
	}
	return op.Taken, nil
}

// IssueCoupons commits a CouponIssue and answers its decisions and unused
// units.
func IssueCoupons(ctx context.Context, g Grouper, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) (decisions []model.CouponDecision, unused int64, err error) {
	op := &CouponIssue{Rule: rule, LeaseID: leaseID, Granted: granted, Reqs: reqs}
	if err := g.CommitGroup(ctx, []Op{op}); err != nil {
		return nil, 0, err
	}
	return op.Decisions, op.Unused, nil
}

// RefuseCoupons commits a CouponRefusal of reqs with reason.
func RefuseCoupons(ctx context.Context, g Grouper, reqs []model.CouponRequest, reason model.CouponReason) error {
	return g.CommitGroup(ctx, []Op{&CouponRefusal{Reqs: reqs, Reason: reason}})
}

// ReleaseCouponRequests commits a CouponRelease of reqs.
func ReleaseCouponRequests(ctx context.Context, g Grouper, reqs []model.CouponRequest) error {
	return g.CommitGroup(ctx, []Op{&CouponRelease{Reqs: reqs}})
}

// CouponRequestOf reads a CouponRequestQuery and answers its request.
func CouponRequestOf(ctx context.Context, r Reader, s model.ShardID, app, serial string) (model.CouponRequest, error) {
	q := &CouponRequestQuery{Shard: s, App: app, Serial: serial}
	if err := r.Read(ctx, q); err != nil {
		return model.CouponRequest{}, err
	}
	return q.Request, nil
}

// HoldingOf reads a HoldingQuery and answers its holding.
func HoldingOf(ctx context.Context, r Reader, s model.ShardID, actID string) (model.CouponHolding, error) {
	q := &HoldingQuery{Shard: s, ActID: actID}
	if err := r.Read(ctx, q); err != nil {
		return model.CouponHolding{}, err
	}
	return q.Holding, nil
}

// HoldingsOf reads a HoldingsQuery and answers its holdings.
func HoldingsOf(ctx context.Context, r Reader, reqs []model.CouponRequest) (map[string]model.CouponHolding, error) {
	q := &HoldingsQuery{Reqs: reqs}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Holdings, nil
}

// CouponsOf reads a CouponsQuery and answers its coupons.
func CouponsOf(ctx context.Context, r Reader, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Coupon, error) {
	q := &CouponsQuery{Shard: s, ActID: actID, After: after, Limit: limit}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Coupons, nil
}

// CouponLeaseSpent reads a CouponLeaseSpentQuery and answers the coupons
// it counted.
func CouponLeaseSpent(ctx context.Context, r Reader, dbs []int, leaseID string) (int64, error) {
	q := &CouponLeaseSpentQuery{DBs: dbs, LeaseID: leaseID}
	if err := r.Read(ctx, q); err != nil {
		return 0, err
	}
	return q.Spent, nil
}
