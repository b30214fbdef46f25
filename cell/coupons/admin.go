package coupons

import (
	"context"
	"time"

	"redcell/api"
	"redcell/cell/couponbatch"
	"redcell/cell/couponq"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// The admin port's coupon routes (admin.Coupons): GET /admin/coupons, PUT
// /admin/coupons, POST /admin/coupons/reload.

// CouponBatches implements admin.Coupons: the real space's engine's
// counters and settings, and the loaded batches with the stock of those
// this cell homes.
func (d *Drop) CouponBatches() api.CouponBatchesResponse {
	return d.describe(d.holder.Catalog())
}

// ReloadCoupons implements admin.Coupons: it reads the batches file again,
// sets the stock rows this cell homes and answers the batches. Errors:
// model.ErrInvalidArgument with every problem when the file is invalid or
// lowers a batch below what it issued; the loaded batches stay.
func (d *Drop) ReloadCoupons() (api.CouponBatchesResponse, error) {
	cat, err := d.holder.Reload(d.cfg.Path, d.clock.Now(), d.issued)
	if err != nil {
		return api.CouponBatchesResponse{}, model.Errorf(model.ErrInvalidArgument, "%v (the loaded batches stay)", err)
	}
	d.syncStock(cat)
	d.metrics.seed(cat)
	return d.describe(cat), nil
}

// SetCoupons implements admin.Coupons: both engines' merge_max (1..1000
// requests) and, when set, prefetch (0..10000 units). Errors:
// model.ErrInvalidArgument (a value out of range; nothing changed).
func (d *Drop) SetCoupons(set api.CouponSetting) (api.CouponBatchesResponse, error) {
	if set.MergeMax < 1 || set.MergeMax > 1000 {
		return api.CouponBatchesResponse{}, model.Invalidf("merge_max must be 1..1000, got %d", set.MergeMax)
	}
	if set.Prefetch != nil && (*set.Prefetch < 0 || *set.Prefetch > 10000) {
		return api.CouponBatchesResponse{}, model.Invalidf("prefetch must be 0..10000, got %d", *set.Prefetch)
	}
	for _, e := range d.engines {
		e.SetMergeMax(set.MergeMax)
		if set.Prefetch != nil {
			e.SetPrefetch(int64(*set.Prefetch))
		}
	}
	return d.describe(d.holder.Catalog()), nil
}

// describe answers the admin port's coupon routes from cat (nil: none
// loaded): the real space's engine, and each batch; a batch homed here
// with its stock row's out, spent and left, read within 2 s.
func (d *Drop) describe(cat *couponbatch.Catalog) api.CouponBatchesResponse {
	out := api.CouponBatchesResponse{Batches: []api.CouponBatch{}}
	e := d.engines[0]
	out.Accepted, out.Issued, out.Refused = e.Stats.Accepted.Load(), e.Stats.Issued.Load(), e.Stats.Refused.Load()
	out.Queue1, out.Queue2 = e.Depths()
	out.MergeMax, out.Prefetch = e.MergeMax(), int(e.Prefetch())
	if cat == nil {
		return out
	}
	out.Loaded, out.Path, out.Version, out.LoadedMS = true, cat.Path, cat.Version, cat.Loaded.UnixMilli()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, b := range cat.Batches() {
		cb := api.CouponBatch{ID: b.ID, Stock: b.Stock, FaceValue: b.FaceValue, PerPersonLimit: b.PerPersonLimit, Group: b.Group}
		if b.Start != nil {
			cb.StartMS = b.Start.UnixMilli()
		}
		if b.End != nil {
			cb.EndMS = b.End.UnixMilli()
		}
		key := couponq.StockKey(b.ID)
		if sh := sharding.BudgetShard(key); d.cfg.Own.Owns(sh) {
			cb.Home = true
			if row, ls, err := storage.Budget(ctx, d.cfg.Spaces[0].Store, sh, key); err == nil {
				out := row.Outstanding()
				for _, l := range ls {
					if l.State == model.LeaseOpen || l.State == model.LeaseExpired {
						cb.Out += l.Amount
					}
				}
				cb.Spent = out - cb.Out
				cb.Left = row.Total - out
			}
		}
		out.Batches = append(out.Batches, cb)
	}
	return out
}
