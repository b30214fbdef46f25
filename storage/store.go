package storage

import (
	"context"
	"errors"

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

// Packets is the part of the store that holds red packets and their claims.
type Packets interface {
	// Packet reads one packet. Errors: ErrNotFound.
	Packet(ctx context.Context, ref model.PacketRef) (model.Packet, error)
	// Claims returns up to limit claims of the packet with seq > afterSeq,
	// in seq order; none (no error) for a packet that does not exist.
	Claims(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error)
	// ClaimsOf reads, without locks, the claims the requests' users hold on
	// the packet, by act_id; users without one are absent. Empty (no error)
	// for a packet that does not exist.
	ClaimsOf(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error)
}

// Expiry finds and refunds expired packets.
type Expiry interface {
	// ExpiredIn lists up to limit open packets with ExpiresMS <= nowMS in
	// the packet tables of the given shards and days of month, in no
	// promised order. Sold-out and refunded packets are never listed.
	ExpiredIn(ctx context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error)
}

// Relayed is what the relay reads and writes of a cell's claims. A claim is
// its own outbox row: each owes its claimant a credit, and nothing marks it
// delivered. The relay keeps, per database of the packets' shards, a
// position below which every claim is known credited (RelayPositions), and
// after a restart reads the claims past it again (ClaimsAfter); the
// receiving side refuses a second credit by claim ID.
type Relayed interface {
	// ClaimsAfter pages through the claims of database db (every claim
	// table of its shards, every day) created in [fromMS, beforeMS] and
	// after position after (the zero ClaimPos: no such bound), in
	// (created_ms, packet_id, seq) order, up to limit, each as the credit it
	// owes: the claimant's shard, CreatedMS and Dest as its row records
	// them. next is the last one's position (after when none). A database
	// never used reads empty; one out of 0..99 is ErrInvalidArgument.
	ClaimsAfter(ctx context.Context, db int, fromMS int64, after model.ClaimPos, beforeMS int64, limit int) (credits []model.Credit, next model.ClaimPos, err error)
	// SendTo records dest in the credits' claim rows (found by claim ID)
	// before the relay delivers them to another cell than the one the rows
	// name: had a delivery applied them there, the row still names where.
	// A claim not found is skipped. Errors: ErrInvalidArgument for a
	// malformed claim ID.
	SendTo(ctx context.Context, credits []model.Credit, dest string) error
	// RelayPositions returns the relay's saved positions of databases dbs
	// (Unix ms: every claim of the database created before it is credited),
	// read from each database itself, so that a position moves with its
	// database. A database without one is absent (MySQL: unless it holds an
	// earlier version's outbox table, whose oldest undelivered row gives it;
	// see MySQL.RelayPositions).
	RelayPositions(ctx context.Context, dbs []int) (map[int]int64, error)
	// SaveRelayPositions records positions (database -> Unix ms), in one
	// round trip. A position may move back (the relay found an older claim
	// uncredited). A database out of 0..99 is an error.
	SaveRelayPositions(ctx context.Context, pos map[int]int64) error
}

// Books is what reconciliation and the audits read.
type Books interface {
	// ReconWindow reads the claims created in [fromMS, toMS) in the claim
	// tables of shards (all of database db; a shard of another database is
	// an error) for the given days of month, each with its Dest, in one
	// statement. A window of more than limit claims is cut short at the
	// creation time of the claim past limit (never below fromMS+1) and
	// read again; the result's ToMS says where it ended. A database never
	// used reads empty. See MySQL.ReconWindow.
	ReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error)
	// CreditsOf returns the credit flows booked here for the given claims
	// (matched by the claimant's shard, act_id and claim ID), by claim ID,
	// with ClaimID, ActID and Amount as booked; a claim credited to two of
	// the accounts asked about comes back with the amounts summed. At most
	// 10,000 credits per call; more, or a shard out of range, is an error.
	// It creates nothing: a database or flow table that does not exist
	// holds no credit (a cell's kept copy of a database it handed over is
	// read as it is).
	CreditsOf(ctx context.Context, credits []model.Credit) (map[string]model.Credit, error)
	// ReconPositions returns where reconciliation has checked up to, by
	// database (0..99), as last saved: claims created before that Unix ms
	// were checked. Databases never saved are absent.
	ReconPositions(ctx context.Context) (map[int]int64, error)
	// SaveReconPositions records positions (database -> Unix ms) durably, in
	// one write. A position never moves back: a save below the stored one
	// keeps the stored one, so a repeated or late save changes nothing. A
	// database out of 0..99 is an error.
	SaveReconPositions(ctx context.Context, pos map[int]int64) error
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

// Store is everything a cell needs from its database.
type Store interface {
	Wallets
	Packets
	Identities
	Rewards
	Expiry
	Relayed
	Schema
	Books
	Grouper
	Reader
	Budgets
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}
