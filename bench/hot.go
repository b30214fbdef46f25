package bench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// hotTask is open number k of the hot packet (roundrobin: of packet k mod
// Packets), by a fresh account.
func (r *loadRun) hotTask(k int64, due time.Time) openTask {
	t := openTask{due: due, pkt: r.rr[k%int64(len(r.rr))], act: fmt.Sprintf("%s-h%d", r.cfg.RunID, k)}
	t.sampled = k < balanceSampleMax && r.book.sample(t.act) // the first accounts: credited first
	return t
}

// hotClosedLoop: Openers workers open the hot packet back to back.
func (r *loadRun) hotClosedLoop(ctx, load context.Context) {
	var wg sync.WaitGroup
	for range r.cfg.Openers {
		wg.Go(func() {
			for load.Err() == nil {
				k := r.next.Add(1) - 1
				if k >= opensMax {
					return
				}
				r.open(ctx, time.Time{}, r.hotTask(k, time.Time{}))
			}
		})
	}
	wg.Wait()
}
