package model

import (
	"errors"
	"testing"
)

func TestBudgetKey(t *testing.T) {
	k := BudgetKey("cny2027", "official", "rain-1")
	if k != "cny2027/official/rain-1" || ValidateBudgetKey(k) != nil {
		t.Fatalf("%q", k)
	}
	long := BudgetKey(string(make32('a')), string(make32('b')), string(make32('c')))
	if len(long) != BudgetKeyMax || ValidateBudgetKey(long) != nil || ValidateBudgetKey(long+"x") == nil {
		t.Fatalf("a key of three 32-character IDs must be the longest valid one")
	}
	for _, bad := range []string{"", "a b", "a/b\x00", "ü/x/y"} {
		if !errors.Is(ValidateBudgetKey(bad), ErrInvalidArgument) {
			t.Errorf("%q passed", bad)
		}
	}
	if id := NewLeaseID(); ValidateLeaseID(id) != nil || id == NewLeaseID() {
		t.Fatalf("lease ID %q", id)
	}
}

func make32(c byte) []byte {
	b := make([]byte, 32)
	for i := range b {
		b[i] = c
	}
	return b
}

// The decisions keep Granted − Returned within Total: a grant takes at most
// what is left above the reserve, a return happens once, a total never drops
// below what is out.
func TestBudgetDecisions(t *testing.T) {
	b := Budget{Key: "k", Total: 100}
	in := GrantInput{Budget: b, ID: "l1", Holder: "c", Want: 70, Reserve: 10, NowMS: 5, ExpiresMS: 65}
	b, l, err := GrantLease(in)
	if err != nil || l.Amount != 70 || b.Granted != 70 || l.State != LeaseOpen {
		t.Fatalf("%+v %+v %v", b, l, err)
	}
	in.Budget, in.ID = b, "l2"
	b, l2, err := GrantLease(in)
	if err != nil || l2.Amount != 20 || b.Granted != 90 {
		t.Fatalf("a grant of what is left above the reserve: %+v %+v %v", b, l2, err)
	}
	in.Budget = b
	if _, _, err := GrantLease(in); !errors.Is(err, ErrBudgetExhausted) {
		t.Fatalf("at the reserve: %v", err)
	}
	if _, err := SetBudgetTotal(b, 89, 6); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a total below the 90 out: %v", err)
	}
	b, l, changed, err := ReturnLease(b, l, 30, 7)
	if err != nil || !changed || b.Returned != 30 || b.Outstanding() != 60 || l.State != LeaseReturned || l.ReturnedMS != 7 {
		t.Fatalf("return: %+v %+v %v %v", b, l, changed, err)
	}
	if b2, l2, changed, err := ReturnLease(b, l, 0, 8); err != nil || changed || b2 != b || l2 != l {
		t.Fatalf("a second return changed something: %+v %+v %v %v", b2, l2, changed, err)
	}
	if _, _, _, err := ReturnLease(b, l, 71, 8); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unspent above the amount: %v", err)
	}
	if b, err = SetBudgetTotal(b, 60, 9); err != nil || b.Total != 60 {
		t.Fatalf("a total of exactly what is out: %+v %v", b, err)
	}
	if !LeaseDue(l2, 65) || LeaseDue(l2, 64) || LeaseDue(l, 100) {
		t.Fatalf("LeaseDue")
	}
}
