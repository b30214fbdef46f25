package memstore

import (
	"context"

	"redcell/storage"
)

// The budget and identity ops and queries (storage/op.go).

// budgetOps runs the budget and identity ops of CommitGroup.
func (s *Store) budgetOps(ctx context.Context, op storage.Op) (bool, error) {
	var err error
	switch o := op.(type) {
	case *storage.SetBudgetTotal:
		o.Budget, err = s.setBudget(ctx, o.Shard, o.Key, o.Total)
	case *storage.GrantBudgetLease:
		o.Lease, err = s.grantLease(ctx, o.Shard, o.Key, o.Holder, o.Want, o.Reserve, o.ExpiresMS)
	case *storage.ReturnBudgetLease:
		o.Lease, err = s.returnLease(ctx, o.Shard, o.LeaseID, o.Unspent)
	case *storage.ExpireBudgetLeases:
		o.Expired, err = s.expireLeases(ctx, o.Shard, o.Key, o.NowMS)
	case *storage.BindAccount:
		o.Binding, o.Repeat, err = s.bindIdentity(ctx, o.Shard, o.Want, o.Legacy...)
	default:
		return false, nil
	}
	return true, err
}

// budgetReads answers the budget and identity queries of Read.
func (s *Store) budgetReads(ctx context.Context, q storage.Query) (bool, error) {
	var err error
	switch o := q.(type) {
	case *storage.BudgetQuery:
		o.Budget, o.Leases, err = s.budget(ctx, o.Shard, o.Key)
	case *storage.BudgetLevelQuery:
		o.Budget, o.Held, err = s.budgetLevel(ctx, o.Shard, o.Key)
	case *storage.HolderLeasesQuery:
		o.Leases, err = s.leasesOf(ctx, o.Shard, o.Holder)
	default:
		return false, nil
	}
	return true, err
}
