package storage

import (
	"context"

	"redcell/model"
)

// The reward, wallet and withdrawal ops and queries (op.go).
//
// Rewards are issued rewards and their booking (model.Reward). A reward's
// row lives in the database of its actID's shard (db_XX.t_reward, one table
// per database), keyed by its order number.

// TakeRewardsOp moves up to Limit rewards of database DB that are pending,
// or processing and taken at or before StaleMS (Unix ms), to processing
// (ClaimedMS now) and answers them in Taken, oldest first. A reward taken
// twice is harmless: BookRewards books each at most once.
type TakeRewardsOp struct {
	DB      int
	StaleMS int64
	Limit   int

	Taken []model.Reward
}

// AccountQuery reads ActID's wallet in shard Shard into Account: balance 0
// for an account never touched (not an error).
type AccountQuery struct {
	Shard model.ShardID
	ActID string

	Account model.Account
}

// RewardQuery reads one reward of shard Shard by order number into Reward.
// Errors: ErrNotFound.
type RewardQuery struct {
	Shard   model.ShardID
	OrderNo string

	Reward model.Reward
}

// RewardsOfQuery lists ActID's rewards of shard Shard in Rewards, newest
// first ((CreatedMS, OrderNo) descending), strictly after cursor After, up
// to Limit; Stage "" for every stage, else that stage's only.
type RewardsOfQuery struct {
	Shard model.ShardID
	ActID string
	Stage string
	After model.FlowCursor
	Limit int

	Rewards []model.Reward
}

// RewardSumsQuery sums ActID's rewards of shard Shard by stage into Sums,
// sorted by stage name; a stage without a reward is absent. Booked, Pending
// and Income are cents of cash rewards; PendingCount counts every award
// type.
type RewardSumsQuery struct {
	Shard model.ShardID
	ActID string

	Sums []model.StageSums
}

// PendingRewardsOfQuery lists ActID's rewards of shard Shard that are not
// booked (pending or processing) in Rewards, oldest first, up to Limit: a
// withdrawal books them first.
type PendingRewardsOfQuery struct {
	Shard model.ShardID
	ActID string
	Limit int

	Rewards []model.Reward
}

// LeaseSpentQuery sums into Spent (cents) the Amount of the rewards issued
// from LeaseID in the databases DBs.
type LeaseSpentQuery struct {
	DBs     []int
	LeaseID string

	Spent int64
}

// WithdrawalQuery reads the withdrawal ActID made under OrderNo in shard
// Shard into Withdrawal, answered as a repeat (Repeat set); Found is false
// when there is none, or when the order number was used by another kind of
// change.
type WithdrawalQuery struct {
	Shard   model.ShardID
	ActID   string
	OrderNo string

	Withdrawal model.Withdrawal
	Found      bool
}

// FlowsOfQuery lists ActID's flow rows of shard Shard other than FlowReward
// (rewards are listed by RewardsOfQuery) in Flows, newest first
// ((CreatedMS, model.FlowItemID(Seq)) descending), strictly after cursor
// After, up to Limit, with Seq set.
type FlowsOfQuery struct {
	Shard model.ShardID
	ActID string
	After model.FlowCursor
	Limit int

	Flows []model.Flow
}

// RewardReconQuery reconciles database DB's rewards booked into wallets in
// [FromMS, ToMS) (by booked time, Unix ms) against their flows, listing up
// to 20 booked rewards without their flow, and counts the rewards not booked
// that were issued before StaleMS, into Recon. With CountFlows it also
// counts the reward flows created in the window (a scan of the flow tables:
// a flow without its reward shows as counts that differ).
type RewardReconQuery struct {
	DB         int
	FromMS     int64
	ToMS       int64
	StaleMS    int64
	CountFlows bool

	Recon model.RewardRecon
}

// RewardsDueQuery tells in Due whether database DB holds a reward a
// booker's RewardTake of StaleMS would book: one pending, or processing and
// taken at or before StaleMS (Unix ms). One read without a lock, no
// transaction; a database without a reward table holds none. The booker's
// scan of every database asks this first, so that a database with nothing
// to book costs one statement and no commit-lane group.
type RewardsDueQuery struct {
	DB      int
	StaleMS int64

	Due bool
}

func (*TakeRewardsOp) isOp()            {}
func (*RewardsDueQuery) isQuery()       {}
func (*AccountQuery) isQuery()          {}
func (*RewardQuery) isQuery()           {}
func (*RewardsOfQuery) isQuery()        {}
func (*RewardSumsQuery) isQuery()       {}
func (*PendingRewardsOfQuery) isQuery() {}
func (*LeaseSpentQuery) isQuery()       {}
func (*WithdrawalQuery) isQuery()       {}
func (*FlowsOfQuery) isQuery()          {}
func (*RewardReconQuery) isQuery()      {}

// rewardOps runs the reward, wallet and withdrawal ops of CommitGroup.
func (m *MySQL) rewardOps(ctx context.Context, op Op) (bool, error) {
	switch o := op.(type) {
	case *TakeRewardsOp:
		var err error
		o.Taken, err = m.takeRewards(ctx, o.DB, o.StaleMS, o.Limit)
		return true, err
	}
	return false, nil
}

