package storage

import (
	"testing"

	"redcell/internal/testenv"
)

// TestDigest: a database's digest (what a move verifies on both servers)
// changes with any row of any of its tables, shadow ones included, and comes
// back when the row goes; an empty table counts as a missing one.
func TestDigest(t *testing.T) {
	m, err := Open(testenv.MySQLDSN(t, 1), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := t.Context()
	exec := func(q string) {
		t.Helper()
		if _, err := m.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const db = 97
	for _, s := range MoveSchemas(db) {
		exec("CREATE DATABASE IF NOT EXISTS " + s)
		exec("DROP TABLE IF EXISTS " + s + ".t_digest_probe")
	}
	before, err := m.Digest(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	exec("CREATE TABLE db_97.t_digest_probe (id INT PRIMARY KEY, v BIGINT NOT NULL)")
	t.Cleanup(func() {
		for _, s := range MoveSchemas(db) {
			_, _ = m.DB().Exec("DROP TABLE IF EXISTS " + s + ".t_digest_probe")
		}
	})
	empty, err := m.Digest(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if empty.Sum() != before.Sum() {
		t.Fatalf("an empty table changed the digest: %v", empty.Diff(before))
	}
	exec("INSERT INTO db_97.t_digest_probe VALUES (1, 100)")
	one, _ := m.Digest(ctx, db)
	exec("UPDATE db_97.t_digest_probe SET v = 101")
	changed, _ := m.Digest(ctx, db)
	if one.Sum() == before.Sum() || changed.Sum() == one.Sum() {
		t.Fatalf("a row, or a changed value, left the digest as it was")
	}
	if d := changed.Diff(one); len(d) != 1 || one["db_97.t_digest_probe"].Rows != 1 {
		t.Fatalf("diff %v, rows %+v", d, one["db_97.t_digest_probe"])
	}
	exec("CREATE TABLE shadow_db_97.t_digest_probe (id INT PRIMARY KEY)")
	exec("INSERT INTO shadow_db_97.t_digest_probe VALUES (7)")
	shadow, _ := m.Digest(ctx, db)
	if shadow.Sum() == changed.Sum() {
		t.Fatal("a shadow row left the digest as it was: shadow_db_XX moves with db_XX")
	}
	exec("DELETE FROM shadow_db_97.t_digest_probe")
	exec("DELETE FROM db_97.t_digest_probe")
	if after, _ := m.Digest(ctx, db); after.Sum() != before.Sum() {
		t.Fatalf("the digest did not come back with the rows gone: %v", after.Diff(before))
	}
}
