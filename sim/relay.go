package sim

import (
	"fmt"

	cellrelay "redcell/cell/relay"
	"redcell/model"
)

// relay is the simulator's model of cell/relay.go for one life of a cell:
// fresh claims from the open batches and a scan of the outbox every
// relayInterval are split by the cell that owns the claimant's wallet into
// lanes; a lane waits cellrelay.Linger for its batch to fill, then delivers it —
// the local lane through the cell's own store, the others as a credits
// message to the claimants' cell, which applies them and answers — and marks
// what was delivered. A credit the receiver deferred is tried again after a
// backoff; a delivery with no answer within relayTimeout is given up, and the
// next scan finds its credits still pending. All of it is lost in a crash.
type relay struct {
	c        *cell
	held     map[string]bool           // claim IDs in a lane, in flight or waiting out a deferral
	lanes    [cellCount][]model.Credit // waiting for the linger, by destination
	armed    [cellCount]bool           // a flush is scheduled
	inFlight map[uint64][]model.Credit // deliveries to other cells by ID, awaiting their answer
	deferred map[string]int            // claim ID → times deferred
}

func newRelay(c *cell) *relay {
	return &relay{c: c, held: map[string]bool{}, inFlight: map[uint64][]model.Credit{}, deferred: map[string]int{}}
}

// scan offers the lanes the outbox rows older than two relay intervals, by
// database and page, as relay.scan does.
func (r *relay) scan() {
	c, w := r.c, r.c.w
	before := w.timeNow().Add(-2 * relayInterval).UnixMilli()
	for _, db := range c.dbs {
		var after model.OutboxPos
		for page := 0; page < cellrelay.ScanPagesMax; page++ {
			credits, next, err := c.store.PendingCredits(w.ctx, db, before, after.CreatedMS, after.ClaimID, cellrelay.BatchMax)
			if err != nil {
				w.count("relay.scan_failed")
				break
			}
			if len(credits) > 0 {
				w.count("relay.scanned")
				r.dispatch(credits)
			}
			if len(credits) < cellrelay.BatchMax {
				break
			}
			after = next
		}
	}
}

// dispatch puts each credit not already held into its destination's lane,
// split by sharding.Map.GroupByOwner as cell/relay's dispatch splits them: the
// cell's own claimants locally, the others by the cell owning their shard.
func (r *relay) dispatch(credits []model.Credit) {
	c, w := r.c, r.c.w
	fresh := make([]model.Credit, 0, len(credits))
	for _, cr := range credits {
		if !r.held[cr.ClaimID] { // marked here: a claim listed twice in credits is taken once
			r.held[cr.ClaimID] = true
			fresh = append(fresh, cr)
		}
	}
	local, remote, noOwner := w.smap.GroupByOwner(fresh, c.owns)
	if noOwner > 0 { // the simulated map covers every shard: a bug of the simulator
		panic(fmt.Sprintf("sim: %d credits without an owner in the cluster map", noOwner))
	}
	r.enqueue(c.idx, local)
	for _, g := range remote {
		r.enqueue(w.cellIndex(g.Cell.Name), g.Credits)
	}
}

// enqueue adds credits (held already) to lane dest and arms its flush after
// cellrelay.Linger.
func (r *relay) enqueue(dest int, credits []model.Credit) {
	if len(credits) == 0 {
		return
	}
	r.lanes[dest] = append(r.lanes[dest], credits...)
	if !r.armed[dest] {
		r.armed[dest] = true
		r.c.later(cellrelay.Linger, func() { r.flush(dest) })
	}
}

// flush delivers what lane dest holds, cellrelay.BatchMax credits at a time.
func (r *relay) flush(dest int) {
	c, w := r.c, r.c.w
	r.armed[dest] = false
	for len(r.lanes[dest]) > 0 {
		n := min(len(r.lanes[dest]), cellrelay.BatchMax)
		batch := append([]model.Credit(nil), r.lanes[dest][:n]...)
		r.lanes[dest] = r.lanes[dest][n:]
		if dest == c.idx {
			c.bookCredits(batch, func(applied int, deferred []string, err error) {
				ln := w.log.begin(w, "relay-local").s(c.name).i(int64(len(batch)))
				if err != nil {
					code, _ := model.CodeOf(err)
					ln.s(code).credits(batch).end()
					r.release(batch)
					return
				}
				ln.kv("deferred", int64(len(deferred))).credits(batch).end()
				w.counts["credits.applied"] += int64(applied)
				w.counts["credits.again"] += int64(len(batch) - applied - len(deferred))
				w.check.credited(c, batch, deferred)
				r.delivered(batch, deferred)
			})
			continue
		}
		w.seq++
		id := w.seq // unique across cells and lives
		r.inFlight[id] = batch
		w.log.begin(w, "relay-send").s(c.name).i(int64(dest)).i(int64(id)).i(int64(len(batch))).credits(batch).end()
		w.send(c.node, nodeCell0+dest, &message{kind: msgCredits, id: id, from: c.idx, credits: batch})
		c.later(relayTimeout, func() {
			if b, ok := r.inFlight[id]; ok {
				delete(r.inFlight, id)
				w.count("relay.timeout")
				w.log.begin(w, "relay-timeout").s(c.name).i(int64(id)).credits(b).end()
				r.release(b)
			}
		})
	}
}

// ack is the receiver's answer to delivery m.id. A late or duplicated answer
// finds nothing in flight and is ignored.
func (r *relay) ack(m *message) {
	w := r.c.w
	batch, ok := r.inFlight[m.id]
	if !ok {
		w.count("relay.stale_ack")
		return
	}
	delete(r.inFlight, m.id)
	if m.ans != nil {
		w.count("relay.failed")
		w.log.begin(w, "relay-failed").s(r.c.name).i(int64(m.id)).s(m.ans.err.Code).end()
		r.release(batch)
		return
	}
	r.delivered(batch, m.deferred)
}

// delivered marks the credits of batch that were not deferred; the deferred
// ones go back to their lane after a backoff that doubles per deferral.
func (r *relay) delivered(batch []model.Credit, deferredIDs []string) {
	c, w := r.c, r.c.w
	done, again := cellrelay.SplitDeferred(batch, deferredIDs)
	if len(done) > 0 {
		c.maybeFailCommit()
		skipped, err := c.store.MarkDelivered(w.ctx, done)
		ln := w.log.begin(w, "mark-delivered").s(c.name).i(int64(len(done)))
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).credits(done).end()
		} else {
			ln.kv("skipped", int64(skipped)).credits(done).end()
		}
		r.release(done)
	}
	for _, cr := range again {
		n := r.deferred[cr.ClaimID] + 1
		r.deferred[cr.ClaimID] = n
		w.count("relay.deferred")
		back := cellrelay.DeferralBackoff(n)
		cr := cr
		c.later(back, func() {
			delete(r.held, cr.ClaimID)
			r.dispatch([]model.Credit{cr})
		})
	}
}

// release lets the next scan or open offer the credits again.
func (r *relay) release(cs []model.Credit) {
	for _, cr := range cs {
		delete(r.held, cr.ClaimID)
	}
}
