// Package climit is a rate limit shared by the cells of a cluster, as Douyin
// Pay's coupon queues drew their consumers' tokens: each cell takes tokens
// from a local stock and refills it in chunks from one cluster-wide counter
// per one-second window (a memcached key "<prefix><name>:<unix second>",
// incremented by the chunk). While every cell reaches memcached, the cells
// together take at most the configured rate in each window, whatever their
// number. Windows are whole seconds of each cell's clock: with clocks in
// step, a span of one second that straddles two windows may see up to twice
// the rate, and a cell whose clock runs ahead spends the next window early.
// A chunk's tokens a cell does not use by the end of its window are lost, so
// the cluster runs under the rate when cells hold chunks they do not use
// (with N·Chunk near the rate, idle cells can hold most of a window).
//
// When memcached does not answer, a cell falls back to a local token bucket
// of rate/N per second (N: the cells the caller counts, at least 1; a burst
// of FallbackBurst/N tokens, at least one), and goes back to the counter a
// second later. While only some cells fall back, the others still draw the
// whole rate from the counter, so the cluster may pass the rate by the
// fallen-back cells' share: the price of not stopping when memcached fails.
package climit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"golang.org/x/time/rate"

	"redcell/internal/clock"
)

// Memcache is what the limiter needs of memcached (guard.Memcache).
type Memcache interface {
	Add(item *memcache.Item) error
	Increment(key string, delta uint64) (uint64, error)
}

// keyTTL keeps a window's counter a little past its second, seconds.
const keyTTL = 5

// retryAfter is how long the limiter stays on its fallback after memcached
// failed, before it asks the counter again.
const retryAfter = time.Second

// Config sets a limiter.
type Config struct {
	// Name keys the counter (with the prefix): one name per limit, the same
	// in every cell.
	Name string
	// Prefix is the memcached key prefix, e.g. "rc:lim:" (stress traffic
	// uses its own).
	Prefix string
	// Rate is the cluster-wide limit, tokens per second, >= 1.
	Rate int
	// Chunk is how many tokens one refill asks for (default Rate/20, at
	// least 1): smaller chunks share the rate more evenly between cells,
	// larger ones call memcached less.
	Chunk int
	// Cells counts the cells sharing the limit, for the fallback's rate/N
	// (nil: 1).
	Cells func() int
	// FallbackBurst is the fallback bucket's burst, shared out as
	// FallbackBurst/N (at least 1); 0: 1.
	FallbackBurst int
}

// Limiter is one cluster-wide limit in one cell. Safe for concurrent use.
type Limiter struct {
	cfg   Config
	mc    Memcache
	clock clock.Clock

	mu        sync.Mutex // guards the fields below
	window    int64      // the unix second local belongs to
	local     int        // tokens held for window
	spent     bool       // the counter gave its last token in window: wait for the next
	downUntil time.Time  // on the fallback until then; zero once memcached answered again
	probing   bool       // a call asks memcached again after a failure, without mu
	fallback  *rate.Limiter
	fellBack  int64 // times memcached failed (Stats)
	refills   int64 // chunks taken from the counter
}

// New returns a limiter on mc (nil: always the fallback).
func New(cfg Config, mc Memcache, clk clock.Clock) (*Limiter, error) {
	if cfg.Name == "" || cfg.Rate < 1 {
		return nil, fmt.Errorf("climit: a limit needs a name and a rate >= 1 (got %q, %d)", cfg.Name, cfg.Rate)
	}
	if len(cfg.Prefix)+len(cfg.Name)+21 > 250 {
		return nil, fmt.Errorf("climit: name %q too long for a memcached key", cfg.Name)
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = max(cfg.Rate/20, 1)
	}
	cfg.Chunk = min(cfg.Chunk, cfg.Rate)
	clk = clock.Or(clk)
	l := &Limiter{cfg: cfg, mc: mc, clock: clk}
	l.fallback = rate.NewLimiter(l.fallbackRate(), l.fallbackBurst()) // starts full
	return l, nil
}

func (l *Limiter) cells() int {
	if l.cfg.Cells != nil {
		return max(l.cfg.Cells(), 1)
	}
	return 1
}

