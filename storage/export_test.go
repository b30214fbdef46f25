package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
)

// ContractMySQL opens, for the contract suite (contract_test.go, package
// storage_test), an empty store on test server 1: its databases carry a fresh
// name prefix (ct<8 hex>_db_XX), so its Ledger reads its own rows only, and
// they are dropped when the test ends. Its clock is clk. Its connections go
// through a commitCutter, which failNextCommit arms: the next COMMIT is cut,
// after reaching the server when lostAnswer is set; cuts counts the COMMITs
// cut. Skips without a server.
func ContractMySQL(t testing.TB, clk clock.Clock) (m *MySQL, failNextCommit func(lostAnswer bool), cuts func() int64) {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	p := newCommitCutter(t, cfg.Addr)
	cfg.Addr = p.ln.Addr().String()
	m, err = Open(cfg.FormatDSN(), 8)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	m.ns = "ct" + hex.EncodeToString(b[:]) + "_"
	m.SetClock(clk)
	t.Cleanup(func() { m.Close() })
	t.Cleanup(func() { dropNamespace(t, m) })
	return m, p.arm, p.cuts.Load
}

// dropNamespace drops the databases of m's name prefix.
func dropNamespace(t testing.TB, m *MySQL) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := m.db.QueryContext(ctx, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?", m.ns+"%")
	if err != nil {
		t.Errorf("list databases of %s: %v", m.ns, err)
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Error(err)
		}
		names = append(names, n)
	}
	rows.Close()
	for _, n := range names {
		if _, err := m.db.ExecContext(ctx, "DROP DATABASE "+n); err != nil {
			t.Errorf("drop %s: %v", n, err)
		}
	}
}

// PutFlowRow writes f into shard s's flow table and adds delta to the balance
// of f.ActID's wallet there (made if missing), straight in SQL with none of
// the store's checks: the contract's Harness.PutFlow, for flow rows no call
// of the suite writes (reward, withdraw) and for books broken on purpose
// (delta other than f.Amount). It writes the row as the store does (flowArgs).
func PutFlowRow(t testing.TB, m *MySQL, s model.ShardID, f model.Flow, delta model.Cents) {
	t.Helper()
	ctx := context.Background()
	if err := m.EnsureShard(ctx, s); err != nil {
		t.Fatalf("put flow: ensure shard %d: %v", s, err)
	}
	if _, err := m.db.ExecContext(ctx, m.flowInsert(s), flowArgs(f)...); err != nil {
		t.Fatalf("put flow %+v: %v", f, err)
	}
	// Made at 0 first, then changed: the row an INSERT proposes is checked
	// (balance >= 0) even when it turns into an update.
	if _, err := m.db.ExecContext(ctx, "INSERT IGNORE INTO "+m.accountTable(s)+" (act_id, balance, updated_ms) VALUES (?, 0, ?)",
		f.ActID, f.CreatedMS); err != nil {
		t.Fatalf("put flow: wallet of %s: %v", f.ActID, err)
	}
	if _, err := m.db.ExecContext(ctx, "UPDATE "+m.accountTable(s)+" SET balance = balance + ?, updated_ms = ? WHERE act_id = ?",
		int64(delta), f.CreatedMS, f.ActID); err != nil {
		t.Fatalf("put flow: balance of %s += %d: %v", f.ActID, delta, err)
	}
}

// HoldWallet holds the wallet row of actID in shard s locked from a
// transaction of its own, on a connection of its own, as another request
// holding it would (storagetest.Harness.HoldWallet): it writes the row (made
// at balance 0 where it was missing) and stays open. waiters is the
// server's count of row-lock waits now (Innodb_row_lock_current_waits: any
// transaction's; information_schema's lock-wait tables do not list the
// groups' waits on this server); release rolls the hold back (again: a
// no-op).
func HoldWallet(t testing.TB, m *MySQL, s model.ShardID, actID string) (waiters func() int, release func()) {
	t.Helper()
	ctx := context.Background()
	if err := m.EnsureShard(ctx, s); err != nil {
		t.Fatalf("hold wallet: ensure shard %d: %v", s, err)
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("hold wallet: %v", err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+m.accountTable(s)+" (act_id, balance, updated_ms) VALUES (?, 0, 0) ON DUPLICATE KEY UPDATE balance = balance", actID); err != nil {
		_ = tx.Rollback()
		t.Fatalf("hold wallet of %s: %v", actID, err)
	}
	var once sync.Once
	waiters = func() int {
		var name string
		var n int
		if err := m.db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_current_waits'").Scan(&name, &n); err != nil {
			t.Errorf("hold wallet of %s: count the lock waits: %v", actID, err)
		}
		return n
	}
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(); err != nil {
				t.Errorf("hold wallet of %s: release: %v", actID, err)
			}
		})
	}
	t.Cleanup(release)
	return waiters, release
}
