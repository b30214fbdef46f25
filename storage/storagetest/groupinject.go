package storagetest

import (
	"errors"
	"fmt"

	"redcell/model"
	"redcell/storage"
)

// The failures GroupMoney injects, one per group, in turn.
const (
	injectDup          = iota // an order number used before: a repeat, or ORDER_CONFLICT
	injectInsufficient        // a send above its sender's balance
	injectSoldOut             // an open that finds no share left
	injectKill                // the connection killed before COMMIT (h.FailNextCommit(false))
	injectLocked              // a wallet the group writes held by another transaction (h.HoldWallet)
	injectLost                // the COMMIT applied, its answer lost (h.FailNextCommit(true))
	injectKinds
)

var injectNames = [injectKinds]string{"duplicate order number", "insufficient balance", "sold out", "killed before COMMIT", "a lock held", "COMMIT answer lost"}

// injection is the failure a group carries: its kind and, for the kinds
// that are an op, the op's index and what it must answer.
type injection struct {
	kind   int
	at     int
	repeat bool // injectDup: a repeat, else ORDER_CONFLICT
}

// check asserts that the injected op answered its failure.
func (m *money) check(what string, inj injection, o storage.MoneyOp) {
	op := answeredOf(o)
	m.t.Helper()
	switch inj.kind {
	case injectDup:
		if inj.repeat && (op.Err != nil || !op.Repeat && !op.Deposit.Repeat) {
			m.t.Fatalf("%s: an order number replayed answered %+v", what, answerOf(o))
		}
		if !inj.repeat {
			wantOp(m.t, what+": an order number reused", op, model.ErrOrderConflict)
		}
	case injectInsufficient:
		wantOp(m.t, what+": a send above the balance", op, model.ErrInsufficientBalance)
	case injectSoldOut:
		if last := op.Results[len(op.Results)-1]; op.Err != nil || !errors.Is(last.Err, model.ErrSoldOut) {
			m.t.Fatalf("%s: the open past the last share answered %s", what, describe(op.Results))
		}
	}
}

// errName names an error code in the run's statistics.
func errName(code string) string {
	switch code {
	case model.ErrInsufficientBalance.Code:
		return "insufficient balance"
	case model.ErrOrderConflict.Code:
		return "order conflict"
	case model.ErrSoldOut.Code:
		return "sold out"
	case model.ErrExpired.Code:
		return "expired"
	}
	return code
}

// duplicate is a deposit or send under an order number applied before:
// the same request (a repeat) or another one (ORDER_CONFLICT).
func (m *money) duplicate() (spec, bool, bool) {
	if len(m.done) == 0 {
		return spec{}, false, false
	}
	d := m.done[m.r.IntN(len(m.done))].in
	snd, isSend := d.(*storage.SendOp)
	dep, _ := d.(*storage.DepositOp)
	switch m.r.IntN(4) {
	case 0: // the same request again
		if isSend {
			return sendOp(snd.Shard, snd.Req, m.packetID(snd.Shard), snd.ExpiresMS), true, true
		}
		return depositOp(dep.Shard, dep.ActID, dep.OrderNo, dep.Amount), true, true
	case 1: // the same kind, another amount
		if isSend {
			req := snd.Req
			req.Kind, req.Amount = model.KindRandom, req.Amount+1
			return sendOp(snd.Shard, req, m.packetID(snd.Shard), snd.ExpiresMS), false, true
		}
		return depositOp(dep.Shard, dep.ActID, dep.OrderNo, dep.Amount+1), false, true
	default: // the other kind
		if isSend {
			return depositOp(snd.Shard, snd.Req.Sender, snd.Req.OrderNo, 100), false, true
		}
		req := model.SendRequest{Sender: dep.ActID, Amount: 1, Count: 1, Kind: model.KindRandom, OrderNo: dep.OrderNo}
		return sendOp(dep.Shard, req, m.packetID(dep.Shard), m.p.nowMS()+1000), false, true
	}
}

// insufficient is a send above its sender's balance, from a wallet no op of
// specs touches (the oracle's balance is the one the send will find).
func (m *money) insufficient(specs []spec) spec {
	u := m.user()
	if touched(specs, u, m.shardOf(u)) {
		u = fmt.Sprintf("x%d", m.orders) // a wallet never used: balance 0
	}
	s := m.shardOf(u)
	bal := m.p.o.balance(s, u)
	req := model.SendRequest{Sender: u, Amount: bal + 1 + model.Cents(m.r.IntN(100)), Count: 1, Kind: model.KindRandom, OrderNo: m.order("s")}
	return sendOp(s, req, m.packetID(s), m.p.nowMS()+1000)
}

// soldOut is an open of a packet no op of specs opens, by users without a
// claim on it, one more than it has shares left (one, when it has none).
func (m *money) soldOut(specs []spec) (spec, bool) {
	now := m.p.nowMS()
	for _, i := range m.r.Perm(len(m.refs)) {
		ref := m.refs[i]
		if opened(specs, ref) {
			continue
		}
		p := m.p.o.packet(ref)
		if p.RemainingCount > 0 && (p.Status != model.StatusOpen || now >= p.ExpiresMS) {
			continue // expired or refunded: the open would answer EXPIRED
		}
		all := make([]model.OpenRequest, len(m.users))
		for j, u := range m.users {
			all[j] = opener(u, m.shardOf(u))
		}
		held, err := storage.ClaimsOf(m.p.o.ctx, m.p.o.s, ref, all)
		if err != nil {
			m.t.Fatal(err)
		}
		var reqs []model.OpenRequest
		for _, j := range m.r.Perm(len(all)) {
			if _, ok := held[all[j].ActID]; !ok && int64(len(reqs)) <= p.RemainingCount {
				reqs = append(reqs, all[j])
			}
		}
		if int64(len(reqs)) != p.RemainingCount+1 {
			continue
		}
		return openOp(ref, m.r.Uint64(), reqs...), true
	}
	return spec{}, false
}
