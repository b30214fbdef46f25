package storage

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// switchBreaker refuses every round trip while refuse is set, and counts
// those it let through.
type switchBreaker struct {
	refuse  atomic.Bool
	allowed atomic.Int64
}

func (b *switchBreaker) Allow() (func(error) bool, error) {
	if b.refuse.Load() {
		return nil, errors.New("refused")
	}
	b.allowed.Add(1)
	return func(error) bool { return false }, nil
}

// A breaker in front of a store refuses its statements but never the end
// of a transaction begun before it opened: a transaction's COMMIT, nor a
// lone ROLLBACK statement that ends a snapshot begun as a statement (the
// ledger's), which would otherwise leave a pooled connection inside its
// snapshot. A refused round trip is not counted.
func TestBreakerLetsTransactionsEnd(t *testing.T) {
	m := openStore(t)
	b := &switchBreaker{}
	m.SetBreaker(b)
	ctx := context.Background()

	conn, err := m.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		t.Fatal(err)
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "DO 1"); err != nil {
		t.Fatal(err)
	}
	b.refuse.Store(true)
	trips, allowed := m.RoundTrips(), b.allowed.Load()
	if _, err := conn.ExecContext(ctx, "DO 2"); !errors.Is(err, ErrDBOpen) {
		t.Fatalf("a statement while the breaker refuses: %v, want ErrDBOpen", err)
	}
	if _, err := tx.ExecContext(ctx, "DO 2"); !errors.Is(err, ErrDBOpen) {
		t.Fatalf("a statement of a transaction while the breaker refuses: %v, want ErrDBOpen", err)
	}
	if n := m.RoundTrips() - trips; n != 0 {
		t.Fatalf("%d refused round trips counted, want none", n)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatalf("ROLLBACK of a snapshot while the breaker refuses: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("COMMIT while the breaker refuses: %v", err)
	}
	if n := m.RoundTrips() - trips; n != 2 || b.allowed.Load() != allowed {
		t.Fatalf("the ROLLBACK and COMMIT: %d round trips, %d asked the breaker; want 2 and none", n, b.allowed.Load()-allowed)
	}
	b.refuse.Store(false)
	var in int
	if err := conn.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&in); err != nil || in != 0 {
		t.Fatalf("after the ROLLBACK the connection is in a transaction: %d, %v", in, err)
	}
}
