package couponq

// Layer 1, the decider: its gatherer takes chunks of layer 1's queue, its
// workers decide each request against the batch's rules and pass those
// allowed into layer 2's queue.

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// decider is the engine's second role, layer 1: the batch open at the
// request's accept, the risk caps, the person's holding. It owns layer 1's
// queue and the risk counters; its goroutines are gather and run; decide
// (a green request) is safe for concurrent use.
type decider struct {
	layer                               // limit: Config.Layer1, gatherFor: Config.Gather[0]
	in    *handoff[model.CouponRequest] // layer 1's queue: the feeder's takes and the accepts queued at once
	out   *handoff[queued]              // layer 2's queue (the merger's): what passes
	risk  riskCounters
}

// layer is what the decider and the merger are each given: the feeder's
// books, the engine's store, catalog, clock, log, observer and counts, and
// the layer's own limiter and gathering wait. Set by New, read only.
type layer struct {
	books     books // the feeder: requests parked, done or released
	store     Store
	catalog   func() *couponbatch.Catalog // never nil (catalogOf)
	limit     Limiter                     // the layer's: one token per request
	gatherFor time.Duration               // the layer's Config.Gather
	clock     clock.Clock
	log       *slog.Logger
	observe   Observer
	stats     *Stats
}

// layerOf is the layer of index i (0: layer 1, 1: layer 2) of cfg.
func layerOf(cfg Config, i int, clk clock.Clock, b books, catalog func() *couponbatch.Catalog, stats *Stats) layer {
	limit := cfg.Layer1
	if i == 1 {
		limit = cfg.Layer2
	}
	return layer{books: b, store: cfg.Store, catalog: catalog, limit: limit, gatherFor: cfg.Gather[i], clock: clk, log: cfg.Log,
		observe: cfg.Observe, stats: stats}
}

// gather drains layer 1's queue at layer 1's rate: one token per
// request, what is queued taken as one chunk (up to decideMax) and handed
// to a free decider (run). One gatherer, so that queued requests stay
// together however many deciders wait: while every decider is busy, the
// next chunk grows in the queue, and a decision's one read of holdings
// covers more requests the busier the cell is.
func (d *decider) gather(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		first, ok := d.in.first(ctx, d.limit) // with the rest of a take the feeder is queuing
		if !ok {
			return
		}
		rs := []model.CouponRequest{first}
		until := gatherUntil(d.clock, d.gatherFor)
	more:
		for len(rs) < decideMax && d.limit.Allow() {
			select {
			case r := <-d.in.ch:
				rs = append(rs, r)
				continue
			default:
			}
			if until == nil {
				break more
			}
			select {
			case r := <-d.in.ch:
				rs = append(rs, r)
			case <-until:
				break more
			case <-ctx.Done():
				break more
			}
		}
		if !handOver(ctx, out, rs, d.books) {
			return
		}
	}
}

// gatherUntil is when a layer's gatherer that got its first request stops
// waiting for more: w (its Config.Gather) after now (nil, never, for none:
// it takes what is queued at once). A chunk that fills, or a token its
// limiter refuses, ends the wait before.
func gatherUntil(clk clock.Clock, w time.Duration) <-chan time.Time {
	if w > 0 {
		return clk.After(w)
	}
	return nil
}

// handOver gives a chunk to a free worker of out or, when ctx ends first,
// releases it (back to accepted, off b); false when ctx ended.
func handOver(ctx context.Context, out chan<- []model.CouponRequest, rs []model.CouponRequest, b books) bool {
	select {
	case out <- rs:
		return true
	case <-ctx.Done():
		for _, r := range rs {
			b.done(r)
		}
		b.release(rs)
		return false
	}
}

// next waits for a chunk a gatherer hands a worker; false when ctx ended
// first.
func next(ctx context.Context, in <-chan []model.CouponRequest) ([]model.CouponRequest, bool) {
	select {
	case <-ctx.Done():
		return nil, false
	case rs := <-in:
		return rs, true
	}
}

