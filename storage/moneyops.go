package storage

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"redcell/model"
)

// The money ops: one type per operation a group carries. Each holds its
// inputs, set by the caller, and its answers, set by CommitGroup (valid only
// when CommitGroup returns nil). The inputs and answers of each type mean what
// the single-op function beside it says (single.go).
//
// The ops that read and change rows (open, send, deposit, withdraw, refund)
// are decided here, once for both stores (Decide): against a GroupState, a
// store's view of the rows the group locked as the ops before left them, with
// the pure money functions of package model. The bulk ops (credits, reward
// issues and bookings, coupon accepts) are written by each store's multi-row
// statements, with the replay decisions of model.

// MoneyOp is one money operation of a group: *OpenOp, *SendOp, *DepositOp,
// *WithdrawOp, *RefundOp, *CreditsOp, *BookOp, *IssueOp or *AcceptOp.
type MoneyOp interface {
	Op
	// Kind names the op's type.
	Kind() GroupKind
	// Shards lists the shards whose rows the op writes, in its own order,
	// repeats kept (a booker's take: the first shard of its database).
	Shards() []model.ShardID
	// Weight is what the op counts against a group's size: its requests (a
	// batch of 200 opens counts 200, a credit batch its credits, a reward
	// booking its rewards, a booker's take its limit), at least 1.
	Weight() int
	// Failed is the op's own error once CommitGroup returned nil: nothing of
	// the op was written. Nil: the op's answers hold.
	Failed() error
	// Fail sets the op's own error, for an op its caller refuses before
	// the group (a shard the cell no longer serves).
	Fail(err error)
	// reset clears the answers, before each run of a group.
	reset()
}

// Outcome is a money op's own error (embedded in each op type).
type Outcome struct {
	// Err is the op's own error: nothing of the op was written.
	Err error
}

// Failed implements MoneyOp.
func (o *Outcome) Failed() error { return o.Err }

// Fail implements MoneyOp.
func (o *Outcome) Fail(err error) { o.Err = err }

func (*OpenOp) isOp()     {}
func (*SendOp) isOp()     {}
func (*DepositOp) isOp()  {}
func (*WithdrawOp) isOp() {}
func (*RefundOp) isOp()   {}
func (*CreditsOp) isOp()  {}
func (*BookOp) isOp()     {}
func (*IssueOp) isOp()    {}
func (*AcceptOp) isOp()   {}

// OpenOp opens packet Ref once per request, in FIFO order (OpenBatch).
// Rand is the source the op takes its draw seed from, once per CommitGroup
// (two draws, model.TakeDrawSeed: every run of the transaction draws the
// same shares; not shared with other goroutines).
//
// CreditHere, when set, tells the claimants' shards (a request's Shard)
// whose wallets the group may credit in its own transaction: a same-cell
// claimant, whose database the caller made sure it serves for the group's
// time. A new claim of such a shard is credited there, after the group's
// other writes, when its wallet row is free (no wait; a held one is left to
// the relay), under the order number a relay's credit would take
// (model.CreditOrderNo), and its result is marked Credited. MySQL credits
// there only a shard whose wallet tables the process has made sure of (no
// DDL on an open's path); the others are left to the relay.
type OpenOp struct {
	Ref        model.PacketRef
	Reqs       []model.OpenRequest
	Rand       *rand.Rand
	CreditHere func(model.ShardID) bool

	Results []model.OpenResult // one per request
	Packet  model.Packet       // the packet as this op left it (zero if not found)
	Outcome

	seed model.DrawSeed
	here []model.Credit // the new claims the group may credit here (CreditHere)
}

// Here is the credits of the op's new claims the group may book in its own
// transaction (CreditHere), as its decision made them; nil when none.
func (op *OpenOp) Here() []model.Credit { return op.here }

// MarkCredited marks the results of Here's credits Credited, but for those
// named in deferred (by claim ID: their wallet rows were held).
func (op *OpenOp) MarkCredited(deferred []string) {
	for _, c := range op.here {
		if slices.Contains(deferred, c.ClaimID) {
			continue
		}
		for i := range op.Results {
			if r := &op.Results[i]; r.Err == nil && r.Claim.ID == c.ClaimID {
				r.Credited = true
			}
		}
	}
}

// SendOp debits Req.Sender in Shard and creates packet PacketID
// (model.NewPacketID for Shard), expiring at ExpiresMS (Unix ms) (Send).
type SendOp struct {
	Shard     model.ShardID
	Req       model.SendRequest
	PacketID  model.PacketID
	ExpiresMS int64

	Packet model.Packet // the new packet; when Repeat, the order's first packet as it is now
	Repeat bool         // the order was applied before
	Outcome
}

