package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/model"
)

// errSwitching refuses new connections while SwitchBack pauses the cell.
var errSwitching = model.Errorf(model.ErrDBUnavailable, "the cell's database is switching back to its primary; retry")

// ErrNotFailedOver: SwitchBack on a cell that serves from its primary.
var ErrNotFailedOver = errors.New("storage: the cell serves from its primary: nothing to switch back")

// SwitchBackResult is what a switch back took.
type SwitchBackResult struct {
	CaughtUp time.Duration // the primary applying the standby's binlog, before the pause
	Paused   time.Duration // from refusing connections to dialing the primary
	GTID     string        // the standby's binlog position the primary applied in the pause
}

// SwitchBack makes the primary serve again after a failover, once it was
// rebuilt as the standby's semi-synchronous replica (redcell cells
// failback): it checks that the primary replicates from the standby with
// both threads running and that the standby acknowledges semi-synchronously;
// lets the primary catch up; then, in a pause: no statement of this cell
// reaches the standby any more (its connections are stale, new ones
// refused), FLUSH TABLES WITH READ LOCK on the standby waits for the commits
// under way and holds later ones, the primary applies the standby's binlog
// up to its end (every acknowledged commit, the rule a promotion follows),
// stops replicating, and the pool dials the primary. The standby, its
// promotion mark removed, becomes the primary's semi-synchronous replica from
// the primary's binlog position (the primary logged all it applied), and
// the watch runs again. Errors before the primary stops replicating leave
// everything as it was (the cell serves from the standby again):
// ErrNotFailedOver, ErrStandbyUnknown (the primary is not the standby's
// replica), the servers'. An error after it is the standby's setup as a
// replica; the cell serves from its primary then, without a standby, and
// says so.
func (f *Failover) SwitchBack(ctx context.Context) (res SwitchBackResult, err error) {
	f.switching.Lock()
	defer f.switching.Unlock()
	if !f.promoted.Load() {
		return res, ErrNotFailedOver
	}
	pdb, err := sql.Open("mysql", f.primary)
	if err != nil {
		return res, err
	}
	defer pdb.Close()
	sdb, err := sql.Open("mysql", f.standby)
	if err != nil {
		return res, err
	}
	defer sdb.Close()
	if err := f.switchBackReady(ctx, pdb, sdb); err != nil {
		return res, err
	}
	t0 := f.clock.Now()
	if err := primaryCatchUp(ctx, pdb, sdb); err != nil {
		return res, err
	}
	res.CaughtUp = f.clock.Now().Sub(t0)

	// The pause, bounded: the cell's calls are refused while it lasts.
	t1 := f.clock.Now()
	pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	wctx := context.WithoutCancel(ctx)
	f.log.Info("failover: switching back to the primary: pausing the cell's database calls")
	f.sw.refuse(errSwitching)
	lock, err := sdb.Conn(pctx)
	if err != nil {
		f.sw.resume()
		return res, err
	}
	defer lock.Close()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_, _ = lock.ExecContext(wctx, "UNLOCK TABLES")
			f.sw.resume()
		}
	}
	pc, err := f.switchOver(pctx, wctx, lock, pdb, resume, &res)
	if err != nil {
		return res, err
	}
	// From here on the primary is the cell's database whatever happens. The
	// standby (the cell's calls to it refused) follows it before the first
	// commit, so the primary's semi-synchronous acknowledgement has its
	// replica from the start.
	resumed = true
	fctx, fcancel := context.WithTimeout(wctx, 30*time.Second)
	defer fcancel()
	ferr := f.followPrimary(fctx, lock, pdb)
	semisync := "SET GLOBAL rpl_semi_sync_master_enabled = 1"
	if ferr != nil {
		semisync = "SET GLOBAL rpl_semi_sync_master_enabled = 0" // no replica: its commits would wait for the timeout
	}
	if _, err := pdb.ExecContext(wctx, semisync); err != nil {
		ferr = errors.Join(ferr, fmt.Errorf("the primary: %s: %w", semisync, err))
	}
	f.sw.set(pc)
	f.promoted.Store(false)
	f.primaryDown.Store(0)
	f.replicating.Store(-1)
	res.Paused = f.clock.Now().Sub(t1)
	f.log.Info("failover: the primary serves again", "paused", res.Paused.Round(time.Millisecond), "gtid", res.GTID)
	f.startWatch()
	if ferr != nil {
		f.log.Error("failover: the primary serves again, but the standby could not be made its replica: the cell has no standby until it is (docs/operations.md)", "err", ferr)
		return res, fmt.Errorf("storage: switch back: the primary serves; the standby's setup as its replica failed: %w", ferr)
	}
	return res, nil
}

