package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/retry"
	"redcell/model"
)

// MySQL error numbers the money paths react to.
const (
	errDupEntry     = 1062
	errLockDeadlock = 1213
	errLockWait     = 1205
)

func isMySQLErr(err error, num uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == num
}

// errCommitUnknown is ErrCommitUnknown (store.go): a COMMIT that got no
// answer. The money paths re-read by order number (settleCommit) before
// answering with it.
var errCommitUnknown = ErrCommitUnknown

// commitUnknown is a COMMIT (or an autocommit statement) that got no answer,
// err: errCommitUnknown, and also model.ErrDBUnavailable when the
// connection broke or the server could not serve (DriverFailure, a bad
// connection), so that the caller's client is answered a retryable 503
// DB_UNAVAILABLE, as for any other dropped connection, not a 500.
func commitUnknown(err error) error {
	if DriverFailure(err) || errors.Is(err, driver.ErrBadConn) {
		return errors.Join(errCommitUnknown, fmt.Errorf("%w: %w", model.ErrDBUnavailable, err))
	}
	return errors.Join(errCommitUnknown, err)
}

// settleCommit finds out whether a transaction whose COMMIT got no answer was
// applied, by calling applied (a re-read by order number) up to three times
// within ctx, 100 ms apart on the store's clock, on fresh connections (the
// pool drops the dead one). known is false when every re-read failed too, or
// ctx ended first: the outcome stays unknown, and the caller answers with the
// commit's error (a retry with the same order number settles it).
func (m *MySQL) settleCommit(ctx context.Context, applied func() (bool, error)) (ok, known bool) {
	err := retry.Do(ctx, retry.Policy{Attempts: 3, Backoff: 100 * time.Millisecond, Max: 100 * time.Millisecond, Clock: m.clock},
		func(int) error {
			var err error
			ok, err = applied()
			return err
		})
	if err != nil {
		return false, false
	}
	return ok, true
}

// lockVictim reports whether fn's error in inTx is InnoDB choosing the
// transaction as a deadlock victim or a lock wait timing out: the transaction
// was rolled back and may run again. A COMMIT's error never is.
func lockVictim(err error) bool {
	return !errors.Is(err, errCommitUnknown) && (isMySQLErr(err, errLockDeadlock) || isMySQLErr(err, errLockWait))
}

// inTx runs fn in a transaction and runs it again (3 times in all, at once,
// while ctx lasts) when it is a lock victim (lockVictim); fn must be safe to
// re-run. A COMMIT without an answer is errCommitUnknown, never re-run.
func (m *MySQL) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	err := retry.Do(ctx, retry.Policy{Attempts: 3, Retryable: lockVictim, Clock: m.clock}, func(int) error {
		// On a connection of its own, so that execCounted can reach it.
		conn, err := m.db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("storage: begin: %w", err)
		}
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("storage: begin: %w", err)
		}
		m.txConns.put(tx, conn)
		defer m.txConns.drop(tx)
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("storage: commit: %w", commitUnknown(err))
		}
		return nil
	})
	if lockVictim(err) {
		return fmt.Errorf("storage: gave up after retries: %w", err)
	}
	return err
}

// flowInsert is the INSERT of one flow row (flowArgs gives its values).
func (m *MySQL) flowInsert(s model.ShardID) string {
	return "INSERT INTO " + m.flowTable(s) +
		" (act_id, order_no, kind, amount, balance_after, ref, req_hash, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
}

// flowArgs are the values of flow row f; a balance the decision did not know
// is written as NULL.
func flowArgs(f model.Flow) []any {
	after := sql.NullInt64{Int64: int64(f.BalanceAfter), Valid: f.BalanceKnown}
	return []any{f.ActID, f.OrderNo, string(f.Kind), f.Amount, after, f.Ref, f.ReqHash, f.CreatedMS}
}

