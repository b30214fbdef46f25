package storagetest

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractBudgetSet", contractBudgetSet)
	register("ContractBudgetGrantsNeverPassTotal", contractBudgetGrantsNeverPassTotal)
	register("ContractBudgetReturnOnce", contractBudgetReturnOnce)
	register("ContractBudgetExpiry", contractBudgetExpiry)
	register("ContractBudgetExhaustedAndUnknown", contractBudgetExhaustedAndUnknown)
}

// Budget keys of the contract; each test's budget is homed in sA (database
// 12) unless it says otherwise.
const (
	budgetKey      = "cny/official/rain-1"
	budgetHolder   = "cell-a"
	budgetHolderB  = "cell-b"
	budgetLeaseTTL = 60_000
)

// budgetRows reads key's row and leases and checks that they add up:
// Granted is the sum of the leases' Amount, Returned the sum of the returned
// ones' Unspent, and Granted − Returned <= Total.
func (f *fixture) budgetRows(s model.ShardID, key string) (model.Budget, []model.Lease) {
	f.t.Helper()
	b, ls, err := storage.Budget(f.ctx, f.s, s, key)
	if err != nil {
		f.t.Fatalf("Budget(%s): %v", key, err)
	}
	var granted, returned int64
	for _, l := range ls {
		if l.Key != key || l.Amount < 1 || !l.State.Valid() || l.Unspent < 0 || l.Unspent > l.Amount {
			f.t.Errorf("lease %+v of budget %s is malformed", l, key)
		}
		granted += l.Amount
		if l.State == model.LeaseReturned {
			returned += l.Unspent
		} else if l.Unspent != 0 || l.ReturnedMS != 0 {
			f.t.Errorf("lease %+v is not returned but carries a return", l)
		}
	}
	if b.Key != key || b.Granted != granted || b.Returned != returned || b.Outstanding() > b.Total {
		f.t.Fatalf("budget %+v does not add up: leases grant %d and return %d", b, granted, returned)
	}
	// BudgetLevel: the same row, and the open and expired leases' units.
	var held int64
	for _, l := range ls {
		if l.State != model.LeaseReturned {
			held += l.Amount
		}
	}
	lb, lheld, err := storage.BudgetLevel(f.ctx, f.s, s, key)
	if err != nil || lb != b || lheld != held {
		f.t.Fatalf("BudgetLevel(%s): %+v held %d, %v; want %+v held %d", key, lb, lheld, err, b, held)
	}
	return b, ls
}

