package memstore

import (
	"context"

	"redcell/storage"
)

// The coupon ops and queries (storage/op.go).

// couponOps runs the coupon ops of CommitGroup.
func (s *Store) couponOps(ctx context.Context, op storage.Op) (bool, error) {
	var err error
	switch o := op.(type) {
	case *storage.CouponTake:
		o.Taken, err = s.takeCouponRequests(ctx, o.DBs, o.StaleMS, o.Limit)
	case *storage.CouponIssue:
		o.Decisions, o.Unused, err = s.issueCoupons(ctx, o.Rule, o.LeaseID, o.Granted, o.Reqs)
	case *storage.CouponRefusal:
		err = s.refuseCoupons(ctx, o.Reqs, o.Reason)
	case *storage.CouponRelease:
		err = s.releaseCouponRequests(ctx, o.Reqs)
	default:
		return false, nil
	}
	return true, err
}

// couponReads answers the coupon queries of Read.
func (s *Store) couponReads(ctx context.Context, q storage.Query) (bool, error) {
	var err error
	switch x := q.(type) {
	case *storage.CouponRequestQuery:
		x.Request, err = s.couponRequestOf(ctx, x.Shard, x.App, x.Serial)
	case *storage.HoldingQuery:
		x.Holding, err = s.holdingOf(ctx, x.Shard, x.ActID)
	case *storage.HoldingsQuery:
		x.Holdings, err = s.holdingsOf(ctx, x.Reqs)
	case *storage.CouponsQuery:
		x.Coupons, err = s.couponsOf(ctx, x.Shard, x.ActID, x.After, x.Limit)
	case *storage.CouponLeaseSpentQuery:
		x.Spent, err = s.couponLeaseSpent(ctx, x.DBs, x.LeaseID)
	default:
		return false, nil
	}
	return true, err
}
