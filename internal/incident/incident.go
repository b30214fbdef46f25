// Package incident logs repeated failures without flooding the log: a failure
// that keeps happening (a database down, a peer cell unreachable) is logged
// once when it starts, as a summary at most once per interval while it lasts,
// and once when it ends, instead of once per attempt.
package incident

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is the summary interval callers use unless they have a reason
// not to: an outage of a minute gives six lines, not thousands.
const DefaultEvery = 10 * time.Second

// Tracker follows one kind of failure (what), for example "relay claims read".
// Fail reports an attempt that failed, OK one that succeeded. Logged:
//   - at the first Fail after an OK (or ever): WARN "<what> failing", with
//     the error and the caller's attributes;
//   - while failures go on: at most one WARN "<what> still failing" per
//     every, with the failures counted since the last line and the latest
//     error;
//   - at the first OK after a Fail: INFO "<what> recovered", with the
//     failures counted and how long it lasted.
//
// A failure that flaps is one incident, not one per flap: when an incident
// that lasted less than every ends and the failure comes back less than
// every later, it goes on without a new start line, and from then on its
// recoveries, like its summaries, are logged at most once per every. A
// recovery held back for that is logged once every has passed since the
// last line, if the failure has not come back meanwhile; so the last line
// about a failure always tells whether it is still going on. (A failure that
// comes back after a longer incident starts a new one at once.)
//
// OK is one atomic load when nothing is failing, so it may sit on a hot path.
// Safe for concurrent use.
type Tracker struct {
	log   *slog.Logger
	lines Lines
	every time.Duration

	failing atomic.Bool

	mu       sync.Mutex // guards the fields below
	since    time.Time  // when the current incident started
	ended    time.Time  // when it last recovered (zero while it never did)
	logged   time.Time  // when the last line about it was written
	total    int64      // failures since it started
	unnamed  int64      // failures since the last line
	flaps    int64      // recoveries not logged since the last line
	reopened bool       // the failure came back after a logged recovery, without a start line
	held     bool       // a recovery waits for its line (a timer runs endHeld(hold))
	hold     uint64     // counts holds, so a stale timer does nothing
}

// Lines are the messages of a Tracker's three kinds of line.
type Lines struct {
	Start string // WARN when a failure starts
	Still string // WARN at most once per every while it lasts
	End   string // INFO when it ends
	// Error writes Start and Still at ERROR instead of WARN: for a failure
	// that is a fault to look into, not an outage to wait out.
	Error bool
}

// New returns a tracker of failures called what, summarized at most once per
// every (> 0; DefaultEvery when it is not). Its lines read "<what> failing",
// "<what> still failing" and "<what> recovered".
func New(log *slog.Logger, what string, every time.Duration) *Tracker {
	return NewLines(log, Lines{Start: what + " failing", Still: what + " still failing", End: what + " recovered"}, every)
}

// NewLines is New with the lines' messages given, for a failure whose log
// lines are known by their words (a runbook or an alert looks for them).
func NewLines(log *slog.Logger, lines Lines, every time.Duration) *Tracker {
	if every <= 0 {
		every = DefaultEvery
	}
	return &Tracker{log: log, lines: lines, every: every}
}

// Fail records a failed attempt; attrs are slog key-value pairs describing
// it (which database, which cell). It logs as the Tracker doc says.
func (t *Tracker) Fail(err error, attrs ...any) {
	now := time.Now()
	t.mu.Lock()
	if !t.failing.Load() {
		t.failing.Store(true)
		flapping := !t.ended.IsZero() && now.Sub(t.ended) < t.every && (t.reopened || t.ended.Sub(t.since) < t.every)
		if !flapping {
			t.since, t.ended, t.logged, t.total, t.unnamed, t.flaps, t.reopened, t.held = now, time.Time{}, now, 1, 0, 0, false, false
			t.mu.Unlock()
			t.log.Log(context.Background(), t.level(), t.lines.Start, append(attrs, "err", err)...)
			return
		}
		t.reopened = true // the same incident goes on
	}
	t.total++
	t.unnamed++
	if now.Sub(t.logged) < t.every {
		t.mu.Unlock()
		return
	}
	n, total, flaps, since := t.unnamed, t.total, t.flaps, t.since
	t.logged, t.unnamed, t.flaps = now, 0, 0
	t.mu.Unlock()
	attrs = append(attrs, "err", err, "failures", n, "failures_total", total, "for", now.Sub(since).Round(time.Millisecond).String())
	if flaps > 0 {
		attrs = append(attrs, "recoveries", flaps)
	}
	t.log.Log(context.Background(), t.level(), t.lines.Still, attrs...)
}

