// Package issued keeps "issued so far" counters that upstream reads at very
// high rates (how much of a reward scene's budget or stock is gone), as the
// festival reward wallet did: each cell counts in process, flushes what it
// added to one memcached key per counter once a second (memcached's incr, so
// the cells' additions sum), and reads the cluster-wide total back on the
// same tick. A read is two atomic loads and a compare in process — never a
// memcached or database call per request, and never a hot key.
//
// A read is an approximation by design: it sees this cell's own additions at
// once, the other cells' at most about two flush intervals late (their flush,
// then this cell's read-back), and never goes down (a monotonic maximum), so
// a memcached restart that loses a key shows the old total until the counts
// pass it again. It is for display and early warnings, not for enforcing a
// budget: budgets are enforced in the database.
package issued

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
)

// Memcache is what the counters need of memcached (guard.Memcache).
type Memcache interface {
	Get(key string) (*memcache.Item, error)
	Add(item *memcache.Item) error
	Increment(key string, delta uint64) (uint64, error)
}

// Interval is how often Run flushes and reads back.
const Interval = time.Second

// keyMax bounds a counter's name: memcached keys are at most 250 bytes, and
// the prefix takes some.
const keyMax = 200

// Counters is one cell's set of counters. Safe for concurrent use.
type Counters struct {
	mc     Memcache
	prefix string // memcached key prefix, e.g. "rc:iss:" or "s:rc:iss:" for stress traffic
	log    *slog.Logger

	mu sync.Mutex // guards m
	m  map[string]*Counter
}

// New returns counters kept in mc under keys prefix+name.
func New(mc Memcache, prefix string, log *slog.Logger) *Counters {
	return &Counters{mc: mc, prefix: prefix, log: log, m: map[string]*Counter{}}
}

// Counter is one count, e.g. one scene's cents issued in one stage.
type Counter struct {
	key     string
	pending atomic.Int64 // added here, not flushed yet
	seen    atomic.Int64 // the cluster-wide total last read back
	high    atomic.Int64 // the highest value Read answered: reads never go down
}

// Counter returns the counter called name (1..200 bytes, no spaces or
// control characters), made on first use. Errors: a bad name.
func (c *Counters) Counter(name string) (*Counter, error) {
	if len(name) == 0 || len(name) > keyMax {
		return nil, fmt.Errorf("issued: counter name must be 1..%d bytes", keyMax)
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] == 0x7f {
			return nil, fmt.Errorf("issued: counter name %q holds a space or control character", name)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.m[name]
	if k == nil {
		k = &Counter{key: c.prefix + name}
		c.m[name] = k
	}
	return k, nil
}

// Add counts n (>= 0) more; the next flush takes it to memcached.
func (k *Counter) Add(n int64) {
	if n > 0 {
		k.pending.Add(n)
	}
}

// Read answers the count as this cell sees it: the cluster-wide total last
// read back plus what this cell added since its last flush, never less than
// an earlier Read. In process only.
func (k *Counter) Read() int64 {
	v := k.seen.Load() + k.pending.Load()
	for {
		h := k.high.Load()
		if v <= h {
			return h
		}
		if k.high.CompareAndSwap(h, v) {
			return v
		}
	}
}

// Flush takes every counter's additions to memcached and reads the totals
// back. A counter whose flush fails keeps its additions for the next flush
// (Read still counts them); the error is the first failure.
func (c *Counters) Flush() error {
	c.mu.Lock()
	counters := make([]*Counter, 0, len(c.m))
	for _, k := range c.m {
		counters = append(counters, k)
	}
	c.mu.Unlock()
	var first error
	for _, k := range counters {
		if err := c.flush(k); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (c *Counters) flush(k *Counter) error {
	if d := k.pending.Swap(0); d > 0 {
		if err := c.push(k.key, d); err != nil {
			k.pending.Add(d) // not taken: the next flush tries again
			return err
		}
		// Pushed but not read back yet: until the read below succeeds, the
		// total this cell knows includes d.
		k.seen.Add(d)
	}
	it, err := c.mc.Get(k.key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil // nothing flushed anywhere yet (or memcached lost it): keep what is known
	}
	if err != nil {
		return fmt.Errorf("issued: read %s: %w", k.key, err)
	}
	total, err := strconv.ParseInt(string(it.Value), 10, 64)
	if err != nil {
		return fmt.Errorf("issued: %s holds %q, not a count", k.key, it.Value)
	}
	for {
		s := k.seen.Load()
		if total <= s || k.seen.CompareAndSwap(s, total) {
			return nil
		}
	}
}

// push adds d to key: incr, or, when the key is missing, add it with d (and
// incr after all when another cell added it first).
func (c *Counters) push(key string, d int64) error {
	_, err := c.mc.Increment(key, uint64(d))
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = c.mc.Add(&memcache.Item{Key: key, Value: []byte(strconv.FormatInt(d, 10))})
		if errors.Is(err, memcache.ErrNotStored) {
			_, err = c.mc.Increment(key, uint64(d))
		}
	}
	if err != nil {
		return fmt.Errorf("issued: add %d to %s: %w", d, key, err)
	}
	return nil
}

// Run flushes every Interval until ctx ends, then once more. A failing
// memcached is logged when it starts failing and when it is back, not on
// every tick.
func (c *Counters) Run(ctx context.Context, clk clock.Clock) {
	clk = clock.Or(clk)
	failing := false
	tick := func() {
		err := c.Flush()
		switch {
		case err != nil && !failing:
			c.log.Warn("issued counters: flush failing; reads count this cell's additions only", "err", err)
		case err == nil && failing:
			c.log.Info("issued counters: flush back")
		}
		failing = err != nil
	}
	for {
		select {
		case <-ctx.Done():
			tick()
			return
		case <-clk.After(Interval):
			tick()
		}
	}
}
