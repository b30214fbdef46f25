package groupcommit

import (
	"context"
	"testing"
	"time"

	"redcell/storage"
)

// BenchmarkSubmit: parallel Submits of one-request ops to one lane whose
// commit does nothing, so the time is the committer's own per op: queueing,
// forming groups of up to Max, answering.
func BenchmarkSubmit(b *testing.B) {
	c := New(Config{Max: 64, QueueMax: 1 << 20, CommitTimeout: time.Second,
		Commit: func(context.Context, Lane, []storage.MoneyOp) error { return nil }})
	defer c.Stop()
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Submit(ctx, lane0, &storage.DepositOp{Amount: 1}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
