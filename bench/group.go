package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// The festival and cold workloads: senders send packets to groups of users,
// and each member's open is due some time after the send (workload.go).

// groupClosedLoop: Senders workers send packets while the Openers workers keep
// up with the members' opens (each due some time after its send).
func (r *loadRun) groupClosedLoop(ctx, load context.Context) {
	var wg sync.WaitGroup
	for i := range r.cfg.Senders {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(r.seed, uint64(i)<<1)) // even streams; a packet's delays use odd ones
			sizes := newGroupSizes(rnd)
			for load.Err() == nil {
				if r.queue.lag(time.Now()) > lagMax || r.queue.len() >= queueMax {
					if !sleepCtx(load, idleWait) {
						return
					}
					continue
				}
				if !r.sendGroup(ctx, time.Time{}, rnd, sizes) && !sleepCtx(load, idleWait) {
					return // a failed send: back off a little so a failing cluster is not hammered
				}
			}
		})
	}
	for range r.cfg.Openers {
		wg.Go(func() {
			for {
				t, ok := r.queue.pop(load)
				if !ok {
					return
				}
				r.open(ctx, time.Time{}, t)
			}
		})
	}
	wg.Wait()
}

// sendGroup sends the next packet of a festival or cold run and queues its
// members' opens. It reports whether the send succeeded.
func (r *loadRun) sendGroup(ctx context.Context, start time.Time, rnd *rand.Rand, sizes groupSizes) bool {
	n := r.next.Add(1)
	if n > packetsMax {
		return false
	}
	return r.sendPlanned(ctx, start, n, r.cfg.plan(rnd, sizes), rand.New(rand.NewPCG(r.seed, uint64(n)<<1|1)))
}

// sendPlanned sends packet n as planned; rnd (owned by the caller) draws the
// members' delays.
func (r *loadRun) sendPlanned(ctx context.Context, start time.Time, n int64, pl packetPlan, rnd *rand.Rand) bool {
	s := r.senders[int(n)%len(r.senders)]
	p, res := r.send(ctx, start, s, n, pl.amount, pl.count)
	if res.code != "" {
		return false
	}
	p.hot = pl.members >= hotGroupMin
	sent := time.Now()
	tasks := make([]openTask, pl.members)
	for m := range tasks {
		act := fmt.Sprintf("%s-u%d", r.cfg.RunID, (pl.firstUser+m)%r.cfg.Users)
		tasks[m] = openTask{due: sent.Add(openDelay(rnd, pl.window)), pkt: p, act: act, sampled: r.book.sample(act)}
	}
	if d := r.queue.push(tasks); d > 0 { // the queue is full: counted like an open-loop drop
		for range d {
			r.rec[opOpen].recordDropped()
		}
	}
	return true
}
