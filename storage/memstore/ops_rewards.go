package memstore

import (
	"context"

	"redcell/storage"
)

// The reward, wallet and withdrawal ops and queries (storage/op.go).

// rewardOps runs the reward, wallet and withdrawal ops of CommitGroup.
func (s *Store) rewardOps(ctx context.Context, op storage.Op) (bool, error) {
	switch o := op.(type) {
	case *storage.TakeRewardsOp:
		var err error
		o.Taken, err = s.takeRewards(ctx, o.DB, o.StaleMS, o.Limit)
		return true, err
	}
	return false, nil
}

// rewardReads answers the reward, wallet and withdrawal queries of Read.
func (s *Store) rewardReads(ctx context.Context, q storage.Query) (bool, error) {
	var err error
	switch x := q.(type) {
	case *storage.AccountQuery:
		x.Account, err = s.account(ctx, x.Shard, x.ActID)
	case *storage.RewardQuery:
		x.Reward, err = s.reward(ctx, x.Shard, x.OrderNo)
	case *storage.RewardsOfQuery:
		x.Rewards, err = s.rewardsOf(ctx, x.Shard, x.ActID, x.Stage, x.After, x.Limit)
	case *storage.RewardSumsQuery:
		x.Sums, err = s.rewardSums(ctx, x.Shard, x.ActID)
	case *storage.PendingRewardsOfQuery:
		x.Rewards, err = s.pendingRewardsOf(ctx, x.Shard, x.ActID, x.Limit)
	case *storage.LeaseSpentQuery:
		x.Spent, err = s.leaseSpent(ctx, x.DBs, x.LeaseID)
	case *storage.WithdrawalQuery:
		x.Withdrawal, x.Found, err = s.withdrawalOf(ctx, x.Shard, x.ActID, x.OrderNo)
	case *storage.FlowsOfQuery:
		x.Flows, err = s.flowsOf(ctx, x.Shard, x.ActID, x.After, x.Limit)
	case *storage.RewardReconQuery:
		x.Recon, err = s.rewardRecon(ctx, x.DB, x.FromMS, x.ToMS, x.StaleMS, x.CountFlows)
	case *storage.RewardsDueQuery:
		x.Due, err = s.rewardsDue(ctx, x.DB, x.StaleMS)
	default:
		return false, nil
	}
	return true, err
}
