package rewards

import (
	"context"
	"errors"
	"net/http"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/issued"
	"redcell/cell/rewardtoken"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/storage"
)

// Serve answers a reward route in space (0 real, 1 shadow) through
// Config.Answers; key is the route's path key. The routes:
// api.RouteReward (POST /v1/rewards: api.RewardRequest →
// api.RewardResponse), api.RouteTokens (POST
// /v1/accounts/{act_id}/tokens, key the act_id: api.TokensRequest →
// api.TokensResponse) and api.RouteIssued (GET
// /v1/activities/{parent_activity_id}/issued, key the parent:
// api.IssuedResponse). The caller has checked the call's signature, the
// rate limit and the space, and set ctx's deadline. Errors answered: each
// route's (below), and NOT_FOUND for any other route.
func (i *Issuer) Serve(ctx context.Context, rc *fasthttp.RequestCtx, route api.RouteID, space int, key string) {
	status, out, err := http.StatusOK, any(nil), error(nil)
	switch route {
	case api.RouteReward:
		out, err = i.issue(ctx, space, rc.PostBody())
	case api.RouteTokens:
		status, out, err = i.tokens(ctx, rc, space, key)
	case api.RouteIssued:
		out, err = i.issuedSoFar(space, key)
	default:
		err = model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path())
	}
	if err != nil {
		i.cfg.Answers.Error(rc, err)
		return
	}
	i.cfg.Answers.JSON(rc, status, out)
}

// rewardOf decodes an issue request and resolves it against the
// activities now: the reward to store (order number, stage, scene, amount,
// created now) and the scene it comes from. Errors: a body that does not
// decode, a wrong cell, no key file (NOT_FOUND), no activities, an unknown
// or closed scene, an amount the scene does not allow, a stage named that
// is not open (NO_ACTIVE_STAGE).
func (i *Issuer) rewardOf(body []byte) (api.RewardRequest, model.Reward, activity.Active, error) {
	var req api.RewardRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return req, model.Reward{}, activity.Active{}, err
	}
	sh, err := i.cfg.Own.Account(req.ActID)
	if err != nil {
		return req, model.Reward{}, activity.Active{}, err
	}
	if i.cfg.Ring == nil {
		return req, model.Reward{}, activity.Active{}, model.Errorf(model.ErrNotFound, "this cell issues no rewards: no reward key file (reward_keys)")
	}
	t, err := i.tree()
	if err != nil {
		return req, model.Reward{}, activity.Active{}, err
	}
	now := i.clock.Now()
	a, err := t.Resolve(req.ParentActivityID, req.SceneID, now)
	if err != nil {
		return req, model.Reward{}, a, resolveErr(err)
	}
	if err := i.validate(req, a.Scene); err != nil {
		return req, model.Reward{}, a, err
	}
	stage := string(a.Child.Stage)
	if req.Stage != "" && req.Stage != stage {
		// A late retry, or a re-issue after the stage changed: never a new
		// reward of another stage.
		return req, model.Reward{}, a, model.Errorf(model.ErrNoActiveStage, "stage %s is not open now (activity %s is in %s)", req.Stage, a.Parent.ID, stage)
	}
	r := model.Reward{OrderNo: model.RewardOrderNo(req.ActID, a.Scene.ID, req.RainID, req.AwardType, stage),
		ActID: req.ActID, Shard: sh, App: req.App, Parent: a.Parent.ID, Child: a.Child.ID, Stage: stage, Scene: a.Scene.ID,
		Rain: req.RainID, AwardType: req.AwardType, TemplateID: a.Scene.TemplateID, Amount: model.Cents(req.Amount),
		CreatedMS: now.UnixMilli()}
	if a.Scene.AwardType == activity.AwardCash {
		r.TemplateID = ""
	}
	return req, r, a, nil
}

