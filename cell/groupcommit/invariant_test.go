package groupcommit

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
)

// The committer's invariants fire on states only a bug can make. Each case
// builds its lane by hand (no worker runs) and calls the operation that
// asserts.

// zeroOp breaks MoneyOp's contract: it weighs nothing.
type zeroOp struct{ storage.DepositOp }

func (*zeroOp) Weight() int { return 0 }

func quietCommitter() *Committer {
	return New(Config{Max: 4, QueueMax: 100, CommitTimeout: time.Second,
		Commit: func(context.Context, Lane, []storage.MoneyOp) error { return nil }})
}

// waiting is a waiter of weight w in state st.
func waiting(w int, st waiterState) *waiter {
	return &waiter{op: &storage.DepositOp{Amount: 1}, weight: w, state: st, done: make(chan struct{})}
}

// laneOf installs l as lane0 of c, without a worker.
func laneOf(c *Committer, l *lane) *lane {
	l.id, l.wake = lane0, make(chan struct{}, 1)
	c.lanes[lane0] = l
	return l
}

func TestSubmitInvariantsFire(t *testing.T) {
	ctx := context.Background()
	testenv.WantPanic(t, "weightless op", "weight below 1", func() {
		_ = quietCommitter().Submit(ctx, lane0, &zeroOp{})
	})
	testenv.WantPanic(t, "an op from nowhere", "ops in must be ops queued + taken + abandoned", func() {
		c := quietCommitter()
		laneOf(c, &lane{in: 5})
		_ = c.Submit(ctx, lane0, deposit(1))
	})
}

func TestTakeInvariantsFire(t *testing.T) {
	testenv.WantPanic(t, "taken twice", "an op taken twice", func() {
		c := quietCommitter()
		l := laneOf(c, &lane{in: 1, queuedOps: 1, reqs: 1})
		l.q = []*waiter{waiting(1, taken)}
		c.take(l, nil, 0)
	})
	testenv.WantPanic(t, "answered before taken", "answered before it was taken", func() {
		c := quietCommitter()
		c.take(laneOf(c, &lane{in: 1, out: 1, answered: 2}), nil, 0)
	})
	testenv.WantPanic(t, "requests without ops", "queued requests disagree with queued ops", func() {
		c := quietCommitter()
		c.take(laneOf(c, &lane{reqs: 3, in: 1, out: 1, answered: 1}), nil, 0) // 3 requests of no op
	})
}

func TestCommitInvariantsFire(t *testing.T) {
	testenv.WantPanic(t, "group past Max", "carries more than Max", func() {
		c := quietCommitter()
		l := laneOf(c, &lane{in: 2, out: 2, groupMax: 4})
		c.commit(l, []*waiter{waiting(3, taken), waiting(3, taken)}, 0)
	})
	testenv.WantPanic(t, "answered twice", "an op answered twice", func() {
		c := quietCommitter()
		l := laneOf(c, &lane{in: 1, out: 1, groupMax: 4})
		c.commit(l, []*waiter{waiting(1, answered)}, 0)
	})
	testenv.WantPanic(t, "an op dropped from its group", "taken and not answered", func() {
		c := quietCommitter()
		l := laneOf(c, &lane{in: 2, out: 2, groupMax: 4}) // two taken, one committed
		c.commit(l, []*waiter{waiting(1, taken)}, 0)
	})
	testenv.WantPanic(t, "stop with an op unanswered", "a lane stops with an op neither answered nor abandoned", func() {
		c := quietCommitter()
		l := laneOf(c, &lane{in: 2, out: 2, answered: 1, stopping: true})
		c.wg.Add(1)
		c.work(l)
	})
}

// The counts balance through real use, an abandoned op included: after
// Stop the lane's in = out + dropped and answered = out.
func TestCountsBalanceThroughUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 16)}
		c := newCommitter(f, nil)
		done := make(chan error, 3)
		go func() { done <- c.Submit(context.Background(), lane0, deposit(1)) }()
		<-f.started // the first group commits; the next ops queue behind it
		ctx, cancel := context.WithCancel(context.Background())
		go func() { done <- c.Submit(ctx, lane0, deposit(2)) }()
		go func() { done <- c.Submit(context.Background(), lane0, deposit(3)) }()
		synctest.Wait()
		cancel() // op 2 is abandoned while queued
		if err := <-done; !errors.Is(err, model.ErrTimeout) {
			t.Fatalf("the abandoned op: %v", err)
		}
		close(f.gate)
		for range 2 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		c.Stop()
		l := c.lanes[lane0]
		if l.in != 3 || l.dropped != 1 || l.out != 2 || l.answered != 2 || l.queuedOps != 0 {
			t.Fatalf("lane counts in %d out %d dropped %d answered %d queued %d", l.in, l.out, l.dropped, l.answered, l.queuedOps)
		}
	})
}
