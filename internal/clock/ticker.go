package clock

import (
	"context"
	"time"
)

// Ticker paces a loop on a Clock as a time.Ticker's channel paces it: its
// ticks fall on a grid, start+d, start+2d, ..., whatever the work between
// them takes. A loop still busy when a tick falls gets that tick at once on
// its next Wait, and the ticks after it that it missed too are dropped (a
// time.Ticker holds one tick for a slow reader); the next tick is then the
// grid's first after that Wait. Every, by contrast, waits d after each pass
// has ended: use a Ticker where the period is a rate the work must keep
// (one batch per tick, say) rather than a pause between passes.
//
// Only After is asked of the clock, so a Manual clock drives a Ticker as it
// drives Every: a tick falls when the clock is moved to it. One loop owns a
// Ticker: it is not safe for concurrent use.
type Ticker struct {
	c    Clock
	d    time.Duration
	next time.Time // the next tick on the grid
}

// NewTicker returns a ticker on c (nil: the system clock) whose first tick
// falls d after now. It panics unless d > 0, as time.NewTicker does.
func NewTicker(c Clock, d time.Duration) *Ticker {
	if d <= 0 {
		panic("clock: NewTicker needs a period > 0")
	}
	c = Or(c)
	return &Ticker{c: c, d: d, next: c.Now().Add(d)}
}

// Wait returns true at the next tick, at once when that tick has fallen
// already, or false once ctx has ended (checked after the wait too, as
// Every does: a tick and the end together answer false).
func (t *Ticker) Wait(ctx context.Context) bool {
	if wait := t.next.Sub(t.c.Now()); wait > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-t.c.After(wait):
		}
	}
	if ctx.Err() != nil {
		return false
	}
	now := t.c.Now()
	t.next = t.next.Add(t.d)
	if !t.next.After(now) { // ticks that fell while the loop was busy: dropped
		t.next = t.next.Add((now.Sub(t.next)/t.d + 1) * t.d)
	}
	return true
}
