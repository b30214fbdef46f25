package relay

// The credits the relay holds: held until credited, acknowledged, let go,
// marked for a read back.

import (
	"time"

	"redcell/internal/invariant"
	"redcell/model"
)

// hold adds cs to what the relay holds, each under its packet's database,
// offered at offered (zero: not yet), and returns those it did not hold
// already. Past HeldMax a database's claims are left to a read from the
// store instead (its position stays below them); leftMS is the creation
// time (Unix ms) of the first credit of cs left out so, -1 when none. read
// tells that cs were read from the store by the running tick (readClaims):
// those acknowledged since it began are not held again. It asserts the
// held count's bounds before and after (checkHeldLocked).
func (r *Relay) hold(cs []model.Credit, offered time.Time, read bool) (out []model.Credit, leftMS int64) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.checkHeldLocked()
	defer r.checkHeldLocked()
	out, leftMS = cs[:0:0], -1
	for _, c := range cs {
		ref, err := model.ParsePacketID(string(c.PacketID))
		if err != nil {
			continue
		}
		t := r.trackLocked(ref.Shard.DB())
		if _, ok := t.pending[c.ClaimID]; ok {
			continue
		}
		if read && r.readAcks[c.ClaimID] {
			continue // delivered while it was read
		}
		if r.held >= r.heldMax {
			r.rereadLocked(t, c.CreatedMS)
			if leftMS < 0 {
				leftMS = c.CreatedMS
			}
			continue
		}
		t.pending[c.ClaimID] = &tracked{c: c, offered: offered}
		t.moved = true
		r.held++
		out = append(out, c)
	}
	return out, leftMS
}

// Came notes claims of database db (their packets') credited in their
// opens' own transactions (model.OpenResult.Credited): the relay holds
// nothing for them, but the database's claims came, so its next save of
// positions moves db's past them, as it would past delivered ones.
func (r *Relay) Came(db int) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.trackLocked(db).moved = true
}

// trackLocked is database db's track, made when missing (its saved
// position not read yet: it reads the claims past it). r.trackMu is held.
func (r *Relay) trackLocked(db int) *dbTrack {
	t, ok := r.dbs[db]
	if !ok {
		t = &dbTrack{pending: map[string]*tracked{}, saved: -1, read: true, again: -1}
		r.dbs[db] = t
	}
	return t
}

// rereadLocked makes t's claims from fromMS on be read from the store
// again: a reading is begun, or the one under way starts again from
// fromMS when that is further back, or else one more follows it (again).
// r.trackMu is held.
func (r *Relay) rereadLocked(t *dbTrack, fromMS int64) {
	t.moved = true // a save must not pass what this is for: it sees the reading (positionLocked)
	switch {
	case !t.read:
		t.read, t.from, t.cursor = true, fromMS, model.ClaimPos{}
	case t.loaded && fromMS < max(t.from, t.cursor.CreatedMS):
		t.from, t.cursor = fromMS, model.ClaimPos{} // the reading under way starts again, further back
	default:
		// The reading under way may have read past these claims' place
		// before they were committed, or stop before them: one more
		// reading follows it unless every page of it began after this ask
		// (readClaims).
		if t.again < 0 || fromMS < t.again {
			t.again = fromMS
		}
		t.againAt = r.clock.Now()
	}
}

// acked forgets credits whose delivery was acknowledged. It asserts the
// held count's bounds after (checkHeldLocked: a credit forgotten twice takes
// it below zero).
func (r *Relay) acked(cs []model.Credit) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	defer r.checkHeldLocked()
	for _, c := range cs {
		if r.readAcks != nil {
			r.readAcks[c.ClaimID] = true
		}
		if t, p := r.heldLocked(c); p != nil {
			delete(t.pending, c.ClaimID)
			t.moved = true
			r.held--
		}
	}
	r.Stats.Relayed.Add(int64(len(cs)))
}

// checkHeldLocked asserts the bounds of the held count: never below zero
// (each credit held is counted once and forgotten once), never above
// HeldMax (hold leaves the rest to a read from the store). r.trackMu is held.
func (r *Relay) checkHeldLocked() {
	invariant.That(r.held >= 0 && r.held <= r.heldMax, "relay: credits held outside 0..HeldMax (held counts each pending credit once)")
}

// heldLocked is c's entry among what the relay holds, with its database's
// track; nil when it is not held. r.trackMu is held.
func (r *Relay) heldLocked(c model.Credit) (*dbTrack, *tracked) {
	ref, err := model.ParsePacketID(string(c.PacketID))
	if err != nil {
		return nil, nil
	}
	t, ok := r.dbs[ref.Shard.DB()]
	if !ok {
		return nil, nil
	}
	return t, t.pending[c.ClaimID]
}

// letGo marks held credits a lane gave up (the relay switched off, the
// claimant's cell changed) to be offered again at the next Interval.
func (r *Relay) letGo(cs []model.Credit) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, c := range cs {
		if _, p := r.heldLocked(c); p != nil {
			p.offered = time.Time{}
		}
	}
}

// MarkDB makes the claims of database db made since since be read from
// the store at the next Interval: a commit whose outcome is unknown may
// have made claims no one handed over (the cell's open path calls it with
// when its batch began, less a margin). The receivers refuse those among
// them that were credited already.
func (r *Relay) MarkDB(db int, since time.Time) {
	from := min(since.UnixMilli(), r.clock.Now().UnixMilli())
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.rereadLocked(r.trackLocked(db), from)
}

// Redrive hands the relay claims reconciliation found uncredited past
// their settle time: held (when not held already) and offered at the next
// Interval, whatever a lane did with them before.
func (r *Relay) Redrive(cs []model.Credit) {
	r.hold(cs, time.Time{}, false)
	r.letGo(cs)
	// Saved now, before reconciliation moves its own position past them: a
	// crash before the next save would otherwise leave them below both.
	r.savePositions(r.life, r.clock.Now())
}

// Held reports how many credits the relay holds (not yet known credited)
// and the creation time (Unix ms) of the oldest; 0 when none. For
// redcell_cell_credits_pending.
func (r *Relay) Held() (n int, oldestMS int64) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, t := range r.dbs {
		for _, p := range t.pending {
			if ms := p.c.CreatedMS; ms > 0 && (oldestMS == 0 || ms < oldestMS) {
				oldestMS = ms
			}
		}
	}
	return r.held, oldestMS
}
