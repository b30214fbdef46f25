package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"redcell/model"
)

// A lane delivers the credits of one destination: the cell that owns the
// claimants' wallets (this cell itself for the local lane, which applies them
// in its own store and never does network I/O). Each lane has a bounded queue,
// its own goroutine, its own attempt timeout and its own backoff, so a
// destination that is slow or down delays only its own credits.
//
// The lane holds each credit from the moment it takes it (offer) until the
// credit's delivery is acknowledged, or it gives it back to the relay; a
// credit it holds is never taken twice (held), so the relay, which offers
// again what it holds, cannot hand a slow lane the same credits again and
// again. Nor does a read or offer hand back a credit the lane let go after
// it began (released): it may have found the credit just before the
// acknowledgement.
//
// Lifecycle: the relay makes a lane on the first credit for its destination
// and starts run; run exits when the relay stops (after flushing what the lane
// holds) or when the lane has held nothing for laneIdleStop.
type lane struct {
	r     *Relay
	dest  string // the destination cell's name; the local lane's is this cell's
	local bool   // claimants of this cell's own shards

	wake chan struct{} // cap 1: credits were queued

	mu          sync.Mutex           // guards the fields below
	queue       []queued             // held credits not in flight, in arrival order
	held        map[string]struct{}  // claim IDs queued or in flight; len <= laneDepthMax
	released    map[string]time.Time // claim IDs let go since the running scan began, and when
	long        int                  // held credits deferred deferralsLong times or more
	backoff     time.Duration        // pause after the last failed attempt; 0 after a success
	pausedUntil time.Time            // while backing off the lane takes no credits
	yieldSince  time.Time            // when the lane began to hold back a batch for load; zero: not yielding
	size        int                  // the most credits the next batch takes: BatchMax, halved after a timed-out attempt (batchMin..BatchMax)
	flight      time.Time            // the earliest since of the attempt in flight (queued.since, never-deferred credits); zero: none
	flightStart time.Time            // when the attempt in flight began; zero: none
	retired     bool                 // run has exited; offer takes nothing
}

// queued is a credit a lane holds, with when it may be tried next: a deferred
// credit (its wallet row was locked) waits its own backoff.
type queued struct {
	c         model.Credit
	due       time.Time // zero: now
	deferrals int       // times the destination deferred it
	since     time.Time // a fresh credit (an open handed it over: Enqueue): its claim's creation, or when the lane took it if that is unknown or later; zero: from a scan (Relay.Behind)
}

func newLane(r *Relay, dest string, local bool) *lane {
	return &lane{r: r, dest: dest, local: local, wake: make(chan struct{}, 1), held: map[string]struct{}{}, released: map[string]time.Time{}, size: BatchMax}
}

