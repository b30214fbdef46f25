package moves

// The moves loop (Run): the marks a restart left, freezes past their time,
// databases the map gives to other cells, and the copies handed over
// dropped once their grace has passed.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"redcell/model"
	"redcell/storage"
)

// Run resumes what a restart interrupted (databases frozen when the
// cell stopped start frozen again), thaws freezes past their time, and drops
// the copies of databases handed over once MoveGrace has passed and the copy
// is unchanged.
func (s *Steps) Run(ctx context.Context) {
	if s.store == nil {
		return
	}
	for ctx.Err() == nil {
		s.movesPass(ctx)
		s.dropDue(ctx)
		s.cfg.Metrics.Passes.Inc()
		select {
		case <-ctx.Done():
		case <-s.clock.After(movesTick):
		}
	}
}

// LoadMarks freezes again the databases a restart interrupted in their
// freeze, before the cell serves anything (Serve calls it first); if the
// marks cannot be read now, Run applies them at its first pass.
func (s *Steps) LoadMarks(ctx context.Context) {
	if s.store == nil {
		return
	}
	s.steps.Lock()
	defer s.steps.Unlock()
	mctx, cancel := context.WithTimeout(ctx, time.Second) // a database down: Run applies them once it answers
	defer cancel()
	if mos, err := s.store.MovedOuts(mctx, s.cfg.Cell); err == nil {
		s.applyMarksLocked(mos)
	}
}

// applyMarksLocked freezes again each database held here whose record says
// a freeze was under way (no digest yet), sealed as the record says. The
// caller holds the steps.
func (s *Steps) applyMarksLocked(mos []storage.MovedOut) {
	s.loaded = true
	now := s.clock.Now()
	for _, mo := range mos {
		if mo.Digest == "" && s.holds(mo.DB) {
			s.log.Warn("move: database was frozen when the cell stopped; frozen again", "db", mo.DB, "sealed", mo.Version > 0)
			_ = s.own.SetFrozen(mo.DB, true)
			s.mu.Lock()
			s.frozenUntil[mo.DB] = now.Add(freezeTTLDefault)
			if mo.Version > 0 {
				s.sealed[mo.DB] = mo.Version
			}
			s.mu.Unlock()
		}
	}
}

// movesPass ends the freezes past their time and lists the copies due for
// a drop (dropDue). It reads the records before it takes the steps, so a
// freeze does not wait for that read, and reads them again under the steps
// only where it changes one.
func (s *Steps) movesPass(ctx context.Context) {
	mos, err := s.store.MovedOuts(ctx, s.cfg.Cell)
	if err != nil {
		return
	}
	s.steps.Lock()
	defer s.steps.Unlock()
	now := s.clock.Now()
	if !s.loaded {
		if mos, err = s.store.MovedOuts(ctx, s.cfg.Cell); err != nil {
			return
		}
		s.applyMarksLocked(mos)
	}
	s.mu.Lock()
	var expired []int
	for db, until := range s.frozenUntil {
		if !now.Before(until) {
			expired = append(expired, db)
		}
	}
	s.mu.Unlock()
	for _, db := range expired {
		if !s.dbSteps[db].TryLock() { // a step on it waits for the cell's steps: the next pass
			continue
		}
		s.freezeExpired(ctx, db)
		s.dbSteps[db].Unlock()
	}
	if dbs := s.ownedElsewhere(); len(dbs) > 0 {
		s.yield(ctx, dbs)
	}
	stale := false
	for _, mo := range mos {
		if mo.Digest == "" || now.Before(time.UnixMilli(mo.ReleasedMS).Add(s.cfg.Grace)) {
			continue
		}
		if s.holds(mo.DB) { // owned again (moved back): its record is stale, never its data
			stale = true
			continue
		}
		s.mu.Lock()
		t, changed := s.changedAt[mo.DB]
		s.mu.Unlock()
		if changed && now.Sub(t) < time.Hour { // found changed: compared again hourly, not each second
			continue
		}
		s.due = append(s.due, mo) // dropCopy checks the record again
	}
	if !stale {
		return
	}
	if mos, err = s.store.MovedOuts(ctx, s.cfg.Cell); err != nil {
		return
	}
	for _, mo := range mos {
		if mo.Digest != "" && s.holds(mo.DB) {
			_ = s.store.ForgetMovedOut(ctx, s.cfg.Cell, mo.DB)
		}
	}
}

