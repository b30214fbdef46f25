// Package budget is the issuing side of reward budgets: a cell spends a
// scene's budget (cents) or stock (pieces) from leases it takes in chunks
// from the scene's home cell, so the hot path never writes the one budget
// row, and the sum of the leases never passes the budget even if the cell
// dies holding some.
//
// This is the approach Douyin's Spring Festival reward wallet and Douyin
// Pay's coupon issuance describe for budgets and stock at their rates: keep
// the count in one place, hand servers pieces of it ahead of time, spend the
// pieces in memory, give back what is left; under-issue rather than ever
// over-issue. The home side (rows, grants, returns) is the budget ops of
// the home cell's store (storage/ops_budgets.go); model/budget.go states
// the rule.
//
// A Pool serves one cell (the holder of its leases): Take spends from a
// lease, fetching a new one when needed; Give puts back what an issue that
// wrote nothing took; Sweep returns leases past their TTL; ReturnAll drains.
// After a crash, Settle returns what the dead process's leases did not spend.
package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"redcell/internal/clock"
	"redcell/internal/invariant"
	"redcell/model"
)

// Home is a scene's home cell, as the issuing cell sees it: its local store
// (LocalHome) or another cell over HTTP (the integrator wires that).
type Home interface {
	// Grant grants holder a lease of key of up to want (>= 1), holding back
	// reserve (>= 0), expiring ttl from the home's now: storage.GrantLease.
	// Errors: model.ErrBudgetExhausted, model.ErrNotFound (no such budget),
	// or a failure.
	Grant(ctx context.Context, key, holder string, want, reserve int64, ttl time.Duration) (model.Lease, error)
	// Return gives back the unspent part (0..Amount) of lease leaseID of
	// key; once (a repeat changes nothing and is no error):
	// storage.ReturnLease.
	Return(ctx context.Context, key, leaseID string, unspent int64) error
}

// fetchRoundsMax bounds the home calls one Take waits for: a Take whose
// fetched leases were spent by others before it got its turn, this many
// times, is answered model.ErrOverloaded.
const fetchRoundsMax = 8

// Pool holds one cell's leases, by budget key. Safe for concurrent use: each
// key has its own mutex, never held during a home call; the one home call
// for a new lease of a key runs in its own goroutine, and the Takes that need
// it wait for it (or their ctx).
type Pool struct {
	holder string
	home   func(key string) Home
	clk    clock.Clock
	cfg    Config

	mu   sync.Mutex // guards keys and owed
	keys map[string]*keyPool
	// owed: leases taken out of keys whose Return failed with a failure
	// (not a refusal); Sweep and ReturnAll try them again.
	owed []owedLease
}

type owedLease struct {
	key string
	h   held
}

// keyPool is one budget key's leases.
type keyPool struct {
	key string

	mu     sync.Mutex // guards everything below
	leases []*held    // oldest first; spendable until their deadline
	fetch  *fetch     // the home call for a new lease, nil when none runs
	// exhaustedUntil: before it, a Take the leases cannot serve is
	// ErrBudgetExhausted without asking the home (Config.ExhaustedWait).
	exhaustedUntil time.Time
	spent          int64 // taken minus given back, for metrics
	// waiting counts the Takes waiting for a fetch: the next fetch asks
	// for enough to serve all of them (amount each), so that a burst of
	// Takes on a budget whose chunk is about one amount is not served one
	// per round.
	waiting int64
}

// held is one lease of the pool.
type held struct {
	lease    model.Lease
	left     int64     // what Take may still spend from it
	deadline time.Time // on the pool's clock: nothing is spent from it at or after this
}

// fetch is one home call for a new lease; err is set before done closes.
type fetch struct {
	done chan struct{}
	err  error
}

// NewPool returns an empty pool for the cell named holder (a lease holder,
// model.ValidateLeaseHolder). home gives the Home of a budget key; clk is
// the clock of lease deadlines (nil: the system clock). cfg's zero fields
// take their defaults; a cfg that fails Validate panics (check it first).
func NewPool(holder string, home func(key string) Home, clk clock.Clock, cfg Config) *Pool {
	invariant.That(model.ValidateLeaseHolder(holder) == nil, "budget: NewPool with a malformed holder")
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return &Pool{holder: holder, home: home, clk: clock.Or(clk), cfg: cfg.withDefaults(), keys: map[string]*keyPool{}}
}

func (p *Pool) keyPool(key string, create bool) *keyPool {
	p.mu.Lock()
	defer p.mu.Unlock()
	kp := p.keys[key]
	if kp == nil && create {
		kp = &keyPool{key: key}
		p.keys[key] = kp
	}
	return kp
}

