package mover

// The replication a move runs on the target's server: the channel from the
// source, the target's standby kept in step, and the waits on both.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/storage"
)

// asyncChannels makes the target's replication channels asynchronous while a
// move runs (rpl_semi_sync_slave_enabled off; a channel's I/O thread reads it
// when it connects): a semi-synchronous channel would acknowledge the
// source's commits in place of the source's standby, and a commit the
// standby lacks could be lost in a failover of the source. restore sets the
// variable back as it was.
func asyncChannels(ctx context.Context, dst *sql.DB) (restore func(), err error) {
	var on int
	if err := dst.QueryRowContext(ctx, "SELECT @@rpl_semi_sync_slave_enabled").Scan(&on); err != nil {
		return nil, err
	}
	if on == 0 {
		return func() {}, nil
	}
	if _, err := dst.ExecContext(ctx, "SET GLOBAL rpl_semi_sync_slave_enabled = 0"); err != nil {
		return nil, err
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_, _ = dst.ExecContext(rctx, "SET GLOBAL rpl_semi_sync_slave_enabled = 1")
	}, nil
}

// checkStandby checks the target's standby's copy of db before the freeze:
// the channel's applier pauses (the source serves on; its binlog queues on
// the target), the standby applies the target's binlog up to its end, and
// the digests of db on the target and on its standby must match. The
// applier runs again whatever happens.
func (m *Mover) checkStandby(ctx context.Context, db int, dst, sb *sql.DB, ch string) (err error) {
	if _, err := dst.ExecContext(ctx, "STOP SLAVE '"+ch+"' SQL_THREAD"); err != nil {
		return fmt.Errorf("mover: channel %s: %w", ch, err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if _, serr := dst.ExecContext(sctx, "START SLAVE '"+ch+"' SQL_THREAD"); serr != nil {
			err = errors.Join(err, fmt.Errorf("mover: channel %s: %w", ch, serr))
		}
	}()
	if err := m.syncStandby(ctx, dst, sb, m.CatchUpMax); err != nil {
		return fmt.Errorf("mover: db_%02d: the target's standby: %w", db, err)
	}
	var onStandby storage.Digest
	var serr error
	done := make(chan struct{})
	go func() { onStandby, serr = storage.DBDigest(ctx, sb, db); close(done) }()
	onTarget, terr := storage.DBDigest(ctx, dst, db)
	<-done
	if err := errors.Join(terr, serr); err != nil {
		return fmt.Errorf("mover: db_%02d digests on the target and its standby: %w", db, err)
	}
	if onTarget.Sum() != onStandby.Sum() {
		return fmt.Errorf("mover: db_%02d differs between the target and its standby: %s", db, strings.Join(onTarget.Diff(onStandby), "; "))
	}
	return nil
}

// syncStandby waits until the target's standby (sb) has applied everything
// in the target's binlog (its gtid_binlog_pos when called), up to max.
// Under semi-synchronous replication the standby received it before the
// target committed it; here it has applied it too.
func (m *Mover) syncStandby(ctx context.Context, dst, sb *sql.DB, max time.Duration) error {
	var pos string
	if err := dst.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		return err
	}
	return m.waitGTID(ctx, sb, pos, max)
}

// waitGTID waits, in MASTER_GTID_WAIT, until the replica behind db has
// applied pos, up to max on the mover's clock, in slices of gtidWaitSlice
// (the server's own waits, on its time): between two, a
// replica whose SQL thread stopped on an error fails the wait at once with
// that error, and a wait that runs out names the replica's threads and last
// errors.
func (m *Mover) waitGTID(ctx context.Context, db *sql.DB, pos string, max time.Duration) error {
	deadline := m.now().Add(max)
	for {
		slice := min(gtidWaitSlice, deadline.Sub(m.now()))
		if slice < 0 {
			slice = 0
		}
		var waited sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", pos, slice.Seconds()).Scan(&waited); err != nil {
			return fmt.Errorf("waiting for GTID %s: %w", pos, err)
		}
		if waited.Valid && waited.Int64 == 0 {
			return nil
		}
		st, err := slaveStatus(ctx, db, "")
		state := ""
		if err == nil {
			state = fmt.Sprintf(" (replication: I/O %s, SQL %s; last I/O error %q, last SQL error %q; received %s)",
				st["Slave_IO_Running"], st["Slave_SQL_Running"], st["Last_IO_Error"], st["Last_SQL_Error"], st["Gtid_IO_Pos"])
			if st["Slave_SQL_Running"] == "No" && st["Last_SQL_Error"] != "" {
				return fmt.Errorf("it stopped applying before GTID %s%s", pos, state)
			}
		}
		if !m.now().Before(deadline) {
			return fmt.Errorf("it did not apply GTID %s within %s%s", pos, max, state)
		}
	}
}

