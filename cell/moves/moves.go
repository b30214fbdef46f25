// Package moves is a cell's side of moving a database to another cell
// (redcell cells; docs/operations.md, Add a cell): a database (db_XX with
// its shadow_db_XX) moves while both cells serve: the new owner's MariaDB
// copies it by replication, then the old owner freezes it (MOVING), the
// mover (cell/mover) verifies both copies are equal, the new owner adopts
// it and the old one releases it, each under a new map version announced
// through memberlist. Steps takes those steps (POST /admin/moves), keeps
// the marks that survive a restart, thaws freezes nobody ended and drops
// the copies of databases handed over once their grace has passed.
package moves

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Store keeps what a cell owns across restarts, and its copies of the
// databases it handed over (storage.MySQL).
type Store interface {
	// SaveMove saves the ranges, version and a record in one transaction.
	SaveMove(ctx context.Context, cell, ranges string, version int64, add *storage.MovedOut, forget int) error
	AddMovedOut(ctx context.Context, mo storage.MovedOut) error
	MovedOuts(ctx context.Context, cell string) ([]storage.MovedOut, error)
	ForgetMovedOut(ctx context.Context, cell string, db int) error
	DropMovedOut(ctx context.Context, cell string, db int) error
	Digest(ctx context.Context, db int) (storage.Digest, error)
	// FilterChanged: the databases the cell holds changed (table lists are
	// read again).
	FilterChanged()
}

// Ownership is the cell's ownership of databases, which the steps change:
// what it holds (frozen or not), freezing and draining one, and a new set
// under a new version.
type Ownership interface {
	HoldsDB(db int) bool
	Held() []int
	FrozenDBs() []int
	Ranges() (sharding.Ranges, int64)
	// SetFrozen stops (true) or resumes serving db.
	SetFrozen(db int, frozen bool) error
	// Drain waits until the work that checked db before its freeze ended.
	Drain(ctx context.Context, db int) error
	// Set serves dbs under version from now on.
	Set(dbs []int, version int64) (sharding.Ranges, error)
}

// Peers is the cluster's shard map as the cell's membership sees it; when
// it also has Announce(shards string, version int64) error
// (membership.Node), a change of ownership is announced through it.
type Peers interface {
	Map() *sharding.Map
}

// announcer is the membership's side of a move (membership.Node.Announce).
type announcer interface {
	Announce(shards string, version int64) error
}

// Metrics are the moves' metrics (the cell registers them).
type Metrics struct {
	Steps         *prometheus.CounterVec // by op
	Drain         prometheus.Observer    // seconds a freeze waited for work in flight
	CopiesDropped prometheus.Counter
	CopyChanged   prometheus.Counter
	Passes        prometheus.Counter // Run's passes
}

// Config is what Steps needs of its cell.
type Config struct {
	Cell  string        // the cell's name
	Grace time.Duration // how long a copy handed over is kept (cell.Config.MoveGrace)
	// Store is nil when the cell has no store for moves: the steps answer
	// NOT_FOUND and nothing runs.
	Store   Store
	Own     Ownership
	Peers   Peers
	Metrics Metrics
	Clock   clock.Clock // nil: clock.Real
	Log     *slog.Logger
}

const (
	freezeTTLDefault = 30 * time.Second // a freeze not released by then thaws (or releases, see Run)
	freezeDrainMax   = 5 * time.Second  // the longest a freeze waits for work in flight
	movesTick        = time.Second
)

// Steps is the cell's part in moves: the store and when each frozen
// database thaws. Safe for concurrent use.
type Steps struct {
	cfg   Config
	store Store
	own   Ownership
	clock clock.Clock
	log   *slog.Logger

	mu          sync.Mutex // guards frozenUntil, sealed, changedAt, sealLog
	frozenUntil map[int]time.Time
	sealed      map[int]int64 // frozen databases a hand-over under this version began for (seal)
	steps       sync.Mutex    // one step at a time
	arriving    atomic.Int64  // steps arrived and not ended (counted before their locks): State waits for none
	// dbSteps[db] is held by a step on db (taken before steps) and by the
	// drop of db's copy (without steps: a drop takes seconds, and a freeze
	// of another database must not wait for it); movesPass, holding steps,
	// only tries it.
	dbSteps   [model.DBCount]sync.Mutex
	loaded    bool               // the marks a restart left are applied
	due       []storage.MovedOut // copies whose grace ended, for dropDue
	changedAt map[int]time.Time
	sealLog   map[int]time.Time // when a sealed freeze past its ttl was last logged
}

