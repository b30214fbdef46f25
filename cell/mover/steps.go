package mover

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"redcell/api"
	"redcell/storage"
)

// moveSteps are a move's steps after its start (moveRun.start), in order
// (the package comment tells what each does and why). A step that fails
// ends the move: moveRun.undo then thaws the source or, once the adoption
// was sent, lets the target's answer decide.
var moveSteps = []struct {
	name string
	run  func(r *moveRun, ctx context.Context) error
}{
	{"copy", (*moveRun).copyDB},
	{"catch up", (*moveRun).catchUp},
	{"freeze", (*moveRun).freeze},
	{"verify", (*moveRun).verify},
	{"unlink", (*moveRun).unlink},
	{"hand over", (*moveRun).handOver},
}

// moveRun is one move's state, shared by its steps.
type moveRun struct {
	m       *Mover
	db      int
	version int64
	// from and to are the cells with the servers that serve them now (a
	// standby promoted included); configured is from as configured, to
	// ask again in the freeze.
	from, to, configured Cell
	src, dst             *sql.DB
	sb                   *sql.DB // the target's standby; nil: none
	ch                   string  // the replication channel's name
	file                 string  // the copy's binlog position on the source
	pos                  int64
	frozen, adoptSent    bool
	digest               storage.Digest // the target's copy, verified
	frozenAt             time.Time      // writes paused from here on
	fctx                 context.Context
	res                  *Result
	closers              []func() // run last to first when the move ends
}

// Move moves database db from cell from to cell to under map version
// version (above every cell's). See the package comment for the steps.
func (m *Mover) Move(ctx context.Context, db int, from, to Cell, version int64) (res Result, err error) {
	m.defaults()
	res = Result{DB: db, From: from.Name, To: to.Name, Version: version}
	r := &moveRun{m: m, db: db, version: version, configured: from, from: from, to: to, ch: channel(db), res: &res}
	defer r.close()
	if err := r.start(ctx); err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			err = r.undo(ctx, err)
		}
	}()
	for _, st := range moveSteps {
		if err := st.run(r, ctx); err != nil {
			return res, err
		}
	}
	return res, nil
}

// close runs the closers, last to first.
func (r *moveRun) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// start finds the servers that serve both cells, opens them (and the
// target's standby), takes each server's move lock, runs the preflight
// checks and makes the target acknowledge asynchronously while a channel
// is defined. What it opened and took is given back by close.
func (r *moveRun) start(ctx context.Context) error {
	var fromSB, toSB string
	var err error
	if r.from.DSN, fromSB, err = storage.Serving(ctx, r.from.DSN, r.from.StandbyDSN); err != nil {
		return fmt.Errorf("mover: which of %s's servers serves: %w", r.from.Name, err)
	}
	if r.to.DSN, toSB, err = storage.Serving(ctx, r.to.DSN, r.to.StandbyDSN); err != nil {
		return fmt.Errorf("mover: which of %s's servers serves: %w", r.to.Name, err)
	}
	r.from.StandbyDSN, r.to.StandbyDSN = fromSB, toSB
	open := func(dsn string) (*sql.DB, error) {
		db, err := openDB(dsn)
		if err == nil {
			r.closers = append(r.closers, func() { db.Close() })
		}
		return db, err
	}
	if r.to.StandbyDSN != "" {
		if r.sb, err = open(r.to.StandbyDSN); err != nil {
			return err
		}
	}
	if r.src, err = open(r.from.DSN); err != nil {
		return err
	}
	if r.dst, err = open(r.to.DSN); err != nil {
		return err
	}
	// One move at a time on either server: a lock each, held on its own
	// connection until the move ends.
	for _, side := range []struct {
		c  Cell
		db *sql.DB
	}{{r.from, r.src}, {r.to, r.dst}} {
		unlock, err := lockServer(ctx, side.db)
		if err != nil {
			return fmt.Errorf("mover: %s's database: %w", side.c.Name, err)
		}
		r.closers = append(r.closers, unlock)
	}
	if err := r.m.preflight(ctx, r.db, r.from, r.to, r.src, r.dst); err != nil {
		return err
	}
	// Given back after undo has run: the target acknowledges nothing for
	// the source while a channel is defined.
	restore, err := asyncChannels(ctx, r.dst)
	if err != nil {
		return fmt.Errorf("mover: %s's database: %w", r.to.Name, err)
	}
	r.closers = append(r.closers, restore)
	return nil
}

