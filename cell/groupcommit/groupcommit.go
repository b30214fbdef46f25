// Package groupcommit gathers work for many keys into one transaction per
// commit lane: a cell's opens of many packets, sends, deposits and credit
// batches that live in the databases of one lane are handed to the store
// together (storage.Grouper.CommitGroup), so they share one COMMIT and one
// fsync.
//
// Each lane has one transaction in flight at a time. While it commits, new
// ops queue; when it ends, the next group takes what queued, oldest first, up
// to Config.Max requests. An op that arrives on an idle lane is committed at
// once; on a busy lane the committer may wait a little for more (see
// Committer). It knows nothing of HTTP, packets or the cell: only ops, lanes
// and a commit function.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/clock"
	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

// Lane names a commit lane: the space (0 real money, 1 stress traffic: they
// never share a transaction) and the lane within it (a database, or a lane
// several databases share; the caller decides).
type Lane struct {
	Space int
	ID    int
}

// String is "real/7" or "shadow/7".
func (l Lane) String() string {
	if l.Space == 1 {
		return fmt.Sprintf("shadow/%d", l.ID)
	}
	return fmt.Sprintf("real/%d", l.ID)
}

// CommitFunc commits ops, in order, as one transaction of lane's store
// (storage.Grouper.CommitGroup's contract: per-op answers in the ops, an
// error for the whole group). It is never called concurrently for one lane.
type CommitFunc func(ctx context.Context, lane Lane, ops []storage.MoneyOp) error

// Group describes one group after its commit, for the metrics.
type Group struct {
	Lane     Lane
	Ops      int           // ops in the group
	Requests int           // requests in the group (Weight summed)
	Queued   time.Duration // how long the group's oldest op waited before the commit began
	Held     time.Duration // of that, how long the committer chose to wait for more (adaptive wait)
	Took     time.Duration // the commit itself
	Err      error         // the group's error (nil: committed)
}

// Config sets up a Committer.
type Config struct {
	// Max is the most requests one group carries (Weight summed), >= 1. An
	// op heavier than Max is committed in a group of its own.
	Max int
	// Wait is the longest the committer waits for a busy lane's group to
	// fill before committing it, >= 0 (0: never wait; take what queued).
	Wait time.Duration
	// QueueMax is the most requests one lane may hold queued; beyond it
	// Submit answers ErrOverloaded. An op on an empty queue is always taken.
	QueueMax int
	// CommitTimeout bounds one group's commit (> 0). The commit does not run
	// under any one op's context: the group belongs to all of them.
	CommitTimeout time.Duration
	// Commit commits a group. Required.
	Commit CommitFunc
	// Observe, when set, is called after every group's commit, on the lane's
	// worker, before the group's ops are answered.
	Observe func(Group)
	// Clock runs the adaptive wait and measures; nil: the system clock.
	Clock clock.Clock
}

// Errors of Submit besides the group's own.
var (
	// ErrInFlight is wrapped (with model.ErrTimeout) in the error of a Submit
	// whose context ended after its op was taken into a group that is still
	// committing: the op may yet be written, and the committer still uses it
	// (its Rand, its answers) until the group ends. The caller must not reuse
	// the op or anything it holds.
	ErrInFlight = errors.New("groupcommit: the op's group is still committing")
)

// Committer runs one worker per lane, started on first use. Safe for
// concurrent use. Create it with New, end it with Stop.
//
// The adaptive wait: an op submitted while its lane has no commit in flight
// arrived on an idle lane, and a group of such ops is committed at once. A
// group holding an op that queued behind a commit (ops arrive faster than
// commits) first waits for more, only as long as that pays: up to the smallest of Config.Wait, half the lane's recent
// commit time (so the database idles at most a third of the time), and the
// time the measured arrival rate needs to fill the group to Max — and not at
// all if that rate brings less than one more request in that time.
//
// Invariants, asserted where ops change hands (internal/invariant: they fail
// only through a bug in this package): each lane counts its ops, and ops in =
// queued + taken into groups + abandoned after every Submit and take; an op
// is taken once and answered once, and every op taken is answered when its
// group ends; a group carries at most Max requests (or one op alone); a lane
// stops with every op answered or abandoned.
type Committer struct {
	cfg   Config
	clock clock.Clock
	max   atomic.Int64 // Config.Max, as SetLimits left it
	wait  atomic.Int64 // Config.Wait in ns, as SetLimits left it

	mu      sync.Mutex // guards lanes, stopped
	lanes   map[Lane]*lane
	stopped bool
	wg      sync.WaitGroup // live workers
}

