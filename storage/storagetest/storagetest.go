// Package storagetest is the contract of storage.Store, written as tests:
// every store a cell may run on (storage.MySQL over MariaDB, memstore.Store in
// memory) must pass Run. Each test states one promise of the interface
// (storage/store.go) and checks it against real values: idempotency by order
// number, errors by code, conservation after every call (the store's own
// Ledger through model.AuditCell and model.Audit), one claim per user per
// packet, every claim listed as the credit it owes (storage.ClaimsAfterQuery) and
// booked exactly once by storage.ApplyCredits however often it is delivered, refunds
// of exactly the remainder once, and what a call does
// when its COMMIT fails or its answer is lost. Group commit
// (storage.Grouper, which every store must implement) is held to the
// single-op helpers (storage.Deposit, storage.Send, ..., each a group of
// one): a second store fed a group's ops one by one answers
// every op alike (group.go), and GroupMoney is its money test.
//
// Every test name contains "Contract" so `go test -run Contract` picks the
// suite out of a package's tests.
package storagetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// Harness is one fresh, empty store and the handles the contract drives it by.
type Harness struct {
	// Store holds no rows at all: its Ledger is empty when the test starts.
	Store storage.Store
	// Clock is the store's only source of time (creation times, expiry);
	// the test moves it. It starts at Start.
	Clock *clock.Manual
	// FailNextCommit arms a fault for the next transaction that commits
	// (the next group of money ops: storage.Deposit, storage.Send,
	// storage.OpenBatch, ... are groups of one): with lostAnswer false its COMMIT
	// fails and nothing is applied (the connection dies before the COMMIT
	// reaches the database); with lostAnswer true the COMMIT is applied but
	// its answer is lost. The call then answers as the store's contract
	// says (see storage.ErrCommitUnknown).
	FailNextCommit func(lostAnswer bool)
	// CommitFaults counts the faults FailNextCommit armed that have fired,
	// so a test knows its call met the fault.
	CommitFaults func() int64
	// PutFlow writes f as a row of shard s's flow table and adds delta to
	// the balance of f.ActID's wallet there (made if missing), with none of
	// the store's checks: the audits' tests fabricate with it the flow rows
	// no call of the suite writes (reward, withdraw) and books broken on
	// purpose (delta other than f.Amount).
	PutFlow func(s model.ShardID, f model.Flow, delta model.Cents)
	// HoldWallet holds the wallet row of actID in shard s locked, as
	// another transaction holding it would (made at balance 0 where it
	// was missing, gone again at release): a group that deposits to it,
	// withdraws from it, sends from it or refunds to it waits until
	// release, or until its context ends (then it answers an error and
	// writes nothing); a credit to it is deferred. waiters counts the
	// groups waiting for the hold now; release may be called more than
	// once. GroupMoney needs it; other tests leave it nil.
	HoldWallet func(s model.ShardID, actID string) (waiters func() int, release func())
}

// Start is where every harness clock starts: a fixed UTC time, so packet IDs
// name a known day of month (14).
var Start = time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)

// Run runs the whole contract; newStore is called once per test (twice by the
// tests that need two cells) and must return a fresh, empty store whose clock
// reads Start.
func Run(t *testing.T, newStore func(t *testing.T) Harness) {
	for _, c := range contract {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newStore)
		})
	}
}

type contractTest struct {
	name string
	run  func(t *testing.T, newStore func(t *testing.T) Harness)
}

// contract lists every test of the suite; the files of this package add to it.
var contract []contractTest

func register(name string, run func(t *testing.T, newStore func(t *testing.T) Harness)) {
	contract = append(contract, contractTest{name: name, run: run})
}

// Shards the tests use: sA and sB share database 12 (one relay position:
// ClaimsAfter lists the claims of both), sC lives in
// database 56. In the two-cell tests cell "a" owns database 12 and cell "b"
// database 56.
const (
	sA model.ShardID = 123
	sB model.ShardID = 125
	sC model.ShardID = 567
)

func ownsAll(model.ShardID) bool { return true }

// fixture wraps one harness with helpers that fail the test on an error and
// check the books after every call that can move money.
type fixture struct {
	t    *testing.T
	h    Harness
	s    storage.Store
	ctx  context.Context
	cell string
	owns func(model.ShardID) bool
}

func newFixture(t *testing.T, newStore func(t *testing.T) Harness) *fixture {
	h := newStore(t)
	if got := h.Clock.Now(); !got.Equal(Start) {
		t.Fatalf("harness clock reads %v, want %v", got, Start)
	}
	f := &fixture{t: t, h: h, s: h.Store, ctx: context.Background(), cell: "a", owns: ownsAll}
	f.check(books{})
	return f
}

