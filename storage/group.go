package storage

import "context"

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
// answers that op (its Outcome, or per request in OpenOp.Results) and never fails
// the others. Only a failure of the transaction itself fails the group.

// GroupKind names what a MoneyOp does.
type GroupKind uint8

// The kinds of money op a group carries (MoneyOp.Kind).
const (
	OpOpen     GroupKind = iota + 1 // *OpenOp
	OpSend                          // *SendOp
	OpDeposit                       // *DepositOp
	OpCredits                       // *CreditsOp
	OpRewards                       // *BookOp
	OpIssue                         // *IssueOp
	OpAccept                        // *AcceptOp
	OpRefund                        // *RefundOp
	OpWithdraw                      // *WithdrawOp
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
	// errors are per op (MoneyOp.Failed: ErrInsufficientBalance,
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