// Take spends amount (>= 1; cents or pieces) of key's budget, whose total is
// total (>= 1; it sizes chunks and the reserve, Config), from one lease the
// pool holds, taking a new lease from the home when none can serve it (at
// most one home call in flight per key; the Takes that need it wait). It
// answers the ID of the lease the amount came from: the issue names it (its
// reward row's LeaseID), and Give takes it back. An amount is never split
// across leases. Errors: model.ErrBudgetExhausted (the home grants nothing
// more above the reserve, or less than amount), model.ErrInvalidArgument,
// model.ErrOverloaded (others spent every lease fetched for this Take,
// fetchRoundsMax times), ctx.Err(), or the home's error.
func (p *Pool) Take(ctx context.Context, key string, total, amount int64) (string, error) {
	if amount < 1 || total < 1 {
		return "", model.Invalidf("budget %s: take %d of total %d: both must be >= 1", key, amount, total)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	kp := p.keyPool(key, true)
	for round := 0; ; round++ {
		kp.mu.Lock()
		now := p.clk.Now()
		if h := kp.pickLocked(now, amount); h != nil {
			h.left -= amount
			kp.spent += amount
			if kp.fetch == nil && !now.Before(kp.exhaustedUntil) && p.lowLocked(kp, now, total) {
				p.startFetchLocked(ctx, kp, total, 0)
			}
			kp.mu.Unlock()
			return h.lease.ID, nil
		}
		if now.Before(kp.exhaustedUntil) {
			kp.mu.Unlock()
			return "", model.Errorf(model.ErrBudgetExhausted, "budget %s: nothing more above the reserve for %d", key, amount)
		}
		if round == fetchRoundsMax {
			kp.mu.Unlock()
			return "", model.Errorf(model.ErrOverloaded, "budget %s: the leases fetched for this take went to others %d times", key, round)
		}
		f := kp.fetch
		if f == nil {
			f = p.startFetchLocked(ctx, kp, total, amount*(kp.waiting+1))
		}
		kp.waiting++
		kp.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			kp.mu.Lock()
			kp.waiting--
			kp.mu.Unlock()
			return "", ctx.Err()
		}
		kp.mu.Lock()
		kp.waiting--
		kp.mu.Unlock()
		if f.err != nil {
			return "", f.err
		}
	}
}

// pickLocked is the oldest lease spendable at now with amount left, or nil.
// kp.mu must be held.
func (kp *keyPool) pickLocked(now time.Time, amount int64) *held {
	for _, h := range kp.leases {
		if now.Before(h.deadline) && h.left >= amount {
			return h
		}
	}
	return nil
}

// lowLocked reports whether kp should fetch its next lease ahead of need:
// what its leases have left, counting only leases with more than
// RefillBelow of the TTL to run, is below RefillBelow of a chunk. kp.mu must
// be held.
func (p *Pool) lowLocked(kp *keyPool, now time.Time, total int64) bool {
	soon := now.Add(time.Duration(p.cfg.RefillBelow * float64(p.cfg.TTL)))
	var left int64
	for _, h := range kp.leases {
		if soon.Before(h.deadline) {
			left += h.left
		}
	}
	return float64(left) < p.cfg.RefillBelow*float64(p.chunk(total))
}

func (p *Pool) chunk(total int64) int64 { return max(1, p.cfg.Chunk(total)) }

func (p *Pool) reserve(key string, total int64) int64 { return max(0, p.cfg.Reserve(key, total)) }

// startFetchLocked starts the home call for a new lease of kp: of a chunk,
// or of amount if that is more. It runs apart from any caller's cancellation
// (the lease serves every waiter), with ctx's values and FetchTimeout.
// kp.mu must be held and kp.fetch nil.
func (p *Pool) startFetchLocked(ctx context.Context, kp *keyPool, total, amount int64) *fetch {
	invariant.That(kp.fetch == nil, "budget: two fetches of one key")
	f := &fetch{done: make(chan struct{})}
	kp.fetch = f
	want, reserve := max(p.chunk(total), amount), p.reserve(kp.key, total)
	ctx = context.WithoutCancel(ctx)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, p.cfg.FetchTimeout)
		defer cancel()
		start := p.clk.Now() // the lease's deadline counts from before the home's clock read
		l, err := p.home(kp.key).Grant(ctx, kp.key, p.holder, want, reserve, p.cfg.TTL)
		if err == nil && (l.Key != kp.key || l.Amount < 1 || l.Amount > want || model.ValidateLeaseID(l.ID) != nil) {
			err = fmt.Errorf("budget %s: the home granted a malformed lease %+v for %d", kp.key, l, want)
		}
		kp.mu.Lock()
		now := p.clk.Now()
		switch {
		case err == nil:
			kp.leases = append(kp.leases, &held{lease: l, left: l.Amount, deadline: start.Add(p.cfg.TTL)})
			if l.Amount < want { // the home had no more than this above the reserve
				kp.exhaustedUntil = now.Add(p.cfg.ExhaustedWait)
			}
		case errors.Is(err, model.ErrBudgetExhausted):
			kp.exhaustedUntil = now.Add(p.cfg.ExhaustedWait)
		}
		f.err = err
		kp.fetch = nil
		kp.mu.Unlock()
		close(f.done)
	}()
	return f
}

