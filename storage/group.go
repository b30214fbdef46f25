package storage

import (
	"context"
	"math/rand/v2"

	"redcell/model"
)

// Group commit: work for different keys gathered into one transaction.
//
// A cell's group committer (cell.committer) collects opens of many packets,
// sends, deposits and credit batches that live in the databases of one
// commit lane and hands them to CommitGroup as a list of ops in arrival order.
// The store locks what the ops touch, decides each op in memory with the pure
// money functions (model.Open, model.Send, model.ApplyDeposit,
// model.ApplyCredit) in list order — so two ops on one key (a wallet, a
// packet) see each other's effects in the order they arrived — and writes the
// outcome of all of them with a few multi-row statements and one COMMIT: one
// fsync for the whole group. Credit batches are the exception: they are
// booked after every other op of the group, whatever their place in the list
// (a credit adds to a balance without reading it, and never waits for a
// wallet row; a deposit or send in the same group does not see it), and so
// are reward bookings, after the credits. No op
// may open a packet that a send of the same group creates (a client learns
// a packet's ID only from its send's answer).
//
// One op's own failure (sold out, insufficient balance, an order number
// reused with another request) is decided before anything is written: it
// answers that op (GroupOp.Err, or per request in Results) and never fails
// the others. Only a failure of the transaction itself fails the group.

// GroupKind names what a GroupOp does.
type GroupKind uint8

// The kinds of op a group carries.
const (
	OpOpen     GroupKind = iota + 1 // open a packet once per request: OpenBatch
	OpSend                          // debit the sender and create a packet: Send
	OpDeposit                       // credit a wallet under the caller's order number: Deposit
	OpCredits                       // book claims into claimants' wallets: ApplyCredits
	OpRewards                       // book issued rewards: BookRewards
	OpIssue                         // store one issued reward: IssueReward
	OpAccept                        // store one coupon request, accepted: AcceptCoupon
	OpRefund                        // give an expired packet's exact remainder back to its sender: Refund
	OpWithdraw                      // debit a wallet under the caller's order number: Withdraw
)

func (k GroupKind) String() string {
	switch k {
	case OpOpen:
		return "open"
	case OpSend:
		return "send"
	case OpDeposit:
		return "deposit"
	case OpCredits:
		return "credits"
	case OpRewards:
		return "rewards"
	case OpIssue:
		return "issue"
	case OpAccept:
		return "accept"
	case OpRefund:
		return "refund"
	case OpWithdraw:
		return "withdraw"
	}
	return "unknown"
}

// GroupOp is one request in a group: its inputs, set by the caller, and its
// answers, set by CommitGroup. The inputs and answers of each kind mean what
// the single-op function of the same kind says (single.go); the answers are
// valid only when CommitGroup returns nil.
type GroupOp struct {
	Kind GroupKind

	// OpOpen: the packet, the opens in FIFO order, and the random source
	// the op takes its draw seed from (two draws, model.TakeDrawSeed; not
	// shared with other goroutines). OpRefund: the packet (Ref) alone.
	Ref  model.PacketRef
	Reqs []model.OpenRequest
	Rand *rand.Rand

	// OpSend: the sender's shard, the validated request, the new packet's
	// ID (model.NewPacketID for Shard) and its expiry (Unix ms).
	// OpDeposit, OpWithdraw: Shard too, and the wallet, order number and
	// amount (cents, > 0).
	Shard     model.ShardID
	Send      model.SendRequest
	PacketID  model.PacketID
	ExpiresMS int64
	ActID     string
	OrderNo   string
	Amount    model.Cents

	// OpCredits: the credits, in any order.
	Credits []model.Credit
	// OpRewards: the rewards to book (by Shard and OrderNo), in any order;
	// or, with Take set instead, the rewards of one database a booker books
	// next (RewardTake), answered in Rewards as booked.
	Rewards []model.Reward
	Take    *RewardTake
	// OpIssue: the reward to store, as IssueReward takes it (CreatedMS: the
	// group's time when 0).
	Reward model.Reward
	// OpAccept: the coupon request to store, as AcceptCoupon takes it
	// (Shard set; AcceptedMS the group's time when 0).
	Coupon model.CouponRequest

	// Answers.
	Results    []model.OpenResult  // OpOpen: one per request
	Packet     model.Packet        // OpOpen, OpRefund: the packet as this op left it (zero if not found); OpSend: the packet
	Repeat     bool                // OpSend: the order was applied before; Packet is the first packet as it is now; OpIssue: the reward was stored before; OpAccept: the serial was stored before
	Issued     model.Reward        // OpIssue: the reward as stored (the first one when Repeat)
	Accepted   model.CouponRequest // OpAccept: the request as stored (the first one, as it is now, when Repeat)
	Deposit    model.Deposit       // OpDeposit
	Withdrawal model.Withdrawal    // OpWithdraw (Repeat set for an order applied before)
	Applied    int                 // OpCredits: this op's credits booked now; OpRewards: its rewards booked now
	Deferred   []string            // OpCredits: claim IDs left for a later call (a wallet row was held); OpRewards with Take: order numbers found but left pending (their wallet tables made after the group), for the next pass
	Refunded   model.Cents         // OpRefund: the cents refunded now (0: nothing was due; not expired, sold out, refunded before)
	Err        error               // this op's own error: nothing of it was written

	tablesFirst []model.ShardID // MySQL: shards whose tables a Take's rewards left in Deferred need (made after the group)
}

