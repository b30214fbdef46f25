package budgets

import (
	"context"
	"errors"
	"strings"
	"time"

	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Run returns expired leases' unspent parts once a second, and every 10 s
// marks the leases past their expiry of the budgets homed here expired and
// settles this cell's leases their homes marked expired (then
// Config.SettleMore). When ctx ends it returns every lease's unspent part
// (drain), waiting at most 5 s, and returns.
func (k *Keeper) Run(ctx context.Context) {
	// A ticker on the clock: a pass each second whatever the last took
	// (a sweep and a settle are not paused after).
	t := clock.NewTicker(k.clock, time.Second)
	for tick := 1; t.Wait(ctx); tick++ {
		for _, p := range k.pools {
			p.Sweep(ctx)
		}
		if tick%10 == 0 {
			k.settle(ctx)
		}
	}
	k.returnAll()
}

// returnAll returns every lease of the pools at drain, waiting at most 5 s.
func (k *Keeper) returnAll() {
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range k.pools {
		if err := p.ReturnAll(dctx); err != nil {
			msg := err.Error()
			if i := strings.IndexByte(msg, '\n'); i >= 0 {
				msg = msg[:i] + " (and more)"
			}
			k.cfg.Log.Warn("budget: leases not returned at drain; they expire at their homes", "first_err", msg)
		}
	}
}

// settle expires the leases homed here past their expiry, then settles this
// cell's reward leases and Config.SettleMore's.
func (k *Keeper) settle(ctx context.Context) {
	k.expireHomed(ctx)
	k.settleLeases(ctx)
	if k.cfg.SettleMore != nil {
		k.cfg.SettleMore(ctx)
	}
}

// Recover runs once when the cell starts: it sets the budgets homed here
// from the loaded activities (Sync), waits settleDelay (3 s) for the
// cluster map to list the other cells (the homes of budgets homed
// elsewhere), then expires and settles an earlier run's leases as Run does
// every 10 s. It returns early when ctx ends.
func (k *Keeper) Recover(ctx context.Context) {
	if t := k.cfg.Tree(); t != nil {
		k.Sync(t)
	}
	select {
	case <-ctx.Done():
		return
	case <-k.clock.After(settleDelay):
	}
	k.settle(ctx)
}

// Issued is activity.Issued for a reload's check: the most of what the
// scene's counter has seen (Config.Issued) and, for a budget homed here,
// what its leases hold or spent (never below what was issued); cents or
// pieces. A budget row it cannot read within 2 s counts the counter only.
func (k *Keeper) Issued(parent, child, scene string) int64 {
	key := model.BudgetKey(parent, child, scene)
	n := k.cfg.Issued(key)
	if sh := sharding.BudgetShard(key); k.cfg.Owns(sh) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if b, _, err := storage.Budget(ctx, k.cfg.Spaces[0].Store, sh, key); err == nil {
			n = max(n, b.Outstanding())
		}
	}
	return n
}

// Sync sets the budget rows this cell homes to t's totals, in both spaces;
// a total below what is out is refused by the store and logged (the
// reload's check refused such a file already). It waits at most 10 s in
// all.
func (k *Keeper) Sync(t *activity.Tree) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eachControlled(t, func(key string, sc *activity.Scene) {
		sh := sharding.BudgetShard(key)
		if !k.cfg.Owns(sh) {
			return
		}
		total := sc.Total()
		for _, sp := range k.cfg.Spaces {
			if _, err := storage.SetBudget(ctx, sp.Store, sh, key, total); err != nil {
				k.cfg.Log.Warn("budget: not set from the activities file", "key", key, "total", total, "space", sp.Name, "err", err)
			}
		}
	})
}

// eachControlled calls f with the budget key and the scene of each scene of
// t that controls its stock, in the file's order.
func eachControlled(t *activity.Tree, f func(key string, sc *activity.Scene)) {
	for _, p := range t.Parents() {
		for _, c := range p.Children {
			for _, r := range c.Rewards {
				for i := range r.Scenes {
					if sc := &r.Scenes[i]; sc.ControlStock {
						f(model.BudgetKey(p.ID, c.ID, sc.ID), sc)
					}
				}
			}
		}
	}
}

