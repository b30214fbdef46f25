package clock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
)

// Every runs fn each time the clock passes d after the previous call, and
// stops with ctx: on a manual clock, two calls after 2d, none more after the
// context ends even when the clock moves on.
func TestEveryRunsOnTheClockUntilCtxEnds(t *testing.T) {
	synctest.Test(t, testEveryRunsOnTheClockUntilCtxEnds)
}

func testEveryRunsOnTheClockUntilCtxEnds(t *testing.T) {
	m := NewManual(time.Unix(1_700_000_000, 0))
	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan int, 10)
	done := make(chan struct{})
	go func() { Every(ctx, m, time.Second, func(p int) { passes <- p }); close(done) }()
	for want := 0; want < 2; want++ {
		testenv.WaitWaiter(t, m, "nothing waits on the clock")
		if len(passes) != 0 {
			t.Fatalf("a pass ran before the clock reached %d s", want+1)
		}
		m.Advance(time.Second)
		if got := <-passes; got != want {
			t.Fatalf("pass %d, want %d", got, want)
		}
	}
	testenv.WaitWaiter(t, m, "nothing waits on the clock") // Every waits for the third second: the moment a pass could run
	cancel()
	<-done
	m.Advance(time.Hour)
	synctest.Wait()
	if len(passes) != 0 {
		t.Fatalf("a pass ran after the context ended")
	}
}
