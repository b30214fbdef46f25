package rewards

import (
	"context"
	"fmt"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"redcell/cell/degrade"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// forcedBookingBatch is how many pending rewards forced booking books in
// one transaction; it goes on until none is left (forcedBookingRounds at
// most: 100,000 rewards of one person).
const (
	forcedBookingBatch  = 1000
	forcedBookingRounds = 100
)

// BookPending books every pending reward of actID, of shard sh, in space
// (0 real, 1 shadow) now, ahead of the booker (forced booking: a
// withdrawal's first step, and POST /v1/accounts/{act_id}/book); n is how
// many it booked. Errors: the store's and the committer's (what was booked
// before stays booked), model.ErrOverloaded past forcedBookingRounds
// batches.
func (i *Issuer) BookPending(ctx context.Context, space int, sh model.ShardID, actID string) (n int, err error) {
	total := 0
	for range forcedBookingRounds {
		pend, err := storage.PendingRewardsOf(ctx, i.cfg.Spaces[space].Store, sh, actID, forcedBookingBatch)
		if err != nil || len(pend) == 0 {
			return total, err
		}
		n, err := i.book(ctx, space, pend)
		i.booked[space].Add(int64(n))
		total += n
		if err != nil {
			return total, err
		}
		if len(pend) < forcedBookingBatch {
			return total, nil
		}
	}
	return total, model.Errorf(model.ErrOverloaded, "%s has more than %d rewards pending; retry", actID, forcedBookingBatch*forcedBookingRounds)
}

// Booking: every Config.BookingInterval each space's booker books the
// pending rewards of the cell's databases (those marked dirty by an issue
// here; every database at the first pass, whenever the databases the cell
// serves change, and every bookerScanEvery, for rewards left from before a
// restart, by another owner, or processing for longer than bookerStale by a
// take of an earlier version) in batches, at Config.BookingRate rewards/s.
// The scan of every database asks each one first, with one read
// (storage.RewardsDueQuery), and books only where something is due: an
// idle cell scans once per bookerStale, not every few seconds.
const (
	bookerBatchesMax = 20               // batches of one database in one pass, at most
	bookerStale      = 30 * time.Second // a processing reward this old is taken again
	bookerScanEvery  = bookerStale      // a reward left processing is taken again within two of these
)

// bookingOff reports whether the booking degrade switch is off.
func (i *Issuer) bookingOff() bool { return i.cfg.Switches.Off(degrade.Booking) }

// bookBatches books database db batch after batch while they come back
// full (the limiter paces them), up to bookerBatchesMax a pass: one batch a
// pass would cap a database at booking_batch per booking_interval (100/s by
// default). failed: a batch failed (logged as the booking's incident);
// more: db has more left, or failed, for the next tick. scan: its first
// batch asks first whether db holds anything to book (bookDB).
func (i *Issuer) bookBatches(ctx context.Context, space int, lim *rate.Limiter, db int, scan bool) (failed, more bool) {
	for n := 1; ; n++ {
		done, err := i.bookDB(ctx, space, lim, db, scan && n == 1)
		if err != nil && ctx.Err() == nil {
			failed = true
			i.booking[space].Fail(err, "db", db)
		}
		if done {
			return failed, false
		}
		if err != nil || n == bookerBatchesMax || ctx.Err() != nil || i.bookingOff() {
			return failed, true
		}
	}
}

// booker returns space's booker, the loop "Booking" above tells.
func (i *Issuer) booker(space int) func(ctx context.Context) {
	return func(ctx context.Context) {
		lim := rate.NewLimiter(rate.Limit(i.cfg.BookingRate), i.cfg.BookingBatch)
		lastScan := time.Time{}
		var scanned []int // the databases of the last scan
		dirty := &i.dirty[space]
		// A ticker on the clock: one tick per BookingInterval whatever a
		// pass takes (the booking rate is per interval), not a pause after it.
		tick := clock.NewTicker(i.clock, i.cfg.BookingInterval)
		for tick.Wait(ctx) {
			i.metrics.ticks.WithLabelValues(i.cfg.Spaces[space].Name).Inc()
			if i.bookingOff() {
				continue
			}
			// The databases issues marked come first, and again after each
			// database of a full scan: a scan reads every database the cell
			// owns, one transaction each (100 on a cell that owns every
			// shard, seconds on a busy server), and a reward issued meanwhile
			// must not wait for its end.
			// A database with more left (or that failed) waits for the next
			// tick, as before the scan: one batch per database per tick.
			failed, booked := false, false
			var again []int
			// The switch is read before each database, not once a tick: a
			// scan takes seconds, and a booking switched off meanwhile stops
			// at once (what was marked stays marked for when it is on).
			// scan: the databases come from the scan of every database, not
			// from issues here; each is asked first whether it holds anything
			// to book (bookDB).
			book := func(todo map[int]bool, scan bool) {
				for db := range todo {
					if i.bookingOff() {
						again = append(again, db)
						continue
					}
					booked = true
					f, more := i.bookBatches(ctx, space, lim, db, scan)
					failed = failed || f
					if more {
						again = append(again, db)
					}
				}
			}
			book(dirty.take(), false)
			if now, dbs := i.clock.Now(), i.cfg.Own.DBs(); now.Sub(lastScan) >= bookerScanEvery || !slices.Equal(dbs, scanned) {
				lastScan, scanned = now, dbs
				for _, db := range dbs { // read each tick: moves change them
					if ctx.Err() != nil {
						return
					}
					if i.bookingOff() {
						break
					}
					book(map[int]bool{db: true}, true)
					book(dirty.take(), false)
				}
			}
			for _, db := range again {
				dirty.mark(db) // more left (or failed): next tick
			}
			if !failed && booked {
				i.booking[space].OK()
			}
		}
	}
}

// bookDB books one batch of database db; done is false when a full batch
// was booked (more may wait) or booking failed (err).
//
// The batch is found, locked and booked in one op of the database's commit
// lane (storage.BookOp with a storage.RewardTake: its locking read,
// the wallets' flows and balances and the rows marked booked, in the lane's
// group transaction). The booking rate is paid after: the wait for a
// batch's tokens follows its booking, so a batch never waits holding rows
// (the limiter's burst is one batch, BookingBatch).
//
// A database of the scan (scan set) is asked first, with one read outside
// the lane, whether it holds anything to book (storage.RewardsDueQuery): a
// scan of every database finds nothing in almost all of them, and each
// would otherwise be a group of its lane.
func (i *Issuer) bookDB(ctx context.Context, space int, lim *rate.Limiter, db int, scan bool) (done bool, err error) {
	bctx, cancel := context.WithTimeout(ctx, i.cfg.BookTimeout)
	defer cancel()
	began := i.clock.Now()
	staleMS := began.Add(-bookerStale).UnixMilli()
	sp := i.cfg.Spaces[space]
	if scan {
		if !i.cfg.Own.ServesDB(db) {
			return true, nil
		}
		q := &storage.RewardsDueQuery{DB: db, StaleMS: staleMS}
		if err := sp.Store.Read(bctx, q); err != nil {
			return false, fmt.Errorf("rewards due in db %d: %w", db, err)
		}
		if !q.Due {
			return true, nil
		}
	}
	// Each write is work a move's freeze waits for, and checks the database
	// is still served inside it.
	leave := i.cfg.Own.Enter()
	if !i.cfg.Own.ServesDB(db) {
		leave()
		return true, nil
	}
	op := &storage.BookOp{Take: &storage.RewardTake{DB: db, StaleMS: staleMS, IssuedByMS: began.UnixMilli(), Limit: i.cfg.BookingBatch}}
	if err = i.cfg.SubmitTake(bctx, space, db, op); err == nil {
		err = op.Err
	}
	leave()
	if err != nil {
		return false, fmt.Errorf("book rewards of db %d: %w", db, err)
	}
	n := op.Applied
	if n == 0 {
		return len(op.Deferred) == 0, nil
	}
	i.booked[space].Add(int64(n))
	i.metrics.bookedNow(sp.Name, op.Rewards, n, i.clock.Now())
	if err := lim.WaitN(ctx, n); err != nil {
		return false, nil
	}
	return n < i.cfg.BookingBatch && len(op.Deferred) == 0, nil
}