// run decides the chunks gather hands it, each together (one read of
// the persons' holdings, one write per refusal reason), and queues what
// passes for layer 2.
func (d *decider) run(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		rs, ok := next(ctx, in)
		if !ok {
			return
		}
		now := d.clock.Now()
		for _, r := range rs {
			if r.TakenMS > 0 {
				d.observe.Waited(1, now.Sub(time.UnixMilli(r.TakenMS)))
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		pass, err := d.decideMany(dctx, rs, true)
		cancel()
		if err != nil {
			// Nothing decided is lost: the requests are taken again after a
			// pause.
			d.log.Warn("coupons: decision failed; the requests are taken again", "requests", len(rs), "err", err)
			d.books.park(rs, d.clock.Now().Add(backoffFor), true)
		}
		passed := map[string]bool{}
		for _, r := range pass {
			passed[key(r)] = true
		}
		for _, r := range rs {
			if !passed[key(r)] && !d.books.isParked(r) {
				d.books.done(r)
			}
		}
		if !d.queue2(ctx, pass) {
			return
		}
	}
}

// queue2 puts a decision's passed requests into layer 2's queue, as one
// run while there is room (the merger's gatherer takes them together), then waiting for
// room; when ctx ends first, the rest are released. False when ctx ended.
func (d *decider) queue2(ctx context.Context, pass []model.CouponRequest) bool {
	i := 0
	d.out.run.Lock()
	now := d.clock.Now()
room:
	for ; i < len(pass); i++ {
		select {
		case d.out.ch <- queued{r: pass[i], at: now}:
		default:
			break room
		}
	}
	d.out.run.Unlock()
	for ; i < len(pass); i++ {
		select {
		case d.out.ch <- queued{r: pass[i], at: d.clock.Now()}:
		case <-ctx.Done():
			d.books.release(pass[i:])
			for _, r := range pass[i:] {
				d.books.done(r)
			}
			return false
		}
	}
	return true
}

// decide is layer 1 for one request (the green channel).
func (d *decider) decide(ctx context.Context, r model.CouponRequest) (pass bool, err error) {
	ps, err := d.decideMany(ctx, []model.CouponRequest{r}, false)
	return len(ps) == 1, err
}

// decideMany is layer 1 for requests taken together: the batch open at
// each one's accept time, the risk caps, and the person's holding (one
// read for all). Refusals are written (final), one write per reason; the
// requests that pass are returned, and a person's requests that cannot all
// pass together are released to be decided after. On an error nothing is
// refused.
func (d *decider) decideMany(ctx context.Context, rs []model.CouponRequest, owned bool) (pass []model.CouponRequest, err error) {
	cat := d.catalog()
	refuse := map[model.CouponReason][]model.CouponRequest{}
	var asks []model.CouponRequest
	rules := map[string]model.CouponRule{}
	now := d.clock.Now()
	for _, r := range rs {
		// The window is the request's: accepted while the batch issued, it
		// is decided even when a backlog brings it here after the end.
		b, err := cat.Open(r.Batch, time.UnixMilli(r.AcceptedMS))
		switch {
		case err != nil:
			refuse[model.ReasonBatchClosed] = append(refuse[model.ReasonBatchClosed], r)
		case !d.risk.allow(r, cat.Risk, now):
			refuse[model.ReasonRisk] = append(refuse[model.ReasonRisk], r)
		default:
			rules[r.Batch] = ruleOf(b)
			asks = append(asks, r)
		}
	}
	if len(asks) > 0 {
		hs, err := storage.HoldingsOf(ctx, d.store, asks)
		if err != nil {
			return nil, err
		}
		// A person's second request in one decision is checked against the
		// holding with the first one's coupon in it too: if the two cannot
		// both be issued, the second waits (released) until the first is
		// decided, rather than taking a unit of stock layer 2 would give
		// back, or being refused for a coupon the first may not get.
		tentative := map[string]model.CouponHolding{}
		var later []model.CouponRequest
		for _, r := range asks {
			rule := rules[r.Batch]
			if reason := model.DecideCoupon(rule, hs[r.ActID]); reason != "" {
				refuse[reason] = append(refuse[reason], r)
				continue
			}
			t, seen := tentative[r.ActID]
			if !seen {
				t = hs[r.ActID]
			}
			if seen && model.DecideCoupon(rule, t) != "" {
				later = append(later, r)
				continue
			}
			tentative[r.ActID] = t.Plus(rule)
			pass = append(pass, r)
		}
		d.books.park(later, now, owned) // taken again at the feeder's next tick
	}
	for reason, group := range refuse {
		if err := storage.RefuseCoupons(ctx, d.store, group, reason); err != nil {
			return nil, err
		}
		d.stats.Refused.Add(int64(len(group)))
		for _, r := range group {
			d.observe.Final(r, false, reason, now)
		}
	}
	return pass, nil
}

// riskCounters are the built-in risk check's per-minute counts, per cell:
// a person's requests all reach the person's cell (routed by act_id), a
// device's or an IP's only when they ask for one person.
type riskCounters struct {
	mu      sync.Mutex
	minute  int64
	m       map[string]int
	verdict map[string]bool // requests counted this minute (key), and whether they passed
}

// allow counts r under its device, IP and act_id for the current minute
// and answers whether every count is within its cap. A request decided
// again (released and taken again) is counted once a minute: it gets the
// verdict it got.
func (c *riskCounters) allow(r model.CouponRequest, caps couponbatch.RiskRules, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := now.Unix() / 60; m != c.minute || c.verdict == nil {
		c.minute = m
		clear(c.m)
		c.verdict = map[string]bool{}
	}
	if v, ok := c.verdict[key(r)]; ok {
		return v
	}
	ok := true
	for _, k := range []struct {
		name, v string
		cap     int
	}{{"d", r.DeviceID, caps.PerDevicePerMin}, {"i", r.ClientIP, caps.PerIPPerMin}, {"a", r.ActID, caps.PerActPerMin}} {
		if k.v == "" {
			continue
		}
		c.m[k.name+k.v]++
		if c.m[k.name+k.v] > k.cap {
			ok = false
		}
	}
	c.verdict[key(r)] = ok
	return ok
}
