package cell

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Budgets of the scenes that control their stock (cell/budget). A scene's
// budget row lives in its home shard (sharding.BudgetShard of
// parent/child/scene); the cell owning that shard is the scene's home. Each
// space of each cell holds a budget.Pool: it spends leases taken from the
// homes — from its own store when it owns the home shard, else over
// POST /internal/budget/lease from the owner — and gives back what is left
// when a lease expires (Sweep, once a second) or the cell drains.

// budgetHome is the Home of a key as space sp of this cell reaches it.
type budgetHome struct {
	s   *Server
	sp  *space
	key string
	cc  *cellclient.Client
}

func (s *Server) newPool(sp *space, cc *cellclient.Client) *budget.Pool {
	cfg := poolConfig(s.cfg.BudgetLeaseTTL)
	cfg.Reserve = s.sceneReserve
	return budget.NewPool(s.cfg.Name, func(key string) budget.Home { return budgetHome{s: s, sp: sp, key: key, cc: cc} }, s.clock, cfg)
}

// sceneReserve is budget.Config.Reserve: the reserve_percent of the scene
// key names in the loaded activities (a reload counts from the next lease),
// or the default share when the scene is gone from the file.
func (s *Server) sceneReserve(key string, total int64) int64 {
	if t := s.acts.holder.Tree(); t != nil {
		if sc := t.SceneByKey(key); sc != nil {
			return sc.Reserve(total)
		}
	}
	return (&activity.Scene{}).Reserve(total)
}

// poolConfig is the lease pool's configuration for a lease TTL (0: the
// default): a lease's fetch is bounded by half its life at most.
func poolConfig(ttl time.Duration) budget.Config {
	c := budget.Config{TTL: ttl}
	if ttl > 0 {
		c.FetchTimeout = min(budget.DefaultConfig().FetchTimeout, ttl/2)
	}
	return c
}

// settleGrace is how long past its expiry a lease is settled: longer than a
// request's deadline and the clocks' skew between cells.
const settleGrace = 10 * time.Second

// Grant implements budget.Home. The asking cell's total makes the row when
// the home has none (its activities file may not be loaded yet, or the
// scene was just added): the home row is then set from the file that
// issues against it.
func (h budgetHome) Grant(ctx context.Context, key, holder string, want, reserve int64, ttl time.Duration) (model.Lease, error) {
	total, ok := h.s.sceneTotal(key)
	if !ok {
		total, ok = h.s.couponTotal(key)
	}
	if !ok {
		return model.Lease{}, model.Errorf(model.ErrNotFound, "no scene or coupon batch controls budget %s in this cell's files", key)
	}
	sh := sharding.BudgetShard(key)
	if h.s.Owns(sh) {
		return h.s.grantLocal(ctx, h.sp.store, api.BudgetLeaseRequest{Key: key, Holder: holder, Want: want, Reserve: reserve,
			TTLMS: ttl.Milliseconds(), Total: total})
	}
	owner, err := h.s.ownerOf(sh)
	if err != nil {
		return model.Lease{}, err
	}
	var out api.BudgetLease
	err = h.cc.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetLeasePath, Stress: h.sp.stress,
		Body: api.BudgetLeaseRequest{Key: key, Holder: holder, Want: want, Reserve: reserve, TTLMS: ttl.Milliseconds(), Total: total}, Out: &out})
	if err != nil {
		return model.Lease{}, err
	}
	return model.Lease{ID: out.ID, Key: out.Key, Holder: out.Holder, Amount: out.Amount, State: model.LeaseOpen,
		CreatedMS: out.CreatedMS, ExpiresMS: out.ExpiresMS}, nil
}

// Return implements budget.Home.
func (h budgetHome) Return(ctx context.Context, key, leaseID string, unspent int64) error {
	sh := sharding.BudgetShard(key)
	if h.s.Owns(sh) {
		_, err := storage.ReturnLease(ctx, h.sp.store, sh, leaseID, unspent)
		return err
	}
	owner, err := h.s.ownerOf(sh)
	if err != nil {
		return err
	}
	return h.cc.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetReturnPath, Stress: h.sp.stress,
		Body: api.BudgetReturnRequest{Key: key, LeaseID: leaseID, Unspent: unspent}})
}

// ownerOf is the address of the live cell owning shard sh.
func (s *Server) ownerOf(sh model.ShardID) (string, error) {
	if s.peers != nil {
		if m := s.peers.Map(); m != nil {
			if c, ok := m.Owner(sh); ok {
				return c.Addr, nil
			}
		}
	}
	return "", model.Errorf(model.ErrCellUnavailable, "no live cell owns shard %d (a budget's home)", sh)
}

// sceneTotal is the budget (cash) or stock (coupon kinds) of the scene key
// names in the loaded activities.
func (s *Server) sceneTotal(key string) (int64, bool) {
	t := s.acts.holder.Tree()
	if t == nil {
		return 0, false
	}
	sc := t.SceneByKey(key)
	if sc == nil || !sc.ControlStock {
		return 0, false
	}
	return sc.Total(), true
}

