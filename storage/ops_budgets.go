package storage

import "context"

// The budget and identity ops and queries (op.go).

// budgetOps runs the budget and identity ops of CommitGroup.
func (m *MySQL) budgetOps(ctx context.Context, op Op) (bool, error) { return false, nil }

// budgetReads answers the budget and identity queries of Read.
func (m *MySQL) budgetReads(ctx context.Context, q Query) (bool, error) { return false, nil }
