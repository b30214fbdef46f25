package model

import (
	"crypto/rand"
	"encoding/hex"

	"redcell/internal/invariant"
)

// Budgets and leases: how a reward scene's budget (cents, cash scenes) or
// stock (pieces, coupon kinds) is issued by many cells and never passed.
// Douyin's Spring Festival reward wallet and Douyin Pay's coupon issuance
// both describe the shape: the count lives in one place, every issuing
// server takes a chunk of it ahead of time and spends the chunk from memory,
// and what a server takes but does not spend goes back; a server that dies
// holding a chunk leaves the chunk counted as issued (under-issue, never
// over-issue) until someone settles it.
//
// Here the one place is the scene's home shard (its budget row,
// sharding.BudgetShard), a chunk is a Lease, and the rule is:
//
//	Outstanding = Granted − Returned   (held by leases, or spent from them)
//	0 <= Returned <= Granted, Outstanding <= Total
//
// A grant takes at most Total − Outstanding − reserve, so the sum of the
// leases never passes the budget whatever the holders do. The decisions are
// the pure functions below (state in → state out); the stores lock the rows,
// call them, and write what they answer.

// BudgetKeyMax bounds a budget key: three activity IDs of at most 32
// characters (cell/activity.IDMax) and two '/'.
const BudgetKeyMax = 3*32 + 2

// LeaseIDLen is the length of a lease ID: 20 lowercase hex digits (80 bits).
const LeaseIDLen = 20

// LeaseHolderMax bounds a lease holder (a cell's name, cell.Config.Name).
const LeaseHolderMax = 64

// BudgetKey names the budget of a scene: "parent/child/scene". Activity IDs
// never hold '/', so the key is unambiguous; it is hashed like an actID for
// its home shard (sharding.BudgetShard).
func BudgetKey(parent, child, scene string) string {
	return parent + "/" + child + "/" + scene
}

// ValidateBudgetKey checks a budget key: 1..BudgetKeyMax characters of
// [A-Za-z0-9_/-]. Errors: ErrInvalidArgument.
func ValidateBudgetKey(key string) error {
	if len(key) == 0 || len(key) > BudgetKeyMax {
		return Invalidf("budget key must be 1..%d characters", BudgetKeyMax)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '/') {
			return Invalidf("budget key may hold only ASCII letters, digits, '_', '-' and '/'")
		}
	}
	return nil
}

// ValidateLeaseHolder checks a lease holder: 1..LeaseHolderMax printable
// ASCII characters, no space. Errors: ErrInvalidArgument.
func ValidateLeaseHolder(holder string) error {
	if len(holder) == 0 || len(holder) > LeaseHolderMax {
		return Invalidf("lease holder must be 1..%d characters", LeaseHolderMax)
	}
	for i := 0; i < len(holder); i++ {
		if holder[i] <= ' ' || holder[i] > '~' {
			return Invalidf("lease holder may hold only printable ASCII without spaces")
		}
	}
	return nil
}

// ValidateLeaseID checks a lease ID: LeaseIDLen lowercase hex digits.
// Errors: ErrInvalidArgument.
func ValidateLeaseID(id string) error {
	if len(id) != LeaseIDLen {
		return Invalidf("lease ID must be %d hex digits", LeaseIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return Invalidf("lease ID must be %d lowercase hex digits", LeaseIDLen)
		}
	}
	return nil
}

// NewLeaseID is a random lease ID (crypto/rand): unique across homes without
// coordination, so a reward row's LeaseID names one lease in the cluster.
func NewLeaseID() string {
	var b [LeaseIDLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read panics rather)
	return hex.EncodeToString(b[:])
}

// Budget is a scene's budget row in its home shard. Amounts are cents for a
// cash scene, pieces for a coupon kind; UpdatedMS is Unix ms.
type Budget struct {
	Key      string
	Total    int64 // what the scene may issue in all, >= 0
	Granted  int64 // the sum of the Amount of every lease granted
	Returned int64 // the sum of the Unspent of every returned lease
	// UpdatedMS is when the row last changed.
	UpdatedMS int64
}

// Outstanding is what leases hold or spent: Granted − Returned.
func (b Budget) Outstanding() int64 { return b.Granted - b.Returned }

