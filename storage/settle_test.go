package storage

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

var errReread = errors.New("re-read failed")

// settleCommit re-reads on the store's clock, 100 ms apart, at most 3 times,
// and stops waiting when ctx ends. Needs no database: only the clock is used.
func TestSettleCommitWaitsOnTheStoreClock(t *testing.T) {
	synctest.Test(t, testSettleCommitWaitsOnTheStoreClock)
}

func testSettleCommitWaitsOnTheStoreClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := clock.NewManual(start)
	m := &MySQL{clock: c}
	var at []time.Duration
	type result struct{ ok, known bool }
	done := make(chan result, 1)
	go func() {
		ok, known := m.settleCommit(context.Background(), func() (bool, error) {
			at = append(at, c.Now().Sub(start))
			if len(at) < 3 {
				return false, errReread
			}
			return true, nil
		})
		done <- result{ok, known}
	}()
	for i := 0; i < 2; i++ { // each wait, once settleCommit is in it
		testenv.WaitWaiter(t, c, "settleCommit does not wait on the store's clock")
		c.Advance(100 * time.Millisecond)
	}
	if r := <-done; !r.ok || !r.known {
		t.Fatalf("third re-read found the order, got %+v", r)
	}
	if len(at) != 3 || at[0] != 0 || at[1] != 100*time.Millisecond || at[2] != 200*time.Millisecond {
		t.Fatalf("re-reads at %v, want 0, 100ms, 200ms", at)
	}

	// Every re-read failing: unknown after 3.
	calls := 0
	m.clock = clock.Real{}
	if ok, known := m.settleCommit(context.Background(), func() (bool, error) { calls++; return false, errReread }); ok || known || calls != 3 {
		t.Fatalf("all re-reads failed: ok=%v known=%v calls=%d", ok, known, calls)
	}
}

func TestSettleCommitStopsWithCtx(t *testing.T) { synctest.Test(t, testSettleCommitStopsWithCtx) }

func testSettleCommitStopsWithCtx(t *testing.T) {
	c := clock.NewManual(time.Unix(0, 0)) // never advanced: only ctx can end the wait
	m := &MySQL{clock: c}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan bool, 1)
	go func() {
		_, known := m.settleCommit(ctx, func() (bool, error) { calls++; return false, errReread })
		done <- known
	}()
	testenv.WaitWaiter(t, c, "settleCommit does not wait on the store's clock")
	cancel()
	if known := <-done; known || calls != 1 {
		t.Fatalf("after cancel: known=%v calls=%d, want unknown after 1", known, calls)
	}
}