// dropDue drops the copies movesPass found due, each digest read and each
// drop made without holding the steps (a freeze waits for neither), the
// drop under its database's dbSteps, if the record is still there and the
// database still not held.
func (s *Steps) dropDue(ctx context.Context) {
	s.steps.Lock()
	due := s.due
	s.due = nil
	s.steps.Unlock()
	for _, mo := range due {
		d, err := s.store.Digest(ctx, mo.DB)
		if err != nil {
			continue
		}
		s.dbSteps[mo.DB].Lock()
		s.dropCopy(ctx, mo, d)
		s.dbSteps[mo.DB].Unlock()
	}
}

// ownedElsewhere lists the databases the cell serves (held, not frozen)
// that the shard map gives to another cell under a version above the
// cell's: a cell started from a config file that still names a database it
// handed over, whose saved ownership was lost, say.
func (s *Steps) ownedElsewhere() []int {
	_, mine := s.own.Ranges()
	frozen := s.own.FrozenDBs()
	var out []int
	for _, db := range s.own.Held() {
		if slices.Contains(frozen, db) {
			continue
		}
		if owner, ok := s.cfg.Peers.Map().Owner(model.ShardID(db * model.ShardsPerDB)); ok && owner.Name != s.cfg.Cell && owner.Version > mine {
			out = append(out, db)
		}
	}
	return out
}

// yield stops serving dbs, each of which the map gives to another cell
// under a version above the cell's (ownedElsewhere): all frozen and
// drained, then released in one save under the highest of those versions
// (the cell has one version: releasing them one by one would raise it above
// the next one's owner, and the cell would then win that database back).
// Each copy is recorded as handed over with yieldedDigest, which no copy
// matches: it is never dropped (no mover verified its rows against the
// owner's; what it took while two cells served it is for a person to
// compare), and the cells' Copies show it changed. Logged at ERROR: two
// cells served them until now. The caller holds the steps; a database whose
// dbSteps is taken (a drop, a step) waits for the next pass.
func (s *Steps) yield(ctx context.Context, dbs []int) {
	var took []int
	version := int64(0)
	for _, db := range dbs {
		owner, ok := s.cfg.Peers.Map().Owner(model.ShardID(db * model.ShardsPerDB))
		if !ok || !s.dbSteps[db].TryLock() {
			continue
		}
		defer s.dbSteps[db].Unlock()
		s.log.Error("move: the map gives a database this cell serves to another cell under a higher version; it is no longer served here, and its copy is kept",
			"db", db, "owner", owner.Name, "version", owner.Version)
		if err := s.own.SetFrozen(db, true); err != nil {
			continue
		}
		took, version = append(took, db), max(version, owner.Version)
	}
	if len(took) == 0 {
		return
	}
	for _, db := range took {
		dctx, cancel := context.WithTimeout(ctx, freezeDrainMax)
		_ = s.own.Drain(dctx, db) // work that checked it before: it ends, or the drain gives up
		cancel()
	}
	held := slices.DeleteFunc(s.own.Held(), func(x int) bool { return slices.Contains(took, x) })
	now := s.clock.Now().UnixMilli()
	for i, db := range took {
		mo := &storage.MovedOut{Cell: s.cfg.Cell, DB: db, Version: version, Digest: yieldedDigest, ReleasedMS: now}
		if i < len(took)-1 {
			// Records first, the ownership with the last: a restart between
			// them finds the database held and yields it again.
			if err := s.store.AddMovedOut(ctx, *mo); err != nil {
				s.thawAll(took)
				return
			}
			continue
		}
		if err := s.setOwned(ctx, held, version, mo, -1); err != nil {
			s.thawAll(took)
			return
		}
	}
	s.log.Warn("move: databases the map gives to other cells released", "dbs", took, "version", version)
}

// yieldedDigest is the digest recorded for a copy the cell yielded
// (yield): well-formed, and no copy's (storage.Digest.Sum is a SHA-256).
var yieldedDigest = strings.Repeat("0", 64)

