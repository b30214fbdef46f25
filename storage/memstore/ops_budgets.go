package memstore

import (
	"context"

	"redcell/storage"
)

// The budget and identity ops and queries (storage/op.go).

// budgetOps runs the budget and identity ops of CommitGroup.
func (s *Store) budgetOps(ctx context.Context, op storage.Op) (bool, error) { return false, nil }

// budgetReads answers the budget and identity queries of Read.
func (s *Store) budgetReads(ctx context.Context, q storage.Query) (bool, error) { return false, nil }
