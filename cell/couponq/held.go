package couponq

import (
	"context"
	"time"

	"redcell/internal/invariant"
)

// Held leases: a merge's deduction may ask the batch's home for more units
// than the merge needs (Config.Prefetch). The rest stay with the engine as
// a held lease, and the batch's next merges deduct from it in memory,
// without a grant and a return at the home each: on a hot batch, two
// transactions on one stock row per merge become two per lease. Every
// coupon a merge issues from a held lease carries the lease's ID, so the
// lease's coupons never exceed its units, and the lease is closed with what
// no merge spent when it has been idle for heldIdle, is HeldMaxAge old, its
// batch found the home empty, or the engine stops. An issue from it whose
// answer was lost leaves it open, never returned: its expiry settles it by
// counting its coupons (under-issue, never over-issue), as a merge's own
// lease is.
//
// A home whose grant came back short (fewer units than asked) is near its
// end: the batch is deducted merge by merge again for shortFor, so that
// no cell sits on the last units while another refuses SOLD_OUT.

// HeldMaxAge is the oldest a held lease is deducted from. The lease's TTL
// must exceed it by more than StepTimeout (an issue begun just before it
// may run a step), or the lease could be settled while a merge spends it.
const HeldMaxAge = 10 * time.Second

const (
	// heldIdle is how long a held lease no merge deducted from is kept.
	heldIdle = 250 * time.Millisecond
	// heldTick is how often held leases are looked at.
	heldTick = 100 * time.Millisecond
	// shortFor is how long a batch whose grant came back short is deducted
	// without prefetch.
	shortFor = 10 * time.Second
)

// heldLease is a lease of a batch's stock the engine deducts from. Guarded
// by merger.mu. Its units are conserved (check): granted = spent + unknown
// + left + out, none negative; closed, it returns left.
type heldLease struct {
	batch   string
	id      string
	granted int64     // units the home granted
	spent   int64     // units coupons took, in issues that ended
	unknown int64     // units of issues whose answer was lost: spent or not, settled by the home
	left    int64     // units no merge has taken
	out     int64     // units merges took whose issue has not ended
	since   time.Time // when it was granted
	used    time.Time // when a merge last took units
	retired bool      // take nothing more: closed once out is 0
	lost    bool      // an issue from it lost its answer: left open for settlement
}

// check asserts h's units: every unit the home granted is spent, unknown
// (a lost answer), left or out with a merge, and none of them is negative.
// m.mu is held.
func (h *heldLease) check() {
	invariant.That(h.spent >= 0 && h.unknown >= 0 && h.left >= 0 && h.out >= 0,
		"couponq: a held lease's units went negative (spent, unknown, left, out >= 0)")
	invariant.That(h.granted == h.spent+h.unknown+h.left+h.out,
		"couponq: a held lease's units are not conserved: granted = spent + unknown + left + out")
}

// checkInflightLocked asserts the units this engine's merges hold of batch:
// never negative, and never below what they took of its held leases
// (inflight counts those and the units of the merges' own leases). m.mu is
// held.
func (m *merger) checkInflightLocked(batch string) {
	var out int64
	for _, h := range m.held {
		if h.batch == batch {
			out += h.out
		}
	}
	invariant.That(out >= 0 && m.inflight[batch] >= out,
		"couponq: units in flight below what merges took of held leases (inflight >= out >= 0)")
}

// fromHeld takes n units of a held lease of batch with n left, for one
// merge; nil when there is none.
func (m *merger) fromHeld(batch string, n int64) *heldLease {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	for _, h := range m.held {
		if h.batch == batch && !h.retired && h.left >= n && now.Sub(h.since) < HeldMaxAge {
			invariant.That(n >= 1, "couponq: a merge takes at least a unit of a held lease")
			h.check()
			h.left -= n
			h.out += n
			h.used = now
			m.inflight[batch] += n
			h.check()
			m.checkInflightLocked(batch)
			return h
		}
	}
	return nil
}

