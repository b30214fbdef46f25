package storagetest

import (
	"math"
	"sync"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractAccountUntouched", contractAccountUntouched)
	register("ContractDepositIdempotent", contractDepositIdempotent)
	register("ContractDepositConcurrentRetries", contractDepositConcurrentRetries)
	register("ContractDepositBalanceLimit", contractDepositBalanceLimit)
	register("ContractSchemaAndPing", contractSchemaAndPing)
}

// An account never touched reads as balance 0, with no error and no row.
func contractAccountUntouched(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	if b := f.balance(sA, "nobody"); b != 0 {
		t.Fatalf("untouched account: balance %d", b)
	}
	f.check(books{})
}

// A deposit raises the balance once per (act_id, order number): the same order
// again answers the first result (the balance right after it) with Repeat
// set; the same order number with another amount, or one a send used, is
// ORDER_CONFLICT; order numbers are per account.
func contractDepositIdempotent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	d := f.deposit(sA, "ann", "o1", 100)
	if d != (model.Deposit{ActID: "ann", OrderNo: "o1", Amount: 100, Balance: 100}) {
		t.Fatalf("first deposit: %+v", d)
	}
	f.check(books{deposits: 100, balances: 100})
	if d := f.deposit(sA, "ann", "o1", 100); d != (model.Deposit{ActID: "ann", OrderNo: "o1", Amount: 100, Balance: 100, Repeat: true}) {
		t.Fatalf("repeat: %+v", d)
	}
	f.check(books{deposits: 100, balances: 100})
	if d := f.deposit(sA, "ann", "o2", 50); d.Balance != 150 || d.Repeat {
		t.Fatalf("second order: %+v", d)
	}
	// A repeat answers the balance right after the first apply, not today's.
	if d := f.deposit(sA, "ann", "o1", 100); d.Balance != 100 || !d.Repeat {
		t.Fatalf("repeat after another deposit: %+v", d)
	}
	_, err := storage.Deposit(f.ctx, f.s, sA, "ann", "o1", 200)
	wantCode(t, "same order number, other amount", err, model.ErrOrderConflict)
	f.check(books{deposits: 150, balances: 150})
	// The order number is the account's: another account may use it.
	if d := f.deposit(sB, "bob", "o1", 70); d.Balance != 70 || d.Repeat {
		t.Fatalf("o1 of another account: %+v", d)
	}
	f.check(books{deposits: 220, balances: 220})
	// A send's order number is taken for deposits, and the other way round.
	f.send(sA, sendReq("ann", "s1", 30, 1), time.Hour)
	_, err = storage.Deposit(f.ctx, f.s, sA, "ann", "s1", 30)
	wantCode(t, "deposit under a send's order number", err, model.ErrOrderConflict)
	_, _, err = storage.Send(f.ctx, f.s, sA, sendReq("ann", "o2", 50, 1), model.NewPacketID(sA, f.h.Clock.Now()), f.nowMS()+1000)
	wantCode(t, "send under a deposit's order number", err, model.ErrOrderConflict)
	if b := f.balance(sA, "ann"); b != 120 {
		t.Fatalf("ann's balance %d, want 120", b)
	}
	f.check(books{deposits: 220, balances: 190, open: 30, sends: 30, packets: 1})
}

// Concurrent calls with one new order number apply it once: exactly one
// answers Repeat false, every answer carries the same balance.
func contractDepositConcurrentRetries(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "o0", 5)
	const n = 8
	answers := make([]model.Deposit, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = storage.Deposit(f.ctx, f.s, sA, "ann", "o1", 7)
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if errs[i] != nil || answers[i].Balance != 12 {
			t.Fatalf("answer %d: %+v, %v", i, answers[i], errs[i])
		}
		if !answers[i].Repeat {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d of %d concurrent calls applied the order", fresh, n)
	}
	f.check(books{deposits: 12, balances: 12})
}

// A deposit that would take a balance past the largest int64 is
// INVALID_ARGUMENT and writes nothing; the order number stays free.
func contractDepositBalanceLimit(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	top := model.Cents(math.MaxInt64 - 10)
	f.deposit(sA, "ann", "d1", top)
	_, err := storage.Deposit(f.ctx, f.s, sA, "ann", "d2", 11)
	wantCode(t, "deposit past the largest balance", err, model.ErrInvalidArgument)
	f.check(books{deposits: top, balances: top})
	if d := f.deposit(sA, "ann", "d2", 10); d.Balance != math.MaxInt64 || d.Repeat {
		t.Fatalf("deposit up to the largest balance: %+v", d)
	}
	f.check(books{deposits: math.MaxInt64, balances: math.MaxInt64})
}

// EnsureShard and EnsureDays succeed on a fresh store, twice; Ping answers.
func contractSchemaAndPing(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	for range 2 {
		if err := f.s.EnsureShard(f.ctx, sC); err != nil {
			t.Fatal(err)
		}
		calls := 0
		if err := f.s.EnsureDays(f.ctx, []model.ShardID{sA, sC}, []int{14, 15}, 2, func(done, total int) {
			calls++
			if total != 2 || done != calls {
				t.Errorf("progress %d/%d at call %d", done, total, calls)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if calls != 2 {
			t.Fatalf("progress called %d times for 2 shards", calls)
		}
	}
	if err := f.s.Ping(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.check(books{})
}
