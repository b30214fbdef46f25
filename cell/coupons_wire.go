package cell

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/admin"
	"redcell/cell/budgets"
	"redcell/cell/couponq"
	"redcell/cell/coupons"
	"redcell/cell/degrade"
	"redcell/storage"
)

// The coupon drop (Config.Coupons) is cell/coupons' Drop (its package
// comment tells how it works); the Server builds it here, serves the
// coupon routes through it (couponRoute), hands it to the admin port
// (admin.Coupons) and runs it (Serve).

// The drop's parts as the cell wires them.
var (
	_ coupons.Budgets = (*budgets.Keeper)(nil)
	_ coupons.Answers = answers{}
	_ coupons.Client  = (*cellclient.Client)(nil)
	_ admin.Coupons   = (*coupons.Drop)(nil)
)

// newCoupons builds the cell's coupon drop over s's spaces and stores,
// ownership, budget keeper and writer, calling other cells through calls.
// s's spaces, answers, ownership, switches, writer and budgets must be set.
// Errors: coupons.New's (an invalid batches file).
func newCoupons(s *Server, stores [2]couponq.Store, calls *cellclient.Client, reg *prometheus.Registry) (*coupons.Drop, error) {
	var spaces [2]coupons.Space
	for i, sp := range s.spaces {
		spaces[i] = coupons.Space{Name: sp.name, Stress: sp.stress, Store: sp.store, Coupons: stores[i]}
	}
	cfg := s.cfg
	return coupons.New(coupons.Config{Cell: cfg.Name, Path: cfg.Coupons, LeaseTTL: cfg.BudgetLeaseTTL, Spaces: spaces,
		Rates: cfg.CouponRates, QueueLen: cfg.CouponQueueLen, Gather: cfg.CouponGather, MergeMax: cfg.CouponMergeMax,
		Prefetch: int64(cfg.CouponPrefetch), StaleAfter: cfg.CouponStaleAfter, Memcache: cfg.CouponMemcache,
		Own: coupons.Ownership{Owns: s.own.owns, Check: s.own.check, Account: s.own.account, DBs: s.own.dbs,
			ServesDB: s.own.servesDB, Enter: s.own.enter},
		Budgets: s.budgets,
		Submit: func(ctx context.Context, space, db int, op storage.MoneyOp) error {
			return s.writer.submitStore(ctx, s.spaces[space], db, op)
		},
		Peers: s.peers, Client: calls, Answers: s.answers,
		Paused: func() bool { return s.switches.Off(degrade.CouponIssue) },
		Reg:    reg, Clock: s.clock, Log: s.log})
}

// couponRoute serves the coupon routes (cell/coupons); on a cell without
// coupons, COUPONS_DISABLED.
func couponRoute(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, rt api.RouteID, key string) {
	cp := s.parts.coupons
	if cp == nil {
		s.answers.err(rc, coupons.ErrDisabled)
		return
	}
	cp.Serve(ctx, rc, rt, sp.index(), key)
}