// DepositOp credits ActID's wallet in Shard by Amount (cents, > 0) under
// the caller's order number (Deposit).
type DepositOp struct {
	Shard   model.ShardID
	ActID   string
	OrderNo string
	Amount  model.Cents

	Deposit model.Deposit
	Outcome
}

// WithdrawOp debits ActID's wallet in Shard by Amount (cents, > 0) under
// the caller's order number (Withdraw).
type WithdrawOp struct {
	Shard   model.ShardID
	ActID   string
	OrderNo string
	Amount  model.Cents

	Withdrawal model.Withdrawal // Repeat set for an order applied before
	Outcome
}

// RefundOp gives expired packet Ref's exact remainder back to its sender
// (Refund).
type RefundOp struct {
	Ref model.PacketRef

	Packet   model.Packet // the packet as this op left it
	Refunded model.Cents  // the cents refunded now (0: nothing was due)
	Outcome
}

// CreditsOp books claims into their claimants' wallets, in any order
// (ApplyCredits).
type CreditsOp struct {
	Credits []model.Credit

	Applied  int      // the credits booked now
	Deferred []string // claim IDs left for a later call (a wallet row was held)
	Outcome
}

// BookOp books issued rewards into wallets (BookRewards): Rewards (by Shard
// and OrderNo), in any order; or, with Take set instead, the rewards of one
// database a booker books next, answered in Rewards as booked.
type BookOp struct {
	Rewards []model.Reward
	Take    *RewardTake

	Applied  int      // the rewards booked now
	Deferred []string // with Take: order numbers found but left pending (their wallet tables made after the group), for the next pass
	Outcome

	tablesFirst []model.ShardID // MySQL: shards whose tables Deferred's rewards need (made after the group)
}

// IssueOp stores one issued reward, pending (IssueReward); CreatedMS is the
// group's time when 0.
type IssueOp struct {
	Reward model.Reward

	Issued model.Reward // the reward as stored (the first one when Repeat)
	Repeat bool         // the reward was stored before
	Outcome
}

// AcceptOp stores one coupon request, accepted (AcceptCoupon); Coupon.Shard
// is set, AcceptedMS the group's time when 0.
type AcceptOp struct {
	Coupon model.CouponRequest

	Accepted model.CouponRequest // the request as stored (the first one, as it is now, when Repeat)
	Repeat   bool                // the serial was stored before
	Outcome
}

func (*OpenOp) Kind() GroupKind     { return OpOpen }
func (*SendOp) Kind() GroupKind     { return OpSend }
func (*DepositOp) Kind() GroupKind  { return OpDeposit }
func (*WithdrawOp) Kind() GroupKind { return OpWithdraw }
func (*RefundOp) Kind() GroupKind   { return OpRefund }
func (*CreditsOp) Kind() GroupKind  { return OpCredits }
func (*BookOp) Kind() GroupKind     { return OpRewards }
func (*IssueOp) Kind() GroupKind    { return OpIssue }
func (*AcceptOp) Kind() GroupKind   { return OpAccept }

func (op *OpenOp) Shards() []model.ShardID     { return []model.ShardID{op.Ref.Shard} }
func (op *SendOp) Shards() []model.ShardID     { return []model.ShardID{op.Shard} }
func (op *DepositOp) Shards() []model.ShardID  { return []model.ShardID{op.Shard} }
func (op *WithdrawOp) Shards() []model.ShardID { return []model.ShardID{op.Shard} }
func (op *RefundOp) Shards() []model.ShardID   { return []model.ShardID{op.Ref.Shard} }
func (op *IssueOp) Shards() []model.ShardID    { return []model.ShardID{op.Reward.Shard} }
func (op *AcceptOp) Shards() []model.ShardID   { return []model.ShardID{op.Coupon.Shard} }

func (op *CreditsOp) Shards() []model.ShardID {
	out := make([]model.ShardID, len(op.Credits))
	for i, c := range op.Credits {
		out[i] = c.Shard
	}
	return out
}

func (op *BookOp) Shards() []model.ShardID {
	if op.Take != nil {
		return []model.ShardID{model.ShardID(op.Take.DB * model.ShardsPerDB)}
	}
	out := make([]model.ShardID, len(op.Rewards))
	for i, r := range op.Rewards {
		out[i] = r.Shard
	}
	return out
}

func (op *OpenOp) Weight() int    { return max(1, len(op.Reqs)) }
func (*SendOp) Weight() int       { return 1 }
func (*DepositOp) Weight() int    { return 1 }
func (*WithdrawOp) Weight() int   { return 1 }
func (*RefundOp) Weight() int     { return 1 }
func (op *CreditsOp) Weight() int { return max(1, len(op.Credits)) }
func (*IssueOp) Weight() int      { return 1 }
func (*AcceptOp) Weight() int     { return 1 }
func (op *BookOp) Weight() int {
	if op.Take != nil { // a booker's batch: as many as it may book
		return max(1, op.Take.Limit)
	}
	return max(1, len(op.Rewards))
}

