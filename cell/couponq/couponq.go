// Package couponq issues coupons behind the accept, in two layers of
// bounded local queues, as Douyin Pay ran its Spring Festival drop. A
// request is stored first (storage.AcceptCoupon) and answered, and
// goes into the first queue at once while it has room (stored as it is,
// accepted); a feeder moves the other stored requests into the queue,
// marking them deciding in the database. Every queued request is durable,
// and a request the cell never got to stays accepted (or goes stale
// deciding) for whoever owns its database next.
//
// Layer 1, the activity decision, drains its queue at its own rate (one
// token per request): the batch must be open, the built-in risk caps (per
// device, IP and act_id per minute) must allow it, and the person's holding
// must leave room (per-person limit, batch-group exclusion). Refusals are
// final; the rest go on to layer 2. One gatherer takes what is queued as
// one chunk for a free decider, so a busier cell decides more requests per
// read of holdings.
//
// Layer 2, the asset step, drains at its own rate: one gatherer, as layer
// 1's, takes up to MergeMax queued requests (what is queued, and what comes
// within Config.Gather) and hands the pass to a free merger, which groups
// them by batch (model.MergeAsks), takes
// one stock deduction per batch (a lease of as many units as requests, or
// what is left), and issues in one transaction that decides each request
// again under the persons' row locks (storage.CouponIssue); the
// units no request took go back. A batch whose deduction found no unit free
// is marked sold out for a second, without asking the stock; a request
// that meets the mark is released and taken again a second later, and
// refused SOLD_OUT the third time, so that units other merges held in
// leases and gave back unused still reach a request.
//
// Before all that, the accept checks a local copy of each batch's stock,
// read from its home twice a second while requests ask about the batch
// (copy.go): once it shows nothing left
// and nothing held, a request is stored already refused SOLD_OUT and
// answered at once.
//
// A green-channel request (a person opening the wallet right after taking a
// coupon) is decided in the caller's request, ahead of both queues.
package couponq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/storage"
)

// Stock is where the batches' stock is deducted. A deduction is a lease of
// the batch's stock: Grant answers how many of want units it got (0 when
// none is free) and the lease's ID; Return closes a lease, giving back the
// units it did not spend (repeatable: a lease returned before is left as it
// is).
type Stock interface {
	Grant(ctx context.Context, batch string, want int64) (leaseID string, granted int64, err error)
	Return(ctx context.Context, batch, leaseID string, unused int64) error
}

// Limiter paces a layer: one token per request (internal/climit.Limiter).
type Limiter interface {
	Allow() bool
	Wait(ctx context.Context) error
}

// Store is an engine's store: it commits the coupon ops (storage.CouponTake,
// CouponIssue, CouponRefusal, CouponRelease) and reads the coupon queries
// (storage.CouponRequestQuery, HoldingsQuery).
type Store interface {
	storage.Grouper
	storage.Reader
}

// Config sets an engine.
type Config struct {
	Store Store
	// Accept stores one request as storage.AcceptCoupon does (the same
	// answers and errors); nil: storage.AcceptCoupon on Store. A cell sets
	// it to store requests through its group committer.
	Accept  func(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error)
	Stock   Stock
	Catalog func() *couponbatch.Catalog // the current batches; nil answers refuse every request
	Layer1  Limiter
	Layer2  Limiter
	// DBs lists the databases whose requests this engine decides (the
	// cell's own).
	DBs func() []int
	// QueueLen bounds each layer's queue (default 4096).
	QueueLen int
	// MergeMax is the most requests layer 2 takes into one pass (default 64).
	MergeMax int
	// Prefetch is how many units beyond a merge's own a deduction asks
	// the batch's home for; the rest are kept as a held lease the next
	// merges deduct from (held.go). 0: a grant and a return per merge.
	Prefetch int64
	// Gather is how long each layer's gatherer (layer 1, layer 2) waits,
	// after the first queued request, for more to take into the same chunk
	// (decision or merge), unless the chunk fills first: a busy cell then
	// reads holdings, locks persons and writes coupons for several requests
	// in one statement per database, and spends less of the cores its
	// accepts share; the wait adds to each request's accept → issued time.
	// Zero: what is queued at once.
	Gather [2]time.Duration
	// StaleAfter is how long a request may stay deciding before the feeder
	// takes it again (default 30 s).
	StaleAfter time.Duration
	// Workers is layer 1's concurrent deciders (default 8).
	Workers int
	// Mergers is layer 2's concurrent merges (default 4): each runs a pass
	// the gatherer hands it, so passes, of different batches or of one
	// batch, run side by side.
	Mergers int
	// Paused, when it reports true, stops the feeder and green decisions:
	// requests are accepted and wait (a degrade switch; nil: never).
	Paused func() bool
	// Levels reads the stock of batches at their homes, for the local copy
	// (copy.go): a batch whose home did not answer, or has no stock row
	// yet, is left out of the map (and an error may say why). nil: no copy,
	// every request is queued.
	Levels func(ctx context.Context, batches []string) (map[string]Level, error)
	// Observe hears what the engine does, for the metrics (nil: nobody).
	Observe Observer
	Clock   clock.Clock
	Log     *slog.Logger
}

// Observer hears the engine's events; its methods must be cheap and safe
// for concurrent use.
type Observer interface {
	// Accepted: a new request was stored (not a repeat).
	Accepted()
	// Final: request r became final: issued, or refused for reason, at now.
	Final(r model.CouponRequest, issued bool, reason model.CouponReason, now time.Time)
	// Waited: a request waited d in layer's queue (1 or 2) before its step.
	Waited(layer int, d time.Duration)
	// Merged: one deduction asked for n requests of batch.
	Merged(batch string, n int)
	// LeftOpen: an issue of batch lost its COMMIT's answer and left its
	// deduction open with units no coupon is known to carry: out of the
	// stock (written off) until the home settles the deduction by its
	// coupons, after its TTL.
	LeftOpen(batch string, units int64)
}

type noObserver struct{}

func (noObserver) Accepted()                                                      {}
func (noObserver) Final(model.CouponRequest, bool, model.CouponReason, time.Time) {}
func (noObserver) Waited(int, time.Duration)                                      {}
func (noObserver) Merged(string, int)                                             {}
func (noObserver) LeftOpen(string, int64)                                         {}