func (f *fixture) nowMS() int64 { return f.h.Clock.Now().UnixMilli() }

// books is what the store's rows must add up to: the model.Audit totals of
// this store alone, plus the send and refund flows.
type books struct {
	deposits, rewards, withdrawals, balances, open, inFlight, sends, refunds model.Cents
	packets                                                                  int64
	claims, credits                                                          int
}

// check reads the store's Ledger, asserts that its own audit and the cluster
// audit of it alone are clean, and that the totals are want.
func (f *fixture) check(want books) model.Ledger {
	f.t.Helper()
	l := f.ledger()
	r := model.Audit([]model.Ledger{l})
	if !r.OK() {
		f.t.Fatalf("audit of %s: difference %d, problems %q", f.cell, r.Difference, r.Problems)
	}
	got := books{deposits: r.Deposits, rewards: r.Rewards, withdrawals: r.Withdrawals, balances: r.Balances, open: r.OpenRemaining,
		inFlight: r.InFlight, sends: l.Sends, refunds: l.RefundFlows, packets: r.Packets, claims: r.ClaimsCount, credits: r.CreditsCount}
	if got != want {
		f.t.Fatalf("books of %s: %+v, want %+v", f.cell, got, want)
	}
	return l
}

// ledger reads the Ledger and checks it with AuditCell (the cell's own audit).
func (f *fixture) ledger() model.Ledger {
	f.t.Helper()
	l, err := f.s.Ledger(f.ctx, f.cell)
	if err != nil {
		f.t.Fatalf("ledger: %v", err)
	}
	if l.Cell != f.cell {
		f.t.Fatalf("ledger of cell %q, asked for %q", l.Cell, f.cell)
	}
	if a := model.AuditCell(l, f.owns); !a.OK() {
		f.t.Fatalf("cell audit of %s: difference %d, problems %q", f.cell, a.Difference, a.Problems)
	}
	f.sameCellAudit(l)
	return l
}

// sameCellAudit checks that the store's own CellAudit (sums and joins in
// place) reports exactly what model.AuditCell reports of its Ledger l. Of a
// claim credited twice, the order in which a problem line names the two
// accounts is not compared.
func (f *fixture) sameCellAudit(l model.Ledger) model.CellAudit {
	f.t.Helper()
	want := model.AuditCell(l, f.owns)
	got, err := f.s.CellAudit(f.ctx, f.cell, f.owns)
	if err != nil {
		f.t.Fatalf("cell audit of %s: %v", f.cell, err)
	}
	norm := func(a model.CellAudit) model.CellAudit {
		a.Problems = slices.Clone(a.Problems)
		for i, p := range a.Problems {
			if m := twiceLine.FindStringSubmatch(p); m != nil && m[2] > m[3] {
				a.Problems[i] = m[1] + m[3] + " and " + m[2] + ")"
			}
		}
		slices.Sort(a.Problems)
		return a
	}
	if g, w := norm(got), norm(want); !reflect.DeepEqual(g, w) {
		f.t.Fatalf("cell audit of %s in the store:\n%+v\nof its ledger:\n%+v", f.cell, g, w)
	}
	return got
}

var twiceLine = regexp.MustCompile(`^(.* credited twice \(to )(\S+) and (\S+)\)$`)

func (f *fixture) deposit(s model.ShardID, act, order string, amount model.Cents) model.Deposit {
	f.t.Helper()
	d, err := storage.Deposit(f.ctx, f.s, s, act, order, amount)
	if err != nil {
		f.t.Fatalf("deposit %s %d to %s: %v", order, amount, act, err)
	}
	return d
}

func (f *fixture) balance(s model.ShardID, act string) model.Cents {
	f.t.Helper()
	a, err := storage.Account(f.ctx, f.s, s, act)
	if err != nil {
		f.t.Fatalf("account %s: %v", act, err)
	}
	if a.ActID != act || a.Shard != s {
		f.t.Fatalf("account %s of shard %d answered as %+v", act, s, a)
	}
	return a.Balance
}

// sendReq is a random packet of amount cents in count shares.
func sendReq(sender, order string, amount model.Cents, count int64) model.SendRequest {
	return model.SendRequest{Sender: sender, Amount: amount, Count: count, Kind: model.KindRandom, Greeting: "hi", OrderNo: order}
}