// primaryCatchUp waits, up to 60 s, until the primary (pdb) applied the
// standby's (sdb) binlog up to its position now, before SwitchBack's pause.
// Errors: the standby's, the primary's wait, wrapped as SwitchBack returns it.
func primaryCatchUp(ctx context.Context, pdb, sdb *sql.DB) error {
	var pos string
	if err := sdb.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		return err
	}
	if err := gtidWait(ctx, pdb, pos, 60*time.Second); err != nil {
		return fmt.Errorf("storage: switch back: the primary catching up: %w", err)
	}
	return nil
}

// switchBackReady checks what SwitchBack needs before it begins: the
// primary replicates from the standby with both threads running, the lease
// is still ours, no move into the cell runs, and the standby acknowledges
// semi-synchronously. Errors: ErrStandbyUnknown (the primary is not the
// standby's running replica), the lease's, a refusal naming the running
// moves or the standby's semi-synchronous status, the servers'.
func (f *Failover) switchBackReady(ctx context.Context, pdb, sdb *sql.DB) error {
	scfg, _ := mysql.ParseDSN(f.standby)
	st, err := slaveStatus(ctx, pdb)
	if err != nil {
		return fmt.Errorf("storage: switch back: the primary: %w", err)
	}
	if st == nil || net.JoinHostPort(st["Master_Host"], st["Master_Port"]) != scfg.Addr || st["Slave_IO_Running"] != "Yes" || st["Slave_SQL_Running"] != "Yes" {
		return fmt.Errorf("%w: the primary must replicate from the standby at %s with both threads running first (redcell cells failback)", ErrStandbyUnknown, scfg.Addr)
	}
	if err := f.leaseStillOurs(ctx, sdb); err != nil {
		return fmt.Errorf("storage: switch back: %w", err)
	}
	if chs, err := moveChannels(ctx, sdb); err != nil || len(chs) > 0 {
		return errors.Join(err, fmt.Errorf("storage: switch back: moves into this cell are running (%v): switch back after them", chs))
	}
	var name, status string
	if err := sdb.QueryRowContext(ctx, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'").Scan(&name, &status); err != nil || status != "ON" {
		return errors.Join(err, fmt.Errorf("storage: switch back: the standby's semi-synchronous replication is %q, not ON", status))
	}
	return nil
}

