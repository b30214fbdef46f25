package budgets

import (
	"context"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Answers writes a route's answer: the cell's one answer writer, which
// names the cell in every answer and counts failures.
type Answers interface {
	// JSON answers status with v as its JSON body.
	JSON(rc *fasthttp.RequestCtx, status int, v any)
	// Error answers err with its code's status (api.WriteError).
	Error(rc *fasthttp.RequestCtx, err error)
}

// Serve answers a budget route for a budget homed here, in space (0 real, 1
// shadow), through Config.Answers: api.RouteBudgetLease (POST /internal/budget/lease:
// api.BudgetLeaseRequest → api.BudgetLease, the lease granted),
// api.RouteBudgetReturn (POST /internal/budget/return:
// api.BudgetReturnRequest → {"returned": true}) and api.RouteBudgetLeases
// (POST /internal/budget/leases: api.BudgetLeasesRequest →
// api.BudgetLeasesResponse, the holder's open and expired leases of the
// key). The caller has checked the call's signature and set ctx's
// deadline. Errors answered: INVALID_ARGUMENT (a malformed body or key, a
// TTL outside 1..3600000 ms, a total below 0), WRONG_CELL and MOVING (the
// key's home shard is not served here), the store's (BUDGET_EXHAUSTED,
// NOT_FOUND, ...), and NOT_FOUND for any other route.
func (k *Keeper) Serve(ctx context.Context, rc *fasthttp.RequestCtx, route api.RouteID, space int) {
	a := k.cfg.Answers
	switch route {
	case api.RouteBudgetLease:
		k.lease(ctx, rc, space)
	case api.RouteBudgetReturn:
		k.giveBack(ctx, rc, space)
	case api.RouteBudgetLeases:
		k.leases(ctx, rc, space)
	default:
		a.Error(rc, model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path()))
	}
}

// lease answers POST /internal/budget/lease.
func (k *Keeper) lease(ctx context.Context, rc *fasthttp.RequestCtx, space int) {
	a := k.cfg.Answers
	var req api.BudgetLeaseRequest
	if err := strictjson.Decode(rc.PostBody(), &req); err != nil {
		a.Error(rc, err)
		return
	}
	if _, err := k.HomeShard(req.Key); err != nil {
		a.Error(rc, err)
		return
	}
	if req.TTLMS < 1 || req.TTLMS > int64(time.Hour/time.Millisecond) || req.Total < 0 {
		a.Error(rc, model.Invalidf("ttl_ms must be 1..3600000 and total >= 0"))
		return
	}
	l, err := k.grantLocal(ctx, k.cfg.Spaces[space].Store, req)
	if err != nil {
		a.Error(rc, err)
		return
	}
	a.JSON(rc, http.StatusOK, api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder, Amount: l.Amount,
		CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS})
}

// giveBack answers POST /internal/budget/return.
func (k *Keeper) giveBack(ctx context.Context, rc *fasthttp.RequestCtx, space int) {
	a := k.cfg.Answers
	var req api.BudgetReturnRequest
	if err := strictjson.Decode(rc.PostBody(), &req); err != nil {
		a.Error(rc, err)
		return
	}
	sh, err := k.HomeShard(req.Key)
	if err != nil {
		a.Error(rc, err)
		return
	}
	if _, err := storage.ReturnLease(ctx, k.cfg.Spaces[space].Store, sh, req.LeaseID, req.Unspent); err != nil {
		a.Error(rc, err)
		return
	}
	a.JSON(rc, http.StatusOK, map[string]bool{"returned": true})
}

// leases answers POST /internal/budget/leases: the holder's open and
// expired leases of the key.
func (k *Keeper) leases(ctx context.Context, rc *fasthttp.RequestCtx, space int) {
	a := k.cfg.Answers
	var req api.BudgetLeasesRequest
	if err := strictjson.Decode(rc.PostBody(), &req); err != nil {
		a.Error(rc, err)
		return
	}
	if _, err := k.HomeShard(req.Key); err != nil {
		a.Error(rc, err)
		return
	}
	ls, err := k.localLeasesOf(ctx, k.cfg.Spaces[space].Store, req.Key, req.Holder)
	if err != nil {
		a.Error(rc, err)
		return
	}
	out := api.BudgetLeasesResponse{Leases: []api.BudgetLeaseState{}}
	for _, l := range ls {
		out.Leases = append(out.Leases, api.BudgetLeaseState{BudgetLease: api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder,
			Amount: l.Amount, CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS}, State: string(l.State)})
	}
	a.JSON(rc, http.StatusOK, out)
}

// localLeasesOf lists holder's open and expired leases of key, homed here,
// from store st.
func (k *Keeper) localLeasesOf(ctx context.Context, st Store, key, holder string) ([]model.Lease, error) {
	all, err := storage.LeasesOf(ctx, st, sharding.BudgetShard(key), holder)
	if err != nil {
		return nil, err
	}
	var out []model.Lease
	for _, l := range all {
		if l.Key == key {
			out = append(out, l)
		}
	}
	return out, nil
}

// leasesOf lists holder's leases of key at its home, wherever that is, as
// space sp reaches it: holder is this cell's name for reward leases, the
// coupon holder for coupon deductions.
func (k *Keeper) leasesOf(ctx context.Context, sp Space, key, holder string) ([]model.Lease, error) {
	sh := sharding.BudgetShard(key)
	if k.cfg.Owns(sh) {
		return k.localLeasesOf(ctx, sp.Store, key, holder)
	}
	owner, err := k.OwnerOf(sh)
	if err != nil {
		return nil, err
	}
	var out api.BudgetLeasesResponse
	if err := k.cfg.Client.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetLeasesPath, Stress: sp.Stress,
		Body: api.BudgetLeasesRequest{Key: key, Holder: holder}, Out: &out}); err != nil {
		return nil, err
	}
	ls := make([]model.Lease, 0, len(out.Leases))
	for _, l := range out.Leases {
		ls = append(ls, model.Lease{ID: l.ID, Key: l.Key, Holder: l.Holder, Amount: l.Amount, State: model.LeaseState(l.State),
			CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS})
	}
	return ls, nil
}