// grantLocal grants a lease from this cell's own budget row, making the row
// from req.Total when it has none.
func (s *Server) grantLocal(ctx context.Context, st storage.Store, req api.BudgetLeaseRequest) (model.Lease, error) {
	sh := sharding.BudgetShard(req.Key)
	expires := s.clock.Now().Add(time.Duration(req.TTLMS) * time.Millisecond).UnixMilli()
	l, err := storage.GrantLease(ctx, st, sh, req.Key, req.Holder, req.Want, req.Reserve, expires)
	if errors.Is(err, model.ErrNotFound) {
		if _, err := storage.SetBudget(ctx, st, sh, req.Key, req.Total); err != nil {
			return model.Lease{}, err
		}
		l, err = storage.GrantLease(ctx, st, sh, req.Key, req.Holder, req.Want, req.Reserve, expires)
	}
	return l, err
}

// homeShard is the home shard of budget key when this cell owns it.
// Errors: ErrInvalidArgument (a malformed key), ErrWrongCell, ErrMoving.
func (s *Server) homeShard(key string) (model.ShardID, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return 0, err
	}
	sh := sharding.BudgetShard(key)
	if err := s.own.check(sh); err != nil {
		return 0, err
	}
	return sh, nil
}

// budgetLease answers POST /internal/budget/lease for a budget homed here.
func (s *Server) budgetLease(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var req api.BudgetLeaseRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if _, err := s.homeShard(req.Key); err != nil {
		s.answers.err(rc, err)
		return
	}
	if req.TTLMS < 1 || req.TTLMS > int64(time.Hour/time.Millisecond) || req.Total < 0 {
		s.answers.err(rc, model.Invalidf("ttl_ms must be 1..3600000 and total >= 0"))
		return
	}
	l, err := s.grantLocal(ctx, sp.store, req)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder, Amount: l.Amount,
		CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS})
}

// budgetReturn answers POST /internal/budget/return for a budget homed here.
func (s *Server) budgetReturn(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var req api.BudgetReturnRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	sh, err := s.homeShard(req.Key)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	if _, err := storage.ReturnLease(ctx, sp.store, sh, req.LeaseID, req.Unspent); err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, map[string]bool{"returned": true})
}

// runBudgetSweep returns expired leases' unspent parts once a second, and
// every lease's when the cell stops (drain).
func (s *Server) runBudgetSweep(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	tick := 0
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, p := range s.pools {
				if err := p.ReturnAll(dctx); err != nil {
					msg := err.Error()
					if i := strings.IndexByte(msg, '\n'); i >= 0 {
						msg = msg[:i] + " (and more)"
					}
					s.log.Warn("budget: leases not returned at drain; they expire at their homes", "first_err", msg)
				}
			}
			return
		case <-t.C:
			for _, p := range s.pools {
				p.Sweep(ctx)
			}
			if tick++; tick%10 == 0 {
				s.expireHomedLeases(ctx)
				s.settleLeases(ctx)
				s.settleCouponLeases(ctx)
			}
		}
	}
}

// sceneIssued is activity.Issued for a reload's check: the most of what the
// scene's counter has seen and, for a budget homed here, what its leases
// hold or spent (never below what was issued).
func (s *Server) sceneIssued(parent, child, scene string) int64 {
	key := model.BudgetKey(parent, child, scene)
	n := s.issuedCounter(s.spaces[0], key).Read()
	if sh := sharding.BudgetShard(key); s.Owns(sh) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if b, _, err := storage.Budget(ctx, s.spaces[0].store, sh, key); err == nil {
			n = max(n, b.Outstanding())
		}
	}
	return n
}

// syncBudgets sets the budget rows this cell homes to the loaded file's
// totals, in both spaces; a total below what is out is refused by the store
// and logged (the reload's check refused such a file already).
func (s *Server) syncBudgets(t *activity.Tree) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range t.Parents() {
		for _, c := range p.Children {
			for _, r := range c.Rewards {
				for _, sc := range r.Scenes {
					if !sc.ControlStock {
						continue
					}
					key := model.BudgetKey(p.ID, c.ID, sc.ID)
					sh := sharding.BudgetShard(key)
					if !s.Owns(sh) {
						continue
					}
					total := sc.Budget
					if sc.AwardType != activity.AwardCash {
						total = sc.Stock
					}
					for _, sp := range s.spaces {
						if _, err := storage.SetBudget(ctx, sp.store, sh, key, total); err != nil {
							s.log.Warn("budget: not set from the activities file", "key", key, "total", total, "space", sp.name, "err", err)
						}
					}
				}
			}
		}
	}
}

// budgetLeases answers POST /internal/budget/leases for a budget homed here:
// the holder's open and expired leases of the key.
func (s *Server) budgetLeases(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var req api.BudgetLeasesRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if _, err := s.homeShard(req.Key); err != nil {
		s.answers.err(rc, err)
		return
	}
	ls, err := s.localLeasesOf(ctx, sp, req.Key, req.Holder)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	out := api.BudgetLeasesResponse{Leases: []api.BudgetLeaseState{}}
	for _, l := range ls {
		out.Leases = append(out.Leases, api.BudgetLeaseState{BudgetLease: api.BudgetLease{ID: l.ID, Key: l.Key, Holder: l.Holder,
			Amount: l.Amount, CreatedMS: l.CreatedMS, ExpiresMS: l.ExpiresMS}, State: string(l.State)})
	}
	s.answers.json(rc, http.StatusOK, out)
}