// New returns a committer; it starts no goroutine until the first Submit.
func New(cfg Config) *Committer {
	if cfg.Max < 1 || cfg.Wait < 0 || cfg.QueueMax < 1 || cfg.CommitTimeout <= 0 || cfg.Commit == nil {
		panic("groupcommit: Max, QueueMax and CommitTimeout must be > 0, Wait >= 0 and Commit set")
	}
	c := &Committer{cfg: cfg, clock: clock.Or(cfg.Clock), lanes: make(map[Lane]*lane)}
	c.SetLimits(cfg.Max, cfg.Wait)
	return c
}

// SetLimits changes Config.Max and Config.Wait for the groups formed from
// now on. It panics if max < 1 or wait < 0.
func (c *Committer) SetLimits(max int, wait time.Duration) {
	if max < 1 || wait < 0 {
		panic("groupcommit: Max must be > 0 and Wait >= 0")
	}
	c.max.Store(int64(max))
	c.wait.Store(int64(wait))
}

// waiter is one submitted op.
type waiter struct {
	op       storage.MoneyOp
	weight   int
	enqueued time.Time
	busy     bool          // it queued behind a commit in flight
	state    waiterState   // guarded by lane.mu
	done     chan struct{} // closed when err is set
	err      error
}

type waiterState uint8

const (
	queued    waiterState = iota // in the lane's queue
	taken                        // in a group being committed
	abandoned                    // its Submit returned before it was taken: never committed
	answered                     // its group ended and its answer is (being) set
)

// lane is one lane's queue and worker state.
type lane struct {
	id   Lane
	mu   sync.Mutex // guards q, reqs, stopping
	q    []*waiter  // oldest first; may hold abandoned waiters
	reqs int        // requests of the queued (not abandoned) waiters
	wake chan struct{}
	// stopping: Stop was called; the worker commits what is queued, then exits.
	stopping bool
	// committing: a group's commit is in flight (set before it starts, cleared
	// before its ops are answered).
	committing bool
	// The lane's op counts (guarded by mu): in = queuedOps + out + dropped,
	// where out counts the ops taken into groups and dropped those abandoned
	// while queued; answered <= out, = out between groups (checkCounts).
	in, queuedOps, out, dropped, answered int
	// groupMax is the largest Max the takes of the group being formed ran
	// under (what commit holds the group to); worker-only.
	groupMax int

	// Worker-only state (no lock): the adaptive wait's measurements.
	commitEWMA time.Duration // recent commit time
	rateEWMA   float64       // recent arrivals, requests per second
	lastTake   time.Time
}

// Submit queues op on lane and blocks until the op's group has committed,
// ctx ends, or the committer stops. It returns nil when the group committed:
// op's answers (Results, Packet, Deposit, Applied, Err, ...) are then set. It
// returns the group's error when the group failed (every op of the group gets
// it; nothing or, wrapping storage.ErrCommitUnknown, an unknown part was
// written). Other errors: model.ErrShuttingDown (the committer stopped; op not
// taken), model.ErrOverloaded (the lane's queue is full; op not taken),
// model.ErrTimeout when ctx ended first — before the op was taken (nothing of
// it will be written), or wrapping ErrInFlight after (see ErrInFlight).
func (c *Committer) Submit(ctx context.Context, ln Lane, op storage.MoneyOp) error {
	w := &waiter{op: op, weight: op.Weight(), enqueued: c.clock.Now(), done: make(chan struct{})}
	invariant.That(w.weight >= 1, "groupcommit: an op of weight below 1 (storage.MoneyOp.Weight is at least 1)")
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return model.ErrShuttingDown
	}
	l := c.lanes[ln]
	if l == nil {
		l = &lane{id: ln, wake: make(chan struct{}, 1)}
		c.lanes[ln] = l
		c.wg.Add(1)
		go c.work(l)
	}
	l.mu.Lock()
	c.mu.Unlock()
	if l.reqs > 0 && l.reqs+w.weight > c.cfg.QueueMax {
		l.mu.Unlock()
		return model.Errorf(model.ErrOverloaded, "commit lane %s holds %d requests", ln, l.reqs)
	}
	w.busy = l.committing
	l.q = append(l.q, w)
	l.reqs += w.weight
	l.in++
	l.queuedOps++
	l.checkCounts()
	l.mu.Unlock()
	signal(l.wake)

	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
	}
	l.mu.Lock()
	st := w.state
	if st == queued {
		w.state = abandoned
		l.reqs -= w.weight
		l.queuedOps--
		l.dropped++
		l.checkCounts()
	}
	l.mu.Unlock()
	if st == queued {
		return model.Errorf(model.ErrTimeout, "the request's deadline passed before its commit began")
	}
	select {
	case <-w.done: // it ended meanwhile: its answer is known
		return w.err
	default:
	}
	return &inFlight{timeout: model.Errorf(model.ErrTimeout, "the request's deadline passed while its group committed"), w: w}
}