// Engine runs the layers. Safe for concurrent use.
type Engine struct {
	cfg    Config
	clock  clock.Clock
	log    *slog.Logger
	takes  *incident.Tracker // the feeder's takes failing (a database down)
	copies *incident.Tracker // the stock copy's reads failing (a home down)
	q1     chan model.CouponRequest
	q2     chan queued
	kick   chan struct{}

	// feeding is held while the feeder puts a take into q1, passing
	// while a decider puts its pass into q2: a gatherer that got a
	// request waits for the rest of its run before it takes a chunk.
	feeding, passing sync.Mutex

	mu       sync.Mutex
	dirty    map[int]bool          // databases accepted into since the feeder's last pass
	backlog  bool                  // requests wait in their rows for the feeder: none is queued at its accept (queueNow)
	soldOut  map[string]time.Time  // batches whose last deduction found nothing free, until when
	backoff  map[string]time.Time  // batches whose last deduction failed, until when
	inflight map[string]int64      // units this engine's merges hold now, by batch
	held     map[string]*heldLease // leases kept for the next merges, by lease ID (held.go)
	short    map[string]time.Time  // batches whose grant came back short, deducted without prefetch until when
	parked   map[string]parked     // requests put aside until a time, then released (park), by key
	tries    map[string]int        // app+serial → deductions that found its batch sold out
	stock    map[string]copied     // the local copy of each batch's stock (copy.go)
	asked    map[string]time.Time  // when a request last asked each batch's copy (copy.go)
	risk     riskCounters
	queued   map[string]bool // app+serial of requests in a queue or a step
	merge    atomic.Int64    // MergeMax now (SetMergeMax)
	pre      atomic.Int64    // Prefetch now (SetPrefetch)
	stopping atomic.Bool     // Run's workers have stopped: no new held lease

	Stats Stats
}

// Stats counts what the engine did; safe to read at any time.
type Stats struct {
	Accepted, Issued, Refused, Deductions, Fed, Released atomic.Int64
	// Queued counts requests put into layer 1's queue at their accept
	// (queueNow); Fed those the feeder took from the databases.
	Queued atomic.Int64
	// HeldDeductions counts merges that deducted from a held lease, with
	// no grant at the batch's home (Deductions counts grants).
	HeldDeductions atomic.Int64
	// RefusedAtAccept counts requests stored refused SOLD_OUT in their
	// accept by the stock copy (counted in Refused too).
	RefusedAtAccept atomic.Int64
}

