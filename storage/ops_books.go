package storage

import "context"

// The packet, expiry, relay and reconciliation ops and queries (op.go).

// bookOps runs the packet, expiry, relay and reconciliation ops of CommitGroup.
func (m *MySQL) bookOps(ctx context.Context, op Op) (bool, error) { return false, nil }

// bookReads answers the packet, expiry, relay and reconciliation queries of Read.
func (m *MySQL) bookReads(ctx context.Context, q Query) (bool, error) { return false, nil }