// switchOver is the pause of SwitchBack up to the primary's serving: the
// standby's tables locked (through lock) and its other connections ended,
// the primary applies the standby's binlog up to its end (res.GTID), the
// standby's promotion mark goes, and the primary stops replicating. It
// returns the primary's connector. On an error it has called resume and
// the standby serves on, marked as promoted again if it was unmarked;
// errors are the servers', wrapped as SwitchBack returns them.
func (f *Failover) switchOver(pctx, wctx context.Context, lock *sql.Conn, pdb *sql.DB, resume func(), res *SwitchBackResult) (driver.Connector, error) {
	// FLUSH TABLES WITH READ LOCK waits for the commits under way, at most
	// lock_wait_timeout, and holds later ones. A statement that passed its
	// connection's staleness check just before the refusal may be among
	// those held: every other client connection is killed, so that nothing
	// held commits on the standby once it is unlocked (a killed
	// transaction rolls back; its client retries, on the primary).
	for _, q := range []string{"SET SESSION lock_wait_timeout = 10", "FLUSH TABLES WITH READ LOCK"} {
		if _, err := lock.ExecContext(pctx, q); err != nil {
			resume()
			return nil, fmt.Errorf("storage: switch back: %s: %w", q, err)
		}
	}
	if err := killOthers(pctx, lock); err != nil {
		resume()
		return nil, fmt.Errorf("storage: switch back: ending the standby's other connections: %w", err)
	}
	if err := lock.QueryRowContext(pctx, "SELECT @@gtid_binlog_pos").Scan(&res.GTID); err != nil {
		resume()
		return nil, err
	}
	if err := gtidWait(pctx, pdb, res.GTID, 30*time.Second); err != nil {
		resume()
		return nil, fmt.Errorf("storage: switch back: the primary applying the standby's last commits: %w", err)
	}
	// The promotion mark goes first (not logged: the primary has none): from
	// then on a restarted cell no longer takes the standby for its database.
	_, _ = lock.ExecContext(wctx, "UNLOCK TABLES")
	for _, q := range []string{"SET SESSION sql_log_bin = 0", "DROP DATABASE IF EXISTS redcell_failover", "SET SESSION sql_log_bin = 1"} {
		if _, err := lock.ExecContext(pctx, q); err != nil {
			resume()
			return nil, fmt.Errorf("storage: switch back: the standby's promotion mark: %w", err)
		}
	}
	pc, err := connectorOf(f.primary)
	if err == nil {
		for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL"} {
			if _, err = pdb.ExecContext(wctx, q); err != nil {
				err = fmt.Errorf("the primary: %s: %w", q, err)
				break
			}
		}
	}
	if err != nil {
		// Still the standby's: it serves on, marked again.
		_, _ = pdb.ExecContext(wctx, "START SLAVE")
		_, _ = lock.ExecContext(wctx, "SET SESSION sql_log_bin = 0") // the primary replicates from it again: not its mark
		if merr := markPromoted(wctx, lock, f.primaryAddr, res.GTID, f.clock.Now().UnixMilli()); merr != nil {
			err = errors.Join(err, fmt.Errorf("and marking the standby as promoted again failed (a restarted cell would refuse to start): %w", merr))
		}
		resume()
		return nil, fmt.Errorf("storage: switch back: %w", err)
	}
	return pc, nil
}

// killOthers ends every client connection of the server behind conn but
// conn and replication's (a replica's binlog dump).
func killOthers(ctx context.Context, conn *sql.Conn) error {
	return killConns(ctx, conn, "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() "+
		"AND user <> 'system user' AND command NOT IN ('Binlog Dump', 'Binlog Dump GTID', 'Daemon', 'Killed')")
}

// followPrimary makes the server behind conn (the standby, which served
// until now, its tables unlocked, its promotion mark gone) the
// semi-synchronous replica of the primary, from the primary's binlog
// position, by GTID.
func (f *Failover) followPrimary(ctx context.Context, conn *sql.Conn, pdb *sql.DB) error {
	var ppos string
	if err := pdb.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&ppos); err != nil {
		return err
	}
	pcfg, _ := mysql.ParseDSN(f.primary)
	host, port, err := net.SplitHostPort(pcfg.Addr)
	if err != nil {
		return err
	}
	for _, q := range []string{
		"SET GLOBAL gtid_slave_pos = " + sqlQuote(ppos),
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%s, MASTER_USER=%s, MASTER_PASSWORD=%s, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
			sqlQuote(host), port, sqlQuote(pcfg.User), sqlQuote(pcfg.Passwd)),
		"SET GLOBAL rpl_semi_sync_slave_enabled = 1",
		// A replica now: its applier's commits must not wait for
		// acknowledgements of its own.
		"SET GLOBAL rpl_semi_sync_master_enabled = 0",
		"START SLAVE",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			words := strings.Fields(q)
			return fmt.Errorf("%s: %w", strings.Join(words[:min(3, len(words))], " "), err)
		}
	}
	return nil
}

// startWatch runs Watch again with the arguments it was last given (after a
// switch back; none: it was never started).
func (f *Failover) startWatch() {
	f.watchMu.Lock()
	ctx, after, every := f.watchCtx, f.watchAfter, f.watchEvery
	f.watchMu.Unlock()
	if ctx != nil && ctx.Err() == nil {
		go f.Watch(ctx, after, every)
	}
}

// gtidWait waits, in MASTER_GTID_WAIT, until the replica behind db has
// applied pos, up to max.
func gtidWait(ctx context.Context, db *sql.DB, pos string, max time.Duration) error {
	var waited sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", pos, max.Seconds()).Scan(&waited); err != nil {
		return err
	}
	if !waited.Valid || waited.Int64 != 0 {
		return fmt.Errorf("GTID %s not applied within %s", pos, max)
	}
	return nil
}

func sqlQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
