package coupons

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/storage"
)

// ErrDisabled answers a coupon route on a cell without a coupon drop (a nil
// Drop), or whose batches file is not loaded; it wraps
// model.ErrCouponsDisabled (501 COUPONS_DISABLED).
var ErrDisabled = model.Errorf(model.ErrCouponsDisabled, "this cluster runs no coupon batches (cell.coupons in the config)")

// Serve answers a coupon route in space (0 real, 1 shadow) through
// Config.Answers; key is the route's path key. The routes:
// api.RouteCouponIssue (POST /v1/coupons/issue: api.CouponIssueRequest →
// api.CouponRequestState, 202 accepted or 200 final), api.RouteCouponState
// (GET /v1/coupons/issue/{serial_no}?act_id=, key the serial:
// api.CouponRequestState), api.RouteCoupons (GET
// /v1/accounts/{act_id}/coupons[?cursor=&limit=], key the act_id:
// api.CouponsResponse) and api.RouteCouponStock (POST
// /internal/coupons/stock: api.CouponStockRequest →
// api.CouponStockResponse). The caller has checked the call's signature,
// the rate limit and the space, and set ctx's deadline. Errors answered:
// each route's (below), and NOT_FOUND for any other route.
func (d *Drop) Serve(ctx context.Context, rc *fasthttp.RequestCtx, route api.RouteID, space int, key string) {
	status, out, err := http.StatusOK, any(nil), error(nil)
	switch route {
	case api.RouteCouponIssue:
		status, out, err = d.issue(ctx, rc, space)
	case api.RouteCouponState:
		out, err = d.requestState(ctx, rc, space, key)
	case api.RouteCoupons:
		out, err = d.couponsOf(ctx, rc, space, key)
	case api.RouteCouponStock:
		out, err = d.stockOf(ctx, space, rc.PostBody())
	default:
		err = model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path())
	}
	if err != nil {
		d.cfg.Answers.Error(rc, err)
		return
	}
	d.cfg.Answers.JSON(rc, status, out)
}

// app is the calling app of a coupon request, as the router set it from the
// caller's API key (api.HeaderApp); "" when none was set.
func app(rc *fasthttp.RequestCtx) string { return string(rc.Request.Header.Peek(api.HeaderApp)) }

// issue answers POST /v1/coupons/issue: the request is stored (accepted)
// and answered 202, or with its final state (200) on the green channel and
// for a repeat of a serial. Errors: COUPONS_DISABLED, INVALID_ARGUMENT,
// NOT_FOUND (no such batch), ORDER_CONFLICT (the serial was used for
// another person or batch), WRONG_CELL, MOVING, and the store's.
func (d *Drop) issue(ctx context.Context, rc *fasthttp.RequestCtx, space int) (int, any, error) {
	var req api.CouponIssueRequest
	if err := strictjson.Decode(rc.PostBody(), &req); err != nil {
		return 0, nil, err
	}
	sh, err := d.cfg.Own.Account(req.ActID)
	if err != nil {
		return 0, nil, err
	}
	r := model.CouponRequest{App: app(rc), Serial: req.SerialNo, ActID: req.ActID, Shard: sh, Batch: req.BatchID,
		Green: req.Green, DeviceID: req.DeviceID, ClientIP: req.ClientIP}
	if err := model.ValidateCouponRequest(r); err != nil {
		return 0, nil, err
	}
	if cat := d.holder.Catalog(); cat == nil {
		return 0, nil, ErrDisabled
	} else if _, ok := cat.Batch(req.BatchID); !ok {
		return 0, nil, model.Errorf(model.ErrNotFound, "no coupon batch %q", req.BatchID)
	}
	got, repeat, err := d.engines[space].Accept(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusAccepted
	if repeat || req.Green || got.State.Final() {
		status = http.StatusOK
	}
	out := stateOf(got)
	out.Repeat = &repeat
	return status, out, nil
}

// stateOf is a request's state as the coupon routes answer it.
func stateOf(r model.CouponRequest) api.CouponRequestState {
	return api.CouponRequestState{SerialNo: r.Serial, ActID: r.ActID, BatchID: r.Batch, State: string(r.State), Reason: string(r.Reason),
		CouponID: r.CouponID, AcceptedMS: r.AcceptedMS, DecidedMS: r.DecidedMS}
}

// requestState answers GET /v1/coupons/issue/{serial_no}?act_id=.
// Errors: INVALID_ARGUMENT, NOT_FOUND (no request of this app with the
// serial for the act_id), WRONG_CELL, MOVING, the store's.
func (d *Drop) requestState(ctx context.Context, rc *fasthttp.RequestCtx, space int, serial string) (any, error) {
	actID := string(rc.QueryArgs().Peek("act_id"))
	sh, err := d.cfg.Own.Account(actID)
	if err != nil {
		return nil, err
	}
	app := app(rc)
	// The serial is checked as a request's would be (the batch is no part of it).
	if err := model.ValidateCouponRequest(model.CouponRequest{App: app, Serial: serial, ActID: actID, Shard: sh, Batch: "x"}); err != nil {
		return nil, err
	}
	got, err := storage.CouponRequestOf(ctx, d.cfg.Spaces[space].Coupons, sh, app, serial)
	if err == nil && got.ActID != actID {
		err = model.ErrNotFound
	}
	if errors.Is(err, model.ErrNotFound) {
		return nil, model.Errorf(model.ErrNotFound, "no coupon request %s for act_id %s", serial, actID)
	}
	if err != nil {
		return nil, err
	}
	return stateOf(got), nil
}

// couponsOf answers GET /v1/accounts/{act_id}/coupons[?cursor=&limit=]:
// the person's coupons, newest first, at most ?limit= (1..100, default
// 100), after ?cursor= (a next_cursor this route gave); next_cursor is set
// while more are left. Errors: INVALID_ARGUMENT (act_id, cursor, limit),
// WRONG_CELL, MOVING, and the store's.
func (d *Drop) couponsOf(ctx context.Context, rc *fasthttp.RequestCtx, space int, actID string) (any, error) {
	sh, err := d.cfg.Own.Account(actID)
	if err != nil {
		return nil, err
	}
	after, err := model.ParseFlowCursor(string(rc.QueryArgs().Peek("cursor")))
	if err != nil {
		return nil, err
	}
	limit := 100
	if v := rc.QueryArgs().Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > 100 {
			return nil, model.Invalidf("limit must be 1..100")
		}
		limit = n
	}
	// One more than asked: whether a next page exists.
	cs, err := storage.CouponsOf(ctx, d.cfg.Spaces[space].Coupons, sh, actID, after, limit+1)
	if err != nil {
		return nil, err
	}
	cat := d.holder.Catalog()
	out := api.CouponsResponse{ActID: actID, Coupons: make([]api.Coupon, 0, min(len(cs), limit))}
	if len(cs) > limit {
		cs = cs[:limit]
		last := cs[limit-1]
		out.NextCursor = model.FlowCursor{CreatedMS: last.IssuedMS, ID: last.ID}.String()
	}
	for _, c := range cs {
		item := api.Coupon{CouponID: c.ID, BatchID: c.Batch, BatchGroup: c.Group, SerialNo: c.Serial, IssuedMS: c.IssuedMS}
		if cat != nil {
			if b, ok := cat.Batch(c.Batch); ok {
				item.FaceValue = b.FaceValue
			}
		}
		out.Coupons = append(out.Coupons, item)
	}
	return out, nil
}
