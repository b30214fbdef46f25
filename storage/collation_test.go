package storage

import (
	"context"
	"testing"

	"redcell/internal/testenv"
	"redcell/model"
)

// TestDatabasesCompareBytes: the databases the store creates compare text
// byte by byte even on a server (here: a session) whose default collation
// ignores case, so that order numbers and act_ids differing in case stay
// apart: two deposits under "O-1" and "o-1" are two deposits.
func TestDatabasesCompareBytes(t *testing.T) {
	// A session whose server default is case-insensitive: what a MariaDB
	// started without collation_server gives every new database.
	m, err := Open(testenv.MySQLDSN(t, 1)+"?character_set_server=utf8mb4&collation_server=%27utf8mb4_general_ci%27", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// A namespace of its own: the shared test databases exist already, and
	// CREATE DATABASE IF NOT EXISTS would not show what a new one gets.
	m.ns = "zcollate_"
	ctx := context.Background()
	t.Cleanup(func() { _, _ = m.DB().Exec("DROP DATABASE IF EXISTS zcollate_db_00") })
	var serverDefault string
	if err := m.DB().QueryRowContext(ctx, "SELECT @@collation_server").Scan(&serverDefault); err != nil || serverDefault != "utf8mb4_general_ci" {
		t.Fatalf("the session's default collation is %q (%v), want utf8mb4_general_ci", serverDefault, err)
	}
	const sh = model.ShardID(3)
	if err := m.EnsureShard(ctx, sh); err != nil {
		t.Fatal(err)
	}
	var dbColl string
	if err := m.DB().QueryRowContext(ctx, "SELECT default_collation_name FROM information_schema.schemata WHERE schema_name = 'zcollate_db_00'").Scan(&dbColl); err != nil {
		t.Fatal(err)
	}
	if dbColl != "utf8mb4_bin" {
		t.Errorf("zcollate_db_00's default collation is %s, want utf8mb4_bin", dbColl)
	}
	rows, err := m.DB().QueryContext(ctx, "SELECT table_name, table_collation FROM information_schema.tables WHERE table_schema = 'zcollate_db_00'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, coll string
		if err := rows.Scan(&name, &coll); err != nil {
			t.Fatal(err)
		}
		n++
		if coll != "utf8mb4_bin" && coll != "ascii_bin" {
			t.Errorf("table %s compares text with %s", name, coll)
		}
	}
	if n == 0 {
		t.Fatal("EnsureShard made no tables")
	}
	for _, order := range []string{"O-1", "o-1"} {
		d, err := Deposit(ctx, m, sh, "alice", order, 100)
		if err != nil || d.Repeat {
			t.Fatalf("deposit %s: %+v %v (a case-insensitive table takes it for a repeat or a conflict)", order, d, err)
		}
	}
	var balance int64
	if err := m.DB().QueryRowContext(ctx, "SELECT balance FROM "+m.accountTable(sh)+" WHERE act_id = 'alice'").Scan(&balance); err != nil || balance != 200 {
		t.Fatalf("alice's balance %d (%v), want 200: two deposits", balance, err)
	}
}
