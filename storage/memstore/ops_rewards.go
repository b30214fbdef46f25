package memstore

import (
	"context"

	"redcell/storage"
)

// The reward, wallet and withdrawal ops and queries (storage/op.go).

// rewardOps runs the reward, wallet and withdrawal ops of CommitGroup.
func (s *Store) rewardOps(ctx context.Context, op storage.Op) (bool, error) { return false, nil }

// rewardReads answers the reward, wallet and withdrawal queries of Read.
func (s *Store) rewardReads(ctx context.Context, q storage.Query) (bool, error) { return false, nil }