// localLeasesOf lists holder's open and expired leases of key, homed here.
func (s *Server) localLeasesOf(ctx context.Context, sp *space, key, holder string) ([]model.Lease, error) {
	all, err := storage.LeasesOf(ctx, sp.store, sharding.BudgetShard(key), holder)
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

// leasesOf lists holder's leases of key at its home, wherever that is:
// holder is this cell's name for reward leases, couponHolder for coupon
// deductions.
func (s *Server) leasesOf(ctx context.Context, sp *space, cc *cellclient.Client, key, holder string) ([]model.Lease, error) {
	sh := sharding.BudgetShard(key)
	if s.Owns(sh) {
		return s.localLeasesOf(ctx, sp, key, holder)
	}
	owner, err := s.ownerOf(sh)
	if err != nil {
		return nil, err
	}
	var out api.BudgetLeasesResponse
	if err := cc.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetLeasesPath, Stress: sp.stress,
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

// controlledKeys lists the budget keys of the scenes of t that control
// their stock.
func controlledKeys(t *activity.Tree) []string {
	var keys []string
	for _, p := range t.Parents() {
		for _, c := range p.Children {
			for _, r := range c.Rewards {
				for _, sc := range r.Scenes {
					if sc.ControlStock {
						keys = append(keys, model.BudgetKey(p.ID, c.ID, sc.ID))
					}
				}
			}
		}
	}
	return keys
}

// settleLeases returns what this cell's leases that their homes marked
// expired did not spend, as the cell's reward rows tell (storage.LeaseSpent
// over its databases): a cell that died holding leases gives their rest back
// once it is up again, and one whose return at drain failed gives it back
// later. Only leases expired for settleGrace are settled: a live pool spends
// a lease only before its TTL (the home expires it at the same TTL, from its
// own clock), and an issue writes its reward within a request's deadline of
// taking from it — so no lease still spent from, by this process or by an
// older one of the same name still draining, is settled. Leases it cannot
// reach now stay out (the budget under-issues by them) until a later pass.
func (s *Server) settleLeases(ctx context.Context) {
	t := s.acts.holder.Tree()
	if t == nil {
		return
	}
	dbs := s.own.dbs()
	for _, sp := range s.spaces {
		for _, key := range controlledKeys(t) {
			s.settleExpired(ctx, sp, key, s.cfg.Name, func(id string) (int64, error) { return storage.LeaseSpent(ctx, sp.store, dbs, id) })
		}
	}
}

// settleExpired settles holder's leases of key that their home marked
// expired settleGrace ago or more: each returns what spent says it did not
// spend (budget.Settle). Leases it cannot list stay out until a later pass.
func (s *Server) settleExpired(ctx context.Context, sp *space, key, holder string, spent func(leaseID string) (int64, error)) {
	ls, err := s.leasesOf(ctx, sp, s.calls, key, holder)
	if err != nil {
		s.inc.leaseList[sp.index()].Fail(err, "key", key, "holder", holder)
		return
	}
	s.inc.leaseList[sp.index()].OK()
	var old []model.Lease
	cut := s.clock.Now().Add(-settleGrace).UnixMilli()
	for _, l := range ls {
		if l.State == model.LeaseExpired && l.ExpiresMS <= cut {
			old = append(old, l)
		}
	}
	if len(old) == 0 {
		return
	}
	home := func(string) budget.Home { return budgetHome{s: s, sp: sp, key: key, cc: s.calls} }
	n, err := budget.Settle(ctx, home, old, spent)
	s.log.Info("budget: expired leases settled", "key", key, "holder", holder, "space", sp.name, "leases", len(old), "returned", n, "err", err)
}

// expireHomedLeases marks the leases past their expiry of the budgets homed
// here expired (they stay out: the holder may have spent any of them).
func (s *Server) expireHomedLeases(ctx context.Context) {
	var keys []string
	if t := s.acts.holder.Tree(); t != nil {
		keys = controlledKeys(t)
	}
	keys = append(keys, s.couponKeys()...)
	now := s.clock.Now().UnixMilli()
	failed := [2]bool{}
	for _, key := range keys {
		sh := sharding.BudgetShard(key)
		leave := s.own.enter() // a write a move's freeze waits for, checked inside it
		if !s.Owns(sh) {
			leave()
			continue
		}
		for i, sp := range s.spaces {
			if _, err := storage.ExpireLeases(ctx, sp.store, sh, key, now); err != nil && !errors.Is(err, model.ErrNotFound) && ctx.Err() == nil {
				failed[i] = true
				s.inc.leaseExp[i].Fail(err, "key", key)
			}
		}
		leave()
	}
	for i, f := range failed {
		if !f {
			s.inc.leaseExp[i].OK()
		}
	}
}
