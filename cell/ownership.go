package cell

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
)

// ownState is one immutable view of what the cell owns: its ranges, the map
// version it announces them with, and the databases it holds but no longer
// serves (frozen: a move's last moments, see ownership.freeze).
type ownState struct {
	ranges  sharding.Ranges
	version int64
	owned   [model.ShardCount]bool
	frozen  [model.DBCount]bool
	held    []int // the owned databases, ascending (frozen ones included)
}

func newOwnState(ranges sharding.Ranges, version int64, frozen [model.DBCount]bool) *ownState {
	st := &ownState{ranges: ranges, version: version}
	for _, sh := range ranges.Shards() {
		st.owned[sh] = true
	}
	for db := 0; db < model.DBCount; db++ {
		if st.owned[db*model.ShardsPerDB] {
			st.held = append(st.held, db)
			st.frozen[db] = frozen[db]
		}
	}
	return st
}

// ownership is which shards this cell owns, and the checks of the keys in a
// request against it. It changes only through a move (freeze, release, adopt;
// cell/moves), each change a new ownState swapped in whole, so a reader
// sees one consistent view without a lock. Safe for concurrent use.
type ownership struct {
	cell string // this cell's name, for the errors
	st   atomic.Pointer[ownState]
	mu   sync.Mutex // serializes changes
	work epochs     // work in flight that may write any database (see enter)
	// dbWork is work in flight confined to one database (see enterDB).
	dbWork [model.DBCount]epochs
	// clock paces a drain's looks (the system clock; the Server sets its
	// own before the ownership is used).
	clock clock.Clock
}

func newOwnership(cell string, shards sharding.Ranges, version int64) *ownership {
	o := &ownership{cell: cell, clock: clock.Real{}}
	o.st.Store(newOwnState(shards, version, [model.DBCount]bool{}))
	o.work.init()
	for i := range o.dbWork {
		o.dbWork[i].init()
	}
	return o
}

// owns reports whether this cell owns shard sh and serves it now (its
// database is not frozen by a move).
func (o *ownership) owns(sh model.ShardID) bool {
	st := o.st.Load()
	return sh.Valid() && st.owned[sh] && !st.frozen[sh.DB()]
}

// check returns nil when the cell serves shard sh, ErrMoving when it owns it
// but its database is frozen by a move, else ErrWrongCell.
func (o *ownership) check(sh model.ShardID) error {
	st := o.st.Load()
	switch {
	case !sh.Valid() || !st.owned[sh]:
		return o.wrongCell(sh)
	case st.frozen[sh.DB()]:
		return model.Errorf(model.ErrMoving, "shard %d: db_%02d is moving from %s to another cell", sh, sh.DB(), o.cell)
	}
	return nil
}

// dbs lists the databases the cell serves now, ascending: owned, not frozen.
// Background work (relay scans, expiry, coupon feeders, bookings, the
// archiver) takes this list at the start of each pass.
func (o *ownership) dbs() []int {
	st := o.st.Load()
	out := make([]int, 0, len(st.held))
	for _, db := range st.held {
		if !st.frozen[db] {
			out = append(out, db)
		}
	}
	return out
}

// shards lists the shards the cell serves now, ascending.
func (o *ownership) shards() []model.ShardID {
	var out []model.ShardID
	for _, db := range o.dbs() {
		for sh := db * model.ShardsPerDB; sh < (db+1)*model.ShardsPerDB; sh++ {
			out = append(out, model.ShardID(sh))
		}
	}
	return out
}

// ranges returns the ranges the cell owns (frozen databases included: it
// announces them until the move hands them over) and their map version.
func (o *ownership) ranges() (sharding.Ranges, int64) {
	st := o.st.Load()
	return st.ranges, st.version
}

// rangesString is the owned ranges in config form ("" when none).
func (o *ownership) rangesString() string { return o.st.Load().ranges.String() }

// frozenDBs lists the databases frozen now.
func (o *ownership) frozenDBs() []int {
	st := o.st.Load()
	var out []int
	for _, db := range st.held {
		if st.frozen[db] {
			out = append(out, db)
		}
	}
	return out
}

// setFrozen freezes (on) or thaws database db. Errors: the cell does not own db.
func (o *ownership) setFrozen(db int, on bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.st.Load()
	if db < 0 || db >= model.DBCount || !st.owned[db*model.ShardsPerDB] {
		return model.Errorf(model.ErrWrongCell, "db_%02d is not owned by %s", db, o.cell)
	}
	frozen := st.frozen
	frozen[db] = on
	o.st.Store(newOwnState(st.ranges, st.version, frozen))
	return nil
}

