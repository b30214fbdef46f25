package guard

import (
	"context"

	"redcell/model"
	"redcell/storage"
)

// Coupons is a storage.Coupons behind the breaker of a Store: coupon calls
// fail and recover with the rest of the database's calls.
type Coupons struct {
	s     *Store
	inner storage.Coupons
}

var _ storage.Coupons = (*Coupons)(nil)

// NewCoupons returns inner behind the breaker and error rules of s.
func NewCoupons(s *Store, inner storage.Coupons) *Coupons { return &Coupons{s: s, inner: inner} }

// AcceptCoupon implements storage.Coupons.
func (c *Coupons) AcceptCoupon(ctx context.Context, r model.CouponRequest) (out model.CouponRequest, repeat bool, err error) {
	err = c.s.call(func() (err error) { out, repeat, err = c.inner.AcceptCoupon(ctx, r); return err })
	return out, repeat, err
}

// CouponRequestOf implements storage.Coupons.
func (c *Coupons) CouponRequestOf(ctx context.Context, sh model.ShardID, app, serial string) (out model.CouponRequest, err error) {
	err = c.s.call(func() (err error) { out, err = c.inner.CouponRequestOf(ctx, sh, app, serial); return err })
	return out, err
}

// TakeCouponRequests implements storage.Coupons.
func (c *Coupons) TakeCouponRequests(ctx context.Context, dbs []int, staleMS int64, limit int) (out []model.CouponRequest, err error) {
	err = c.s.call(func() (err error) { out, err = c.inner.TakeCouponRequests(ctx, dbs, staleMS, limit); return err })
	return out, err
}

// IssueCoupons implements storage.Coupons.
func (c *Coupons) IssueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) (ds []model.CouponDecision, unused int64, err error) {
	err = c.s.call(func() (err error) {
		ds, unused, err = c.inner.IssueCoupons(ctx, rule, leaseID, granted, reqs)
		return err
	})
	return ds, unused, err
}

// RefuseCoupons implements storage.Coupons.
func (c *Coupons) RefuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	return c.s.call(func() error { return c.inner.RefuseCoupons(ctx, reqs, reason) })
}

// ReleaseCouponRequests implements storage.Coupons.
func (c *Coupons) ReleaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error {
	return c.s.call(func() error { return c.inner.ReleaseCouponRequests(ctx, reqs) })
}

// HoldingOf implements storage.Coupons.
func (c *Coupons) HoldingOf(ctx context.Context, sh model.ShardID, actID string) (h model.CouponHolding, err error) {
	err = c.s.call(func() (err error) { h, err = c.inner.HoldingOf(ctx, sh, actID); return err })
	return h, err
}

// HoldingsOf implements storage.Coupons.
func (c *Coupons) HoldingsOf(ctx context.Context, reqs []model.CouponRequest) (hs map[string]model.CouponHolding, err error) {
	err = c.s.call(func() (err error) { hs, err = c.inner.HoldingsOf(ctx, reqs); return err })
	return hs, err
}

// CouponsOf implements storage.Coupons.
func (c *Coupons) CouponsOf(ctx context.Context, sh model.ShardID, actID string, after model.FlowCursor, limit int) (out []model.Coupon, err error) {
	err = c.s.call(func() (err error) { out, err = c.inner.CouponsOf(ctx, sh, actID, after, limit); return err })
	return out, err
}

// CouponLeaseSpent implements storage.Coupons.
func (c *Coupons) CouponLeaseSpent(ctx context.Context, dbs []int, leaseID string) (n int64, err error) {
	err = c.s.call(func() (err error) { n, err = c.inner.CouponLeaseSpent(ctx, dbs, leaseID); return err })
	return n, err
}
