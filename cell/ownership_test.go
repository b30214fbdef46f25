package cell

import (
	"context"
	"errors"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/sharding"
)

// TestDrainWaitsForItsDatabase: a freeze of database 3 waits for work that
// entered database 3 or the cell as a whole before it, not for work of
// database 4, nor for work that entered after it began.
func TestDrainWaitsForItsDatabase(t *testing.T) {
	o := newOwnership("cell-t", sharding.Ranges{{From: 0, To: 99}}, 1)
	drained := func(db int) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		err := o.drain(ctx, db)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !drained(3) {
		t.Fatal("a drain with nothing in flight did not end")
	}

	other := o.enterDB(4)
	if !drained(3) {
		t.Error("a drain of db_03 waited for work in db_04")
	}
	if drained(4) {
		t.Error("a drain of db_04 did not wait for work in db_04")
	}
	other()

	mine := o.enterDBs([]int{4, 3, 3, 4})
	if drained(3) || drained(4) {
		t.Error("a drain did not wait for work in db_03 and db_04")
	}
	mine()
	if !drained(3) || !drained(4) {
		t.Error("work that left still held a drain (enterDBs left more or less than it entered)")
	}

	global := o.enter()
	if drained(7) {
		t.Error("a drain of db_07 did not wait for work that may write any database")
	}
	global()

	// Work that enters while a drain waits joins the next generation: the
	// drain ends when the old work leaves.
	first := o.enterDB(3)
	gen := o.dbWork[3].cur.Load()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- o.drain(ctx, 3)
	}()
	testenv.WaitFor(t, 10*time.Second, "the drain to start the new generation", func() bool { return o.dbWork[3].cur.Load() != gen })
	later := o.enterDB(3)
	defer later()
	first()
	if err := <-done; err != nil {
		t.Errorf("a drain waited for work that entered after it began: %v", err)
	}
}

// TestDrainAfterAFailedDrain: work a drain gave up waiting for (a freeze
// that timed out and thawed) is still waited for by the next drain.
func TestDrainAfterAFailedDrain(t *testing.T) {
	o := newOwnership("cell-t", sharding.Ranges{{From: 0, To: 99}}, 1)
	stalled := o.enterDB(5)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := o.drain(ctx, 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a drain with work in flight ended: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = o.drain(ctx, 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the next drain did not wait for the work the failed one gave up on: %v", err)
	}
	stalled()
	if err := o.drain(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	if n := len(o.dbWork[5].pending); n != 0 {
		t.Errorf("%d generations still pending after a drain that ended", n)
	}
}