// undo ends a move that failed with err, and returns the move's error.
// Once the adoption was sent, its answer was lost or refused: what the
// target did decides, and a copy it may serve is never dropped. Before
// that, a frozen source is thawed and the target's copy cleaned.
func (r *moveRun) undo(ctx context.Context, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if r.adoptSent {
		return r.m.afterAdoptFailed(cctx, r.db, r.from, r.to, r.version, r.digest, err)
	}
	if r.frozen {
		if terr := r.m.step(cctx, r.from, api.MoveStep{Op: "thaw", DB: r.db}); terr != nil {
			r.m.Log.Error("move failed and the source could not be thawed: it thaws by itself at the freeze's end", "db", r.db, "err", terr)
		}
	}
	r.m.cleanTarget(cctx, r.dst, r.sb, r.db)
	return err
}

// copyDB (step 1) copies db to the target, brings the target's standby
// up to the load, and starts the channel from the copy's position.
func (r *moveRun) copyDB(ctx context.Context) error {
	t := r.m.now()
	file, pos, err := r.m.copy(ctx, r.db, r.from, r.to, r.src)
	if err != nil {
		return err
	}
	r.file, r.pos = file, pos
	r.res.Copy = r.m.since(t)
	if r.sb != nil { // the load, in the target's domain, applied before the channel's
		if err := r.m.syncStandby(ctx, r.dst, r.sb, r.m.CatchUpMax); err != nil {
			return fmt.Errorf("mover: db_%02d: %s's standby after the load: %w", r.db, r.to.Name, err)
		}
	}
	return startChannel(ctx, r.dst, r.ch, r.db, r.from.DSN, r.file, r.pos)
}

// waitChannel waits, up to CatchUpMax, until the channel applied what the
// source wrote.
func (r *moveRun) waitChannel(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.m.CatchUpMax)
	defer cancel()
	if err := r.m.waitCaughtUp(cctx, r.src, r.dst, r.ch); err != nil {
		return fmt.Errorf("mover: db_%02d catching up: %w", r.db, err)
	}
	return nil
}

// catchUp (step 2) lets the channel catch up, copies the reconciliation
// positions, checks the target's standby, and catches up again until one
// wait is short, right before the freeze.
func (r *moveRun) catchUp(ctx context.Context) error {
	t := r.m.now()
	if err := r.waitChannel(ctx); err != nil {
		return err
	}
	// The reconciliation positions go first: a position only moves forward,
	// so one copied before the freeze makes the target check a little more,
	// never less, and the copy stays out of the freeze.
	if err := copyReconPositions(ctx, r.db, r.from.DSN, r.to.DSN); err != nil {
		return err
	}
	if r.sb != nil {
		ts := r.m.now()
		if err := r.m.checkStandby(ctx, r.db, r.dst, r.sb, r.ch); err != nil {
			return err
		}
		r.res.StandbyCheck = r.m.since(ts)
	}
	// Right before the freeze the channel catches up again, until one wait
	// is short: what it still has to apply inside the freeze is then what
	// the source wrote in about that time.
	for i := 0; i < 5; i++ {
		tw := r.m.now()
		if err := r.waitChannel(ctx); err != nil {
			return err
		}
		if r.m.since(tw) < 50*time.Millisecond {
			break
		}
	}
	r.res.CatchUp = r.m.since(t)
	return nil
}

// freeze (step 3): the source saves its mark, then stops serving db and
// drains: writes are paused from the request on, less the time the source
// took to save the mark (the answer's saved_ms). The steps after it run
// within FreezeMax of the request (fctx).
func (r *moveRun) freeze(ctx context.Context) error {
	t0 := r.m.now()
	var ans api.MoveAnswer
	if err := r.m.admin(ctx, r.from, http.MethodPost, api.MoveStep{Op: "freeze", DB: r.db, TTLMS: (3 * r.m.FreezeMax).Milliseconds()}, &ans); err != nil {
		return err
	}
	r.frozen = true
	r.res.Drain = time.Duration(ans.DrainedMS) * time.Millisecond
	r.res.Prep = time.Duration(ans.SavedMS) * time.Millisecond
	r.frozenAt = t0.Add(r.res.Prep)
	// FreezeMax from the request: what is left of it on the mover's clock,
	// as a context's timeout (on the system clock, as every deadline).
	fctx, fcancel := context.WithTimeout(ctx, r.m.FreezeMax-r.m.since(t0))
	r.fctx = fctx
	r.closers = append(r.closers, fcancel)
	return nil
}

