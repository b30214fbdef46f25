package couponq

// The feeder: it puts requests into layer 1's queue, just accepted
// (queueNow) or taken from the databases (feed: those stored accepted, and
// those a dead or stopped cell left deciding), and keeps the books of the
// requests the engine holds: each is on them (queued) from its take until it
// is done; the decider and the merger park requests with it to be taken
// again later (unpark), and hand back those they will not decide (release).

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/storage"
)

// feeder is the engine's first role. Its goroutine is feed; its other
// methods are safe for concurrent use.
type feeder struct {
	out        *handoff[model.CouponRequest] // layer 1's queue (the decider's): the feeder puts requests in
	kick       chan struct{}                 // cap 1: an accept left a request to the feeder
	store      Store
	dbs        func() []int // Config.DBs
	paused     func() bool  // Config.Paused, never nil
	staleAfter time.Duration
	forget     func(r model.CouponRequest) // a request off the books: what other roles count of it goes (merger.forget)
	takes      *incident.Tracker           // the feeder's takes failing (a database down)
	clock      clock.Clock
	log        *slog.Logger
	stats      *Stats

	mu       sync.Mutex
	dirty    map[int]bool      // databases accepted into since the feeder's last pass
	backlog  bool              // requests wait in their rows for the feeder: none is queued at its accept (queueNow)
	queued   map[string]bool   // the books: key of requests in a queue or a step
	parked   map[string]parked // requests put aside until a time, then released (park), by key
	stopping bool              // Run's workers have stopped: nothing is queued at its accept
}

func newFeeder(cfg Config, clk clock.Clock, paused func() bool, out *handoff[model.CouponRequest], forget func(model.CouponRequest), stats *Stats) *feeder {
	return &feeder{out: out, kick: make(chan struct{}, 1), store: cfg.Store, dbs: cfg.DBs, paused: paused, staleAfter: cfg.StaleAfter,
		forget: forget, takes: incident.New(cfg.Log, "coupons: take requests", incident.DefaultEvery), clock: clk, log: cfg.Log,
		stats: stats, dirty: map[int]bool{}, queued: map[string]bool{}, parked: map[string]parked{}}
}

// sweepEvery is how often the feeder also sweeps every database it
// decides: requests deciding longer than StaleAfter (their taker died or
// stalled) and, at the first sweep and whenever the databases it decides
// change (a move), every request there, which earlier processes or cells
// accepted. A sixth of StaleAfter (10 s at the default minute), at least a
// second: a stale request waits at most that past StaleAfter, and an idle
// cell reads each database's queue once a sweep rather than every tick.
func (f *feeder) sweepEvery() time.Duration { return max(time.Second, f.staleAfter/6) }