// inFlight is Submit's error for an op whose group is still committing: a
// model.ErrTimeout wrapping ErrInFlight, through which InFlight waits for
// the group's end.
type inFlight struct {
	timeout error
	w       *waiter
}

func (e *inFlight) Error() string   { return e.timeout.Error() + ": " + ErrInFlight.Error() }
func (e *inFlight) Unwrap() []error { return []error{e.timeout, ErrInFlight} }

// InFlight reports whether err is Submit's error for an op whose group was
// still committing (wrapping ErrInFlight) and, if so, returns wait, which
// blocks until that group ends and returns what Submit would have: the
// group's error, or nil with the op's answers set. The open path hands the
// claims of such an op to the relay once wait returns nil (no one else
// learns of them).
func InFlight(err error) (wait func() error, ok bool) {
	var e *inFlight
	if !errors.As(err, &e) {
		return nil, false
	}
	return func() error { <-e.w.done; return e.w.err }, true
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Stop takes no new ops (Submit answers ErrShuttingDown), lets every lane
// commit what it holds, and returns when all workers have exited.
func (c *Committer) Stop() {
	c.mu.Lock()
	c.stopped = true
	for _, l := range c.lanes {
		l.mu.Lock()
		l.stopping = true
		l.mu.Unlock()
		signal(l.wake)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// Queued returns the requests waiting in all lanes (not yet in a group).
func (c *Committer) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lanes {
		l.mu.Lock()
		n += l.reqs
		l.mu.Unlock()
	}
	return n
}

// Lanes returns the number of lanes with a worker.
func (c *Committer) Lanes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lanes)
}

// work is a lane's worker: one group at a time until Stop, then what is left.
func (c *Committer) work(l *lane) {
	defer c.wg.Done()
	var group []*waiter
	for {
		group = c.take(l, group[:0], 0)
		if len(group) == 0 {
			l.mu.Lock()
			stop := l.stopping && l.reqs == 0
			if stop {
				invariant.That(l.queuedOps == 0 && l.answered == l.out,
					"groupcommit: a lane stops with an op neither answered nor abandoned (every submitted op is answered once)")
			}
			l.mu.Unlock()
			if stop {
				return
			}
			<-l.wake
			continue
		}
		var held time.Duration
		for _, w := range group {
			if w.busy {
				group, held = c.fill(l, group)
				break
			}
		}
		c.commit(l, group, held)
		clear(group) // let finished ops be collected
	}
}

// take moves queued ops into group, oldest first, while the group's requests
// stay within Max (the first op always goes in). reqs is what group already
// carries. It asserts that each op it takes was queued (an op is taken once)
// and the lane's counts after (checkCounts).
func (c *Committer) take(l *lane, group []*waiter, reqs int) []*waiter {
	groupMax := int(c.max.Load())
	if len(group) == 0 {
		l.groupMax = groupMax
	}
	l.groupMax = max(l.groupMax, groupMax)
	l.mu.Lock()
	defer l.mu.Unlock()
	n, took := 0, 0
	for _, w := range l.q {
		if w.state == abandoned {
			n++
			continue
		}
		if len(group) > 0 && reqs+w.weight > groupMax {
			break
		}
		invariant.That(w.state == queued, "groupcommit: an op taken twice (only a queued op is taken)")
		w.state = taken
		l.reqs -= w.weight
		reqs += w.weight
		group = append(group, w)
		n++
		took++
	}
	l.queuedOps -= took
	l.out += took
	l.checkCounts()
	rest := copy(l.q, l.q[n:])
	clear(l.q[rest:])
	l.q = l.q[:rest]
	if rest == 0 && cap(l.q) > 1024 {
		l.q = nil // give a burst's memory back
	}
	return group
}

