package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"redcell/model"
)

// A cell may run more than one process for the same databases (a SET of
// several servers): one serves, the others wait. Which one serves is a
// lease in the cell's own database, redcell_meta.t_lease: one row per cell
// with the holder's slot (cell/proc), a generation that grows at each
// change of holder, and an expiry on the server's clock. The holder renews
// it; another process takes it only once it has expired (or when it holds
// the same slot: a restart of that process). Two processes never write at
// once because the connections are fenced by generation, as
// storage.Failover's are by server: each connection the serving process's
// pools open first registers itself under the lease's generation
// (redcell_meta.t_lease_conns, in one statement that fails once the
// generation has moved on), and a process that takes the lease ends every
// connection registered under an older generation. A holder that hung and
// wakes up finds its connections ended and new ones refused, and its next
// renewal tells it the lease is lost.

// Lease is a held lease: Generation is what the holder's connections
// register under.
type Lease struct {
	Cell       string
	Slot       string // cell/proc: a process of this slot may take the lease at once
	Holder     string // the slot and where it runs, for logs
	Generation int64
	TTL        time.Duration
}

// ErrLeaseLost: a renewal found the lease under another generation (another
// process took it): the process must stop serving.
var ErrLeaseLost = errors.New("storage: the cell's lease was taken by another process")

// errFenced refuses a connection of a process whose lease generation has
// moved on: a retryable DB_UNAVAILABLE to its clients, and ErrLeaseLost to
// its renewal.
var errFenced = fmt.Errorf("%w: %w", model.Errorf(model.ErrDBUnavailable, "this process no longer holds the cell's lease: another process serves it"), ErrLeaseLost)

const leaseDDL = "CREATE TABLE IF NOT EXISTS redcell_meta.t_lease (cell VARCHAR(64) NOT NULL PRIMARY KEY, slot VARCHAR(128) NOT NULL, " +
	"holder VARCHAR(255) NOT NULL, generation BIGINT NOT NULL, expires_ms BIGINT NOT NULL) ENGINE=InnoDB"

// t_lease_conns: a connection id names a connection on one server in one of
// its runs (ids start again at a restart, and rows travel to replicas), so a
// row keeps the server's id and start (Unix s) too, and only rows of the
// server in its current run name connections a taker may end.
const leaseConnsDDL = "CREATE TABLE IF NOT EXISTS redcell_meta.t_lease_conns (conn_id BIGINT UNSIGNED NOT NULL, " +
	"server_id BIGINT UNSIGNED NOT NULL, started BIGINT NOT NULL, cell VARCHAR(64) NOT NULL, generation BIGINT NOT NULL, " +
	"registered BIGINT NOT NULL DEFAULT 1, PRIMARY KEY (server_id, conn_id), KEY k_gen (cell, generation)) ENGINE=InnoDB"

// serverStarted is the server's start in Unix seconds (its clock less its
// uptime; a second either way between two reads).
const serverStarted = "(SELECT CAST(UNIX_TIMESTAMP() - VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME')"

// EnsureLease makes the lease tables on the server behind db.
func EnsureLease(ctx context.Context, db *sql.DB) error {
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS redcell_meta" + dbDefaults, leaseDDL, leaseConnsDDL} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("storage: lease: %w", err)
		}
	}
	return nil
}

// nowMS is the server's clock in Unix ms: every process of a cell reads
// expiries on one clock, whatever their machines' clocks say.
const nowMS = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

// TakeLease tries once to take cell's lease for slot on the server behind
// db (the cell's serving database, its tables made by EnsureLease; not a
// store's pool, whose connections would not be fenced). It takes it when
// nobody holds it, when it expired, or when slot holds it (that process
// restarted); then it ends every connection registered under an older
// generation. Otherwise ok is false and other and left say who holds it
// and for how much longer. An error with ok false: the lease may have been
// taken but the older connections not all ended; the caller must not serve,
// and tries again (the same slot takes it again at once).
func TakeLease(ctx context.Context, db *sql.DB, cell, slot, holder string, ttl time.Duration) (l Lease, ok bool, other string, left time.Duration, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return l, false, "", 0, err
	}
	defer tx.Rollback()
	var curSlot, curHolder string
	var gen, expires, now int64
	err = tx.QueryRowContext(ctx, "SELECT slot, holder, generation, expires_ms, "+nowMS+" FROM redcell_meta.t_lease WHERE cell = ? FOR UPDATE", cell).
		Scan(&curSlot, &curHolder, &gen, &expires, &now)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := tx.QueryRowContext(ctx, "SELECT "+nowMS).Scan(&now); err != nil {
			return l, false, "", 0, err
		}
	case err != nil:
		return l, false, "", 0, err
	case curSlot != slot && expires > now:
		return l, false, curHolder, time.Duration(expires-now) * time.Millisecond, nil
	}
	gen++
	if _, err := tx.ExecContext(ctx, "REPLACE INTO redcell_meta.t_lease (cell, slot, holder, generation, expires_ms) VALUES (?, ?, ?, ?, ?)",
		cell, slot, holder, gen, now+ttl.Milliseconds()); err != nil {
		return l, false, "", 0, err
	}
	if err := tx.Commit(); err != nil {
		return l, false, "", 0, err
	}
	l = Lease{Cell: cell, Slot: slot, Holder: holder, Generation: gen, TTL: ttl}
	if err := endOlder(ctx, db, l); err != nil {
		return Lease{}, false, curHolder, 0, err
	}
	return l, true, curHolder, 0, nil
}

