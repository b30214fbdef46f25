package storagetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"redcell/model"
	"redcell/storage"
)

// The group-commit contract (storage.Grouper, storage/group.go), checked
// against the single-op helpers: a second store of the same kind, fed the
// same ops one at a time through storage.Deposit, Send, OpenBatch,
// ApplyCredits, Withdraw and Refund (each a group of one), is the oracle. Every op of a group must answer what its single-op method
// answers in its place, and both stores must hold the same rows after.

// spec is one op of a group as a caller makes it: its inputs, and the seed of
// an open's random source. op makes a fresh op from it as often as needed
// (the group, a retry, the oracle), each with its own source.
type spec struct {
	in     storage.MoneyOp // inputs only
	seed   uint64
	sender string // a refund: the packet's sender, whose wallet a refund may credit
}

func (s spec) op() storage.MoneyOp {
	switch in := s.in.(type) {
	case *storage.OpenOp:
		return &storage.OpenOp{Ref: in.Ref, Reqs: in.Reqs, Rand: rand.New(rand.NewPCG(s.seed, s.seed))}
	case *storage.SendOp:
		return &storage.SendOp{Shard: in.Shard, Req: in.Req, PacketID: in.PacketID, ExpiresMS: in.ExpiresMS}
	case *storage.DepositOp:
		return &storage.DepositOp{Shard: in.Shard, ActID: in.ActID, OrderNo: in.OrderNo, Amount: in.Amount}
	case *storage.WithdrawOp:
		return &storage.WithdrawOp{Shard: in.Shard, ActID: in.ActID, OrderNo: in.OrderNo, Amount: in.Amount}
	case *storage.RefundOp:
		return &storage.RefundOp{Ref: in.Ref}
	case *storage.CreditsOp:
		return &storage.CreditsOp{Credits: in.Credits}
	}
	panic(fmt.Sprintf("storagetest: spec of %T", s.in))
}

func depositOp(s model.ShardID, act, order string, amount model.Cents) spec {
	return spec{in: &storage.DepositOp{Shard: s, ActID: act, OrderNo: order, Amount: amount}}
}

func sendOp(s model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) spec {
	return spec{in: &storage.SendOp{Shard: s, Req: req, PacketID: id, ExpiresMS: expiresMS}}
}

func openOp(ref model.PacketRef, seed uint64, reqs ...model.OpenRequest) spec {
	return spec{in: &storage.OpenOp{Ref: ref, Reqs: reqs}, seed: seed}
}

func withdrawOp(s model.ShardID, act, order string, amount model.Cents) spec {
	return spec{in: &storage.WithdrawOp{Shard: s, ActID: act, OrderNo: order, Amount: amount}}
}

func refundOp(ref model.PacketRef) spec {
	return spec{in: &storage.RefundOp{Ref: ref}}
}

func creditsOp(credits ...model.Credit) spec {
	return spec{in: &storage.CreditsOp{Credits: credits}}
}

func opsOf(specs []spec) []storage.MoneyOp {
	ops := make([]storage.MoneyOp, len(specs))
	for i, s := range specs {
		ops[i] = s.op()
	}
	return ops
}

// answered is an op's answers, whatever its type: the suite's checks read
// them by name (the fields of a type the op has not are zero).
type answered struct {
	Kind       storage.GroupKind
	Results    []model.OpenResult
	Packet     model.Packet
	Repeat     bool
	Deposit    model.Deposit
	Withdrawal model.Withdrawal
	Applied    int
	Deferred   []string
	Refunded   model.Cents
	Err        error
}

func answeredOf(op storage.MoneyOp) answered {
	a := answered{Kind: op.Kind(), Err: op.Failed()}
	switch op := op.(type) {
	case *storage.OpenOp:
		a.Results, a.Packet = op.Results, op.Packet
	case *storage.SendOp:
		a.Packet, a.Repeat = op.Packet, op.Repeat
	case *storage.DepositOp:
		a.Deposit = op.Deposit
	case *storage.WithdrawOp:
		a.Withdrawal = op.Withdrawal
	case *storage.RefundOp:
		a.Packet, a.Refunded = op.Packet, op.Refunded
	case *storage.CreditsOp:
		a.Applied, a.Deferred = op.Applied, op.Deferred
	case *storage.BookOp:
		a.Applied, a.Deferred = op.Applied, op.Deferred
	case *storage.IssueOp:
		a.Repeat = op.Repeat
	case *storage.AcceptOp:
		a.Repeat = op.Repeat
	}
	return a
}

