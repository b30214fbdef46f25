package storage

import "context"

// The coupon ops and queries (op.go).

// couponOps runs the coupon ops of CommitGroup.
func (m *MySQL) couponOps(ctx context.Context, op Op) (bool, error) { return false, nil }

// couponReads answers the coupon queries of Read.
func (m *MySQL) couponReads(ctx context.Context, q Query) (bool, error) { return false, nil }
