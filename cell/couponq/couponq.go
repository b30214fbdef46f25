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
	"log/slog"
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

// Engine is the coupon engine: it composes its three roles and wires their
// hand-offs. The feeder (feeder.go) puts requests into layer 1's queue (at
// their accept, or taken from the databases) and keeps the books of the
// requests the engine holds; the decider (decider.go, layer 1) decides them
// against the batches' rules, the risk caps and the persons' holdings, and
// queues those that pass for layer 2; the merger (merger.go and held.go,
// layer 2) merges them by batch, deducts each batch's stock once per merge
// and issues the coupons. Each role owns its state, under its own lock; the
// decider and the merger hand requests back to the feeder's books (park,
// done, release). The Engine itself owns the accept and the local copy of
// the batches' stock (copy.go). Safe for concurrent use.
type Engine struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	copies  *incident.Tracker           // the stock copy's reads failing (a home down)
	catalog func() *couponbatch.Catalog // never nil (catalogOf)

	feeder  *feeder
	decider *decider
	merger  *merger

	mu    sync.Mutex           // guards stock, asked
	stock map[string]copied    // the local copy of each batch's stock (copy.go)
	asked map[string]time.Time // when a request last asked each batch's copy (copy.go)

	Stats Stats
}

// handoff is a layer's bounded queue (Config.QueueLen), drained by that
// layer's gatherer, with the barrier of a run: the role that puts a run of
// requests in (the feeder's take, a decision's passed requests) holds run
// while it does, and the gatherer, having got a run's first request, waits
// for the rest (run locked and let go) before it takes a chunk.
type handoff[T any] struct {
	ch  chan T
	run sync.Mutex
}

// first waits for a token of limit (one per request) and for the queue's
// next request, then for the rest of its run: the lock is a barrier here,
// held by the producer (the feeder's feedDBs, a decider's queue2), not by
// this. False when ctx ended first.
func (h *handoff[T]) first(ctx context.Context, limit Limiter) (v T, ok bool) {
	if err := limit.Wait(ctx); err != nil {
		return v, false
	}
	select {
	case <-ctx.Done():
		return v, false
	case v = <-h.ch:
	}
	h.run.Lock()
	//lint:ignore SA2001 a barrier: wait for the run its producer is queuing, hold nothing
	h.run.Unlock()
	return v, true
}

// drain takes what the queue holds now, without waiting.
func (h *handoff[T]) drain() []T {
	var out []T
	for {
		select {
		case v := <-h.ch:
			out = append(out, v)
		default:
			return out
		}
	}
}

// books is what the decider and the merger ask of the feeder about the
// requests they hold: each is on the feeder's books from its take (or its
// accept) until it is done, parked in between, or released (accepted again).
type books interface {
	park(reqs []model.CouponRequest, until time.Time, owned bool)
	isParked(r model.CouponRequest) bool
	done(r model.CouponRequest)
	release(rs []model.CouponRequest)
}

var _ books = (*feeder)(nil)

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
	catalog, paused := catalogOf(cfg.Catalog), pausedOf(cfg.Paused)
	e := &Engine{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Log,
		copies: incident.New(cfg.Log, "coupons: read the stock copy", incident.DefaultEvery), catalog: catalog,
		stock: map[string]copied{}, asked: map[string]time.Time{}}
	q1 := &handoff[model.CouponRequest]{ch: make(chan model.CouponRequest, cfg.QueueLen)}
	q2 := &handoff[queued]{ch: make(chan queued, cfg.QueueLen)}
	e.merger = newMerger(layerOf(cfg, 1, e.clock, nil, catalog, &e.Stats), cfg, q2)
	e.feeder = newFeeder(cfg, e.clock, paused, q1, e.merger.forget, &e.Stats)
	e.merger.books = e.feeder // set once the feeder, which forgets through the merger, is made
	e.decider = &decider{layer: layerOf(cfg, 0, e.clock, e.feeder, catalog, &e.Stats), in: q1, out: q2,
		risk: riskCounters{m: map[string]int{}}}
	return e, nil
}

// key names a request in the engine: its database, app and serial (a
// serial is unique per app within one database; the same serial of an app
// for a person of another database is another request).
func key(r model.CouponRequest) string {
	return strconv.Itoa(r.Shard.DB()) + "\x00" + r.App + "\x00" + r.Serial
}

func (e *Engine) paused() bool { return e.feeder.paused() }

// pausedOf is Config.Paused, never nil (nil: never paused).
func pausedOf(p func() bool) func() bool {
	return func() bool { return p != nil && p() }
}

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
func (e *Engine) SetMergeMax(n int) { e.merger.mergeMax.Store(int64(max(n, 1))) }

