// Package clock is the one source of time for production code in cell and
// storage: they read time only through a Clock they are given, so tests and the
// simulation (sim) can run them on a clock they drive.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and waits.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// After sends the time on the channel once d has passed.
	After(d time.Duration) <-chan time.Time
}

// Real is the system clock.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Or returns c, or the system clock when c is nil (a zero config).
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Manual is a clock that moves only when told to (Set, Advance). Waiters made
// by After fire when the clock reaches their time. Safe for concurrent use.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewManual returns a manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now is the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// After fires when the clock has been moved d past now (at once if d <= 0).
func (m *Manual) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := make(chan time.Time, 1)
	at := m.now.Add(d)
	if d <= 0 {
		ch <- m.now
		return ch
	}
	m.waiters = append(m.waiters, waiter{at: at, ch: ch})
	return ch
}

// Advance moves the clock forward by d and fires the waiters it passed.
func (m *Manual) Advance(d time.Duration) { m.Set(m.Now().Add(d)) }

// Set moves the clock to t (never backwards: an earlier t is ignored) and
// fires the waiters it passed.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.Before(m.now) {
		return
	}
	m.now = t
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if !w.at.After(t) {
			w.ch <- t
		} else {
			kept = append(kept, w)
		}
	}
	m.waiters = kept
}

// Waiters is how many After channels have not fired yet (tests wait for a
// goroutine to start waiting before they move the clock).
func (m *Manual) Waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}
