package couponq

// Layer 2, the merger: its gatherer takes chunks of layer 2's queue, its
// mergers group them by batch, deduct each batch's stock once (a grant at
// the batch's home, or a held lease) and issue the coupons.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"redcell/model"
	"redcell/storage"
)

// gather2 drains layer 2's queue at layer 2's rate: one token per
// request, what is queued (up to MergeMax) taken as one pass and handed to
// a free merger (layer2). One gatherer, as gather1: while the mergers are
// busy the next pass grows, so merges are larger the busier the cell is.
func (e *Engine) gather2(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		if err := e.cfg.Layer2.Wait(ctx); err != nil {
			return
		}
		var first queued
		select {
		case <-ctx.Done():
			return
		case first = <-e.q2:
		}
		// The rest of that decision's pass is in the queue once its
		// decider lets go (queue2): a barrier, as in gather1.
		e.passing.Lock()
		//lint:ignore SA2001 a barrier: wait for the decider's pass (queue2), hold nothing
		e.passing.Unlock()
		now := e.clock.Now()
		e.cfg.Observe.Waited(2, now.Sub(first.at))
		batch := []model.CouponRequest{first.r}
		until := e.gatherUntil(1)
	more:
		for mergeMax := int(e.merge.Load()); len(batch) < mergeMax && e.cfg.Layer2.Allow(); {
			var q queued
			select {
			case q = <-e.q2:
			default:
				if until == nil {
					break more
				}
				select {
				case q = <-e.q2:
				case <-until:
					break more
				case <-ctx.Done():
					break more
				}
			}
			e.cfg.Observe.Waited(2, e.clock.Now().Sub(q.at))
			batch = append(batch, q.r)
		}
		if !e.handOver(ctx, out, dedupe(batch)) {
			return
		}
	}
}

// layer2 merges and issues the passes gather2 hands it.
func (e *Engine) layer2(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		var batch []model.CouponRequest
		select {
		case <-ctx.Done():
			return
		case batch = <-in:
		}
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		if err := e.issue(ictx, batch, true, false); err != nil {
			e.log.Warn("coupons: issue failed; the requests are taken again once stale", "requests", len(batch), "err", err)
		}
		cancel()
		for _, r := range batch {
			if !e.isParked(r) {
				e.done(r)
			}
		}
	}
}

