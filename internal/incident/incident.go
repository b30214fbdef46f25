// Package incident logs repeated failures without flooding the log: a failure
// that keeps happening (a database down, a peer cell unreachable) is logged
// once when it starts, as a summary at most once per interval while it lasts,
// and once when it ends, instead of once per attempt.
package incident

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is the summary interval callers use unless they have a reason
// not to: an outage of a minute gives six lines, not thousands.
const DefaultEvery = 10 * time.Second

// Tracker follows one kind of failure (what), for example "outbox scan".
// Fail reports an attempt that failed, OK one that succeeded. Logged:
//   - at the first Fail after an OK (or ever): WARN "<what> failing", with
//     the error and the caller's attributes;
//   - while failures go on: at most one WARN "<what> still failing" per
//     every, with the failures counted since the last line and the latest
//     error;
//   - at the first OK after a Fail: INFO "<what> recovered", with the
//     failures counted and how long it lasted.
//
// OK is one atomic load when nothing is failing, so it may sit on a hot path.
// Safe for concurrent use.
type Tracker struct {
	log   *slog.Logger
	what  string
	every time.Duration

	failing atomic.Bool

	mu      sync.Mutex // guards the fields below
	since   time.Time  // when the current failure started
	logged  time.Time  // when the last line about it was written
	total   int64      // failures since it started
	unnamed int64      // failures since the last line
}

// New returns a tracker of failures called what, summarized at most once per
// every (> 0; DefaultEvery when it is not).
func New(log *slog.Logger, what string, every time.Duration) *Tracker {
	if every <= 0 {
		every = DefaultEvery
	}
	return &Tracker{log: log, what: what, every: every}
}

// Fail records a failed attempt; attrs are slog key-value pairs describing
// it (which database, which cell). It logs as the Tracker doc says.
func (t *Tracker) Fail(err error, attrs ...any) {
	now := time.Now()
	t.mu.Lock()
	started := !t.failing.Load()
	if started {
		t.failing.Store(true)
		t.since, t.logged, t.total, t.unnamed = now, now, 1, 0
		t.mu.Unlock()
		t.log.Warn(t.what+" failing", append(attrs, "err", err)...)
		return
	}
	t.total++
	t.unnamed++
	if now.Sub(t.logged) < t.every {
		t.mu.Unlock()
		return
	}
	n, total, since := t.unnamed, t.total, t.since
	t.logged, t.unnamed = now, 0
	t.mu.Unlock()
	t.log.Warn(t.what+" still failing", append(attrs, "err", err, "failures", n, "failures_total", total,
		"for", now.Sub(since).Round(time.Millisecond).String())...)
}

// OK records a successful attempt; it logs the recovery if a failure was going on.
func (t *Tracker) OK() {
	if !t.failing.Load() {
		return
	}
	t.mu.Lock()
	if !t.failing.Load() {
		t.mu.Unlock()
		return
	}
	t.failing.Store(false)
	total, since := t.total, t.since
	t.mu.Unlock()
	t.log.Info(t.what+" recovered", "failures_total", total, "lasted", time.Since(since).Round(time.Millisecond).String())
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