// SetBudget creates a budget and changes its total; a total below what is
// out (held by leases or spent from them) is INVALID_ARGUMENT and changes
// nothing, and so are a negative total and a malformed key.
func contractBudgetSet(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	b, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 1000)
	if err != nil || b != (model.Budget{Key: budgetKey, Total: 1000, UpdatedMS: now}) {
		t.Fatalf("new budget: %+v, %v", b, err)
	}
	if got, ls := f.budgetRows(sA, budgetKey); got != b || len(ls) != 0 {
		t.Fatalf("read back %+v with %d leases, want %+v and none", got, len(ls), b)
	}
	l, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 600, 0, now+budgetLeaseTTL)
	if err != nil || l.Amount != 600 {
		t.Fatalf("grant 600 of 1000: %+v, %v", l, err)
	}
	if _, err := storage.ReturnLease(f.ctx, f.s, sA, l.ID, 100); err != nil {
		t.Fatal(err)
	}
	// 500 are out now: a total of 499 is refused, 500 is taken.
	if _, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 499); !errors.Is(err, model.ErrInvalidArgument) {
		t.Errorf("total below the 500 out: %v, want INVALID_ARGUMENT", err)
	}
	if b := f.budgetRow(sA, budgetKey); b.Total != 1000 {
		t.Errorf("a refused total changed the row: %+v", b)
	}
	f.h.Clock.Advance(time.Second)
	if b, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 500); err != nil || b.Total != 500 || b.Granted != 600 || b.Returned != 100 || b.UpdatedMS != now+1000 {
		t.Errorf("total down to what is out: %+v, %v", b, err)
	}
	if b, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 5000); err != nil || b.Total != 5000 {
		t.Errorf("total up: %+v, %v", b, err)
	}
	if _, err := storage.SetBudget(f.ctx, f.s, sA, "other/x/y", -1); !errors.Is(err, model.ErrInvalidArgument) {
		t.Errorf("negative total: %v, want INVALID_ARGUMENT", err)
	}
	if _, _, err := storage.Budget(f.ctx, f.s, sA, "other/x/y"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("a refused new budget was stored: %v", err)
	}
	for _, bad := range []string{"", "a b/c", string(make([]byte, model.BudgetKeyMax+1))} {
		if _, err := storage.SetBudget(f.ctx, f.s, sA, bad, 1); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("key %q: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	f.budgetRows(sA, budgetKey)
	f.check(books{})
}

func (f *fixture) budgetRow(s model.ShardID, key string) model.Budget {
	b, _ := f.budgetRows(s, key)
	return b
}

// Eight granters, each asking for random chunks until the budget is
// exhausted, are granted exactly Total − reserve between them, never more;
// the rows agree; and after every lease is returned whole the budget has
// nothing out.
func contractBudgetGrantsNeverPassTotal(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	const total, reserve, granters = 10_000, 1_000, 8
	if _, err := storage.SetBudget(f.ctx, f.s, sC, budgetKey, total); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sum int64
	var mine []model.Lease
	var wg sync.WaitGroup
	for g := range granters {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for {
				want := 1 + r.Int64N(700)
				l, err := storage.GrantLease(f.ctx, f.s, sC, budgetKey, budgetHolder, want, reserve, f.nowMS()+budgetLeaseTTL)
				if errors.Is(err, model.ErrBudgetExhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if l.Amount < 1 || l.Amount > want || l.State != model.LeaseOpen || l.Holder != budgetHolder {
					t.Errorf("asked for %d, granted %+v", want, l)
				}
				mu.Lock()
				sum += l.Amount
				mine = append(mine, l)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, ls := f.budgetRows(sC, budgetKey)
	if sum != total-reserve || b.Granted != sum || len(ls) != len(mine) {
		t.Fatalf("granted %d in %d leases, rows say %d in %d; want exactly %d (total %d − reserve %d)",
			sum, len(mine), b.Granted, len(ls), total-reserve, total, reserve)
	}
	// The reserve is held back, not lost: without it there is more.
	if l, err := storage.GrantLease(f.ctx, f.s, sC, budgetKey, budgetHolderB, 5000, 0, f.nowMS()+budgetLeaseTTL); err != nil || l.Amount != reserve {
		t.Fatalf("grant without reserve: %+v, %v; want the %d held back", l, err, reserve)
	} else {
		mine = append(mine, l)
	}
	for _, l := range mine {
		if _, err := storage.ReturnLease(f.ctx, f.s, sC, l.ID, l.Amount); err != nil {
			t.Fatal(err)
		}
	}
	if b := f.budgetRow(sC, budgetKey); b.Outstanding() != 0 || b.Granted != total {
		t.Fatalf("every lease returned whole: %+v, want nothing out", b)
	}
	f.check(books{})
}

// A return turns a lease returned and gives its unspent part back, once:
// returning again answers the lease as it is and changes nothing; unspent
// outside 0..Amount, a lease ID of another database or none at all are
// refused.
func contractBudgetReturnOnce(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	if _, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 1000); err != nil {
		t.Fatal(err)
	}
	l, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 400, 0, now+budgetLeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.ValidateLeaseID(l.ID); err != nil || l.Key != budgetKey || l.Amount != 400 || l.CreatedMS != now || l.ExpiresMS != now+budgetLeaseTTL {
		t.Fatalf("granted %+v (%v)", l, err)
	}
	for _, bad := range []int64{-1, 401} {
		if _, err := storage.ReturnLease(f.ctx, f.s, sA, l.ID, bad); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("return with unspent %d: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	f.h.Clock.Advance(500 * time.Millisecond)
	got, err := storage.ReturnLease(f.ctx, f.s, sA, l.ID, 150)
	want := l
	want.State, want.Unspent, want.ReturnedMS = model.LeaseReturned, 150, now+500
	if err != nil || got != want {
		t.Fatalf("return: %+v, %v; want %+v", got, err, want)
	}
	if b := f.budgetRow(sA, budgetKey); b.Granted != 400 || b.Returned != 150 || b.Outstanding() != 250 {
		t.Fatalf("after the return: %+v", b)
	}
	f.h.Clock.Advance(500 * time.Millisecond)
	for _, again := range []int64{150, 0, 400} {
		if got, err := storage.ReturnLease(f.ctx, f.s, sA, l.ID, again); err != nil || got != want {
			t.Errorf("return again with %d: %+v, %v; want the lease as it is", again, got, err)
		}
	}
	if b := f.budgetRow(sA, budgetKey); b.Returned != 150 {
		t.Fatalf("a repeated return changed the budget: %+v", b)
	}
	if _, err := storage.ReturnLease(f.ctx, f.s, sC, l.ID, 0); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("the lease from another database: %v, want NOT_FOUND", err)
	}
	if _, err := storage.ReturnLease(f.ctx, f.s, sA, "0123456789abcdef0123", 0); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("a lease never granted: %v, want NOT_FOUND", err)
	}
	if _, err := storage.ReturnLease(f.ctx, f.s, sA, "not-a-lease", 0); !errors.Is(err, model.ErrInvalidArgument) {
		t.Errorf("a malformed lease ID: %v, want INVALID_ARGUMENT", err)
	}
	if ls, err := storage.LeasesOf(f.ctx, f.s, sA, budgetHolder); err != nil || len(ls) != 0 {
		t.Errorf("a returned lease is still listed for its holder: %+v, %v", ls, err)
	}
	f.check(books{})
}

// ExpireLeases turns open leases at or past their expiry expired, and only
// those; an expired lease keeps its whole amount out, is listed for its
// holder (with the open ones, not the returned), and still takes a return.
func contractBudgetExpiry(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	if _, _, err := storage.BudgetLevel(f.ctx, f.s, sB, budgetKey); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("BudgetLevel of no budget: %v, want NOT_FOUND", err)
	}
	if _, err := storage.SetBudget(f.ctx, f.s, sB, budgetKey, 1000); err != nil {
		t.Fatal(err)
	}
	grant := func(holder string, want, expiresMS int64) model.Lease {
		t.Helper()
		f.h.Clock.Advance(time.Millisecond) // a distinct creation time each: the listing's order is known
		l, err := storage.GrantLease(f.ctx, f.s, sB, budgetKey, holder, want, 0, expiresMS)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	early := grant(budgetHolder, 100, now+1000)
	late := grant(budgetHolder, 200, now+5000)
	other := grant(budgetHolderB, 300, now+1000)
	done := grant(budgetHolder, 50, now+1000)
	if _, err := storage.ReturnLease(f.ctx, f.s, sB, done.ID, 50); err != nil {
		t.Fatal(err)
	}
	if n, err := storage.ExpireLeases(f.ctx, f.s, sB, budgetKey, now+999); err != nil || n != 0 {
		t.Fatalf("expire before any is due: %d, %v", n, err)
	}
	if n, err := storage.ExpireLeases(f.ctx, f.s, sB, budgetKey, now+1000); err != nil || n != 2 {
		t.Fatalf("expire at now+1000: %d, %v; want 2 (early, other)", n, err)
	}
	if n, err := storage.ExpireLeases(f.ctx, f.s, sB, budgetKey, now+1000); err != nil || n != 0 {
		t.Fatalf("expire again: %d, %v; want 0", n, err)
	}
	b, ls := f.budgetRows(sB, budgetKey)
	states := map[string]model.LeaseState{}
	for _, l := range ls {
		states[l.ID] = l.State
	}
	if states[early.ID] != model.LeaseExpired || states[other.ID] != model.LeaseExpired || states[late.ID] != model.LeaseOpen ||
		states[done.ID] != model.LeaseReturned || b.Outstanding() != 600 {
		t.Fatalf("after expiry: %+v, leases %v; want 600 out (expired leases keep theirs)", b, states)
	}
	mine, err := storage.LeasesOf(f.ctx, f.s, sB, budgetHolder)
	if err != nil || len(mine) != 2 || mine[0].ID != early.ID || mine[1].ID != late.ID || mine[0].State != model.LeaseExpired {
		t.Fatalf("leases of %s: %+v, %v; want early (expired) and late (open)", budgetHolder, mine, err)
	}
	// A leaseholder of another database's budgets sees nothing here.
	if ls, err := storage.LeasesOf(f.ctx, f.s, sC, budgetHolder); err != nil || len(ls) != 0 {
		t.Errorf("leases of %s in database 56: %+v, %v", budgetHolder, ls, err)
	}
	if l, err := storage.ReturnLease(f.ctx, f.s, sB, early.ID, 40); err != nil || l.State != model.LeaseReturned || l.Unspent != 40 {
		t.Fatalf("return of an expired lease: %+v, %v", l, err)
	}
	if b := f.budgetRow(sB, budgetKey); b.Outstanding() != 560 {
		t.Fatalf("after the late return: %+v, want 560 out", b)
	}
	f.check(books{})
}

// A grant takes what is left above the reserve when that is less than asked;
// then, with nothing left above it, BUDGET_EXHAUSTED. A budget never set is
// NOT_FOUND; a bad want, reserve or holder is INVALID_ARGUMENT.
func contractBudgetExhaustedAndUnknown(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	exp := f.nowMS() + budgetLeaseTTL
	if _, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 10, 0, exp); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("grant of a budget never set: %v, want NOT_FOUND", err)
	}
	if _, _, err := storage.Budget(f.ctx, f.s, sA, budgetKey); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("read of a budget never set: %v, want NOT_FOUND", err)
	}
	if _, err := storage.SetBudget(f.ctx, f.s, sA, budgetKey, 100); err != nil {
		t.Fatal(err)
	}
	// Homed in database 12: another database does not know it.
	if _, err := storage.GrantLease(f.ctx, f.s, sC, budgetKey, budgetHolder, 10, 0, exp); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("grant from another database: %v, want NOT_FOUND", err)
	}
	for _, c := range []struct {
		holder        string
		want, reserve int64
	}{{budgetHolder, 0, 0}, {budgetHolder, 10, -1}, {"", 10, 0}, {"a cell", 10, 0}} {
		if _, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, c.holder, c.want, c.reserve, exp); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("grant %+v: %v, want INVALID_ARGUMENT", c, err)
		}
	}
	if l, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 85, 10, exp); err != nil || l.Amount != 85 {
		t.Fatalf("grant 85 of 100 with 10 held back: %+v, %v", l, err)
	}
	if l, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 85, 10, exp); err != nil || l.Amount != 5 {
		t.Fatalf("grant with 5 left above the reserve: %+v, %v; want 5", l, err)
	}
	if _, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 1, 10, exp); !errors.Is(err, model.ErrBudgetExhausted) {
		t.Fatalf("grant at the reserve: %v, want BUDGET_EXHAUSTED", err)
	}
	if l, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 85, 0, exp); err != nil || l.Amount != 10 {
		t.Fatalf("grant of the reserve itself: %+v, %v; want 10", l, err)
	}
	if _, err := storage.GrantLease(f.ctx, f.s, sA, budgetKey, budgetHolder, 1, 0, exp); !errors.Is(err, model.ErrBudgetExhausted) {
		t.Fatalf("grant of a spent budget: %v, want BUDGET_EXHAUSTED", err)
	}
	if b, ls := f.budgetRows(sA, budgetKey); b.Granted != 100 || len(ls) != 3 {
		t.Fatalf("after exhaustion: %+v in %d leases", b, len(ls))
	}
	f.check(books{})
}
