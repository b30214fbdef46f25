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

// Wallets is the part of the store that holds balances.
type Wallets interface {
	// Account reads actID's wallet in shard s: balance 0 for an account
	// never touched (not an error).
	Account(ctx context.Context, s model.ShardID, actID string) (model.Account, error)
}

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

// Identities is the part of the store that binds app accounts to actIDs.
type Identities interface {
	// BindIdentity stores want (model.NewBinding) in shard s, the home of
	// its app account (sharding.ShardOfIdentity), unless the account is bound
	// already: then model.Bind decides against the binding there. It answers
	// the binding that holds and repeat (bound before). legacy are the
	// hashes of want's phone in the forms of bindings stored before numbers
	// were parsed (model.LegacyPhoneHashes): a row holding one is the same
	// phone, answered as a repeat with its actID, and re-keyed to
	// want.PhoneHash (the only write of a repeat), so that every spelling
	// of the number finds it from then on. Concurrent first bindings of one
	// account store one; the others are decided against it. Errors:
	// model.ErrIdentityConflict.
	BindIdentity(ctx context.Context, s model.ShardID, want model.IdentityBinding, legacy ...string) (model.IdentityBinding, bool, error)
}

// Coupons is the person side of coupon issuance: the issue requests and the
// coupons, in the act_id's database. The stock is a Budgets row of the
// batch's home shard, and a merged deduction a lease of it (GrantLease with
// no reserve, as many units as requests): coupons carry their lease, so a
// lease whose holder died is settled by counting them (CouponLeaseSpent).
type Coupons interface {
	// CouponRequestOf reads the request of app and serial in shard s's
	// database. Errors: ErrNotFound.
	CouponRequestOf(ctx context.Context, s model.ShardID, app, serial string) (model.CouponRequest, error)
	// TakeCouponRequests moves up to limit requests of databases dbs that
	// are accepted, or deciding and taken at or before staleMS, to deciding
	// (TakenMS now) and answers them, oldest accepted first
	// (model.CompareCouponRequests), in one transaction. A request taken
	// twice is harmless: IssueCoupons and RefuseCoupons decide it once.
	// A staleMS below 0 takes accepted requests only.
	TakeCouponRequests(ctx context.Context, dbs []int, staleMS int64, limit int) ([]model.CouponRequest, error)
	// IssueCoupons decides requests of rule's batch (any databases of this
	// store) that share a deduction of granted units from lease leaseID, in
	// one transaction: it locks their persons, leaves out the requests
	// already final (decided before, by another taker), and decides the rest
	// in order with model.AssignCoupons against the persons' holdings: a
	// coupon row (model.CouponID, with leaseID) and state issued, or state
	// refused with the reason. It answers the decisions made, in order, and
	// unused: the granted units no request took, for the caller to return
	// to the lease. Errors: ErrCommitUnknown (each request is then final or
	// still deciding; the lease is settled by its coupon rows).
	IssueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) (decisions []model.CouponDecision, unused int64, err error)
	// RefuseCoupons sets the requests that are not final yet refused with
	// reason; final ones are left as they are.
	RefuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error
	// ReleaseCouponRequests sets the requests that are deciding back to
	// accepted (a draining cell's queued requests, for the next owner to
	// take at once); others are left as they are.
	ReleaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error
	// HoldingOf reads actID's holding (coupons per batch, the batch held in
	// each group) in shard s's database, without a lock: the activity
	// layer's early decision; IssueCoupons decides again under lock.
	HoldingOf(ctx context.Context, s model.ShardID, actID string) (model.CouponHolding, error)
	// HoldingsOf reads the holdings of the persons of reqs (their act_ids
	// and shards) at once, by act_id; a person without coupons has an
	// empty holding.
	HoldingsOf(ctx context.Context, reqs []model.CouponRequest) (map[string]model.CouponHolding, error)
	// CouponsOf lists actID's coupons in shard s's database, newest first
	// (issued_ms, then coupon_id, descending), up to limit, after the
	// cursor (the zero cursor: from the newest; else only coupons older
	// than cursor's issued_ms and coupon_id).
	CouponsOf(ctx context.Context, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Coupon, error)
	// CouponLeaseSpent counts the coupons issued from leaseID in the given
	// databases.
	CouponLeaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error)
}

// Rewards is the part of the store that holds issued rewards and books them
// (model.Reward). A reward's row lives in the database of its actID's shard
// (db_XX.t_reward, one table per database), keyed by its order number.
type Rewards interface {
	// Reward reads one reward of shard s by order number. Errors: ErrNotFound.
	Reward(ctx context.Context, s model.ShardID, orderNo string) (model.Reward, error)
	// RewardsOf lists actID's rewards of shard s, newest first ((CreatedMS,
	// OrderNo) descending), strictly after cursor, up to limit; stage "" for
	// every stage, else that stage's only.
	RewardsOf(ctx context.Context, s model.ShardID, actID, stage string, after model.FlowCursor, limit int) ([]model.Reward, error)
	// RewardSums sums actID's rewards of shard s by stage, sorted by stage
	// name; a stage without a reward is absent. Booked, Pending and Income
	// are cents of cash rewards; PendingCount counts every award type.
	RewardSums(ctx context.Context, s model.ShardID, actID string) ([]model.StageSums, error)
	// TakeRewards moves up to limit rewards of database db that are pending,
	// or processing and taken at or before staleMS, to processing (ClaimedMS
	// now) and answers them, oldest first. A reward taken twice is harmless:
	// BookRewards books each at most once.
	TakeRewards(ctx context.Context, db int, staleMS int64, limit int) ([]model.Reward, error)
	// PendingRewardsOf lists actID's rewards of shard s that are not booked
	// (pending or processing), oldest first, up to limit: a withdrawal books
	// them first.
	PendingRewardsOf(ctx context.Context, s model.ShardID, actID string, limit int) ([]model.Reward, error)
	// LeaseSpent sums the Amount of the rewards issued from leaseID in the
	// given databases.
	LeaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error)
	// WithdrawalOf reads the withdrawal actID made under orderNo, answered
	// as a repeat (Repeat set); found is false when there is none, or when
	// the order number was used by another kind of change.
	WithdrawalOf(ctx context.Context, s model.ShardID, actID, orderNo string) (w model.Withdrawal, found bool, err error)
	// FlowsOf lists actID's flow rows of shard s other than FlowReward
	// (rewards are listed from RewardsOf), newest first ((CreatedMS,
	// model.FlowItemID(Seq)) descending), strictly after cursor, up to
	// limit, with Seq set.
	FlowsOf(ctx context.Context, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Flow, error)
	// RewardRecon reconciles database db's rewards booked into wallets in
	// [fromMS, toMS) (by booked time) against their flows, listing up to 20
	// booked rewards without their flow, and counts the rewards not booked
	// that were issued before staleMS. With countFlows it also counts the
	// reward flows created in the window (a scan of the flow tables: a flow
	// without its reward shows as counts that differ).
	RewardRecon(ctx context.Context, db int, fromMS, toMS, staleMS int64, countFlows bool) (model.RewardRecon, error)
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
	Wallets
	Identities
	Rewards
	Schema
	Books
	Grouper
	Reader
	Budgets
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}
