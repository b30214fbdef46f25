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
// The first pass after start, and every fullScanEvery-th pass, reads all 31 day
// slots instead: packets left open by an outage longer than the window, or by a
// shorter packet_expiry, are refunded too.
func (s *Server) expiryLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ExpiryInterval)
	defer t.Stop()
	for pass := 0; ; pass++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			days := expiryDays(s.now(), s.cfg.PacketExpiry)
			if pass%fullScanEvery == 0 {
				days = allDays
			}
			s.expireOnce(ctx, days)
		}
	}
}

// fullScanEvery: how often (in passes) the expiry scan reads every day slot.
const fullScanEvery = 120

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
func (s *Server) expireOnce(ctx context.Context, days []int) model.Cents {
	now := s.now()
	var total model.Cents
	for _, sh := range s.cfg.Shards.Shards() {
		for _, day := range days {
			ids, err := s.store.ExpiredPackets(ctx, sh, day, now.UnixMilli(), 200)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("expiry scan failed", "shard", sh, "day", day, "err", err)
				}
				continue
			}
			for _, id := range ids {
				ref, err := model.ParsePacketID(string(id))
				if err != nil {
					s.log.Error("bad packet id in table", "id", id)
					continue
				}
				cents, err := s.store.Refund(ctx, ref)
				if err != nil {
					s.log.Warn("refund failed; will retry", "packet", id, "err", err)
					continue
				}
				if cents > 0 {
					total += cents
					s.stats.refunds.Add(1)
					s.closed.put(ref.ID, model.ErrExpired)
					if p, err := s.store.Packet(ctx, ref); err == nil {
						s.cacheRemaining(p)
					}
				}
			}
		}
	}
	return total
}