// findFlow reads the flow row of (actID, orderNo); ok is false if there is none.
func (m *MySQL) findFlow(ctx context.Context, q queryer, s model.ShardID, actID, orderNo string) (model.Flow, bool, error) {
	f := model.Flow{ActID: actID, OrderNo: orderNo}
	var after sql.NullInt64
	err := q.QueryRowContext(ctx, "SELECT kind, amount, balance_after, ref, req_hash, created_ms FROM "+m.flowTable(s)+
		" WHERE act_id = ? AND order_no = ?", actID, orderNo).Scan(&f.Kind, &f.Amount, &after, &f.Ref, &f.ReqHash, &f.CreatedMS)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Flow{}, false, nil
	}
	if err != nil {
		return model.Flow{}, false, fmt.Errorf("storage: read flow: %w", err)
	}
	f.BalanceAfter, f.BalanceKnown = model.Cents(after.Int64), after.Valid
	return f, true, nil
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// account answers AccountQuery: the wallet of actID; an account never
// touched has balance 0.
func (m *MySQL) account(ctx context.Context, s model.ShardID, actID string) (model.Account, error) {
	if err := m.EnsureShard(ctx, s); err != nil {
		return model.Account{}, err
	}
	a := model.Account{ActID: actID, Shard: s}
	err := m.db.QueryRowContext(ctx, "SELECT balance FROM "+m.accountTable(s)+" WHERE act_id = ?", actID).Scan(&a.Balance)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return model.Account{}, fmt.Errorf("storage: read account: %w", err)
	}
	return a, nil
}

type creditOutcome int

const (
	creditApplied  creditOutcome = iota // booked now
	creditRepeat                        // booked before: nothing changed
	creditDeferred                      // a row it needs is locked: nothing written
)

// noWait runs one statement without waiting for a row lock another
// transaction holds (MariaDB's SET STATEMENT ... FOR, statement-scoped).
const noWait = "SET STATEMENT innodb_lock_wait_timeout=0 FOR "

// noWaitAny is noWait without a wait for a table's metadata lock either (a
// LOCK TABLES, a DDL under way): either wait answers error 1205 at once.
const noWaitAny = "SET STATEMENT innodb_lock_wait_timeout=0, lock_wait_timeout=0 FOR "

// creditOne books one credit inside tx (applyCreditsTx's path for a shard
// whose bulk statements could not be written whole). An error must fail
// the whole transaction. The decision (model.ApplyCredit) is asked as for a
// credit not booked yet; the flow row's UNIQUE order number then makes the
// INSERT of a credit booked before a no-op (0 rows affected), which is the
// decision's answer for a booked credit: nothing changes.
func (m *MySQL) creditOne(ctx context.Context, tx *sql.Tx, c model.Credit, now int64, nw string) (creditOutcome, error) {
	out := model.ApplyCredit(model.CreditInput{Credit: c, NowMS: now})
	f := out.Flow
	// In one lock order (shard, act_id, claim ID): insert the flow row, then
	// raise the balance (creating the account row), each without waiting
	// (innodb_lock_wait_timeout=0 for that statement; its error 1205 rolls
	// back only that statement, MariaDB's default innodb_rollback_on_timeout=OFF
	// keeping the transaction). When the account row is held, the flow row just
	// inserted is deleted again (it is this transaction's own, so that cannot
	// wait). Only a duplicate order number is ignored (0 rows affected).
	res, err := tx.ExecContext(ctx, nw+m.flowInsert(c.Shard)+" ON DUPLICATE KEY UPDATE id = id", flowArgs(f)...)
	if isMySQLErr(err, errLockWait) {
		return creditDeferred, stillInTx(ctx, tx) // nothing of this credit written
	}
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n == 0 { // booked before: as model.ApplyCredit answers for a booked credit, nothing changes
		return creditRepeat, nil
	}
	_, err = tx.ExecContext(ctx, nw+"INSERT INTO "+m.accountTable(c.Shard)+
		" (act_id, balance, updated_ms) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), updated_ms = VALUES(updated_ms)",
		f.ActID, f.Amount, f.CreatedMS)
	if isMySQLErr(err, errLockWait) {
		if err := stillInTx(ctx, tx); err != nil {
			return 0, err
		}
		// The wallet row is held: take the flow row back out (it is ours, so
		// this cannot wait). Should that fail, the whole transaction rolls back.
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+m.flowTable(c.Shard)+" WHERE act_id = ? AND order_no = ?", f.ActID, f.OrderNo); err != nil {
			return 0, fmt.Errorf("storage: take back the flow row of deferred credit %s: %w", c.ClaimID, err)
		}
		return creditDeferred, nil
	}
	if err != nil {
		return 0, err
	}
	return creditApplied, nil
}

// stillInTx checks, after a statement failed with a lock wait timeout, that
// only that statement was rolled back. A server run with
// innodb_rollback_on_timeout=ON rolls back the whole transaction instead, and
// what followed would run outside it: the batch must then fail as a whole.
func stillInTx(ctx context.Context, tx *sql.Tx) error {
	var in int
	if err := tx.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&in); err != nil {
		return fmt.Errorf("storage: after a lock wait: %w", err)
	}
	if in != 1 {
		return errors.New("storage: a lock wait timeout ended the whole transaction (innodb_rollback_on_timeout=ON); credits need it OFF")
	}
	return nil
}