// endOlder ends the connections registered under generations older than
// l's: from the lease's commit on, no new one registers under them.
func endOlder(ctx context.Context, db *sql.DB, l Lease) error {
	// Only rows of this server in its current run, of connections that are
	// still there, and never the caller's own.
	err := killConns(ctx, db, "SELECT c.conn_id FROM redcell_meta.t_lease_conns c JOIN information_schema.PROCESSLIST p ON p.ID = c.conn_id "+
		"WHERE c.cell = ? AND c.generation < ? AND c.server_id = @@server_id AND ABS(c.started - "+serverStarted+") <= 2 AND c.conn_id <> CONNECTION_ID()",
		l.Cell, l.Generation)
	if err != nil {
		return fmt.Errorf("storage: lease: the older holder's connections: %w", err)
	}
	_, err = db.ExecContext(ctx, "DELETE FROM redcell_meta.t_lease_conns WHERE cell = ? AND generation < ?", l.Cell, l.Generation)
	return err
}

// registerSQL registers the connection under the lease's generation
// (arguments: cell, generation); see register.
const registerSQL = "INSERT INTO redcell_meta.t_lease_conns (conn_id, server_id, started, cell, generation) " +
	"SELECT CONNECTION_ID(), @@server_id, " + serverStarted + ", cell, generation FROM redcell_meta.t_lease WHERE cell = ? AND generation = ? LOCK IN SHARE MODE " +
	"ON DUPLICATE KEY UPDATE started = VALUES(started), cell = VALUES(cell), generation = VALUES(generation), registered = registered + 1"

// register is the fence every new connection of the holder passes: it
// records itself under the lease's generation, in one statement that
// inserts nothing once the generation has moved on (the lease row's lock
// orders it with a taker's update), and then the connection is refused.
func (l Lease) register(ctx context.Context, conn driver.Conn) error {
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		return errors.New("storage: lease: the driver's connection cannot execute statements")
	}
	// LOCK IN SHARE MODE: the read of the lease row locks it whatever the
	// isolation level, so a taker's update and this insert are ordered. A
	// row left by an earlier connection with this id (a server restart)
	// is taken over: registered grows, so the statement always changes it.
	res, err := ex.ExecContext(ctx, registerSQL,
		[]driver.NamedValue{{Ordinal: 1, Value: l.Cell}, {Ordinal: 2, Value: l.Generation}})
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errFenced
	}
	return nil
}

// SetLease fences the store's connections (and its shadow's, which share
// them) with l: each new one registers under l's generation first, and is
// refused once another process took the lease. Set before the pool's
// first connection.
func (m *MySQL) SetLease(l Lease) {
	m.sw.mu.Lock()
	m.sw.fence = l.register
	m.sw.mu.Unlock()
}

// RenewLease extends l by its TTL from the server's clock now, through the
// store's own (fenced) connections. Errors: ErrLeaseLost when another
// process took it; the server's.
func (m *MySQL) RenewLease(ctx context.Context, l Lease) error {
	var gen int64
	return m.inTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, "SELECT generation FROM redcell_meta.t_lease WHERE cell = ? FOR UPDATE", l.Cell).Scan(&gen)
		if errors.Is(err, sql.ErrNoRows) || err == nil && gen != l.Generation {
			return ErrLeaseLost
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE redcell_meta.t_lease SET expires_ms = "+nowMS+" + ? WHERE cell = ? AND generation = ?",
			l.TTL.Milliseconds(), l.Cell, l.Generation)
		return err
	})
}

// ReleaseLease ends l at once (a graceful stop): a waiting process takes it
// at its next try instead of after the TTL.
func (m *MySQL) ReleaseLease(ctx context.Context, l Lease) error {
	_, err := m.db.ExecContext(ctx, "UPDATE redcell_meta.t_lease SET expires_ms = 0 WHERE cell = ? AND generation = ?", l.Cell, l.Generation)
	return err
}

// OpenRaw opens a plain pool to dsn (the driver's parameters added, as Open
// does) for work outside a store: taking a lease.
func OpenRaw(dsn string) (*sql.DB, error) {
	full, err := withParams(dsn)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("mysql", full)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	return db, nil
}
