package storage

import (
	"context"
	"database/sql"
	"testing"
)

// RoundTrips counts what reaches the server: a statement, a BEGIN (two with
// an isolation level: the driver sets it first), a COMMIT, a ROLLBACK, a
// ping; its Shadow store counts into the same total.
func TestRoundTrips(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	step := func(name string, want int64, fn func() error) {
		t.Helper()
		before := m.RoundTrips()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := m.RoundTrips() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		}
	}
	step("a statement", 1, func() error { _, err := m.db.ExecContext(ctx, "DO 1"); return err })
	step("a statement list", 1, func() error { _, err := m.db.ExecContext(ctx, "DO 1; DO 2; DO 3"); return err })
	step("a ping", 1, func() error { return m.Ping(ctx) })
	step("begin, statement, commit", 3, func() error {
		return m.inTx(ctx, func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, "DO 1"); return err })
	})
	step("begin read committed, query, rollback", 4, func() error {
		tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		var one int
		if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			return err
		}
		return tx.Rollback()
	})
	step("the shadow store's statement", 1, func() error { _, err := m.Shadow().db.ExecContext(ctx, "DO 1"); return err })
}
