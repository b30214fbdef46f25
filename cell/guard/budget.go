package guard

import (
	"context"

	"redcell/model"
)

// The budget calls (storage.Budgets), each behind the breaker like the rest
// of Store.

// SetBudget implements storage.Store.
func (s *Store) SetBudget(ctx context.Context, sh model.ShardID, key string, total int64) (b model.Budget, err error) {
	err = s.call(func() (err error) { b, err = s.inner.SetBudget(ctx, sh, key, total); return err })
	return b, err
}

// GrantLease implements storage.Store.
func (s *Store) GrantLease(ctx context.Context, sh model.ShardID, key, holder string, want, reserve, expiresMS int64) (l model.Lease, err error) {
	err = s.call(func() (err error) {
		l, err = s.inner.GrantLease(ctx, sh, key, holder, want, reserve, expiresMS)
		return err
	})
	return l, err
}

// ReturnLease implements storage.Store.
func (s *Store) ReturnLease(ctx context.Context, sh model.ShardID, leaseID string, unspent int64) (l model.Lease, err error) {
	err = s.call(func() (err error) { l, err = s.inner.ReturnLease(ctx, sh, leaseID, unspent); return err })
	return l, err
}

// ExpireLeases implements storage.Store.
func (s *Store) ExpireLeases(ctx context.Context, sh model.ShardID, key string, nowMS int64) (n int, err error) {
	err = s.call(func() (err error) { n, err = s.inner.ExpireLeases(ctx, sh, key, nowMS); return err })
	return n, err
}

// Budget implements storage.Store.
func (s *Store) Budget(ctx context.Context, sh model.ShardID, key string) (b model.Budget, ls []model.Lease, err error) {
	err = s.call(func() (err error) { b, ls, err = s.inner.Budget(ctx, sh, key); return err })
	return b, ls, err
}

// BudgetLevel implements storage.Store.
func (s *Store) BudgetLevel(ctx context.Context, sh model.ShardID, key string) (b model.Budget, held int64, err error) {
	err = s.call(func() (err error) { b, held, err = s.inner.BudgetLevel(ctx, sh, key); return err })
	return b, held, err
}

// LeasesOf implements storage.Store.
func (s *Store) LeasesOf(ctx context.Context, sh model.ShardID, holder string) (ls []model.Lease, err error) {
	err = s.call(func() (err error) { ls, err = s.inner.LeasesOf(ctx, sh, holder); return err })
	return ls, err
}
