package relay

// The relay's positions: where each database's claims were read up to,
// loaded at start, followed, read back and saved.

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

// loadPositions reads the saved position of each database whose position
// is not known yet, in one call; the claims past it are to be read
// (readClaims). A database without one is read from its first claim.
func (r *Relay) loadPositions(ctx context.Context) {
	r.trackMu.Lock()
	var dbs []int
	for db, t := range r.dbs {
		if !t.loaded {
			dbs = append(dbs, db)
		}
	}
	r.trackMu.Unlock()
	if len(dbs) == 0 {
		return
	}
	slices.Sort(dbs)
	pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	pos, err := storage.RelayPositions(pctx, r.cfg.Store, dbs)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.Stats.Errors.Add(1)
			r.saving.Fail(err, "reading", len(dbs))
		}
		return
	}
	// A read that works ends an incident a failed read began: with the
	// positions read back, nothing may be left to save that would end it.
	r.saving.OK()
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, db := range dbs {
		t, ok := r.dbs[db]
		if !ok || t.loaded {
			continue
		}
		t.loaded, t.saved = true, -1
		from := int64(0)
		if p, ok := pos[db]; ok {
			t.saved, from = p, p
		}
		if !t.read || from < max(t.from, t.cursor.CreatedMS) || t.cursor == (model.ClaimPos{}) {
			t.read, t.from, t.cursor = true, from, model.ClaimPos{}
		}
	}
}

// readClaims reads, for each database whose claims must be read, up to
// ScanPagesMax pages of BatchMax claims past where its reading has got,
// created up to now, holds those it does not hold yet and offers them to
// the lanes; a page not full ends the database's reading. It stops reading
// while the relay holds HeldMax credits.
func (r *Relay) readClaims(ctx context.Context, now time.Time) {
	type job struct {
		db     int
		from   int64
		cursor model.ClaimPos
	}
	var jobs []job
	r.trackMu.Lock()
	for db, t := range r.dbs {
		if t.loaded && t.read {
			jobs = append(jobs, job{db, t.from, t.cursor})
		}
	}
	r.trackMu.Unlock()
	slices.SortFunc(jobs, func(a, b job) int { return a.db - b.db })
	ok := true
	for _, j := range jobs {
		for page := 0; page < ScanPagesMax && ctx.Err() == nil; page++ {
			r.trackMu.Lock()
			full := r.held >= r.heldMax
			r.trackMu.Unlock()
			if full {
				break
			}
			pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
			cs, next, err := storage.ClaimsAfter(pctx, r.cfg.Store, j.db, j.from, j.cursor, now.UnixMilli(), BatchMax)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					ok = false
					r.Stats.Errors.Add(1)
					r.reading.Fail(err, "db", j.db)
				}
				break
			}
			r.Stats.Reads.Add(1)
			fresh, leftMS := r.hold(cs, now, true)
			if len(fresh) > 0 {
				r.dispatch(fresh, now)
			}
			done := len(cs) < BatchMax
			r.trackMu.Lock()
			t, same := r.dbs[j.db]
			same = same && t.read && t.from == j.from && t.cursor == j.cursor
			if same {
				if j.cursor == (model.ClaimPos{}) {
					t.began = now // the reading's first page: read after now
				}
				switch {
				case leftMS >= 0: // HeldMax: read again from the first claim left out, once there is room
					t.from, t.cursor = leftMS, model.ClaimPos{}
				case done && t.again >= 0 && !(t.againAt.Before(t.began) && t.again >= t.from):
					// Another reading was asked for meanwhile, for claims
					// committed by then, and some page of this one may
					// have been read before: it runs from there.
					t.from, t.cursor, t.again = t.again, model.ClaimPos{}, -1
				case done:
					// Every ask came before this reading's first page,
					// whose pass began after them: its pages saw those
					// claims (committed by then, stamped before).
					t.read, t.cursor, t.again = false, model.ClaimPos{}, -1
				default:
					t.cursor = next
				}
			}
			r.trackMu.Unlock()
			if done || !same || leftMS >= 0 { // !same: a reading from further back began meanwhile, at the next Interval
				break
			}
			j.cursor = next
		}
	}
	if ok {
		r.reading.OK()
	}
}

