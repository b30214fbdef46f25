package couponq

// Layer 2, the merger: its gatherer takes chunks of layer 2's queue, its
// mergers group them by batch, deduct each batch's stock once (a grant at
// the batch's home, or a held lease) and issue the coupons.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

// merger is the engine's third role, layer 2: it owns layer 2's queue and
// the stock units the engine holds (merges in flight, held leases), with
// each batch's marks (sold out, backing off, granted short) and each
// request's sold-out tries. Its goroutines are gather, run and keepHeld;
// issue (a green request) is safe for concurrent use.
type merger struct {
	layer                  // limit: Config.Layer2, gatherFor: Config.Gather[1]
	in    *handoff[queued] // layer 2's queue: what the decider passed
	stock Stock

	mergeMax atomic.Int64 // MergeMax now (Engine.SetMergeMax)
	pre      atomic.Int64 // Prefetch now (Engine.SetPrefetch)
	stopping atomic.Bool  // Run's workers have stopped: no new held lease (set under mu)

	mu       sync.Mutex
	soldOut  map[string]time.Time  // batches whose last deduction found nothing free, until when
	backoff  map[string]time.Time  // batches whose last deduction failed, until when
	inflight map[string]int64      // units this engine's merges hold now, by batch
	held     map[string]*heldLease // leases kept for the next merges, by lease ID (held.go)
	short    map[string]time.Time  // batches whose grant came back short, deducted without prefetch until when
	tries    map[string]int        // request key → deductions that found its batch sold out
}

func newMerger(l layer, cfg Config, in *handoff[queued]) *merger {
	m := &merger{layer: l, in: in, stock: cfg.Stock, soldOut: map[string]time.Time{}, backoff: map[string]time.Time{},
		inflight: map[string]int64{}, held: map[string]*heldLease{}, short: map[string]time.Time{}, tries: map[string]int{}}
	m.mergeMax.Store(int64(cfg.MergeMax))
	m.pre.Store(max(cfg.Prefetch, 0))
	return m
}

// forget drops r's sold-out tries: r is off the feeder's books (done).
func (m *merger) forget(r model.CouponRequest) {
	m.mu.Lock()
	delete(m.tries, key(r))
	m.mu.Unlock()
}

// stop ends new held leases: the engine's workers have stopped.
func (m *merger) stop() {
	m.mu.Lock() // keep takes m.mu: no lease is kept once this returns
	m.stopping.Store(true)
	m.mu.Unlock()
}

// gather drains layer 2's queue at layer 2's rate: one token per
// request, what is queued (up to MergeMax) taken as one pass and handed to
// a free merger (run). One gatherer, as the decider's: while the mergers are
// busy the next pass grows, so merges are larger the busier the cell is.
func (m *merger) gather(ctx context.Context, out chan<- []model.CouponRequest) {
	for {
		first, ok := m.in.first(ctx, m.limit) // with the rest of that decision's pass (queue2)
		if !ok {
			return
		}
		now := m.clock.Now()
		m.observe.Waited(2, now.Sub(first.at))
		batch := []model.CouponRequest{first.r}
		until := gatherUntil(m.clock, m.gatherFor)
	more:
		for mergeMax := int(m.mergeMax.Load()); len(batch) < mergeMax && m.limit.Allow(); {
			var q queued
			select {
			case q = <-m.in.ch:
			default:
				if until == nil {
					break more
				}
				select {
				case q = <-m.in.ch:
				case <-until:
					break more
				case <-ctx.Done():
					break more
				}
			}
			m.observe.Waited(2, m.clock.Now().Sub(q.at))
			batch = append(batch, q.r)
		}
		if !handOver(ctx, out, dedupe(batch), m.books) {
			return
		}
	}
}