// controlledKeys lists the budget keys of the scenes of t that control
// their stock.
func controlledKeys(t *activity.Tree) []string {
	var keys []string
	eachControlled(t, func(key string, _ *activity.Scene) { keys = append(keys, key) })
	return keys
}

// settleLeases returns what this cell's leases that their homes marked
// expired did not spend, as the cell's reward rows tell (storage.LeaseSpent
// over its databases): a cell that died holding leases gives their rest back
// once it is up again, and one whose return at drain failed gives it back
// later. Only leases expired for SettleGrace are settled: a live pool spends
// a lease only before its TTL (the home expires it at the same TTL, from its
// own clock), and an issue writes its reward within a request's deadline of
// taking from it — so no lease still spent from, by this process or by an
// older one of the same name still draining, is settled. Leases it cannot
// reach now stay out (the budget under-issues by them) until a later pass.
func (k *Keeper) settleLeases(ctx context.Context) {
	t := k.cfg.Tree()
	if t == nil {
		return
	}
	dbs := k.cfg.DBs()
	for i, sp := range k.cfg.Spaces {
		for _, key := range controlledKeys(t) {
			k.SettleExpired(ctx, i, key, k.cfg.Cell, func(id string) (int64, error) { return storage.LeaseSpent(ctx, sp.Store, dbs, id) })
		}
	}
}

// SettleExpired settles holder's leases of budget key, as space (0 real, 1
// shadow) reaches their home, that the home marked expired SettleGrace ago
// or more: each returns what spent (cents or pieces issued from the lease
// ID) says it did not spend (budget.Settle). Leases it cannot list stay out
// until a later pass; the failure is logged as an incident, the outcome of
// a settlement in one line.
func (k *Keeper) SettleExpired(ctx context.Context, space int, key, holder string, spent func(leaseID string) (int64, error)) {
	sp := k.cfg.Spaces[space]
	ls, err := k.leasesOf(ctx, sp, key, holder)
	if err != nil {
		k.leaseList[space].Fail(err, "key", key, "holder", holder)
		return
	}
	k.leaseList[space].OK()
	var old []model.Lease
	cut := k.clock.Now().Add(-SettleGrace).UnixMilli()
	for _, l := range ls {
		if l.State == model.LeaseExpired && l.ExpiresMS <= cut {
			old = append(old, l)
		}
	}
	if len(old) == 0 {
		return
	}
	home := func(string) budget.Home { return k.Home(space) }
	n, err := budget.Settle(ctx, home, old, spent)
	k.cfg.Log.Info("budget: expired leases settled", "key", key, "holder", holder, "space", sp.Name, "leases", len(old), "returned", n, "err", err)
}

// expireHomed marks the leases past their expiry of the budgets homed here
// expired (they stay out: the holder may have spent any of them).
func (k *Keeper) expireHomed(ctx context.Context) {
	var keys []string
	if t := k.cfg.Tree(); t != nil {
		keys = controlledKeys(t)
	}
	if k.cfg.CouponKeys != nil {
		keys = append(keys, k.cfg.CouponKeys()...)
	}
	now := k.clock.Now().UnixMilli()
	failed := [2]bool{}
	for _, key := range keys {
		sh := sharding.BudgetShard(key)
		leave := k.cfg.Enter() // a write a move's freeze waits for, checked inside it
		if !k.cfg.Owns(sh) {
			leave()
			continue
		}
		for i, sp := range k.cfg.Spaces {
			if _, err := storage.ExpireLeases(ctx, sp.Store, sh, key, now); err != nil && !errors.Is(err, model.ErrNotFound) && ctx.Err() == nil {
				failed[i] = true
				k.leaseExp[i].Fail(err, "key", key)
			}
		}
		leave()
	}
	for i, f := range failed {
		if !f {
			k.leaseExp[i].OK()
		}
	}
}
