package cell

import (
	"log/slog"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/cell/keyqueue"
	"redcell/model"
)

// openStrategy is how opens run now: the strategy and the batch settings of
// the packet queues. The admin port reads and switches it. Safe for
// concurrent use.
type openStrategy struct {
	cur   atomic.Pointer[api.StrategySetting]
	queue *keyqueue.Queue[queueKey, *openJob]
	log   *slog.Logger
}

// Strategy returns how opens run now.
func (o *openStrategy) Strategy() api.StrategySetting { return *o.cur.Load() }

// SetStrategy switches how opens run, for opens that start from now on: the
// strategy (naive, serial, batched), the batch size and the batch wait. Opens
// already queued run under the new batch settings. Errors: ErrInvalidArgument.
func (o *openStrategy) SetStrategy(st api.StrategySetting) error {
	switch st.Strategy {
	case StrategyNaive, StrategySerial, StrategyBatched:
	default:
		return model.Invalidf("strategy must be naive, serial or batched")
	}
	if st.BatchMax < 1 || st.BatchMax > 4096 || st.BatchWaitMS < 0 || st.BatchWaitMS > 1000 {
		return model.Invalidf("batch_max must be 1..4096 and batch_wait_ms 0..1000")
	}
	batch, wait := st.BatchMax, time.Duration(st.BatchWaitMS)*time.Millisecond
	if st.Strategy != StrategyBatched {
		batch, wait = 1, 0 // serial: one open per transaction; naive bypasses the queue
	}
	o.queue.SetBatch(batch, wait)
	o.cur.Store(&st)
	o.log.Info("open strategy set", "strategy", st.Strategy, "batch_max", st.BatchMax, "batch_wait_ms", st.BatchWaitMS)
	return nil
}