// reoffer offers the lanes again every held credit not offered for
// reofferIntervals Intervals (no lane took it, or a lane gave it up); a lane
// that holds it already skips it. As it walks every held credit anyway, it
// asserts that the held count is what is pending: held = Σ len(pending).
func (r *Relay) reoffer(now time.Time) {
	cutoff := now.Add(-reofferIntervals * r.cfg.Interval)
	var cs []model.Credit
	r.trackMu.Lock()
	pending := 0
	for _, t := range r.dbs {
		pending += len(t.pending)
		for _, p := range t.pending {
			if p.offered.IsZero() || !p.offered.After(cutoff) {
				p.offered = now
				cs = append(cs, p.c)
			}
		}
	}
	invariant.That(pending == r.held, "relay: the held count differs from the credits pending (held = Σ len(pending) over the databases)")
	r.trackMu.Unlock()
	if len(cs) > 0 {
		slices.SortFunc(cs, func(a, b model.Credit) int { return cmp.Compare(a.CreatedMS, b.CreatedMS) })
		r.dispatch(cs, now)
	}
}

// positionLocked is database t's position at now: Slack before now, and
// never past a claim the relay holds or one a reading under way has not
// reached. r.trackMu is held.
func positionLocked(t *dbTrack, now time.Time) int64 {
	p := now.Add(-Slack).UnixMilli()
	if t.read {
		p = min(p, max(t.from, t.cursor.CreatedMS))
	}
	if t.again >= 0 {
		p = min(p, t.again)
	}
	for _, c := range t.pending {
		p = min(p, c.c.CreatedMS)
	}
	return p
}

// savePositions saves, in one call, the position of every database whose
// position is known and whose claims came or went since the last save
// (never of a database without claims: a save would make its tables),
// inside Config.Enter for those databases (a move's freeze waits for it),
// and only of those the cell still serves then.
func (r *Relay) savePositions(ctx context.Context, now time.Time) {
	r.saveMu.Lock() // one save at a time: a later one never lands before an earlier one
	defer r.saveMu.Unlock()
	pos := map[int]int64{}
	r.trackMu.Lock()
	r.lastSave = now
	for db, t := range r.dbs {
		if t.loaded && t.moved { // a database whose claims never came or went keeps what it has (or none: it is read from its first claim, of which it has none)
			if p := positionLocked(t, now); p != t.saved {
				pos[db] = p
			}
			t.moved = false
		}
	}
	r.trackMu.Unlock()
	if len(pos) == 0 {
		return
	}
	dbs := slices.Sorted(maps.Keys(pos))
	if r.cfg.Enter != nil {
		leave := r.cfg.Enter(dbs)
		defer leave()
	}
	var skipped []int
	for _, db := range dbs {
		if !r.cfg.Owns(model.ShardID(db * 10)) {
			delete(pos, db)
			skipped = append(skipped, db)
		}
	}
	if len(skipped) > 0 { // frozen for a move, say: saved once served again (follow forgets it if it goes)
		r.trackMu.Lock()
		for _, db := range skipped {
			if t, ok := r.dbs[db]; ok {
				t.moved = true
			}
		}
		r.trackMu.Unlock()
	}
	if len(pos) == 0 {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	err := storage.SaveRelayPositions(sctx, r.cfg.Store, pos)
	cancel()
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			r.Stats.Errors.Add(1)
			r.saving.Fail(err, "databases", len(pos))
		}
		for db := range pos {
			if t, ok := r.dbs[db]; ok {
				t.moved = true // saved at the next try
			}
		}
		return
	}
	r.saving.OK()
	r.Stats.Saves.Add(1)
	for db, p := range pos {
		if t, ok := r.dbs[db]; ok {
			t.saved = p
		}
	}
}
