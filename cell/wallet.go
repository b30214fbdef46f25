package cell

// The reward wallet's routes: the wallet page, its flow and rewards, the
// withdrawals with their gray release, forced booking.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/model"
	"redcell/storage"
)

// currentStage is the stage a wallet request shows: ?stage=, else the stage
// of the child the time picks in ?parent_activity_id= (or the first parent
// activity), else official.
func (s *Server) currentStage(rc *fasthttp.RequestCtx) (string, error) {
	args := rc.QueryArgs()
	if st := string(args.Peek("stage")); st != "" {
		if !slices.Contains(activity.Stages, activity.Stage(st)) {
			return "", model.Invalidf("stage %q: must be test, gray or official", st)
		}
		return st, nil
	}
	t := s.acts.holder.Tree()
	if t == nil {
		return model.StageOfficial, nil
	}
	parent := string(args.Peek("parent_activity_id"))
	if parent == "" {
		ps := t.Parents()
		if len(ps) == 0 {
			return model.StageOfficial, nil
		}
		parent = ps[0].ID
	}
	if c := t.ChildAt(parent, s.clock.Now()); c != nil {
		return string(c.Stage), nil
	}
	return model.StageOfficial, nil
}

// wallet answers GET /v1/accounts/{act_id}/wallet.
func (s *Server) wallet(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	stage, err := s.currentStage(rc)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	sums, err := storage.RewardSums(ctx, sp.store, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	acct, err := storage.Account(ctx, sp.store, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	out := api.WalletResponse{ActID: actID, Stage: stage, FlowDegraded: s.switches.Off(degradeWalletFlow)}
	by := map[string]model.StageSums{}
	for _, x := range sums {
		by[x.Stage] = x
	}
	for _, st := range activity.Stages {
		x := by[string(st)]
		w := api.StageWallet{Stage: string(st), Balance: int64(x.Booked), Pending: int64(x.Pending), CumulativeIncome: int64(x.Income)}
		if st == activity.StageOfficial {
			w.Balance, w.Withdrawable = int64(acct.Balance), true
		}
		out.Stages = append(out.Stages, w)
		if string(st) == stage {
			out.Balance, out.Pending, out.CumulativeIncome = w.Balance, w.Pending, w.CumulativeIncome
		}
	}
	s.answers.json(rc, http.StatusOK, out)
}

// listArgs reads ?cursor= and ?limit= (1..100, default 20).
func listArgs(rc *fasthttp.RequestCtx) (model.FlowCursor, int, error) {
	args := rc.QueryArgs()
	cur, err := model.ParseFlowCursor(string(args.Peek("cursor")))
	if err != nil {
		return cur, 0, err
	}
	limit := 20
	if v := args.Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > 100 {
			return cur, 0, model.Invalidf("limit must be 1..100")
		}
		limit = n
	}
	return cur, limit, nil
}

// flowKinds names the flow kinds in the listing.
var flowKinds = map[model.FlowKind]string{
	model.FlowDeposit: "deposit", model.FlowSend: "send", model.FlowRefund: "refund", model.FlowCredit: "claim",
	model.FlowWithdraw: "withdraw", model.FlowReward: "reward",
}

// flow answers GET /v1/accounts/{act_id}/flow: the stage's rewards (from
// the reward rows, so a pending one is listed at its issue time and stays
// there when booked) merged with the wallet's other flows (official stage
// only), newest first.
func (s *Server) flow(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	if s.switches.Off(degradeWalletFlow) {
		s.answers.err(rc, model.Errorf(model.ErrDegraded, "the flow listing is switched off (degrade switch wallet_flow); the wallet's balance still answers"))
		return
	}
	stage, err := s.currentStage(rc)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	cur, limit, err := listArgs(rc)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	rs, err := storage.RewardsOf(ctx, sp.store, sh, actID, stage, cur, limit)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var fs []model.Flow
	if stage == model.StageOfficial {
		if fs, err = storage.FlowsOf(ctx, sp.store, sh, actID, cur, limit); err != nil {
			s.answers.err(rc, err)
			return
		}
	}
	out := api.FlowResponse{ActID: actID, Stage: stage, Items: make([]api.FlowItem, 0, limit)}
	for len(out.Items) < limit && (len(rs) > 0 || len(fs) > 0) {
		var it api.FlowItem
		useReward := len(fs) == 0 || len(rs) > 0 && (rs[0].CreatedMS > fs[0].CreatedMS ||
			rs[0].CreatedMS == fs[0].CreatedMS && rs[0].OrderNo > model.FlowItemID(fs[0].Seq))
		if useReward {
			r := rs[0]
			rs = rs[1:]
			amount := int64(r.Amount)
			it = api.FlowItem{ID: r.OrderNo, Kind: "reward", Amount: amount, Status: r.Status.String(), OrderNo: r.OrderNo,
				Ref: r.Scene, Stage: r.Stage, CreatedMS: r.CreatedMS}
			if !r.Cash() {
				it.Kind = "reward_" + r.AwardType
			}
		} else {
			f := fs[0]
			fs = fs[1:]
			it = api.FlowItem{ID: model.FlowItemID(f.Seq), Kind: flowKinds[f.Kind], Amount: int64(f.Amount), Status: "booked",
				OrderNo: f.OrderNo, Ref: f.Ref, Stage: model.StageOfficial, CreatedMS: f.CreatedMS}
		}
		out.Items = append(out.Items, it)
	}
	if n := len(out.Items); n == limit {
		out.NextCursor = model.FlowCursor{CreatedMS: out.Items[n-1].CreatedMS, ID: out.Items[n-1].ID}.String()
	}
	s.answers.json(rc, http.StatusOK, out)
}

// rewardsOf answers GET /v1/accounts/{act_id}/rewards: "did this person win
// in this activity" (?parent_activity_id=), newest first.
func (s *Server) rewardsOf(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	cur, limit, err := listArgs(rc)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	stage := string(rc.QueryArgs().Peek("stage"))
	parent := string(rc.QueryArgs().Peek("parent_activity_id"))
	out := api.RewardsResponse{ActID: actID, Rewards: []api.RewardItem{}}
	for len(out.Rewards) < limit {
		rs, err := storage.RewardsOf(ctx, sp.store, sh, actID, stage, cur, limit)
		if err != nil {
			s.answers.err(rc, err)
			return
		}
		for _, r := range rs {
			cur = model.FlowCursor{CreatedMS: r.CreatedMS, ID: r.OrderNo}
			if parent != "" && r.Parent != parent {
				continue
			}
			out.Rewards = append(out.Rewards, api.RewardItem{OrderNo: r.OrderNo, ParentActivityID: r.Parent, ChildActivityID: r.Child,
				Stage: r.Stage, SceneID: r.Scene, RainID: r.Rain, AwardType: r.AwardType, TemplateID: r.TemplateID,
				Amount: int64(r.Amount), Status: r.Status.String(), CreatedMS: r.CreatedMS, BookedMS: r.BookedMS})
			if len(out.Rewards) == limit {
				break
			}
		}
		if len(rs) < limit {
			cur = model.FlowCursor{}
			break
		}
	}
	if len(out.Rewards) == limit {
		out.NextCursor = cur.String()
	}
	s.answers.json(rc, http.StatusOK, out)
}

// released reports whether actID may withdraw (the gray release).
func (s *Server) released(actID string) bool {
	rel := s.rw.release.Load()
	if rel == nil {
		return false
	}
	if slices.Contains(rel.Allow, actID) {
		return true
	}
	return int(xxhash.Sum64String("withdraw/"+actID)%100) < rel.Percent
}

// forceBook answers POST /v1/accounts/{act_id}/book: the person's pending
// rewards of every stage are booked now, ahead of the booker (forced
// booking, as a withdrawal does first).
func (s *Server) forceBook(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	n, err := s.bookPendingOf(ctx, sp, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	a, err := storage.Account(ctx, sp.store, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, api.BookResponse{ActID: actID, BookedNow: n, Balance: int64(a.Balance)})
}

// withdraw answers POST /v1/accounts/{act_id}/withdraw.
func (s *Server) withdraw(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var req api.WithdrawRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if err := model.ValidateOrderNo(req.OrderNo); err != nil {
		s.answers.err(rc, err)
		return
	}
	if req.Amount < 1 || req.Amount > int64(MaxDeposit) {
		s.answers.err(rc, model.Invalidf("amount must be 1..%d cents", MaxDeposit))
		return
	}
	if req.Stage != "" && req.Stage != model.StageOfficial {
		s.answers.err(rc, model.Invalidf("stage %q: only the official stage's money can be withdrawn", req.Stage))
		return
	}
	if !s.released(actID) {
		// A retry of a withdrawal made while it was released answers its
		// first result, whatever the release says now.
		if w, found, err := storage.WithdrawalOf(ctx, sp.store, sh, actID, req.OrderNo); err != nil {
			s.answers.err(rc, err)
			return
		} else if found {
			if int64(w.Amount) != req.Amount {
				s.answers.err(rc, model.Errorf(model.ErrOrderConflict, "order_no %s was used with a different request", req.OrderNo))
				return
			}
			s.answers.json(rc, http.StatusOK, api.WithdrawResponse{ActID: w.ActID, OrderNo: w.OrderNo, Amount: int64(w.Amount),
				Balance: int64(w.Balance), Repeat: true})
			return
		}
		s.answers.err(rc, model.Errorf(model.ErrWithdrawNotReleased, "withdrawal is not released to %s yet (gray release)", actID))
		return
	}
	booked, err := s.bookPendingOf(ctx, sp, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	// After the booking has committed: the withdrawal sees what it booked.
	w, err := s.withdrawGrouped(ctx, sp, sh, actID, req.OrderNo, model.Cents(req.Amount))
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, api.WithdrawResponse{ActID: w.ActID, OrderNo: w.OrderNo, Amount: int64(w.Amount),
		Balance: int64(w.Balance), Repeat: w.Repeat, BookedNow: booked})
}

// WithdrawRelease implements admin.Withdrawals.
func (s *Server) WithdrawRelease() api.WithdrawRelease {
	if r := s.rw.release.Load(); r != nil {
		return *r
	}
	return api.WithdrawRelease{Allow: []string{}}
}

// SetWithdrawRelease implements admin.Withdrawals. Errors:
// ErrInvalidArgument for a percent outside 0..100 or a bad act_id.
func (s *Server) SetWithdrawRelease(r api.WithdrawRelease) (api.WithdrawRelease, error) {
	if err := validateRelease(r); err != nil {
		return api.WithdrawRelease{}, err
	}
	if r.Allow == nil {
		r.Allow = []string{}
	}
	s.rw.release.Store(&r)
	s.log.Info("withdrawal release changed", "percent", r.Percent, "allow", len(r.Allow))
	return r, nil
}

func validateRelease(r api.WithdrawRelease) error {
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