// New returns an engine; Run starts it.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Stock == nil || cfg.Layer1 == nil || cfg.Layer2 == nil || cfg.DBs == nil {
		return nil, errors.New("couponq: Store, Stock, Layer1, Layer2 and DBs are required")
	}
	if cfg.Accept == nil {
		st := cfg.Store
		cfg.Accept = func(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error) {
			return storage.AcceptCoupon(ctx, st, r)
		}
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 4096
	}
	if cfg.MergeMax <= 0 {
		cfg.MergeMax = 64
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 30 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Mergers <= 0 {
		cfg.Mergers = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Observe == nil {
		cfg.Observe = noObserver{}
	}
	e := &Engine{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Log, takes: incident.New(cfg.Log, "coupons: take requests", incident.DefaultEvery),
		copies: incident.New(cfg.Log, "coupons: read the stock copy", incident.DefaultEvery), q1: make(chan model.CouponRequest, cfg.QueueLen),
		q2: make(chan queued, cfg.QueueLen), kick: make(chan struct{}, 1), dirty: map[int]bool{},
		soldOut: map[string]time.Time{}, backoff: map[string]time.Time{}, inflight: map[string]int64{}, held: map[string]*heldLease{}, short: map[string]time.Time{}, stock: map[string]copied{}, asked: map[string]time.Time{}, parked: map[string]parked{}, tries: map[string]int{}, risk: riskCounters{m: map[string]int{}}, queued: map[string]bool{}}
	e.merge.Store(int64(cfg.MergeMax))
	e.pre.Store(max(cfg.Prefetch, 0))
	return e, nil
}

// key names a request in the engine: its database, app and serial (a
// serial is unique per app within one database; the same serial of an app
// for a person of another database is another request).
func key(r model.CouponRequest) string {
	return strconv.Itoa(r.Shard.DB()) + "\x00" + r.App + "\x00" + r.Serial
}

func (e *Engine) paused() bool { return e.cfg.Paused != nil && e.cfg.Paused() }

// dedupe drops the later copies of a request in rs (by app and serial): a
// pass decides each request once.
func dedupe(rs []model.CouponRequest) []model.CouponRequest {
	seen := make(map[string]bool, len(rs))
	out := rs[:0]
	for _, r := range rs {
		if !seen[key(r)] {
			seen[key(r)] = true
			out = append(out, r)
		}
	}
	return out
}

// queued is a request in layer 2's queue, with when it got there.
type queued struct {
	r  model.CouponRequest
	at time.Time
}

// SetMergeMax changes how many queued requests one deduction takes at
// most, from the next pass on (1: a deduction per request).
func (e *Engine) SetMergeMax(n int) { e.merge.Store(int64(max(n, 1))) }

// SetPrefetch changes how many units beyond its own a merge's deduction
// asks for, from the next grant on (0: none; held leases are used up or
// closed as they age).
func (e *Engine) SetPrefetch(n int64) { e.pre.Store(max(n, 0)) }

// Prefetch is what SetPrefetch last set (Config.Prefetch at first).
func (e *Engine) Prefetch() int64 { return e.pre.Load() }

// MergeMax is the bound SetMergeMax last set (Config.MergeMax at first).
func (e *Engine) MergeMax() int { return int(e.merge.Load()) }

// Depths returns how many requests wait in layer 1's and layer 2's queues.
func (e *Engine) Depths() (layer1, layer2 int) { return len(e.q1), len(e.q2) }

// Accept stores r (Config.Accept) and wakes the feeder; a
// repeat answers the stored request. A request for a batch whose local
// stock copy shows nothing left (copy.go) is stored refused SOLD_OUT and
// answered so, queued nowhere. With r.Green, the request is decided
// now, ahead of the queues, and the answer is its final state (a repeat of
// a request not final yet is decided now too). Errors: the store's, and
// context errors of a green decision.
func (e *Engine) Accept(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error) {
	accept := e.cfg.Accept
	if e.refusedByCopy(r) {
		r = model.RefusedAtAccept(r)
	}
	got, repeat, err := accept(ctx, r)
	if err != nil {
		return got, repeat, err
	}
	if !repeat {
		e.Stats.Accepted.Add(1)
		e.cfg.Observe.Accepted()
		if got.State == model.CouponRefused { // refused by the copy: decided, nothing to queue
			e.Stats.RefusedAtAccept.Add(1)
			e.Stats.Refused.Add(1)
			e.cfg.Observe.Final(got, false, got.Reason, e.clock.Now())
			return got, false, nil
		}
	}
	if r.Green && !got.State.Final() && !e.paused() {
		// Decided to the end even if the caller goes away: a deduction
		// half done would hold units for nothing.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout)
		defer cancel()
		g := got
		g.Green = true // this call is green, whatever the first one was
		out, err := e.decideNow(dctx, g)
		return out, repeat, err
	}
	if !repeat && !e.queueNow(got) {
		e.mu.Lock()
		e.dirty[r.Shard.DB()] = true
		e.mu.Unlock()
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
	return got, repeat, nil
}

// queueNow puts a request just accepted straight into layer 1's queue,
// stored as it is (accepted): the feeder need not take it, a take being a
// transaction of its own, one per request or two when the cell is not
// busy. A request the feeder's sweep takes as well is queued once
// (e.queued). One left queued by a cell that dies is still accepted (or
// deciding, if a sweep marked it), for the next owner. False, for the
// feeder to take it, when the engine is paused or stopping, when layer 1's
// queue is full, and while the feeder has a backlog (the queue was full, or
// its last take found as many requests as the queue had room for): the
// feeder then takes the waiting requests oldest first, and a new one does
// not jump them. Once a take finds fewer, accepts are queued again; the
// few accepted during that take wait for the feeder's next pass, a few
// milliseconds (woken by their accepts).
func (e *Engine) queueNow(r model.CouponRequest) bool {
	if e.paused() {
		return false
	}
	r.TakenMS = e.clock.Now().UnixMilli() // queued now: layer 1's wait counts from here
	// Under e.mu, mark and send together (the send never blocks): the
	// feeder's duplicate check and done() see a request either queued and
	// marked or neither. A request left to the feeder marks its database
	// dirty under the same lock, so no later accept is queued before the
	// feeder took it.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.queued[key(r)] { // a sweep took it already
		return true
	}
	if e.stopping.Load() || e.backlog {
		e.dirty[r.Shard.DB()] = true
		return false
	}
	select {
	case e.q1 <- r:
		e.queued[key(r)] = true
		e.Stats.Queued.Add(1)
		return true
	default:
		e.backlog = true // the queue is full: the feeder takes what waits, in order
		e.dirty[r.Shard.DB()] = true
		return false
	}
}

// decideNow runs both layers for one request, without the queues or their
// limiters, and answers the request as stored after.
func (e *Engine) decideNow(ctx context.Context, r model.CouponRequest) (_ model.CouponRequest, err error) {
	// The feeder skips it while it is decided here (it may still find it
	// accepted); should a queue hold it already, IssueCoupons and
	// RefuseCoupons decide it once.
	e.mu.Lock()
	mine := !e.queued[key(r)]
	e.queued[key(r)] = true
	e.mu.Unlock()
	if mine {
		defer func() {
			if e.isParked(r) { // a parked request keeps its mark until the feeder releases it
				return
			}
			e.done(r)
			if err != nil {
				// The feeder may have taken it meanwhile (and skipped it as
				// queued here): back to accepted, and its database to the
				// feeder's next pass, so it is taken again now rather than
				// at a sweep or once stale.
				e.release([]model.CouponRequest{r})
				e.markDirty([]int{r.Shard.DB()})
			}
		}()
	}
	if pass, err := e.decide(ctx, r); err != nil || !pass {
		if err != nil {
			return r, err
		}
		return storage.CouponRequestOf(ctx, e.cfg.Store, r.Shard, r.App, r.Serial)
	}
	if err := e.issue(ctx, []model.CouponRequest{r}, mine, true); err != nil {
		return r, err
	}
	return storage.CouponRequestOf(ctx, e.cfg.Store, r.Shard, r.App, r.Serial)
}

// StepTimeout bounds one step in flight (a decision, a merge's deduction
// and issue, a green request), also at a stop.
const StepTimeout = 30 * time.Second

// Run starts the feeder, layer 1's deciders and layer 2's mergers, and
// returns when ctx ends and every step in flight is done (each bounded by
// StepTimeout); the requests still queued are released (accepted again).
// An engine runs once.
func (e *Engine) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { e.feed(ctx) })
	wg.Go(func() { e.keepHeld(ctx) })
	wg.Go(func() { e.keepCopy(ctx) })
	decisions, merges := make(chan []model.CouponRequest), make(chan []model.CouponRequest)
	wg.Go(func() { e.gather1(ctx, decisions) })
	wg.Go(func() { e.gather2(ctx, merges) })
	for range e.cfg.Workers {
		wg.Go(func() { e.layer1(ctx, decisions) })
	}
	for range e.cfg.Mergers {
		wg.Go(func() { e.layer2(ctx, merges) })
	}
	wg.Wait()
	e.drain()
}

// drain releases what is left in the queues, after the workers stopped,
// and closes the held leases no green decision still uses (one that does
// is settled at its expiry by its coupons).
func (e *Engine) drain() {
	e.mu.Lock() // keep takes e.mu: no lease is kept after closeHeld below
	e.stopping.Store(true)
	e.mu.Unlock()
	var rest []model.CouponRequest
loop1:
	for {
		select {
		case r := <-e.q1:
			rest = append(rest, r)
		default:
			break loop1
		}
	}
loop2:
	for {
		select {
		case q := <-e.q2:
			rest = append(rest, q.r)
		default:
			break loop2
		}
	}
	for _, r := range rest {
		e.done(r)
	}
	e.release(rest)
	e.unpark(time.Time{}, true)
	ctx, cancel := context.WithTimeout(context.Background(), StepTimeout)
	defer cancel()
	e.closeHeld(ctx, true)
}

