package coupons

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/budget"
	"redcell/cell/couponq"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// stock is couponq.Stock of one space: the deduction is a lease of the
// batch's stock row at its home, this cell's or another's (Budgets.Home),
// with no reserve.
type stock struct {
	d     *Drop
	space int // 0 real, 1 shadow
}

func (c stock) home(batch string) (budget.Home, string) {
	return c.d.cfg.Budgets.Home(c.space), couponq.StockKey(batch)
}

// Grant implements couponq.Stock: none left is 0 units, no error.
func (c stock) Grant(ctx context.Context, batch string, want int64) (string, int64, error) {
	h, key := c.home(batch)
	l, err := h.Grant(ctx, key, c.d.Holder(), want, 0, c.d.LeaseTTL())
	if errors.Is(err, model.ErrBudgetExhausted) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	return l.ID, l.Amount, nil
}

// Return implements couponq.Stock.
func (c stock) Return(ctx context.Context, batch, leaseID string, unused int64) error {
	h, key := c.home(batch)
	return h.Return(ctx, key, leaseID, unused)
}

// stockMax bounds the batches of one POST /internal/coupons/stock.
const stockMax = 1000

// Levels is couponq.Config.Levels for the space: the batches this cell
// homes read from its store, the others asked of their home cells, one call
// per home (per stockMax batches), side by side. A batch with no stock row
// yet, or whose home did not answer, is left out; the errors are joined.
func (c stock) Levels(ctx context.Context, batches []string) (map[string]couponq.Level, error) {
	out := map[string]couponq.Level{}
	byHome := map[string][]string{}
	var errs []error
	for _, b := range batches {
		key := couponq.StockKey(b)
		sh := sharding.BudgetShard(key)
		if !c.d.cfg.Own.Owns(sh) {
			owner, err := c.d.cfg.Budgets.OwnerOf(sh)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			byHome[owner] = append(byHome[owner], b)
			continue
		}
		l, ok, err := c.d.level(ctx, c.space, b)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			out[b] = couponq.Level{Left: l.Left, Held: l.Held}
		}
	}
	errs = append(errs, c.askHomes(ctx, byHome, out)...)
	return out, errors.Join(errs...)
}

// askHomes asks each home cell of byHome (address → batches) for its
// batches' stock, into out, side by side; it answers the failed calls'
// errors.
func (c stock) askHomes(ctx context.Context, byHome map[string][]string, out map[string]couponq.Level) []error {
	sp := c.d.cfg.Spaces[c.space]
	var errs []error
	var mu sync.Mutex // guards out, errs
	var wg sync.WaitGroup
	for home, bs := range byHome {
		for len(bs) > 0 {
			part := bs[:min(len(bs), stockMax)]
			bs = bs[len(part):]
			wg.Go(func() {
				var resp api.CouponStockResponse
				err := c.d.cfg.Client.Send(ctx, cellclient.Call{Addr: home, Path: api.CouponStockPath, Stress: sp.Stress,
					Body: api.CouponStockRequest{Batches: part}, Out: &resp})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("stock of %d batches at %s: %w", len(part), home, err))
					return
				}
				for _, l := range resp.Stock {
					out[l.Batch] = couponq.Level{Left: l.Left, Held: l.Held}
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// level reads batch's stock in space at this cell, its home: false when it
// has no stock row yet.
func (d *Drop) level(ctx context.Context, space int, batch string) (api.CouponStockLevel, bool, error) {
	key := couponq.StockKey(batch)
	b, held, err := storage.BudgetLevel(ctx, d.cfg.Spaces[space].Store, sharding.BudgetShard(key), key)
	if errors.Is(err, model.ErrNotFound) {
		return api.CouponStockLevel{}, false, nil
	}
	if err != nil {
		return api.CouponStockLevel{}, false, err
	}
	return api.CouponStockLevel{Batch: batch, Total: b.Total, Left: b.Available(0), Held: held}, true, nil
}

// stockOf answers POST /internal/coupons/stock in space: the stock of the
// asked batches this cell homes and has a row of; the others are left out
// (the asker's map may be older than a move). Errors: INVALID_ARGUMENT (a
// malformed body, more than stockMax batches, a malformed ID), the store's.
func (d *Drop) stockOf(ctx context.Context, space int, body []byte) (any, error) {
	var req api.CouponStockRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, err
	}
	if len(req.Batches) > stockMax {
		return nil, model.Invalidf("at most %d batches per call, got %d", stockMax, len(req.Batches))
	}
	out := api.CouponStockResponse{Stock: make([]api.CouponStockLevel, 0, len(req.Batches))}
	for _, b := range req.Batches {
		if _, err := d.cfg.Budgets.HomeShard(couponq.StockKey(b)); errors.Is(err, model.ErrInvalidArgument) {
			return nil, err
		} else if err != nil {
			continue // not homed here, or frozen by a move
		}
		l, ok, err := d.level(ctx, space, b)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Stock = append(out.Stock, l)
		}
	}
	return out, nil
}