func (op *OpenOp) reset()     { op.Results, op.Packet, op.Err, op.here = nil, model.Packet{}, nil, nil }
func (op *SendOp) reset()     { op.Packet, op.Repeat, op.Err = model.Packet{}, false, nil }
func (op *DepositOp) reset()  { op.Deposit, op.Err = model.Deposit{}, nil }
func (op *WithdrawOp) reset() { op.Withdrawal, op.Err = model.Withdrawal{}, nil }
func (op *RefundOp) reset()   { op.Packet, op.Refunded, op.Err = model.Packet{}, 0, nil }
func (op *CreditsOp) reset()  { op.Applied, op.Deferred, op.Err = 0, nil, nil }
func (op *IssueOp) reset()    { op.Issued, op.Repeat, op.Err = model.Reward{}, false, nil }
func (op *AcceptOp) reset()   { op.Accepted, op.Repeat, op.Err = model.CouponRequest{}, false, nil }
func (op *BookOp) reset() {
	op.Applied, op.Deferred, op.Err = 0, nil, nil
	if op.Take != nil {
		op.Rewards, op.tablesFirst = nil, nil
	}
}

// BeginGroup readies ops for one CommitGroup call: each open takes its draw
// seed (every run of the group's transaction draws the same shares). Both
// stores' CommitGroup call it once, before any run.
func BeginGroup(ops []MoneyOp) {
	for _, op := range ops {
		if o, ok := op.(*OpenOp); ok {
			o.seed = model.TakeDrawSeed(o.Rand)
		}
	}
}

// ResetAnswers clears every op's answers, before a run of the group (a
// store may run a group's transaction more than once).
func ResetAnswers(ops []MoneyOp) {
	for _, op := range ops {
		op.reset()
	}
}

// GroupState is a store's view, for one run of a group, of the rows its
// money ops decide against: the rows the group read (and locked) as the ops
// decided before left them. Decide reads it and hands it each decision's
// writes, which it shows to the ops after and writes at COMMIT. Both stores
// implement it (MySQL's groupState, memstore's group).
type GroupState interface {
	// NowMS is the group's time (Unix ms): every row it writes carries it.
	NowMS() int64
	// Packet is packet id as the group left it; false: not found.
	Packet(id model.PacketID) (model.Packet, bool)
	// Claims are the claims reqs's users hold on packet id (found), made
	// before the group or by it. complete is false when the store did not
	// read the earlier ones (an optimistic run): an open refused then is
	// decided again with them (Decide answers errClaimsNeeded).
	Claims(id model.PacketID, reqs []model.OpenRequest) (held map[string]model.Claim, complete bool)
	// Balance is actID's wallet balance in shard sh (cents; 0: no row).
	Balance(sh model.ShardID, actID string) model.Cents
	// Flow is the flow row of (actID, orderNo) in shard sh.
	Flow(sh model.ShardID, actID, orderNo string) (model.Flow, bool)
	// Opened writes an open's fresh claims and the packet after them.
	Opened(ref model.PacketRef, out model.OpenOutcome)
	// Sent writes a send: the new packet, the sender's flow and balance.
	Sent(sh model.ShardID, out model.SendOutcome)
	// Moved writes a deposit's or withdrawal's flow; the wallet's balance
	// becomes f.BalanceAfter.
	Moved(sh model.ShardID, f model.Flow)
	// Refunded writes a refund: the packet after and the sender's flow,
	// whose amount goes to the sender's wallet.
	Refunded(ref model.PacketRef, out model.RefundOutcome)
	// SentBefore asks for packet id, the first packet of a send's order
	// number applied before, to be set in *into before CommitGroup returns:
	// as the group leaves it (MySQL reads it after the group's writes), or
	// as the ops before left it (memstore, at the decision).
	SentBefore(id model.PacketID, into *model.Packet)
}