// rewardReads answers the reward, wallet and withdrawal queries of Read.
func (m *MySQL) rewardReads(ctx context.Context, q Query) (bool, error) {
	var err error
	switch x := q.(type) {
	case *AccountQuery:
		x.Account, err = m.account(ctx, x.Shard, x.ActID)
	case *RewardQuery:
		x.Reward, err = m.reward(ctx, x.Shard, x.OrderNo)
	case *RewardsOfQuery:
		x.Rewards, err = m.rewardsOf(ctx, x.Shard, x.ActID, x.Stage, x.After, x.Limit)
	case *RewardSumsQuery:
		x.Sums, err = m.rewardSums(ctx, x.Shard, x.ActID)
	case *PendingRewardsOfQuery:
		x.Rewards, err = m.pendingRewardsOf(ctx, x.Shard, x.ActID, x.Limit)
	case *LeaseSpentQuery:
		x.Spent, err = m.leaseSpent(ctx, x.DBs, x.LeaseID)
	case *WithdrawalQuery:
		x.Withdrawal, x.Found, err = m.withdrawalOf(ctx, x.Shard, x.ActID, x.OrderNo)
	case *FlowsOfQuery:
		x.Flows, err = m.flowsOf(ctx, x.Shard, x.ActID, x.After, x.Limit)
	case *RewardReconQuery:
		x.Recon, err = m.rewardRecon(ctx, x.DB, x.FromMS, x.ToMS, x.StaleMS, x.CountFlows)
	case *RewardsDueQuery:
		x.Due, err = m.rewardsDue(ctx, x.DB, x.StaleMS)
	default:
		return false, nil
	}
	return true, err
}

// TakeRewards runs TakeRewardsOp on g and answers the rewards taken.
func TakeRewards(ctx context.Context, g Grouper, db int, staleMS int64, limit int) ([]model.Reward, error) {
	op := &TakeRewardsOp{DB: db, StaleMS: staleMS, Limit: limit}
	if err := g.CommitGroup(ctx, []Op{op}); err != nil {
		return nil, err
	}
	return op.Taken, nil
}

// Account reads actID's wallet in shard s (AccountQuery).
func Account(ctx context.Context, r Reader, s model.ShardID, actID string) (model.Account, error) {
	q := &AccountQuery{Shard: s, ActID: actID}
	if err := r.Read(ctx, q); err != nil {
		return model.Account{}, err
	}
	return q.Account, nil
}

// Reward reads one reward of shard s by order number (RewardQuery).
// Errors: ErrNotFound.
func Reward(ctx context.Context, r Reader, s model.ShardID, orderNo string) (model.Reward, error) {
	q := &RewardQuery{Shard: s, OrderNo: orderNo}
	if err := r.Read(ctx, q); err != nil {
		return model.Reward{}, err
	}
	return q.Reward, nil
}

// RewardsOf lists actID's rewards of shard s, newest first, strictly after
// the cursor, up to limit, of one stage or of every stage ("")
// (RewardsOfQuery).
func RewardsOf(ctx context.Context, r Reader, s model.ShardID, actID, stage string, after model.FlowCursor, limit int) ([]model.Reward, error) {
	q := &RewardsOfQuery{Shard: s, ActID: actID, Stage: stage, After: after, Limit: limit}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Rewards, nil
}

// RewardSums sums actID's rewards of shard s by stage (RewardSumsQuery).
func RewardSums(ctx context.Context, r Reader, s model.ShardID, actID string) ([]model.StageSums, error) {
	q := &RewardSumsQuery{Shard: s, ActID: actID}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Sums, nil
}

// PendingRewardsOf lists actID's rewards of shard s that are not booked,
// oldest first, up to limit (PendingRewardsOfQuery).
func PendingRewardsOf(ctx context.Context, r Reader, s model.ShardID, actID string, limit int) ([]model.Reward, error) {
	q := &PendingRewardsOfQuery{Shard: s, ActID: actID, Limit: limit}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Rewards, nil
}

// LeaseSpent sums the Amount (cents) of the rewards issued from leaseID in
// databases dbs (LeaseSpentQuery).
func LeaseSpent(ctx context.Context, r Reader, dbs []int, leaseID string) (int64, error) {
	q := &LeaseSpentQuery{DBs: dbs, LeaseID: leaseID}
	if err := r.Read(ctx, q); err != nil {
		return 0, err
	}
	return q.Spent, nil
}

// WithdrawalOf reads the withdrawal actID made under orderNo in shard s;
// found is false when there is none (WithdrawalQuery).
func WithdrawalOf(ctx context.Context, r Reader, s model.ShardID, actID, orderNo string) (w model.Withdrawal, found bool, err error) {
	q := &WithdrawalQuery{Shard: s, ActID: actID, OrderNo: orderNo}
	if err := r.Read(ctx, q); err != nil {
		return model.Withdrawal{}, false, err
	}
	return q.Withdrawal, q.Found, nil
}

// FlowsOf lists actID's flow rows of shard s other than FlowReward, newest
// first, strictly after the cursor, up to limit (FlowsOfQuery).
func FlowsOf(ctx context.Context, r Reader, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Flow, error) {
	q := &FlowsOfQuery{Shard: s, ActID: actID, After: after, Limit: limit}
	if err := r.Read(ctx, q); err != nil {
		return nil, err
	}
	return q.Flows, nil
}

// RewardRecon reconciles database db's rewards booked in [fromMS, toMS)
// against their flows (RewardReconQuery).
func RewardRecon(ctx context.Context, r Reader, db int, fromMS, toMS, staleMS int64, countFlows bool) (model.RewardRecon, error) {
	q := &RewardReconQuery{DB: db, FromMS: fromMS, ToMS: toMS, StaleMS: staleMS, CountFlows: countFlows}
	if err := r.Read(ctx, q); err != nil {
		return model.RewardRecon{}, err
	}
	return q.Recon, nil
}