// endHeld ends a merge's use of n units of h, unused of them not spent;
// lost says the outcome is unknown: h is then left open, and open
// is the units no coupon is known to carry (the lost issue's n and what h
// never gave out). It asserts the merge ends no more than it took, and
// spends no more than it holds (0 <= unused <= n <= out), before, and
// that h's units are conserved after.
func (m *merger) endHeld(h *heldLease, n, unused int64, lost bool) (open int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	invariant.That(n >= 1 && n <= h.out && unused >= 0 && unused <= n,
		"couponq: a merge ended more units of a held lease than it took, or spent more than it held (0 <= unused <= n <= out)")
	defer m.checkInflightLocked(h.batch)
	defer h.check()
	h.out -= n
	m.inflight[h.batch] -= n
	if lost {
		h.lost, h.retired = true, true
		h.unknown += n
		return n + h.left // the lost issue's units and those never given out
	}
	h.spent += n - unused
	h.left += unused
	return 0
}

// keep makes lease (granted units, n of them taken by the merge now) a held
// lease of batch; asked is when the grant was asked for (its age counts
// from then: the home set its expiry at most that much later).
// Nil when the engine is stopping: the caller issues from the lease and
// closes it itself.
func (m *merger) keep(batch, lease string, granted, n int64, asked time.Time) *heldLease {
	invariant.That(n >= 1 && granted > n, "couponq: a held lease keeps units beyond its merge's own (granted > n >= 1)")
	now := m.clock.Now()
	h := &heldLease{batch: batch, id: lease, granted: granted, left: granted - n, out: n, since: asked, used: now}
	m.mu.Lock()
	if m.stopping.Load() {
		m.mu.Unlock()
		return nil
	}
	m.held[lease] = h
	m.inflight[batch] += n
	h.check()
	m.checkInflightLocked(batch)
	m.mu.Unlock()
	return h
}

// heldLeftLocked is the units held leases of batch have not given out
// (called with m.mu held).
func (m *merger) heldLeftLocked(batch string) int64 {
	var n int64
	for _, h := range m.held {
		if h.batch == batch && !h.lost {
			n += h.left
		}
	}
	return n
}

// retireHeld stops deductions from batch's held leases: they are closed
// at the next look, once their merges end.
func (m *merger) retireHeld(batch string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range m.held {
		if h.batch == batch {
			h.retired = true
		}
	}
}

// prefetch is how many units beyond a merge's own to ask batch's home for.
func (m *merger) prefetch(batch string) int64 {
	n := m.pre.Load()
	if n <= 0 || m.stopping.Load() { // a stopping engine keeps no new lease
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.clock.Now().Before(m.short[batch]) {
		return 0
	}
	return n
}

// closeHeld closes the held leases no merge is using that are idle, old or
// retired (every one with all), returning their units left to the stock.
// A lease whose return fails (its home is down, say) is tried again at the
// next look while it is younger than HeldMaxAge+StepTimeout, its TTL still
// far; after that, or when the engine stops (all), it stays open and is
// settled at its expiry by its coupons.
func (m *merger) closeHeld(ctx context.Context, all bool) {
	var cs []*heldLease
	m.mu.Lock()
	now := m.clock.Now()
	for b, until := range m.short {
		if !now.Before(until) {
			delete(m.short, b)
		}
	}
	for id, h := range m.held {
		if h.out > 0 {
			continue
		}
		if !all && !h.retired && now.Sub(h.used) < heldIdle && now.Sub(h.since) < HeldMaxAge {
			continue
		}
		delete(m.held, id)
		if !h.lost {
			// What it returns is what no coupon took: granted = spent + returned.
			invariant.That(h.unknown == 0 && h.granted == h.spent+h.left,
				"couponq: a held lease closed with units unaccounted for: granted = spent + returned")
			cs = append(cs, h)
		}
	}
	m.mu.Unlock()
	for _, h := range cs {
		err := m.stock.Return(ctx, h.batch, h.id, h.left)
		if err == nil {
			continue
		}
		if !all && m.clock.Now().Sub(h.since) < HeldMaxAge+StepTimeout {
			m.mu.Lock()
			h.retired = true
			m.held[h.id] = h // tried again at the next look
			m.mu.Unlock()
			continue
		}
		m.log.Warn("coupons: held lease not closed; its expiry settles it by its coupons", "batch", h.batch, "lease", h.id, "left", h.left, "err", err)
	}
}

// keepHeld closes held leases as they age, until ctx ends.
func (m *merger) keepHeld(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.clock.After(heldTick):
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StepTimeout)
		m.closeHeld(cctx, false)
		cancel()
	}
}
