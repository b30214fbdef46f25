package memstore

import (
	"context"

	"redcell/storage"
)

// The packet, expiry, relay and reconciliation ops and queries (storage/op.go).

// bookOps runs the packet, expiry, relay and reconciliation ops of CommitGroup.
func (s *Store) bookOps(ctx context.Context, op storage.Op) (bool, error) { return false, nil }

// bookReads answers the packet, expiry, relay and reconciliation queries of Read.
func (s *Store) bookReads(ctx context.Context, q storage.Query) (bool, error) { return false, nil }
