package cell

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
	"redcell/model"
	"redcell/storage"
)

// tokens answers POST /v1/accounts/{act_id}/tokens: each token is checked
// (signature, key, expiry, owner); a valid one the cell has is "known"; a
// valid one it has lost is stored again and booked ("restored"), unless the
// token_restore degrade switch is off (refused TOKEN_RESTORE_OFF); any other
// is refused, and then the answer is 422 TOKEN_REFUSED listing each token.
// Each refusal is counted by code (redcell_reward_tokens_refused_total).
func (s *Server) tokens(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var req api.TokensRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if len(req.Tokens) == 0 || len(req.Tokens) > api.MaxTokens {
		s.answers.err(rc, model.Invalidf("tokens: 1..%d tokens", api.MaxTokens))
		return
	}
	ring := s.rw.ring.Load()
	if ring == nil {
		s.answers.err(rc, model.Errorf(model.ErrNotFound, "this cell has no reward key file (reward_keys)"))
		return
	}
	out := api.TokensResponse{ActID: actID, Results: make([]api.TokenResult, 0, len(req.Tokens))}
	refused := 0
	refuse := func(i int, order, code, msg string) {
		refused++
		s.rwMetrics.tokenRefused(sp, code)
		out.Results = append(out.Results, api.TokenResult{Index: i, OrderNo: order, Result: "refused", Code: code, Message: msg})
	}
	for i, tok := range req.Tokens {
		c, err := ring.Verify(tok, s.clock.Now(), s.cfg.TokenTTL)
		if err != nil {
			refuse(i, "", rewardtoken.Reason(err), err.Error())
			continue
		}
		if c.ActID != actID {
			refuse(i, c.OrderNo, tokenWrongAccount, "the token is another person's reward")
			continue
		}
		if want := tokenClaims(sp, model.Reward{}).Status; c.Status != want {
			refuse(i, c.OrderNo, tokenWrongSpace, "a stress-test token is taken back only from stress traffic, and the other way round")
			continue
		}
		prior, err := storage.Reward(ctx, sp.store, sh, c.OrderNo)
		switch {
		case err == nil && c.Matches(prior):
			out.Results = append(out.Results, api.TokenResult{Index: i, OrderNo: c.OrderNo, Result: "known"})
		case err == nil:
			refuse(i, c.OrderNo, tokenMismatch, "the cell holds this order number with other fields")
		case errors.Is(err, model.ErrNotFound) && s.switches.Off(degrade.TokenRestore):
			refuse(i, c.OrderNo, tokenRestoreOff, "restoring rewards from tokens is switched off (degrade switch token_restore)")
		case errors.Is(err, model.ErrNotFound):
			if err := s.restoreReward(ctx, sp, sh, c); errors.Is(err, model.ErrBudgetExhausted) {
				refuse(i, c.OrderNo, model.ErrBudgetExhausted.Code, "the scene's budget has nothing left for the restored reward")
				continue
			} else if err != nil {
				s.answers.err(rc, err)
				return
			}
			s.rwMetrics.restored.WithLabelValues(sp.name).Inc()
			out.Results = append(out.Results, api.TokenResult{Index: i, OrderNo: c.OrderNo, Result: "restored"})
		default:
			s.answers.err(rc, err)
			return
		}
	}
	if refused > 0 {
		_, msg := model.CodeOf(model.Errorf(model.ErrTokenRefused, "%d of %d tokens refused; see results", refused, len(req.Tokens)))
		out.Error = &api.ErrorDetail{Code: model.ErrTokenRefused.Code, Message: msg}
		rc.Response.Header.Set(api.HeaderCode, model.ErrTokenRefused.Code)
		s.answers.json(rc, api.Status(model.ErrTokenRefused.Code), out)
		return
	}
	s.answers.json(rc, http.StatusOK, out)
}

// restoreReward stores again, and books, a reward the cell lost whose valid
// token the client kept, spending a lease of its scene's budget as an issue
// does. The child is the parent's child of the token's stage. Errors:
// model.ErrBudgetExhausted, the store's.
func (s *Server) restoreReward(ctx context.Context, sp *space, sh model.ShardID, c rewardtoken.Claims) error {
	actID, scene, rain, award, stage, err := model.ParseRewardOrderNo(c.OrderNo)
	if err != nil || actID != c.ActID || scene != c.Scene || rain != c.Rain || award != c.AwardType || stage != c.Stage {
		return model.Invalidf("token %s: its order number does not match its fields", c.OrderNo)
	}
	child := ""
	if t := s.acts.holder.Tree(); t != nil {
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
	if total, ok := s.budgets.SceneTotal(key); ok {
		if r.LeaseID, err = s.budgets.Pool(sp.index()).Take(ctx, key, total, c.Amount); err != nil {
			return err
		}
	}
	ring := s.rw.ring.Load()
	if r.Token, err = ring.Sign(tokenClaims(sp, r)); err != nil {
		s.budgets.Pool(sp.index()).Give(key, r.LeaseID, c.Amount)
		return err
	}
	got, repeat, err := s.storeReward(ctx, sp, r)
	if err != nil {
		if !errors.Is(err, storage.ErrCommitUnknown) {
			s.budgets.Pool(sp.index()).Give(key, r.LeaseID, c.Amount)
		}
		return err
	}
	if repeat {
		s.budgets.Pool(sp.index()).Give(key, r.LeaseID, c.Amount)
	} else {
		s.rwMetrics.issued.WithLabelValues(sp.name).Inc()
	}
	_, err = s.bookRewards(ctx, sp, []model.Reward{got})
	return err
}
