package testenv

import (
	"testing"
	"testing/synctest"
	"time"
)

// Advance lets d of fake time pass in the caller's synctest bubble (the
// code under test reads the bubble's clock: time.Now, its timers, a
// clock.Real), then waits with synctest.Wait until every goroutine in the
// bubble is durably blocked, so what the code does by then is done when the
// test looks. It is for use inside synctest.Test only, from one goroutine at
// a time: outside a bubble synctest.Wait panics, so a misuse cannot pass for
// a real wait. Where the test only needs goroutines to settle, call
// synctest.Wait alone; where the code takes a clock.Clock, prefer a
// clock.Manual the test moves.
func Advance(d time.Duration) {
	time.Sleep(d) // the bubble's fake clock: returns once it has moved d
	synctest.Wait()
}

// WaitWaiter waits with synctest.Wait until every goroutine in the
// caller's bubble is durably blocked, then fails the test with msg unless
// one of them waits on c (a clock.Manual, whose Waiters counts the sleeps
// and timers pending on it). For use inside synctest.Test only.
func WaitWaiter(t testing.TB, c interface{ Waiters() int }, msg string) {
	t.Helper()
	synctest.Wait()
	if c.Waiters() == 0 {
		t.Fatal(msg)
	}
}