// release puts requests this engine will not decide back to accepted.
func (e *Engine) release(rs []model.CouponRequest) {
	if len(rs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := storage.ReleaseCouponRequests(ctx, e.cfg.Store, rs); err != nil {
		e.log.Warn("coupons: queued requests not released; the next owner takes them once stale", "requests", len(rs), "err", err)
		return
	}
	e.Stats.Released.Add(int64(len(rs)))
}

// feedTick is how often the feeder takes requests from the databases
// accepted into since its last take (the dirty set: this process's
// accepts that did not go straight into the queue, and takes that failed).
const feedTick = 50 * time.Millisecond

// sweepEvery is how often the feeder also sweeps every database it
// decides: requests deciding longer than StaleAfter (their taker died or
// stalled) and, at the first sweep and whenever the databases it decides
// change (a move), every request there, which earlier processes or cells
// accepted. A sixth of StaleAfter (10 s at the default minute), at least a
// second: a stale request waits at most that past StaleAfter, and an idle
// cell reads each database's queue once a sweep rather than every tick.
func (e *Engine) sweepEvery() time.Duration { return max(time.Second, e.cfg.StaleAfter/6) }

// feed moves stored requests into layer 1's queue.
func (e *Engine) feed(ctx context.Context) {
	last := time.Time{}
	var swept []int // the databases of the last sweep
	// The first sweep takes every deciding request, however recent: an
	// engine starting over its databases finds the requests an earlier one
	// (this cell's last process, killed) held. Taken twice, a request is
	// still decided once.
	first := true
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		case <-e.clock.After(feedTick):
		}
		e.unpark(e.clock.Now(), false)
		if e.paused() {
			continue // the accepted requests wait; the dirty set keeps where
		}
		now := e.clock.Now()
		all := e.cfg.DBs()
		e.mu.Lock()
		var dbs []int
		staleMS := int64(-1) // a quick pass takes accepted requests only
		if now.Sub(last) >= e.sweepEvery() || !sameDBs(all, swept) {
			dbs, last, swept = all, now, slices.Clone(all)
			staleMS = now.Add(-e.cfg.StaleAfter).UnixMilli()
			if first {
				staleMS, first = now.UnixMilli(), false
			}
		} else {
			for db := range e.dirty {
				dbs = append(dbs, db)
			}
		}
		clear(e.dirty)
		e.mu.Unlock()
		e.feedDBs(ctx, dbs, staleMS)
	}
}

// sameDBs reports whether a and b list the same databases, in any order.
func sameDBs(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// feedDBs takes as many requests of dbs as layer 1's queue has room for,
// in one take.
func (e *Engine) feedDBs(ctx context.Context, dbs []int, staleMS int64) {
	if len(dbs) == 0 {
		return
	}
	room := cap(e.q1) - len(e.q1)
	if room <= 0 {
		e.markDirty(dbs) // again at the next tick
		e.setBacklog(true)
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout)
	defer cancel()
	rs, err := storage.TakeCouponRequests(tctx, e.cfg.Store, dbs, staleMS, room)
	if err != nil {
		e.markDirty(dbs)
		e.takes.Fail(err, "dbs", len(dbs)) // logged when it starts, summarized, and when it ends
		return
	}
	e.takes.OK()
	if ctx.Err() != nil { // stopping: give them back at once
		e.release(rs)
		return
	}
	if e.paused() {
		// Issuing went off while the take ran (a first sweep over cold
		// tables takes seconds): what it took, accepted after the switch
		// perhaps, waits in its rows like the rest rather than being
		// decided now.
		e.release(rs)
		e.markDirty(dbs)
		return
	}
	// A database that gave requests may hold more (a take asks each for a
	// share, which requests queued at their accept and still accepted fill
	// as well): it is asked again at the next tick. So is every database of
	// a take that found as many requests as the queue had room for: those
	// that gave none may have been cut off by the older requests of others.
	var over []model.CouponRequest
	gave := map[int]bool{}
	for _, r := range rs {
		gave[r.Shard.DB()] = true
	}
	e.feeding.Lock() // gather1 takes the take as one chunk
	for _, r := range rs {
		e.mu.Lock()
		dup := e.queued[key(r)]
		e.queued[key(r)] = true
		e.mu.Unlock()
		if dup { // still in a queue here (taken again once stale, or queued at its accept)
			continue
		}
		select {
		case e.q1 <- r:
			e.Stats.Fed.Add(1)
		default: // accepts queued since the room was counted took it
			e.done(r)
			over = append(over, r)
		}
	}
	e.feeding.Unlock()
	again := dbs // a take cut at room: every database asked may hold more
	if len(rs) < room {
		again = again[:0:0]
		for db := range gave {
			again = append(again, db)
		}
	}
	e.markDirty(again)
	if len(over) > 0 { // back to accepted, taken at a next tick
		e.release(over)
	}
	e.setBacklog(len(over) > 0 || len(rs) >= room)
}

// setBacklog says whether requests wait in their rows beyond what the
// feeder's last take found room for (queueNow queues none meanwhile).
func (e *Engine) setBacklog(b bool) {
	e.mu.Lock()
	e.backlog = b
	e.mu.Unlock()
}

func (e *Engine) markDirty(dbs []int) {
	e.mu.Lock()
	for _, db := range dbs {
		e.dirty[db] = true
	}
	e.mu.Unlock()
}

// done takes r off the engine's books: decided, or handed back for good.
// A parked request is not done (unpark releases it).
func (e *Engine) done(r model.CouponRequest) {
	e.mu.Lock()
	delete(e.queued, key(r))
	delete(e.tries, key(r))
	e.mu.Unlock()
}

// gather1 drains layer 1's queue at layer 1's rate: one token per
// request, what is queued taken as one chunk (up to decideMax) and handed
// to a free decider (layer1). One gatherer, so that queued requests stay
// together however many deciders wait: while every decider is busy, the
// next chunk grows in the queue, and a decision's one read of holdings
// covers more requests the busier the cell is.
func (e *Engine) gather1(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		if err := e.cfg.Layer1.Wait(ctx); err != nil {
			return
		}
		var first model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case first = <-e.q1:
		}
		// The rest of a take the feeder is queuing is in once it lets go:
		// the lock is a barrier here, held by feedDBs, not by this.
		e.feeding.Lock()
		//lint:ignore SA2001 a barrier: wait for the take feedDBs is queuing, hold nothing
		e.feeding.Unlock()
		rs := []model.CouponRequest{first}
		until := e.gatherUntil(0)
	more:
		for len(rs) < decideMax && e.cfg.Layer1.Allow() {
			select {
			case r := <-e.q1:
				rs = append(rs, r)
				continue
			default:
			}
			if until == nil {
				break more
			}
			select {
			case r := <-e.q1:
				rs = append(rs, r)
			case <-until:
				break more
			case <-ctx.Done():
				break more
			}
		}
		if !e.handOver(ctx, out, rs) {
			return
		}
	}
}

