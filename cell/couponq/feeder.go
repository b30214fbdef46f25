package couponq

// The feeder: it takes the requests stored accepted (and those a dead or
// stopped cell left deciding) from the databases into layer 1's queue.

import (
	"context"
	"slices"
	"time"

	"redcell/model"
	"redcell/storage"
)

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
