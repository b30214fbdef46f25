package clock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
)

// A Ticker's ticks fall on its grid whatever the loop's passes take: a
// pass past a tick gets it at once and drops the ticks it also missed, the
// next falls on the grid again; a Wait ends with ctx.
func TestTickerKeepsItsGrid(t *testing.T) {
	synctest.Test(t, testTickerKeepsItsGrid)
}

func testTickerKeepsItsGrid(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	m := NewManual(start)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk := NewTicker(m, time.Second)
	ticks := make(chan time.Time, 10)
	wait := func() { // one Wait on another goroutine; its tick's time on ticks
		go func() {
			if tk.Wait(ctx) {
				ticks <- m.Now()
			}
		}()
	}
	wait()
	testenv.WaitWaiter(t, m, "the first Wait does not wait on the clock")
	m.Advance(999 * time.Millisecond)
	synctest.Wait()
	if len(ticks) != 0 {
		t.Fatal("a tick before 1 s")
	}
	m.Advance(time.Millisecond)
	if got := <-ticks; !got.Equal(start.Add(time.Second)) {
		t.Fatalf("first tick at %v, want 1 s", got.Sub(start))
	}
	// A pass of 300 ms: the next tick still falls at 2 s, not 2.3 s.
	m.Advance(300 * time.Millisecond)
	wait()
	testenv.WaitWaiter(t, m, "the second Wait does not wait on the clock")
	m.Advance(700 * time.Millisecond)
	if got := <-ticks; !got.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("second tick at %v, want 2 s", got.Sub(start))
	}
	// A pass of 2.5 s overruns the ticks at 3 and 4 s: the next Wait
	// answers at once (the tick at 3 s), the one at 4 s is dropped, and the
	// one after waits for 5 s.
	m.Advance(2500 * time.Millisecond)
	if !tk.Wait(ctx) || m.Waiters() != 0 {
		t.Fatal("a Wait after an overrun waited")
	}
	wait()
	testenv.WaitWaiter(t, m, "the Wait after the overrun's tick does not wait on the clock")
	m.Advance(499 * time.Millisecond)
	synctest.Wait()
	if len(ticks) != 0 {
		t.Fatal("a dropped tick fell")
	}
	m.Advance(time.Millisecond)
	if got := <-ticks; !got.Equal(start.Add(5 * time.Second)) {
		t.Fatalf("tick after the overrun at %v, want 5 s", got.Sub(start))
	}
	// The end of ctx ends a Wait, and a tick due then does not count.
	done := make(chan bool)
	go func() { done <- tk.Wait(ctx) }()
	testenv.WaitWaiter(t, m, "the last Wait does not wait on the clock")
	cancel()
	if <-done {
		t.Fatal("a Wait answered a tick after ctx ended")
	}
	m.Advance(time.Hour)
	if tk.Wait(ctx) {
		t.Fatal("a due tick answered after ctx ended")
	}
}
