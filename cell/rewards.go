package cell

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/degrade"
	"redcell/cell/issued"
	"redcell/cell/rewardtoken"
	"redcell/cell/scenelimit"
	"redcell/model"
	"redcell/storage"
)

// The reward wallet, as Douyin ran it for Spring Festival 2022: a reward is
// issued at once — a row in the person's home shard, pending, and a signed
// token answered to the caller — and booked behind by the booker, in bulk
// and at its own rate (Config.BookingRate), so issuance can run far above
// what the ledger books. Budgets never overrun: a scene that controls its
// stock spends leases taken from the scene's home (cell/budget). A
// withdrawal books the person's pending rewards first.

// rewards is the cell's reward state.
type rewards struct {
	ring     atomic.Pointer[rewardtoken.Ring] // nil: no key file, issuing answers REWARDS_DISABLED
	release  atomic.Pointer[api.WithdrawRelease]
	scenes   [2]*scenelimit.Limits // each scene's rate_limit, for the whole cluster, per space
	counters [2]*issued.Counters
	dirty    [2]dirtyDBs // databases with rewards issued here since the booker's last pass
	booked   [2]atomic.Int64
}

// dirtyDBs is a set of database indexes, taken whole by the booker.
type dirtyDBs struct {
	mu sync.Mutex
	m  map[int]bool
}

func (d *dirtyDBs) mark(db int) {
	d.mu.Lock()
	if d.m == nil {
		d.m = map[int]bool{}
	}
	d.m[db] = true
	d.mu.Unlock()
}

func (d *dirtyDBs) take() map[int]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.m
	d.m = nil
	return m
}

// sceneKey names a scene of one child: its budget, limiter and counter.
func sceneKey(a activity.Active) string { return model.BudgetKey(a.Parent.ID, a.Child.ID, a.Scene.ID) }

func (s *Server) issuedCounter(sp *space, key string) *issued.Counter {
	c, err := s.rw.counters[sp.index()].Counter(key)
	if err != nil { // a name the tree's ID rules cannot make
		panic(err)
	}
	return c
}

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

