package sim

import (
	"errors"
	"fmt"
	"time"

	cellrelay "redcell/cell/relay"
	"redcell/model"
	"redcell/storage"
)

// relay is the simulator's model of cell/relay for one life of a cell. Its
// claims are its outbox: the fresh claims of the open batches are held in
// memory until a delivery is acknowledged, and split by the cell that owns
// the claimant's wallet into lanes; a lane waits cellrelay.Linger for its
// batch to fill (again while its credits keep coming, as a cellrelay lane
// does, up to cellrelay.LingerMax), then delivers it — the local lane through the cell's own
// store, the others as a credits message to the claimants' cell, which
// applies them and answers. A credit the receiver deferred is tried again
// after a backoff; a delivery with no answer within relayTimeout is given
// up, and the credit offered again at the next tick. Every relayInterval a
// tick reads the saved positions of databases not loaded yet, reads the
// claims past them (after a start, or a commit with an unknown outcome:
// markDB), offers again what no lane holds, and every
// cellrelay.PositionEvery saves per database the position below which
// every claim is credited (never past a held claim, cellrelay.Slack behind
// now). All of it but the saved positions is lost in a crash; the next life
// reads the claims past them again and delivers them (the receivers refuse
// the repeats).
type relay struct {
	c        *cell
	held     map[string]*heldCredit // claims not yet known credited, by claim ID; order lists them
	order    []string               // claim IDs in the order they were held (some forgotten since): iterated instead of held
	dbs      map[int]*dbTrack       // by database of c.dbs; looked up, iterated through c.dbs
	lastSave int64                  // simulated ms of the last save of positions; -1: none yet
	inLane   map[string]bool        // claim IDs in a lane, in flight or waiting out a deferral
	lanes    [cellCount][]model.Credit
	armed    [cellCount]bool           // a flush is scheduled
	armN     [cellCount]int            // the lane's length at its last wait's start (cellrelay.LingerFlow)
	armSince [cellCount]int64          // simulated ms of the lane's first wait since its last flush
	inFlight map[uint64][]model.Credit // deliveries to other cells by ID, awaiting their answer
	deferred map[string]int            // claim ID → times deferred
}

// heldCredit is a credit the relay holds.
type heldCredit struct {
	c       model.Credit
	db      int   // its packet's database
	offered int64 // simulated ms it was last offered to a lane; -1: never, or let go since
}

// dbTrack is what the relay knows of one database's claims (cellrelay's
// dbTrack).
type dbTrack struct {
	loaded bool           // saved was read from the store
	saved  int64          // the position last saved or read (Unix ms); -1: none stored
	moved  bool           // claims came or went since the last save
	read   bool           // the claims past from must be read from the store
	from   int64          // where that reading starts (Unix ms)
	cursor model.ClaimPos // how far it has got (zero: not begun)
}

func newRelay(c *cell) *relay {
	r := &relay{c: c, held: map[string]*heldCredit{}, dbs: map[int]*dbTrack{}, lastSave: -1,
		inLane: map[string]bool{}, inFlight: map[uint64][]model.Credit{}, deferred: map[string]int{}}
	for _, db := range c.dbs {
		r.dbs[db] = &dbTrack{saved: -1, read: true}
	}
	return r
}

// enqueue takes the fresh claims of an open batch (Relay.Enqueue): held,
// and offered to their lanes at once.
func (r *relay) enqueue(credits []model.Credit) {
	r.dispatch(r.hold(credits))
}

// hold adds what it does not hold yet of cs, offered now, and returns it.
func (r *relay) hold(cs []model.Credit) []model.Credit {
	now := r.c.w.now
	var out []model.Credit
	for _, cr := range cs {
		if r.held[cr.ClaimID] != nil {
			continue
		}
		ref, err := model.ParsePacketID(string(cr.PacketID))
		if err != nil {
			panic(fmt.Sprintf("sim: credit of claim %s with a bad packet ID: %v", cr.ClaimID, err))
		}
		db := ref.Shard.DB()
		r.held[cr.ClaimID] = &heldCredit{c: cr, db: db, offered: now}
		r.order = append(r.order, cr.ClaimID)
		if t := r.dbs[db]; t != nil {
			t.moved = true
		}
		out = append(out, cr)
	}
	return out
}

// acked forgets the credits of cs, whose delivery was acknowledged.
func (r *relay) acked(cs []model.Credit) {
	for _, cr := range cs {
		delete(r.inLane, cr.ClaimID)
		delete(r.deferred, cr.ClaimID)
		if h := r.held[cr.ClaimID]; h != nil {
			delete(r.held, cr.ClaimID)
			if t := r.dbs[h.db]; t != nil {
				t.moved = true
			}
		}
	}
	if len(r.order) > 64+2*len(r.held) { // drop the forgotten
		kept := r.order[:0]
		for _, id := range r.order {
			if r.held[id] != nil {
				kept = append(kept, id)
			}
		}
		r.order = kept
	}
}

// release takes cs out of their lanes after a failed or lost delivery: the
// next tick offers them again (Relay.letGo).
func (r *relay) release(cs []model.Credit) {
	for _, cr := range cs {
		delete(r.inLane, cr.ClaimID)
		if h := r.held[cr.ClaimID]; h != nil {
			h.offered = -1
		}
	}
}

// markDB makes the next tick read database db's claims of the last
// cellrelay.Slack (Relay.MarkDB): a commit whose outcome is unknown may
// have made claims no one handed over.
func (r *relay) markDB(db int) {
	w := r.c.w
	t := r.dbs[db]
	if t == nil {
		return
	}
	from := w.timeNow().Add(-cellrelay.Slack).UnixMilli()
	w.count("relay.mark_db")
	w.log.begin(w, "relay-mark-db").s(r.c.name).i(int64(db)).i(from).end()
	switch {
	case !t.read:
		t.read, t.from, t.cursor = true, from, model.ClaimPos{}
	case t.loaded && from < max(t.from, t.cursor.CreatedMS):
		t.from, t.cursor = from, model.ClaimPos{}
	}
}

// tick is one relayInterval's work (Relay.tick).
func (r *relay) tick() {
	r.loadPositions()
	r.readClaims()
	r.reoffer()
	if w := r.c.w; r.lastSave < 0 || w.now-r.lastSave >= cellrelay.PositionEvery.Milliseconds() {
		r.savePositions()
	}
}

// loadPositions reads, in one call, the saved positions of the databases
// not loaded yet: their claims past it are to be read (from the first one
// when none is saved).
func (r *relay) loadPositions() {
	c, w := r.c, r.c.w
	var dbs []int
	for _, db := range c.dbs {
		if !r.dbs[db].loaded {
			dbs = append(dbs, db)
		}
	}
	if len(dbs) == 0 {
		return
	}
	pos, err := storage.RelayPositions(w.ctx, c.store, dbs)
	if err != nil {
		w.count("relay.positions_failed")
		return
	}
	ln := w.log.begin(w, "relay-positions").s(c.name)
	for _, db := range dbs {
		t := r.dbs[db]
		t.loaded, t.saved = true, -1
		from := int64(0)
		if p, ok := pos[db]; ok {
			t.saved, from = p, p
		}
		ln = ln.i(int64(db)).i(t.saved)
		if !t.read || from < max(t.from, t.cursor.CreatedMS) || t.cursor == (model.ClaimPos{}) {
			t.read, t.from, t.cursor = true, from, model.ClaimPos{}
		}
	}
	ln.end()
}

// readClaims reads, for each database whose claims must be read, up to
// cellrelay.ScanPagesMax pages of cellrelay.BatchMax claims past where its
// reading has got, created up to now, holds those it does not hold and
// offers them; a page not full ends the reading.
func (r *relay) readClaims() {
	c, w := r.c, r.c.w
	nowMS := w.timeNow().UnixMilli()
	for _, db := range c.dbs {
		t := r.dbs[db]
		for page := 0; t.loaded && t.read && page < cellrelay.ScanPagesMax; page++ {
			cs, next, err := storage.ClaimsAfter(w.ctx, c.store, db, t.from, t.cursor, nowMS, cellrelay.BatchMax)
			if err != nil {
				w.count("relay.read_failed")
				break
			}
			fresh := r.hold(cs)
			w.count("relay.read")
			w.counts["relay.read_claims"] += int64(len(cs))
			w.log.begin(w, "relay-read").s(c.name).i(int64(db)).i(t.from).i(int64(len(cs))).credits(fresh).end()
			r.dispatch(fresh)
			if len(cs) < cellrelay.BatchMax {
				t.read, t.cursor = false, model.ClaimPos{}
				break
			}
			t.cursor = next
		}
	}
}

// reoffer offers again every held credit no lane holds that was not offered
// for two relayIntervals (or was let go since).
func (r *relay) reoffer() {
	w := r.c.w
	cutoff := w.now - 2*relayInterval.Milliseconds()
	var cs []model.Credit
	for _, id := range r.order {
		h := r.held[id]
		if h == nil || r.inLane[id] || h.offered > cutoff {
			continue
		}
		h.offered = w.now
		cs = append(cs, h.c)
	}
	if len(cs) > 0 {
		w.count("relay.reoffered")
		r.dispatch(cs)
	}
}

// savePositions saves, in one call, the position of every loaded database
// whose claims came or went since the last save (or that has none stored):
// cellrelay.Slack before now, and never past a held claim or one a reading
// under way has not reached.
func (r *relay) savePositions() {
	c, w := r.c, r.c.w
	r.lastSave = w.now
	oldest := map[int]int64{} // by database: the oldest held claim's creation
	for _, id := range r.order {
		if h := r.held[id]; h != nil {
			if o, ok := oldest[h.db]; !ok || h.c.CreatedMS < o {
				oldest[h.db] = h.c.CreatedMS
			}
		}
	}
	pos := map[int]int64{}
	var dbs []int
	for _, db := range c.dbs {
		t := r.dbs[db]
		if !t.loaded || !t.moved { // as cell/relay: a database whose claims never came or went is not saved
			continue
		}
		t.moved = false
		p := w.timeNow().Add(-cellrelay.Slack).UnixMilli()
		if t.read {
			p = min(p, max(t.from, t.cursor.CreatedMS))
		}
		if o, ok := oldest[db]; ok {
			p = min(p, o)
		}
		if p != t.saved {
			pos[db] = p
			dbs = append(dbs, db)
		}
	}
	if len(dbs) == 0 {
		return
	}
	ln := w.log.begin(w, "relay-save").s(c.name)
	for _, db := range dbs {
		ln = ln.i(int64(db)).i(pos[db])
	}
	if err := storage.SaveRelayPositions(w.ctx, c.store, pos); err != nil {
		code, _ := model.CodeOf(err)
		ln.s(code).end()
		w.count("relay.save_failed")
		for _, db := range dbs {
			r.dbs[db].moved = true
		}
		return
	}
	ln.end()
	w.count("relay.saved")
	for _, db := range dbs {
		r.dbs[db].saved = pos[db]
	}
}

// idle tells whether the relay holds nothing and has nothing left to read:
// every database's position loaded and no reading under way.
func (r *relay) idle() bool {
	if len(r.held) > 0 {
		return false
	}
	for _, db := range r.c.dbs {
		if t := r.dbs[db]; !t.loaded || t.read {
			return false
		}
	}
	return true
}

// dispatch puts each credit not already in a lane into its destination's
// lane, split by sharding.Map.GroupByOwner as cell/relay's dispatch splits
// them: the cell's own claimants locally, the others by the cell owning
// their shard.
func (r *relay) dispatch(credits []model.Credit) {
	c, w := r.c, r.c.w
	fresh := make([]model.Credit, 0, len(credits))
	for _, cr := range credits {
		if !r.inLane[cr.ClaimID] { // marked here: a claim listed twice in credits is taken once
			r.inLane[cr.ClaimID] = true
			fresh = append(fresh, cr)
		}
	}
	local, remote, noOwner := w.smap.GroupByOwner(fresh, c.owns)
	if noOwner > 0 { // the simulated map covers every shard: a bug of the simulator
		panic(fmt.Sprintf("sim: %d credits without an owner in the cluster map", noOwner))
	}
	r.enqueueLane(c.idx, local)
	for _, g := range remote {
		r.enqueueLane(w.cellIndex(g.Cell.Name), g.Credits)
	}
}

// enqueueLane adds credits (in a lane already) to lane dest and arms its
// flush after cellrelay.Linger.
func (r *relay) enqueueLane(dest int, credits []model.Credit) {
	if len(credits) == 0 {
		return
	}
	r.lanes[dest] = append(r.lanes[dest], credits...)
	if !r.armed[dest] {
		r.armed[dest] = true
		r.armN[dest], r.armSince[dest] = len(r.lanes[dest]), r.c.w.now
		r.c.later(cellrelay.Linger, func() { r.linger(dest) })
	}
}

// linger ends one of lane dest's waits: as a cellrelay lane, it waits
// cellrelay.Linger again while the last wait brought cellrelay.LingerFlow
// credits or more, up to cellrelay.LingerMax from its first wait (about its
// oldest credit's claim), unless a full batch is held; then it flushes.
func (r *relay) linger(dest int) {
	n := len(r.lanes[dest])
	waited := time.Duration(r.c.w.now-r.armSince[dest]) * time.Millisecond
	if n < cellrelay.BatchMax && n-r.armN[dest] >= cellrelay.LingerFlow && waited+cellrelay.Linger <= cellrelay.LingerMax {
		r.armN[dest] = n
		r.c.later(cellrelay.Linger, func() { r.linger(dest) })
		return
	}
	r.flush(dest)
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

// delivered forgets the credits of batch that were not deferred (their
// delivery is acknowledged); the deferred ones go back to their lane after a
// backoff that doubles per deferral.
func (r *relay) delivered(batch []model.Credit, deferredIDs []string) {
	c, w := r.c, r.c.w
	done, again := cellrelay.SplitDeferred(batch, deferredIDs)
	if len(done) > 0 {
		w.log.begin(w, "relay-acked").s(c.name).i(int64(len(done))).credits(done).end()
		r.acked(done)
	}
	for _, cr := range again {
		n := r.deferred[cr.ClaimID] + 1
		r.deferred[cr.ClaimID] = n
		w.count("relay.deferred")
		back := cellrelay.DeferralBackoff(n)
		cr := cr
		c.later(back, func() {
			delete(r.inLane, cr.ClaimID)
			if r.held[cr.ClaimID] != nil {
				r.dispatch([]model.Credit{cr})
			}
		})
	}
}

// commitUnknown tells whether a failed store call may have committed all the
// same (its COMMIT's answer was lost), as cell/open.go asks before MarkDB.
func commitUnknown(err error) bool {
	return errors.Is(err, storage.ErrCommitUnknown) || errors.Is(err, model.ErrTimeout)
}
