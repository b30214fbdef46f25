package bench

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
)

// lagSampler picks the sampled issues and polls them until booked. A nil
// *lagSampler samples nothing. Safe for concurrent use.
type lagSampler struct {
	c      *client
	cfg    RewardsConfig
	loadAt time.Time
	slot   time.Duration // the load is cut into LagSamples slots; the first issue of each is sampled
	taken  []atomic.Bool

	mu      sync.Mutex // guards samples and tick
	samples []lagSample
	tick    int64 // polls so far
}

// lagSample is one sampled reward.
type lagSample struct {
	act, orderNo     string
	createdMS        int64
	seenMS, bookedMS int64 // 0 until seen booked: when (client clock) and its booked_ms
	askedAt          int64 // the tick that last asked about it, or the tick it was added at
	lastAskMS        int64 // when it was last asked about (client clock), or issued
	maxGapMS         int64 // the longest wait between two asks while it was pending
	booked, lost     bool  // lost: the person's reward is another (a reused run ID)
}

func newLagSampler(c *client, cfg RewardsConfig, loadAt time.Time) *lagSampler {
	return &lagSampler{c: c, cfg: cfg, loadAt: loadAt, slot: max(cfg.Duration/time.Duration(cfg.LagSamples), time.Millisecond),
		taken: make([]atomic.Bool, cfg.LagSamples)}
}

// take returns the slot an issue starting at now samples, or -1.
func (l *lagSampler) take(now time.Time) int {
	if l == nil {
		return -1
	}
	s := int(now.Sub(l.loadAt) / l.slot)
	if s < 0 || s >= len(l.taken) || !l.taken[s].CompareAndSwap(false, true) {
		return -1
	}
	return s
}

// add records a sampled issue's answer.
func (l *lagSampler) add(act string, out api.RewardResponse) {
	l.mu.Lock()
	// A new sample queues behind the ones waiting since earlier ticks, so
	// the polls go round every pending sample in turn.
	l.samples = append(l.samples, lagSample{act: act, orderNo: out.OrderNo, createdMS: out.CreatedMS,
		askedAt: l.tick, lastAskMS: time.Now().UnixMilli()})
	l.mu.Unlock()
}

// poll asks, every lagPollInterval, about every sample not seen booked yet
// (lagPollers at a time) until stop is called; stop waits for the poller
// to end. A nil sampler polls nothing.
func (l *lagSampler) poll(ctx context.Context) (stop func()) {
	if l == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(lagPollInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				return
			case <-t.C:
				l.pollOnce()
			}
		}
	})
	return func() { close(quit); wg.Wait() }
}

// pollOnce asks about the lagPollsPerTick samples not seen booked that
// were asked about longest ago (never asked first, then in issue order).
func (l *lagSampler) pollOnce() {
	l.mu.Lock()
	l.tick++
	var todo []int
	for i, s := range l.samples {
		if !s.booked && !s.lost {
			todo = append(todo, i)
		}
	}
	slices.SortStableFunc(todo, func(a, b int) int { return cmp.Compare(l.samples[a].askedAt, l.samples[b].askedAt) })
	todo = todo[:min(len(todo), lagPollsPerTick)]
	for _, i := range todo {
		l.samples[i].askedAt = l.tick
	}
	l.mu.Unlock()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(lagPollers, len(todo)) {
		wg.Go(func() {
			for j := int(next.Add(1) - 1); j < len(todo); j = int(next.Add(1) - 1) {
				l.check(todo[j])
			}
		})
	}
	wg.Wait()
}