// SetPrefetch changes how many units beyond its own a merge's deduction
// asks for, from the next grant on (0: none; held leases are used up or
// closed as they age).
func (e *Engine) SetPrefetch(n int64) { e.merger.pre.Store(max(n, 0)) }

// Prefetch is what SetPrefetch last set (Config.Prefetch at first).
func (e *Engine) Prefetch() int64 { return e.merger.pre.Load() }

// MergeMax is the bound SetMergeMax last set (Config.MergeMax at first).
func (e *Engine) MergeMax() int { return int(e.merger.mergeMax.Load()) }

// Depths returns how many requests wait in layer 1's and layer 2's queues.
func (e *Engine) Depths() (layer1, layer2 int) {
	return len(e.decider.in.ch), len(e.merger.in.ch)
}

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
	if !repeat && !e.feeder.queueNow(got) {
		e.feeder.wake(r.Shard.DB())
	}
	return got, repeat, nil
}

// decideNow runs both layers for one request, without the queues or their
// limiters, and answers the request as stored after.
func (e *Engine) decideNow(ctx context.Context, r model.CouponRequest) (_ model.CouponRequest, err error) {
	// The feeder skips it while it is decided here (it may still find it
	// accepted); should a queue hold it already, IssueCoupons and
	// RefuseCoupons decide it once.
	f := e.feeder
	mine := f.claim(r)
	if mine {
		defer func() {
			if f.isParked(r) { // a parked request keeps its mark until the feeder releases it
				return
			}
			f.done(r)
			if err != nil {
				// The feeder may have taken it meanwhile (and skipped it as
				// queued here): back to accepted, and its database to the
				// feeder's next pass, so it is taken again now rather than
				// at a sweep or once stale.
				f.release([]model.CouponRequest{r})
				f.markDirty([]int{r.Shard.DB()})
			}
		}()
	}
	if pass, err := e.decider.decide(ctx, r); err != nil || !pass {
		if err != nil {
			return r, err
		}
		return storage.CouponRequestOf(ctx, e.cfg.Store, r.Shard, r.App, r.Serial)
	}
	if err := e.merger.issue(ctx, []model.CouponRequest{r}, mine, true); err != nil {
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
	wg.Go(func() { e.feeder.feed(ctx) })
	wg.Go(func() { e.merger.keepHeld(ctx) })
	wg.Go(func() { e.keepCopy(ctx) })
	decisions, merges := make(chan []model.CouponRequest), make(chan []model.CouponRequest)
	wg.Go(func() { e.decider.gather(ctx, decisions) })
	wg.Go(func() { e.merger.gather(ctx, merges) })
	for range e.cfg.Workers {
		wg.Go(func() { e.decider.run(ctx, decisions) })
	}
	for range e.cfg.Mergers {
		wg.Go(func() { e.merger.run(ctx, merges) })
	}
	wg.Wait()
	e.drain()
}

// drain releases what is left in the queues, after the workers stopped,
// and closes the held leases no green decision still uses (one that does
// is settled at its expiry by its coupons).
func (e *Engine) drain() {
	e.feeder.stop()
	e.merger.stop() // no lease is kept after closeHeld below
	rest := e.decider.in.drain()
	for _, q := range e.merger.in.drain() {
		rest = append(rest, q.r)
	}
	for _, r := range rest {
		e.feeder.done(r)
	}
	e.feeder.release(rest)
	e.feeder.unpark(time.Time{}, true)
	ctx, cancel := context.WithTimeout(context.Background(), StepTimeout)
	defer cancel()
	e.merger.closeHeld(ctx, true)
}

// feedTick is how often the feeder takes requests from the databases
// accepted into since its last take (the dirty set: this process's
// accepts that did not go straight into the queue, and takes that failed).
const feedTick = 50 * time.Millisecond

// decideMax is the most requests one layer 1 decision takes together.
const decideMax = 32

// catalogOf is Config.Catalog, answering emptyCatalog (every request
// refused) when there is none.
func catalogOf(cat func() *couponbatch.Catalog) func() *couponbatch.Catalog {
	return func() *couponbatch.Catalog {
		if cat != nil {
			if c := cat(); c != nil {
				return c
			}
		}
		return emptyCatalog
	}
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

// backoffFor is how long a batch whose deduction failed is left alone: its
// requests are parked and taken again after it.
const backoffFor = time.Second

// heldWait is how long requests wait that found no unit free while this
// engine's merges held some: about a step.
const heldWait = 100 * time.Millisecond

// soldOutFor is how long a batch whose deduction found nothing free is
// taken as sold out without asking the stock again.
const soldOutFor = time.Second

// soldOutTries is how many times a request finds its batch with nothing
// free before it is refused SOLD_OUT: units other merges hold in leases
// come back unused within a step, so a request released and taken again
// (the feeder's sweep, a second later) gets them.
const soldOutTries = 3