func (s *Server) tree() (*activity.Tree, error) {
	t := s.acts.holder.Tree()
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

// validateReward checks a request against the scene it resolved to.
func (s *Server) validateReward(req api.RewardRequest, sc *activity.Scene) error {
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
	if sc.AwardType == activity.AwardCash && req.Amount > s.cfg.RewardCashMax {
		return model.Invalidf("amount %d is above the cap of %d cents per cash reward (reward_cash_max)", req.Amount, s.cfg.RewardCashMax)
	}
	return nil
}

// issueReward answers POST /v1/rewards.
func (s *Server) issueReward(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var req api.RewardRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	sh, err := s.own.account(req.ActID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	ring := s.rw.ring.Load()
	if ring == nil {
		s.answers.err(rc, model.Errorf(model.ErrNotFound, "this cell issues no rewards: no reward key file (reward_keys)"))
		return
	}
	t, err := s.tree()
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	now := s.clock.Now()
	a, err := t.Resolve(req.ParentActivityID, req.SceneID, now)
	if err != nil {
		s.answers.err(rc, resolveErr(err))
		return
	}
	if err := s.validateReward(req, a.Scene); err != nil {
		s.answers.err(rc, err)
		return
	}
	stage := string(a.Child.Stage)
	if req.Stage != "" && req.Stage != stage {
		// A late retry, or a re-issue after the stage changed: never a new
		// reward of another stage.
		s.answers.err(rc, model.Errorf(model.ErrNoActiveStage, "stage %s is not open now (activity %s is in %s)", req.Stage, a.Parent.ID, stage))
		return
	}
	r := model.Reward{OrderNo: model.RewardOrderNo(req.ActID, a.Scene.ID, req.RainID, req.AwardType, stage),
		ActID: req.ActID, Shard: sh, App: req.App, Parent: a.Parent.ID, Child: a.Child.ID, Stage: stage, Scene: a.Scene.ID,
		Rain: req.RainID, AwardType: req.AwardType, TemplateID: a.Scene.TemplateID, Amount: model.Cents(req.Amount),
		CreatedMS: now.UnixMilli()}
	if a.Scene.AwardType == activity.AwardCash {
		r.TemplateID = ""
	}
	// A refusal of the budget first looks for the reward stored under the
	// order number: a client's retry of an issued reward gets its first
	// answer even once the scene is spent.
	refuse := func(cause error) {
		prior, err := storage.Reward(ctx, sp.store, sh, r.OrderNo)
		switch {
		case err == nil:
			if err := model.ReplayReward(prior, r); err != nil {
				s.answers.err(rc, err)
				return
			}
			s.answers.json(rc, http.StatusOK, rewardAnswer(prior, true))
		case errors.Is(err, model.ErrNotFound):
			s.answers.err(rc, cause)
		default:
			s.answers.err(rc, err)
		}
	}
	key := sceneKey(a)
	rl := a.Scene.RateLimit
	if ok, _ := s.rw.scenes[sp.index()].Allow(key, rl.PerSec, rl.Burst); !ok {
		// Shed without touching the database: a retry of an issued reward
		// gets its first answer once the rate allows it again. The rate is
		// the tree's this request resolved in: a reload holds at once.
		s.answers.err(rc, model.Errorf(model.ErrSceneRateLimited, "scene %s issues at most %d/s (burst %d) across the cluster", a.Scene.ID, rl.PerSec, rl.Burst))
		return
	}
	limit := a.Scene.Budget
	if a.Scene.AwardType != activity.AwardCash {
		limit = a.Scene.Stock
	}
	if a.Scene.ControlStock {
		if r.LeaseID, err = s.budgets.Pool(sp.index()).Take(ctx, key, limit, int64(r.Amount)); err != nil {
			if errors.Is(err, model.ErrBudgetExhausted) {
				refuse(err)
				return
			}
			s.answers.err(rc, err)
			return
		}
	}
	giveBack := func() {
		if r.LeaseID != "" {
			s.budgets.Pool(sp.index()).Give(key, r.LeaseID, int64(r.Amount))
		}
	}
	if r.Token, err = ring.Sign(tokenClaims(sp, r)); err != nil {
		giveBack()
		s.answers.err(rc, err)
		return
	}
	got, repeat, err := s.storeReward(ctx, sp, r)
	if err != nil {
		if !errors.Is(err, storage.ErrCommitUnknown) { // written or not unknown: the lease keeps it spent (never over-issue)
			giveBack()
		}
		s.answers.err(rc, err)
		return
	}
	if repeat { // a concurrent issue of the same order number stored first
		giveBack()
		s.answers.json(rc, http.StatusOK, rewardAnswer(got, true))
		return
	}
	s.issuedCounter(sp, key).Add(int64(r.Amount))
	s.rwMetrics.issued.WithLabelValues(sp.name).Inc()
	if req.BookNow {
		if _, err := s.bookRewards(ctx, sp, []model.Reward{got}); err != nil {
			s.answers.err(rc, err)
			return
		}
		got.Status = model.RewardBooked
	} else {
		s.rw.dirty[sp.index()].mark(sh.DB())
	}
	s.answers.json(rc, http.StatusOK, rewardAnswer(got, false))
}

// bookRewards books rs, rewards of one database (one person's, or one
// reward), as one op of that database's commit lane (storage.BookOp):
// storage.BookRewards's answers.
func (s *Server) bookRewards(ctx context.Context, sp *space, rs []model.Reward) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	op := &storage.BookOp{Rewards: rs}
	err := s.submitStore(ctx, sp, rs[0].Shard.DB(), op)
	return op.Applied, err
}

// storeReward stores an issued reward as one op of its database's commit
// lane (storage.IssueOp: the issues of a group share one multi-row INSERT
// per database and one COMMIT; an issue alone is its INSERT in autocommit).
// A repeat answers the reward stored before.
func (s *Server) storeReward(ctx context.Context, sp *space, r model.Reward) (model.Reward, bool, error) {
	op := &storage.IssueOp{Reward: r}
	if err := s.submitStore(ctx, sp, r.Shard.DB(), op); err != nil {
		return model.Reward{}, false, err
	}
	return op.Issued, op.Repeat, nil
}

// tokenClaims are the claims of r's token in space sp: a stress reward's
// token says so (rewardtoken.StatusIssuedStress), and is taken back only
// in the shadow space.
func tokenClaims(sp *space, r model.Reward) rewardtoken.Claims {
	c := rewardtoken.FromReward(r)
	if sp.stress {
		c.Status = rewardtoken.StatusIssuedStress
	}
	return c
}

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

// forcedBookingBatch is how many pending rewards forced booking books in
// one transaction; it goes on until none is left (forcedBookingRounds at
// most: 100,000 rewards of one person).
const (
	forcedBookingBatch  = 1000
	forcedBookingRounds = 100
)

// bookPendingOf books every pending reward of a person (forced booking).
func (s *Server) bookPendingOf(ctx context.Context, sp *space, sh model.ShardID, actID string) (int, error) {
	total := 0
	for range forcedBookingRounds {
		pend, err := storage.PendingRewardsOf(ctx, sp.store, sh, actID, forcedBookingBatch)
		if err != nil || len(pend) == 0 {
			return total, err
		}
		n, err := s.bookRewards(ctx, sp, pend)
		s.rw.booked[sp.index()].Add(int64(n))
		total += n
		if err != nil {
			return total, err
		}
		if len(pend) < forcedBookingBatch {
			return total, nil
		}
	}
	return total, model.Errorf(model.ErrOverloaded, "%s has more than %d rewards pending; retry", actID, forcedBookingBatch*forcedBookingRounds)
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

// issuedSoFar answers GET /v1/activities/{parent_activity_id}/issued from
// the in-process counters: no database, no memcached per request.
func (s *Server) issuedSoFar(rc *fasthttp.RequestCtx, sp *space, parent string) {
	t, err := s.tree()
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	c := t.ChildAt(parent, s.clock.Now())
	if c == nil {
		s.answers.err(rc, model.Errorf(model.ErrNoActiveStage, "activity %s has no stage open now (or is unknown)", parent))
		return
	}
	out := api.IssuedResponse{ParentActivityID: parent, ChildActivityID: c.ID, Stage: string(c.Stage),
		StalenessMS: 2 * issued.Interval.Milliseconds(), Scenes: []api.IssuedScene{}}
	for _, rw := range c.Rewards {
		for _, sc := range rw.Scenes {
			limit := sc.Budget
			if sc.AwardType != activity.AwardCash {
				limit = sc.Stock
			}
			n := s.issuedCounter(sp, model.BudgetKey(parent, c.ID, sc.ID)).Read()
			out.Scenes = append(out.Scenes, api.IssuedScene{SceneID: sc.ID, AwardType: sc.AwardType, Issued: n, Limit: limit})
		}
	}
	s.answers.json(rc, http.StatusOK, out)
}

// Booking: every Config.BookingInterval each space's booker books the
// pending rewards of the cell's databases (those marked dirty by an issue
// here; every database at the first pass, whenever the databases the cell
// serves change, and every bookerScanEvery, for rewards left from before a
// restart, by another owner, or processing for longer than bookerStale by a
// take of an earlier version) in batches, at Config.BookingRate rewards/s.
// The scan of every database asks each one first, with one read
// (storage.RewardsDueQuery), and books only where something is due: an
// idle cell scans once per bookerStale, not every few seconds.
const (
	bookerBatchesMax = 20               // batches of one database in one pass, at most
	bookerStale      = 30 * time.Second // a processing reward this old is taken again
	bookerScanEvery  = bookerStale      // a reward left processing is taken again within two of these
)

func (s *Server) runBooker(sp *space) func(ctx context.Context) {
	return func(ctx context.Context) {
		lim := rate.NewLimiter(rate.Limit(s.cfg.BookingRate), s.cfg.BookingBatch)
		lastScan := time.Time{}
		var scanned []int // the databases of the last scan
		t := time.NewTicker(s.cfg.BookingInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.rwMetrics.ticks.WithLabelValues(sp.name).Inc()
			if s.switches.Off(degradeBooking) {
				continue
			}
			// The databases issues marked come first, and again after each
			// database of a full scan: a scan reads every database the cell
			// owns, one transaction each (100 on a cell that owns every
			// shard, seconds on a busy server), and a reward issued meanwhile
			// must not wait for its end.
			// A database with more left (or that failed) waits for the next
			// tick, as before the scan: one batch per database per tick.
			failed, booked := false, false
			var again []int
			// The switch is read before each database, not once a tick: a
			// scan takes seconds, and a booking switched off meanwhile stops
			// at once (what was marked stays marked for when it is on).
			// scan: the databases come from the scan of every database, not
			// from issues here; each is asked first whether it holds anything
			// to book (bookDB).
			book := func(todo map[int]bool, scan bool) {
				for db := range todo {
					if s.switches.Off(degradeBooking) {
						again = append(again, db)
						continue
					}
					booked = true
					// Batch after batch while they come back full (the
					// limiter paces them), up to bookerBatchesMax a pass:
					// one batch a pass would cap a database at
					// booking_batch per booking_interval (100/s by default).
					for n := 1; ; n++ {
						done, err := s.bookDB(ctx, sp, lim, db, scan && n == 1)
						if err != nil && ctx.Err() == nil {
							failed = true
							s.inc.booking[sp.index()].Fail(err, "db", db)
						}
						if done {
							break
						}
						if err != nil || n == bookerBatchesMax || ctx.Err() != nil || s.switches.Off(degradeBooking) {
							again = append(again, db)
							break
						}
					}
				}
			}
			book(s.rw.dirty[sp.index()].take(), false)
			if now, dbs := s.clock.Now(), s.own.dbs(); now.Sub(lastScan) >= bookerScanEvery || !slices.Equal(dbs, scanned) {
				lastScan, scanned = now, dbs
				for _, db := range dbs { // read each tick: moves change them
					if ctx.Err() != nil {
						return
					}
					if s.switches.Off(degradeBooking) {
						break
					}
					book(map[int]bool{db: true}, true)
					book(s.rw.dirty[sp.index()].take(), false)
				}
			}
			for _, db := range again {
				s.rw.dirty[sp.index()].mark(db) // more left (or failed): next tick
			}
			if !failed && booked {
				s.inc.booking[sp.index()].OK()
			}
		}
	}
}

// bookDB books one batch of database db; done is false when a full batch
// was booked (more may wait) or booking failed (err).
//
// The batch is found, locked and booked in one op of the database's commit
// lane (storage.BookOp with a storage.RewardTake: its locking read,
// the wallets' flows and balances and the rows marked booked, in the lane's
// group transaction). The booking rate is paid after: the wait for a
// batch's tokens follows its booking, so a batch never waits holding rows
// (the limiter's burst is one batch, BookingBatch).
//
// A database of the scan (scan set) is asked first, with one read outside
// the lane, whether it holds anything to book (storage.RewardsDueQuery): a
// scan of every database finds nothing in almost all of them, and each
// would otherwise be a group of its lane.
func (s *Server) bookDB(ctx context.Context, sp *space, lim *rate.Limiter, db int, scan bool) (done bool, err error) {
	bctx, cancel := context.WithTimeout(ctx, txTimeout)
	defer cancel()
	began := s.clock.Now()
	staleMS := began.Add(-bookerStale).UnixMilli()
	if scan {
		if !s.own.servesDB(db) {
			return true, nil
		}
		q := &storage.RewardsDueQuery{DB: db, StaleMS: staleMS}
		if err := sp.store.Read(bctx, q); err != nil {
			return false, fmt.Errorf("rewards due in db %d: %w", db, err)
		}
		if !q.Due {
			return true, nil
		}
	}
	// Each write is work a move's freeze waits for, and checks the database
	// is still served inside it.
	leave := s.own.enter()
	if !s.own.servesDB(db) {
		leave()
		return true, nil
	}
	op := &storage.BookOp{Take: &storage.RewardTake{DB: db, StaleMS: staleMS, IssuedByMS: began.UnixMilli(), Limit: s.cfg.BookingBatch}}
	if err = s.submit(bctx, sp, db, op); err == nil {
		err = op.Err
	}
	leave()
	if err != nil {
		return false, fmt.Errorf("book rewards of db %d: %w", db, err)
	}
	n := op.Applied
	if n == 0 {
		return len(op.Deferred) == 0, nil
	}
	s.rw.booked[sp.index()].Add(int64(n))
	s.rwMetrics.bookedNow(sp, op.Rewards, n, s.clock.Now())
	if err := lim.WaitN(ctx, n); err != nil {
		return false, nil
	}
	return n < s.cfg.BookingBatch && len(op.Deferred) == 0, nil
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

// The reward wallet's degrade switches.
const (
	degradeWalletFlow = degrade.WalletFlow
	degradeBooking    = degrade.Booking
)