// thawAll serves dbs again after a yield that could not save (the next pass
// tries again).
func (s *Steps) thawAll(dbs []int) {
	for _, db := range dbs {
		_ = s.own.SetFrozen(db, false)
	}
}

// freezeExpired ends a freeze nobody released: if the shard map gives the
// database to another cell under a higher version (the mover stopped after
// the adoption), the cell releases it; otherwise, unless the freeze is
// sealed (a hand-over began, and the new owner may have adopted it), it
// serves it again. A sealed freeze stays, logged at ERROR each minute, until
// the map shows the new owner or a person thaws it (POST /admin/moves).
func (s *Steps) freezeExpired(ctx context.Context, db int) {
	_, mine := s.own.Ranges()
	s.mu.Lock()
	sealed, isSealed := s.sealed[db]
	s.mu.Unlock()
	owner, ok := s.cfg.Peers.Map().Owner(model.ShardID(db * model.ShardsPerDB))
	if isSealed && !(ok && owner.Name != s.cfg.Cell && owner.Version >= sealed) {
		now := s.clock.Now()
		s.mu.Lock()
		s.frozenUntil[db] = now.Add(movesTick) // looked at again each pass
		if s.sealLog == nil {
			s.sealLog = map[int]time.Time{}
		}
		last, logged := s.sealLog[db]
		if !logged || now.Sub(last) >= time.Minute {
			s.sealLog[db] = now
		}
		s.mu.Unlock()
		if logged && now.Sub(last) < time.Minute {
			return
		}
		s.log.Error("move: a database frozen for a hand-over is not in the map under its new owner; kept frozen (thaw it by hand once the new owner is known not to have adopted it)",
			"db", db, "version", sealed)
		return
	}
	if ok && owner.Name != s.cfg.Cell && owner.Version > mine {
		d, err := s.store.Digest(ctx, db)
		if err != nil {
			return
		}
		dbs := slices.DeleteFunc(s.own.Held(), func(x int) bool { return x == db })
		if err := s.setOwned(ctx, dbs, owner.Version, &storage.MovedOut{Cell: s.cfg.Cell, DB: db, Version: owner.Version, Digest: d.Sum(), ReleasedMS: s.clock.Now().UnixMilli()}, -1); err == nil {
			s.log.Warn("move: a frozen database was adopted by another cell; released", "db", db, "owner", owner.Name, "version", owner.Version)
		}
		return
	}
	_ = s.thawLocked(ctx, db)
}

// dropCopy drops the copy of a database handed over when it is unchanged
// since the handover (d: its digest now); a changed copy (a write that
// reached it after the freeze) is kept and logged at ERROR, for a person to
// compare. The caller holds the database's dbSteps.
func (s *Steps) dropCopy(ctx context.Context, mo storage.MovedOut, d storage.Digest) {
	if s.holds(mo.DB) {
		return
	}
	mos, err := s.store.MovedOuts(ctx, s.cfg.Cell)
	if err != nil || !slices.ContainsFunc(mos, func(x storage.MovedOut) bool { return x == mo }) {
		return // forgotten or replaced meanwhile
	}
	if d.Sum() != mo.Digest {
		if s.changedLogged(mo.DB, s.clock.Now()) {
			s.cfg.Metrics.CopyChanged.Inc()
			s.log.Error("move: the copy of a database handed over changed after the handover; kept, not dropped", "db", mo.DB,
				"version", mo.Version, "err", errors.New("digest differs"))
		}
		return
	}
	if err := s.store.DropMovedOut(ctx, s.cfg.Cell, mo.DB); err != nil {
		s.log.Warn("move: dropping the copy of a database handed over", "db", mo.DB, "err", err)
		return
	}
	s.cfg.Metrics.CopiesDropped.Inc()
	s.log.Info("move: copy of a database handed over dropped", "db", mo.DB, "released", time.UnixMilli(mo.ReleasedMS).UTC().Format(time.RFC3339))
}

// changedLogged records when a copy was found changed (movesPass compares it
// again an hour later) and reports that it is to be logged.
func (s *Steps) changedLogged(db int, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changedAt == nil {
		s.changedAt = map[int]time.Time{}
	}
	s.changedAt[db] = now
	return true
}
