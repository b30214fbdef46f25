package rewards

// Reward tokens handed back by their clients: checked, and the rewards the
// cell does not hold restored.

import (
	"context"
	"errors"
	"net/http"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/degrade"
	"redcell/cell/rewardtoken"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/storage"
)

// tokens answers POST /v1/accounts/{act_id}/tokens: each token is checked
// (signature, key, expiry, owner); a valid one the cell has is "known"; a
// valid one it has lost is stored again and booked ("restored"), unless the
// token_restore degrade switch is off (refused TOKEN_RESTORE_OFF); any other
// is refused, and then the answer is 422 TOKEN_REFUSED listing each token
// (its code in api.HeaderCode, set here). Each refusal is counted by code
// (redcell_reward_tokens_refused_total).
func (i *Issuer) tokens(ctx context.Context, rc *fasthttp.RequestCtx, space int, actID string) (int, any, error) {
	sh, err := i.cfg.Own.Account(actID)
	if err != nil {
		return 0, nil, err
	}
	var req api.TokensRequest
	if err := strictjson.Decode(rc.PostBody(), &req); err != nil {
		return 0, nil, err
	}
	if len(req.Tokens) == 0 || len(req.Tokens) > api.MaxTokens {
		return 0, nil, model.Invalidf("tokens: 1..%d tokens", api.MaxTokens)
	}
	if i.cfg.Ring == nil {
		return 0, nil, model.Errorf(model.ErrNotFound, "this cell has no reward key file (reward_keys)")
	}
	sp := i.cfg.Spaces[space]
	out := api.TokensResponse{ActID: actID, Results: make([]api.TokenResult, 0, len(req.Tokens))}
	refused := 0
	refuse := func(n int, order, code, msg string) {
		refused++
		i.metrics.tokenRefused(sp.Name, code)
		out.Results = append(out.Results, api.TokenResult{Index: n, OrderNo: order, Result: "refused", Code: code, Message: msg})
	}
	for n, tok := range req.Tokens {
		c, err := i.cfg.Ring.Verify(tok, i.clock.Now(), i.cfg.TokenTTL)
		if err != nil {
			refuse(n, "", rewardtoken.Reason(err), err.Error())
			continue
		}
		if c.ActID != actID {
			refuse(n, c.OrderNo, tokenWrongAccount, "the token is another person's reward")
			continue
		}
		if want := tokenClaims(sp.Stress, model.Reward{}).Status; c.Status != want {
			refuse(n, c.OrderNo, tokenWrongSpace, "a stress-test token is taken back only from stress traffic, and the other way round")
			continue
		}
		prior, err := storage.Reward(ctx, sp.Store, sh, c.OrderNo)
		switch {
		case err == nil && c.Matches(prior):
			out.Results = append(out.Results, api.TokenResult{Index: n, OrderNo: c.OrderNo, Result: "known"})
		case err == nil:
			refuse(n, c.OrderNo, tokenMismatch, "the cell holds this order number with other fields")
		case errors.Is(err, model.ErrNotFound) && i.cfg.Switches.Off(degrade.TokenRestore):
			refuse(n, c.OrderNo, tokenRestoreOff, "restoring rewards from tokens is switched off (degrade switch token_restore)")
		case errors.Is(err, model.ErrNotFound):
			if err := i.restore(ctx, space, sh, c); errors.Is(err, model.ErrBudgetExhausted) {
				refuse(n, c.OrderNo, model.ErrBudgetExhausted.Code, "the scene's budget has nothing left for the restored reward")
				continue
			} else if err != nil {
				return 0, nil, err
			}
			i.metrics.restored.WithLabelValues(sp.Name).Inc()
			out.Results = append(out.Results, api.TokenResult{Index: n, OrderNo: c.OrderNo, Result: "restored"})
		default:
			return 0, nil, err
		}
	}
	if refused > 0 {
		_, msg := model.CodeOf(model.Errorf(model.ErrTokenRefused, "%d of %d tokens refused; see results", refused, len(req.Tokens)))
		out.Error = &api.ErrorDetail{Code: model.ErrTokenRefused.Code, Message: msg}
		rc.Response.Header.Set(api.HeaderCode, model.ErrTokenRefused.Code)
		return api.Status(model.ErrTokenRefused.Code), out, nil
	}
	return http.StatusOK, out, nil
}

// restore stores again, and books, a reward the cell lost whose valid
// token the client kept, spending a lease of its scene's budget as an issue
// does. The child is the parent's child of the token's stage. Errors:
// model.ErrBudgetExhausted, the store's.
func (i *Issuer) restore(ctx context.Context, space int, sh model.ShardID, c rewardtoken.Claims) error {
	actID, scene, rain, award, stage, err := model.ParseRewardOrderNo(c.OrderNo)
	if err != nil || actID != c.ActID || scene != c.Scene || rain != c.Rain || award != c.AwardType || stage != c.Stage {
		return model.Invalidf("token %s: its order number does not match its fields", c.OrderNo)
	}
	child := ""
	if t := i.acts.Tree(); t != nil {
		if ch := t.ChildOfStage(c.Parent, activity.Stage(c.Stage)); ch != nil {
			child = ch.ID
		}
	}
	r := model.Reward{OrderNo: c.OrderNo, ActID: c.ActID, Shard: sh, App: c.App, Parent: c.Parent, Child: child, Stage: c.Stage,
		Scene: c.Scene, Rain: c.Rain, AwardType: c.AwardType, TemplateID: c.TemplateID, Amount: model.Cents(c.Amount),
		CreatedMS: c.IssuedMS}
	// A scene that controls its stock spends a lease for the restored
	// reward too: the rows that lost it may have made its first lease's
	// settlement give its amount back (counting it twice at worst is an
	// under-issue, never an over-issue).
	key := model.BudgetKey(c.Parent, child, c.Scene)
	if total, ok := i.cfg.Budgets.SceneTotal(key); ok {
		if r.LeaseID, err = i.cfg.Budgets.Pool(space).Take(ctx, key, total, c.Amount); err != nil {
			return err
		}
	}
	got, _, err := i.signAndStore(ctx, space, key, r)
	if err != nil {
		return err
	}
	_, err = i.book(ctx, space, []model.Reward{got})
	return err
}