// set replaces the owned databases and the version (a move's release or
// adoption); frozen databases the cell keeps stay frozen.
func (o *ownership) set(dbs []int, version int64) (sharding.Ranges, error) {
	ranges, err := sharding.RangesOfDBs(dbs)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.st.Store(newOwnState(ranges, version, o.st.Load().frozen))
	return ranges, nil
}

// holdsDB reports whether the cell owns database db, frozen or not.
func (o *ownership) holdsDB(db int) bool {
	return db >= 0 && db < model.DBCount && o.st.Load().owned[db*model.ShardsPerDB]
}

// servesDB reports whether the cell serves database db now: owned, not frozen.
func (o *ownership) servesDB(db int) bool {
	st := o.st.Load()
	return db >= 0 && db < model.DBCount && st.owned[db*model.ShardsPerDB] && !st.frozen[db]
}

// held lists every database the cell owns, frozen ones included.
func (o *ownership) held() []int { return slices.Clone(o.st.Load().held) }

// enter registers work that may write any of the cell's databases (a relay
// delivery, an expiry pass, a request whose databases are known only inside
// its handler). The work checks ownership after enter (owns, check) and
// calls leave when it is done; a freeze waits for all work that entered
// before it (drain), so none that checked before the freeze writes after it.
func (o *ownership) enter() (leave func()) { return o.work.enter() }

// enterDB registers work that writes database db only (an open batch, a
// send or a deposit of one account, a group commit's share of db): as enter,
// but only a freeze of db waits for it. The work may check only shards of
// db after it: a check of another database's shard needs enter, or that
// database's enterDB.
func (o *ownership) enterDB(db int) (leave func()) {
	if db < 0 || db >= model.DBCount {
		return o.work.enter() // not a database: checks fail anyway
	}
	return o.dbWork[db].enter()
}

// enterServed registers background work about to write database db (an
// archive or export step) as work a move's freeze drains, when the cell
// serves db now; ok false (not served, or frozen) registers nothing.
func (o *ownership) enterServed(db int) (leave func(), ok bool) {
	leave = o.enterDB(db)
	if !o.servesDB(db) {
		leave()
		return nil, false
	}
	return leave, true
}

// enterDBs is enterDB for each of dbs (in any order, repeats allowed).
func (o *ownership) enterDBs(dbs []int) (leave func()) {
	var seen [model.DBCount]bool
	leaves := make([]func(), 0, len(dbs))
	for _, db := range dbs {
		if db >= 0 && db < model.DBCount && seen[db] {
			continue
		}
		if db >= 0 && db < model.DBCount {
			seen[db] = true
		}
		leaves = append(leaves, o.enterDB(db))
	}
	return func() {
		for _, l := range leaves {
			l()
		}
	}
}

// drain waits until every work entered before the call (enter, and
// enterDB of db) has left, or ctx ends.
func (o *ownership) drain(ctx context.Context, db int) error {
	if db < 0 || db >= model.DBCount {
		return drainAll(ctx, o.clock, &o.work)
	}
	return drainAll(ctx, o.clock, &o.work, &o.dbWork[db])
}

// epochs counts work in flight by generation: enter joins the current one,
// drain starts a new one and waits for the older ones to empty, without
// blocking the work that enters meanwhile. A generation a drain gave up on
// (its ctx ended) stays pending: the next drain waits for it too, so work
// that checked before a failed freeze never writes after a later one.
type epochs struct {
	cur     atomic.Pointer[epoch]
	mu      sync.Mutex // one drain at a time; guards pending
	pending []*epoch   // older generations not seen empty yet
}

type epoch struct {
	n     atomic.Int64
	leave func()
}

func newEpoch() *epoch {
	e := &epoch{}
	e.leave = func() { e.n.Add(-1) }
	return e
}

func (w *epochs) init() { w.cur.Store(newEpoch()) }

func (w *epochs) enter() func() {
	for {
		e := w.cur.Load()
		e.n.Add(1)
		if w.cur.Load() == e {
			return e.leave
		}
		e.n.Add(-1) // a drain began meanwhile: join the new generation
	}
}