// New returns the cell's steps; LoadMarks, then Run, start them.
func New(cfg Config) *Steps {
	return &Steps{cfg: cfg, store: cfg.Store, own: cfg.Own, clock: clock.Or(cfg.Clock), log: cfg.Log,
		frozenUntil: map[int]time.Time{}, sealed: map[int]int64{}}
}

// Copies lists the databases the cell handed over and keeps a copy of (a
// moved-out record); none without a store. Errors: the store's.
func (s *Steps) Copies(ctx context.Context) ([]int, error) {
	if s.store == nil {
		return nil, nil
	}
	mos, err := s.store.MovedOuts(ctx, s.cfg.Cell)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(mos))
	for _, mo := range mos {
		out = append(out, mo.DB)
	}
	return out, nil
}

// MovesState implements admin.Moves. It waits for a step under way (a
// step is answered from one state, never from the middle of one): a mover
// that gave up waiting on an adoption and asks what the cell did learns what
// the adoption did, never "not held" while it is still saving. When ctx ends
// first it answers TIMEOUT, and the mover leaves the move as it is (the
// source frozen and sealed).
func (s *Steps) MovesState(ctx context.Context) (api.MovesState, error) {
	unlock, err := s.lockSteps(ctx)
	if err != nil {
		return api.MovesState{}, err
	}
	defer unlock()
	ranges, version := s.own.Ranges()
	out := api.MovesState{Cell: s.cfg.Cell, Shards: ranges.String(), Version: version, DBs: s.own.Held(), Frozen: s.own.FrozenDBs(),
		MovedOut: []api.MovedOutState{}}
	if out.DBs == nil {
		out.DBs = []int{}
	}
	if out.Frozen == nil {
		out.Frozen = []int{}
	}
	if s.store == nil {
		return out, nil
	}
	mos, err := s.store.MovedOuts(ctx, s.cfg.Cell)
	if err != nil {
		return out, model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	for _, mo := range mos {
		if mo.Digest == "" {
			continue // a freeze in progress
		}
		out.MovedOut = append(out.MovedOut, api.MovedOutState{DB: mo.DB, Version: mo.Version, ReleasedMS: mo.ReleasedMS,
			DropAtMS: mo.ReleasedMS + s.cfg.Grace.Milliseconds()})
	}
	return out, nil
}

// MoveStep implements admin.Moves: one step of a move (api.MoveStep).
func (s *Steps) MoveStep(ctx context.Context, step api.MoveStep) (api.MoveAnswer, error) {
	if s.store == nil {
		return api.MoveAnswer{}, model.Errorf(model.ErrNotFound, "cell %s has no store for moves", s.cfg.Cell)
	}
	if step.DB < 0 || step.DB >= model.DBCount {
		return api.MoveAnswer{}, model.Invalidf("no database %d (0..%d)", step.DB, model.DBCount-1)
	}
	s.arriving.Add(1) // before its locks: MovesState waits for a step still queued too
	defer s.arriving.Add(-1)
	// The database's steps first: a step on a database whose copy is being
	// dropped waits for the drop without holding the cell's steps.
	s.dbSteps[step.DB].Lock()
	defer s.dbSteps[step.DB].Unlock()
	s.steps.Lock()
	defer s.steps.Unlock()
	ans := api.MoveAnswer{Op: step.Op, DB: step.DB}
	var err error
	switch step.Op {
	case "freeze":
		ans.SavedMS, ans.DrainedMS, err = s.freeze(ctx, step.DB, time.Duration(step.TTLMS)*time.Millisecond)
	case "thaw":
		err = s.thaw(ctx, step.DB)
	case "release":
		err = s.release(ctx, step.DB, step.Version, step.Digest)
	case "adopt":
		err = s.adopt(ctx, step.DB, step.Version, step.Digest)
	case "seal":
		err = s.seal(ctx, step.DB, step.Version)
	case "forget":
		err = s.forget(ctx, step.DB)
	default:
		err = model.Invalidf("unknown move op %q (freeze, seal, thaw, release, adopt, forget)", step.Op)
	}
	if err != nil {
		return ans, err
	}
	ranges, version := s.own.Ranges()
	ans.Shards, ans.Version = ranges.String(), version
	s.cfg.Metrics.Steps.WithLabelValues(step.Op).Inc()
	return ans, nil
}

// lockSteps takes the cell's steps lock (Steps.steps) once no step is
// under way or queued for its locks (Steps.arriving), looking again every
// 5 ms on the cell's clock, or answers TIMEOUT when ctx ends first.
func (s *Steps) lockSteps(ctx context.Context) (unlock func(), err error) {
	try := func() bool {
		if s.arriving.Load() > 0 || !s.steps.TryLock() {
			return false
		}
		if s.arriving.Load() > 0 { // one arrived meanwhile: it goes first
			s.steps.Unlock()
			return false
		}
		return true
	}
	if try() {
		return s.steps.Unlock, nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil, model.Errorf(model.ErrTimeout, "a move step is under way on %s; ask again", s.cfg.Cell)
		case <-s.clock.After(5 * time.Millisecond):
			if try() {
				return s.steps.Unlock, nil
			}
		}
	}
}

