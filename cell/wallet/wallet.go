// Package wallet is a cell's side of the reward wallet's routes: the wallet
// page of each stage, its flow, the rewards a person won, forced booking
// and withdrawals with their gray release (docs/rewards.md).
//
// A Teller is built from what it uses: each space's store (the wallet and
// reward queries of package storage), the cell's ownership of act_ids
// (Config.Account), the loaded activities (Config.Tree), the rewards' forced
// booking (Booker, cell/rewards.Issuer), the group committer's withdrawal
// (Config.Withdraw), the degrade switches (Switches), the cell's answer
// writer (Answers), a clock and a logger; it knows nothing of the cell's
// server. It serves the wallet routes (Serve) and the admin port's
// withdrawal release (admin.Withdrawals).
package wallet

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/degrade"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// Booker books a person's pending rewards now (cell/rewards.Issuer).
type Booker interface {
	// BookPending books every pending reward of actID, of shard sh, in
	// space (0 real, 1 shadow); n is how many it booked.
	BookPending(ctx context.Context, space int, sh model.ShardID, actID string) (n int, err error)
}

// Switches are the degrade switches (cell/degrade.Switches): the wallet
// reads degrade.WalletFlow.
type Switches interface {
	Off(sw degrade.Switch) bool
}

// Answers writes a route's answer: the cell's one answer writer, which
// names the cell in every answer and counts failures.
type Answers interface {
	// JSON answers status with v as its JSON body.
	JSON(rc *fasthttp.RequestCtx, status int, v any)
	// Error answers err with its code's status (api.WriteError).
	Error(rc *fasthttp.RequestCtx, err error)
}

// Config is what a Teller is built from. Every field is required but
// Clock (nil: the system clock).
type Config struct {
	// Stores read each space's wallets, flows, rewards and withdrawals
	// ([0] real money, [1] stress traffic).
	Stores [2]storage.Reader
	// Account validates an act_id and checks the cell serves its shard.
	// Errors: model.ErrInvalidArgument, model.ErrWrongCell, model.ErrMoving.
	Account func(actID string) (model.ShardID, error)
	// Tree is the loaded reward activities (nil: none loaded): the stage a
	// wallet request shows by default.
	Tree func() *activity.Tree
	// Booker books a person's pending rewards before a withdrawal.
	Booker Booker
	// Withdraw is storage.Withdraw through the account's commit lane in
	// space (0 real, 1 shadow; storage.WithdrawOp).
	Withdraw func(ctx context.Context, space int, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error)
	// Release is the gray release of withdrawals at start (the admin port
	// changes it: SetWithdrawRelease); it must pass ValidateRelease.
	Release  api.WithdrawRelease
	Switches Switches
	// Answers writes the answers of the wallet routes (Serve).
	Answers Answers
	Clock   clock.Clock
	Log     *slog.Logger
}

// Teller answers the wallet's routes and holds the withdrawals' gray
// release. Create it with New; its methods are safe for concurrent use.
type Teller struct {
	cfg     Config
	clock   clock.Clock
	release atomic.Pointer[api.WithdrawRelease]
}

// New builds a Teller; it does no I/O.
func New(cfg Config) *Teller {
	t := &Teller{cfg: cfg, clock: clock.Or(cfg.Clock)}
	rel := cfg.Release
	if rel.Allow == nil {
		rel.Allow = []string{} // GET /admin/withdraw answers a list, also when the config named none
	}
	t.release.Store(&rel)
	return t
}

// Serve answers a wallet route in space (0 real, 1 shadow) through
// Config.Answers; key is the route's act_id. The routes: api.RouteWallet
// (GET /v1/accounts/{act_id}/wallet[?stage=&parent_activity_id=]:
// api.WalletResponse), api.RouteFlow (GET .../flow[?stage=&cursor=&limit=]:
// api.FlowResponse), api.RouteRewards (GET
// .../rewards[?parent_activity_id=&stage=&cursor=&limit=]:
// api.RewardsResponse), api.RouteBook (POST .../book: api.BookResponse) and
// api.RouteWithdraw (POST .../withdraw: api.WithdrawRequest →
// api.WithdrawResponse). The caller has checked the call's signature, the
// rate limit and the space, and set ctx's deadline. Errors answered: each
// route's (below), and NOT_FOUND for any other route.
func (t *Teller) Serve(ctx context.Context, rc *fasthttp.RequestCtx, route api.RouteID, space int, actID string) {
	var out any
	var err error
	switch route {
	case api.RouteWallet:
		out, err = t.wallet(ctx, rc.QueryArgs(), space, actID)
	case api.RouteFlow:
		out, err = t.flow(ctx, rc.QueryArgs(), space, actID)
	case api.RouteRewards:
		out, err = t.rewardsOf(ctx, rc.QueryArgs(), space, actID)
	case api.RouteBook:
		out, err = t.forceBook(ctx, space, actID)
	case api.RouteWithdraw:
		out, err = t.withdraw(ctx, space, actID, rc.PostBody())
	default:
		err = model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path())
	}
	if err != nil {
		t.cfg.Answers.Error(rc, err)
		return
	}
	t.cfg.Answers.JSON(rc, http.StatusOK, out)
}

// released reports whether actID may withdraw (the gray release).
func (t *Teller) released(actID string) bool {
	rel := t.release.Load()
	if slices.Contains(rel.Allow, actID) {
		return true
	}
	return int(xxhash.Sum64String("withdraw/"+actID)%100) < rel.Percent
}

// WithdrawRelease implements admin.Withdrawals.
func (t *Teller) WithdrawRelease() api.WithdrawRelease { return *t.release.Load() }

// SetWithdrawRelease implements admin.Withdrawals. Errors:
// ErrInvalidArgument for a percent outside 0..100 or a bad act_id.
func (t *Teller) SetWithdrawRelease(r api.WithdrawRelease) (api.WithdrawRelease, error) {
	if err := ValidateRelease(r); err != nil {
		return api.WithdrawRelease{}, err
	}
	if r.Allow == nil {
		r.Allow = []string{}
	}
	t.release.Store(&r)
	t.cfg.Log.Info("withdrawal release changed", "percent", r.Percent, "allow", len(r.Allow))
	return r, nil
}

// ValidateRelease checks a gray release of withdrawals. Errors:
// ErrInvalidArgument for a percent outside 0..100 or a bad act_id.
func ValidateRelease(r api.WithdrawRelease) error {
	if r.Percent < 0 || r.Percent > 100 {
		return model.Invalidf("percent must be 0..100")
	}
	for _, a := range r.Allow {
		if err := model.ValidateActID(a); err != nil {
			return fmt.Errorf("allow: %w", err)
		}
	}
	return nil
}
