package coupons

import (
	"context"
	"slices"

	"redcell/model"
	"redcell/storage"
)

// moving is the coupon engine's store, kept off databases a move froze or
// handed over: each coupon op (storage.CouponTake, CouponIssue,
// CouponRefusal, CouponRelease) is work the freeze waits for
// (Ownership.Enter), and an issue, refusal or release writes nothing when
// one of its requests' shards is not served (ErrMoving; the engine parks
// those requests, and the new owner takes them again once stale); a take
// takes only from the databases served now. The engine's queues may hold
// requests taken before the freeze. Every other op, and every read, passes
// through.
type moving struct {
	Store
	own Ownership
}

func (m moving) served(reqs []model.CouponRequest) error {
	for _, r := range reqs {
		if err := m.own.Check(r.Shard); err != nil {
			return err
		}
	}
	return nil
}

// CommitGroup runs the coupon ops as the type's comment says.
func (m moving) CommitGroup(ctx context.Context, list []storage.Op) error {
	if len(list) != 1 {
		return m.Store.CommitGroup(ctx, list)
	}
	var reqs []model.CouponRequest
	switch op := list[0].(type) {
	case *storage.CouponTake:
		leave := m.own.Enter()
		defer leave()
		dbs := op.DBs
		defer func() { op.DBs = dbs }()
		op.DBs = slices.DeleteFunc(slices.Clone(dbs), func(db int) bool { return !m.own.ServesDB(db) })
		if len(op.DBs) == 0 {
			op.Taken = nil
			return nil
		}
		return m.Store.CommitGroup(ctx, list)
	case *storage.CouponIssue:
		reqs = op.Reqs
	case *storage.CouponRefusal:
		reqs = op.Reqs
	case *storage.CouponRelease:
		reqs = op.Reqs
	default:
		return m.Store.CommitGroup(ctx, list)
	}
	leave := m.own.Enter()
	defer leave()
	if err := m.served(reqs); err != nil {
		return err
	}
	return m.Store.CommitGroup(ctx, list)
}
