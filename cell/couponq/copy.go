package couponq

import (
	"context"
	"errors"
	"time"

	"redcell/model"
)

// The local copy of each batch's stock, as seed 001 keeps it: the check
// before a deduction need not ask the stock's home every time, nor be
// exact (the deduction decides); its use is to stop, cheaply, requests for
// a batch that has nothing left. Every copyEvery the engine reads the
// stock at its home (Config.Levels) of each batch a request asked about
// within copyActive (a batch nobody asks about is not read: an idle cell
// reads no stock, and a batch's first requests after a quiet spell find no
// copy and go to the queues); a request for a batch whose
// copy shows nothing left and nothing held by deductions is stored already
// refused SOLD_OUT in its accept (model.RefusedAtAccept) and answered at
// once, without a queue. The copy may be late (a request accepted and
// queued while the batch ran out is decided by the merge, which refuses it
// after soldOutTries) or early (a stock raised by a reload reaches the
// copy within copyEvery), never over-issuing: it only refuses.

// Level is a batch's stock at its home: Left, units no deduction holds or
// spent (Total − Outstanding); Held, units open or expired, unsettled
// deductions hold, some of which may come back.
type Level struct {
	Left, Held int64
}

// empty reports whether no unit can reach a request: none left, none that
// a lease may give back.
func (l Level) empty() bool { return l.Left <= 0 && l.Held <= 0 }

// copyEvery is how often the copy is read from the homes: twice a second,
// so that a read that takes a while still leaves the copy younger than a
// second.
const copyEvery = 500 * time.Millisecond

// copyMaxAge is the oldest copy a request is refused by: a home that stops
// answering leaves its batches' requests to the queues.
const copyMaxAge = 2 * time.Second

// copyActive: a batch's copy is kept fresh while a request asked about it
// within this long.
const copyActive = 10 * time.Second

// copied is a batch's level and when it was read.
type copied struct {
	Level
	at time.Time
}

// keepCopy refreshes the copy every copyEvery until ctx ends.
func (e *Engine) keepCopy(ctx context.Context) {
	if e.cfg.Levels == nil {
		return
	}
	for {
		e.refreshCopy(ctx)
		select {
		case <-ctx.Done():
			return
		case <-e.clock.After(copyEvery):
		}
	}
}

// refreshCopy reads, once (Config.Levels), the level of every batch of the
// catalog a request asked about within copyActive; a batch whose home did
// not answer keeps its last level until it is too old.
func (e *Engine) refreshCopy(ctx context.Context) {
	bs := e.catalog().Batches()
	if len(bs) == 0 || e.cfg.Catalog == nil {
		return
	}
	at := e.clock.Now()
	var ids []string
	e.mu.Lock()
	for _, b := range bs {
		if t, ok := e.asked[b.ID]; ok && at.Sub(t) <= copyActive {
			ids = append(ids, b.ID)
		}
	}
	for id, t := range e.asked {
		if at.Sub(t) > copyActive {
			delete(e.asked, id)
		}
	}
	e.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, copyEvery)
	ls, err := e.cfg.Levels(rctx, ids)
	cancel()
	switch {
	case err == nil:
		e.copies.OK()
	case ctx.Err() != nil, errors.Is(err, model.ErrCellUnavailable) && len(ls) == 0:
		// Stopping, or no cell in the map homes the batches yet (a cell
		// starting before the gossip): the queues decide their requests.
	default:
		e.copies.Fail(err, "batches", len(ids)) // logged when it starts, summarized, and when it ends
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, l := range ls {
		e.stock[id] = copied{Level: l, at: at}
	}
}

// CopyOf answers the local copy of batch's stock and whether there is one
// young enough to refuse by.
func (e *Engine) CopyOf(batch string) (Level, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.stock[batch]
	if !ok || e.clock.Now().Sub(c.at) > copyMaxAge {
		return Level{}, false
	}
	return c.Level, true
}

// refusedByCopy reports whether a request of batch is refused at its
// accept: the copy, young enough, shows nothing left and nothing held,
// and issuing is on (while it is off requests wait, accepted, for a fix).
func (e *Engine) refusedByCopy(r model.CouponRequest) bool {
	e.mu.Lock()
	e.asked[r.Batch] = e.clock.Now() // keeps its copy fresh (refreshCopy)
	e.mu.Unlock()
	if e.paused() {
		return false
	}
	l, ok := e.CopyOf(r.Batch)
	return ok && l.empty()
}