// checkCounts asserts the lane's op accounting; l.mu must be held. Every
// op submitted is queued, taken into a group, or abandoned (in = queued +
// out + dropped); answers never outrun takes; requests are queued exactly
// when ops are, at least one per op (MoneyOp.Weight >= 1).
func (l *lane) checkCounts() {
	invariant.That(l.queuedOps >= 0 && l.in == l.queuedOps+l.out+l.dropped,
		"groupcommit: ops in must be ops queued + taken + abandoned (lane counts)")
	invariant.That(l.answered <= l.out, "groupcommit: an op answered before it was taken")
	invariant.That(l.reqs >= l.queuedOps && (l.reqs == 0 || l.queuedOps > 0),
		"groupcommit: queued requests disagree with queued ops (each op weighs >= 1)")
}

// weightOf sums the group's requests.
func weightOf(group []*waiter) int {
	n := 0
	for _, w := range group {
		n += w.weight
	}
	return n
}

// fill waits for more ops on a busy lane, as long as the adaptive wait says
// (see Committer), and returns the group and how long it waited.
func (c *Committer) fill(l *lane, group []*waiter) ([]*waiter, time.Duration) {
	reqs := weightOf(group)
	wait := c.waitFor(l, reqs)
	if wait <= 0 {
		return group, 0
	}
	start := c.clock.Now()
	timer := c.clock.After(wait)
wait:
	for reqs < int(c.max.Load()) {
		select {
		case <-l.wake:
			group = c.take(l, group, reqs)
			reqs = weightOf(group)
		case <-timer:
			group = c.take(l, group, reqs) // what arrived as the timer fired
			break wait
		}
	}
	return group, c.clock.Now().Sub(start)
}

// waitFor chooses how long a busy lane waits for a group holding reqs
// requests to fill (see Committer).
func (c *Committer) waitFor(l *lane, reqs int) time.Duration {
	groupMax, bound := int(c.max.Load()), time.Duration(c.wait.Load())
	if bound <= 0 || reqs >= groupMax || l.rateEWMA <= 0 {
		return 0
	}
	wait := min(bound, l.commitEWMA/2)
	if fill := time.Duration(float64(groupMax-reqs) / l.rateEWMA * float64(time.Second)); fill < wait {
		wait = fill
	}
	if l.rateEWMA*wait.Seconds() < 1 {
		return 0 // less than one more request expected: waiting only adds latency
	}
	return wait
}

// ewmaWeight is how much one new sample moves the adaptive wait's measures.
const ewmaWeight = 0.25

// commit runs one group and answers its ops. It asserts the group's size
// before (at most the Max its takes ran under, or one op alone) and after
// that each op of it is answered once and every op taken has its answer.
func (c *Committer) commit(l *lane, group []*waiter, held time.Duration) {
	start := c.clock.Now()
	ops := make([]storage.MoneyOp, len(group))
	for i, w := range group {
		ops[i] = w.op
	}
	reqs := weightOf(group)
	invariant.That(len(group) == 1 || len(group) > 1 && reqs <= l.groupMax,
		"groupcommit: a group is empty or carries more than Max requests (Config.Max; only an op alone may pass it)")
	// Arrival rate: the requests this group took over the time since the
	// previous group was taken.
	if !l.lastTake.IsZero() {
		if gap := start.Sub(l.lastTake); gap > 0 {
			sample := float64(reqs) / gap.Seconds()
			l.rateEWMA += ewmaWeight * (sample - l.rateEWMA)
		}
	}
	l.lastTake = start
	l.mu.Lock()
	l.committing = true
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	err := c.cfg.Commit(ctx, l.id, ops)
	cancel()
	took := c.clock.Now().Sub(start)
	l.mu.Lock()
	l.committing = false // before the answers: a caller's next op finds the lane idle
	for _, w := range group {
		invariant.That(w.state == taken, "groupcommit: an op answered twice, or never taken (each op is answered once)")
		w.state = answered
	}
	l.answered += len(group)
	invariant.That(l.answered == l.out, "groupcommit: a group ended with an op taken and not answered (every op is answered once)")
	l.mu.Unlock()
	l.commitEWMA += time.Duration(ewmaWeight * float64(took-l.commitEWMA))
	if c.cfg.Observe != nil { // before the answers: whoever has an answer finds its group counted
		c.cfg.Observe(Group{Lane: l.id, Ops: len(group), Requests: reqs, Queued: start.Sub(group[0].enqueued),
			Held: held, Took: took, Err: err})
	}
	for _, w := range group {
		w.err = err
		close(w.done)
	}
}
