package cell

import (
	"context"
	"time"

	"redcell/model"
)

// expiryLoop refunds expired packets: every ExpiryInterval it scans the packet
// tables of the days a still-open packet could have been created on and refunds
// each expired one. Refund locks the packet row, so it serializes with opens.
//
// Beside it, a full scan of all 31 day slots runs 30 s after start and then
// every fullScanInterval, so packets left open by an outage longer than the
// window, or by a shorter packet_expiry, are refunded too.
func (s *Server) expiryLoop(ctx context.Context) {
	full := make(chan struct{})
	go func() { defer close(full); s.fullExpiryLoop(ctx) }()
	defer func() { <-full }()
	every(ctx, s.cfg.ExpiryInterval, func(pass int) {
		days := expiryDays(s.now(), s.cfg.PacketExpiry)
		s.expireOnce(ctx, s.spaces[0], days)
		if pass%shadowEvery == 0 {
			s.expireOnce(ctx, s.spaces[1], days) // stress traffic: scanned less often
		}
	})
}

// shadowEvery: how often (in passes) the shadow tables are scanned too.
const shadowEvery = 4

// fullScanInterval: how often every day slot is scanned.
const fullScanInterval = 10 * time.Minute

func (s *Server) fullExpiryLoop(ctx context.Context) {
	wait := 30 * time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		for _, sp := range s.spaces {
			s.expireOnce(ctx, sp, allDays)
		}
		wait = fullScanInterval
	}
}

var allDays = func() []int {
	d := make([]int, 31)
	for i := range d {
		d[i] = i + 1
	}
	return d
}()

// expiryDays lists the days of month whose tables may hold open packets that
// have expired by now: from two days before the oldest creation time that could
// have expired, to today.
func expiryDays(now time.Time, expiry time.Duration) []int {
	now = now.UTC()
	start := now.Add(-expiry - 24*time.Hour)
	var days []int
	for d := time.Date(start.Year(), start.Month(), start.Day(), 0, 0, 0, 0, time.UTC); !d.After(now); d = d.AddDate(0, 0, 1) {
		days = append(days, d.Day())
	}
	return days
}

// expireOnce runs one pass over the given day slots and returns the cents refunded.
// A scan or refund that fails is tried again at the next pass; each logs
// through its incident tracker (one line when it starts failing, one when
// a pass goes through again).
func (s *Server) expireOnce(ctx context.Context, sp *space, days []int) model.Cents {
	var total model.Cents
	shards := s.cfg.Shards.Shards()
	scan, refund := s.inc.expiryScan[spaceIndex(sp)], s.inc.refund[spaceIndex(sp)]
	scanned, refundFailed := false, false
	defer func() {
		if scanned && !refundFailed && ctx.Err() == nil {
			refund.OK() // every refund this pass found to do went through
		}
	}()
	for round := 0; round < 50 && ctx.Err() == nil; round++ { // 50 x 500 refunds at most per pass
		ids, err := sp.store.ExpiredIn(ctx, shards, days, s.now().UnixMilli(), 500)
		if err != nil {
			if ctx.Err() == nil {
				scan.Fail(err)
			}
			return total
		}
		scan.OK()
		scanned = true
		refunded := 0
		for _, id := range ids {
			ref, err := model.ParsePacketID(string(id))
			if err != nil {
				s.log.Error("bad packet id in table", "id", id)
				continue
			}
			cents, err := sp.store.Refund(ctx, ref)
			if err != nil {
				if ctx.Err() == nil {
					refundFailed = true
					refund.Fail(err, "packet", id)
				}
				continue
			}
			if cents > 0 {
				refunded++
				total += cents
				s.stats.refunds.Add(1)
				s.stats.refundCents.Add(int64(cents))
				sp.closed.put(ref.ID, model.ErrExpired)
				if p, err := sp.store.Packet(ctx, ref); err == nil {
					s.cacheRemaining(sp, p)
				}
			}
		}
		if len(ids) < 500 || refunded == 0 {
			return total
		}
	}
	return total
}
