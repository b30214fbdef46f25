package storage

import (
	"context"
	"errors"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
)

// TestLease: one process of a cell holds its lease; another slot waits
// until it expires (the server's clock), the same slot takes it at once; a
// taker ends the connections the older holder's store registered, that
// store's new connections are refused (DB_UNAVAILABLE) and its renewal
// answers ErrLeaseLost; a released lease is taken at the next try.
func TestLease(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t, 1)
	cell := "lease-" + testenv.Prefix()
	raw, err := OpenRaw(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	t.Cleanup(func() {
		_, _ = raw.Exec("DELETE FROM redcell_meta.t_lease WHERE cell = ?", cell)
		_, _ = raw.Exec("DELETE FROM redcell_meta.t_lease_conns WHERE cell = ?", cell)
	})
	if err := EnsureLease(ctx, raw); err != nil {
		t.Fatal(err)
	}
	a, ok, _, _, err := TakeLease(ctx, raw, cell, cell+"/a", "a", 2*time.Second)
	if err != nil || !ok || a.Generation != 1 {
		t.Fatalf("first take: %+v %v %v", a, ok, err)
	}
	storeA, err := Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer storeA.Close()
	storeA.SetLease(a)
	if err := storeA.RenewLease(ctx, a); err != nil {
		t.Fatalf("renewal by the holder: %v", err)
	}
	var registered int
	if err := raw.QueryRow("SELECT COUNT(*) FROM redcell_meta.t_lease_conns WHERE cell = ? AND generation = 1", cell).Scan(&registered); err != nil || registered == 0 {
		t.Fatalf("the holder's connections registered: %d %v", registered, err)
	}

	// Slot b waits while a's lease lasts.
	if _, ok, other, left, err := TakeLease(ctx, raw, cell, cell+"/b", "b", 2*time.Second); err != nil || ok || other != "a" || left <= 0 || left > 2*time.Second {
		t.Fatalf("slot b while a holds: ok %v, holder %q, left %s, %v", ok, other, left, err)
	}
	// ... and takes it once it expired: a's connections end.
	var b Lease
	if !testenv.Until(30*time.Second, func() bool {
		if b, ok, _, _, err = TakeLease(ctx, raw, cell, cell+"/b", "b", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		return ok
	}) {
		t.Fatal("slot b did not take the expired lease within 30 s")
	}
	if b.Generation != 2 {
		t.Fatalf("b's generation %d, want 2", b.Generation)
	}
	err = storeA.RenewLease(ctx, a)
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's renewal after b took over: %v, want ErrLeaseLost", err)
	}
	if err := storeA.Ping(ctx); err == nil {
		t.Fatal("a's store still reaches its database after b took the lease")
	} else if code, _ := model.CodeOf(err); code != "DB_UNAVAILABLE" {
		t.Fatalf("a's store after b took over: %v (code %s), want DB_UNAVAILABLE", err, code)
	}
	if err := raw.QueryRow("SELECT COUNT(*) FROM redcell_meta.t_lease_conns WHERE cell = ? AND generation = 1", cell).Scan(&registered); err != nil || registered != 0 {
		t.Fatalf("a's registrations after the takeover: %d %v", registered, err)
	}

	// A row left under this connection's id (a server restarted; ids start
	// again) does not refuse the connection that has it now.
	conn, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second finds the first's row, identical
		res, err := conn.ExecContext(ctx, registerSQL, cell, b.Generation)
		if n, _ := res.RowsAffected(); err != nil || n == 0 {
			t.Fatalf("registering connection %d again: %d rows, %v", id, n, err)
		}
	}
	conn.Close()

	// Slot b again (a restart of b): at once, a new generation.
	b2, ok, _, _, err := TakeLease(ctx, raw, cell, cell+"/b", "b again", 2*time.Second)
	if err != nil || !ok || b2.Generation != 3 {
		t.Fatalf("slot b restarted: %+v %v %v", b2, ok, err)
	}
	// Released: slot a takes it at once.
	storeB, err := Open(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer storeB.Close()
	storeB.SetLease(b2)
	if err := storeB.ReleaseLease(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if a2, ok, _, _, err := TakeLease(ctx, raw, cell, cell+"/a", "a", 2*time.Second); err != nil || !ok || a2.Generation != 4 {
		t.Fatalf("slot a after b released: %+v %v %v", a2, ok, err)
	}
}