// issue is layer 2 for requests taken together: one deduction and one
// issuing transaction per batch. A batch no longer in the catalog refuses
// its requests (BATCH_CLOSED); the window was decided by layer 1.
//
// owned says the caller holds the requests' places in the queued set: a
// request released to be taken again leaves it. A green decision of a
// request the feeder queued as well does not own it, and leaves the mark
// to the queue's copy (removing it would let the feeder queue a second).
//
// green: the caller waits for the final state (the green channel), so a
// deduction that found nothing free while this engine's other merges hold
// units waits for them rather than releasing the request.
func (e *Engine) issue(ctx context.Context, reqs []model.CouponRequest, owned, green bool) error {
	byBatch := map[string][]model.CouponRequest{}
	var order []string
	for _, r := range reqs {
		if byBatch[r.Batch] == nil {
			order = append(order, r.Batch)
		}
		byBatch[r.Batch] = append(byBatch[r.Batch], r)
	}
	cat := e.catalog()
	// The batches of a pass are deducted and issued side by side: each has
	// its own stock row, and the persons' rows are locked in one order by
	// every issue.
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, id := range order {
		wg.Go(func() {
			group := byBatch[id]
			b, ok := cat.Batch(id)
			if !ok {
				errs[i] = e.refuse(ctx, group, model.ReasonBatchClosed)
				return
			}
			e.mu.Lock()
			now := e.clock.Now()
			out, wait := now.Before(e.soldOut[id]), now.Before(e.backoff[id])
			e.mu.Unlock()
			if wait { // its stock did not answer a moment ago: taken again later
				e.park(group, e.backoffUntil(id), owned)
				return
			}
			if out {
				errs[i] = e.soldOutNow(ctx, group, owned)
				return
			}
			if err := e.issueBatch(ctx, ruleOf(b), group, owned, green); err != nil {
				errs[i] = fmt.Errorf("batch %s: %w", id, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (e *Engine) refuse(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	if err := storage.RefuseCoupons(ctx, e.cfg.Store, reqs, reason); err != nil {
		return fmt.Errorf("refuse %d (%s): %w", len(reqs), reason, err)
	}
	e.Stats.Refused.Add(int64(len(reqs)))
	now := e.clock.Now()
	for _, r := range reqs {
		e.cfg.Observe.Final(r, false, reason, now)
	}
	return nil
}

// holding reports whether this engine's merges hold units of batch now.
func (e *Engine) holding(batch string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inflight[batch]+e.heldLeftLocked(batch) > 0
}

// backoffUntil is when batch's pause ends.
func (e *Engine) backoffUntil(batch string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.backoff[batch]
}

// parked is a request this engine put aside: it stays deciding, marked
// queued here, until the feeder releases it (accepted) at until.
type parked struct {
	r     model.CouponRequest
	until time.Time
}

// park puts requests aside until until; the feeder then puts them back to
// accepted and takes them again. Until then they stay deciding and marked
// queued here, so no pass takes them twice and a batch's pause (a failed
// deduction, a sold-out mark) really passes before they are tried again.
// A request the caller does not own (a green decision of one the feeder
// queued too) is left to its queued copy.
func (e *Engine) park(reqs []model.CouponRequest, until time.Time, owned bool) {
	if !owned {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range reqs {
		e.parked[key(r)] = parked{r: r, until: until}
	}
}

// isParked reports whether r is put aside (its queued mark is the park's).
func (e *Engine) isParked(r model.CouponRequest) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.parked[key(r)]
	return ok
}

// unpark releases the parked requests due by now (all of them with
// everything true), off the queued set first.
func (e *Engine) unpark(now time.Time, everything bool) {
	var due []model.CouponRequest
	e.mu.Lock()
	for k, p := range e.parked {
		if everything || !now.Before(p.until) {
			due = append(due, p.r)
			delete(e.parked, k)
			delete(e.queued, k)
			e.dirty[p.r.Shard.DB()] = true
		}
	}
	e.mu.Unlock()
	e.release(due)
}

// soldOutNow answers requests whose batch had nothing free: refused
// SOLD_OUT after soldOutTries (a green one at once: its caller waits for
// the final state), else released to be taken again.
func (e *Engine) soldOutNow(ctx context.Context, reqs []model.CouponRequest, owned bool) error {
	var refuse, again []model.CouponRequest
	e.mu.Lock()
	for _, r := range reqs {
		e.tries[key(r)]++
		if e.tries[key(r)] >= soldOutTries || r.Green { // a green request is answered now
			delete(e.tries, key(r))
			refuse = append(refuse, r)
		} else {
			again = append(again, r)
		}
	}
	e.mu.Unlock()
	// Tried again once the sold-out mark has passed: each try asks the
	// stock anew.
	if len(again) > 0 {
		e.park(again, e.clock.Now().Add(soldOutFor), owned)
	}
	if len(refuse) > 0 {
		return e.refuse(ctx, refuse, model.ReasonSoldOut)
	}
	return nil
}

// issueBatch deducts once for reqs (one batch) and issues: from a held
// lease of the batch with enough units left (held.go), else from a lease
// granted now, of the merge's units plus the prefetch when the merge is
// smaller than it (the rest kept as a held lease when all were granted). A
// grant of fewer units than requests issues as many requests as units and
// parks the others, or counts them towards SOLD_OUT (soldOutNow). Whatever happens after the grant, a
// lease not kept is closed with what it did not spend when that is known;
// only an issue whose COMMIT lost its answer leaves its lease open, its
// units counted out (under-issue, never over-issue) until it is settled by
// its coupons.
func (e *Engine) issueBatch(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, owned, green bool) (err error) {
	e.cfg.Observe.Merged(rule.Batch, len(reqs))
	n := int64(len(reqs))
	if h := e.fromHeld(rule.Batch, n); h != nil {
		e.Stats.HeldDeductions.Add(1)
		return e.issueHeld(ctx, rule, reqs, h, h.id, owned, fmt.Sprintf("held lease %s (left open)", h.id))
	}
	want := n
	if pre := e.prefetch(rule.Batch); n < pre {
		// Only a merge smaller than the prefetch asks for more: a full one
		// already shares its grant, and a held lease serves merges of up to
		// its units left.
		want += pre
	}
	asked := e.clock.Now()
	lease, granted, stopped, err := e.grant(ctx, rule.Batch, want, n, green)
	if stopped {
		return err // ctx ended while a green request waited
	}
	if err != nil {
		// Granted or not, unknown: a lease granted without an answer is
		// settled by its (zero) coupons. The requests are taken again after
		// a pause of the batch, not only once stale.
		until := e.clock.Now().Add(backoffFor)
		e.mu.Lock()
		e.backoff[rule.Batch] = until
		e.mu.Unlock()
		e.park(reqs, until, owned)
		return fmt.Errorf("deduct %d: %w", n, err)
	}
	e.Stats.Deductions.Add(1)
	if granted < want { // the home had less than asked: near the end, no prefetch for a while
		e.mu.Lock()
		e.short[rule.Batch] = e.clock.Now().Add(shortFor)
		e.mu.Unlock()
	}
	if granted == 0 {
		return e.noneGranted(ctx, rule.Batch, reqs, owned, green)
	}
	if granted < n {
		// Fewer units than requests: the batch is near its end, but units
		// held here or by other cells may still come back. The requests
		// beyond the units are not refused now: they go the way of a
		// deduction that found nothing (parked while this engine holds
		// units, else counted towards SOLD_OUT after soldOutTries).
		e.retireHeld(rule.Batch)
		rest := reqs[granted:]
		reqs = reqs[:granted]
		n = granted
		if e.holding(rule.Batch) && !green {
			e.park(rest, e.clock.Now().Add(heldWait), owned)
		} else if rerr := e.soldOutNow(ctx, rest, owned); rerr != nil {
			defer func() { err = errors.Join(err, rerr) }()
		}
	}
	if granted > n && granted == want {
		// The merge's units now, the rest kept for the batch's next merges
		// (unless the engine began stopping meanwhile).
		if h := e.keep(rule.Batch, lease, granted, n, asked); h != nil {
			return e.issueHeld(ctx, rule, reqs, h, lease, owned, fmt.Sprintf("lease %s (left open, %d units out)", lease, granted))
		}
	}
	return e.issueGranted(ctx, rule, reqs, lease, granted, owned)
}

// grant asks the batch's home for want units. A green request that found
// nothing asks again (for n) while this engine holds units, and for
// greenPeerWait in any case: another cell's idle held lease goes back to
// the home within heldIdle+heldTick. Errors: the home's; or ctx's, with
// stopped, when it ended while a green request waited.
func (e *Engine) grant(ctx context.Context, batch string, want, n int64, green bool) (lease string, granted int64, stopped bool, err error) {
	lease, granted, err = e.cfg.Stock.Grant(ctx, batch, want)
	started := e.clock.Now()
	for wait := 0; err == nil && granted == 0 && green && wait < greenWaits &&
		(e.holding(batch) || e.clock.Now().Sub(started) < greenPeerWait); wait++ {
		pause := greenPeerPause // another cell's units: they come back after its idle time
		if e.holding(batch) {
			pause = greenWait // this engine's own: back within a step
		}
		e.retireHeld(batch)
		select {
		case <-ctx.Done():
			return "", 0, true, ctx.Err()
		case <-e.clock.After(pause):
		}
		lease, granted, err = e.cfg.Stock.Grant(ctx, batch, n)
	}
	return lease, granted, false, err
}

// noneGranted handles a deduction that found nothing: what this engine's
// held leases keep goes back to the stock, for anyone; while units held
// here (by other merges or held leases) may still come back unused, the
// requests are taken again shortly (a green one is refused at once), else
// the batch is sold out for soldOutFor.
func (e *Engine) noneGranted(ctx context.Context, batch string, reqs []model.CouponRequest, owned, green bool) error {
	e.retireHeld(batch)
	e.mu.Lock()
	held := e.inflight[batch] + e.heldLeftLocked(batch)
	if held == 0 {
		e.soldOut[batch] = e.clock.Now().Add(soldOutFor)
	}
	e.mu.Unlock()
	if held > 0 && !green {
		e.park(reqs, e.clock.Now().Add(heldWait), owned)
		return nil
	}
	return e.soldOutNow(ctx, reqs, owned)
}

// issueHeld issues reqs from held lease h (lease its ID as the store
// knows it) and closes the merge's part of it with what it did not spend.
// A commit whose outcome is unknown leaves the part open (left names the
// lease in the error); any other failure gives the part back and takes the
// requests again.
func (e *Engine) issueHeld(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, h *heldLease, lease string, owned bool, left string) error {
	n := int64(len(reqs))
	ds, unused, err := storage.IssueCoupons(ctx, e.cfg.Store, rule, lease, n, reqs)
	if err != nil {
		lost := errors.Is(err, storage.ErrCommitUnknown)
		open := e.endHeld(h, n, n, lost)
		if lost {
			e.cfg.Observe.LeftOpen(rule.Batch, open)
			return fmt.Errorf("issue %d from %s: %w", n, left, err)
		}
		e.park(reqs, e.clock.Now(), owned)
		return fmt.Errorf("issue %d: %w", n, err)
	}
	e.finals(reqs, ds)
	e.endHeld(h, n, unused, false)
	return nil
}

// issueGranted issues reqs from a lease of granted units held by this
// merge alone (counted in inflight meanwhile), then closes the lease with
// what it did not spend, even none, so that nobody settles it. A commit
// whose outcome is unknown leaves the lease open; any other failure gives
// every unit back and takes the requests again.
func (e *Engine) issueGranted(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, lease string, granted int64, owned bool) error {
	n := int64(len(reqs))
	e.mu.Lock()
	e.inflight[rule.Batch] += granted
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inflight[rule.Batch] -= granted
		e.mu.Unlock()
	}()
	ds, unused, err := storage.IssueCoupons(ctx, e.cfg.Store, rule, lease, granted, reqs)
	if err != nil {
		if errors.Is(err, storage.ErrCommitUnknown) {
			e.cfg.Observe.LeftOpen(rule.Batch, granted)
			return fmt.Errorf("issue %d from lease %s (left open, %d units out): %w", n, lease, granted, err)
		}
		// Nothing was written: every unit goes back, and the requests are
		// taken again.
		if rerr := e.giveBack(ctx, rule.Batch, lease, granted); rerr != nil {
			return errors.Join(fmt.Errorf("issue %d: %w", n, err), rerr)
		}
		e.park(reqs, e.clock.Now(), owned)
		return fmt.Errorf("issue %d: %w", n, err)
	}
	e.finals(reqs, ds)
	return e.giveBack(ctx, rule.Batch, lease, unused)
}

// finals counts and reports the decisions ds of reqs.
func (e *Engine) finals(reqs []model.CouponRequest, ds []model.CouponDecision) {
	bySerial := make(map[string]model.CouponRequest, len(reqs))
	for _, r := range reqs {
		bySerial[r.App+"\x00"+r.Serial] = r
	}
	now := e.clock.Now()
	for _, d := range ds {
		if d.Issued {
			e.Stats.Issued.Add(1)
		} else {
			e.Stats.Refused.Add(1)
		}
		e.cfg.Observe.Final(bySerial[d.App+"\x00"+d.Serial], d.Issued, d.Reason, now)
	}
}

// giveBack closes a lease with unused units, trying a few times (a return
// is repeatable).
func (e *Engine) giveBack(ctx context.Context, batch, lease string, unused int64) error {
	var err error
	for attempt := range 3 {
		if err = e.cfg.Stock.Return(ctx, batch, lease, unused); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("return %d unused of lease %s: %w", unused, lease, err)
		case <-e.clock.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return fmt.Errorf("return %d unused of lease %s (left open): %w", unused, lease, err)
}
