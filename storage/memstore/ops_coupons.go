package memstore

import (
	"context"

	"redcell/storage"
)

// The coupon ops and queries (storage/op.go).

// couponOps runs the coupon ops of CommitGroup.
func (s *Store) couponOps(ctx context.Context, op storage.Op) (bool, error) { return false, nil }

// couponReads answers the coupon queries of Read.
func (s *Store) couponReads(ctx context.Context, q storage.Query) (bool, error) { return false, nil }