// RewardTake names the rewards a booker books next in database DB: the
// oldest pending ones, and those left processing at StaleMS (Unix ms) or
// earlier (taken by TakeRewardsOp and never booked: a booker that stopped),
// issued at IssuedByMS (Unix ms) or earlier, at most Limit, skipping rows
// another transaction holds. They are found, locked and booked in the
// group's own transaction: no take of their own. IssuedByMS is when the
// booker began the batch: a batch still queued when booking was switched
// off never books a reward issued after it.
type RewardTake struct {
	DB         int
	StaleMS    int64
	IssuedByMS int64
	Limit      int
}

// Grouper commits groups of ops. Implemented by MySQL and memstore.Store;
// the contract suite (storagetest) holds both to it.
type Grouper interface {
	// CommitGroup runs ops in one transaction, deciding each in list order
	// with the effects of the ones before it, and sets their answers. Op
	// errors are per op (GroupOp.Err: ErrInsufficientBalance,
	// ErrOrderConflict, ErrInvalidArgument) or per open request
	// (OpenResult.Err: ErrNotFound, ErrSoldOut, ErrExpired); an op with an
	// error wrote nothing. An error returned for the group means nothing
	// of any op was written — or, wrapping ErrCommitUnknown, that the COMMIT
	// got no answer and a re-read could not settle it (a retry of each op
	// with its order numbers and users settles it, never applying twice).
	// An empty list is a no-op. A typed op (op.go) is the whole of its
	// group: CommitGroup runs it alone and answers its errors; beside other
	// ops it is ErrInvalidArgument.
	CommitGroup(ctx context.Context, ops []Op) error
}

// WalletMove is an OpDeposit's or an OpWithdraw's decision, as both stores
// take it in a group: the kind and request hash its order number is
// replayed against (model.ReplayOrder), the pure decision on the wallet's
// balance (model.ApplyDeposit, model.ApplyWithdraw: the flow, whose
// BalanceAfter is the balance after, or the refusal), and the op's answer
// for a balance after it, fresh or a repeat.
type WalletMove struct {
	Kind   model.FlowKind
	Hash   string
	Apply  func(balance model.Cents, nowMS int64) (model.Flow, error)
	Answer func(balance model.Cents, repeat bool)
}

// WalletMoveOf returns op's WalletMove; op is an OpDeposit or an OpWithdraw.
func WalletMoveOf(op *GroupOp) WalletMove {
	if op.Kind == OpWithdraw {
		return WalletMove{Kind: model.FlowWithdraw, Hash: model.WithdrawHash(op.Amount),
			Apply: func(balance model.Cents, nowMS int64) (model.Flow, error) {
				out, err := model.ApplyWithdraw(model.WithdrawInput{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: balance, NowMS: nowMS})
				return out.Flow, err
			},
			Answer: func(balance model.Cents, repeat bool) {
				op.Withdrawal = model.Withdrawal{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: balance, Repeat: repeat}
			}}
	}
	return WalletMove{Kind: model.FlowDeposit, Hash: model.DepositHash(op.Amount),
		Apply: func(balance model.Cents, nowMS int64) (model.Flow, error) {
			out, err := model.ApplyDeposit(model.DepositInput{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: balance, NowMS: nowMS})
			return out.Flow, err
		},
		Answer: func(balance model.Cents, repeat bool) {
			op.Deposit = model.Deposit{ActID: op.ActID, OrderNo: op.OrderNo, Amount: op.Amount, Balance: balance, Repeat: repeat}
		}}
}