// gtidWaitSlice is how long waitGTID waits between two looks at the
// replica's threads.
const gtidWaitSlice = 5 * time.Second

// channel is the name of db's replication channel on the target.
func channel(db int) string { return fmt.Sprintf("move_db_%02d", db) }

// startChannel starts replicating db's schemas from the source's binlog
// position into the target.
func startChannel(ctx context.Context, dst *sql.DB, ch string, db int, srcDSN, file string, pos int64) error {
	cfg, err := mysql.ParseDSN(srcDSN)
	if err != nil {
		return err
	}
	host, port, err := splitHostPort(cfg.Addr)
	if err != nil {
		return err
	}
	schemas := storage.MoveSchemas(db)
	for _, q := range []string{
		fmt.Sprintf("CHANGE MASTER '%s' TO MASTER_HOST=%s, MASTER_PORT=%d, MASTER_USER=%s, MASTER_PASSWORD=%s, MASTER_LOG_FILE=%s, MASTER_LOG_POS=%d, MASTER_USE_GTID=no, MASTER_CONNECT_RETRY=1",
			ch, quote(host), port, quote(cfg.User), quote(cfg.Passwd), quote(file), pos),
		fmt.Sprintf("SET GLOBAL %s.replicate_wild_do_table = %s", ch,
			quote(strings.ReplaceAll(schemas[0], "_", `\_`)+".%,"+strings.ReplaceAll(schemas[1], "_", `\_`)+".%")),
		"START SLAVE '" + ch + "'",
	} {
		if _, err := dst.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mover: channel %s: %w", ch, err)
		}
	}
	return nil
}

// waitCaughtUp waits until the channel has applied everything the source's
// binlog held when the call began (its file and position then): in
// MASTER_POS_WAIT on the target, which returns as the position is applied,
// and in steps of at most a second, between which the channel's status
// reports an error that stopped it (looked at again after 5 ms on the
// mover's clock).
func (m *Mover) waitCaughtUp(ctx context.Context, src, dst *sql.DB, ch string) error {
	var file string
	var pos int64
	if err := src.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &pos, new(any), new(any)); err != nil {
		return fmt.Errorf("source binlog position: %w", err)
	}
	for {
		var waited sql.NullInt64
		err := dst.QueryRowContext(ctx, "SELECT MASTER_POS_WAIT(?, ?, 1, ?)", file, pos, ch).Scan(&waited)
		if err != nil {
			return fmt.Errorf("channel %s waiting for %s:%d: %w", ch, file, pos, err)
		}
		if waited.Valid && waited.Int64 >= 0 {
			return nil
		}
		// A second went by (-1), or the channel's SQL thread is not
		// running (NULL): its status tells which.
		st, err := slaveStatus(ctx, dst, ch)
		if err != nil {
			return err
		}
		if st["Last_SQL_Error"] != "" || st["Last_IO_Error"] != "" && st["Slave_IO_Running"] != "Yes" {
			return fmt.Errorf("channel %s: %s%s", ch, st["Last_SQL_Error"], st["Last_IO_Error"])
		}
		exec, _ := strconv.ParseInt(st["Exec_Master_Log_Pos"], 10, 64)
		if f := st["Relay_Master_Log_File"]; f > file || f == file && exec >= pos {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("channel %s at %s:%s, source at %s:%d: %w", ch, st["Relay_Master_Log_File"], st["Exec_Master_Log_Pos"], file, pos, ctx.Err())
		case <-m.clk().After(5 * time.Millisecond):
		}
	}
}

func slaveStatus(ctx context.Context, db *sql.DB, ch string) (map[string]string, error) {
	rows, err := storage.StatusRows(ctx, db, "SHOW SLAVE '"+ch+"' STATUS")
	if err != nil {
		return nil, fmt.Errorf("channel %s status: %w", ch, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("channel %s: no status", ch)
	}
	return rows[0], nil
}
