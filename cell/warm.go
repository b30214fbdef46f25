package cell

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/storage"
)

// warmer creates the shard tables and today's and tomorrow's day tables
// before they are needed (Config.WarmSchema), then again each hour so
// tomorrow's always exist.
type warmer struct {
	store   storage.Schema
	shards  []model.ShardID
	retry   time.Duration // wait after a failed pass (Config.WarmRetry)
	clock   clock.Clock
	log     *slog.Logger
	failing *incident.Tracker
	ready   atomic.Bool // a pass has gone through (/healthz schema_ready)
}

// run warms the schema until ctx ends: a pass, then the next one an hour
// later, or WarmRetry later after a pass that failed (the database down, or
// its breaker open). The wait is pacing, not a retry of one call: each pass
// is whole, and tables are made IF NOT EXISTS.
func (w *warmer) run(ctx context.Context) {
	for {
		start := w.clock.Now()
		days := []int{start.UTC().Day(), start.UTC().Add(24 * time.Hour).Day()}
		last := start
		err := w.store.EnsureDays(ctx, w.shards, days, 4, func(done, total int) {
			if now := w.clock.Now(); now.Sub(last) > 5*time.Second || done == total {
				last = now
				w.log.Info("creating day tables", "done", done, "shards", total, "days", days)
			}
		})
		next := time.Hour
		if err != nil && ctx.Err() == nil {
			w.failing.Fail(err, "retry_in", w.retry.String())
			next = w.retry
		} else if err == nil {
			w.failing.OK()
			w.ready.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-w.clock.After(next):
		}
	}
}
