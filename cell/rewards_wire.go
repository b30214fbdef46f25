package cell

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/admin"
	"redcell/cell/budgets"
	"redcell/cell/degrade"
	"redcell/cell/rewards"
	"redcell/cell/rewardtoken"
	"redcell/internal/clock"
	"redcell/storage"
)

// The rewards (Config.Activities, Config.RewardKeys) are cell/rewards'
// Issuer (its package comment tells how they work): New loads their files
// first (loadRewards), builds the Issuer here (newRewards), serves the
// reward routes through it (rewardRoute), hands its activities to the
// admin port (admin.Activities) and runs it (Serve).

// The rewards' parts as the cell wires them.
var (
	_ rewards.Budgets  = (*budgets.Keeper)(nil)
	_ rewards.Switches = (*degrade.Switches)(nil)
	_ rewards.Answers  = answers{}
	_ rewards.Peers    = Peers(nil)
	_ admin.Activities = (*rewards.Activities)(nil)
)

// loadRewards reads the reward activities and the token key file (the
// reads New does, first: a bad file stops the cell before anything is set
// up or joins); ring is nil without a key file. Errors: either file does
// not load.
func loadRewards(cfg Config, clk clock.Clock, log *slog.Logger) (*rewards.Activities, *rewardtoken.Ring, error) {
	acts, err := rewards.LoadActivities(cfg.Activities, clk, log)
	if err != nil {
		return nil, nil, fmt.Errorf("cell: %w", err)
	}
	var ring *rewardtoken.Ring
	if cfg.RewardKeys != "" {
		if ring, err = rewardtoken.LoadRing(cfg.RewardKeys); err != nil {
			return nil, nil, fmt.Errorf("cell: %w", err)
		}
	}
	return acts, ring, nil
}

// newRewards builds the cell's rewards over acts and ring, s's spaces,
// ownership, budget keeper, switches and committer, and registers their
// metrics with reg. s's spaces, answers, ownership, switches and budgets
// must be set.
func newRewards(s *Server, acts *rewards.Activities, ring *rewardtoken.Ring, reg *prometheus.Registry) *rewards.Issuer {
	var spaces [2]rewards.Space
	for i, sp := range s.spaces {
		spaces[i] = rewards.Space{Name: sp.name, Stress: sp.stress, Store: sp.store}
	}
	cfg := s.cfg
	return rewards.New(rewards.Config{Activities: acts, Ring: ring, Spaces: spaces,
		Own:     rewards.Ownership{Account: s.own.account, DBs: s.own.dbs, ServesDB: s.own.servesDB, Enter: s.own.enter},
		Budgets: s.budgets, Switches: s.switches, Peers: s.peers, Answers: s.answers, Reg: reg, Clock: s.clock, Log: s.log,
		TokenTTL: cfg.TokenTTL, CashMax: cfg.RewardCashMax, BookingRate: cfg.BookingRate, BookingBatch: cfg.BookingBatch,
		BookingInterval: cfg.BookingInterval, BookTimeout: txTimeout, IssuedMemcache: cfg.IssuedMemcache, SceneMemcache: cfg.SceneMemcache,
		Submit: func(ctx context.Context, space, db int, op storage.MoneyOp) error {
			return s.writer.submitStore(ctx, s.spaces[space], db, op)
		},
		SubmitTake: func(ctx context.Context, space, db int, op storage.MoneyOp) error {
			return s.writer.submit(ctx, s.spaces[space], db, op)
		}})
}

// rewardRoute serves the reward routes (cell/rewards).
func rewardRoute(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, rt api.RouteID, key string) {
	s.parts.rewards.Serve(ctx, rc, rt, sp.index(), key)
}
