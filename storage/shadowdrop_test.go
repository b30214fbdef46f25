package storage

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
)

// schemaExists reports whether database name exists on m's server.
func schemaExists(t *testing.T, m *MySQL, name string) bool {
	t.Helper()
	var n int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestDropShadow: DropShadow drops the shadow databases of the indexes it is
// given that exist, with their tables, and answers them; a second call drops
// nothing; the store makes the tables again when next used (its cache of the
// tables it made is forgotten), so shadow traffic works after it; the real
// database of the same index keeps its row; a store of real money refuses.
// It uses databases 96 and 97 (shadow rows of other tests there go too).
func TestDropShadow(t *testing.T) {
	m := openStore(t)
	sh := m.Shadow()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	act := testenv.Prefix() + "-d"
	s96, s97 := model.ShardID(963), model.ShardID(975)
	if _, err := Deposit(ctx, m, s96, act, "real-1", 4321); err != nil {
		t.Fatal(err)
	}
	for _, s := range []model.ShardID{s96, s97} {
		if _, err := Deposit(ctx, sh, s, act, "shadow-1", 100); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Day()
	if err := sh.EnsureDay(ctx, s96, day); err != nil {
		t.Fatal(err)
	}
	if _, err := ExpiredIn(ctx, sh, []model.ShardID{s96}, []int{day}, 0, 10); err != nil { // caches the table list
		t.Fatal(err)
	}

	dropped, tables, err := sh.DropShadow(ctx, []int{97, 96, 96})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"shadow_db_96", "shadow_db_97"}; !slices.Equal(dropped, want) || tables < 8 {
		t.Fatalf("dropped %v (%d tables), want %v with at least the 8 tables made here", dropped, tables, want)
	}
	for _, name := range []string{"shadow_db_96", "shadow_db_97"} {
		if schemaExists(t, m, name) {
			t.Fatalf("%s still exists", name)
		}
	}
	if !schemaExists(t, m, "db_96") {
		t.Fatal("db_96 went with its shadow")
	}
	if a, err := Account(ctx, m, s96, act); err != nil || a.Balance != 4321 {
		t.Fatalf("real balance after the drop: %d, %v", a.Balance, err)
	}

	// Idempotent: nothing left to drop.
	if dropped, tables, err := sh.DropShadow(ctx, []int{96, 97}); err != nil || len(dropped) != 0 || tables != 0 {
		t.Fatalf("second drop: %v (%d tables), %v", dropped, tables, err)
	}

	// The store makes the tables again: the shadow space works as new.
	if _, err := Deposit(ctx, sh, s96, act, "shadow-2", 7); err != nil {
		t.Fatalf("shadow deposit after the drop: %v", err)
	}
	if a, err := Account(ctx, sh, s96, act); err != nil || a.Balance != 7 {
		t.Fatalf("shadow balance after the drop: %d, %v (want only the new deposit)", a.Balance, err)
	}
	if err := sh.EnsureDay(ctx, s96, day); err != nil {
		t.Fatal(err)
	}
	if ids, err := ExpiredIn(ctx, sh, []model.ShardID{s96}, []int{day}, 0, 10); err != nil || len(ids) != 0 {
		t.Fatalf("expiry scan of the new tables: %v, %v", ids, err)
	}

	// Real money is never dropped.
	if _, _, err := m.DropShadow(ctx, []int{96}); !errors.Is(err, ErrNotShadow) {
		t.Fatalf("DropShadow on the real store: %v, want ErrNotShadow", err)
	}
	if a, err := Account(ctx, m, s96, act); err != nil || a.Balance != 4321 || !schemaExists(t, m, "db_96") {
		t.Fatalf("real balance after a refused drop: %d, %v", a.Balance, err)
	}
}
