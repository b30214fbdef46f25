package cell

import (
	"context"
	"time"

	"redcell/api/cellclient"
	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/cell/budgets"
)

// The budgets of the scenes that control their stock and of the coupon
// batches' stock are cell/budgets' Keeper (its package comment tells how
// they work); the Server builds it here, serves its routes through it
// (serveRoute) and runs it (Serve).

// poolConfig is budgets.PoolConfig, for Config.Validate.
func poolConfig(ttl time.Duration) budget.Config { return budgets.PoolConfig(ttl) }

// newBudgets builds the cell's budget keeper over s's spaces, ownership,
// the activities' tree, rewards and coupons, calling other cells through
// calls. s's spaces, answers and ownership must be set; the rewards and
// the coupon drop may be set later (the keeper reads them at each call).
func newBudgets(s *Server, calls *cellclient.Client, tree func() *activity.Tree) *budgets.Keeper {
	var spaces [2]budgets.Space
	for i, sp := range s.spaces {
		spaces[i] = budgets.Space{Name: sp.name, Stress: sp.stress, Store: sp.store}
	}
	return budgets.New(budgets.Config{Cell: s.cfg.Name, LeaseTTL: s.cfg.BudgetLeaseTTL, Spaces: spaces,
		Owns: s.Owns, Check: s.own.check, Enter: s.own.enter, DBs: s.own.dbs, Peers: s.peers, Client: calls, Answers: s.answers,
		Tree: tree,
		// The rewards and the coupon drop are built after the keeper (the
		// rewards spend its leases): each call reads them (a nil drop: no
		// coupon drop, no stock).
		Issued:      func(key string) int64 { return s.parts.rewards.Issued(0, key) },
		CouponTotal: func(key string) (int64, bool) { return s.parts.coupons.StockTotal(key) },
		CouponKeys:  func() []string { return s.parts.coupons.StockKeys() },
		SettleMore:  func(ctx context.Context) { s.parts.coupons.SettleLeases(ctx) },
		Clock:       s.clock, Log: s.log})
}
