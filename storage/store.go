package storage

import (
	"context"
	"errors"
	"math/rand/v2"

	"redcell/model"
)

// The store contract. A cell's money lives behind these interfaces; two stores
// implement them: MySQL (MariaDB, what cells run on) and memstore.Store (in
// memory, for the simulation and fast unit tests). Both pass one contract
// suite, storage/storagetest, which states each promise below as a test.
//
// Common to every method: amounts are int64 cents (model.Cents), times are
// Unix milliseconds read from the store's clock, a shard is 0..999 and a
// database index 0..99 (shard/10). Errors with a code are model sentinels,
// matched with errors.Is; any other error is an infrastructure failure.
// Every call is safe for concurrent use.
//
// Every balance change is a flow row keyed by the UNIQUE pair (act_id, order
// number), written in the same transaction as the change, so nothing applies
// twice: caller order numbers for deposits and sends, "refund:"+packet ID for
// a refund, "claim:"+claim ID for a credit (model.RefundOrderNo,
// model.CreditOrderNo).

// ErrCommitUnknown: a call that writes money could not learn whether its
// COMMIT applied (the connection or server failed at COMMIT, or the answer
// was lost). The call answers it only after failing to settle the outcome;
// a retry with the same order number (packet, claim) settles it, never
// applying twice. Match with errors.Is.
var ErrCommitUnknown = errors.New("storage: commit outcome unknown")

// Books is what the audits read (reconciliation reads through Read:
// ReconWindowQuery, CreditsOfQuery, ReconPositionsQuery; ops_books.go).
type Books interface {
	// CellAudit checks this store's books as model.AuditCell checks its
	// Ledger, with the same result (for MariaDB within the bounds
	// MySQL.CellAudit gives), but with memory bounded whatever the number of
	// rows: sums and joins run where the rows are, and only problem rows come
	// back (counted whole, named by the few claim IDs a problem line shows).
	// Its Cell is cell; owns says which shards are the cell's.
	CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error)
	// Ledger reads every money row in one snapshot, as sums (deposits,
	// balances, sends, packet totals, remainders, refunds) and as rows
	// (claims, with their Dest, and credits, by claim ID), and lists row-level
	// problems (a balance that is not the sum of its flows, a packet whose
	// claims, refund and remainder do not add up, a claim credited twice).
	// Its Cell is cell. model.AuditCell and model.Audit check it.
	Ledger(ctx context.Context, cell string) (model.Ledger, error)
}

// Schema creates tables ahead of need. A store without tables (memstore)
// answers nil.
type Schema interface {
	// EnsureShard makes the shard's wallet and flow tables, and its
	// database's relay position table, exist.
	EnsureShard(ctx context.Context, s model.ShardID) error
	// EnsureDays makes the packet and claim tables of every shard for each of
	// days exist, with up to parallel workers, calling progress (if not nil,
	// never concurrently) after each shard with done counting up to total.
	EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error
}

