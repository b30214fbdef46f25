package admission

import (
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
)

// Remaining is the grab cache's copy of a packet: shares left, status and expiry.
type Remaining struct {
	Count     int64
	Status    int8
	ExpiresMS int64
	// Local is set on a copy read from the in-process fallback (memcached was
	// unreachable); it is not stored.
	Local bool
}

// Cache is the grab cache: memcached's copy of how many shares each packet
// has left. A miss reads as "not cached" (the caller reads the database).
//
// While memcached is unreachable (a call fails, or its circuit breaker is
// open) the cache keeps its copies in process instead, bounded by localMax,
// and says so once in the log; it tries memcached again at most once per
// probeEvery and, when memcached answers, logs that and goes back to it.
// Copies written to memcached before the outage may have gone stale while
// the in-process ones were updated, so going back starts a new key
// generation: every packet reads as a miss once, and is filled from the
// database. The generation also starts anew with each process, since a copy
// another lifetime of this cell wrote may be stale too. Safe for concurrent use.
type Cache struct {
	mc    Memcache
	state fallbackState

	mu         sync.Mutex // guards gen, gens, local, lastProbe
	gen        string     // key generation: a random stamp of the process, then a count of outages
	gens       int
	local      map[string]localCopy
	lastProbe  time.Time
	probeEvery time.Duration // how often memcached is tried while down (tests shorten it)

	fallbacks atomic.Int64 // calls served by the in-process copies

	// Clock is where the cache reads time (the copies' expiry, the probes);
	// nil is the system clock. Set it before the first call.
	Clock clock.Clock
}

func (c *Cache) now() time.Time { return clock.Or(c.Clock).Now() }

type localCopy struct {
	r       Remaining
	expires time.Time
}

const (
	// localMax bounds the in-process copies; when full they are dropped, which
	// only costs a database read per packet.
	localMax = 100_000
	// probeEvery is how often the cache tries memcached again while it is down:
	// often enough to be back within a second, rare enough to cost nothing.
	probeEvery = time.Second
)

// NewCache returns the grab cache over mc; log receives its fallback changes.
func NewCache(mc Memcache, log *slog.Logger) *Cache {
	// The generation stamp must differ from every earlier process's, so a
	// copy another lifetime wrote is never read: 64 random bits (math/rand/v2
	// seeds itself per process), not a time, which a manual clock would
	// repeat and two processes started in one millisecond would share.
	return &Cache{mc: mc, state: newFallbackState("grab cache", log),
		gen: strconv.FormatUint(rand.Uint64(), 36) + ".0", local: map[string]localCopy{}, probeEvery: probeEvery}
}

// FallingBack reports whether the cache serves its in-process copies now
// (memcached unreachable), and how many calls those served since the start.
func (c *Cache) FallingBack() (active bool, served int64) {
	return c.state.down.Load(), c.fallbacks.Load()
}

func (c *Cache) remKey(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return "rc:rem:" + c.gen + ":" + key
}

// useMemcached reports whether a call should go to memcached: always while it
// is up; while it is down, once per probeEvery, to find out whether it is back.
func (c *Cache) useMemcached() bool {
	if !c.state.down.Load() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if now.Sub(c.lastProbe) < c.probeEvery {
		return false
	}
	c.lastProbe = now
	return true
}

// outcome tells the cache what a memcached call returned: it falls back on a
// failure and comes back when memcached answers again. ok is false when the
// call failed and the in-process copies must serve it.
func (c *Cache) outcome(err error) (ok bool) {
	if !serverAnswered(err) {
		c.mu.Lock()
		c.lastProbe = c.now()
		if !c.state.down.Load() {
			c.local = map[string]localCopy{} // copies left from an earlier outage are stale now
		}
		c.mu.Unlock()
		c.state.failed(err)
		return false
	}
	if c.state.down.Load() {
		c.mu.Lock()
		c.gens++ // copies from before the outage may be stale
		c.gen = c.gen[:strings.IndexByte(c.gen, '.')+1] + strconv.Itoa(c.gens)
		c.local = map[string]localCopy{}
		c.mu.Unlock()
	}
	c.state.reached() // on every answer, so the log ends the incident even after a race with a failure
	return true
}

// Get returns the copy for key; ok is false on a miss.
func (c *Cache) Get(key string) (r Remaining, ok bool) {
	if c.useMemcached() {
		probe := c.state.down.Load()
		it, err := c.mc.Get(c.remKey(key))
		if c.outcome(err) {
			if err != nil || probe {
				return r, false // a probe read the generation from before the outage
			}
			return parseRemaining(it.Value)
		}
	}
	c.fallbacks.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	lc, ok := c.local[key]
	if !ok || c.now().After(lc.expires) {
		return r, false
	}
	lc.r.Local = true
	return lc.r, true
}

func parseRemaining(v []byte) (r Remaining, ok bool) {
	var parts [3]int64
	s := string(v)
	for i := 0; i < 3; i++ {
		var field string
		field, s, _ = cutColon(s)
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return r, false
		}
		parts[i] = n
	}
	return Remaining{Count: parts[0], Status: int8(parts[1]), ExpiresMS: parts[2]}, true
}

// Set stores the copy for key until ttl passes; the open worker calls it after
// each commit, so it always writes the newest state. A failed write lands in
// the in-process copies: the cache is a hint, a miss reads the database.
func (c *Cache) Set(key string, r Remaining, ttl time.Duration) {
	c.write(c.mc.Set, key, r, ttl, true)
}

// Fill stores a copy read from the database after a miss, only if no copy is
// there: a worker's newer Set must never be overwritten by an older read.
func (c *Cache) Fill(key string, r Remaining, ttl time.Duration) {
	c.write(c.mc.Add, key, r, ttl, false)
}

// write stores through op (Set or Add), or in process while memcached is down.
func (c *Cache) write(op func(*memcache.Item) error, key string, r Remaining, ttl time.Duration, overwrite bool) {
	if c.useMemcached() {
		probe := c.state.down.Load()
		if c.outcome(op(c.item(key, r, ttl))) {
			if probe {
				_ = op(c.item(key, r, ttl)) // the probe wrote the old generation; write the new one
			}
			return
		}
	}
	c.putLocal(key, r, ttl, overwrite)
}

func (c *Cache) putLocal(key string, r Remaining, ttl time.Duration, overwrite bool) {
	c.fallbacks.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc, there := c.local[key]; there && !overwrite && c.now().Before(lc.expires) {
		return
	}
	if len(c.local) >= localMax {
		c.local = map[string]localCopy{}
	}
	r.Local = false
	c.local[key] = localCopy{r: r, expires: c.now().Add(ttl)}
}

func (c *Cache) item(key string, r Remaining, ttl time.Duration) *memcache.Item {
	v := strconv.FormatInt(r.Count, 10) + ":" + strconv.Itoa(int(r.Status)) + ":" + strconv.FormatInt(r.ExpiresMS, 10)
	sec := int32(ttl / time.Second)
	if sec < 1 {
		sec = 1
	}
	if sec > 30*24*3600 {
		sec = 30 * 24 * 3600
	}
	return &memcache.Item{Key: c.remKey(key), Value: []byte(v), Expiration: sec}
}
