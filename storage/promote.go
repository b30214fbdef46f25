package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"

	"redcell/model"
)

// errPromoting refuses new connections while a promotion runs.
var errPromoting = model.Errorf(model.ErrDBUnavailable, "the cell's standby is being promoted; retry")

// Promote makes the standby serve: first no statement of this cell reaches
// the primary any more (its connections are stale), then the standby stops
// taking the primary's binlog, applies everything it received (every
// acknowledged commit, under semi-synchronous replication), is marked as
// promoted, forgets the primary, and the pool dials it. Errors: the
// standby's, ErrStandbyUnknown (a standby that replicates from another
// server, or from none and is not marked); the standby is then not promoted,
// takes the binlog again, and the pool dials the primary again.
func (f *Failover) Promote(ctx context.Context) (err error) {
	if f.promoted.Load() {
		return nil
	}
	f.sw.refuse(errPromoting)
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		f.sw.resume()
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	stopped := false
	defer func() {
		if err == nil {
			return
		}
		if stopped {
			if _, rerr := db.ExecContext(context.WithoutCancel(ctx), "START SLAVE IO_THREAD"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("and taking the binlog again failed: %w", rerr))
			}
		}
		f.sw.resume()
	}()
	if err := f.leaseStillOurs(ctx, db); err != nil {
		return fmt.Errorf("storage: promote: %w", err)
	}
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return fmt.Errorf("storage: promote: read the replica's state: %w", err)
	}
	if st == nil {
		if marked, merr := promotedMark(ctx, db); merr != nil || !marked {
			return errors.Join(merr, ErrStandbyUnknown)
		}
	} else {
		if err := f.promoteReplica(ctx, db, st, &stopped); err != nil {
			return err
		}
	}
	sc, err := connectorOf(f.standby)
	if err != nil {
		return err
	}
	f.sw.set(sc)
	f.promoted.Store(true)
	f.Promotions.Add(1)
	f.primaryDown.Store(0)
	f.replicating.Store(-1) // no standby any more
	return nil
}

// promoteReplica is Promote on a standby that replicates from the primary
// (st, its replica status): it stops taking the binlog (then *stopped is
// set, so that Promote's undo takes it again on an error), waits until the
// standby applied what it received, marks it as promoted, makes it forget
// the primary and turns its semi-synchronous acknowledgement off. Errors:
// ErrStandbyUnknown (it replicates from another server), the standby's,
// wrapped as Promote returns them.
func (f *Failover) promoteReplica(ctx context.Context, db *sql.DB, st map[string]string, stopped *bool) error {
	if net.JoinHostPort(st["Master_Host"], st["Master_Port"]) != f.primaryAddr {
		return fmt.Errorf("%w: it replicates from %s:%s", ErrStandbyUnknown, st["Master_Host"], st["Master_Port"])
	}
	f.log.Info("failover: promoting the standby: stopping its replication")
	if _, err := db.ExecContext(ctx, "STOP SLAVE IO_THREAD"); err != nil {
		return fmt.Errorf("storage: promote: stop taking the binlog: %w", err)
	}
	*stopped = true
	var err error
	if st, err = slaveStatus(ctx, db); err != nil || st == nil {
		return errors.Join(err, errors.New("storage: promote: the replica's state went away"))
	}
	f.log.Info("failover: waiting for the standby to apply what it received", "gtid_io_pos", st["Gtid_IO_Pos"])
	var waited sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 60)", st["Gtid_IO_Pos"]).Scan(&waited); err != nil || !waited.Valid || waited.Int64 != 0 {
		last, _ := slaveStatus(ctx, db)
		return errors.Join(err, fmt.Errorf("storage: promote: the standby did not apply what it received (up to %q) within 60 s; its SQL thread: running %q, last error %q",
			st["Gtid_IO_Pos"], last["Slave_SQL_Running"], last["Last_SQL_Error"]))
	}
	if err := markPromoted(ctx, db, f.primaryAddr, st["Gtid_IO_Pos"], f.clock.Now().UnixMilli()); err != nil {
		return fmt.Errorf("storage: promote: mark: %w", err)
	}
	f.log.Info("failover: applied and marked; forgetting the primary")
	if _, err := db.ExecContext(ctx, "STOP SLAVE"); err != nil {
		return fmt.Errorf("storage: promote: %w", err)
	}
	if _, err := db.ExecContext(ctx, "RESET SLAVE ALL"); err != nil {
		return fmt.Errorf("storage: promote: %w", err)
	}
	// No standby of its own yet: with semi-synchronous acknowledgement
	// on, its first commits would wait the whole timeout for a replica
	// there is not (rpl_semi_sync_master_wait_no_slave). Fail-back turns
	// it on again once its new standby replicates (cell/mover).
	if _, err := db.ExecContext(ctx, "SET GLOBAL rpl_semi_sync_master_enabled = 0"); err != nil {
		f.log.Warn("failover: could not turn semi-synchronous acknowledgement off on the promoted standby: its first commits may wait for the timeout", "err", err)
	}
	return nil
}

// markPromoted leaves the promotion mark on the server behind db (the
// standby that serves): redcell_failover.t_promoted, dated atMS (Unix ms).
func markPromoted(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, oldPrimary, gtid string, atMS int64) error {
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS redcell_failover" + dbDefaults,
		"CREATE TABLE IF NOT EXISTS redcell_failover.t_promoted (id TINYINT NOT NULL PRIMARY KEY, " +
			"old_primary VARCHAR(255) NOT NULL, gtid VARCHAR(255) NOT NULL, promoted_ms BIGINT NOT NULL) ENGINE=InnoDB",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, "REPLACE INTO redcell_failover.t_promoted VALUES (1, ?, ?, ?)", oldPrimary, gtid, atMS)
	return err
}
