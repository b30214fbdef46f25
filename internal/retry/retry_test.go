package retry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

var errBusy = errors.New("busy")

func TestDoStopsAtSuccessAndBound(t *testing.T) {
	calls := 0
	err := Do(context.Background(), Policy{Attempts: 5}, func(int) error {
		calls++
		if calls == 3 {
			return nil
		}
		return errBusy
	})
	if err != nil || calls != 3 {
		t.Fatalf("err=%v calls=%d, want nil after 3", err, calls)
	}
	calls = 0
	err = Do(context.Background(), Policy{Attempts: 4}, func(int) error { calls++; return errBusy })
	if !errors.Is(err, errBusy) || calls != 4 {
		t.Fatalf("err=%v calls=%d, want busy after 4", err, calls)
	}
}

func TestDoRefusedErrorEndsAtOnce(t *testing.T) {
	calls := 0
	err := Do(context.Background(), Policy{Attempts: 4, Retryable: func(err error) bool { return false }},
		func(int) error { calls++; return errBusy })
	if !errors.Is(err, errBusy) || calls != 1 {
		t.Fatalf("err=%v calls=%d, want 1 call", err, calls)
	}
}

// The waits double up to Max, measured on a manual clock.
func TestDoBacksOffOnTheClock(t *testing.T) { synctest.Test(t, testDoBacksOffOnTheClock) }

func testDoBacksOffOnTheClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := clock.NewManual(start)
	var at []time.Duration
	done := make(chan error, 1)
	go func() {
		done <- Do(context.Background(), Policy{Attempts: 4, Backoff: 100 * time.Millisecond, Max: 300 * time.Millisecond, Clock: c},
			func(int) error { at = append(at, c.Now().Sub(start)); return errBusy })
	}()
	for i := 0; i < 3; i++ { // each wait, once Do is in it
		testenv.WaitWaiter(t, c, "Do does not wait on the clock")
		c.Advance(time.Second)
	}
	if err := <-done; !errors.Is(err, errBusy) {
		t.Fatal(err)
	}
	if len(at) != 4 {
		t.Fatalf("attempts at %v", at)
	}
	// A manual clock moved by 1 s per wait: attempts at 0, 1, 2, 3 s; the
	// waits asked for are checked through a clock that records them.
	rc := &recording{Manual: clock.NewManual(start)}
	_ = Do(context.Background(), Policy{Attempts: 5, Backoff: 100 * time.Millisecond, Max: 300 * time.Millisecond, Clock: rc},
		func(int) error { return errBusy })
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}
	if len(rc.waits) != len(want) {
		t.Fatalf("waits %v, want %v", rc.waits, want)
	}
	for i := range want {
		if rc.waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", rc.waits, want)
		}
	}
}

// recording fires every wait at once and remembers how long it was.
type recording struct {
	*clock.Manual
	waits []time.Duration
}

func (r *recording) After(d time.Duration) <-chan time.Time {
	r.waits = append(r.waits, d)
	return r.Manual.After(0)
}

func TestDoHonoursContextBetweenAttempts(t *testing.T) {
	synctest.Test(t, testDoHonoursContextBetweenAttempts)
}

func testDoHonoursContextBetweenAttempts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := clock.NewManual(time.Unix(0, 0)) // never advanced: only ctx can end the wait
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- Do(ctx, Policy{Attempts: 10, Backoff: time.Hour, Clock: c}, func(int) error { calls++; return errBusy })
	}()
	testenv.WaitWaiter(t, c, "Do does not wait on the clock")
	cancel()
	err := <-done
	if !errors.Is(err, ErrStopped) || !errors.Is(err, context.Canceled) || !errors.Is(err, errBusy) || calls != 1 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
}
