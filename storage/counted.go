package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	"github.com/go-sql-driver/mysql"
)

// Rows affected per statement of a statement list, as the server reports
// them: an INSERT ... ON DUPLICATE KEY UPDATE k = k affects 1 row when it
// stored a new one and 0 when the key was there (clientFoundRows is off,
// withParams). database/sql gives only the last statement's count, so the
// list is sent on the transaction's own connection (sql.Conn.Raw) and the
// driver's per-statement counts read (mysql.Result.AllRowsAffected); no
// session variable, no statement of ours to read it back.

// txConnMap maps each transaction inTx runs to the connection it was
// begun on, while it runs (execCounted needs it).
type txConnMap struct {
	mu sync.Mutex
	m  map[*sql.Tx]*sql.Conn
}

func (t *txConnMap) put(tx *sql.Tx, c *sql.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[*sql.Tx]*sql.Conn{}
	}
	t.m[tx] = c
}

func (t *txConnMap) drop(tx *sql.Tx) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, tx)
}

func (t *txConnMap) get(tx *sql.Tx) (*sql.Conn, bool) {
	if t == nil {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.m[tx]
	return c, ok
}

func (m *MySQL) conns() *txConnMap { return m.txConns }

// execCounted runs query, a statement list, inside tx (which inTx began)
// and returns the rows each statement affected, in order. Errors: the
// server's (the list stops at the first failing statement), or a tx not
// begun by inTx.
func (m *MySQL) execCounted(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]int64, error) {
	conn, ok := m.conns().get(tx)
	if !ok {
		return nil, errors.New("storage: a counted statement list outside a transaction of inTx")
	}
	return execList(ctx, conn, query, args...)
}

// execList runs query, a statement list, on conn in one round trip and
// returns the rows each statement affected, in order (see execCounted). A
// lost connection is returned as a plain error: from Raw, ErrBadConn would
// make the Conn close itself, which waits for a transaction on it to end,
// which waits for this call (the transaction's rollback, or the caller's
// Close, discards the connection).
func execList(ctx context.Context, conn *sql.Conn, query string, args ...any) ([]int64, error) {
	var counts []int64
	err := conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return fmt.Errorf("storage: connection %T cannot execute", dc)
		}
		named := make([]driver.NamedValue, len(args))
		checker, _ := dc.(driver.NamedValueChecker)
		for i, a := range args {
			nv := driver.NamedValue{Ordinal: i + 1, Value: a}
			err := driver.ErrSkip
			if checker != nil {
				err = checker.CheckNamedValue(&nv)
			}
			if errors.Is(err, driver.ErrSkip) {
				nv.Value, err = driver.DefaultParameterConverter.ConvertValue(a)
			}
			if err != nil {
				return fmt.Errorf("storage: argument %d: %w", i+1, err)
			}
			named[i] = nv
		}
		res, err := ex.ExecContext(ctx, query, named)
		if errors.Is(err, driver.ErrBadConn) {
			return fmt.Errorf("storage: connection lost: %v", err)
		}
		if err != nil {
			return err
		}
		mr, ok := res.(mysql.Result)
		if !ok {
			return fmt.Errorf("storage: result %T gives no per-statement counts", res)
		}
		counts = mr.AllRowsAffected()
		return nil
	})
	return counts, err
}