// refused answers an issue the budget refused (cause): a refusal first
// looks for the reward stored under the order number, so a client's retry
// of an issued reward gets its first answer even once the scene is spent.
func (i *Issuer) refused(ctx context.Context, space int, r model.Reward, cause error) (any, error) {
	prior, err := storage.Reward(ctx, i.cfg.Spaces[space].Store, r.Shard, r.OrderNo)
	switch {
	case err == nil:
		if err := model.ReplayReward(prior, r); err != nil {
			return nil, err
		}
		return rewardAnswer(prior, true), nil
	case errors.Is(err, model.ErrNotFound):
		return nil, cause
	default:
		return nil, err
	}
}

// sceneKey names a scene of one child: its budget, limiter and counter.
func sceneKey(a activity.Active) string { return model.BudgetKey(a.Parent.ID, a.Child.ID, a.Scene.ID) }

// resolveErr turns the activity tree's errors into API errors.
func resolveErr(err error) error {
	switch {
	case errors.Is(err, activity.ErrNoChild):
		return model.Errorf(model.ErrNoActiveStage, "%v", err)
	case errors.Is(err, activity.ErrUnknownActivity), errors.Is(err, activity.ErrUnknownScene):
		return model.Errorf(model.ErrNotFound, "%v", err)
	}
	return err
}

// tree is the loaded tree. Errors: NOT_FOUND when none is loaded.
func (i *Issuer) tree() (*activity.Tree, error) {
	t := i.acts.Tree()
	if t == nil {
		return nil, model.Errorf(model.ErrNotFound, "this cell has no reward activities loaded (cell.activities)")
	}
	return t, nil
}

func rewardAnswer(r model.Reward, repeat bool) api.RewardResponse {
	return api.RewardResponse{OrderNo: r.OrderNo, Token: r.Token, Amount: int64(r.Amount), AwardType: r.AwardType,
		TemplateID: r.TemplateID, Stage: r.Stage, ChildActivityID: r.Child, Status: r.Status.String(), Repeat: repeat,
		CreatedMS: r.CreatedMS}
}

// validate checks a request against the scene it resolved to.
func (i *Issuer) validate(req api.RewardRequest, sc *activity.Scene) error {
	if req.App != "" {
		if err := model.ValidateApp(req.App); err != nil {
			return err
		}
	}
	if err := activity.ValidateID(req.RainID); err != nil {
		return model.Invalidf("rain_id: %v", err)
	}
	if req.AwardType != sc.AwardType {
		return model.Invalidf("award_type %q: scene %s issues %q", req.AwardType, sc.ID, sc.AwardType)
	}
	if req.Amount < sc.Amount.Min || req.Amount > sc.Amount.Max {
		return model.Invalidf("amount %d is outside scene %s's rule %d..%d", req.Amount, sc.ID, sc.Amount.Min, sc.Amount.Max)
	}
	if sc.AwardType == activity.AwardCash && req.Amount > i.cfg.CashMax {
		return model.Invalidf("amount %d is above the cap of %d cents per cash reward (reward_cash_max)", req.Amount, i.cfg.CashMax)
	}
	return nil
}

// issue answers POST /v1/rewards.
func (i *Issuer) issue(ctx context.Context, space int, body []byte) (any, error) {
	req, r, a, err := i.rewardOf(body)
	if err != nil {
		return nil, err
	}
	key := sceneKey(a)
	rl := a.Scene.RateLimit
	if ok, _ := i.scenes[space].Allow(key, rl.PerSec, rl.Burst); !ok {
		// Shed without touching the database: a retry of an issued reward
		// gets its first answer once the rate allows it again. The rate is
		// the tree's this request resolved in: a reload holds at once.
		return nil, model.Errorf(model.ErrSceneRateLimited, "scene %s issues at most %d/s (burst %d) across the cluster", a.Scene.ID, rl.PerSec, rl.Burst)
	}
	if a.Scene.ControlStock {
		if r.LeaseID, err = i.cfg.Budgets.Pool(space).Take(ctx, key, a.Scene.Total(), int64(r.Amount)); err != nil {
			if errors.Is(err, model.ErrBudgetExhausted) {
				return i.refused(ctx, space, r, err)
			}
			return nil, err
		}
	}
	got, repeat, err := i.signAndStore(ctx, space, key, r)
	if err != nil {
		return nil, err
	}
	if repeat { // a concurrent issue of the same order number stored first
		return rewardAnswer(got, true), nil
	}
	i.counter(space, key).Add(int64(r.Amount))
	if req.BookNow {
		if _, err := i.book(ctx, space, []model.Reward{got}); err != nil {
			return nil, err
		}
		got.Status = model.RewardBooked
	} else {
		i.dirty[space].mark(r.Shard.DB())
	}
	return rewardAnswer(got, false), nil
}