// Decide decides op, one of the row ops (open, send, deposit, withdraw,
// refund), against st and hands its writes to st; decided is false for any
// other op (a bulk op, each store's own). err is the group's, never the op's
// (the op's own goes in its Outcome): errClaimsNeeded, when an open of an
// optimistic run is refused.
func Decide(st GroupState, op MoneyOp) (decided bool, err error) {
	now := st.NowMS()
	switch op := op.(type) {
	case *OpenOp:
		return true, op.decide(st, now)
	case *SendOp:
		r := op.Req
		if prior, ok := st.Flow(op.Shard, r.Sender, r.OrderNo); ok {
			if op.Err = model.ReplayOrder(prior, model.FlowSend, model.SendHash(r)); op.Err == nil {
				op.Repeat, op.Packet.ID = true, model.PacketID(prior.Ref)
				st.SentBefore(op.Packet.ID, &op.Packet)
			}
			return true, nil
		}
		if _, ok := st.Packet(op.PacketID); ok {
			op.Err = fmt.Errorf("storage: send %s: packet ID %s exists", r.OrderNo, op.PacketID)
			return true, nil
		}
		out, err := model.Send(model.SendInput{Req: r, ID: op.PacketID, Balance: st.Balance(op.Shard, r.Sender), NowMS: now, ExpiresMS: op.ExpiresMS})
		if err != nil {
			op.Err = err
			return true, nil
		}
		st.Sent(op.Shard, out)
		op.Packet = out.Packet
	case *DepositOp:
		if prior, ok := st.Flow(op.Shard, op.ActID, op.OrderNo); ok {
			if op.Err = model.ReplayOrder(prior, model.FlowDeposit, model.DepositHash(op.Amount)); op.Err == nil {
				op.Deposit = model.Deposit{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: prior.BalanceAfter, Repeat: true}
			}
			return true, nil
		}
		out, err := model.ApplyDeposit(model.DepositInput{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: st.Balance(op.Shard, op.ActID), NowMS: now})
		if err != nil {
			op.Err = err
			return true, nil
		}
		st.Moved(op.Shard, out.Flow)
		op.Deposit = out.Deposit
	case *WithdrawOp:
		if prior, ok := st.Flow(op.Shard, op.ActID, op.OrderNo); ok {
			if op.Err = model.ReplayOrder(prior, model.FlowWithdraw, model.WithdrawHash(op.Amount)); op.Err == nil {
				op.Withdrawal = model.Withdrawal{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: prior.BalanceAfter, Repeat: true}
			}
			return true, nil
		}
		out, err := model.ApplyWithdraw(model.WithdrawInput{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: st.Balance(op.Shard, op.ActID), NowMS: now})
		if err != nil {
			op.Err = err
			return true, nil
		}
		st.Moved(op.Shard, out.Flow)
		op.Withdrawal = model.Withdrawal{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: out.Flow.BalanceAfter}
	case *RefundOp:
		p, ok := st.Packet(op.Ref.ID)
		if !ok {
			op.Err = model.Errorf(model.ErrNotFound, "red packet %s not found", op.Ref.ID)
			return true, nil
		}
		out := model.Refund(p, now)
		op.Packet = out.Packet
		if out.Due {
			st.Refunded(op.Ref, out)
			op.Refunded = out.Amount
		}
	default:
		return false, nil
	}
	return true, nil
}

// decide decides an open with the pure model.Open, on the packet as the
// group left it and the openers' claims.
func (op *OpenOp) decide(st GroupState, now int64) error {
	in := model.OpenInput{Packet: model.Packet{ID: op.Ref.ID}, Reqs: op.Reqs, NowMS: now, Rand: op.seed.Rand()}
	p, found := st.Packet(op.Ref.ID)
	complete := true
	if found {
		in.Packet, in.Found = p, true
		in.Earlier, complete = st.Claims(op.Ref.ID, op.Reqs)
	}
	out := model.Open(in)
	if found && !complete && refusedAny(out.Results) {
		// A user's earlier claim would have replaced the refusal.
		return errClaimsNeeded
	}
	op.Results, op.Packet = out.Results, out.Packet
	if found && len(out.Fresh) > 0 {
		st.Opened(op.Ref, out)
		if op.CreditHere != nil {
			for _, c := range out.Credits {
				if op.CreditHere(c.Shard) {
					op.here = append(op.here, c)
				}
			}
		}
	}
	return nil
}

// Stored answers an issue whose reward is stored now: pending, never
// claimed or booked.
func (op *IssueOp) Stored() {
	op.Issued = op.Reward
	op.Issued.Status, op.Issued.ClaimedMS, op.Issued.BookedMS = model.RewardPending, 0, 0
}

// Replay answers an issue whose order number was stored before, as prior:
// model.ReplayReward decides (a repeat, or ErrOrderConflict).
func (op *IssueOp) Replay(prior model.Reward) {
	if op.Err = model.ReplayReward(prior, op.Reward); op.Err == nil {
		op.Issued, op.Repeat = prior, true
	}
}

// Stored answers an accept whose request is stored now, as
// model.AcceptedForm makes it.
func (op *AcceptOp) Stored() { op.Accepted = model.AcceptedForm(op.Coupon) }

// Replay answers an accept whose serial was stored before, as prior:
// model.ReplayCouponRequest decides (a repeat, or ErrOrderConflict).
func (op *AcceptOp) Replay(prior model.CouponRequest) {
	if op.Err = model.ReplayCouponRequest(prior, op.Coupon); op.Err == nil {
		op.Accepted, op.Repeat = prior, true
	}
}
