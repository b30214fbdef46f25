// Package scenelimit holds each reward scene's rate limit (its rate_limit in
// the activities file) for the whole cluster, as the seed's distributed
// limiter did for its low-rate, high-precision limits: one token bucket per
// scene in memcached (internal/climit.Buckets, GCRA by compare-and-swap), so
// over any span T the cells together accept at most Burst + PerSec·T issues
// of a scene, whatever their number.
//
// The rate is the caller's, read from the activities tree each request uses:
// a reload that changes a scene's per_sec or burst holds from the next
// request. The bucket of a changed rate is another memcached item (the rate
// is part of its key), so it starts full: over a span holding a reload the
// scene may accept the old rate's tokens and the new burst, and never waits
// out the old rate's backlog under a raised one.
//
// When memcached fails, each cell decides alone for a second from a local
// bucket of PerSec/N and Burst/N (N: the live cells), climit.Buckets's
// fallback; without memcached at all (nil) it always does.
package scenelimit

import (
	"fmt"
	"sync"
	"time"

	"redcell/internal/climit"
	"redcell/internal/clock"
)

// Limits is the scene limits of one cell and one space. Safe for concurrent
// use.
type Limits struct {
	mc     climit.CASMemcache // nil: the local fallback only
	prefix string
	procs  func() int
	clock  clock.Clock

	mu     sync.Mutex // guards scenes
	scenes map[string]*bucket
}

// bucket is a scene's bucket at one rate.
type bucket struct {
	perSec, burst int
	b             *climit.Buckets
}

// New returns the limits kept in mc (nil: each cell limits alone, at
// PerSec/N) under keys starting with prefix ("rc:scene:"; stress traffic
// uses its own). procs counts the cells sharing the limits, for the
// fallback (nil: 1); clk is the clock of the buckets (nil: the system's).
func New(mc climit.CASMemcache, prefix string, procs func() int, clk clock.Clock) *Limits {
	return &Limits{mc: mc, prefix: prefix, procs: procs, clock: clock.Or(clk), scenes: map[string]*bucket{}}
}

// Allow takes one issue of scene (its key, model.BudgetKey: no spaces)
// at perSec sustained and burst back to back (both >= 1, burst/perSec at
// most 29 days), and reports whether there was room; when there was not,
// wait is how long until there will be. It never waits itself: a memcached
// read and a compare-and-swap. A rate climit refuses is refused, with wait
// 1 s (the activities file's validation keeps such rates out).
func (l *Limits) Allow(scene string, perSec, burst int) (ok bool, wait time.Duration) {
	b, err := l.bucket(scene, perSec, burst)
	if err != nil {
		return false, time.Second
	}
	return b.Allow(scene)
}

// bucket is scene's buckets at the rate given, made when the rate is new.
func (l *Limits) bucket(scene string, perSec, burst int) (*climit.Buckets, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.scenes[scene]; e != nil && e.perSec == perSec && e.burst == burst {
		return e.b, nil
	}
	b, err := climit.NewBuckets(climit.BucketsConfig{Prefix: fmt.Sprintf("%s%d-%d:", l.prefix, perSec, burst), PerSec: perSec, Burst: burst,
		Procs: l.procs, MaxLocal: 2}, l.mc, l.clock)
	if err != nil {
		return nil, err
	}
	l.scenes[scene] = &bucket{perSec: perSec, burst: burst, b: b}
	return b, nil
}

// Keep forgets every scene keep answers false for (scenes a reload
// removed), so the map holds only the loaded tree's scenes.
func (l *Limits) Keep(keep func(scene string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.scenes {
		if !keep(k) {
			delete(l.scenes, k)
		}
	}
}