// signAndStore signs r's token and stores r (store), counting it issued
// unless it is a repeat. A lease r took (r.LeaseID) is given back to
// budget key when r is not stored, or a repeat; when it is not known
// whether r was stored, the lease keeps it spent (never over-issue).
func (i *Issuer) signAndStore(ctx context.Context, space int, key string, r model.Reward) (model.Reward, bool, error) {
	giveBack := func() {
		if r.LeaseID != "" {
			i.cfg.Budgets.Pool(space).Give(key, r.LeaseID, int64(r.Amount))
		}
	}
	var err error
	if r.Token, err = i.cfg.Ring.Sign(tokenClaims(i.cfg.Spaces[space].Stress, r)); err != nil {
		giveBack()
		return model.Reward{}, false, err
	}
	got, repeat, err := i.store(ctx, space, r)
	if err != nil {
		if !errors.Is(err, storage.ErrCommitUnknown) {
			giveBack()
		}
		return model.Reward{}, false, err
	}
	if repeat {
		giveBack()
	} else {
		i.metrics.issued.WithLabelValues(i.cfg.Spaces[space].Name).Inc()
	}
	return got, repeat, nil
}

// book books rs, rewards of one database (one person's, or one reward),
// as one op of that database's commit lane (storage.BookOp):
// storage.BookRewards's answers.
func (i *Issuer) book(ctx context.Context, space int, rs []model.Reward) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	op := &storage.BookOp{Rewards: rs}
	err := i.cfg.Submit(ctx, space, rs[0].Shard.DB(), op)
	return op.Applied, err
}

// store stores an issued reward as one op of its database's commit lane
// (storage.IssueOp: the issues of a group share one multi-row INSERT per
// database and one COMMIT; an issue alone is its INSERT in autocommit). A
// repeat answers the reward stored before.
func (i *Issuer) store(ctx context.Context, space int, r model.Reward) (model.Reward, bool, error) {
	op := &storage.IssueOp{Reward: r}
	if err := i.cfg.Submit(ctx, space, r.Shard.DB(), op); err != nil {
		return model.Reward{}, false, err
	}
	return op.Issued, op.Repeat, nil
}

// tokenClaims are the claims of r's token in a space: a stress reward's
// token says so (rewardtoken.StatusIssuedStress), and is taken back only
// in the shadow space.
func tokenClaims(stress bool, r model.Reward) rewardtoken.Claims {
	c := rewardtoken.FromReward(r)
	if stress {
		c.Status = rewardtoken.StatusIssuedStress
	}
	return c
}

// issuedSoFar answers GET /v1/activities/{parent_activity_id}/issued from
// the in-process counters: no database, no memcached per request.
func (i *Issuer) issuedSoFar(space int, parent string) (any, error) {
	t, err := i.tree()
	if err != nil {
		return nil, err
	}
	c := t.ChildAt(parent, i.clock.Now())
	if c == nil {
		return nil, model.Errorf(model.ErrNoActiveStage, "activity %s has no stage open now (or is unknown)", parent)
	}
	out := api.IssuedResponse{ParentActivityID: parent, ChildActivityID: c.ID, Stage: string(c.Stage),
		StalenessMS: 2 * issued.Interval.Milliseconds(), Scenes: []api.IssuedScene{}}
	for _, rw := range c.Rewards {
		for _, sc := range rw.Scenes {
			n := i.Issued(space, model.BudgetKey(parent, c.ID, sc.ID))
			out.Scenes = append(out.Scenes, api.IssuedScene{SceneID: sc.ID, AwardType: sc.AwardType, Issued: n, Limit: sc.Total()})
		}
	}
	return out, nil
}
