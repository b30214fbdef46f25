package guard

import (
	"context"

	"redcell/model"
)

// IssueReward implements storage.Store.
func (s *Store) IssueReward(ctx context.Context, r model.Reward) (out model.Reward, repeat bool, err error) {
	err = s.call(func() (err error) { out, repeat, err = s.inner.IssueReward(ctx, r); return err })
	return out, repeat, err
}

// Reward implements storage.Store.
func (s *Store) Reward(ctx context.Context, sh model.ShardID, orderNo string) (r model.Reward, err error) {
	err = s.call(func() (err error) { r, err = s.inner.Reward(ctx, sh, orderNo); return err })
	return r, err
}

// RewardsOf implements storage.Store.
func (s *Store) RewardsOf(ctx context.Context, sh model.ShardID, actID, stage string, after model.FlowCursor, limit int) (rs []model.Reward, err error) {
	err = s.call(func() (err error) { rs, err = s.inner.RewardsOf(ctx, sh, actID, stage, after, limit); return err })
	return rs, err
}

// RewardSums implements storage.Store.
func (s *Store) RewardSums(ctx context.Context, sh model.ShardID, actID string) (sums []model.StageSums, err error) {
	err = s.call(func() (err error) { sums, err = s.inner.RewardSums(ctx, sh, actID); return err })
	return sums, err
}

// TakeRewards implements storage.Store.
func (s *Store) TakeRewards(ctx context.Context, db int, staleMS int64, limit int) (rs []model.Reward, err error) {
	err = s.call(func() (err error) { rs, err = s.inner.TakeRewards(ctx, db, staleMS, limit); return err })
	return rs, err
}

// PendingRewardsOf implements storage.Store.
func (s *Store) PendingRewardsOf(ctx context.Context, sh model.ShardID, actID string, limit int) (rs []model.Reward, err error) {
	err = s.call(func() (err error) { rs, err = s.inner.PendingRewardsOf(ctx, sh, actID, limit); return err })
	return rs, err
}

// BookRewards implements storage.Store.
func (s *Store) BookRewards(ctx context.Context, rs []model.Reward) (booked int, err error) {
	err = s.call(func() (err error) { booked, err = s.inner.BookRewards(ctx, rs); return err })
	return booked, err
}

// LeaseSpent implements storage.Store.
func (s *Store) LeaseSpent(ctx context.Context, dbs []int, leaseID string) (n int64, err error) {
	err = s.call(func() (err error) { n, err = s.inner.LeaseSpent(ctx, dbs, leaseID); return err })
	return n, err
}

// Withdraw implements storage.Store.
func (s *Store) Withdraw(ctx context.Context, sh model.ShardID, actID, orderNo string, amount model.Cents) (w model.Withdrawal, err error) {
	err = s.call(func() (err error) { w, err = s.inner.Withdraw(ctx, sh, actID, orderNo, amount); return err })
	return w, err
}

// FlowsOf implements storage.Store.
func (s *Store) FlowsOf(ctx context.Context, sh model.ShardID, actID string, after model.FlowCursor, limit int) (fs []model.Flow, err error) {
	err = s.call(func() (err error) { fs, err = s.inner.FlowsOf(ctx, sh, actID, after, limit); return err })
	return fs, err
}

// RewardRecon implements storage.Store.
func (s *Store) RewardRecon(ctx context.Context, db int, fromMS, toMS, staleMS int64, countFlows bool) (r model.RewardRecon, err error) {
	err = s.call(func() (err error) {
		r, err = s.inner.RewardRecon(ctx, db, fromMS, toMS, staleMS, countFlows)
		return err
	})
	return r, err
}

// WithdrawalOf implements storage.Store.
func (s *Store) WithdrawalOf(ctx context.Context, sh model.ShardID, actID, orderNo string) (w model.Withdrawal, found bool, err error) {
	err = s.call(func() (err error) { w, found, err = s.inner.WithdrawalOf(ctx, sh, actID, orderNo); return err })
	return w, found, err
}