// offer takes the credits of cs that the lane does not hold yet, as long as
// it has room (laneDepthMax) and is not backing off, and returns how many of
// cs it now holds (or, offered by a scan that began at scanStart, let go
// since); the relay holds the others and offers them again. It never blocks.
func (l *lane) offer(cs []model.Credit, now, scanStart time.Time) (holds int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retired {
		return 0
	}
	paused, took := now.Before(l.pausedUntil), false
	for _, c := range cs {
		if _, ok := l.held[c.ClaimID]; ok {
			holds++
			continue
		}
		if at, ok := l.released[c.ClaimID]; ok && !scanStart.IsZero() && !at.Before(scanStart) {
			holds++ // found before the lane's delivery was acknowledged
			continue
		}
		if paused || len(l.held) >= laneDepthMax {
			continue
		}
		l.held[c.ClaimID] = struct{}{}
		q := queued{c: c}
		if scanStart.IsZero() {
			q.since = now
			if made := time.UnixMilli(c.CreatedMS); c.CreatedMS > 0 && made.Before(now) {
				q.since = made
			}
		}
		l.queue = append(l.queue, q)
		holds++
		took = true
	}
	if took {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return holds
}

// run is the lane's goroutine (see lane).
func (l *lane) run() {
	defer l.r.lanesWG.Done()
	c := l.r.clock
	idleSince := c.Now()
	for {
		select {
		case <-l.r.stop:
			l.flush()
			return
		default:
		}
		batch, wait := l.next(c.Now())
		if len(batch) > 0 {
			if l.attempt(batch) {
				// What came during the delivery lingers as what comes to
				// an idle lane does: a flow's next batch fills too.
				l.mu.Lock()
				more := len(l.queue) > 0
				l.mu.Unlock()
				if more {
					l.linger()
				}
			}
			idleSince = c.Now()
			continue
		}
		if wait < 0 { // holds nothing
			idle := c.Now().Sub(idleSince)
			if idle >= laneIdleStop && l.r.retire(l) {
				return
			}
			wait = laneIdleStop - idle
		}
		select {
		case <-l.r.stop:
		case <-l.wake:
			l.linger()
		case <-c.After(max(wait, time.Millisecond)):
		}
	}
}

// linger waits for more credits, unless a full batch is queued: Linger,
// then Linger again while each wait brings LingerFlow or more and the
// oldest fresh credit's claim (or the first wait) is less than LingerMax
// ago. A lone credit waits Linger; under a flow of opens one delivery (one
// transaction, one HTTP call) carries hundreds of credits, several of them
// of one shard table, instead of one open batch's worth.
func (l *lane) linger() {
	c := l.r.clock
	start := c.Now()
	l.mu.Lock()
	n, full := len(l.queue), len(l.queue) >= l.size
	l.mu.Unlock()
	for !full {
		select {
		case <-l.r.stop:
			return
		case <-c.After(Linger):
		}
		now := c.Now()
		from := start
		l.mu.Lock()
		m := len(l.queue)
		full = m >= l.size
		if first := l.firstFreshLocked(); !first.IsZero() && first.Before(from) {
			from = first
		}
		l.mu.Unlock()
		if m-n < LingerFlow || now.Sub(from)+Linger > LingerMax {
			return
		}
		n = m
	}
}

// next takes the next batch: up to l.size (BatchMax unless attempts timed
// out) held credits that are due.
// With none, wait is how long until one is (or the backoff ends, or a
// yielding lane asks about the load again), -1 when the lane holds nothing.
// While the relay is switched off the lane gives back everything it holds:
// the relay keeps it. While the cell is loaded (Config.Busy) it yields: it
// takes a batch only when a full one (l.size) is held or it has held back
// for YieldMax.
func (l *lane) next(now time.Time) (batch []queued, wait time.Duration) {
	off := l.r.cfg.Off()
	busy := l.r.cfg.Busy != nil && l.r.cfg.Busy()
	l.mu.Lock()
	defer l.mu.Unlock()
	if off {
		if len(l.queue) > 0 {
			// Back to the relay, offered again once it is on. (letGo takes
			// trackMu while l.mu is held: nothing takes l.mu under trackMu.)
			back := make([]model.Credit, len(l.queue))
			for i, q := range l.queue {
				back[i] = q.c
			}
			defer l.r.letGo(back)
		}
		l.queue, l.held, l.long = nil, map[string]struct{}{}, 0
	}
	if len(l.queue) == 0 {
		l.yieldSince = time.Time{}
		return nil, -1
	}
	if now.Before(l.pausedUntil) {
		return nil, l.pausedUntil.Sub(now)
	}
	if busy && len(l.queue) < l.size {
		if l.yieldSince.IsZero() {
			l.yieldSince = now
			l.r.Stats.Yields.Add(1)
		}
		left := YieldMax - now.Sub(l.yieldSince)
		if first := l.firstFreshLocked(); !first.IsZero() {
			// A fresh credit is held back for YieldMax from its claim's
			// creation at most, not from the yield's start: the open's own
			// commit counts, and a credit never waits long enough, yielding
			// alone, to make the cell shed opens (Relay.Behind).
			left = min(left, YieldMax-now.Sub(first))
		}
		if left > 0 {
			return nil, min(left, yieldPoll)
		}
	}
	l.yieldSince = time.Time{}
	rest := l.queue[:0]
	wait = -1
	for _, q := range l.queue {
		if len(batch) < l.size && !now.Before(q.due) {
			batch = append(batch, q)
			continue
		}
		if d := q.due.Sub(now); d > 0 && (wait < 0 || d < wait) {
			wait = d
		}
		rest = append(rest, q)
	}
	l.queue = rest
	if wait < 0 && len(rest) > 0 {
		wait = 0 // due now, beyond this batch
	}
	return batch, wait
}

// attempt delivers one batch within the lane's attempt timeout and settles
// it: the delivered credits are acknowledged and let go, the deferred ones
// queued again after their own backoff, the others (no longer this
// destination's) given back to the relay. A failure puts the whole batch back and pauses the
// lane (exponential backoff); a success ends the pause. An attempt that ran
// out of time halves the lane's batch size (down to batchMin), so a loaded
// destination still gets work done rather than rolling back whole batches
// again and again; each success doubles it back up to BatchMax. It reports
// success.
func (l *lane) attempt(batch []queued) bool {
	cs := make([]model.Credit, len(batch))
	for i, q := range batch {
		cs[i] = q.c
	}
	ctx, cancel := context.WithDeadline(l.r.life, l.attemptDeadline())
	l.setFlight(batch, l.r.clock.Now())
	defer l.setFlight(nil, time.Time{})
	delivered, deferred, err := l.r.deliver(ctx, l, cs)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	cancel()
	now := l.r.clock.Now()
	if err != nil {
		l.r.failed(l, len(cs), err)
		l.requeueFailed(batch, len(cs), timedOut, now)
		return false
	}
	l.r.succeeded(l)
	l.r.observeLag(l.local, delivered, now)
	if len(delivered) > 0 {
		l.r.acked(delivered)
	}
	again := make(map[string]bool, len(deferred))
	for _, c := range deferred {
		again[c.ClaimID] = true
	}
	if len(delivered)+len(deferred) < len(cs) {
		l.letGoOthers(cs, delivered, again)
	}
	l.settle(batch, again, len(deferred), now)
	return true
}

// attemptDeadline is when an attempt begun now must end: the lane's
// timeout (a local or a remote one), or the relay's flush time when the
// cell stops, whichever is first.
func (l *lane) attemptDeadline() time.Time {
	timeout := relayAttemptTimeout
	if l.local {
		timeout = relayLocalTimeout
	}
	deadline := l.r.clock.Now().Add(timeout)
	if by := l.r.flushBy.Load(); by != 0 && time.Unix(0, by).Before(deadline) {
		deadline = time.Unix(0, by) // the cell stops: no attempt outlives the flush (a remote call's own deadline included)
	}
	return deadline
}

// requeueFailed puts a failed attempt's batch (n credits) back at the head
// of the queue, as a backlog, and backs the lane off; a timed-out attempt
// also halves the next batch.
func (l *lane) requeueFailed(batch []queued, n int, timedOut bool, now time.Time) {
	l.mu.Lock()
	if timedOut {
		l.size = max(min(l.size, n)/2, batchMin)
	}
	l.queue = append(append([]queued(nil), batch...), l.queue...) // a copy: batch may share flush's array
	for i := range l.queue {
		l.queue[i].since = time.Time{} // held through a failure: a backlog now (oldest)
	}
	l.backoff = min(max(2*l.backoff, relayBackoffMin), relayBackoffMax)
	l.pausedUntil = now.Add(l.backoff)
	l.mu.Unlock()
}

// letGoOthers gives back to the relay the credits of cs neither delivered
// nor deferred (again): some are no longer this destination's, and the
// relay offers them to their destination now.
func (l *lane) letGoOthers(cs, delivered []model.Credit, again map[string]bool) {
	done := make(map[string]bool, len(delivered))
	for _, c := range delivered {
		done[c.ClaimID] = true
	}
	var back []model.Credit
	for _, c := range cs {
		if !done[c.ClaimID] && !again[c.ClaimID] {
			back = append(back, c)
		}
	}
	l.r.letGo(back)
}

// settle ends a successful attempt at now: the lane's backoff is reset and
// its batch size doubled; the batch's credits not deferred (again) are
// forgotten (released), the deferred ones (deferredN) queued again after
// their backoff.
func (l *lane) settle(batch []queued, again map[string]bool, deferredN int, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backoff, l.pausedUntil = 0, time.Time{}
	l.size = min(2*l.size, BatchMax)
	if len(l.released) > 4*laneDepthMax { // no offer ran for long (switched off): forget
		l.released = map[string]time.Time{}
	}
	var longest *queued
	for _, q := range batch {
		wasLong := q.deferrals >= deferralsLong
		if !again[q.c.ClaimID] {
			delete(l.held, q.c.ClaimID)
			l.released[q.c.ClaimID] = now
			if wasLong {
				l.long--
			}
			continue
		}
		q.deferrals++
		q.due = now.Add(DeferralBackoff(q.deferrals))
		l.queue = append(l.queue, q)
		if !wasLong && q.deferrals >= deferralsLong {
			l.long++
		}
		if longest == nil || q.deferrals > longest.deferrals {
			longest = &q
		}
	}
	l.r.deferredCredits(l, deferredN, longest, l.long)
}

// setFlight records, for oldest, the attempt now in flight (batch, begun at
// start; nil: none): the earliest since of its fresh credits never deferred.
func (l *lane) setFlight(batch []queued, start time.Time) {
	first := earliestFresh(batch)
	l.mu.Lock()
	l.flight, l.flightStart = first, start
	l.mu.Unlock()
}

// remoteStall: a lane to another cell whose attempt has run this long is
// stalled on that cell (down or hung), which shedding opens here does not
// mend: its credits are not counted (oldest) until the attempt ends. Above
// a loaded cell's deliveries (0.2-1 s of 500 credits on the bench's
// machine), below the attempt's 5 s bound.
const remoteStall = 1500 * time.Millisecond

// oldest is, at now, the earliest since (the claim's creation) of the fresh
// credits (those an open handed over, not a scan) that wait on the lane
// itself: in flight, or queued and never deferred. Zero: none, or the lane
// is backing off after a failed delivery, or it is a lane to another cell
// whose attempt has run longer than remoteStall. A credit the receiver
// deferred waits for a wallet row another transaction holds, not for the
// lane; one a scan found, or one held through a failed attempt, is a
// backlog (a restart, the relay switched back on, a peer back up) that fresh
// credits queue behind, which is what counts.
func (l *lane) oldest(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.backoff > 0 || (!l.local && !l.flightStart.IsZero() && now.Sub(l.flightStart) > remoteStall) {
		return time.Time{}
	}
	first := l.flight
	if q := l.firstFreshLocked(); !q.IsZero() && (first.IsZero() || q.Before(first)) {
		first = q
	}
	return first
}

// firstFreshLocked is the earliest since of the queued fresh credits never
// deferred; zero: none. l.mu is held.
func (l *lane) firstFreshLocked() time.Time { return earliestFresh(l.queue) }

// earliestFresh is the earliest since of the fresh credits of qs never
// deferred; zero: none.
func earliestFresh(qs []queued) time.Time {
	var first time.Time
	for _, q := range qs {
		if q.deferrals == 0 && !q.since.IsZero() && (first.IsZero() || q.since.Before(first)) {
			first = q.since
		}
	}
	return first
}

// flush delivers, when the cell stops, everything the lane holds, once, in
// batches of up to BatchMax, until a delivery fails or the relay's flush
// time (relayFlushMax) is up. A lane backing off does not try: its
// destination failed just now. What is left is read again at the next
// start, past its database's position.
func (l *lane) flush() {
	if l.r.cfg.Off() {
		return
	}
	l.mu.Lock()
	pending := l.queue
	l.queue = nil
	if l.r.clock.Now().Before(l.pausedUntil) {
		pending = nil
	}
	l.mu.Unlock()
	for len(pending) > 0 && l.r.life.Err() == nil {
		n := min(len(pending), BatchMax)
		if !l.attempt(pending[:n]) {
			return
		}
		pending = pending[n:]
	}
}

// scanBegins forgets the credits let go before a read or offer that begins
// at start: it finds them acknowledged (or, held still, it is to offer them
// again).
func (l *lane) scanBegins(start time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, at := range l.released {
		if at.Before(start) {
			delete(l.released, id)
		}
	}
}

// state reports what the lane holds and its current backoff (the metrics).
func (l *lane) state() (held int, backoff time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held), l.backoff
}