// gatherUntil is when a gatherer of layer (0: layer 1, 1: layer 2) that
// got its first request stops waiting for more: Config.Gather after now
// (nil, never, for none: it takes what is queued at once). A chunk that
// fills, or a token its limiter refuses, ends the wait before.
func (e *Engine) gatherUntil(layer int) <-chan time.Time {
	if w := e.cfg.Gather[layer]; w > 0 {
		return e.clock.After(w)
	}
	return nil
}

// handOver gives a chunk to a free worker of out or, when ctx ends first,
// releases it (back to accepted); false when ctx ended.
func (e *Engine) handOver(ctx context.Context, out chan<- []model.CouponRequest, rs []model.CouponRequest) bool {
	select {
	case out <- rs:
		return true
	case <-ctx.Done():
		for _, r := range rs {
			e.done(r)
		}
		e.release(rs)
		return false
	}
}

// layer1 decides the chunks gather1 hands it, each together (one read of
// the persons' holdings, one write per refusal reason), and queues what
// passes for layer 2.
func (e *Engine) layer1(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		var rs []model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case rs = <-in:
		}
		now := e.clock.Now()
		for _, r := range rs {
			if r.TakenMS > 0 {
				e.cfg.Observe.Waited(1, now.Sub(time.UnixMilli(r.TakenMS)))
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		pass, err := e.decideMany(dctx, rs, true)
		cancel()
		if err != nil {
			// Nothing decided is lost: the requests are taken again after a
			// pause.
			e.log.Warn("coupons: decision failed; the requests are taken again", "requests", len(rs), "err", err)
			e.park(rs, e.clock.Now().Add(backoffFor), true)
		}
		passed := map[string]bool{}
		for _, r := range pass {
			passed[key(r)] = true
		}
		for _, r := range rs {
			if !passed[key(r)] && !e.isParked(r) {
				e.done(r)
			}
		}
		if !e.queue2(ctx, pass) {
			return
		}
	}
}

// queue2 puts a decision's passed requests into layer 2's queue, as one
// run while there is room (gather2 takes them together), then waiting for
// room; when ctx ends first, the rest are released. False when ctx ended.
func (e *Engine) queue2(ctx context.Context, pass []model.CouponRequest) bool {
	i := 0
	e.passing.Lock()
	now := e.clock.Now()
room:
	for ; i < len(pass); i++ {
		select {
		case e.q2 <- queued{r: pass[i], at: now}:
		default:
			break room
		}
	}
	e.passing.Unlock()
	for ; i < len(pass); i++ {
		select {
		case e.q2 <- queued{r: pass[i], at: e.clock.Now()}:
		case <-ctx.Done():
			e.release(pass[i:])
			for _, r := range pass[i:] {
				e.done(r)
			}
			return false
		}
	}
	return true
}

// decideMax is the most requests one layer 1 decision takes together.
const decideMax = 32

// decide is layer 1 for one request (the green channel).
func (e *Engine) decide(ctx context.Context, r model.CouponRequest) (pass bool, err error) {
	ps, err := e.decideMany(ctx, []model.CouponRequest{r}, false)
	return len(ps) == 1, err
}

// decideMany is layer 1 for requests taken together: the batch open at
// each one's accept time, the risk caps, and the person's holding (one
// read for all). Refusals are written (final), one write per reason; the
// requests that pass are returned, and a person's requests that cannot all
// pass together are released to be decided after. On an error nothing is
// refused.
func (e *Engine) decideMany(ctx context.Context, rs []model.CouponRequest, owned bool) (pass []model.CouponRequest, err error) {
	cat := e.catalog()
	refuse := map[model.CouponReason][]model.CouponRequest{}
	var asks []model.CouponRequest
	rules := map[string]model.CouponRule{}
	now := e.clock.Now()
	for _, r := range rs {
		// The window is the request's: accepted while the batch issued, it
		// is decided even when a backlog brings it here after the end.
		b, err := cat.Open(r.Batch, time.UnixMilli(r.AcceptedMS))
		switch {
		case err != nil:
			refuse[model.ReasonBatchClosed] = append(refuse[model.ReasonBatchClosed], r)
		case !e.risk.allow(r, cat.Risk, now):
			refuse[model.ReasonRisk] = append(refuse[model.ReasonRisk], r)
		default:
			rules[r.Batch] = ruleOf(b)
			asks = append(asks, r)
		}
	}
	if len(asks) > 0 {
		hs, err := storage.HoldingsOf(ctx, e.cfg.Store, asks)
		if err != nil {
			return nil, err
		}
		// A person's second request in one decision is checked against the
		// holding with the first one's coupon in it too: if the two cannot
		// both be issued, the second waits (released) until the first is
		// decided, rather than taking a unit of stock layer 2 would give
		// back, or being refused for a coupon the first may not get.
		tentative := map[string]model.CouponHolding{}
		var later []model.CouponRequest
		for _, r := range asks {
			rule := rules[r.Batch]
			if reason := model.DecideCoupon(rule, hs[r.ActID]); reason != "" {
				refuse[reason] = append(refuse[reason], r)
				continue
			}
			t, seen := tentative[r.ActID]
			if !seen {
				t = hs[r.ActID]
			}
			if seen && model.DecideCoupon(rule, t) != "" {
				later = append(later, r)
				continue
			}
			tentative[r.ActID] = t.Plus(rule)
			pass = append(pass, r)
		}
		e.park(later, now, owned) // taken again at the feeder's next tick
	}
	for reason, group := range refuse {
		if err := storage.RefuseCoupons(ctx, e.cfg.Store, group, reason); err != nil {
			return nil, err
		}
		e.Stats.Refused.Add(int64(len(group)))
		for _, r := range group {
			e.cfg.Observe.Final(r, false, reason, now)
		}
	}
	return pass, nil
}

