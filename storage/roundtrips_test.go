package storage

import (
	"context"
	"database/sql"
	"slices"
	"testing"

	"redcell/internal/testenv"
	"redcell/model"
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

// execCounted reports each statement's rows affected, as the server counts
// them: an INSERT ... ON DUPLICATE KEY UPDATE k = k stores 1 row new, 0
// when the key is there; typed arguments (model.Cents) are converted as
// database/sql converts them. Outside a transaction of inTx it refuses.
func TestExecCounted(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	name := testenv.Prefix() + "counted"
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS " + name, "DROP TABLE IF EXISTS " + name + ".t",
		"CREATE TABLE " + name + ".t (k INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB"} {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { m.db.Exec("DROP DATABASE IF EXISTS " + name) })
	ins := "INSERT INTO " + name + ".t (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE k = k"
	var counts []int64
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		counts, err = m.execCounted(ctx, tx, ins+";"+ins+";INSERT INTO "+name+".t (k, v) VALUES (?, ?), (?, ?) ON DUPLICATE KEY UPDATE k = k",
			1, model.Cents(10), 1, model.Cents(10), 2, model.Cents(20), 3, int64(30))
		return err
	})
	if err != nil || !slices.Equal(counts, []int64{1, 0, 2}) {
		t.Fatalf("counts %v, %v; want [1 0 2]", counts, err)
	}
	var sum int64
	if err := m.db.QueryRowContext(ctx, "SELECT SUM(v) FROM "+name+".t").Scan(&sum); err != nil || sum != 60 {
		t.Fatalf("rows sum %d (%v), want 60: the list committed with its transaction", sum, err)
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := m.execCounted(ctx, tx, "DO 1"); err == nil {
		t.Fatal("a transaction not begun by inTx was taken")
	}
}
