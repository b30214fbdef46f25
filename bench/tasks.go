package bench

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// packetState is what a hot, festival or cold run knows about one packet it
// sent; every open task of the packet points to it.
type packetState struct {
	id            string
	amount, count int64 // cents, shares, as sent
	hot           bool  // festival: a big group's packet (hotGroupMin members or more)
	claimedCents  atomic.Int64
	claims        atomic.Int64
}

// openTask is one open to make: act opens pkt at due (zero: whenever a worker
// is free).
type openTask struct {
	due     time.Time
	pkt     *packetState
	act     string
	sampled bool // act's balance is read after the run
}

// taskQueue holds open tasks by due time (earliest first, FIFO among equals).
// Senders push the members' opens of each packet they send; workers pop them
// when due. It holds at most max tasks. It is safe for concurrent use.
type taskQueue struct {
	mu   sync.Mutex // guards h, seq and wake
	h    taskHeap
	seq  uint64
	wake chan struct{} // closed (and replaced) by every push, to wake poppers
	max  int
}

func newTaskQueue(max int) *taskQueue {
	if max < 1 {
		panic("bench: taskQueue needs max >= 1")
	}
	return &taskQueue{wake: make(chan struct{}), max: max}
}

// push adds tasks and returns how many did not fit.
func (q *taskQueue) push(tasks []openTask) (dropped int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range tasks {
		if len(q.h) >= q.max {
			dropped++
			continue
		}
		q.seq++
		heap.Push(&q.h, queued{openTask: t, seq: q.seq})
	}
	close(q.wake)
	q.wake = make(chan struct{})
	return dropped
}

// len returns the number of tasks queued.
func (q *taskQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h)
}

// lag returns how long the earliest task has been due, 0 when none is: how far
// the workers are behind.
func (q *taskQueue) lag(now time.Time) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.h) == 0 || q.h[0].due.After(now) {
		return 0
	}
	return now.Sub(q.h[0].due)
}

// pop waits until the earliest task is due and returns it; ok is false when
// ctx ends first.
func (q *taskQueue) pop(ctx context.Context) (openTask, bool) {
	for {
		q.mu.Lock()
		now := time.Now()
		if len(q.h) > 0 && !q.h[0].due.After(now) {
			t := heap.Pop(&q.h).(queued)
			q.mu.Unlock()
			return t.openTask, true
		}
		wait := time.Hour // until a push
		if len(q.h) > 0 {
			wait = q.h[0].due.Sub(now)
		}
		wake := q.wake
		q.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return openTask{}, false
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

type queued struct {
	openTask
	seq uint64
}

// taskHeap implements heap.Interface, ordered by (due, seq).
type taskHeap []queued

func (h taskHeap) Len() int { return len(h) }
func (h taskHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h taskHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *taskHeap) Push(x any)   { *h = append(*h, x.(queued)) }
func (h *taskHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = queued{} // let the packet state be collected
	*h = old[:n-1]
	return t
}
