// Package admission caps how many database transactions run at once for one key
// (a red packet) across every process that might serve it, with memcached CAS as
// WeChat's red-packet SETs do. It also keeps the grab cache: memcached's copy of
// how many shares a packet has left.
package admission

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/internal/retry"
)

// Memcache is the part of a memcached client the slots and the grab cache use:
// a *memcache.Client, or one behind a circuit breaker (cell/guard.Memcache),
// whose refusals read here like any memcached failure.
type Memcache interface {
	Get(key string) (*memcache.Item, error)
	Add(item *memcache.Item) error
	Set(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
}

// ErrBusy is returned by Acquire when the key's cap stayed full until ctx ended.
var ErrBusy = errors.New("admission: transaction slots for this key stay full")

// Slots is a memcached-backed counting semaphore per key. When memcached cannot be
// reached it falls back to an in-process count (the per-key FIFO already keeps one
// transaction per key inside a process) and counts the fallbacks.
type Slots struct {
	mc     Memcache
	cap    int
	ttlSec int32 // a slot held by a crashed process frees itself after this
	log    *slog.Logger

	mu    sync.Mutex // guards local
	local map[string]int

	Fallbacks atomic.Int64 // Acquire calls served in-process because memcached failed
	Conflicts atomic.Int64 // CAS conflicts retried
	state     fallbackState

	// Clock is where the slots read time and wait (the counters' start, the
	// backoff); nil is the system clock. Set it before the first Acquire.
	Clock clock.Clock
}

// NewSlots returns a cap of capPerKey concurrent holders per key.
func NewSlots(mc Memcache, capPerKey int, log *slog.Logger) *Slots {
	return &Slots{mc: mc, cap: capPerKey, ttlSec: 10, log: log, local: map[string]int{},
		state: newFallbackState("transaction cap", log)}
}

// NewClient returns a memcached client sized for a cell.
func NewClient(servers []string) *memcache.Client {
	c := memcache.New(servers...)
	c.Timeout = 200 * time.Millisecond
	c.MaxIdleConns = 128
	return c
}

// Stats returns the CAS conflicts retried and the calls the in-process fallback
// served (memcached failed or its circuit breaker is open) since the start.
func (s *Slots) Stats() (casConflicts, fallbacks int64) {
	return s.Conflicts.Load(), s.Fallbacks.Load()
}

// FallingBack reports whether the last call found memcached unreachable, so
// the slots are counted in-process until a call reaches it again.
func (s *Slots) FallingBack() bool { return s.state.down.Load() }

func slotKey(key string) string { return "rc:tx:" + key }

// The bounds of Acquire's wait for a full cap: a backoff from 200 µs doubling
// up to 10 ms, at most acquireAttempts tries (about 10 s, past any
// transaction's 5 s; the caller's ctx normally ends the wait first).
const (
	acquireBackoff  = 200 * time.Microsecond
	acquireWaitMax  = 10 * time.Millisecond
	acquireAttempts = 1000
)

// errCapFull: the key's cap is full, or a CAS lost: worth another try.
var errCapFull = errors.New("admission: cap full")

// unreachable wraps a memcached failure: Acquire falls back, not retries.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }

// Acquire takes one slot for key, waiting (with short backoff, retry.Do)
// while the cap is full. The returned release must be called exactly once; it
// gives the slot back where it was taken (memcached or the in-process
// fallback). Errors: ErrBusy when ctx ends first, or the cap stays full for
// acquireAttempts tries.
func (s *Slots) Acquire(ctx context.Context, key string) (release func(), err error) {
	k := slotKey(key)
	err = retry.Do(ctx, retry.Policy{Attempts: acquireAttempts, Backoff: acquireBackoff, Max: acquireWaitMax, Clock: s.Clock,
		Retryable: func(err error) bool { return err == errCapFull }},
		func(int) error {
			ok, err := s.tryAcquire(k)
			if err != nil {
				return unreachable{err}
			}
			s.state.reached()
			if !ok {
				return errCapFull
			}
			return nil
		})
	var u unreachable
	switch {
	case err == nil:
		return func() { s.release(k) }, nil
	case errors.As(err, &u):
		s.fallback(u.err)
		return s.acquireLocal(ctx, k)
	}
	return nil, ErrBusy
}

// A slot counter is stored as "count:startUnix", where start is when the
// counter last went up from zero. A counter older than the TTL is stale — a
// holder crashed or could not give its slot back — and is started afresh, so a
// lost release blocks a packet for at most ttlSec, even under steady load.
func parseSlot(v []byte) (n int, start int64) {
	cs, ss, _ := cutColon(string(v))
	n, _ = strconv.Atoi(cs)
	start, _ = strconv.ParseInt(ss, 10, 64)
	return n, start
}

func formatSlot(dst []byte, n int, start int64) []byte {
	dst = strconv.AppendInt(dst[:0], int64(n), 10)
	dst = append(dst, ':')
	return strconv.AppendInt(dst, start, 10)
}

// tryAcquire makes one attempt; ok=false means the cap is full or a CAS lost.
func (s *Slots) tryAcquire(k string) (ok bool, err error) {
	now := clock.Or(s.Clock).Now().Unix()
	it, err := s.mc.Get(k)
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = s.mc.Add(&memcache.Item{Key: k, Value: formatSlot(nil, 1, now), Expiration: s.ttlSec})
		if errors.Is(err, memcache.ErrNotStored) {
			s.Conflicts.Add(1)
			return false, nil
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	n, start := parseSlot(it.Value)
	if n <= 0 || now-start > int64(s.ttlSec) {
		n, start = 0, now // empty or stale: start a new counter
	}
	if n >= s.cap {
		return false, nil
	}
	it.Value = formatSlot(it.Value, n+1, start)
	it.Expiration = s.ttlSec
	err = s.mc.CompareAndSwap(it)
	if errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) {
		s.Conflicts.Add(1)
		return false, nil
	}
	return err == nil, err
}

// releaseAttempts bounds the CAS tries of one release.
const releaseAttempts = 50

// release gives a memcached slot back, trying again at once (retry.Do, no
// backoff) when a CAS lost to another holder. If memcached fails now, the
// slot stays counted until the counter goes stale (see parseSlot); it is
// never "given back" to the in-process count, which did not grant it.
func (s *Slots) release(k string) {
	_ = retry.Do(context.Background(), retry.Policy{Attempts: releaseAttempts, Clock: s.Clock,
		Retryable: func(err error) bool { return err == errCapFull }},
		func(int) error {
			it, err := s.mc.Get(k)
			if errors.Is(err, memcache.ErrCacheMiss) {
				return nil // expired; nothing to give back
			}
			if err != nil {
				s.fallback(err)
				return nil
			}
			n, start := parseSlot(it.Value)
			if n <= 0 {
				return nil
			}
			it.Value = formatSlot(it.Value, n-1, start)
			it.Expiration = s.ttlSec
			err = s.mc.CompareAndSwap(it)
			if err == nil || errors.Is(err, memcache.ErrNotStored) {
				return nil
			}
			if !errors.Is(err, memcache.ErrCASConflict) {
				s.fallback(err)
				return nil
			}
			s.Conflicts.Add(1)
			return errCapFull // lost the CAS: try again
		})
}

func (s *Slots) fallback(err error) {
	s.Fallbacks.Add(1)
	s.state.failed(err)
}

// fallbackState remembers whether memcached was reachable at the last call of
// one user of it (the slots, the grab cache) and logs it as an incident
// (internal/incident): a warning when it falls back to in-process, a summary
// at most every incident.DefaultEvery while it lasts, a notice when it is
// back. A memcached that answers some calls and fails others flaps: that is
// one incident too, not two lines per failed call.
type fallbackState struct {
	down atomic.Bool
	log  *incident.Tracker
}

func newFallbackState(use string, log *slog.Logger) fallbackState {
	return fallbackState{log: incident.NewLines(log, incident.Lines{
		Start: "memcached unreachable: " + use + " falls back to in-process",
		Still: "memcached still unreachable: " + use + " in-process",
		End:   "memcached reachable again: " + use + " uses it again",
	}, incident.DefaultEvery)}
}

// failed records a call that could not reach memcached.
func (f *fallbackState) failed(err error) {
	f.down.Store(true)
	f.log.Fail(err)
}

// reached records a call memcached answered: one atomic load while it is up.
func (f *fallbackState) reached() {
	if f.down.Load() {
		f.down.Store(false)
	}
	f.log.OK()
}

// serverAnswered reports whether err is memcached's own answer (a miss, a CAS
// conflict, not stored): the server is reachable. Anything else (refused, timed
// out, a broken connection, an open circuit breaker) means it is not.
func serverAnswered(err error) bool {
	return err == nil || errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrCASConflict) ||
		errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrMalformedKey)
}

// acquireLocal takes an in-process slot, polling every millisecond while the
// key's cap is full (inside one process the FIFO worker holds the only slot,
// so a wait is rare and short); it ends with ErrBusy when ctx does.
func (s *Slots) acquireLocal(ctx context.Context, k string) (func(), error) {
	c := clock.Or(s.Clock)
	for {
		s.mu.Lock()
		if s.local[k] < s.cap {
			s.local[k]++
			s.mu.Unlock()
			return func() { s.releaseLocal(k) }, nil
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ErrBusy
		case <-c.After(time.Millisecond):
		}
	}
}

func (s *Slots) releaseLocal(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.local[k] <= 1 {
		delete(s.local, k)
	} else {
		s.local[k]--
	}
}

func cutColon(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
