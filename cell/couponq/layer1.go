package couponq

// Layer 1, the decider: its gatherer takes chunks of layer 1's queue, its
// workers decide each request against the batch's rules and pass those
// allowed into layer 2's queue.

import (
	"context"
	"sync"
	"time"

	"redcell/cell/couponbatch"
	"redcell/model"
	"redcell/storage"
)

// gather1 drains layer 1's queue at layer 1's rate: one token per
// request, what is queued taken as one chunk (up to decideMax) and handed
// to a free decider (layer1). One gatherer, so that queued requests stay
// together however many deciders wait: while every decider is busy, the
// next chunk grows in the queue, and a decision's one read of holdings
// covers more requests the busier the cell is.
func (e *Engine) gather1(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		if err := e.cfg.Layer1.Wait(ctx); err != nil {
			return
		}
		var first model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case first = <-e.q1:
		}
		// The rest of a take the feeder is queuing is in once it lets go:
		// the lock is a barrier here, held by feedDBs, not by this.
		e.feeding.Lock()
		//lint:ignore SA2001 a barrier: wait for the take feedDBs is queuing, hold nothing
		e.feeding.Unlock()
		rs := []model.CouponRequest{first}
		until := e.gatherUntil(0)
	more:
		for len(rs) < decideMax && e.cfg.Layer1.Allow() {
			select {
			case r := <-e.q1:
				rs = append(rs, r)
				continue
			default:
			}
			if until == nil {
				break more
			}
			select {
			case r := <-e.q1:
				rs = append(rs, r)
			case <-until:
				break more
			case <-ctx.Done():
				break more
			}
		}
		if !e.handOver(ctx, out, rs) {
			return
		}
	}
}

// gatherUntil is when a gatherer of layer (0: layer 1, 1: layer 2) that
// got its first request stops waiting for more: Config.Gather after now
// (nil, never, for none: it takes what is queued at once). A chunk that
// fills, or a token its limiter refuses, ends the wait before.
func (e *Engine) gatherUntil(layer int) <-chan time.Time {
	if w := e.cfg.Gather[layer]; w > 0 {
		return e.clock.After(w)
	}
	return nil
}

// handOver gives a chunk to a free worker of out or, when ctx ends first,
// releases it (back to accepted); false when ctx ended.
func (e *Engine) handOver(ctx context.Context, out chan<- []model.CouponRequest, rs []model.CouponRequest) bool {
	select {
	case out <- rs:
		return true
	case <-ctx.Done():
		for _, r := range rs {
			e.done(r)
		}
		e.release(rs)
		return false
	}
}

// layer1 decides the chunks gather1 hands it, each together (one read of
// the persons' holdings, one write per refusal reason), and queues what
// passes for layer 2.
func (e *Engine) layer1(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		var rs []model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case rs = <-in:
		}
		now := e.clock.Now()
		for _, r := range rs {
			if r.TakenMS > 0 {
				e.cfg.Observe.Waited(1, now.Sub(time.UnixMilli(r.TakenMS)))
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		pass, err := e.decideMany(dctx, rs, true)
		cancel()
		if err != nil {
			// Nothing decided is lost: the requests are taken again after a
			// pause.
			e.log.Warn("coupons: decision failed; the requests are taken again", "requests", len(rs), "err", err)
			e.park(rs, e.clock.Now().Add(backoffFor), true)
		}
		passed := map[string]bool{}
		for _, r := range pass {
			passed[key(r)] = true
		}
		for _, r := range rs {
			if !passed[key(r)] && !e.isParked(r) {
				e.done(r)
			}
		}
		if !e.queue2(ctx, pass) {
			return
		}
	}
}

// queue2 puts a decision's passed requests into layer 2's queue, as one
// run while there is room (gather2 takes them together), then waiting for
// room; when ctx ends first, the rest are released. False when ctx ended.
func (e *Engine) queue2(ctx context.Context, pass []model.CouponRequest) bool {
	i := 0
	e.passing.Lock()
	now := e.clock.Now()
room:
	for ; i < len(pass); i++ {
		select {
		case e.q2 <- queued{r: pass[i], at: now}:
		default:
			break room
		}
	}
	e.passing.Unlock()
	for ; i < len(pass); i++ {
		select {
		case e.q2 <- queued{r: pass[i], at: e.clock.Now()}:
		case <-ctx.Done():
			e.release(pass[i:])
			for _, r := range pass[i:] {
				e.done(r)
			}
			return false
		}
	}
	return true
}

// decide is layer 1 for one request (the green channel).
func (e *Engine) decide(ctx context.Context, r model.CouponRequest) (pass bool, err error) {
	ps, err := e.decideMany(ctx, []model.CouponRequest{r}, false)
	return len(ps) == 1, err
}

// decideMany is layer 1 for requests taken together: the batch open at
// each one's accept time, the risk caps, and the person's holding (one
// read for all). Refusals are written (final), one write per reason; the
// requests that pass are returned, and a person's requests that cannot all
// pass together are released to be decided after. On an error nothing is
// refused.
func (e *Engine) decideMany(ctx context.Context, rs []model.CouponRequest, owned bool) (pass []model.CouponRequest, err error) {
	cat := e.catalog()
	refuse := map[model.CouponReason][]model.CouponRequest{}
	var asks []model.CouponRequest
	rules := map[string]model.CouponRule{}
	now := e.clock.Now()
	for _, r := range rs {
		// The window is the request's: accepted while the batch issued, it
		// is decided even when a backlog brings it here after the end.
		b, err := cat.Open(r.Batch, time.UnixMilli(r.AcceptedMS))
		switch {
		case err != nil:
			refuse[model.ReasonBatchClosed] = append(refuse[model.ReasonBatchClosed], r)
		case !e.risk.allow(r, cat.Risk, now):
			refuse[model.ReasonRisk] = append(refuse[model.ReasonRisk], r)
		default:
			rules[r.Batch] = ruleOf(b)
			asks = append(asks, r)
		}
	}
	if len(asks) > 0 {
		hs, err := storage.HoldingsOf(ctx, e.cfg.Store, asks)
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
		e.park(later, now, owned) // taken again at the feeder's next tick
	}
	for reason, group := range refuse {
		if err := storage.RefuseCoupons(ctx, e.cfg.Store, group, reason); err != nil {
			return nil, err
		}
		e.Stats.Refused.Add(int64(len(group)))
		for _, r := range group {
			e.cfg.Observe.Final(r, false, reason, now)
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
