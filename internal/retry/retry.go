// Package retry is the one retry loop of redcell: bounded in attempts, with a
// backoff that doubles up to a cap, and never sleeping past its context.
package retry

import (
	"context"
	"errors"
	"time"

	"redcell/internal/clock"
)

// Policy bounds a retry loop. The zero value makes one attempt.
type Policy struct {
	Attempts int           // at most this many calls of fn (>= 1; 0 means 1)
	Backoff  time.Duration // wait before the second attempt; doubles after each failure
	Max      time.Duration // the longest wait (0: no cap)
	// Retryable says whether an error is worth another attempt; nil retries
	// every error. An error it refuses ends the loop at once.
	Retryable func(error) bool
	Clock     clock.Clock // nil: the system clock
}

// ErrStopped wraps the last error when ctx ends the loop between attempts.
var ErrStopped = errors.New("retry: context ended between attempts")

// Do calls fn until it returns nil, an error Retryable refuses, or the
// attempts are used up, waiting Backoff, 2*Backoff, ... (capped at Max)
// between calls. It returns fn's last error, or, when ctx ends during a wait,
// that error joined with ErrStopped and ctx's error. fn gets the attempt
// number, from 0.
func Do(ctx context.Context, p Policy, fn func(attempt int) error) error {
	attempts := max(p.Attempts, 1)
	c := clock.Or(p.Clock)
	wait := p.Backoff
	var err error
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ErrStopped, ctx.Err())
			case <-c.After(wait):
			}
			wait *= 2
			if p.Max > 0 && wait > p.Max {
				wait = p.Max
			}
		}
		if err = fn(attempt); err == nil {
			return nil
		}
		if p.Retryable != nil && !p.Retryable(err) {
			return err
		}
	}
	return err
}
