// Package keyqueue runs one FIFO worker per active key: work for one key runs in
// arrival order, one batch at a time, while different keys run in parallel. It
// knows nothing of red packets.
package keyqueue

import (
	"errors"
	"sync"
	"time"
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
}

// Queue is a set of per-key FIFO workers. Handle is called with batches of one
// key, never concurrently for the same key, in arrival order. Safe for concurrent use.
type Queue[K comparable, T any] struct {
	cfg    Config
	handle func(key K, batch []T)

	mu     sync.Mutex   // guards keys and closed
	keys   map[K]chan T // one buffered FIFO per key with a live worker
	closed bool
	wg     sync.WaitGroup // live workers
}

// New returns a queue that calls handle for each batch.
func New[K comparable, T any](cfg Config, handle func(key K, batch []T)) *Queue[K, T] {
	if cfg.Depth < 1 || cfg.MaxKeys < 1 || cfg.BatchMax < 1 || cfg.IdleStop <= 0 {
		panic("keyqueue: Depth, MaxKeys, BatchMax and IdleStop must be > 0")
	}
	return &Queue[K, T]{cfg: cfg, handle: handle, keys: make(map[K]chan T)}
}

// Enqueue appends item to key's FIFO, starting its worker if needed. It never
// blocks. Errors: ErrFull, ErrClosed.
func (q *Queue[K, T]) Enqueue(key K, item T) error {
	q.mu.Lock()
	defer q.mu.Unlock() // the send happens under mu so a worker cannot exit in between
	if q.closed {
		return ErrClosed
	}
	ch, ok := q.keys[key]
	if !ok {
		if len(q.keys) >= q.cfg.MaxKeys {
			return ErrFull
		}
		ch = make(chan T, q.cfg.Depth)
		q.keys[key] = ch
		q.wg.Add(1)
		go q.work(key, ch)
	}
	select {
	case ch <- item:
		return nil
	default:
		return ErrFull
	}
}

// Len returns the number of items waiting for key.
func (q *Queue[K, T]) Len(key K) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys[key])
}

// Keys returns the number of keys with a live worker.
func (q *Queue[K, T]) Keys() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys)
}

// Close stops new work; the workers finish everything already queued. Wait
// returns when they have.
func (q *Queue[K, T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// Wait blocks until every worker has exited (after Close, when queues are empty).
func (q *Queue[K, T]) Wait() { q.wg.Wait() }

func (q *Queue[K, T]) work(key K, ch chan T) {
	defer q.wg.Done()
	idle := time.NewTimer(q.cfg.IdleStop)
	defer idle.Stop()
	batch := make([]T, 0, q.cfg.BatchMax)
	for {
		select {
		case item := <-ch:
			batch = q.fill(append(batch[:0], item), ch)
			q.handle(key, batch)
			clear(batch) // drop references so finished items can be collected
			if !idle.Stop() {
				select {
				case <-idle.C:
				default:
				}
			}
			idle.Reset(q.cfg.IdleStop)
			if q.stopIfDone(key, ch, false) {
				return
			}
		case <-idle.C:
			if q.stopIfDone(key, ch, true) {
				return
			}
			idle.Reset(q.cfg.IdleStop)
		}
	}
}

// fill drains what is queued for the key into batch, up to BatchMax, waiting up
// to BatchWait for more.
func (q *Queue[K, T]) fill(batch []T, ch chan T) []T {
	var deadline <-chan time.Time
	for len(batch) < q.cfg.BatchMax {
		select {
		case item := <-ch:
			batch = append(batch, item)
			continue
		default:
		}
		if q.cfg.BatchWait <= 0 {
			break
		}
		if deadline == nil {
			t := time.NewTimer(q.cfg.BatchWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case item := <-ch:
			batch = append(batch, item)
			continue
		case <-deadline:
		}
		break
	}
	return batch
}

// stopIfDone removes the key's worker when its queue is empty and either it was
// idle or the queue is closed. It reports whether the worker must exit.
func (q *Queue[K, T]) stopIfDone(key K, ch chan T, idle bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(ch) > 0 || !(idle || q.closed) {
		return false
	}
	delete(q.keys, key)
	return true
}
