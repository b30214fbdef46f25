// Package keyqueue runs one FIFO worker per active key: work for one key runs in
// arrival order, one batch at a time, while different keys run in parallel. It
// knows nothing of red packets.
package keyqueue

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/clock"
	"redcell/internal/invariant"
)

var (
	// ErrFull is returned by Enqueue when the key's queue holds Depth items or
	// MaxKeys keys are active. The caller sheds the request.
	ErrFull = errors.New("keyqueue: queue full")
	// ErrClosed is returned by Enqueue after Close.
	ErrClosed = errors.New("keyqueue: closed")
)

// Config bounds a Queue.
type Config struct {
	Depth     int           // items one key may hold waiting; beyond it Enqueue fails
	MaxKeys   int           // keys with a live worker at once
	BatchMax  int           // most items handed to one Handle call
	BatchWait time.Duration // how long a worker waits for a batch to fill (0 = take what is there)
	IdleStop  time.Duration // a worker with nothing to do for this long exits
	Clock     clock.Clock   // the batch wait and the idle stop run on it; nil: the system clock
}

// Queue is a set of per-key FIFO workers. Handle is called with batches of one
// key, never concurrently for the same key, in arrival order. Safe for concurrent use.
//
// A key's FIFO is a slice that grows with use, so an idle or barely used key
// costs a few hundred bytes, not Depth slots.
//
// Invariants, asserted where units change hands (internal/invariant: they
// fail only through a bug in this package): every key counts the items
// Enqueue appended (in) and take handed to batches (out), and in = out +
// queued after each; a key holds at most Depth items and at most MaxKeys keys
// are live whenever a worker takes; a key's worker is its only one (the map
// holds its state when it stops); a key stops with in = out.
type Queue[K comparable, T any] struct {
	cfg    Config
	handle func(key K, batch []T)

	batchMax  atomic.Int64 // current BatchMax (SetBatch changes it at run time)
	batchWait atomic.Int64 // current BatchWait in ns

	mu     sync.Mutex // guards keys, every keyState.items, and closed
	keys   map[K]*keyState[T]
	closed bool
	wg     sync.WaitGroup // live workers
}

type keyState[T any] struct {
	items []T           // waiting items, oldest first; guarded by Queue.mu
	wake  chan struct{} // capacity 1: "items may be waiting"
	// in and out count the items Enqueue appended and take moved into
	// batches; guarded by Queue.mu. in − out = len(items).
	in, out int
}

// New returns a queue that calls handle for each batch.
func New[K comparable, T any](cfg Config, handle func(key K, batch []T)) *Queue[K, T] {
	if cfg.Depth < 1 || cfg.MaxKeys < 1 || cfg.BatchMax < 1 || cfg.IdleStop <= 0 {
		panic("keyqueue: Depth, MaxKeys, BatchMax and IdleStop must be > 0")
	}
	cfg.Clock = clock.Or(cfg.Clock)
	q := &Queue[K, T]{cfg: cfg, handle: handle, keys: make(map[K]*keyState[T])}
	q.SetBatch(cfg.BatchMax, cfg.BatchWait)
	return q
}

// SetBatch changes BatchMax and BatchWait for the batches formed from now on.
func (q *Queue[K, T]) SetBatch(max int, wait time.Duration) {
	if max < 1 {
		panic("keyqueue: BatchMax must be > 0")
	}
	q.batchMax.Store(int64(max))
	q.batchWait.Store(int64(wait))
}

// Enqueue appends item to key's FIFO, starting its worker if needed. It never
// blocks. Errors: ErrFull, ErrClosed. It asserts that the key's items are
// then what it counts: in = out + queued.
func (q *Queue[K, T]) Enqueue(key K, item T) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	ks, ok := q.keys[key]
	if !ok {
		if len(q.keys) >= q.cfg.MaxKeys {
			q.mu.Unlock()
			return ErrFull
		}
		ks = &keyState[T]{wake: make(chan struct{}, 1)}
		q.keys[key] = ks
		q.wg.Add(1)
		go q.work(key, ks)
	}
	if len(ks.items) >= q.cfg.Depth {
		q.mu.Unlock()
		return ErrFull
	}
	ks.items = append(ks.items, item)
	ks.in++
	invariant.That(ks.in-ks.out == len(ks.items), "keyqueue: a key must hold the items enqueued and not taken: in = out + queued (Enqueue)")
	q.mu.Unlock()
	signal(ks.wake)
	return nil
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Len returns the number of items waiting for key.
func (q *Queue[K, T]) Len(key K) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ks, ok := q.keys[key]; ok {
		return len(ks.items)
	}
	return 0
}