// verify (step 4): the target applies the source's position after the
// drain, and both digests must match; then the target's standby catches
// up, and the source must still be served by the server copied from.
func (r *moveRun) verify(context.Context) error {
	tv := r.m.now()
	if err := r.compare(); err != nil {
		return err
	}
	r.res.Verify = r.m.since(tv) - r.res.Applied // the digests (and any later attempt's wait)
	if r.sb != nil {
		ts := r.m.now()
		if err := r.m.syncStandby(r.fctx, r.dst, r.sb, r.m.FreezeMax); err != nil {
			return fmt.Errorf("mover: db_%02d in the freeze: %s's standby: %w", r.db, r.to.Name, err)
		}
		r.res.StandbyTail = r.m.since(ts)
	}
	if r.configured.StandbyDSN != "" {
		now, _, err := storage.Serving(r.fctx, r.configured.DSN, r.configured.StandbyDSN)
		if err != nil {
			return fmt.Errorf("mover: db_%02d in the freeze: which of %s's servers serves: %w", r.db, r.from.Name, err)
		}
		if now != r.from.DSN {
			return fmt.Errorf("mover: db_%02d: %s failed over to its standby during the move: the copy came from its old primary; move it again", r.db, r.from.Name)
		}
	}
	for _, t := range r.digest {
		if t.Rows > 0 {
			r.res.Tables++
			r.res.Rows += t.Rows
		}
	}
	return nil
}

// compare waits for the target to apply the source's position and
// compares the digests; a write that reached the source after the position
// was read makes them differ: then once more, from the new position, up to
// three attempts. The source, drained, no longer changes: its digest is
// read while the target applies.
func (r *moveRun) compare() error {
	for r.res.Attempts = 1; ; r.res.Attempts++ {
		var other storage.Digest
		var derr, oerr error
		done := make(chan struct{})
		go func() { other, oerr = storage.DBDigest(r.fctx, r.src, r.db); close(done) }()
		ta := r.m.now()
		if err := r.m.waitCaughtUp(r.fctx, r.src, r.dst, r.ch); err != nil {
			<-done
			return fmt.Errorf("mover: db_%02d in the freeze: %w", r.db, err)
		}
		if r.res.Attempts == 1 {
			r.res.Applied = r.m.since(ta)
		}
		r.digest, derr = storage.DBDigest(r.fctx, r.dst, r.db)
		<-done
		if derr != nil || oerr != nil {
			return fmt.Errorf("mover: db_%02d digests: %w", r.db, errors.Join(derr, oerr))
		}
		if r.digest.Sum() == other.Sum() {
			return nil
		}
		if r.res.Attempts >= 3 {
			return fmt.Errorf("mover: db_%02d differs after %d attempts: %s", r.db, r.res.Attempts, strings.Join(r.digest.Diff(other), "; "))
		}
		r.m.Log.Warn("move: copies differ; the target catches up again", "db", r.db, "diff", r.digest.Diff(other))
	}
}

// unlink removes the channel before the hand-over (a channel left defined
// would start again with the target's server, without its filter) and
// seals the source meanwhile: from then on the source never thaws by
// itself, since the target may adopt.
func (r *moveRun) unlink(context.Context) error {
	th := r.m.now()
	sealed := make(chan error, 1)
	go func() { sealed <- r.m.step(r.fctx, r.from, api.MoveStep{Op: "seal", DB: r.db, Version: r.version}) }()
	var cerr error
	for _, q := range []string{"STOP SLAVE '" + r.ch + "'", "RESET SLAVE '" + r.ch + "' ALL"} {
		if _, err := r.dst.ExecContext(r.fctx, q); err != nil {
			cerr = fmt.Errorf("mover: %s: %w", q, err)
			break
		}
	}
	if err := errors.Join(<-sealed, cerr); err != nil {
		return err
	}
	r.res.Unlink = r.m.since(th)
	return nil
}

// handOver (step 5): the target adopts db under version; then the source
// releases it (a release not taken is logged: the sealed source releases
// by itself once its map shows the new owner).
func (r *moveRun) handOver(ctx context.Context) error {
	th := r.m.now()
	r.adoptSent = true
	actx, acancel := context.WithTimeout(ctx, 15*time.Second)
	err := r.m.step(actx, r.to, api.MoveStep{Op: "adopt", DB: r.db, Version: r.version, Digest: r.digest.Sum()})
	acancel()
	if err != nil {
		return err
	}
	r.res.Freeze, r.res.HandOver = r.m.since(r.frozenAt), r.m.since(th)
	if err := r.m.step(context.WithoutCancel(ctx), r.from, api.MoveStep{Op: "release", DB: r.db, Version: r.version, Digest: r.digest.Sum()}); err != nil {
		// The target owns it under the higher version and routers follow it;
		// the source, sealed, releases it when its map shows the target.
		r.m.Log.Warn("move: the source did not take the release; it releases by itself once its map shows the new owner", "db", r.db, "err", err)
	}
	return nil
}
