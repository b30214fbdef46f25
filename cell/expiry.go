package cell

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// expirer refunds expired packets in both spaces. It shares with the open
// path only what a refund changes: each space's closed-packet set and the
// grab cache.
type expirer struct {
	spaces [2]*space
	shards func() []model.ShardID // the shards the cell serves now, read each pass
	own    *ownership             // a packet whose shard the cell no longer serves is skipped
	// refund refunds one packet through the group committer (writer.refundGrouped),
	// which registers the write and checks the packet's shard is still
	// served: the cents refunded and the packet as the refund left it.
	refund       func(ctx context.Context, sp *space, ref model.PacketRef) (model.Cents, model.Packet, error)
	interval     time.Duration // Config.ExpiryInterval
	packetExpiry time.Duration // Config.PacketExpiry
	cache        *grabCache    // nil: none
	clock        clock.Clock
	log          *slog.Logger
	inc          *incidents

	refunds, refundCents atomic.Int64 // since the start
}

// run refunds expired packets until ctx ends: every ExpiryInterval it scans the packet
// tables of the days a still-open packet could have been created on and refunds
// each expired one. A refund locks the packet row, so it serializes with opens.
//
// Beside it, a full scan of all 31 day slots runs 30 s after start and then
// every fullScanInterval, so packets left open by an outage longer than the
// window, or by a shorter packet_expiry, are refunded too.
func (e *expirer) run(ctx context.Context) {
	full := make(chan struct{})
	go func() { defer close(full); e.runFull(ctx) }()
	defer func() { <-full }()
	clock.Every(ctx, e.clock, e.interval, func(pass int) {
		days := model.ExpiryDays(e.clock.Now(), e.packetExpiry)
		e.once(ctx, e.spaces[0], days)
		if pass%shadowEvery == 0 {
			e.once(ctx, e.spaces[1], days) // stress traffic: scanned less often
		}
	})
}

// refundsInFlight bounds the refunds of one pass waiting in the group
// committer at once.
const refundsInFlight = 64

// shadowEvery: how often (in passes) the shadow tables are scanned too.
const shadowEvery = 4

// fullScanInterval: how often every day slot is scanned.
const fullScanInterval = 10 * time.Minute

// runFull scans every day slot 30 s after start, then every fullScanInterval.
func (e *expirer) runFull(ctx context.Context) {
	wait := 30 * time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.clock.After(wait):
		}
		for _, sp := range e.spaces {
			e.once(ctx, sp, model.AllDays())
		}
		wait = fullScanInterval
	}
}

// once runs one pass over the given day slots and returns the cents refunded.
// A scan or refund that fails is tried again at the next pass; each logs
// through its incident tracker (one line when it starts failing, one when
// a pass goes through again).
func (e *expirer) once(ctx context.Context, sp *space, days []int) model.Cents {
	var total model.Cents
	shards := e.shards()
	if len(shards) == 0 {
		return 0
	}
	scan, refund := e.inc.expiryScan[sp.index()], e.inc.refund[sp.index()]
	scanned, refundFailed := false, false
	defer func() {
		if scanned && !refundFailed && ctx.Err() == nil {
			refund.OK() // every refund this pass found to do went through
		}
	}()
	for round := 0; round < 50 && ctx.Err() == nil; round++ { // 50 x 500 refunds at most per pass
		ids, err := storage.ExpiredIn(ctx, sp.store, shards, days, e.clock.Now().UnixMilli(), 500)
		if err != nil {
			if ctx.Err() == nil {
				scan.Fail(err)
			}
			return total
		}
		scan.OK()
		scanned = true
		// The round's refunds go to the group committer together (at most
		// refundsInFlight at a time), so they share its transactions.
		var (
			mu       sync.Mutex
			wg       sync.WaitGroup
			refunded int
			slots    = make(chan struct{}, refundsInFlight)
		)
		for _, id := range ids {
			ref, err := model.ParsePacketID(string(id))
			if err != nil {
				e.log.Error("bad packet id in table", "id", id)
				continue
			}
			if !e.own.owns(ref.Shard) { // frozen or handed over by a move since the scan
				continue
			}
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				cents, p, err := e.refund(ctx, sp, ref)
				if errors.Is(err, model.ErrMoving) || errors.Is(err, model.ErrWrongCell) {
					return // frozen or handed over since the check: the next owner refunds it
				}
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						refundFailed = true
						mu.Unlock()
						refund.Fail(err, "packet", id)
					}
					return
				}
				if cents == 0 {
					return
				}
				mu.Lock()
				refunded++
				total += cents
				mu.Unlock()
				e.refunds.Add(1)
				e.refundCents.Add(int64(cents))
				sp.closed.put(ref.ID, model.ErrExpired)
				e.cache.set(sp, p)
			}()
		}
		wg.Wait()
		if len(ids) < 500 || refunded == 0 {
			return total
		}
	}
	return total
}
