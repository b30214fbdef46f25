// Package memstore is an in-memory storage.Store with the semantics of the
// MariaDB store (storage.MySQL), for the cluster simulation and fast unit tests
// of the cell; `make run` never uses it. Both stores pass the one contract
// suite, storage/storagetest.
//
// It holds no money rule of its own: every decision is one of model's pure
// functions (model.ApplyDeposit, model.Send, model.Open, model.Refund,
// model.ApplyCredit, model.ReplayOrder), called under the store's lock with
// the rows they need; the store writes what the decision returned, as the
// MariaDB store writes it in one transaction. CommitGroup (storage.Grouper)
// decides a group's ops in order against a staged view of the rows and
// writes all of them at its one COMMIT. Real and shadow traffic are two
// Stores.
//
// It is deterministic: given the same calls in the same order, the same clock
// readings and the same random sources, it gives the same answers, bit for
// bit; no answer depends on the iteration order of a map. It is safe for
// concurrent use (one mutex; calls never block on anything else).
//
// FailNextCommit injects the fault of a COMMIT that fails or whose answer is
// lost, for tests and the simulation.
package memstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"redcell/internal/clock"
	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

var _ storage.Store = (*Store)(nil)

// Store is one cell's money, in memory: what the cell's MariaDB would hold.
type Store struct {
	clk clock.Clock

	mu       sync.Mutex // guards everything below
	accounts map[acctKey]model.Cents
	budgets  budgetBook // budgets and leases (budget.go)
	flows    map[flowKey]*model.Flow
	// credited indexes the credit flows: claimant's shard and claim ID to
	// the accounts credited (more than one only if a claim was credited to
	// two accounts, which the Ledger reports).
	credited map[claimKey][]string
	packets  map[model.PacketID]*packet
	tables   map[tableKey]*table // packets by shard and day of month
	// byDB indexes every claim by the database of its packet's shard, in
	// (CreatedMS, PacketID, Seq) order: what ClaimsAfter pages (relay.go).
	byDB     map[int][]claimAt
	dest     func(model.ShardID) string // a new claim's Dest (SetCreditDest); nil: ""
	relay    map[int]int64              // the relay's saved positions, by database
	recon    map[int]int64              // reconciliation's saved positions, by database
	idents   map[identKey]model.IdentityBinding
	rewards  map[string]*model.Reward              // by order number (rewards.go)
	couponRq map[couponReqKey]*model.CouponRequest // coupon requests (coupons.go)
	coupons  map[string]*model.Coupon              // by coupon ID (coupons.go)
	flowSeq  int64                                 // the last flow row's Seq
	fault    fault
	faults   int64 // faults that fired
	// held are the wallets HoldWallet holds, each with the channel its
	// release closes; waiting counts the groups waiting for one of them.
	held    map[acctKey]chan struct{}
	waiting int
}

type identKey struct {
	shard          model.ShardID
	app, appUserID string
}

type acctKey struct {
	shard model.ShardID
	act   string
}

type flowKey struct {
	shard model.ShardID
	act   string
	order string
}

type claimKey struct {
	shard model.ShardID
	claim string
}

type tableKey struct {
	shard model.ShardID
	day   int
}

// table is a packet table and its claim table: t_packet_Y_DD, t_claim_Y_DD.
type table struct {
	packets []*packet                  // in creation order
	open    map[model.PacketID]*packet // packets with StatusOpen
}

type packet struct {
	p      model.Packet
	ref    model.PacketRef
	claims []model.Claim  // claims[i].Seq == i+1, as answered: no ActShard, no Dest
	routes []route        // routes[i] is where claims[i]'s credit goes
	byUser map[string]int // act_id → index in claims
}

// route is what a claim's row records of its credit besides the claim:
// the claimant's shard (Claim.ActShard) and the cell its credit was sent to
// (Claim.Dest).
type route struct {
	shard model.ShardID
	dest  string
}

// fault is the armed commit fault, if any.
type fault struct {
	armed      bool
	lostAnswer bool
}

// New returns an empty store reading time from clk (the system clock if nil).
func New(clk clock.Clock) *Store {
	return &Store{
		clk:      clock.Or(clk),
		accounts: map[acctKey]model.Cents{},
		flows:    map[flowKey]*model.Flow{},
		credited: map[claimKey][]string{},
		packets:  map[model.PacketID]*packet{},
		tables:   map[tableKey]*table{},
		byDB:     map[int][]claimAt{},
		relay:    map[int]int64{},
		recon:    map[int]int64{},
		idents:   map[identKey]model.IdentityBinding{},
		rewards:  map[string]*model.Reward{},
		couponRq: map[couponReqKey]*model.CouponRequest{},
		coupons:  map[string]*model.Coupon{},
	}
}