// drainAll starts a new generation in each of ws at once, then waits until
// the older ones (pending ones included) are empty, looking every
// millisecond on c.
func drainAll(ctx context.Context, c clock.Clock, ws ...*epochs) error {
	for _, w := range ws {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.pending = append(w.pending, w.cur.Swap(newEpoch()))
	}
	for _, w := range ws {
		for len(w.pending) > 0 {
			if w.pending[0].n.Load() == 0 {
				w.pending = w.pending[1:]
				continue
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-c.After(time.Millisecond):
			}
		}
		w.pending = nil // the emptied ones, for the collector
	}
	return nil
}

// wrongCell is the error of a key of a shard another cell owns.
func (o *ownership) wrongCell(sh model.ShardID) error {
	return model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", sh, o.cell)
}

// account validates an act_id from the path and checks this cell serves its
// shard. Errors: ErrInvalidArgument, ErrWrongCell, ErrMoving.
func (o *ownership) account(actID string) (model.ShardID, error) {
	if err := model.ValidateActID(actID); err != nil {
		return 0, err
	}
	sh := sharding.ShardOfAct(actID)
	if err := o.check(sh); err != nil {
		return 0, err
	}
	return sh, nil
}

// identity splits and validates the app account of an identity path
// ("{app}/{app_user_id}") and checks this cell serves its home shard
// (sharding.ShardOfIdentity). Errors: ErrInvalidArgument, ErrWrongCell,
// ErrMoving.
func (o *ownership) identity(key string) (sh model.ShardID, app, appUserID string, err error) {
	app, appUserID, err = api.SplitIdentityKey(key)
	if err != nil {
		return 0, "", "", err
	}
	sh = sharding.ShardOfIdentity(app, appUserID)
	if err := o.check(sh); err != nil {
		return 0, "", "", err
	}
	return sh, app, appUserID, nil
}

// packetRef parses a packet ID from the path and checks this cell serves its
// shard. Errors: ErrInvalidArgument, ErrWrongCell, ErrMoving.
func (o *ownership) packetRef(id string) (model.PacketRef, error) {
	ref, err := model.ParsePacketID(id)
	if err != nil {
		return ref, err
	}
	if err := o.check(ref.Shard); err != nil {
		return ref, err
	}
	return ref, nil
}

// decodeCredits reads the body of /internal/credits and /internal/recon
// ({"credits": [...]}, strict) and checks every credit: each names a claim of
// its packet and a claimant of a shard this cell serves. Errors:
// ErrInvalidArgument, ErrWrongCell, ErrMoving.
func (o *ownership) decodeCredits(body []byte) ([]model.Credit, error) {
	var req api.CreditsRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, err
	}
	if len(req.Credits) > creditsPerCallMax {
		return nil, model.Invalidf("at most %d credits per call", creditsPerCallMax)
	}
	for _, c := range req.Credits {
		if err := o.validCredit(c); err != nil {
			return nil, err
		}
	}
	return req.Credits, nil
}

// decodeRecon decodes a POST /internal/recon body: its credits, checked as
// decodeCredits checks them, and whether it asks about copies (api.ReconRequest.Copy),
// whose credits need not be of shards the cell owns now.
func (o *ownership) decodeRecon(body []byte) (credits []model.Credit, copied bool, err error) {
	var req api.ReconRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, false, err
	}
	if len(req.Credits) > creditsPerCallMax {
		return nil, false, model.Invalidf("at most %d credits per call", creditsPerCallMax)
	}
	for _, c := range req.Credits {
		if err := o.validCreditOf(c, !req.Copy); err != nil {
			return nil, false, err
		}
	}
	return req.Credits, req.Copy, nil
}

func (o *ownership) validCredit(c model.Credit) error { return o.validCreditOf(c, true) }

// validCreditOf checks a credit's fields, and with owned that this cell owns
// its claimant's shard now.
func (o *ownership) validCreditOf(c model.Credit, owned bool) error {
	ref, _, err := model.ParseClaimID(c.ClaimID)
	if err != nil {
		return err
	}
	if ref.ID != c.PacketID {
		return model.Invalidf("claim %s does not belong to packet %s", c.ClaimID, c.PacketID)
	}
	if err := model.ValidateActID(c.ActID); err != nil {
		return err
	}
	if sharding.ShardOfAct(c.ActID) != c.Shard {
		return model.Invalidf("credit shard %d does not match act_id", c.Shard)
	}
	if !c.Shard.Valid() {
		return model.Invalidf("credit shard %d out of range", c.Shard)
	}
	if owned {
		if err := o.check(c.Shard); err != nil {
			return err
		}
	}
	if c.Amount < 1 {
		return model.Invalidf("credit amount must be >= 1")
	}
	return nil
}
