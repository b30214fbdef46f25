package clock

import (
	"context"
	"time"
)

// Every calls fn(pass) each time d has passed on c since the previous call
// ended, until ctx ends; pass counts the calls from 0. fn runs on the caller's
// goroutine, so a pass that takes longer than d delays the next one rather
// than overlapping it (a Ticker keeps a grid instead). The cell's periodic
// work (relay scans, expiry, reconciliation, the audit) runs on it.
func Every(ctx context.Context, c Clock, d time.Duration, fn func(pass int)) {
	c = Or(c)
	for pass := 0; ; pass++ {
		select {
		case <-ctx.Done():
			return
		case <-c.After(d):
		}
		if ctx.Err() != nil {
			return
		}
		fn(pass)
	}
}