// send sends req from shard s as a new packet created now that expires after
// ttl; it fails the test unless the packet is new.
func (f *fixture) send(s model.ShardID, req model.SendRequest, ttl time.Duration) (model.Packet, model.PacketRef) {
	f.t.Helper()
	id := model.NewPacketID(s, f.h.Clock.Now())
	p, repeat, err := storage.Send(f.ctx, f.s, s, req, id, f.h.Clock.Now().Add(ttl).UnixMilli())
	if err != nil || repeat {
		f.t.Fatalf("send %+v: repeat %v, %v", req, repeat, err)
	}
	ref, err := model.ParsePacketID(string(p.ID))
	if err != nil || p.ID != id {
		f.t.Fatalf("send answered packet %q, made %q (%v)", p.ID, id, err)
	}
	return p, ref
}

func (f *fixture) packet(ref model.PacketRef) model.Packet {
	f.t.Helper()
	p, err := storage.Packet(f.ctx, f.s, ref)
	if err != nil {
		f.t.Fatalf("packet %s: %v", ref.ID, err)
	}
	return p
}

// opener is one user opening a packet: act_id and wallet shard.
func opener(act string, s model.ShardID) model.OpenRequest {
	return model.OpenRequest{ActID: act, Shard: s}
}

func (f *fixture) open(ref model.PacketRef, seed uint64, reqs ...model.OpenRequest) ([]model.OpenResult, model.Packet) {
	f.t.Helper()
	res, p, err := storage.OpenBatch(f.ctx, f.s, ref, reqs, rand.New(rand.NewPCG(seed, seed)))
	if err != nil {
		f.t.Fatalf("open %s: %v", ref.ID, err)
	}
	if len(res) != len(reqs) {
		f.t.Fatalf("open of %d requests answered %d", len(reqs), len(res))
	}
	return res, p
}

func (f *fixture) refund(ref model.PacketRef) model.Cents {
	f.t.Helper()
	c, err := storage.Refund(f.ctx, f.s, ref)
	if err != nil {
		f.t.Fatalf("refund %s: %v", ref.ID, err)
	}
	return c
}

// owed is the credits the claims of database db owe, as the relay reads
// them after a restart with no saved position: the first limit claims
// created up to now (ClaimsAfter), credited or not.
func (f *fixture) owed(db int, limit int) []model.Credit {
	f.t.Helper()
	cs, _, err := storage.ClaimsAfter(f.ctx, f.s, db, 0, model.ClaimPos{}, f.nowMS(), limit)
	if err != nil {
		f.t.Fatalf("claims after of db %d: %v", db, err)
	}
	return cs
}

func (f *fixture) applyCredits(credits []model.Credit) int {
	f.t.Helper()
	n, deferred, err := storage.ApplyCredits(f.ctx, f.s, credits)
	if err != nil || len(deferred) != 0 {
		f.t.Fatalf("apply %d credits: deferred %v, %v", len(credits), deferred, err)
	}
	return n
}

// creditOf is the credit a claim owes its claimant in shard s, as
// ClaimsAfter reads it from the claim's row while nothing names its Dest
// (no SetCreditDest, no SendTo).
func creditOf(c model.Claim, s model.ShardID) model.Credit {
	return model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: s, Amount: c.Amount, CreatedMS: c.CreatedMS}
}

// wantCode fails the test unless err carries the code of want.
func wantCode(t *testing.T, what string, err error, want *model.Error) {
	t.Helper()
	if !errors.Is(err, want) {
		code, _ := model.CodeOf(err)
		t.Fatalf("%s: error %v (code %s), want %s", what, err, code, want.Code)
	}
}

// draws returns the first n double-mean shares of a random packet of amount
// cents in count shares drawn from seed: what OpenBatch must give new claims,
// in request order, when it is handed rand.New(rand.NewPCG(seed, seed)).
func draws(amount model.Cents, count int64, seed uint64, n int) []model.Cents {
	r := model.TakeDrawSeed(rand.New(rand.NewPCG(seed, seed))).Rand() // the batch's seed, as the stores take it
	var out []model.Cents
	for i := 0; i < n; i++ {
		s := model.SplitNext(amount, count, r)
		out = append(out, s)
		amount -= s
		count--
	}
	return out
}

func sum(cs ...model.Cents) model.Cents {
	var s model.Cents
	for _, c := range cs {
		s += c
	}
	return s
}

func claimIDs(m map[string]model.Claim) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func describe(res []model.OpenResult) string {
	s := ""
	for i, r := range res {
		s += fmt.Sprintf("[%d] %s seq %d %d repeat %v err %v; ", i, r.Claim.ActID, r.Claim.Seq, r.Claim.Amount, r.Repeat, r.Err)
	}
	return s
}
