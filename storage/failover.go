package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Failover is a cell's database with a standby: a MariaDB replica of the
// primary, fed by semi-synchronous replication (the standby acknowledges a
// transaction's binlog events before the primary answers its COMMIT, so an
// acknowledged commit is on the standby too; see deploy/local/services.sh
// start_standby). The store's pool dials whichever server serves; Watch
// promotes the standby when the primary has not answered for a while, and
// the pool dials the standby from then on. It never switches back: the old
// primary, if it returns, holds a past the standby has gone beyond, and is
// rebuilt as the new standby by hand (docs/operations.md).
type Failover struct {
	primary, standby string // DSNs with the driver's parameters
	sw               *switchConnector
	db               *sql.DB // the store's pool
	maxConns         int
	promoted         atomic.Bool
	log              *slog.Logger

	// Promotions counts standbys promoted by this process; PrimaryDown is
	// when the primary stopped answering (zero while it answers).
	Promotions  atomic.Int64
	primaryDown atomic.Int64 // Unix ms
}

// switchConnector dials the server that serves now.
type switchConnector struct {
	mu  sync.Mutex
	cur driver.Connector
}

func (c *switchConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c.mu.Lock()
	cur := c.cur
	c.mu.Unlock()
	return cur.Connect(ctx)
}

func (c *switchConnector) Driver() driver.Driver { return mysql.MySQLDriver{} }

func (c *switchConnector) set(to driver.Connector) {
	c.mu.Lock()
	c.cur = to
	c.mu.Unlock()
}

func connectorOf(dsn string) (driver.Connector, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("storage: bad DSN: %w", err)
	}
	return mysql.NewConnector(cfg)
}

// OpenFailover is Open for a primary with a standby (DSNs as Open takes
// them). It serves from the primary unless the standby was promoted
// already (it replicates from nothing: an earlier process promoted it), so
// a cell restarted after a failover keeps writing where it wrote last.
// Errors: a bad DSN; a standby that cannot be reached is not an error (the
// primary serves, and Watch cannot promote until it answers).
func OpenFailover(primaryDSN, standbyDSN string, maxConns int, log *slog.Logger) (*MySQL, *Failover, error) {
	primary, err := withParams(primaryDSN)
	if err != nil {
		return nil, nil, err
	}
	standby, err := withParams(standbyDSN)
	if err != nil {
		return nil, nil, err
	}
	pc, err := connectorOf(primary)
	if err != nil {
		return nil, nil, err
	}
	f := &Failover{primary: primary, standby: standby, sw: &switchConnector{cur: pc}, maxConns: maxConns, log: log}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if replicating, err := f.standbyReplicates(ctx); err == nil && !replicating {
		sc, err := connectorOf(standby)
		if err != nil {
			return nil, nil, err
		}
		f.sw.set(sc)
		f.promoted.Store(true)
		log.Warn("the standby replicates from nobody: an earlier process promoted it, and the cell serves from it; rebuild the old primary as its standby (docs/operations.md)")
	}
	db := sql.OpenDB(f.sw)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxLifetime(5 * time.Minute)
	f.db = db
	return newMySQL(db), f, nil
}

// OnStandby reports whether the standby serves (it was promoted).
func (f *Failover) OnStandby() bool { return f.promoted.Load() }

// PrimaryDownSince is when the primary stopped answering Watch's pings
// (zero while it answers, or once the standby serves).
func (f *Failover) PrimaryDownSince() time.Time {
	if ms := f.primaryDown.Load(); ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}

// standbyReplicates asks the standby whether it is configured as a replica.
func (f *Failover) standbyReplicates(ctx context.Context) (bool, error) {
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		return false, err
	}
	defer db.Close()
	st, err := slaveStatus(ctx, db)
	return st != nil, err
}

// slaveStatus reads SHOW SLAVE STATUS as column → value (nil: not a replica).
func slaveStatus(ctx context.Context, db *sql.DB) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	if !rows.Next() {
		return nil, rows.Err()
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(cols))
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out, rows.Err()
}

// Promote makes the standby serve: it stops taking the primary's binlog,
// applies everything it received (every acknowledged commit, under
// semi-synchronous replication), forgets the primary and sends the pool's
// new connections to it; connections to the primary fail and are dropped
// as they are used. Errors: the standby's (it is then not promoted).
func (f *Failover) Promote(ctx context.Context) error {
	if f.promoted.Load() {
		return nil
	}
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	f.log.Info("failover: promoting the standby: stopping its replication")
	if _, err := db.ExecContext(ctx, "STOP SLAVE IO_THREAD"); err != nil {
		return fmt.Errorf("storage: promote: stop taking the binlog: %w", err)
	}
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return fmt.Errorf("storage: promote: read the replica's state: %w", err)
	}
	if st != nil {
		f.log.Info("failover: waiting for the standby to apply what it received", "gtid_io_pos", st["Gtid_IO_Pos"])
		var waited sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 60)", st["Gtid_IO_Pos"]).Scan(&waited); err != nil || !waited.Valid || waited.Int64 != 0 {
			return errors.Join(err, fmt.Errorf("storage: promote: the standby did not apply what it received (up to %q) within 60 s", st["Gtid_IO_Pos"]))
		}
		f.log.Info("failover: applied; forgetting the primary")
		if _, err := db.ExecContext(ctx, "STOP SLAVE"); err != nil {
			return fmt.Errorf("storage: promote: %w", err)
		}
		if _, err := db.ExecContext(ctx, "RESET SLAVE ALL"); err != nil {
			return fmt.Errorf("storage: promote: %w", err)
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
	// Idle connections to the old primary go now; busy ones fail on their
	// next use and the pool drops them.
	f.db.SetMaxIdleConns(0)
	f.db.SetMaxIdleConns(f.maxConns)
	return nil
}

// Watch pings the primary every interval until ctx ends or the standby
// serves; once the primary has not answered for after, it promotes the
// standby (trying again at each ping while that fails). A primary that
// answers again before after ends the outage: a database restart (the
// db_restart drill, about a second) never promotes.
func (f *Failover) Watch(ctx context.Context, after, interval time.Duration) {
	probe, err := sql.Open("mysql", f.primary)
	if err != nil {
		f.log.Error("failover: cannot watch the primary", "err", err)
		return
	}
	defer probe.Close()
	probe.SetMaxOpenConns(1)
	probe.SetConnMaxLifetime(time.Second) // a fresh connection each ping: a dead server is seen at once
	t := time.NewTicker(interval)
	defer t.Stop()
	for !f.promoted.Load() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, min(interval, 2*time.Second))
		err := probe.PingContext(pctx)
		cancel()
		now := time.Now()
		if err == nil {
			if down := f.primaryDown.Swap(0); down > 0 {
				f.log.Info("failover: the primary answers again; no promotion", "down_for", now.Sub(time.UnixMilli(down)).Round(time.Millisecond))
			}
			continue
		}
		down := f.primaryDown.Load()
		if down == 0 {
			f.primaryDown.Store(now.UnixMilli())
			f.log.Warn("failover: the primary does not answer; the standby is promoted if it stays down", "after", after, "err", err)
			continue
		}
		if now.Sub(time.UnixMilli(down)) < after {
			continue
		}
		if err := f.Promote(ctx); err != nil {
			f.log.Error("failover: promoting the standby failed; trying again", "err", err)
			continue
		}
		f.log.Warn("failover: the standby was promoted and serves; the old primary must be rebuilt as its standby",
			"primary_down_for", now.Sub(time.UnixMilli(down)).Round(time.Millisecond))
	}
}