// Singles are the single-operation writes: each method is one operation in
// a transaction of its own, the same operation a GroupOp of its kind is in a
// group (OpDeposit, OpCredits, OpSend, OpOpen, OpRefund, OpAccept, OpIssue,
// OpRewards, OpWithdraw). A cell never calls them: its writes go through
// Grouper.CommitGroup (the group committer; a naive open is a group of
// one). The contract suite holds both stores to them and checks every group
// op against them, and tools that seed data (the bench's limits probe) use
// them.
type Singles interface {
	// Deposit credits amount (> 0, checked by the caller) to actID's wallet
	// in shard s under the caller's order number and answers the balance
	// right after it. The same (actID, orderNo) again with the same amount
	// answers that first result with Repeat set and writes nothing; with
	// another amount, or an order number a send used, it is ErrOrderConflict.
	// Concurrent calls with one new order number apply it once.
	// Errors: ErrOrderConflict, ErrInvalidArgument (the balance would pass
	// the largest int64; nothing written), ErrCommitUnknown.
	Deposit(ctx context.Context, s model.ShardID, actID, orderNo string, amount model.Cents) (model.Deposit, error)
	// ApplyCredits books claims into the claimants' wallets (credit.Shard,
	// credit.ActID), each at most once under "claim:"+ClaimID, in one
	// transaction. applied counts the credits booked now; a credit booked
	// before (or listed twice) changes nothing. It never waits for a wallet
	// row another transaction holds: such credits are named, by claim ID, in
	// deferred, with nothing written for them, for a later call; the rest
	// had been booked before. Errors: ErrCommitUnknown.
	ApplyCredits(ctx context.Context, credits []model.Credit) (applied int, deferred []string, err error)
	// Send debits req.Sender (shard s) by req.Amount and creates packet id
	// (from model.NewPacketID for shard s; day from it), open with every
	// share left, created now and expiring at expiresMS, in one transaction.
	// req is validated by the caller (Limits.CheckShares). The same
	// (sender, order number) again with the same kind, amount, count and
	// greeting answers the first packet as it is now with repeat set, whatever
	// id and expiresMS the retry carries, and moves nothing; a different
	// request, or an order number a deposit used, is ErrOrderConflict.
	// Errors: ErrInsufficientBalance (nothing written; the order number stays
	// free), ErrOrderConflict, ErrCommitUnknown.
	Send(ctx context.Context, s model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (model.Packet, bool, error)
	// OpenBatch opens the packet once per request, in order, in one
	// transaction, by the rules of model.Open: a user gets at most one claim
	// per packet (an earlier claim comes back with Repeat set; a user listed
	// twice gets one claim, the later answer repeating it); a new claim takes
	// the next seq, its share drawn from the batch's seed, which it takes
	// from r (model.TakeDrawSeed; double-mean, or the fixed share), created now, its credit owed to the request's shard.
	// Per-request errors (in OpenResult.Err): ErrNotFound, ErrSoldOut (no
	// share left, whatever the time), ErrExpired (refunded, or now >=
	// ExpiresMS). It returns the packet as the batch left it (zero if not
	// found). An error for the whole batch means nothing was written:
	// ErrCommitUnknown (a retry finds the claims if they were), or a failure.
	// r must not be shared with other goroutines.
	OpenBatch(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest, r *rand.Rand) ([]model.OpenResult, model.Packet, error)
	// Refund gives an open packet expired at the store's clock (now >=
	// ExpiresMS) its exact remainder back to the sender, once ("refund:"+ID):
	// the packet becomes refunded (RefundAmount = the remainder,
	// RemainingAmount 0, RemainingCount unchanged). It answers the cents
	// refunded: 0 when nothing was due (not expired, sold out, refunded
	// before). Errors: ErrNotFound, ErrCommitUnknown.
	Refund(ctx context.Context, ref model.PacketRef) (model.Cents, error)
	// AcceptCoupon stores r as accepted (AcceptedMS now when 0), or
	// refused SOLD_OUT and decided at once when r is
	// model.RefusedAtAccept (model.AcceptedForm), unless its app and
	// serial are stored: then model.ReplayCouponRequest decides
	// against the stored request, which is answered with repeat set.
	// Errors: ErrInvalidArgument (model.ValidateCouponRequest),
	// ErrOrderConflict, ErrCommitUnknown.
	AcceptCoupon(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error)
	// IssueReward stores r as pending (r.Shard, r.OrderNo, and every field
	// set by the caller; CreatedMS now when 0) unless its order number is
	// stored: then model.ReplayReward decides against the stored one, which
	// is answered with repeat set and nothing written. Concurrent issues of
	// one order number store one. Errors: ErrOrderConflict, ErrCommitUnknown.
	IssueReward(ctx context.Context, r model.Reward) (model.Reward, bool, error)
	// BookRewards books each reward (found by Shard and OrderNo) that is not
	// booked yet, in one transaction: official-stage cash
	// (Reward.IntoWallet) is credited to the wallet with a FlowReward flow
	// under model.RewardFlowOrderNo, and every one becomes booked (BookedMS
	// now). booked counts the rewards booked by this call; one booked before,
	// listed twice or not found changes nothing. Errors: ErrCommitUnknown (a
	// retry settles it).
	BookRewards(ctx context.Context, rs []model.Reward) (booked int, err error)
	// Withdraw debits amount (> 0) from actID's wallet in shard s under the
	// caller's order number, with a FlowWithdraw flow, and answers the
	// balance right after. The same order number again with the same amount
	// answers the first result with Repeat set; with another amount, or an
	// order number of a deposit or send, it is ErrOrderConflict. Errors:
	// ErrInsufficientBalance (nothing written), ErrOrderConflict,
	// ErrCommitUnknown.
	Withdraw(ctx context.Context, s model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error)
}

// Full is a Store with its Singles: what the contract suite, the simulation
// and the seeding tools are given. Both stores implement it.
type Full interface {
	Store
	Singles
}

// Store is everything a cell needs from its database.
type Store interface {
	Schema
	Books
	Grouper
	Reader
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}
