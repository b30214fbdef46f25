package cell

import (
	"context"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/admin"
	"redcell/cell/degrade"
	"redcell/cell/rewards"
	"redcell/cell/wallet"
	"redcell/model"
	"redcell/storage"
)

// The reward wallet's routes (the wallet page, its flow, the rewards list,
// forced booking, withdrawals) are cell/wallet's Teller (its package
// comment tells what each does); the Server builds it here, serves the
// wallet routes through it (walletRoute) and hands it to the admin port
// (admin.Withdrawals).

// The wallet's parts as the cell wires them.
var (
	_ wallet.Booker     = (*rewards.Issuer)(nil)
	_ wallet.Switches   = (*degrade.Switches)(nil)
	_ wallet.Answers    = answers{}
	_ admin.Withdrawals = (*wallet.Teller)(nil)
)

// newWallet builds the cell's teller over s's spaces, ownership, rewards,
// switches and committer, with the release of withdrawals of s's config.
// s's spaces, answers, ownership, switches and rewards must be set.
func newWallet(s *Server, tree func() *activity.Tree) *wallet.Teller {
	return wallet.New(wallet.Config{Stores: [2]storage.Reader{s.spaces[0].store, s.spaces[1].store}, Account: s.own.account,
		Tree: tree, Booker: s.parts.rewards, Release: s.cfg.WithdrawRelease, Switches: s.switches, Answers: s.answers, Clock: s.clock, Log: s.log,
		Withdraw: func(ctx context.Context, space int, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error) {
			return s.writer.withdrawGrouped(ctx, s.spaces[space], sh, actID, orderNo, amount)
		}})
}

// walletRoute serves the wallet routes (cell/wallet).
func walletRoute(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, rt api.RouteID, key string) {
	s.parts.wallet.Serve(ctx, rc, rt, sp.index(), key)
}