func (s *Steps) holds(db int) bool { return s.own.HoldsDB(db) }

// Holds reports whether the cell owns database db, frozen or not.
func (s *Steps) Holds(db int) bool { return s.own.HoldsDB(db) }

// freeze stops serving db, waits for the work that checked it before, and
// thaws it after ttl unless released. The mark is saved first, so a cell
// restarted meanwhile comes back with db frozen. It returns how long the
// mark's save and the drain took (ms): writes to db paused after the save.
func (s *Steps) freeze(ctx context.Context, db int, ttl time.Duration) (savedMS, drainedMS int64, err error) {
	if !s.holds(db) {
		return 0, 0, model.Errorf(model.ErrWrongCell, "db_%02d is not owned by %s", db, s.cfg.Cell)
	}
	if slices.Contains(s.own.FrozenDBs(), db) {
		return 0, 0, model.Invalidf("db_%02d is frozen already: another move of it is running", db)
	}
	if ttl <= 0 {
		ttl = freezeTTLDefault
	}
	t0 := s.clock.Now()
	if err := s.store.AddMovedOut(ctx, storage.MovedOut{Cell: s.cfg.Cell, DB: db, ReleasedMS: t0.UnixMilli()}); err != nil {
		return 0, 0, model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	start := s.clock.Now()
	if err := s.own.SetFrozen(db, true); err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	s.frozenUntil[db] = start.Add(ttl)
	s.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, freezeDrainMax)
	defer cancel()
	if err := s.own.Drain(dctx, db); err != nil {
		_ = s.thawLocked(context.WithoutCancel(ctx), db)
		return 0, 0, model.Errorf(model.ErrOverloaded, "db_%02d: work in flight did not finish within %s; thawed", db, freezeDrainMax)
	}
	drained := s.clock.Now().Sub(start)
	s.cfg.Metrics.Drain.Observe(drained.Seconds())
	s.log.Info("move: database frozen", "db", db, "drained", drained, "thaws_in", ttl)
	return start.Sub(t0).Milliseconds(), drained.Milliseconds(), nil
}

func (s *Steps) thaw(ctx context.Context, db int) error {
	if !s.holds(db) {
		return model.Errorf(model.ErrWrongCell, "db_%02d is not owned by %s", db, s.cfg.Cell)
	}
	return s.thawLocked(ctx, db)
}

