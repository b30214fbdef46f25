package keyqueue

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkEnqueue: b.N items through the queue, to one key or spread over
// 64, with a handler that only counts them; the time is per item, from
// Enqueue to its batch handled.
func BenchmarkEnqueue(b *testing.B) {
	for _, keys := range []int{1, 64} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			var done atomic.Int64
			q := New(Config{Depth: 1024, MaxKeys: 1024, BatchMax: 64, IdleStop: time.Second},
				func(_ int, batch []int) { done.Add(int64(len(batch))) })
			b.ReportAllocs()
			for i := range b.N {
				for q.Enqueue(i%keys, i) == ErrFull {
					runtime.Gosched()
				}
			}
			for done.Load() < int64(b.N) {
				runtime.Gosched()
			}
			b.StopTimer()
			q.Close()
			q.Wait()
		})
	}
}

// BenchmarkEnqueueTake: the queue's own bookkeeping on one goroutine, without
// a worker or its scheduling: Enqueue, and every 16 items a take of them
// (the time is per item).
func BenchmarkEnqueueTake(b *testing.B) {
	q := New(Config{Depth: 64, MaxKeys: 4, BatchMax: 16, IdleStop: time.Second}, func(int, []int) {})
	ks := &keyState[int]{wake: make(chan struct{}, 1)}
	q.keys[1] = ks // no worker: the benchmark takes
	batch := make([]int, 0, 16)
	b.ReportAllocs()
	for i := range b.N {
		if err := q.Enqueue(1, i); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			batch = q.take(ks, batch[:0])
			select {
			case <-ks.wake:
			default:
			}
		}
	}
}