// check reads sample i's person's rewards (it has this one only).
func (l *lagSampler) check(i int) {
	l.mu.Lock()
	s := l.samples[i]
	l.mu.Unlock()
	var out api.RewardsResponse
	path := api.AccountSubPath(s.act, "rewards") + "?parent_activity_id=" + l.cfg.Parent + "&limit=1"
	if res := l.c.call(http.MethodGet, path, nil, &out); res.code != "" || len(out.Rewards) != 1 {
		return // asked again at the next poll
	}
	now := time.Now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &l.samples[i]
	p.maxGapMS, p.lastAskMS = max(p.maxGapMS, now-p.lastAskMS), now
	switch it := out.Rewards[0]; {
	case it.OrderNo != p.orderNo:
		p.lost = true // not this run's reward: a reused run ID; counted as not booked
	case it.Status == "booked":
		p.booked, p.seenMS, p.bookedMS = true, now, it.BookedMS
	}
}

// wait polls on after the load until every sample is booked or LagWait
// passed, stops the poller and summarizes.
func (l *lagSampler) wait(ctx context.Context, stop func(), loadEnd time.Time) BookingLag {
	deadline := loadEnd.Add(l.cfg.LagWait)
	for ctx.Err() == nil && time.Now().Before(deadline) && !l.allBooked() {
		sleepCtx(ctx, lagPollInterval/2)
	}
	stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := BookingLag{Sampled: len(l.samples), PollIntervalMS: lagPollInterval.Milliseconds(),
		WaitedMS: time.Since(loadEnd).Milliseconds()}
	var seen, server []int64
	for _, s := range l.samples {
		out.MaxAskGapMS = max(out.MaxAskGapMS, s.maxGapMS)
		if s.booked {
			out.Booked++
			seen = append(seen, max(s.seenMS-s.createdMS, 0))
			server = append(server, max(s.bookedMS-s.createdMS, 0))
		}
	}
	out.Seen, out.Server = percentilesMS(seen), percentilesMS(server)
	return out
}

func (l *lagSampler) allBooked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.samples {
		if !s.booked && !s.lost {
			return false
		}
	}
	return true
}

// percentilesMS summarizes a few hundred lags in ms (nearest rank).
func percentilesMS(v []int64) LatencyMS {
	if len(v) == 0 {
		return LatencyMS{}
	}
	slices.Sort(v)
	at := func(q float64) float64 {
		i := int(q*float64(len(v))+0.999999) - 1
		return float64(v[min(max(i, 0), len(v)-1)])
	}
	return LatencyMS{P50: at(0.50), P90: at(0.90), P99: at(0.99), P999: at(0.999), Max: float64(v[len(v)-1])}
}

// measureReads runs the no-op, then the issued-so-far read, closed-loop.
func measureReads(ctx context.Context, c *client, cfg RewardsConfig) ReadsReport {
	out := ReadsReport{Concurrency: cfg.Concurrency, DurationMS: cfg.ReadsDuration.Milliseconds()}
	var perSec [2]float64
	for i, read := range []func(k int64) result{
		func(k int64) result {
			var out api.NoopResponse
			return c.call(http.MethodPost, api.NoopPathOf(cfg.RunID+"-n"+strconv.FormatInt(k%1000, 10)), nil, &out)
		},
		func(int64) result {
			var out api.IssuedResponse
			return c.call(http.MethodGet, api.IssuedPath(cfg.Parent), nil, &out)
		},
	} {
		rec := newOpRecorder()
		start := time.Now()
		load, cancel := context.WithTimeout(ctx, cfg.ReadsDuration)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range cfg.Concurrency {
			wg.Go(func() {
				for k := next.Add(1) - 1; load.Err() == nil && k < readsMax; k = next.Add(1) - 1 {
					rec.record(read(k), false)
				}
			})
		}
		wg.Wait()
		cancel()
		st := rec.stats()
		perSec[i] = float64(st.OK) / time.Since(start).Seconds()
		if i == 0 {
			out.Noop = st
		} else {
			out.Issued = st
		}
	}
	out.NoopPerSec, out.IssuedPerSec = perSec[0], perSec[1]
	out.Ratio = ratio(out.IssuedPerSec, out.NoopPerSec)
	return out
}