// Give puts back amount, which Take answered with leaseID for key, when the
// issue it was for definitely wrote nothing. A lease returned meanwhile
// (past its TTL, or drained) keeps it as spent: the budget under-issues by
// amount, never over-issues. Giving back more than was taken from a lease
// panics.
func (p *Pool) Give(key, leaseID string, amount int64) {
	kp := p.keyPool(key, false)
	if kp == nil || amount <= 0 {
		return
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	for _, h := range kp.leases {
		if h.lease.ID == leaseID {
			invariant.That(h.left+amount <= h.lease.Amount, "budget: Give of more than was taken from the lease")
			h.left += amount
			kp.spent -= amount
			return
		}
	}
}

// Spent is what Takes of key took, less what Give put back, since the pool
// was made; for metrics.
func (p *Pool) Spent(key string) int64 {
	kp := p.keyPool(key, false)
	if kp == nil {
		return 0
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return kp.spent
}

// Leases lists the leases the pool holds, with Unspent set to what is left
// to spend of each, by key and then oldest first; leases whose return failed
// and waits for a retry are among them. For metrics and drain.
func (p *Pool) Leases() []model.Lease {
	p.mu.Lock()
	kps := p.keyPoolsLocked()
	var out []model.Lease
	for _, o := range p.owed {
		out = append(out, withLeft(o.h))
	}
	p.mu.Unlock()
	for _, kp := range kps {
		kp.mu.Lock()
		for _, h := range kp.leases {
			out = append(out, withLeft(*h))
		}
		kp.mu.Unlock()
	}
	slices.SortStableFunc(out, func(a, b model.Lease) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func withLeft(h held) model.Lease {
	l := h.lease
	l.Unspent = h.left
	return l
}

// Sweep returns every lease at or past its deadline (its TTL on the pool's
// clock), with what is left of it, and retries returns that failed before;
// the next Take of the key takes a new lease. The integrator calls it once a
// second. A return that fails with a failure is retried by the next Sweep;
// one the home refuses (not found, invalid) is dropped: the home settles it.
func (p *Pool) Sweep(ctx context.Context) {
	now := p.clk.Now()
	_ = p.returnLeases(ctx, p.takeOut(func(h *held) bool { return !now.Before(h.deadline) }))
}

// ReturnAll drains the pool: it waits for the home calls in flight (or ctx),
// then returns every lease's unspent part to its home, and answers the
// returns that failed (joined; those are tried again by Sweep and the next
// ReturnAll). Call it when the cell stops issuing: a Take after it takes a
// new lease.
func (p *Pool) ReturnAll(ctx context.Context) error {
	if err := p.waitFetches(ctx); err != nil {
		return err
	}
	return p.returnLeases(ctx, p.takeOut(func(*held) bool { return true }))
}

// keyPoolsLocked lists the pools of the keys, to be walked once p.mu is
// released (each has a lock of its own). p.mu must be held.
func (p *Pool) keyPoolsLocked() []*keyPool {
	kps := make([]*keyPool, 0, len(p.keys))
	for _, kp := range p.keys {
		kps = append(kps, kp)
	}
	return kps
}

// waitFetches waits for the home calls in flight now, or ctx.
func (p *Pool) waitFetches(ctx context.Context) error {
	p.mu.Lock()
	kps := p.keyPoolsLocked()
	p.mu.Unlock()
	for _, kp := range kps {
		kp.mu.Lock()
		f := kp.fetch
		kp.mu.Unlock()
		if f == nil {
			continue
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// takeOut removes from the pool the leases out says to, and the owed ones,
// and answers them.
func (p *Pool) takeOut(out func(*held) bool) []owedLease {
	p.mu.Lock()
	due := p.owed
	p.owed = nil
	kps := p.keyPoolsLocked()
	p.mu.Unlock()
	for _, kp := range kps {
		kp.mu.Lock()
		kept := kp.leases[:0]
		for _, h := range kp.leases {
			if out(h) {
				due = append(due, owedLease{key: kp.key, h: *h})
			} else {
				kept = append(kept, h)
			}
		}
		clear(kp.leases[len(kept):])
		kp.leases = kept
		kp.mu.Unlock()
	}
	return due
}

// returnLeases returns each lease's left to its home, one call each, and
// keeps those that failed with a failure for a later try.
func (p *Pool) returnLeases(ctx context.Context, due []owedLease) error {
	var errs []error
	var again []owedLease
	for _, o := range due {
		err := p.home(o.key).Return(ctx, o.key, o.h.lease.ID, o.h.left)
		if err == nil {
			continue
		}
		errs = append(errs, fmt.Errorf("budget %s: return lease %s (%d unspent): %w", o.key, o.h.lease.ID, o.h.left, err))
		if !errors.Is(err, model.ErrNotFound) && !errors.Is(err, model.ErrInvalidArgument) {
			again = append(again, o)
		}
	}
	if len(again) > 0 {
		p.mu.Lock()
		p.owed = append(p.owed, again...)
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}