// Available is what a grant holding back reserve may take now: Total −
// Outstanding − reserve, possibly <= 0. reserve must be >= 0.
func (b Budget) Available(reserve int64) int64 { return b.Total - b.Outstanding() - reserve }

// LeaseState is where a lease is. The values are stored
// (t_budget_lease.state) and never change meaning.
type LeaseState string

const (
	// LeaseOpen: granted; its holder spends from it.
	LeaseOpen LeaseState = "open"
	// LeaseReturned: its holder gave back Unspent; the rest counts as issued.
	LeaseReturned LeaseState = "returned"
	// LeaseExpired: past ExpiresMS without a return. Its whole Amount stays
	// outstanding (the holder may have spent any of it); the holder, or a
	// settlement after its restart, may still return the unspent part.
	LeaseExpired LeaseState = "expired"
)

// Valid reports whether s is one of the three states.
func (s LeaseState) Valid() bool { return s == LeaseOpen || s == LeaseReturned || s == LeaseExpired }

// Lease is a chunk of a budget granted to one holder (a cell). Amount and
// Unspent are in the budget's unit; times are Unix ms; ReturnedMS is 0 until
// returned, Unspent is 0 until returned.
type Lease struct {
	ID         string
	Key        string
	Holder     string
	Amount     int64 // granted, >= 1
	Unspent    int64 // given back at the return, 0..Amount
	State      LeaseState
	CreatedMS  int64
	ExpiresMS  int64
	ReturnedMS int64
}

// SetBudgetTotal decides SetBudget: b is the row as locked (a new row: only
// Key set). Errors: ErrInvalidArgument for a total below 0, or below what is
// already out (b.Outstanding(): held by leases or spent from them).
// It asserts the budget's rule (checkBudget) on the row given and the row
// answered, and that only the total changed.
func SetBudgetTotal(b Budget, total, nowMS int64) (Budget, error) {
	checkBudget(b)
	if total < 0 {
		return Budget{}, Invalidf("budget %s: total %d is below 0", b.Key, total)
	}
	if out := b.Outstanding(); total < out {
		return Budget{}, Invalidf("budget %s: total %d is below the %d already issued or held by leases", b.Key, total, out)
	}
	after := b
	after.Total, after.UpdatedMS = total, nowMS
	checkBudget(after)
	invariant.That(after.Granted == b.Granted && after.Returned == b.Returned,
		"setting a budget's total moved units (SetBudgetTotal changes only Total)")
	return after, nil
}

// GrantInput is what a grant is decided on: the locked budget row and the request.
type GrantInput struct {
	Budget    Budget
	ID        string // the new lease's ID (NewLeaseID)
	Holder    string
	Want      int64 // >= 1
	Reserve   int64 // >= 0: held back; the grant never takes Total − reserve or more
	NowMS     int64
	ExpiresMS int64
}

// GrantLease decides a grant: min(Want, Budget.Available(Reserve)), as an
// open lease, and the budget with Granted raised by it. Errors:
// ErrInvalidArgument (Want < 1, Reserve < 0), ErrBudgetExhausted (nothing
// available above the reserve). It asserts the budget's rule on the row
// given and, after (checkGrant), that Granted grew by exactly the lease's
// 1..Want units and the reserve stayed untouched.
func GrantLease(in GrantInput) (Budget, Lease, error) {
	checkBudget(in.Budget)
	if in.Want < 1 || in.Reserve < 0 {
		return Budget{}, Lease{}, Invalidf("budget %s: want %d must be >= 1 and reserve %d >= 0", in.Budget.Key, in.Want, in.Reserve)
	}
	amount := min(in.Want, in.Budget.Available(in.Reserve))
	if amount <= 0 {
		return Budget{}, Lease{}, Errorf(ErrBudgetExhausted, "budget %s: %d of %d out, %d held back", in.Budget.Key,
			in.Budget.Outstanding(), in.Budget.Total, in.Reserve)
	}
	b := in.Budget
	b.Granted += amount
	b.UpdatedMS = in.NowMS
	l := Lease{ID: in.ID, Key: b.Key, Holder: in.Holder, Amount: amount, State: LeaseOpen,
		CreatedMS: in.NowMS, ExpiresMS: in.ExpiresMS}
	checkGrant(in, b, l)
	return b, l, nil
}

