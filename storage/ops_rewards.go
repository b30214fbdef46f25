package storage

import "context"

// The reward, wallet and withdrawal ops and queries (op.go).

// rewardOps runs the reward, wallet and withdrawal ops of CommitGroup.
func (m *MySQL) rewardOps(ctx context.Context, op Op) (bool, error) { return false, nil }

// rewardReads answers the reward, wallet and withdrawal queries of Read.
func (m *MySQL) rewardReads(ctx context.Context, q Query) (bool, error) { return false, nil }