func (t *Tracker) level() slog.Level {
	if t.lines.Error {
		return slog.LevelError
	}
	return slog.LevelWarn
}

// OK records a successful attempt; it logs the recovery if a failure was going on.
func (t *Tracker) OK() {
	if !t.failing.Load() {
		return
	}
	now := time.Now()
	t.mu.Lock()
	if !t.failing.Load() {
		t.mu.Unlock()
		return
	}
	t.failing.Store(false)
	t.ended = now
	if t.reopened && now.Sub(t.logged) < t.every {
		t.flaps++
		if !t.held {
			t.held = true
			t.hold++
			hold := t.hold
			time.AfterFunc(t.logged.Add(t.every).Sub(now), func() { t.endHeld(hold) })
		}
		t.mu.Unlock()
		return
	}
	t.endLocked(now)
}

// endHeld writes a recovery held back while the failure flapped, unless the
// failure has come back since (the next Fail writes the summary) or a line
// was written less than every ago (it waits for its turn again).
func (t *Tracker) endHeld(hold uint64) {
	t.mu.Lock()
	if !t.held || t.hold != hold {
		t.mu.Unlock()
		return
	}
	if t.failing.Load() {
		t.held = false
		t.mu.Unlock()
		return
	}
	now := time.Now()
	if wait := t.logged.Add(t.every).Sub(now); wait > 0 {
		t.mu.Unlock()
		time.AfterFunc(wait, func() { t.endHeld(hold) })
		return
	}
	t.endLocked(now)
}

// endLocked writes the recovery line; t.mu must be held, and is released.
func (t *Tracker) endLocked(now time.Time) {
	total, flaps, since := t.total, t.flaps, t.since
	t.logged, t.unnamed, t.flaps, t.held = now, 0, 0, false
	t.mu.Unlock()
	attrs := []any{"failures_total", total, "lasted", now.Sub(since).Round(time.Millisecond).String()}
	if flaps > 0 {
		attrs = append(attrs, "recoveries", flaps+1)
	}
	t.log.Info(t.lines.End, attrs...)
}

// Failing reports whether the last attempt recorded failed.
func (t *Tracker) Failing() bool { return t.failing.Load() }

// Set holds one Tracker per key (a peer's address, a database), made on
// first use, for failures that are tracked per target. It keeps at most max
// trackers; past that, keys share one overflow tracker, so a churning key space
// cannot grow it without bound. Safe for concurrent use.
type Set struct {
	log   *slog.Logger
	what  string
	attr  string // the attribute the key is logged under
	every time.Duration
	max   int

	mu       sync.Mutex // guards byKey and overflow
	byKey    map[string]*Tracker
	overflow *Tracker
}

// NewSet returns a Set whose trackers are called what and log their key under
// attr (e.g. "addr"); at most keysMax (>= 1) keys get a tracker of their own.
func NewSet(log *slog.Logger, what, attr string, every time.Duration, keysMax int) *Set {
	return &Set{log: log, what: what, attr: attr, every: every, max: max(1, keysMax), byKey: map[string]*Tracker{}}
}

// Of returns the tracker of key.
func (s *Set) Of(key string) *Tracker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.byKey[key]; ok {
		return t
	}
	if len(s.byKey) >= s.max {
		if s.overflow == nil {
			s.overflow = New(s.log, s.what, s.every)
		}
		return s.overflow
	}
	t := New(s.log.With(s.attr, key), s.what, s.every)
	s.byKey[key] = t
	return t
}