// Keys returns the number of keys with a live worker.
func (q *Queue[K, T]) Keys() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys)
}

// Close stops new work; the workers finish everything already queued and exit.
// Wait returns when they have.
func (q *Queue[K, T]) Close() {
	q.mu.Lock()
	q.closed = true
	for _, ks := range q.keys {
		signal(ks.wake) // idle workers notice at once
	}
	q.mu.Unlock()
}

// Wait blocks until every worker has exited (after Close, when queues are empty).
func (q *Queue[K, T]) Wait() { q.wg.Wait() }

func (q *Queue[K, T]) work(key K, ks *keyState[T]) {
	defer q.wg.Done()
	idle := q.cfg.Clock.After(q.cfg.IdleStop) // renewed after every batch and every idle stop refused
	var batch []T
	for {
		batch = q.take(ks, batch[:0])
		if len(batch) == 0 {
			if q.stopIfDone(key, ks, false) {
				return
			}
			select {
			case <-ks.wake:
			case <-idle:
				if q.stopIfDone(key, ks, true) {
					return
				}
				idle = q.cfg.Clock.After(q.cfg.IdleStop)
			}
			continue
		}
		if len(batch) < int(q.batchMax.Load()) && q.batchWait.Load() > 0 {
			batch = q.fill(ks, batch)
		}
		q.handle(key, batch)
		clear(batch) // drop references so finished items can be collected
		idle = q.cfg.Clock.After(q.cfg.IdleStop)
	}
}

// take moves up to BatchMax-len(batch) waiting items into batch, oldest
// first. It asserts the bounds before (checkBounds) and after that exactly
// the n items left the key's FIFO for the batch: in = out + queued.
func (q *Queue[K, T]) take(ks *keyState[T], batch []T) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.checkBounds(ks)
	before := len(batch)
	n := max(0, min(int(q.batchMax.Load())-len(batch), len(ks.items)))
	batch = append(batch, ks.items[:n]...)
	rest := copy(ks.items, ks.items[n:])
	clear(ks.items[rest:])
	ks.items = ks.items[:rest]
	if rest == 0 && cap(ks.items) > 64 {
		ks.items = nil // give a burst's memory back
	}
	ks.out += n
	invariant.That(len(batch) == before+n && ks.in-ks.out == len(ks.items),
		"keyqueue: a take must move its items from the key's FIFO to the batch, none lost or doubled: in = out + queued (take)")
	return batch
}

// checkBounds asserts the limits Enqueue keeps (C7: a limit on everything):
// a key holds at most Depth items, at most MaxKeys keys are live. q.mu must
// be held.
func (q *Queue[K, T]) checkBounds(ks *keyState[T]) {
	invariant.That(len(ks.items) <= q.cfg.Depth, "keyqueue: a key holds more than Depth items (Enqueue refuses them)")
	invariant.That(len(q.keys) <= q.cfg.MaxKeys, "keyqueue: more than MaxKeys keys are live (Enqueue refuses them)")
}

// fill waits up to BatchWait for more items to make a fuller batch.
func (q *Queue[K, T]) fill(ks *keyState[T], batch []T) []T {
	done := q.cfg.Clock.After(time.Duration(q.batchWait.Load()))
	for len(batch) < int(q.batchMax.Load()) {
		select {
		case <-ks.wake:
			batch = q.take(ks, batch)
		case <-done:
			return q.take(ks, batch)
		}
	}
	return batch
}

// stopIfDone removes the key's worker when its queue is empty and either it was
// idle or the queue is closed. It reports whether the worker must exit. It
// asserts that the worker is its key's only one (the map holds its state)
// and that every item the key took in went out (in = out).
func (q *Queue[K, T]) stopIfDone(key K, ks *keyState[T], idle bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(ks.items) > 0 || !(idle || q.closed) {
		return false
	}
	invariant.That(q.keys[key] == ks, "keyqueue: one worker per key: a worker stops a key whose state is another's")
	invariant.That(ks.in == ks.out, "keyqueue: a key stops with items enqueued and never handed out (in = out)")
	delete(q.keys, key)
	return true
}
