package cell

import (
	"context"
	"time"

	"redcell/api/cellclient"
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
// activities and coupons, calling other cells through calls. s's spaces,
// answers, ownership and activities must be set; the coupon drop may be set
// later (the keeper reads it at each call).
func newBudgets(s *Server, calls *cellclient.Client) *budgets.Keeper {
	var spaces [2]budgets.Space
	for i, sp := range s.spaces {
		spaces[i] = budgets.Space{Name: sp.name, Stress: sp.stress, Store: sp.store}
	}
	return budgets.New(budgets.Config{Cell: s.cfg.Name, LeaseTTL: s.cfg.BudgetLeaseTTL, Spaces: spaces,
		Owns: s.Owns, Check: s.own.check, Enter: s.own.enter, DBs: s.own.dbs, Peers: s.peers, Client: calls, Answers: s.answers,
		Tree:   s.acts.holder.Tree,
		Issued: func(key string) int64 { return s.issuedCounter(s.spaces[0], key).Read() },
		// The coupon drop is built after the keeper: each call reads it (nil:
		// no coupon drop, no stock).
		CouponTotal: func(key string) (int64, bool) { return s.parts.coupons.StockTotal(key) },
		CouponKeys:  func() []string { return s.parts.coupons.StockKeys() },
		SettleMore:  func(ctx context.Context) { s.parts.coupons.SettleLeases(ctx) },
		Clock:       s.clock, Log: s.log})
}
