package climit

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"golang.org/x/time/rate"

	"redcell/internal/clock"
)

// CASMemcache is what Buckets needs of memcached: a read with its CAS id and a
// compare-and-swap (the same calls the cells' transaction cap uses).
type CASMemcache interface {
	Get(key string) (*memcache.Item, error)
	Add(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
}

// tauMax bounds Burst/PerSec, how far a TAT may run ahead of now: an item
// lives until its TAT, and memcached takes an expiration above 30 days for
// a Unix time (one long past, so the item would be gone at once and the
// bucket full again); it also keeps Burst·(1/PerSec) within a Duration.
const tauMax = 29 * 24 * time.Hour

// casAttempts bounds the tries of one Allow when other processes change the
// same key in between (ErrCASConflict); past them the token is refused.
const casAttempts = 4

// BucketsConfig sets a family of shared token buckets.
type BucketsConfig struct {
	// Prefix starts every key, e.g. "rc:user:"; the bucket's key follows.
	Prefix string
	// PerSec is each bucket's sustained rate, tokens per second, >= 1, and
	// Burst how many it gives back to back after a quiet spell, >= 1.
	PerSec, Burst int
	// Procs counts the processes sharing the buckets, for the fallback's
	// PerSec/N and Burst/N (nil: 1).
	Procs func() int
	// MaxLocal bounds the keys whose fallback buckets a process keeps
	// (default 100,000); the ones idle longest are forgotten first.
	MaxLocal int
}

// Buckets is a token bucket per key (an act_id) shared by every process that
// uses the same memcached and prefix: across N routers a key gets PerSec
// tokens a second and Burst at once, not N times that. The bucket is kept as
// GCRA's theoretical arrival time (TAT, Unix ns) in one memcached item per
// key, read and replaced by compare-and-swap: a token is taken when
// max(TAT, now) + 1/PerSec − now ≤ Burst/PerSec, which is a token bucket of
// PerSec with Burst tokens. Over any span T a key gets at most
// PerSec·T + Burst, whatever the number of processes, as long as their clocks
// agree to well under 1/PerSec (the items hold absolute times). The item
// expires once its TAT is past (a key idle that long has a full bucket).
//
// When memcached fails, the process decides alone for a second, from a
// local bucket of PerSec/N and Burst/N per key (N from Procs, at least 1,
// each at least 1): the processes together stay near the limit without
// memcached, if the load is spread evenly across them. Safe for concurrent use.
type Buckets struct {
	cfg      BucketsConfig
	mc       CASMemcache
	clock    clock.Clock
	interval time.Duration // 1/PerSec
	tau      time.Duration // Burst/PerSec: how far the TAT may run ahead of now

	downUntil atomic.Int64 // Unix ns: on the fallback until then; 0 once memcached answered again
	probing   atomic.Bool  // one call is trying memcached again after a failure
	fallbacks atomic.Int64 // Allow calls the fallback answered
	failures  atomic.Int64 // memcached calls that failed
	conflicts atomic.Int64 // Allow calls refused after casAttempts conflicts

	mu       sync.Mutex // guards cur, old
	cur, old map[string]*rate.Limiter
}

// NewBuckets returns the buckets on mc (nil: always the fallback).
func NewBuckets(cfg BucketsConfig, mc CASMemcache, clk clock.Clock) (*Buckets, error) {
	if cfg.PerSec < 1 || cfg.Burst < 1 {
		return nil, fmt.Errorf("climit: buckets need PerSec >= 1 and Burst >= 1 (got %d, %d)", cfg.PerSec, cfg.Burst)
	}
	if float64(cfg.Burst)/float64(cfg.PerSec) > tauMax.Seconds() {
		return nil, fmt.Errorf("climit: Burst/PerSec is at most %v (got %d/%d)", tauMax, cfg.Burst, cfg.PerSec)
	}
	if cfg.MaxLocal <= 0 {
		cfg.MaxLocal = 100_000
	}
	interval := time.Second / time.Duration(cfg.PerSec)
	return &Buckets{cfg: cfg, mc: mc, clock: clock.Or(clk), interval: interval, tau: time.Duration(cfg.Burst) * interval,
		cur: map[string]*rate.Limiter{}, old: map[string]*rate.Limiter{}}, nil
}

// Allow takes one token of key's bucket and reports whether there was one,
// and, when there was not, how long until there will be (the answer's
// Retry-After). It never waits: a memcached read and a compare-and-swap, more
// only when another process changed the key in between.
func (b *Buckets) Allow(key string) (ok bool, wait time.Duration) {
	now := b.clock.Now()
	if b.mc == nil {
		return b.local(key, now)
	}
	if down := b.downUntil.Load(); down != 0 {
		// After a failure, one call at a time tries memcached again; the
		// others keep to the fallback until it answered, so that a memcached
		// that does not answer at all holds up one request a second, not all
		// that come while it times out.
		if now.UnixNano() < down || !b.probing.CompareAndSwap(false, true) {
			return b.local(key, now)
		}
		defer b.probing.Store(false)
	}
	k := b.cfg.Prefix + key
	for range casAttempts {
		it, err := b.mc.Get(k)
		if (err == nil || errors.Is(err, memcache.ErrCacheMiss)) && b.downUntil.Load() != 0 {
			b.downUntil.Store(0) // memcached answers again
		}
		if errors.Is(err, memcache.ErrCacheMiss) {
			tat := now.Add(b.interval)
			err = b.mc.Add(&memcache.Item{Key: k, Value: strconv.AppendInt(nil, tat.UnixNano(), 10), Expiration: b.ttl(tat, now)})
			if errors.Is(err, memcache.ErrNotStored) {
				continue // another process made it first: read theirs
			}
			if err != nil {
				return b.fail(key, now, err)
			}
			return true, 0
		}
		if err != nil {
			return b.fail(key, now, err)
		}
		prev, perr := strconv.ParseInt(string(it.Value), 10, 64)
		if perr != nil {
			prev = 0 // not ours or damaged: start the bucket full again
		}
		tat := time.Unix(0, max(prev, now.UnixNano())).Add(b.interval)
		if ahead := tat.Sub(now); ahead > b.tau {
			// No process whose clock agrees with this one writes a TAT more
			// than tau ahead, so the wait is at most 1/PerSec; one further
			// off came from a clock running ahead (or a damaged item) and
			// holds only until the item expires: the wait, a client's
			// Retry-After, is capped at a whole bucket's refill.
			return false, min(ahead-b.tau, b.tau+b.interval)
		}
		it.Value = strconv.AppendInt(it.Value[:0], tat.UnixNano(), 10)
		it.Expiration = b.ttl(tat, now)
		err = b.mc.CompareAndSwap(it)
		switch {
		case err == nil:
			return true, 0
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
			now = b.clock.Now()
			continue // changed or expired in between: read it again
		default:
			return b.fail(key, now, err)
		}
	}
	// Other processes changed the key between each read and its swap: a
	// flood of one key. Refused, so that the limit holds under any contention.
	b.conflicts.Add(1)
	return false, b.interval
}

// ttl keeps the item until its TAT is past, in whole seconds (at least 1).
func (b *Buckets) ttl(tat, now time.Time) int32 {
	return int32(tat.Sub(now)/time.Second) + 2
}

// fail notes a memcached failure and puts the process on its fallback for a
// second (retryAfter). A key memcached cannot take (too long, or a space or
// control character in it) is the caller's fault, not memcached's: that one
// key is answered locally and the others still go to memcached.
func (b *Buckets) fail(key string, now time.Time, err error) (bool, time.Duration) {
	if errors.Is(err, memcache.ErrMalformedKey) {
		return b.local(key, now)
	}
	b.failures.Add(1)
	b.downUntil.Store(now.Add(retryAfter).UnixNano())
	return b.local(key, now)
}

// local answers from key's fallback bucket: PerSec/N and Burst/N.
func (b *Buckets) local(key string, now time.Time) (bool, time.Duration) {
	b.fallbacks.Add(1)
	n := 1
	if b.cfg.Procs != nil {
		n = max(b.cfg.Procs(), 1)
	}
	limit := rate.Limit(float64(b.cfg.PerSec) / float64(n))
	burst := max(b.cfg.Burst/n, 1)
	b.mu.Lock()
	l, ok := b.cur[key]
	if !ok {
		if l, ok = b.old[key]; ok {
			delete(b.old, key)
		} else {
			l = rate.NewLimiter(limit, burst)
		}
		if len(b.cur) >= b.cfg.MaxLocal/2 {
			b.old, b.cur = b.cur, make(map[string]*rate.Limiter)
		}
		b.cur[key] = l
	}
	b.mu.Unlock()
	if l.Limit() != limit || l.Burst() != burst { // N changed
		l.SetLimitAt(now, limit)
		l.SetBurstAt(now, burst)
	}
	r := l.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// BucketsStats is what the buckets did: Allow calls the fallback answered,
// memcached calls that failed, and Allow calls refused because other
// processes kept changing the key (casAttempts).
type BucketsStats struct {
	Fallbacks, Failures, Conflicts int64
}

// Stats reads the counts.
func (b *Buckets) Stats() BucketsStats {
	return BucketsStats{Fallbacks: b.fallbacks.Load(), Failures: b.failures.Load(), Conflicts: b.conflicts.Load()}
}

// FallingBack reports whether the buckets are on their fallback now.
func (b *Buckets) FallingBack() bool {
	return b.mc == nil || b.clock.Now().UnixNano() < b.downUntil.Load()
}
