package cell

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/model"
	"redcell/sharding"
	"redcell/storage/memstore"
)

// noSlots admits every batch at once (no memcached).
type noSlots struct{}

func (noSlots) Acquire(context.Context, string) (func(), error) { return func() {}, nil }
func (noSlots) Stats() (int64, int64)                           { return 0, 0 }
func (noSlots) FallingBack() bool                               { return false }

// BenchmarkOpenBatch runs the packet worker (openBatch) over memstore: a
// batch of 8 opens of one packet per op, a new packet every 100 batches.
func BenchmarkOpenBatch(b *testing.B) {
	for _, strategy := range []string{StrategyBatched, StrategyGrouped} {
		b.Run(strategy, func(b *testing.B) { benchOpenBatch(b, strategy) })
	}
}

func benchOpenBatch(b *testing.B, strategy string) {
	cfg := DefaultConfig()
	cfg.ClusterSecret = "0123456789abcdef0123"
	cfg.OpenStrategy = strategy
	cfg.WarmSchema = false
	cfg.Limits.MaxCount = 1000
	cfg.Limits.MaxAmount = 1 << 40
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg, Stores{Real: memstore.New(nil), Shadow: memstore.New(nil)}, noSlots{}, nil, nil, prometheus.NewRegistry(), log)
	if err != nil {
		b.Fatal(err)
	}
	defer s.writer.groups.Stop()
	ctx := context.Background()
	sp := s.spaces[0]
	sender := "bench-sender"
	sh := sharding.ShardOfAct(sender)
	if _, err := s.writer.depositGrouped(ctx, sp, sh, sender, "dep-1", 1<<40); err != nil {
		b.Fatal(err)
	}
	const per, batches = 8, 100
	var ref model.PacketRef
	jobs := make([]*openJob, per)
	for i := range jobs {
		jobs[i] = &openJob{sp: sp, done: make(chan model.OpenResult, 1)}
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if n%batches == 0 {
			b.StopTimer()
			now := s.clock.Now()
			id := model.NewPacketID(sh, now)
			req := model.SendRequest{Sender: sender, Amount: per * batches * 100, Count: per * batches, Kind: model.KindRandom, OrderNo: fmt.Sprint("r", n)}
			p, _, err := s.writer.sendGrouped(ctx, sp, sh, req, id, now.Add(time.Hour).UnixMilli())
			if err != nil {
				b.Fatal(err)
			}
			if ref, err = model.ParsePacketID(string(p.ID)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		now := s.clock.Now()
		for i, j := range jobs {
			act := fmt.Sprint("u", n, "-", i)
			j.ref, j.req, j.enqueued = ref, model.OpenRequest{ActID: act, Shard: sharding.ShardOfAct(act)}, now
		}
		s.openBatch(queueKey{id: ref.ID}, jobs)
		for _, j := range jobs {
			if r := <-j.done; r.Err != nil {
				b.Fatal(r.Err)
			}
		}
	}
}
