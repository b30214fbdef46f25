package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"

	"redcell/model"
)

// switchConnector dials the server that serves now, and stamps each
// connection with the generation it was dialed in: a switch (or a
// promotion beginning) starts a new generation, and connections of an
// older one are refused by the pool (IsValid, ResetSession) and fail every
// call, so no statement of this cell reaches the old primary after it.
// It also counts the round trips its connections make (trips): a store
// opened without a standby dials through one that never switches.
type switchConnector struct {
	mu      sync.Mutex
	cur     driver.Connector
	gen     atomic.Int64
	refusal error // while a promotion runs: no new connection
	trips   atomic.Int64
	// fence, when set (Lease.register, SetLease), runs on each new
	// connection before its first use; an error refuses it.
	fence func(context.Context, driver.Conn) error
}

// connect dials a connection of the current generation, behind g.
func (c *switchConnector) connect(ctx context.Context, g *gate) (driver.Conn, error) {
	c.mu.Lock()
	cur, refusal, gen, fence := c.cur, c.refusal, c.gen.Load(), c.fence
	c.mu.Unlock()
	if refusal != nil {
		return nil, refusal
	}
	conn, err := cur.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if fence != nil {
		c.trips.Add(1)
		if err := fence(ctx, conn); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return &genConn{Conn: conn, gen: gen, sw: c, gate: g}, nil
}

func (c *switchConnector) Driver() driver.Driver { return mysql.MySQLDriver{} }

// set sends new connections to to, in a new generation.
func (c *switchConnector) set(to driver.Connector) {
	c.mu.Lock()
	c.cur, c.refusal = to, nil
	c.gen.Add(1)
	c.mu.Unlock()
}

// refuse makes every connection stale and refuses new ones with err until
// set or resume.
func (c *switchConnector) refuse(err error) {
	c.mu.Lock()
	c.refusal = err
	c.gen.Add(1)
	c.mu.Unlock()
}

// resume dials the current server again (a promotion abandoned).
func (c *switchConnector) resume() {
	c.mu.Lock()
	c.refusal = nil
	c.mu.Unlock()
}

// genConn is a connection of one generation of a switchConnector. Its
// round trips but COMMIT and ROLLBACK go through its pool's gate (Guarded);
// one the breaker refuses is not counted in trips (it never left).
type genConn struct {
	driver.Conn
	gen  int64
	sw   *switchConnector
	gate *gate
}

func (c *genConn) stale() bool { return c.gen != c.sw.gen.Load() }

func (c *genConn) IsValid() bool {
	if c.stale() {
		return false
	}
	v, ok := c.Conn.(driver.Validator)
	return !ok || v.IsValid()
}

func (c *genConn) ResetSession(ctx context.Context) error {
	if c.stale() {
		return driver.ErrBadConn
	}
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *genConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.stale() {
		return nil, errStale
	}
	var tx driver.Tx
	err := Guarded(c.gate.breaker(), func() (err error) {
		// The driver sets a non-default isolation level with a statement
		// of its own before START TRANSACTION.
		if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) {
			c.sw.trips.Add(1)
		}
		c.sw.trips.Add(1)
		tx, err = c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &genTx{Tx: tx, c: c}, nil
}

func (c *genConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.stale() {
		return nil, errStale
	}
	var st driver.Stmt
	err := Guarded(c.gate.breaker(), func() (err error) {
		c.sw.trips.Add(1)
		st, err = c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
		return err
	})
	return st, err
}

func (c *genConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.stale() {
		return nil, errStale
	}
	exec := func() (res driver.Result, err error) {
		c.sw.trips.Add(1)
		return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	}
	if endsTx(query) {
		// A transaction begun as a statement (a snapshot's START
		// TRANSACTION) ends as one: never refused, as genTx's are not.
		return exec()
	}
	var res driver.Result
	err := Guarded(c.gate.breaker(), func() (err error) { res, err = exec(); return err })
	return res, err
}

// endsTx reports whether query is a lone COMMIT or ROLLBACK.
func endsTx(query string) bool {
	q := strings.TrimSpace(query)
	return strings.EqualFold(q, "ROLLBACK") || strings.EqualFold(q, "COMMIT")
}

func (c *genConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.stale() {
		return nil, errStale
	}
	var rows driver.Rows
	err := Guarded(c.gate.breaker(), func() (err error) {
		c.sw.trips.Add(1)
		rows, err = c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
		return err
	})
	return rows, err
}

func (c *genConn) Ping(ctx context.Context) error {
	if c.stale() {
		return driver.ErrBadConn
	}
	return Guarded(c.gate.breaker(), func() error { c.sw.trips.Add(1); return c.Conn.(driver.Pinger).Ping(ctx) })
}

func (c *genConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// genTx is a transaction of a genConn: begun before a switch, it is rolled
// back rather than committed (on the old primary) after it.
type genTx struct {
	driver.Tx
	c *genConn
}

func (t *genTx) Commit() error {
	t.c.sw.trips.Add(1)
	if t.c.stale() {
		_ = t.Tx.Rollback()
		return model.Errorf(model.ErrDBUnavailable, "the cell's database server was switched during this transaction; not committed")
	}
	return t.Tx.Commit()
}

func (t *genTx) Rollback() error {
	t.c.sw.trips.Add(1)
	return t.Tx.Rollback()
}

// errStale is a call on a connection of an older generation (dialed before
// a promotion or a switch back): driver.ErrBadConn, so database/sql takes
// another connection where it can, and a retryable DB_UNAVAILABLE where it
// cannot (inside a transaction), not a 500.
var errStale = fmt.Errorf("storage: a connection to the cell's former database server: %w: %w", model.ErrDBUnavailable, driver.ErrBadConn)