// bindIdentity runs storage.BindAccount (no commit fault: a binding
// moves no money, and its retry is a repeat).
func (s *Store) bindIdentity(_ context.Context, sh model.ShardID, want model.IdentityBinding, legacy ...string) (model.IdentityBinding, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := identKey{sh, want.App, want.AppUserID}
	if have, ok := s.idents[k]; ok {
		b, repeat, err := model.Bind(&have, want, legacy...)
		if err == nil && b != have {
			s.idents[k] = b // re-keyed from a legacy form
		}
		return b, repeat, err
	}
	s.idents[k] = want
	return model.Bind(nil, want)
}

// FailNextCommit arms a fault for the next CommitGroup of at least one money
// op (storage.MoneyOp; the whole group meets it once), whatever the group
// decides: a single write (storage.Deposit, storage.Send, ...) is a group of
// one, so a repeat, a conflict or a refusal meets it too, as a transaction
// that COMMITs without writing meets a dead connection in MariaDB.
// With lostAnswer false that call writes nothing and answers an error
// matching storage.ErrCommitUnknown (the COMMIT never reached the database);
// with lostAnswer true it writes everything and then answers that error (the
// COMMIT applied, its answer was lost). Arming again replaces the fault.
func (s *Store) FailNextCommit(lostAnswer bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = fault{armed: true, lostAnswer: lostAnswer}
}

// CommitFaults counts the faults FailNextCommit armed that have fired.
func (s *Store) CommitFaults() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// commitLocked is a call's COMMIT: write tells whether to write what the
// decision returned, err what to answer after writing. s.mu must be held.
func (s *Store) commitLocked(op string) (write bool, err error) {
	if !s.fault.armed {
		return true, nil
	}
	f := s.fault
	s.fault = fault{}
	s.faults++
	if f.lostAnswer {
		return true, fmt.Errorf("memstore: %s: COMMIT applied, its answer lost: %w", op, storage.ErrCommitUnknown)
	}
	return false, fmt.Errorf("memstore: %s: COMMIT failed: %w", op, storage.ErrCommitUnknown)
}

func (s *Store) nowMS() int64 { return s.clk.Now().UnixMilli() }

// writeFlowLocked writes a flow row and its balance change. s.mu must be held.
func (s *Store) writeFlowLocked(sh model.ShardID, f model.Flow) {
	k := flowKey{sh, f.ActID, f.OrderNo}
	_, dup := s.flows[k]
	invariant.That(!dup, "flow written twice under one order number")
	s.flowSeq++
	f.Seq = s.flowSeq
	s.flows[k] = &f
	a := acctKey{sh, f.ActID}
	s.accounts[a] += f.Amount
	invariant.That(s.accounts[a] >= 0, "balance below zero")
	invariant.That(!f.BalanceKnown || f.BalanceAfter == s.accounts[a], "flow's balance after differs from the balance")
	if f.Kind == model.FlowCredit {
		ck := claimKey{sh, creditOrder(f.OrderNo)}
		s.credited[ck] = append(s.credited[ck], f.ActID)
	}
}

// creditOrder is the claim ID in a credit flow's order number (model.CreditOrderNo).
func creditOrder(order string) string { return strings.TrimPrefix(order, "claim:") }

// account answers storage.AccountQuery.
func (s *Store) account(ctx context.Context, sh model.ShardID, actID string) (model.Account, error) {
	if err := ctx.Err(); err != nil {
		return model.Account{}, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	return model.Account{ActID: actID, Shard: sh, Balance: s.accounts[acctKey{sh, actID}]}, nil
}

// EnsureShard implements storage.Schema: every table exists in memory.
func (s *Store) EnsureShard(ctx context.Context, sh model.ShardID) error {
	invariant.That(sh.Valid(), "shard out of range")
	return ctx.Err()
}

// EnsureDays implements storage.Schema: it only reports progress, shard by
// shard.
func (s *Store) EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error {
	for i := range shards {
		if err := ctx.Err(); err != nil {
			return err
		}
		if progress != nil {
			progress(i+1, len(shards))
		}
	}
	return nil
}

// Ping implements storage.Store.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }
