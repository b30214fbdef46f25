package climit

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
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

// casAttempts bounds the tries of one exchange when other processes change
// the same key in between (ErrCASConflict); past them its tokens are
// refused. Each conflict means another process took tokens (progress); as a
// process runs one exchange of a key at a time (its calls grouped), the
// contenders are the processes, not their requests, so a bound this size is
// reached only by a process starved by many others.
const casAttempts = 16

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

	seed   maphash.Seed
	shards [keyShards]keyShard // the keys with a call in Allow now, by hash
}

// keyShards spreads the keys in Allow over this many locks, so that calls
// of different keys (a router's persons) seldom wait for one another.
const keyShards = 64

// keyShard is some keys' states and the lock guarding them and every
// field of theirs but run.
type keyShard struct {
	mu   sync.Mutex
	keys map[string]*keyState
}

// keyState is one key's calls in this process: at most one exchange with
// memcached at a time (run), and the group of calls that came while it was
// in flight (forming), which the next exchange answers together. Its
// fields but run are guarded by its shard's mu.
type keyState struct {
	run     sync.Mutex // held by the group leader whose exchange is in flight
	forming *group     // nil: no group waiting
	refs    int        // calls in Allow for the key
}

// group is calls of one key answered by one exchange: the first granted
// of its n calls (in arrival order) get a token, the others wait.
type group struct {
	n        int
	done     chan struct{}
	granted  int
	wait     time.Duration
	fallback bool // memcached failed: each call asks the fallback itself
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
		cur: map[string]*rate.Limiter{}, old: map[string]*rate.Limiter{}, seed: maphash.MakeSeed()}, nil
}

// Allow takes one token of key's bucket and reports whether there was one,
// and, when there was not, how long until there will be (the answer's
// Retry-After). It never waits on the bucket: a memcached read and a
// compare-and-swap, more only when another process changed the key in
// between (each retry after a random pause up to 50 µs·2^attempt, so that
// two processes do not lose to each other in step).
//
// The calls of one key in this process share their exchanges: while one is
// in flight, the calls that come form a group, and the next exchange takes
// tokens for the whole group at once (one read, one swap), given to its
// calls in arrival order. So a hot key (a scene's bucket) costs a process
// one exchange at a time however many requests wait on it, and its calls do
// not race each other's swaps (which refused tokens a bucket had room for).
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
		granted, wait, fellBack := b.take(key, 1, now)
		if fellBack {
			return b.local(key, now)
		}
		return granted == 1, wait
	}
	sh := &b.shards[maphash.String(b.seed, key)%keyShards]
	sh.mu.Lock()
	ks := sh.keys[key]
	if ks == nil {
		if sh.keys == nil {
			sh.keys = map[string]*keyState{}
		}
		ks = &keyState{}
		sh.keys[key] = ks
	}
	ks.refs++
	g := ks.forming
	if g == nil {
		g = &group{done: make(chan struct{})}
		ks.forming = g
	}
	idx := g.n
	g.n++
	sh.mu.Unlock()
	if idx == 0 { // the group's leader
		b.lead(sh, ks, g, key)
	} else {
		<-g.done
	}
	sh.mu.Lock()
	if ks.refs--; ks.refs == 0 {
		delete(sh.keys, key)
	}
	sh.mu.Unlock()
	switch {
	case g.fallback:
		return b.local(key, b.clock.Now())
	case idx < g.granted:
		return true, 0
	case g.granted > 0:
		return false, b.interval // the tokens ran out within the group: the next one is an interval on
	}
	return false, g.wait
}

// lead runs group g's exchange once the key's previous one is done, and
// wakes its calls. Should an earlier group have found memcached failing
// meanwhile, g goes to the fallback without trying it again (one probe a
// second does, in Allow).
func (b *Buckets) lead(sh *keyShard, ks *keyState, g *group, key string) {
	ks.run.Lock()
	defer close(g.done)
	defer ks.run.Unlock()
	sh.mu.Lock()
	ks.forming = nil // later calls form the next group
	n := g.n
	sh.mu.Unlock()
	if b.downUntil.Load() != 0 {
		g.fallback = true
		return
	}
	g.granted, g.wait, g.fallback = b.take(key, n, b.clock.Now())
}

// take takes up to n tokens of key's bucket in memcached at now, in one read
// and one compare-and-swap (again when another process changed the key in
// between, up to casAttempts), and returns how many it took. When it took
// none, wait is how long until there will be one. fellBack: memcached failed
// (fail noted it), nothing taken.
func (b *Buckets) take(key string, n int, now time.Time) (granted int, wait time.Duration, fellBack bool) {
	k := b.cfg.Prefix + key
	for attempt := range casAttempts {
		if attempt > 0 {
			// Lost the race: step out of phase with the process that won
			// (which may be about to run its next exchange), a random
			// moment up to 50 µs·2^attempt (at most 1.6 ms).
			time.Sleep(rand.N(time.Duration(50<<min(attempt, 5)) * time.Microsecond))
			now = b.clock.Now()
		}
		it, err := b.mc.Get(k)
		if (err == nil || errors.Is(err, memcache.ErrCacheMiss)) && b.downUntil.Load() != 0 {
			b.downUntil.Store(0) // memcached answers again
		}
		if errors.Is(err, memcache.ErrCacheMiss) {
			granted = min(n, b.cfg.Burst) // a full bucket
			tat := now.Add(time.Duration(granted) * b.interval)
			err = b.mc.Add(&memcache.Item{Key: k, Value: strconv.AppendInt(nil, tat.UnixNano(), 10), Expiration: b.ttl(tat, now)})
			if errors.Is(err, memcache.ErrNotStored) {
				continue // another process made it first: read theirs
			}
			if err != nil {
				b.fail(err)
				return 0, 0, true
			}
			return granted, 0, false
		}
		if err != nil {
			b.fail(err)
			return 0, 0, true
		}
		prev, perr := strconv.ParseInt(string(it.Value), 10, 64)
		if perr != nil {
			prev = 0 // not ours or damaged: start the bucket full again
		}
		// GCRA for n: token i (1..n) fits when base + i·interval − now ≤ tau.
		base := time.Unix(0, max(prev, now.UnixNano()))
		room := b.tau - base.Sub(now)
		if fit := int(room / b.interval); fit < n {
			granted = max(fit, 0)
		} else {
			granted = n
		}
		if granted == 0 {
			// No process whose clock agrees with this one writes a TAT more
			// than tau ahead, so the wait is at most 1/PerSec; one further
			// off came from a clock running ahead (or a damaged item) and
			// holds only until the item expires: the wait, a client's
			// Retry-After, is capped at a whole bucket's refill.
			ahead := base.Add(b.interval).Sub(now)
			return 0, min(ahead-b.tau, b.tau+b.interval), false
		}
		tat := base.Add(time.Duration(granted) * b.interval)
		it.Value = strconv.AppendInt(it.Value[:0], tat.UnixNano(), 10)
		it.Expiration = b.ttl(tat, now)
		err = b.mc.CompareAndSwap(it)
		switch {
		case err == nil:
			return granted, 0, false
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
			continue // changed or expired in between: read it again
		default:
			b.fail(err)
			return 0, 0, true
		}
	}
	// Other processes changed the key between each read and its swap: a
	// flood of one key. Refused, so that the limit holds under any contention.
	b.conflicts.Add(int64(n))
	return 0, b.interval, false
}

// ttl keeps the item until its TAT is past, in whole seconds (at least 1).
func (b *Buckets) ttl(tat, now time.Time) int32 {
	return int32(tat.Sub(now)/time.Second) + 2
}

// fail notes a memcached failure and puts the process on its fallback for a
// second (retryAfter); the caller answers from the fallback. A key memcached
// cannot take (too long, or a space or control character in it) is the
// caller's fault, not memcached's: that one key is answered locally and the
// others still go to memcached.
func (b *Buckets) fail(err error) {
	if errors.Is(err, memcache.ErrMalformedKey) {
		return
	}
	b.failures.Add(1)
	b.downUntil.Store(b.clock.Now().Add(retryAfter).UnixNano())
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