func (l *Limiter) fallbackRate() rate.Limit {
	return rate.Limit(float64(l.cfg.Rate) / float64(l.cells()))
}

func (l *Limiter) fallbackBurst() int { return max(l.cfg.FallbackBurst/l.cells(), 1) }

// toFallback sets the fallback bucket to the share of now's number of cells.
func (l *Limiter) toFallback(now time.Time) {
	l.fallback.SetLimitAt(now, l.fallbackRate())
	if b := l.fallbackBurst(); b != l.fallback.Burst() {
		l.fallback.SetBurstAt(now, b)
	}
}

// Allow takes one token if the limit allows it now; it never waits.
func (l *Limiter) Allow() bool {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mc == nil || now.Before(l.downUntil) || l.probing {
		l.toFallback(now)
		return l.fallback.AllowN(now, 1)
	}
	sec := now.Unix()
	if sec != l.window {
		l.window, l.local, l.spent = sec, 0, false
	}
	if l.local == 0 {
		if l.spent {
			return false
		}
		var got int
		var err error
		if l.downUntil.IsZero() {
			got, err = l.refill(sec) // the others wait for this one call (normally well under a millisecond)
		} else {
			// The first call after a failure asks memcached without the
			// lock, and the others take the fallback meanwhile (l.probing),
			// so that a memcached that does not answer at all holds up one
			// request a second, not every one that comes while it times out.
			// They touch neither the window nor its tokens.
			l.probing = true
			l.mu.Unlock()
			got, err = l.refill(sec)
			l.mu.Lock()
			l.probing = false
			if err == nil {
				l.downUntil = time.Time{}
			}
		}
		if err != nil {
			l.fellBack++
			l.downUntil = now.Add(retryAfter)
			l.toFallback(now)
			return l.fallback.AllowN(now, 1)
		}
		l.refills++
		l.local = got
		if got < l.cfg.Chunk {
			l.spent = true // the window's rate is given out
		}
		if got == 0 {
			return false
		}
	}
	l.local--
	return true
}

// refill takes a chunk of window sec's counter: the tokens the increment
// covered below the rate.
func (l *Limiter) refill(sec int64) (int, error) {
	key := l.cfg.Prefix + l.cfg.Name + ":" + strconv.FormatInt(sec, 10)
	chunk := uint64(l.cfg.Chunk)
	after, err := l.mc.Increment(key, chunk)
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = l.mc.Add(&memcache.Item{Key: key, Value: []byte(strconv.FormatUint(chunk, 10)), Expiration: keyTTL})
		if err == nil {
			after = chunk
		} else if errors.Is(err, memcache.ErrNotStored) { // another cell added it first
			after, err = l.mc.Increment(key, chunk)
		}
	}
	if err != nil {
		return 0, err
	}
	before := after - chunk
	if before >= uint64(l.cfg.Rate) {
		return 0, nil
	}
	return int(min(after, uint64(l.cfg.Rate)) - before), nil
}

// Wait takes one token, waiting for the next window as long as ctx allows.
// Errors: ctx's.
func (l *Limiter) Wait(ctx context.Context) error {
	for {
		if l.Allow() {
			return nil
		}
		now := l.clock.Now()
		next := time.Unix(now.Unix()+1, 0)
		wait := max(next.Sub(now), time.Millisecond)
		if d := l.fallbackWait(now); d > 0 {
			wait = min(wait, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.clock.After(wait):
		}
	}
}

// fallbackWait is how long the fallback bucket needs for a token, 0 when the
// counter is in use.
func (l *Limiter) fallbackWait(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mc != nil && !now.Before(l.downUntil) && !l.probing {
		return 0
	}
	r := l.fallback.ReserveN(now, 1)
	d := r.DelayFrom(now)
	r.CancelAt(now)
	return max(d, time.Millisecond)
}

// FallingBack reports whether the limiter is on its fallback now (no
// memcached, or memcached failed within the last second).
func (l *Limiter) FallingBack() bool {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mc == nil || now.Before(l.downUntil)
}

// Stats is what a limiter did: chunks taken from the counter and times
// memcached failed (each starts a second on the fallback).
type Stats struct {
	Refills, FellBack int64
}

// Stats reads the limiter's counts.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Refills: l.refills, FellBack: l.fellBack}
}