// run merges and issues the passes gather hands it.
func (m *merger) run(ctx context.Context, in <-chan []model.CouponRequest) {
	for {
		batch, ok := next(ctx, in)
		if !ok {
			return
		}
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout) // a step in flight finishes
		if err := m.issue(ictx, batch, true, false); err != nil {
			m.log.Warn("coupons: issue failed; the requests are taken again once stale", "requests", len(batch), "err", err)
		}
		cancel()
		for _, r := range batch {
			if !m.books.isParked(r) {
				m.books.done(r)
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
func (m *merger) issue(ctx context.Context, reqs []model.CouponRequest, owned, green bool) error {
	byBatch := map[string][]model.CouponRequest{}
	var order []string
	for _, r := range reqs {
		if byBatch[r.Batch] == nil {
			order = append(order, r.Batch)
		}
		byBatch[r.Batch] = append(byBatch[r.Batch], r)
	}
	cat := m.catalog()
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
				errs[i] = m.refuse(ctx, group, model.ReasonBatchClosed)
				return
			}
			m.mu.Lock()
			now := m.clock.Now()
			out, wait := now.Before(m.soldOut[id]), now.Before(m.backoff[id])
			m.mu.Unlock()
			if wait { // its stock did not answer a moment ago: taken again later
				m.books.park(group, m.backoffUntil(id), owned)
				return
			}
			if out {
				errs[i] = m.soldOutNow(ctx, group, owned)
				return
			}
			if err := m.issueBatch(ctx, ruleOf(b), group, owned, green); err != nil {
				errs[i] = fmt.Errorf("batch %s: %w", id, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (m *merger) refuse(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	if err := storage.RefuseCoupons(ctx, m.store, reqs, reason); err != nil {
		return fmt.Errorf("refuse %d (%s): %w", len(reqs), reason, err)
	}
	m.stats.Refused.Add(int64(len(reqs)))
	now := m.clock.Now()
	for _, r := range reqs {
		m.observe.Final(r, false, reason, now)
	}
	return nil
}

// holding reports whether this engine's merges hold units of batch now.
func (m *merger) holding(batch string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inflight[batch]+m.heldLeftLocked(batch) > 0
}

// backoffUntil is when batch's pause ends.
func (m *merger) backoffUntil(batch string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.backoff[batch]
}

// soldOutNow answers requests whose batch had nothing free: refused
// SOLD_OUT after soldOutTries (a green one at once: its caller waits for
// the final state), else released to be taken again.
func (m *merger) soldOutNow(ctx context.Context, reqs []model.CouponRequest, owned bool) error {
	var refuse, again []model.CouponRequest
	m.mu.Lock()
	for _, r := range reqs {
		m.tries[key(r)]++
		if m.tries[key(r)] >= soldOutTries || r.Green { // a green request is answered now
			delete(m.tries, key(r))
			refuse = append(refuse, r)
		} else {
			again = append(again, r)
		}
	}
	m.mu.Unlock()
	// Tried again once the sold-out mark has passed: each try asks the
	// stock anew.
	if len(again) > 0 {
		m.books.park(again, m.clock.Now().Add(soldOutFor), owned)
	}
	if len(refuse) > 0 {
		return m.refuse(ctx, refuse, model.ReasonSoldOut)
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
func (m *merger) issueBatch(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, owned, green bool) (err error) {
	m.observe.Merged(rule.Batch, len(reqs))
	n := int64(len(reqs))
	if h := m.fromHeld(rule.Batch, n); h != nil {
		m.stats.HeldDeductions.Add(1)
		return m.issueHeld(ctx, rule, reqs, h, h.id, owned, fmt.Sprintf("held lease %s (left open)", h.id))
	}
	want := n
	if pre := m.prefetch(rule.Batch); n < pre {
		// Only a merge smaller than the prefetch asks for more: a full one
		// already shares its grant, and a held lease serves merges of up to
		// its units left.
		want += pre
	}
	asked := m.clock.Now()
	lease, granted, stopped, err := m.grant(ctx, rule.Batch, want, n, green)
	if stopped {
		return err // ctx ended while a green request waited
	}
	if err != nil {
		// Granted or not, unknown: a lease granted without an answer is
		// settled by its (zero) coupons. The requests are taken again after
		// a pause of the batch, not only once stale.
		until := m.clock.Now().Add(backoffFor)
		m.mu.Lock()
		m.backoff[rule.Batch] = until
		m.mu.Unlock()
		m.books.park(reqs, until, owned)
		return fmt.Errorf("deduct %d: %w", n, err)
	}
	m.stats.Deductions.Add(1)
	if granted < want { // the home had less than asked: near the end, no prefetch for a while
		m.mu.Lock()
		m.short[rule.Batch] = m.clock.Now().Add(shortFor)
		m.mu.Unlock()
	}
	if granted == 0 {
		return m.noneGranted(ctx, rule.Batch, reqs, owned, green)
	}
	if granted < n {
		// Fewer units than requests: the batch is near its end, but units
		// held here or by other cells may still come back. The requests
		// beyond the units are not refused now: they go the way of a
		// deduction that found nothing (parked while this engine holds
		// units, else counted towards SOLD_OUT after soldOutTries).
		m.retireHeld(rule.Batch)
		rest := reqs[granted:]
		reqs = reqs[:granted]
		n = granted
		if m.holding(rule.Batch) && !green {
			m.books.park(rest, m.clock.Now().Add(heldWait), owned)
		} else if rerr := m.soldOutNow(ctx, rest, owned); rerr != nil {
			defer func() { err = errors.Join(err, rerr) }()
		}
	}
	if granted > n && granted == want {
		// The merge's units now, the rest kept for the batch's next merges
		// (unless the engine began stopping meanwhile).
		if h := m.keep(rule.Batch, lease, granted, n, asked); h != nil {
			return m.issueHeld(ctx, rule, reqs, h, lease, owned, fmt.Sprintf("lease %s (left open, %d units out)", lease, granted))
		}
	}
	return m.issueGranted(ctx, rule, reqs, lease, granted, owned)
}

// grant asks the batch's home for want units. A green request that found
// nothing asks again (for n) while this engine holds units, and for
// greenPeerWait in any case: another cell's idle held lease goes back to
// the home within heldIdle+heldTick. Errors: the home's; or ctx's, with
// stopped, when it ended while a green request waited.
func (m *merger) grant(ctx context.Context, batch string, want, n int64, green bool) (lease string, granted int64, stopped bool, err error) {
	lease, granted, err = m.stock.Grant(ctx, batch, want)
	granted, err = grantInRange(want, granted, err)
	started := m.clock.Now()
	for wait := 0; err == nil && granted == 0 && green && wait < greenWaits &&
		(m.holding(batch) || m.clock.Now().Sub(started) < greenPeerWait); wait++ {
		pause := greenPeerPause // another cell's units: they come back after its idle time
		if m.holding(batch) {
			pause = greenWait // this engine's own: back within a step
		}
		m.retireHeld(batch)
		select {
		case <-ctx.Done():
			return "", 0, true, ctx.Err()
		case <-m.clock.After(pause):
		}
		lease, granted, err = m.stock.Grant(ctx, batch, n)
		granted, err = grantInRange(n, granted, err)
	}
	return lease, granted, false, err
}

// grantInRange refuses a deduction's answer outside 0..want units (a merge
// never holds more than it asked for). The answer may be another cell's, so
// a bad one is an error, never an assertion: the batch backs off and the
// lease, if any, expires and is settled by its (zero) coupons.
func grantInRange(want, granted int64, err error) (int64, error) {
	if err == nil && (granted < 0 || granted > want) {
		return 0, fmt.Errorf("couponq: the batch's home granted %d units for %d asked", granted, want)
	}
	return granted, err
}

// checkIssued asserts an issue's answer against the units it was given:
// its coupons and the units it left unused are those units, neither
// negative (a merge never spends more than it holds, nor gives back more).
func checkIssued(units, unused int64, ds []model.CouponDecision) {
	var issued int64
	for _, d := range ds {
		if d.Issued {
			issued++
		}
	}
	invariant.That(unused >= 0 && issued+unused == units,
		"couponq: an issue spent other than the units it held: coupons + unused = units, unused >= 0")
}

// noneGranted handles a deduction that found nothing: what this engine's
// held leases keep goes back to the stock, for anyone; while units held
// here (by other merges or held leases) may still come back unused, the
// requests are taken again shortly (a green one is refused at once), else
// the batch is sold out for soldOutFor.
func (m *merger) noneGranted(ctx context.Context, batch string, reqs []model.CouponRequest, owned, green bool) error {
	m.retireHeld(batch)
	m.mu.Lock()
	held := m.inflight[batch] + m.heldLeftLocked(batch)
	if held == 0 {
		m.soldOut[batch] = m.clock.Now().Add(soldOutFor)
	}
	m.mu.Unlock()
	if held > 0 && !green {
		m.books.park(reqs, m.clock.Now().Add(heldWait), owned)
		return nil
	}
	return m.soldOutNow(ctx, reqs, owned)
}

// issueHeld issues reqs from held lease h (lease its ID as the store
// knows it) and closes the merge's part of it with what it did not spend.
// A commit whose outcome is unknown leaves the part open (left names the
// lease in the error); any other failure gives the part back and takes the
// requests again.
func (m *merger) issueHeld(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, h *heldLease, lease string, owned bool, left string) error {
	n := int64(len(reqs))
	ds, unused, err := storage.IssueCoupons(ctx, m.store, rule, lease, n, reqs)
	if err != nil {
		lost := errors.Is(err, storage.ErrCommitUnknown)
		open := m.endHeld(h, n, n, lost)
		if lost {
			m.observe.LeftOpen(rule.Batch, open)
			return fmt.Errorf("issue %d from %s: %w", n, left, err)
		}
		m.books.park(reqs, m.clock.Now(), owned)
		return fmt.Errorf("issue %d: %w", n, err)
	}
	checkIssued(n, unused, ds)
	m.finals(reqs, ds)
	m.endHeld(h, n, unused, false)
	return nil
}

// issueGranted issues reqs from a lease of granted units held by this
// merge alone (counted in inflight meanwhile), then closes the lease with
// what it did not spend, even none, so that nobody settles it. A commit
// whose outcome is unknown leaves the lease open; any other failure gives
// every unit back and takes the requests again.
func (m *merger) issueGranted(ctx context.Context, rule model.CouponRule, reqs []model.CouponRequest, lease string, granted int64, owned bool) error {
	n := int64(len(reqs))
	invariant.That(n >= 1 && n <= granted, "couponq: a merge issues from its lease at most as many requests as units (1 <= n <= granted)")
	m.mu.Lock()
	m.inflight[rule.Batch] += granted
	m.checkInflightLocked(rule.Batch)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.inflight[rule.Batch] -= granted
		m.checkInflightLocked(rule.Batch)
		m.mu.Unlock()
	}()
	ds, unused, err := storage.IssueCoupons(ctx, m.store, rule, lease, granted, reqs)
	if err != nil {
		if errors.Is(err, storage.ErrCommitUnknown) {
			m.observe.LeftOpen(rule.Batch, granted)
			return fmt.Errorf("issue %d from lease %s (left open, %d units out): %w", n, lease, granted, err)
		}
		// Nothing was written: every unit goes back, and the requests are
		// taken again.
		if rerr := m.giveBack(ctx, rule.Batch, lease, granted); rerr != nil {
			return errors.Join(fmt.Errorf("issue %d: %w", n, err), rerr)
		}
		m.books.park(reqs, m.clock.Now(), owned)
		return fmt.Errorf("issue %d: %w", n, err)
	}
	checkIssued(granted, unused, ds)
	m.finals(reqs, ds)
	return m.giveBack(ctx, rule.Batch, lease, unused)
}

// finals counts and reports the decisions ds of reqs.
func (m *merger) finals(reqs []model.CouponRequest, ds []model.CouponDecision) {
	bySerial := make(map[string]model.CouponRequest, len(reqs))
	for _, r := range reqs {
		bySerial[r.App+"\x00"+r.Serial] = r
	}
	now := m.clock.Now()
	for _, d := range ds {
		if d.Issued {
			m.stats.Issued.Add(1)
		} else {
			m.stats.Refused.Add(1)
		}
		m.observe.Final(bySerial[d.App+"\x00"+d.Serial], d.Issued, d.Reason, now)
	}
}

// giveBack closes a lease with unused units, trying a few times (a return
// is repeatable).
func (m *merger) giveBack(ctx context.Context, batch, lease string, unused int64) error {
	var err error
	for attempt := range 3 {
		if err = m.stock.Return(ctx, batch, lease, unused); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("return %d unused of lease %s: %w", unused, lease, err)
		case <-m.clock.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return fmt.Errorf("return %d unused of lease %s (left open): %w", unused, lease, err)
}