func answeredAll(ops []storage.MoneyOp) []answered {
	out := make([]answered, len(ops))
	for i, op := range ops {
		out[i] = answeredOf(op)
	}
	return out
}

// grouperOf returns h's store as a storage.Grouper; a store without
// CommitGroup fails the test: every store a cell runs on must have it.
func grouperOf(t *testing.T, h Harness) storage.Grouper {
	t.Helper()
	g, ok := h.Store.(storage.Grouper)
	if !ok {
		t.Fatalf("the store under test (%T) does not implement storage.Grouper (CommitGroup)", h.Store)
	}
	return g
}

// single runs op through the single-op helper of its kind on s and sets its
// answers as CommitGroup sets them: a coded error of a send or deposit is
// the op's own (op.Err); any other error is returned.
func single(ctx context.Context, s storage.Store, op storage.MoneyOp) error {
	switch op := op.(type) {
	case *storage.OpenOp:
		res, p, err := storage.OpenBatch(ctx, s, op.Ref, op.Reqs, op.Rand)
		if err != nil {
			return err
		}
		op.Results, op.Packet = res, p
	case *storage.SendOp:
		p, rep, err := storage.Send(ctx, s, op.Shard, op.Req, op.PacketID, op.ExpiresMS)
		if err != nil && errCode(err) == "error" {
			return err
		}
		op.Packet, op.Repeat, op.Err = p, rep, err
	case *storage.DepositOp:
		d, err := storage.Deposit(ctx, s, op.Shard, op.ActID, op.OrderNo, op.Amount)
		if err != nil && errCode(err) == "error" {
			return err
		}
		op.Deposit, op.Err = d, err
	case *storage.CreditsOp:
		n, deferred, err := storage.ApplyCredits(ctx, s, op.Credits)
		if err != nil {
			return err
		}
		op.Applied, op.Deferred = n, deferred
	case *storage.WithdrawOp:
		w, err := storage.Withdraw(ctx, s, op.Shard, op.ActID, op.OrderNo, op.Amount)
		if err != nil && errCode(err) == "error" {
			return err
		}
		op.Withdrawal, op.Err = w, err
	case *storage.RefundOp:
		c, err := storage.Refund(ctx, s, op.Ref)
		if err != nil && errCode(err) == "error" {
			return err
		}
		if op.Refunded, op.Err = c, err; err == nil {
			// The packet as the refund left it, as the group answers it.
			if op.Packet, err = storage.Packet(ctx, s, op.Ref); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("op %T of no kind single runs", op)
	}
	return nil
}

// answer is what an op answered, comparable across stores: errors by code
// ("error" for one without a code), and nothing but the code of an op that
// failed.
type answer struct {
	Kind       storage.GroupKind
	Results    []result
	Packet     model.Packet
	Repeat     bool
	Deposit    model.Deposit
	Applied    int
	Deferred   []string
	Refunded   model.Cents
	Withdrawal model.Withdrawal
	Err        string
}

type result struct {
	Claim  model.Claim
	Repeat bool
	Err    string
}

func errCode(err error) string {
	if err == nil {
		return ""
	}
	if c, _ := model.CodeOf(err); c != model.ErrInternal.Code {
		return c
	}
	return "error"
}

func answerOf(o storage.MoneyOp) answer {
	op := answeredOf(o)
	if op.Err != nil {
		return answer{Kind: op.Kind, Err: errCode(op.Err)}
	}
	a := answer{Kind: op.Kind, Packet: op.Packet, Repeat: op.Repeat, Deposit: op.Deposit, Applied: op.Applied, Refunded: op.Refunded, Withdrawal: op.Withdrawal}
	if len(op.Deferred) > 0 {
		a.Deferred = op.Deferred
	}
	for _, r := range op.Results {
		a.Results = append(a.Results, result{Claim: r.Claim, Repeat: r.Repeat, Err: errCode(r.Err)})
	}
	return a
}

// pair is the store under test (g), which takes groups, and the oracle (o),
// a store fed the same ops one by one; their clocks move together.
type pair struct {
	t    *testing.T
	g, o *fixture
	cg   storage.Grouper
	// fresh are the ops of the last group the store applied, to feed the
	// oracle when it is compared (see commit).
}

func newPair(t *testing.T, g, o *fixture) *pair {
	return &pair{t: t, g: g, o: o, cg: grouperOf(t, g.h)}
}

func newStorePair(t *testing.T, newStore func(t *testing.T) Harness) *pair {
	g := newFixture(t, newStore)
	o := newFixture(t, newStore)
	return newPair(t, g, o)
}

// nowMS is the time both stores read.
func (p *pair) nowMS() int64 { return p.g.nowMS() }

// advanceMS moves both clocks.
func (p *pair) advanceMS(ms int64) {
	d := msDuration(ms)
	p.g.h.Clock.Advance(d)
	p.o.h.Clock.Advance(d)
}

// packetID is a new packet ID of shard s at the stores' time.
func (p *pair) packetID(s model.ShardID) (model.PacketID, model.PacketRef) {
	id := model.NewPacketID(s, p.g.h.Clock.Now())
	ref, err := model.ParsePacketID(string(id))
	if err != nil {
		p.t.Fatal(err)
	}
	return id, ref
}

// oracle feeds the ops of specs to the oracle one by one, in the order a
// group decides them (credit batches after every other op), and returns
// them answered, in list order.
func (p *pair) oracle(specs []spec) []storage.MoneyOp {
	p.t.Helper()
	ops := opsOf(specs)
	for _, credits := range []bool{false, true} {
		for i, op := range ops {
			if (op.Kind() == storage.OpCredits) != credits {
				continue
			}
			if err := single(p.o.ctx, p.o.s, op); err != nil {
				p.t.Fatalf("oracle: op %d (%s): %v", i, op.Kind(), err)
			}
		}
	}
	return ops
}

// compare fails the test unless every op of got answered as its twin in want.
func (p *pair) compare(what string, got, want []storage.MoneyOp) {
	p.t.Helper()
	for i := range want {
		if g, w := answerOf(got[i]), answerOf(want[i]); !reflect.DeepEqual(g, w) {
			p.t.Fatalf("%s: op %d (%s) answered\n  %+v\nits single-op method answers\n  %+v", what, i, want[i].Kind(), g, w)
		}
	}
}

// commit commits specs as one group on the store under test, feeds them to
// the oracle one by one, and fails the test unless every answer is the
// oracle's and both stores' books are clean and alike. It returns the
// group's ops, answered.
func (p *pair) commit(what string, specs ...spec) []answered {
	p.t.Helper()
	ops := opsOf(specs)
	if err := p.cg.CommitGroup(p.g.ctx, storage.Ops(ops)); err != nil {
		p.t.Fatalf("%s: commit group of %d ops: %v", what, len(ops), err)
	}
	p.compare(what, ops, p.oracle(specs))
	p.sameBooks(what)
	return answeredAll(ops)
}

// sameBooks fails the test unless both stores' ledgers pass their audits and
// hold the same sums, claims (with their claimants' shards and dests) and
// credits. It returns the audit.
func (p *pair) sameBooks(what string) model.AuditReport {
	p.t.Helper()
	lg, lo := p.g.ledger(), p.o.ledger()
	rg, ro := model.Audit([]model.Ledger{lg}), model.Audit([]model.Ledger{lo})
	if !rg.OK() || !ro.OK() {
		p.t.Fatalf("%s: audit of the store %+v, of the oracle %+v", what, rg, ro)
	}
	if !reflect.DeepEqual(rg, ro) || lg.Sends != lo.Sends || lg.RefundFlows != lo.RefundFlows {
		p.t.Fatalf("%s: books differ: store %+v, oracle %+v", what, rg, ro)
	}
	if !reflect.DeepEqual(lg.Claims, lo.Claims) || !reflect.DeepEqual(lg.Credits, lo.Credits) {
		p.t.Fatalf("%s: rows differ: claims %d/%d, credits %d/%d (store/oracle)", what,
			len(lg.Claims), len(lo.Claims), len(lg.Credits), len(lo.Credits))
	}
	return rg
}

// wantOp fails the test unless op failed with code want (nil: succeeded).
func wantOp(t *testing.T, what string, op answered, want *model.Error) {
	t.Helper()
	if want == nil {
		if op.Err != nil {
			t.Fatalf("%s: %v", what, op.Err)
		}
		return
	}
	wantCode(t, what, op.Err, want)
}

// wantResults fails the test unless the open's results carry the codes
// want ("" for a claim), with Repeat where rep says.
func wantResults(t *testing.T, what string, op answered, want []string, rep []bool) {
	t.Helper()
	if op.Err != nil || len(op.Results) != len(want) {
		t.Fatalf("%s: %d results, %v; want %d", what, len(op.Results), op.Err, len(want))
	}
	for i, r := range op.Results {
		if errCode(r.Err) != want[i] || r.Repeat != rep[i] {
			t.Fatalf("%s: %s", what, describe(op.Results))
		}
	}
}