func (e *Engine) catalog() *couponbatch.Catalog {
	if e.cfg.Catalog != nil {
		if c := e.cfg.Catalog(); c != nil {
			return c
		}
	}
	return emptyCatalog
}

var emptyCatalog = func() *couponbatch.Catalog {
	c, err := couponbatch.Parse([]byte("batches: [{id: none, stock: 1, face_value: 1, per_person_limit: 1, end: '1970-01-01T00:00:01Z'}]\n"), time.Unix(0, 0))
	if err != nil {
		panic(err)
	}
	return c
}()

func ruleOf(b couponbatch.Batch) model.CouponRule {
	return model.CouponRule{Batch: b.ID, Limit: b.PerPersonLimit, Group: b.Group}
}

// gather2 drains layer 2's queue at layer 2's rate: one token per
// request, what is queued (up to MergeMax) taken as one pass and handed to
// a free merger (layer2). One gatherer, as gather1: while the mergers are
// busy the next pass grows, so merges are larger the busier the cell is.
func (e *Engine) gather2(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		if err := e.cfg.Layer2.Wait(ctx); err != nil {
			return
		}
		var first queued
		select {
		case <-ctx.Done():
			return
		case first = <-e.q2:
		}
		// The rest of that decision's pass is in the queue once its
		// decider lets go (queue2): a barrier, as in gather1.
		e.passing.Lock()
		//lint:ignore SA2001 a barrier: wait for the decider's pass (queue2), hold nothing
		e.passing.Unlock()
		now := e.clock.Now()
		e.cfg.Observe.Waited(2, now.Sub(first.at))
		batch := []model.CouponRequest{first.r}
		until := e.gatherUntil(1)
	more:
		for mergeMax := int(e.merge.Load()); len(batch) < mergeMax && e.cfg.Layer2.Allow(); {
			var q queued
			select {
			case q = <-e.q2:
			default:
				if until == nil {
					break more
				}
				select {
				case q = <-e.q2:
				case <-until:
					break more
				case <-ctx.Done():
					break more
				}
			}
			e.cfg.Observe.Waited(2, e.clock.Now().Sub(q.at))
			batch = append(batch, q.r)
		}
		if !e.handOver(ctx, out, dedupe(batch)) {
			return
		}
	}
}

// layer2 merges and issues the passes gather2 hands it.
func (e *Engine) layer2(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		var batch []model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case batch = <-in:
		}
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		if err := e.issue(ictx, batch, true, false); err != nil {
			e.log.Warn("coupons: issue failed; the requests are taken again once stale", "requests", len(batch), "err", err)
		}
		cancel()
		for _, r := range batch {
			if !e.isParked(r) {
				e.done(r)
			}
		}
	}
}

