package sim

import (
	"redcell/api"
	cellrelay "redcell/cell/relay"
	"redcell/model"
	"redcell/storage"
)

// The model cell's open path: the opens of a packet wait for its batch and
// are answered from the batch's open op, or from its closed set.

// flushOpens opens a packet for the opens that waited for its batch, in
// batches of openBatchMax, as the cell's batched strategy does (or, when the
// run is Grouped, as strategy grouped does: each batch an op in the packet
// database's lane).
func (c *cell) flushOpens(id model.PacketID) {
	oq := c.opens[id]
	if c.w.cfg.Grouped {
		if oq != nil && !c.openBusy[id] { // a batch in flight takes these when it is answered
			c.openNext(id, oq)
		}
		return
	}
	delete(c.opens, id)
	for len(oq.waiting) > 0 {
		if final := c.closed[id]; final != nil {
			c.answerClosed(oq, final)
			return
		}
		n := min(len(oq.waiting), openBatchMax)
		batch := oq.waiting[:n:n]
		oq.waiting = oq.waiting[n:]
		reqs := make([]model.OpenRequest, n)
		for i, wt := range batch {
			reqs[i] = wt.req
		}
		op := &storage.OpenOp{Ref: oq.ref, Reqs: reqs, Rand: c.rng}
		c.commit(oq.ref.Shard.DB(), op, func(err error) { c.opened(oq.ref, batch, op, err) })
	}
}

// openNext hands the packet's next batch to its lane, Grouped: one batch of
// a packet in flight at a time, the next taken when it is answered, as the
// cell's packet worker does (so a group holds at most one op per packet).
func (c *cell) openNext(id model.PacketID, oq *openQueue) {
	if final := c.closed[id]; final != nil {
		delete(c.opens, id)
		c.answerClosed(oq, final)
		return
	}
	n := min(len(oq.waiting), openBatchMax)
	batch := oq.waiting[:n:n]
	oq.waiting = oq.waiting[n:]
	if len(oq.waiting) == 0 {
		delete(c.opens, id)
	}
	reqs := make([]model.OpenRequest, n)
	for i, wt := range batch {
		reqs[i] = wt.req
	}
	c.openBusy[id] = true
	op := &storage.OpenOp{Ref: oq.ref, Reqs: reqs, Rand: c.rng}
	c.commit(oq.ref.Shard.DB(), op, func(err error) {
		delete(c.openBusy, id)
		c.opened(oq.ref, batch, op, err)
		if next := c.opens[id]; next != nil {
			c.openNext(id, next)
		}
	})
}

// opened answers the opens of one batch.
func (c *cell) opened(ref model.PacketRef, batch []openWaiter, op *storage.OpenOp, err error) {
	w, id, reqs := c.w, ref.ID, op.Reqs
	if err != nil {
		code, _ := model.CodeOf(err)
		w.log.begin(w, "open-batch").s(c.name).s(string(id)).i(int64(len(batch))).s(code).end()
		w.check.openFailed(ref)
		if commitUnknown(err) {
			// The claims may be committed though no answer says so (as
			// cell/open.go): the relay reads the database's recent claims.
			c.relay.markDB(ref.Shard.DB())
		}
		for _, wt := range batch {
			c.reply(wt.id, errAnswer(err))
		}
		return
	}
	results, p := op.Results, op.Packet
	for i, r := range results {
		ln := w.log.begin(w, "open").s(c.name).s(string(id)).s(reqs[i].ActID)
		if r.Err != nil {
			code, _ := model.CodeOf(r.Err)
			ln.s(code).end()
			c.reply(batch[i].id, errAnswer(r.Err))
			continue
		}
		ln.s(r.Claim.ID).i(int64(r.Claim.Amount)).kv("repeat", b2i(r.Repeat)).end()
		c.reply(batch[i].id, &answer{open: openAnswer(r.Claim, r.Repeat)})
	}
	w.check.opened(c, ref, reqs, results, p)
	fresh := cellrelay.NewCredits(results) // as cell/open.go afterOpen
	w.counts["open.claim"] += int64(len(fresh))
	c.relay.enqueue(fresh)
	c.noteClosed(p)
}

// noteClosed remembers a packet an open batch left in a final state
// (model.FinalErr), as cell/open.go afterOpen does.
func (c *cell) noteClosed(p model.Packet) {
	if final := model.FinalErr(p, c.w.timeNow().UnixMilli()); final != nil {
		c.close(p.ID, final)
	}
}

func (c *cell) close(id model.PacketID, final error) {
	if len(c.closed) >= closedMax {
		c.closed = map[model.PacketID]error{}
	}
	c.closed[id] = final
}

// openAnswer is the answer to an open that got claim cl (cell/open.go's
// writeOpen renders the same fields by hand).
func openAnswer(cl model.Claim, repeat bool) api.OpenResponse {
	return api.OpenResponse{ClaimID: cl.ID, PacketID: string(cl.PacketID), ActID: cl.ActID, Amount: int64(cl.Amount),
		Seq: cl.Seq, Repeat: repeat}
}

// answerClosed answers every open waiting for a closed packet as
// cell/open.go answerClosed does: the earlier claim of a user who has one
// (ClaimsOf, without a batch), else the packet's final error
// (model.ClosedResults).
func (c *cell) answerClosed(oq *openQueue, final error) {
	w := c.w
	reqs := make([]model.OpenRequest, len(oq.waiting))
	for i, wt := range oq.waiting {
		reqs[i] = wt.req
	}
	earlier, err := storage.ClaimsOf(w.ctx, c.store, oq.ref, reqs)
	if err != nil {
		for _, wt := range oq.waiting {
			c.reply(wt.id, errAnswer(err))
		}
		return
	}
	results := model.ClosedResults(reqs, earlier, final)
	for i, r := range results {
		ln := w.log.begin(w, "open-closed").s(c.name).s(string(oq.ref.ID)).s(reqs[i].ActID)
		if r.Err != nil {
			code, _ := model.CodeOf(r.Err)
			ln.s(code).end()
			c.reply(oq.waiting[i].id, errAnswer(r.Err))
			continue
		}
		ln.s(r.Claim.ID).i(int64(r.Claim.Amount)).kv("repeat", 1).end()
		c.reply(oq.waiting[i].id, &answer{open: openAnswer(r.Claim, true)})
	}
	w.count("open.closed_answers")
	w.check.openedClosed(c, oq.ref, reqs, results)
}
