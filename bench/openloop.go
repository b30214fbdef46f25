package bench

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Open-loop mode: requests start at their scheduled time whether or not
// earlier ones finished, so a slow cluster cannot slow the arrivals down and
// hide its queueing (coordinated omission); latency counts from the scheduled
// time. What bounds the client is the number in flight: a request due while
// the bound is reached is not sent and is counted as CLIENT_DROPPED.

// dispatcher runs functions in goroutines, at most max at once. It is safe for
// concurrent use.
type dispatcher struct {
	slots chan struct{} // one token per function running
	wg    sync.WaitGroup
}

func newDispatcher(max int) *dispatcher {
	if max < 1 {
		panic("bench: dispatcher needs max >= 1")
	}
	return &dispatcher{slots: make(chan struct{}, max)}
}

// start runs f in a new goroutine if fewer than max are running, and reports
// whether it did. It never waits.
func (d *dispatcher) start(f func()) bool {
	select {
	case d.slots <- struct{}{}:
	default:
		return false
	}
	d.wg.Go(func() {
		defer func() { <-d.slots }()
		f()
	})
	return true
}

// wait returns when every started function has returned.
func (d *dispatcher) wait() { d.wg.Wait() }

// scheduledAt is the time of arrival k (from 0) at rate per second from t0.
// Computed from k, not by adding intervals, so rounding never drifts.
func scheduledAt(t0 time.Time, rate float64, k int64) time.Time {
	return t0.Add(time.Duration(float64(k) / rate * float64(time.Second)))
}

// sleepUntil sleeps until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	if d := time.Until(t); d > 0 {
		return sleepCtx(ctx, d)
	}
	return ctx.Err() == nil
}

// hotOpenLoop opens the hot packet at cfg.Rate per second, each open by a
// fresh account, until load ends.
func (r *loadRun) hotOpenLoop(ctx, load context.Context) {
	d := newDispatcher(r.cfg.inFlight())
	t0 := time.Now()
	for k := int64(0); k < opensMax; k++ {
		due := scheduledAt(t0, float64(r.cfg.Rate), k)
		if !sleepUntil(load, due) {
			break
		}
		t := r.hotTask(k, due)
		if d.start(func() { r.open(ctx, t.due, t) }) {
			r.started.Add(1)
		} else {
			r.rec[opOpen].recordDropped()
		}
	}
	r.countDue(t0, float64(r.cfg.Rate), opensMax)
	d.wait()
}

// groupOpenLoop sends festival or cold packets on a schedule chosen so that
// their members' opens arrive at about cfg.Rate per second, and starts each
// open at its due time, until load ends. Sends and opens each have their own
// in-flight bound.
func (r *loadRun) groupOpenLoop(ctx, load context.Context) {
	opens, sends := newDispatcher(r.cfg.inFlight()), newDispatcher(r.cfg.inFlight())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			t, ok := r.queue.pop(load)
			if !ok {
				return
			}
			if !opens.start(func() { r.open(ctx, t.due, t) }) {
				r.rec[opOpen].recordDropped()
			}
		}
	})
	sendRate := float64(r.cfg.Rate) / r.cfg.opensPerPacket()
	rnd := rand.New(rand.NewPCG(r.seed, 0))
	sizes := newGroupSizes(rnd)
	t0 := time.Now()
	for k := int64(0); k < packetsMax; k++ {
		due := scheduledAt(t0, sendRate, k)
		if !sleepUntil(load, due) {
			break
		}
		n := r.next.Add(1)
		pl := r.cfg.plan(rnd, sizes)
		delays := rand.New(rand.NewPCG(r.seed, uint64(n)<<1|1))
		if sends.start(func() { r.sendPlanned(ctx, due, n, pl, delays) }) {
			r.started.Add(1)
		} else {
			r.rec[opSend].recordDropped()
		}
	}
	r.countDue(t0, sendRate, packetsMax)
	sends.wait()
	wg.Wait()
	opens.wait()
}

// countDue records how many of a schedule's arrivals (at rate per second from
// t0, at most max) fell due before now, the end of the load: Report.Due.
func (r *loadRun) countDue(t0 time.Time, rate float64, max int64) {
	r.due.Store(min(int64(time.Since(t0).Seconds()*rate)+1, max))
}

// closedLoopN runs workers goroutines that call do(k) for k = 0, 1, ...
// back to back (next numbers them) until load ends or k reaches n.
func closedLoopN(load context.Context, workers int, n int64, next *atomic.Int64, do func(k int64)) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for load.Err() == nil {
				k := next.Add(1) - 1
				if k >= n {
					return
				}
				do(k)
			}
		})
	}
	wg.Wait()
}

// openLoopN starts do(at, k) at its scheduled time at rate per second
// until load ends or k reaches n, inFlight at most at once (one due beyond
// it calls dropped), and answers how many fell due and how many started.
func openLoopN(load context.Context, inFlight, rate int, n int64, do func(at time.Time, k int64), dropped func()) (due, started int64) {
	d := newDispatcher(inFlight)
	t0 := time.Now()
	for k := int64(0); k < n; k++ {
		at := scheduledAt(t0, float64(rate), k)
		if !sleepUntil(load, at) {
			break
		}
		if d.start(func() { do(at, k) }) {
			started++
		} else {
			dropped()
		}
	}
	d.wait()
	return min(int64(time.Since(t0).Seconds()*float64(rate))+1, n), started
}