// issue is layer 2 for requests taken together: one deduction and one
// issuing transaction per batch. A batch no longer in the catalog refuses
// its requests (BATCH_CLOSED); the window was decided by layer 1.
//
// owned says the caller holds the requests' places in the queued set: a
// request released to be taken again leaves it. A green decision of a
// request the feeder queued as well does not own it, and leaves the mark
// to the queue's copy (removing it would let the feeder queue a second).
//
// green: the caller waits for the final state (the green channel), so a
// deduction that found nothing free while this engine's other merges hold
// units waits for them rather than releasing the request.
func (e *Engine) issue(ctx context.Context, reqs []model.CouponRequest, owned, green bool) error {
	byBatch := map[string][]model.CouponRequest{}
	var order []string
	for _, r := range reqs {
		if byBatch[r.Batch] == nil {
			order = append(order, r.Batch)
		}
		byBatch[r.Batch] = append(byBatch[r.Batch], r)
	}
	cat := e.catalog()
	// The batches of a pass are deducted and issued side by side: each has
	// its own stock row, and the persons' rows are locked in one order by
	// every issue.
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, id := range order {
		wg.Go(func() {
			group := byBatch[id]
			b, ok := cat.Batch(id)
			if !ok {
				errs[i] = e.refuse(ctx, group, model.ReasonBatchClosed)
				return
			}
			e.mu.Lock()
			now := e.clock.Now()
			out, wait := now.Before(e.soldOut[id]), now.Before(e.backoff[id])
			e.mu.Unlock()
			if wait { // its stock did not answer a moment ago: taken again later
				e.park(group, e.backoffUntil(id), owned)
				return
			}
			if out {
				errs[i] = e.soldOutNow(ctx, group, owned)
				return
			}
			if err := e.issueBatch(ctx, ruleOf(b), group, owned, green); err != nil {
				errs[i] = fmt.Errorf("batch %s: %w", id, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (e *Engine) refuse(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	if err := storage.RefuseCoupons(ctx, e.cfg.Store, reqs, reason); err != nil {
		return fmt.Errorf("refuse %d (%s): %w", len(reqs), reason, err)
	}
	e.Stats.Refused.Add(int64(len(reqs)))
	now := e.clock.Now()
	for _, r := range reqs {
		e.cfg.Observe.Final(r, false, reason, now)
	}
	return nil
}

// A green request whose deduction found nothing free while this engine's
// other merges hold units of the batch asks again every greenWait, at most
// greenWaits times, before it is refused SOLD_OUT; with nothing held here,
// for greenPeerWait (another cell's idle held lease is closed by then).
const (
	greenWait      = 10 * time.Millisecond
	greenWaits     = 100
	greenPeerWait  = heldIdle + 2*heldTick
	greenPeerPause = 100 * time.Millisecond
)

// holding reports whether this engine's merges hold units of batch now.
func (e *Engine) holding(batch string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inflight[batch]+e.heldLeftLocked(batch) > 0
}

// backoffFor is how long a batch whose deduction failed is left alone: its
// requests are parked and taken again after it.
const backoffFor = time.Second

// heldWait is how long requests wait that found no unit free while this
// engine's merges held some: about a step.
const heldWait = 100 * time.Millisecond

// backoffUntil is when batch's pause ends.
func (e *Engine) backoffUntil(batch string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.backoff[batch]
}

// parked is a request this engine put aside: it stays deciding, marked
// queued here, until the feeder releases it (accepted) at until.
type parked struct {
	r     model.CouponRequest
	until time.Time
}

// park puts requests aside until until; the feeder then puts them back to
// accepted and takes them again. Until then they stay deciding and marked
// queued here, so no pass takes them twice and a batch's pause (a failed
// deduction, a sold-out mark) really passes before they are tried again.
// A request the caller does not own (a green decision of one the feeder
// queued too) is left to its queued copy.
func (e *Engine) park(reqs []model.CouponRequest, until time.Time, owned bool) {
	if !owned {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range reqs {
		e.parked[key(r)] = parked{r: r, until: until}
	}
}

// isParked reports whether r is put aside (its queued mark is the park's).
func (e *Engine) isParked(r model.CouponRequest) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.parked[key(r)]
	return ok
}

// unpark releases the parked requests due by now (all of them with
// everything true), off the queued set first.
func (e *Engine) unpark(now time.Time, everything bool) {
	var due []model.CouponRequest
	e.mu.Lock()
	for k, p := range e.parked {
		if everything || !now.Before(p.until) {
			due = append(due, p.r)
			delete(e.parked, k)
			delete(e.queued, k)
			e.dirty[p.r.Shard.DB()] = true
		}
	}
	e.mu.Unlock()
	e.release(due)
}

// soldOutFor is how long a batch whose deduction found nothing free is
// taken as sold out without asking the stock again.
const soldOutFor = time.Second

// soldOutTries is how many times a request finds its batch with nothing
// free before it is refused SOLD_OUT: units other merges hold in leases
// come back unused within a step, so a request released and taken again
// (the feeder's sweep, a second later) gets them.
const soldOutTries = 3

// soldOutNow answers requests whose batch had nothing free: refused
// SOLD_OUT after soldOutTries (a green one at once: its caller waits for
// the final state), else released to be taken again.
func (e *Engine) soldOutNow(ctx context.Context, reqs []model.CouponRequest, owned bool) error {
	var refuse, again []model.CouponRequest
	e.mu.Lock()
	for _, r := range reqs {
		e.tries[key(r)]++
		if e.tries[key(r)] >= soldOutTries || r.Green { // a green request is answered now
			delete(e.tries, key(r))
			refuse = append(refuse, r)
		} else {
			again = append(again, r)
		}
	}
	e.mu.Unlock()
	// Tried again once the sold-out mark has passed: each try asks the
	// stock anew.
	if len(again) > 0 {
		e.park(again, e.clock.Now().Add(soldOutFor), owned)
	}
	if len(refuse) > 0 {
		return e.refuse(ctx, refuse, model.ReasonSoldOut)
	}
	return nil
}

// issueBatch deducts once for reqs (one batch) and issues: from a held
// lease of the batch with enough units left (held.go), else from a lease
// granted now, of the merge's units plus the prefetch when the merge is
// smaller than it (the rest kept as a held lease when all were granted). A
// grant of fewer units than requests issues as many requests as units and
// parks the others, or counts them towards SOLD_OUT (soldOutNow). Whatever happens after the grant, a
// lease not kept is closed with what it did not spend when that is known;
// only an issue whose COMMIT lost its answer leaves its lease open, its
// units counted out (under-issue, never over-issue) until it is settled by
// its coupons.
func (e *Engine) issueBatch(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, owned, green bool) (err error) {
	e.cfg.Observe.Merged(rule.Batch, len(reqs))
	n := int64(len(reqs))
	if h := e.fromHeld(rule.Batch, n); h != nil {
		e.Stats.HeldDeductions.Add(1)
		ds, unused, err := storage.IssueCoupons(ctx, e.cfg.Store, rule, h.id, n, reqs)
		if err != nil {
			lost := errors.Is(err, storage.ErrCommitUnknown)
			open := e.endHeld(h, n, n, lost)
			if lost {
				e.cfg.Observe.LeftOpen(rule.Batch, open)
				return fmt.Errorf("issue %d from held lease %s (left open): %w", n, h.id, err)
			}
			e.park(reqs, e.clock.Now(), owned)
			return fmt.Errorf("issue %d: %w", n, err)
		}
		e.finals(reqs, ds)
		e.endHeld(h, n, unused, false)
		return nil
	}
	want := n
	if pre := e.prefetch(rule.Batch); n < pre {
		// Only a merge smaller than the prefetch asks for more: a full one
		// already shares its grant, and a held lease serves merges of up to
		// its units left.
		want += pre
	}
	asked := e.clock.Now()
	lease, granted, err := e.cfg.Stock.Grant(ctx, rule.Batch, want)
	// A green request that found nothing asks again while this engine
	// holds units, and for greenPeerWait in any case: another cell's idle
	// held lease goes back to the home within heldIdle+heldTick.
	started := e.clock.Now()
	for wait := 0; err == nil && granted == 0 && green && wait < greenWaits &&
		(e.holding(rule.Batch) || e.clock.Now().Sub(started) < greenPeerWait); wait++ {
		pause := greenPeerPause // another cell's units: they come back after its idle time
		if e.holding(rule.Batch) {
			pause = greenWait // this engine's own: back within a step
		}
		e.retireHeld(rule.Batch)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.clock.After(pause):
		}
		lease, granted, err = e.cfg.Stock.Grant(ctx, rule.Batch, n)
	}
	if err != nil {
		// Granted or not, unknown: a lease granted without an answer is
		// settled by its (zero) coupons. The requests are taken again after
		// a pause of the batch, not only once stale.
		until := e.clock.Now().Add(backoffFor)
		e.mu.Lock()
		e.backoff[rule.Batch] = until
		e.mu.Unlock()
		e.park(reqs, until, owned)
		return fmt.Errorf("deduct %d: %w", n, err)
	}
	e.Stats.Deductions.Add(1)
	if granted < want { // the home had less than asked: near the end, no prefetch for a while
		e.mu.Lock()
		e.short[rule.Batch] = e.clock.Now().Add(shortFor)
		e.mu.Unlock()
	}
	if granted == 0 {
		e.retireHeld(rule.Batch) // what they hold goes back to the stock, for anyone
		e.mu.Lock()
		held := e.inflight[rule.Batch] + e.heldLeftLocked(rule.Batch)
		if held == 0 {
			e.soldOut[rule.Batch] = e.clock.Now().Add(soldOutFor)
		}
		e.mu.Unlock()
		if held > 0 && !green {
			// Units this engine's other merges or held leases hold may come
			// back unused: not sold out yet; the requests are taken again
			// shortly.
			e.park(reqs, e.clock.Now().Add(heldWait), owned)
			return nil
		}
		return e.soldOutNow(ctx, reqs, owned)
	}
	if granted < n {
		// Fewer units than requests: the batch is near its end, but units
		// held here or by other cells may still come back. The requests
		// beyond the units are not refused now: they go the way of a
		// deduction that found nothing (parked while this engine holds
		// units, else counted towards SOLD_OUT after soldOutTries).
		e.retireHeld(rule.Batch)
		rest := reqs[granted:]
		reqs = reqs[:granted]
		n = granted
		if e.holding(rule.Batch) && !green {
			e.park(rest, e.clock.Now().Add(heldWait), owned)
		} else if rerr := e.soldOutNow(ctx, rest, owned); rerr != nil {
			defer func() { err = errors.Join(err, rerr) }()
		}
	}
	var h *heldLease
	if granted > n && granted == want {
		// The merge's units now, the rest kept for the batch's next merges
		// (unless the engine began stopping meanwhile).
		h = e.keep(rule.Batch, lease, granted, n, asked)
	}
	if h != nil {
		ds, unused, err := storage.IssueCoupons(ctx, e.cfg.Store, rule, lease, n, reqs)
		if err != nil {
			lost := errors.Is(err, storage.ErrCommitUnknown)
			open := e.endHeld(h, n, n, lost)
			if lost {
				e.cfg.Observe.LeftOpen(rule.Batch, open)
				return fmt.Errorf("issue %d from lease %s (left open, %d units out): %w", n, lease, granted, err)
			}
			e.park(reqs, e.clock.Now(), owned)
			return fmt.Errorf("issue %d: %w", n, err)
		}
		e.finals(reqs, ds)
		e.endHeld(h, n, unused, false)
		return nil
	}
	e.mu.Lock()
	e.inflight[rule.Batch] += granted
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inflight[rule.Batch] -= granted
		e.mu.Unlock()
	}()
	ds, unused, err := storage.IssueCoupons(ctx, e.cfg.Store, rule, lease, granted, reqs)
	if err != nil {
		if errors.Is(err, storage.ErrCommitUnknown) {
			e.cfg.Observe.LeftOpen(rule.Batch, granted)
			return fmt.Errorf("issue %d from lease %s (left open, %d units out): %w", n, lease, granted, err)
		}
		// Nothing was written: every unit goes back, and the requests are
		// taken again.
		if rerr := e.giveBack(ctx, rule.Batch, lease, granted); rerr != nil {
			return errors.Join(fmt.Errorf("issue %d: %w", n, err), rerr)
		}
		e.park(reqs, e.clock.Now(), owned)
		return fmt.Errorf("issue %d: %w", n, err)
	}
	e.finals(reqs, ds)
	// Closed even when every unit was spent, so that nobody settles it.
	return e.giveBack(ctx, rule.Batch, lease, unused)
}

// finals counts and reports the decisions ds of reqs.
func (e *Engine) finals(reqs []model.CouponRequest, ds []model.CouponDecision) {
	bySerial := make(map[string]model.CouponRequest, len(reqs))
	for _, r := range reqs {
		bySerial[r.App+"\x00"+r.Serial] = r
	}
	now := e.clock.Now()
	for _, d := range ds {
		if d.Issued {
			e.Stats.Issued.Add(1)
		} else {
			e.Stats.Refused.Add(1)
		}
		e.cfg.Observe.Final(bySerial[d.App+"\x00"+d.Serial], d.Issued, d.Reason, now)
	}
}

// giveBack closes a lease with unused units, trying a few times (a return
// is repeatable).
func (e *Engine) giveBack(ctx context.Context, batch, lease string, unused int64) error {
	var err error
	for attempt := range 3 {
		if err = e.cfg.Stock.Return(ctx, batch, lease, unused); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("return %d unused of lease %s: %w", unused, lease, err)
		case <-e.clock.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return fmt.Errorf("return %d unused of lease %s (left open): %w", unused, lease, err)
}

// riskCounters are the built-in risk check's per-minute counts, per cell:
// a person's requests all reach the person's cell (routed by act_id), a
// device's or an IP's only when they ask for one person.
type riskCounters struct {
	mu      sync.Mutex
	minute  int64
	m       map[string]int
	verdict map[string]bool // requests counted this minute (key), and whether they passed
}

// allow counts r under its device, IP and act_id for the current minute
// and answers whether every count is within its cap. A request decided
// again (released and taken again) is counted once a minute: it gets the
// verdict it got.
func (c *riskCounters) allow(r model.CouponRequest, caps couponbatch.RiskRules, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := now.Unix() / 60; m != c.minute || c.verdict == nil {
		c.minute = m
		clear(c.m)
		c.verdict = map[string]bool{}
	}
	if v, ok := c.verdict[key(r)]; ok {
		return v
	}
	ok := true
	for _, k := range []struct {
		name, v string
		cap     int
	}{{"d", r.DeviceID, caps.PerDevicePerMin}, {"i", r.ClientIP, caps.PerIPPerMin}, {"a", r.ActID, caps.PerActPerMin}} {
		if k.v == "" {
			continue
		}
		c.m[k.name+k.v]++
		if c.m[k.name+k.v] > k.cap {
			ok = false
		}
	}
	c.verdict[key(r)] = ok
	return ok
}