// checkGrant asserts GrantLease's postconditions: Granted after = Granted
// before + the lease's amount, 1 <= amount <= Want, Returned and Total
// unchanged, and what is out stays within Total − Reserve.
func checkGrant(in GrantInput, b Budget, l Lease) {
	checkBudget(b)
	invariant.That(l.Amount >= 1 && l.Amount <= in.Want && l.State == LeaseOpen && l.Key == b.Key,
		"a lease of 1..Want units, open, of its budget (GrantLease)")
	invariant.That(b.Granted == in.Budget.Granted+l.Amount && b.Returned == in.Budget.Returned && b.Total == in.Budget.Total,
		"a grant must raise Granted by exactly its lease's units (Outstanding = Granted − Returned)")
	invariant.That(b.Outstanding() <= b.Total-in.Reserve, "a grant took the reserve (GrantInput.Reserve is held back)")
}

// ReturnLease decides a return of l (locked, of budget b) with unspent left:
// an open or expired lease becomes returned with Unspent = unspent, and
// b.Returned grows by it. A lease returned before comes back as it is with
// changed false (nothing to write). Errors: ErrInvalidArgument for unspent
// outside 0..l.Amount. It asserts that b and l are rows the rules reach
// (checkReturnable) and, after (checkReturn), that Returned grew by exactly
// unspent, once.
func ReturnLease(b Budget, l Lease, unspent, nowMS int64) (Budget, Lease, bool, error) {
	checkReturnable(b, l)
	if unspent < 0 || unspent > l.Amount {
		return Budget{}, Lease{}, false, Invalidf("lease %s: unspent %d is outside 0..%d", l.ID, unspent, l.Amount)
	}
	if l.State == LeaseReturned {
		return b, l, false, nil
	}
	after, al := b, l
	al.State, al.Unspent, al.ReturnedMS = LeaseReturned, unspent, nowMS
	after.Returned += unspent
	after.UpdatedMS = nowMS
	checkReturn(b, l, after, al)
	return after, al, true, nil
}

// checkReturnable asserts ReturnLease's preconditions: the budget keeps its
// rule, the lease is of it, holds 1.. units in a known state, and a lease
// not returned yet still counts its whole Amount as outstanding (Granted
// counts it, Returned does not: see LeaseExpired), so returning it cannot
// take Returned past Granted.
func checkReturnable(b Budget, l Lease) {
	checkBudget(b)
	invariant.That(l.Key == b.Key && l.Amount >= 1 && l.State.Valid() && l.Unspent >= 0 && l.Unspent <= l.Amount,
		"a lease of another budget, of no units or of an unknown state (Lease)")
	invariant.That(l.State == LeaseReturned || l.Amount <= b.Outstanding(),
		"an unreturned lease's units are not outstanding (Outstanding = Granted − Returned counts every unreturned lease)")
}

// checkReturn asserts ReturnLease's postconditions: Returned after =
// Returned before + unspent, Granted and Total unchanged, the lease returned
// with that unspent, and the budget's rule kept.
func checkReturn(b Budget, l Lease, after Budget, al Lease) {
	checkBudget(after)
	invariant.That(al.State == LeaseReturned && l.State != LeaseReturned && al.Amount == l.Amount,
		"a lease returned twice (a lease is returned once: LeaseReturned)")
	invariant.That(after.Returned == b.Returned+al.Unspent && after.Granted == b.Granted && after.Total == b.Total,
		"a return must raise Returned by exactly the unspent units (Outstanding = Granted − Returned)")
}

// LeaseDue reports whether ExpireLeases turns l expired at nowMS: open, and
// ExpiresMS <= nowMS.
func LeaseDue(l Lease, nowMS int64) bool { return l.State == LeaseOpen && l.ExpiresMS <= nowMS }

// checkBudget panics when a decision broke the budget's rule: no decision
// may lead there, whatever its input (SetBudgetTotal refuses totals below
// the outstanding, GrantLease never grants past the total).
func checkBudget(b Budget) {
	invariant.That(b.Returned >= 0 && b.Returned <= b.Granted && b.Outstanding() <= b.Total,
		"budget would be passed: 0 <= Returned <= Granted and Granted − Returned <= Total")
}