func (s *Steps) thawLocked(ctx context.Context, db int) error {
	if err := s.store.ForgetMovedOut(ctx, s.cfg.Cell, db); err != nil {
		return model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	s.mu.Lock()
	delete(s.frozenUntil, db)
	delete(s.sealed, db)
	s.mu.Unlock()
	if err := s.own.SetFrozen(db, false); err != nil {
		return err
	}
	s.log.Warn("move: database thawed, served here again", "db", db)
	return nil
}

// seal marks a frozen database as being handed over under version: from
// now on the freeze never ends by itself in a thaw (the new owner may have
// adopted it), only in a release once the map shows the new owner, or by a
// thaw asked for. Saved, so a restart keeps it.
func (s *Steps) seal(ctx context.Context, db int, version int64) error {
	if !slices.Contains(s.own.FrozenDBs(), db) {
		return model.Invalidf("db_%02d is not frozen: freeze it before the seal", db)
	}
	if _, cur := s.own.Ranges(); version <= cur {
		return model.Invalidf("version %d is not above the cell's %d", version, cur)
	}
	if err := s.store.AddMovedOut(ctx, storage.MovedOut{Cell: s.cfg.Cell, DB: db, Version: version, ReleasedMS: s.clock.Now().UnixMilli()}); err != nil {
		return model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	s.mu.Lock()
	s.sealed[db] = version
	s.mu.Unlock()
	return nil
}

// forget removes the record of a database the cell handed over and does not
// hold (before it takes the database back: its old copy must not be
// dropped by the grace check while the new one is made).
func (s *Steps) forget(ctx context.Context, db int) error {
	if s.holds(db) {
		return model.Invalidf("db_%02d is owned by %s: nothing to forget", db, s.cfg.Cell)
	}
	if err := s.store.ForgetMovedOut(ctx, s.cfg.Cell, db); err != nil {
		return model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	return nil
}

// release hands db over: saved first (a restart never claims it again),
// then dropped from the ranges served and announced.
func (s *Steps) release(ctx context.Context, db int, version int64, digest string) error {
	if !s.holds(db) {
		return model.Errorf(model.ErrWrongCell, "db_%02d is not owned by %s", db, s.cfg.Cell)
	}
	if !slices.Contains(s.own.FrozenDBs(), db) {
		return model.Invalidf("db_%02d is not frozen: freeze it before the release", db)
	}
	if !wellFormedDigest(digest) {
		return model.Invalidf("a release needs the digest the new owner verified (64 hex digits, storage.Digest.Sum)")
	}
	_, cur := s.own.Ranges()
	if version <= cur {
		return model.Invalidf("version %d is not above the cell's %d", version, cur)
	}
	dbs := slices.DeleteFunc(s.own.Held(), func(d int) bool { return d == db })
	return s.setOwned(ctx, dbs, version, &storage.MovedOut{Cell: s.cfg.Cell, DB: db, Version: version, Digest: digest, ReleasedMS: s.clock.Now().UnixMilli()}, -1)
}

// adopt takes db: saved, served and announced, once the cell's copy matches
// digest, the content the mover verified on both copies (a hand-over never
// serves a copy without its rows).
func (s *Steps) adopt(ctx context.Context, db int, version int64, digest string) error {
	if s.holds(db) {
		return model.Invalidf("db_%02d is already owned by %s", db, s.cfg.Cell)
	}
	_, cur := s.own.Ranges()
	if version <= cur {
		return model.Invalidf("version %d is not above the cell's %d", version, cur)
	}
	if !wellFormedDigest(digest) {
		return model.Invalidf("an adoption needs the digest the mover verified (64 hex digits, storage.Digest.Sum)")
	}
	d, err := s.store.Digest(ctx, db)
	if err != nil {
		return model.Errorf(model.ErrDBUnavailable, "db_%02d: digest of this cell's copy: %v", db, err)
	}
	if got := d.Sum(); got != digest {
		s.log.Error("move: adoption refused: this cell's copy is not the one the mover verified", "db", db, "version", version, "copy", got, "verified", digest)
		return model.Invalidf("db_%02d: this cell's copy (digest %s) is not the one the mover verified (%s): not adopted", db, got, digest)
	}
	dbs := append(s.own.Held(), db)
	slices.Sort(dbs)
	return s.setOwned(ctx, dbs, version, nil, db)
}

// setOwned saves (with the record add, or forgetting forget's, in the same
// transaction), applies and announces a new set of databases.
func (s *Steps) setOwned(ctx context.Context, dbs []int, version int64, add *storage.MovedOut, forget int) error {
	ranges, err := rangesOf(dbs)
	if err != nil {
		return err
	}
	if err := s.store.SaveMove(ctx, s.cfg.Cell, ranges, version, add, forget); err != nil {
		return model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	r, err := s.own.Set(dbs, version)
	if err != nil {
		return err
	}
	s.store.FilterChanged()
	s.mu.Lock()
	for db := range s.frozenUntil {
		if !slices.Contains(dbs, db) {
			delete(s.frozenUntil, db)
		}
	}
	s.mu.Unlock()
	s.announce()
	s.log.Info("move: ownership changed", "shards", r.String(), "version", version)
	return nil
}

// wellFormedDigest tells whether d is a storage.Digest.Sum: 64 hex digits.
func wellFormedDigest(d string) bool {
	return len(d) == 64 && strings.Trim(d, "0123456789abcdef") == ""
}

func rangesOf(dbs []int) (string, error) {
	r, err := sharding.RangesOfDBs(dbs)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// announce gossips the cell's ranges and version (when its peers can).
func (s *Steps) announce() {
	a, ok := s.cfg.Peers.(announcer)
	if !ok {
		return
	}
	ranges, version := s.own.Ranges()
	if err := a.Announce(ranges.String(), version); err != nil {
		s.log.Warn("move: announcing the new ranges", "err", err)
	}
}
