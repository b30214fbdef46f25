package cell

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

// rewardOf decodes an issue request and resolves it against the
// activities now: the reward to store (order number, stage, scene, amount,
// created now), the scene it comes from and the key ring that signs its
// token. Errors: a body that does not decode, a wrong cell, no key file
// (NOT_FOUND), no activities, an unknown or closed scene, an amount the
// scene does not allow, a stage named that is not open (NO_ACTIVE_STAGE).
func (s *Server) rewardOf(body []byte) (api.RewardRequest, model.Reward, activity.Active, *rewardtoken.Ring, error) {
	var req api.RewardRequest
	if err := decodeStrict(body, &req); err != nil {
		return req, model.Reward{}, activity.Active{}, nil, err
	}
	sh, err := s.own.account(req.ActID)
	if err != nil {
		return req, model.Reward{}, activity.Active{}, nil, err
	}
	ring := s.rw.ring.Load()
	if ring == nil {
		return req, model.Reward{}, activity.Active{}, nil, model.Errorf(model.ErrNotFound, "this cell issues no rewards: no reward key file (reward_keys)")
	}
	t, err := s.tree()
	if err != nil {
		return req, model.Reward{}, activity.Active{}, nil, err
	}
	now := s.clock.Now()
	a, err := t.Resolve(req.ParentActivityID, req.SceneID, now)
	if err != nil {
		return req, model.Reward{}, a, nil, resolveErr(err)
	}
	if err := s.validateReward(req, a.Scene); err != nil {
		return req, model.Reward{}, a, nil, err
	}
	stage := string(a.Child.Stage)
	if req.Stage != "" && req.Stage != stage {
		// A late retry, or a re-issue after the stage changed: never a new
		// reward of another stage.
		return req, model.Reward{}, a, nil, model.Errorf(model.ErrNoActiveStage, "stage %s is not open now (activity %s is in %s)", req.Stage, a.Parent.ID, stage)
	}
	r := model.Reward{OrderNo: model.RewardOrderNo(req.ActID, a.Scene.ID, req.RainID, req.AwardType, stage),
		ActID: req.ActID, Shard: sh, App: req.App, Parent: a.Parent.ID, Child: a.Child.ID, Stage: stage, Scene: a.Scene.ID,
		Rain: req.RainID, AwardType: req.AwardType, TemplateID: a.Scene.TemplateID, Amount: model.Cents(req.Amount),
		CreatedMS: now.UnixMilli()}
	if a.Scene.AwardType == activity.AwardCash {
		r.TemplateID = ""
	}
	return req, r, a, ring, nil
}

// refuseReward answers an issue the budget refused (cause): a refusal
// first looks for the reward stored under the order number, so a client's
// retry of an issued reward gets its first answer even once the scene is
// spent.
func (s *Server) refuseReward(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, r model.Reward, cause error) {
	prior, err := storage.Reward(ctx, sp.store, r.Shard, r.OrderNo)
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
	req, r, a, ring, err := s.rewardOf(rc.PostBody())
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	sh := r.Shard
	refuse := func(cause error) { s.refuseReward(ctx, rc, sp, r, cause) }
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

// bookBatches books database db batch after batch while they come back
// full (the limiter paces them), up to bookerBatchesMax a pass: one batch a
// pass would cap a database at booking_batch per booking_interval (100/s by
// default). failed: a batch failed (logged as the booking's incident);
// more: db has more left, or failed, for the next tick. scan: its first
// batch asks first whether db holds anything to book (bookDB).
func (s *Server) bookBatches(ctx context.Context, sp *space, lim *rate.Limiter, db int, scan bool) (failed, more bool) {
	for n := 1; ; n++ {
		done, err := s.bookDB(ctx, sp, lim, db, scan && n == 1)
		if err != nil && ctx.Err() == nil {
			failed = true
			s.inc.booking[sp.index()].Fail(err, "db", db)
		}
		if done {
			return failed, false
		}
		if err != nil || n == bookerBatchesMax || ctx.Err() != nil || s.switches.Off(degradeBooking) {
			return failed, true
		}
	}
}

// runBooker returns space sp's booker, the loop "Booking" above tells.
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
					f, more := s.bookBatches(ctx, sp, lim, db, scan)
					failed = failed || f
					if more {
						again = append(again, db)
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

// The reward wallet's degrade switches.
const (
	degradeWalletFlow = degrade.WalletFlow
	degradeBooking    = degrade.Booking
)
