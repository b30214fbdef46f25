package wallet

import (
	"context"
	"slices"
	"strconv"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/degrade"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/storage"
)

// currentStage is the stage a wallet request shows: ?stage=, else the stage
// of the child the time picks in ?parent_activity_id= (or the first parent
// activity), else official.
func (t *Teller) currentStage(args *fasthttp.Args) (string, error) {
	if st := string(args.Peek("stage")); st != "" {
		if !slices.Contains(activity.Stages, activity.Stage(st)) {
			return "", model.Invalidf("stage %q: must be test, gray or official", st)
		}
		return st, nil
	}
	tree := t.cfg.Tree()
	if tree == nil {
		return model.StageOfficial, nil
	}
	parent := string(args.Peek("parent_activity_id"))
	if parent == "" {
		ps := tree.Parents()
		if len(ps) == 0 {
			return model.StageOfficial, nil
		}
		parent = ps[0].ID
	}
	if c := tree.ChildAt(parent, t.clock.Now()); c != nil {
		return string(c.Stage), nil
	}
	return model.StageOfficial, nil
}

// wallet answers GET /v1/accounts/{act_id}/wallet.
func (t *Teller) wallet(ctx context.Context, args *fasthttp.Args, space int, actID string) (any, error) {
	sh, err := t.cfg.Account(actID)
	if err != nil {
		return nil, err
	}
	stage, err := t.currentStage(args)
	if err != nil {
		return nil, err
	}
	st := t.cfg.Stores[space]
	sums, err := storage.RewardSums(ctx, st, sh, actID)
	if err != nil {
		return nil, err
	}
	acct, err := storage.Account(ctx, st, sh, actID)
	if err != nil {
		return nil, err
	}
	out := api.WalletResponse{ActID: actID, Stage: stage, FlowDegraded: t.cfg.Switches.Off(degrade.WalletFlow)}
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
	return out, nil
}

// listArgs reads ?cursor= and ?limit= (1..100, default 20).
func listArgs(args *fasthttp.Args) (model.FlowCursor, int, error) {
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
func (t *Teller) flow(ctx context.Context, args *fasthttp.Args, space int, actID string) (any, error) {
	sh, err := t.cfg.Account(actID)
	if err != nil {
		return nil, err
	}
	if t.cfg.Switches.Off(degrade.WalletFlow) {
		return nil, model.Errorf(model.ErrDegraded, "the flow listing is switched off (degrade switch wallet_flow); the wallet's balance still answers")
	}
	stage, err := t.currentStage(args)
	if err != nil {
		return nil, err
	}
	cur, limit, err := listArgs(args)
	if err != nil {
		return nil, err
	}
	st := t.cfg.Stores[space]
	rs, err := storage.RewardsOf(ctx, st, sh, actID, stage, cur, limit)
	if err != nil {
		return nil, err
	}
	var fs []model.Flow
	if stage == model.StageOfficial {
		if fs, err = storage.FlowsOf(ctx, st, sh, actID, cur, limit); err != nil {
			return nil, err
		}
	}
	return mergeFlow(actID, stage, limit, rs, fs), nil
}

// mergeFlow is the flow listing of rs (reward rows) and fs (the wallet's
// flows), each newest first: at most limit items, newest first, and the
// cursor of the next page when it is full.
func mergeFlow(actID, stage string, limit int, rs []model.Reward, fs []model.Flow) api.FlowResponse {
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
	return out
}

// rewardsOf answers GET /v1/accounts/{act_id}/rewards: "did this person win
// in this activity" (?parent_activity_id=), newest first.
func (t *Teller) rewardsOf(ctx context.Context, args *fasthttp.Args, space int, actID string) (any, error) {
	sh, err := t.cfg.Account(actID)
	if err != nil {
		return nil, err
	}
	cur, limit, err := listArgs(args)
	if err != nil {
		return nil, err
	}
	stage := string(args.Peek("stage"))
	parent := string(args.Peek("parent_activity_id"))
	out := api.RewardsResponse{ActID: actID, Rewards: []api.RewardItem{}}
	for len(out.Rewards) < limit {
		rs, err := storage.RewardsOf(ctx, t.cfg.Stores[space], sh, actID, stage, cur, limit)
		if err != nil {
			return nil, err
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
	return out, nil
}

// forceBook answers POST /v1/accounts/{act_id}/book: the person's pending
// rewards of every stage are booked now, ahead of the booker (forced
// booking, as a withdrawal does first).
func (t *Teller) forceBook(ctx context.Context, space int, actID string) (any, error) {
	sh, err := t.cfg.Account(actID)
	if err != nil {
		return nil, err
	}
	n, err := t.cfg.Booker.BookPending(ctx, space, sh, actID)
	if err != nil {
		return nil, err
	}
	a, err := storage.Account(ctx, t.cfg.Stores[space], sh, actID)
	if err != nil {
		return nil, err
	}
	return api.BookResponse{ActID: actID, BookedNow: n, Balance: int64(a.Balance)}, nil
}

// withdraw answers POST /v1/accounts/{act_id}/withdraw.
func (t *Teller) withdraw(ctx context.Context, space int, actID string, body []byte) (any, error) {
	sh, err := t.cfg.Account(actID)
	if err != nil {
		return nil, err
	}
	var req api.WithdrawRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, err
	}
	if err := model.ValidateOrderNo(req.OrderNo); err != nil {
		return nil, err
	}
	if req.Amount < 1 || req.Amount > int64(api.MaxDeposit) {
		return nil, model.Invalidf("amount must be 1..%d cents", api.MaxDeposit)
	}
	if req.Stage != "" && req.Stage != model.StageOfficial {
		return nil, model.Invalidf("stage %q: only the official stage's money can be withdrawn", req.Stage)
	}
	if !t.released(actID) {
		return t.unreleased(ctx, space, sh, actID, req)
	}
	booked, err := t.cfg.Booker.BookPending(ctx, space, sh, actID)
	if err != nil {
		return nil, err
	}
	// After the booking has committed: the withdrawal sees what it booked.
	w, err := t.cfg.Withdraw(ctx, space, sh, actID, req.OrderNo, model.Cents(req.Amount))
	if err != nil {
		return nil, err
	}
	return api.WithdrawResponse{ActID: w.ActID, OrderNo: w.OrderNo, Amount: int64(w.Amount),
		Balance: int64(w.Balance), Repeat: w.Repeat, BookedNow: booked}, nil
}

// unreleased answers a withdrawal of a person the gray release does not
// let withdraw now: a retry of a withdrawal made while it was released
// answers its first result, whatever the release says now; any other is
// WITHDRAW_NOT_RELEASED.
func (t *Teller) unreleased(ctx context.Context, space int, sh model.ShardID, actID string, req api.WithdrawRequest) (any, error) {
	w, found, err := storage.WithdrawalOf(ctx, t.cfg.Stores[space], sh, actID, req.OrderNo)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, model.Errorf(model.ErrWithdrawNotReleased, "withdrawal is not released to %s yet (gray release)", actID)
	case int64(w.Amount) != req.Amount:
		return nil, model.Errorf(model.ErrOrderConflict, "order_no %s was used with a different request", req.OrderNo)
	}
	return api.WithdrawResponse{ActID: w.ActID, OrderNo: w.OrderNo, Amount: int64(w.Amount),
		Balance: int64(w.Balance), Repeat: true}, nil
}
