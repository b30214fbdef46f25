package guard

import (
	"errors"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/cell/admission"
)

// ErrOpen is what Memcache returns while its breaker refuses calls; to
// admission it reads like any memcached failure, so the transaction slots fall
// back to their in-process count and the grab cache reads as a miss.
var ErrOpen = errors.New("guard: memcached circuit breaker is open")

// Memcache is a memcached client behind a Breaker. Answers of the server
// (a miss, a CAS conflict, not stored) count as successes; network errors,
// timeouts and server errors as failures. Safe for concurrent use.
type Memcache struct {
	mc admission.Memcache
	b  *Breaker
}

var _ admission.Memcache = (*Memcache)(nil)

// NewMemcache returns mc behind b.
func NewMemcache(mc admission.Memcache, b *Breaker) *Memcache { return &Memcache{mc: mc, b: b} }

func judgeMemcache(err error, _ time.Duration) error {
	switch {
	case err == nil, errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrCASConflict),
		errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrMalformedKey), errors.Is(err, memcache.ErrNoStats):
		return nil
	}
	return errFailure // refused, timed out, ErrServerError, ErrNoServers, a broken connection
}

func (m *Memcache) call(f func() error) error {
	err, refused := m.b.do(f, judgeMemcache)
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

// CompareAndSwap implements admission.Memcache.
func (m *Memcache) CompareAndSwap(item *memcache.Item) error {
	return m.call(func() error { return m.mc.CompareAndSwap(item) })
}