// feed moves stored requests into layer 1's queue.
func (f *feeder) feed(ctx context.Context) {
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
		case <-f.kick:
		case <-f.clock.After(feedTick):
		}
		f.unpark(f.clock.Now(), false)
		if f.paused() {
			continue // the accepted requests wait; the dirty set keeps where
		}
		now := f.clock.Now()
		all := f.dbs()
		f.mu.Lock()
		var dbs []int
		staleMS := int64(-1) // a quick pass takes accepted requests only
		if now.Sub(last) >= f.sweepEvery() || !sameDBs(all, swept) {
			dbs, last, swept = all, now, slices.Clone(all)
			staleMS = now.Add(-f.staleAfter).UnixMilli()
			if first {
				staleMS, first = now.UnixMilli(), false
			}
		} else {
			for db := range f.dirty {
				dbs = append(dbs, db)
			}
		}
		clear(f.dirty)
		f.mu.Unlock()
		f.feedDBs(ctx, dbs, staleMS)
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
func (f *feeder) feedDBs(ctx context.Context, dbs []int, staleMS int64) {
	if len(dbs) == 0 {
		return
	}
	room := cap(f.out.ch) - len(f.out.ch)
	if room <= 0 {
		f.markDirty(dbs) // again at the next tick
		f.setBacklog(true)
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout)
	defer cancel()
	rs, err := storage.TakeCouponRequests(tctx, f.store, dbs, staleMS, room)
	if err != nil {
		f.markDirty(dbs)
		f.takes.Fail(err, "dbs", len(dbs)) // logged when it starts, summarized, and when it ends
		return
	}
	f.takes.OK()
	if ctx.Err() != nil { // stopping: give them back at once
		f.release(rs)
		return
	}
	if f.paused() {
		// Issuing went off while the take ran (a first sweep over cold
		// tables takes seconds): what it took, accepted after the switch
		// perhaps, waits in its rows like the rest rather than being
		// decided now.
		f.release(rs)
		f.markDirty(dbs)
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
	f.out.run.Lock() // the decider's gatherer takes the take as one chunk
	for _, r := range rs {
		f.mu.Lock()
		dup := f.queued[key(r)]
		f.queued[key(r)] = true
		f.mu.Unlock()
		if dup { // still in a queue here (taken again once stale, or queued at its accept)
			continue
		}
		select {
		case f.out.ch <- r:
			f.stats.Fed.Add(1)
		default: // accepts queued since the room was counted took it
			f.done(r)
			over = append(over, r)
		}
	}
	f.out.run.Unlock()
	again := dbs // a take cut at room: every database asked may hold more
	if len(rs) < room {
		again = again[:0:0]
		for db := range gave {
			again = append(again, db)
		}
	}
	f.markDirty(again)
	if len(over) > 0 { // back to accepted, taken at a next tick
		f.release(over)
	}
	f.setBacklog(len(over) > 0 || len(rs) >= room)
}

// setBacklog says whether requests wait in their rows beyond what the
// feeder's last take found room for (queueNow queues none meanwhile).
func (f *feeder) setBacklog(b bool) {
	f.mu.Lock()
	f.backlog = b
	f.mu.Unlock()
}

func (f *feeder) markDirty(dbs []int) {
	f.mu.Lock()
	for _, db := range dbs {
		f.dirty[db] = true
	}
	f.mu.Unlock()
}

// done takes r off the engine's books: decided, or handed back for good.
// A parked request is not done (unpark releases it).
func (f *feeder) done(r model.CouponRequest) {
	f.mu.Lock()
	delete(f.queued, key(r))
	f.mu.Unlock()
	f.forget(r)
}

// wake marks db accepted into and wakes the feeder: a request accepted
// there was left to it (queueNow said false).
func (f *feeder) wake(db int) {
	f.mu.Lock()
	f.dirty[db] = true
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// claim puts r on the books for a green decision; mine is false when it is
// on them already (queued, or in a step): its queued copy keeps the mark.
func (f *feeder) claim(r model.CouponRequest) (mine bool) {
	f.mu.Lock()
	mine = !f.queued[key(r)]
	f.queued[key(r)] = true
	f.mu.Unlock()
	return mine
}

// stop ends queuing at the accept: the engine's workers have stopped.
func (f *feeder) stop() {
	f.mu.Lock()
	f.stopping = true
	f.mu.Unlock()
}

// queueNow puts a request just accepted straight into layer 1's queue,
// stored as it is (accepted): the feeder need not take it, a take being a
// transaction of its own, one per request or two when the cell is not
// busy. A request the feeder's sweep takes as well is queued once
// (f.queued). One left queued by a cell that dies is still accepted (or
// deciding, if a sweep marked it), for the next owner. False, for the
// feeder to take it, when the engine is paused or stopping, when layer 1's
// queue is full, and while the feeder has a backlog (the queue was full, or
// its last take found as many requests as the queue had room for): the
// feeder then takes the waiting requests oldest first, and a new one does
// not jump them. Once a take finds fewer, accepts are queued again; the
// few accepted during that take wait for the feeder's next pass, a few
// milliseconds (woken by their accepts).
func (f *feeder) queueNow(r model.CouponRequest) bool {
	if f.paused() {
		return false
	}
	r.TakenMS = f.clock.Now().UnixMilli() // queued now: layer 1's wait counts from here
	// Under f.mu, mark and send together (the send never blocks): the
	// feeder's duplicate check and done() see a request either queued and
	// marked or neither. A request left to the feeder marks its database
	// dirty under the same lock, so no later accept is queued before the
	// feeder took it.
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.queued[key(r)] { // a sweep took it already
		return true
	}
	if f.stopping || f.backlog {
		f.dirty[r.Shard.DB()] = true
		return false
	}
	select {
	case f.out.ch <- r:
		f.queued[key(r)] = true
		f.stats.Queued.Add(1)
		return true
	default:
		f.backlog = true // the queue is full: the feeder takes what waits, in order
		f.dirty[r.Shard.DB()] = true
		return false
	}
}

// release puts requests this engine will not decide back to accepted.
func (f *feeder) release(rs []model.CouponRequest) {
	if len(rs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := storage.ReleaseCouponRequests(ctx, f.store, rs); err != nil {
		f.log.Warn("coupons: queued requests not released; the next owner takes them once stale", "requests", len(rs), "err", err)
		return
	}
	f.stats.Released.Add(int64(len(rs)))
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
func (f *feeder) park(reqs []model.CouponRequest, until time.Time, owned bool) {
	if !owned {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range reqs {
		f.parked[key(r)] = parked{r: r, until: until}
	}
}

// isParked reports whether r is put aside (its queued mark is the park's).
func (f *feeder) isParked(r model.CouponRequest) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.parked[key(r)]
	return ok
}

// unpark releases the parked requests due by now (all of them with
// everything true), off the queued set first.
func (f *feeder) unpark(now time.Time, everything bool) {
	var due []model.CouponRequest
	f.mu.Lock()
	for k, p := range f.parked {
		if everything || !now.Before(p.until) {
			due = append(due, p.r)
			delete(f.parked, k)
			delete(f.queued, k)
			f.dirty[p.r.Shard.DB()] = true
		}
	}
	f.mu.Unlock()
	f.release(due)
}
