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
	st := k.cfg.Spaces[space].Store
	var out any
	var err error
	switch route {
	case api.RouteBudgetLease:
		out, err = k.lease(ctx, st, rc.PostBody())
	case api.RouteBudgetReturn:
		out, err = k.giveBack(ctx, st, rc.PostBody())
	case api.RouteBudgetLeases:
		out, err = k.leases(ctx, st, rc.PostBody())
	default:
		err = model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path())
	}
	if err != nil {
		k.cfg.Answers.Error(rc, err)
		return
	}
	k.cfg.Answers.JSON(rc, http.StatusOK, out)
}

// homed decodes body into req (a pointer) and answers the home shard of
// the budget key the decoded request names at *key, when this cell serves
// it. Errors: model.ErrInvalidArgument (a malformed body or key),
// model.ErrWrongCell, model.ErrMoving.
func (k *Keeper) homed(body []byte, req any, key *string) (model.ShardID, error) {
	if err := strictjson.Decode(body, req); err != nil {
		return 0, err
	}
	return k.HomeShard(*key)
}

// lease answers POST /internal/budget/lease from store st.
func (k *Keeper) lease(ctx context.Context, st Store, body []byte) (any, error) {
	var req api.BudgetLeaseRequest
	if _, err := k.homed(body, &req, &req.Key); err != nil {
		return nil, err
	}
	if req.TTLMS < 1 || req.TTLMS > int64(time.Hour/time.Millisecond) || req.Total < 0 {
		return nil, model.Invalidf("ttl_ms must be 1..3600000 and total >= 0")
	}
	l, err := k.grantLocal(ctx, st, req)
	if err != nil {
		return nil, err
	}
	return api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder, Amount: l.Amount,
		CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS}, nil
}

// giveBack answers POST /internal/budget/return from store st.
func (k *Keeper) giveBack(ctx context.Context, st Store, body []byte) (any, error) {
	var req api.BudgetReturnRequest
	sh, err := k.homed(body, &req, &req.Key)
	if err != nil {
		return nil, err
	}
	if _, err := storage.ReturnLease(ctx, st, sh, req.LeaseID, req.Unspent); err != nil {
		return nil, err
	}
	return map[string]bool{"returned": true}, nil
}

// leases answers POST /internal/budget/leases from store st: the holder's
// open and expired leases of the key.
func (k *Keeper) leases(ctx context.Context, st Store, body []byte) (any, error) {
	var req api.BudgetLeasesRequest
	if _, err := k.homed(body, &req, &req.Key); err != nil {
		return nil, err
	}
	ls, err := k.localLeasesOf(ctx, st, req.Key, req.Holder)
	if err != nil {
		return nil, err
	}
	out := api.BudgetLeasesResponse{Leases: []api.BudgetLeaseState{}}
	for _, l := range ls {
		out.Leases = append(out.Leases, api.BudgetLeaseState{BudgetLease: api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder,
			Amount: l.Amount, CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS}, State: string(l.State)})
	}
	return out, nil
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
