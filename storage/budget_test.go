package storage

import (
	"context"
	"errors"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/model"
)

// A grant or return whose COMMIT answer is lost is settled by re-reading the
// lease (its ID is drawn before the transaction): the call answers what was
// written. A COMMIT that never reached the server answers ErrCommitUnknown
// and leaves nothing behind.
func TestBudgetLostCommit(t *testing.T) {
	m, fail, cuts := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	const key = "cny/official/cut"
	s := model.ShardID(345)
	if _, err := SetBudget(ctx, m, s, key, 1000); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute).UnixMilli()
	fail(true)
	l, err := GrantLease(ctx, m, s, key, "cell-a", 300, 0, exp)
	if err != nil || l.Amount != 300 || cuts() != 1 {
		t.Fatalf("grant with its COMMIT answer lost: %+v, %v (cuts %d); want the lease written", l, err, cuts())
	}
	fail(false)
	if _, err := GrantLease(ctx, m, s, key, "cell-a", 300, 0, exp); !errors.Is(err, ErrCommitUnknown) || cuts() != 2 {
		t.Fatalf("grant with its COMMIT cut: %v (cuts %d); want ErrCommitUnknown", err, cuts())
	}
	fail(true)
	r, err := ReturnLease(ctx, m, s, l.ID, 100)
	if err != nil || r.State != model.LeaseReturned || r.Unspent != 100 || cuts() != 3 {
		t.Fatalf("return with its COMMIT answer lost: %+v, %v", r, err)
	}
	b, ls, err := Budget(ctx, m, s, key)
	if err != nil || len(ls) != 1 || b.Granted != 300 || b.Returned != 100 {
		t.Fatalf("rows: %+v, %d leases, %v; want the one lease, 100 back", b, len(ls), err)
	}
}

// The budget table refuses, by its CHECK, a row that would pass the total,
// whatever writes it.
func TestBudgetTableRefusesOverIssue(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	s := model.ShardID(345)
	if _, err := SetBudget(ctx, m, s, "cny/official/check", 100); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"granted = 101", "returned = 1", "total = -1"} {
		if _, err := m.db.ExecContext(ctx, "UPDATE "+m.budgetTable(s)+" SET "+set+" WHERE budget_key = 'cny/official/check'"); err == nil {
			t.Errorf("SET %s was taken", set)
		}
	}
}
