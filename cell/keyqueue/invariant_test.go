package keyqueue

import (
	"testing"
	"time"

	"redcell/internal/testenv"
)

// The queue's invariants fire on states only a bug can make. Each case builds
// its key states by hand (no worker runs) and calls the operation that
// asserts.

// queueWith is a queue holding ks as key 1's state, without its worker.
func queueWith(ks *keyState[int]) *Queue[int, int] {
	q := New(Config{Depth: 4, MaxKeys: 2, BatchMax: 8, IdleStop: time.Minute}, func(int, []int) {})
	q.keys[1] = ks
	return q
}

func state(items []int, in, out int) *keyState[int] {
	return &keyState[int]{items: items, wake: make(chan struct{}, 1), in: in, out: out}
}

func TestInvariantsFire(t *testing.T) {
	testenv.WantPanic(t, "an item from nowhere", "in = out + queued (Enqueue)", func() {
		_ = queueWith(state([]int{7}, 0, 0)).Enqueue(1, 8)
	})
	testenv.WantPanic(t, "an item lost", "in = out + queued (take)", func() {
		ks := state([]int{7, 8}, 3, 0)
		queueWith(ks).take(ks, nil)
	})
	testenv.WantPanic(t, "past Depth", "more than Depth items", func() {
		ks := state([]int{1, 2, 3, 4, 5}, 5, 0)
		queueWith(ks).take(ks, nil)
	})
	testenv.WantPanic(t, "past MaxKeys", "more than MaxKeys keys", func() {
		ks := state(nil, 0, 0)
		q := queueWith(ks)
		q.keys[2], q.keys[3] = state(nil, 0, 0), state(nil, 0, 0)
		q.take(ks, nil)
	})
	testenv.WantPanic(t, "two workers for a key", "one worker per key", func() {
		q := queueWith(state(nil, 2, 2))
		q.stopIfDone(1, state(nil, 2, 2), true)
	})
	testenv.WantPanic(t, "a key leaves with items unaccounted", "in = out)", func() {
		ks := state(nil, 3, 2)
		queueWith(ks).stopIfDone(1, ks, true)
	})
}

// The counts hold through real use: after Close and Wait every key left with
// in = out (stopIfDone asserted it).
func TestCountsBalanceThroughUse(t *testing.T) {
	got := 0
	q := New(Config{Depth: 64, MaxKeys: 8, BatchMax: 3, IdleStop: time.Millisecond}, func(_ int, b []int) { got += len(b) })
	for i := range 50 {
		if err := q.Enqueue(0, i); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	q.Wait()
	if got != 50 || q.Keys() != 0 {
		t.Fatalf("handled %d of 50, %d keys live", got, q.Keys())
	}
}
