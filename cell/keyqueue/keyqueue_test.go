package keyqueue

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

func TestFIFOPerKeyAndBatching(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]int{}
	batches := 0
	release := make(chan struct{})
	q := New(Config{Depth: 1000, MaxKeys: 10, BatchMax: 50, IdleStop: 50 * time.Millisecond}, func(k string, b []int) {
		<-release // hold the first batch so the rest queue up behind it
		mu.Lock()
		defer mu.Unlock()
		got[k] = append(got[k], b...)
		batches++
		if len(b) > 50 {
			t.Errorf("batch of %d > BatchMax", len(b))
		}
	})
	for i := 0; i < 200; i++ {
		for _, k := range []string{"a", "b"} {
			if err := q.Enqueue(k, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(release)
	q.Close()
	q.Wait()
	for _, k := range []string{"a", "b"} {
		if len(got[k]) != 200 {
			t.Fatalf("key %s handled %d of 200", k, len(got[k]))
		}
		for i, v := range got[k] {
			if v != i {
				t.Fatalf("key %s out of order at %d: %d", k, i, v)
			}
		}
	}
	if batches > 12 { // 2 keys x (1 + 199/50 rounded up)
		t.Fatalf("%d batches: queued items were not batched", batches)
	}
	if err := q.Enqueue("a", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("enqueue after close: %v", err)
	}
}

func TestBoundedDepthAndKeys(t *testing.T) { synctest.Test(t, testBoundedDepthAndKeys) }

func testBoundedDepthAndKeys(t *testing.T) {
	block := make(chan struct{})
	q := New(Config{Depth: 2, MaxKeys: 1, BatchMax: 1, IdleStop: time.Second}, func(string, []int) { <-block })
	if err := q.Enqueue("a", 1); err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // the worker holds item 1, so the queue is empty again
	if n := q.Len("a"); n != 0 {
		t.Fatalf("%d items queued while the worker is blocked, want 0 (it holds item 1)", n)
	}
	for i := 0; i < 2; i++ {
		if err := q.Enqueue("a", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Enqueue("a", 9); !errors.Is(err, ErrFull) {
		t.Fatalf("third item in a queue of depth 2: %v", err)
	}
	if err := q.Enqueue("b", 1); !errors.Is(err, ErrFull) {
		t.Fatalf("second key with MaxKeys 1: %v", err)
	}
	close(block)
	q.Close()
	q.Wait()
	if q.Keys() != 0 {
		t.Fatalf("%d workers left after Wait", q.Keys())
	}
}

func TestIdleWorkerExitsAndRestarts(t *testing.T) {
	synctest.Test(t, testIdleWorkerExitsAndRestarts)
}

func testIdleWorkerExitsAndRestarts(t *testing.T) {
	var mu sync.Mutex
	n := 0
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	q := New(Config{Depth: 4, MaxKeys: 4, BatchMax: 4, IdleStop: 10 * time.Millisecond, Clock: clk}, func(string, []int) {
		mu.Lock()
		n++
		mu.Unlock()
	})
	for round := 0; round < 3; round++ {
		if err := q.Enqueue("k", round); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the worker handled the item and waits, idle
		if q.Keys() != 1 {
			t.Fatalf("round %d: %d workers before IdleStop passed, want 1", round, q.Keys())
		}
		clk.Advance(10 * time.Millisecond)
		synctest.Wait()
		if q.Keys() != 0 {
			t.Fatal("idle worker did not exit")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 3 {
		t.Fatalf("handled %d of 3", n)
	}
}

func TestCloseWakesIdleWorkers(t *testing.T) {
	done := make(chan struct{}, 1)
	q := New(Config{Depth: 4, MaxKeys: 4, BatchMax: 4, IdleStop: time.Minute}, func(string, []int) { done <- struct{}{} })
	if err := q.Enqueue("k", 1); err != nil {
		t.Fatal(err)
	}
	<-done
	start := time.Now()
	q.Close()
	q.Wait()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait took %s after Close: idle worker not woken", d)
	}
}

func TestBatchWaitFillsBatch(t *testing.T) { synctest.Test(t, testBatchWaitFillsBatch) }

func testBatchWaitFillsBatch(t *testing.T) {
	sizes := make(chan int, 10)
	q := New(Config{Depth: 100, MaxKeys: 4, BatchMax: 10, BatchWait: 200 * time.Millisecond, IdleStop: time.Second},
		func(_ string, b []int) { sizes <- len(b) })
	for i := 0; i < 10; i++ {
		if err := q.Enqueue("k", i); err != nil {
			t.Fatal(err)
		}
		testenv.Advance(5 * time.Millisecond) // on the bubble's clock, within BatchWait
	}
	if got := <-sizes; got < 5 {
		t.Fatalf("first batch of %d: BatchWait did not gather the items arriving within it", got)
	}
	q.Close()
	q.Wait()
}
