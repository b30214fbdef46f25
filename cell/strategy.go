package cell

import (
	"log/slog"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/cell/keyqueue"
	"redcell/model"
)

// groupLimits is the part of the group committer the strategy switches
// (groupcommit.Committer).
type groupLimits interface {
	SetLimits(max int, wait time.Duration)
}

// openStrategy is how opens run now: the strategy, the batch settings of the
// packet queues and the group commit's limits. The admin port reads and
// switches it. Safe for concurrent use.
type openStrategy struct {
	cur    atomic.Pointer[api.StrategySetting]
	queue  *keyqueue.Queue[queueKey, *openJob]
	groups groupLimits
	log    *slog.Logger
}

// Strategy returns how opens run now.
func (o *openStrategy) Strategy() api.StrategySetting { return *o.cur.Load() }

// grouped reports whether opens go through the group committer now. The
// strategy decides opens only: every other write of the cell (sends,
// deposits, withdrawals, credits, refunds, reward issues and bookings,
// coupon accepts)
// goes through the group committer whatever it is.
func (o *openStrategy) grouped() bool { return o.cur.Load().Strategy == StrategyGrouped }

// SetStrategy switches how opens run, for opens that start from now on: the
// strategy (naive, serial, batched, grouped), the batch size and wait of the
// packet queues (batched and grouped) and the group commit's size and wait
// bound (grouped; every other write goes through the committer whatever
// the strategy, under these limits). Opens already queued run under the
// new batch settings. Errors: ErrInvalidArgument.
func (o *openStrategy) SetStrategy(st api.StrategySetting) error {
	switch st.Strategy {
	case StrategyNaive, StrategySerial, StrategyBatched, StrategyGrouped:
	default:
		return model.Invalidf("strategy must be naive, serial, batched or grouped")
	}
	if st.BatchMax < 1 || st.BatchMax > 4096 || st.BatchWaitMS < 0 || st.BatchWaitMS > 1000 {
		return model.Invalidf("batch_max must be 1..4096 and batch_wait_ms 0..1000")
	}
	if st.GroupMax < 1 || st.GroupMax > 4096 || st.GroupWaitMS < 0 || st.GroupWaitMS > 1000 {
		return model.Invalidf("group_max must be 1..4096 and group_wait_ms 0..1000")
	}
	batch, wait := st.BatchMax, time.Duration(st.BatchWaitMS)*time.Millisecond
	if st.Strategy != StrategyBatched && st.Strategy != StrategyGrouped {
		batch, wait = 1, 0 // serial: one open per transaction; naive bypasses the queue
	}
	o.queue.SetBatch(batch, wait)
	o.groups.SetLimits(st.GroupMax, time.Duration(st.GroupWaitMS)*time.Millisecond)
	o.cur.Store(&st)
	o.log.Info("open strategy set", "strategy", st.Strategy, "batch_max", st.BatchMax, "batch_wait_ms", st.BatchWaitMS,
		"group_max", st.GroupMax, "group_wait_ms", st.GroupWaitMS)
	return nil
}
