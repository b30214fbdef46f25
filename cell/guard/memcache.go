package guard

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/cell/admission"
)

// ErrOpen is what Memcache returns while its breaker refuses calls; to
// admission it reads like any memcached failure, so the transaction slots fall
// back to their in-process count and the grab cache reads as a miss.
var ErrOpen = errors.New("guard: memcached circuit breaker is open")

// Pool is the memcached client a Memcache wraps: the calls admission makes,
// plus Close, which closes every idle pooled connection and leaves the client
// usable (*memcache.Client's Close does exactly that).
type Pool interface {
	admission.Memcache
	Increment(key string, delta uint64) (uint64, error)
	Close() error
}

// Memcache is a memcached client behind a Breaker. Answers of the server
// (a miss, a CAS conflict, not stored) count as successes; network errors,
// timeouts and server errors as failures. Safe for concurrent use.
//
// A call that fails on a dead connection (see deadConn) drops every idle
// connection of the pool and is tried once more, on a fresh one; only the
// second outcome reaches the breaker. The client keeps up to MaxIdleConns
// idle connections, and when memcached stops or restarts all of them die at
// once: without the drop each call, and so each half-open probe, would take
// the next dead one and fail, and the breaker would need one cooldown per
// pooled connection to see that memcached is back.
type Memcache struct {
	mc Pool
	b  *Breaker
}

var _ admission.Memcache = (*Memcache)(nil)

// NewMemcache returns mc behind b.
func NewMemcache(mc Pool, b *Breaker) *Memcache { return &Memcache{mc: mc, b: b} }

func judgeMemcache(err error) error {
	switch {
	case err == nil, errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrCASConflict),
		errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrMalformedKey), errors.Is(err, memcache.ErrNoStats):
		return nil
	}
	return errFailure // refused, timed out, ErrServerError, ErrNoServers, a broken connection
}

// deadConn reports whether err says a connection that was open broke: the
// server closed it (EOF) or reset it, or it was closed under the call. A
// stopped or restarted memcached leaves exactly these on every pooled
// connection. Dial errors (refused, connect timeout) and read timeouts are
// not: a fresh connection would not help, and a timed-out command may have
// been applied.
//
// Trying such a call again is safe: memcached answers every command it
// applies, so a connection closed or reset before any answer carried a
// command no server applied (a server that dies between applying a command
// and answering it loses the item anyway; a transaction slot counted twice
// that way goes stale within admission's 10 s TTL).
func deadConn(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (m *Memcache) call(f func() error) error {
	err, refused := m.b.do(func() error {
		err := f()
		if deadConn(err) {
			_ = m.mc.Close() // the idle connections died with the same server
			err = f()
		}
		return err
	}, judgeMemcache)
	if refused {
		return ErrOpen
	}
	return err
}

// Get implements admission.Memcache.
func (m *Memcache) Get(key string) (it *memcache.Item, err error) {
	err = m.call(func() (err error) { it, err = m.mc.Get(key); return err })
	return it, err
}

// Add implements admission.Memcache.
func (m *Memcache) Add(item *memcache.Item) error {
	return m.call(func() error { return m.mc.Add(item) })
}

// Set implements admission.Memcache.
func (m *Memcache) Set(item *memcache.Item) error {
	return m.call(func() error { return m.mc.Set(item) })
}

// Increment adds delta to the number stored at key and answers the new value
// (memcached's incr; a missing key is memcache.ErrCacheMiss, an answer). A
// retry on a fresh connection after a dead one (see deadConn) could add
// twice only if memcached applied the command and its connection then
// broke before the answer: callers use it for approximate counters.
func (m *Memcache) Increment(key string, delta uint64) (n uint64, err error) {
	err = m.call(func() (err error) { n, err = m.mc.Increment(key, delta); return err })
	return n, err
}

// CompareAndSwap implements admission.Memcache.
func (m *Memcache) CompareAndSwap(item *memcache.Item) error {
	return m.call(func() error { return m.mc.CompareAndSwap(item) })
}
