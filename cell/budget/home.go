package budget

import (
	"context"
	"errors"
	"fmt"
	"time"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
)

// Rows is what a home cell keeps budgets in: the grant and return of a
// store's lease ops (storage.GrantLease and storage.ReturnLease, with a store
// as first argument, have these signatures without it; the integrator adapts
// them, as this package never imports storage).
type Rows interface {
	GrantLease(ctx context.Context, s model.ShardID, key, holder string, want, reserve, expiresMS int64) (model.Lease, error)
	ReturnLease(ctx context.Context, s model.ShardID, leaseID string, unspent int64) (model.Lease, error)
}

// LocalHome is the Home of the budgets whose home shard
// (sharding.BudgetShard) the calling cell owns: rows in its own store, with
// lease expiry ttl from clk's now (nil: the system clock). It does not check
// ownership: the integrator sends a key here only if the cell owns its shard.
func LocalHome(rows Rows, clk clock.Clock) Home { return localHome{rows: rows, clk: clock.Or(clk)} }

type localHome struct {
	rows Rows
	clk  clock.Clock
}

func (h localHome) Grant(ctx context.Context, key, holder string, want, reserve int64, ttl time.Duration) (model.Lease, error) {
	return h.rows.GrantLease(ctx, sharding.BudgetShard(key), key, holder, want, reserve, h.clk.Now().Add(ttl).UnixMilli())
}

func (h localHome) Return(ctx context.Context, key, leaseID string, unspent int64) error {
	_, err := h.rows.ReturnLease(ctx, sharding.BudgetShard(key), leaseID, unspent)
	return err
}

// Settle returns, after a crash, what the leases a restarted holder finds
// (storage.LeasesOf in each home database: open and expired ones)
// did not spend: for each, unspent = Amount − spent(lease ID), where spent
// sums the issues that name the lease (the integrator reads it from the
// reward rows, storage.LeaseSpentQuery). Returned leases in the list are
// skipped. It answers the sum of the unspent parts it returned; a repeated
// Settle of the same leases changes nothing at the homes (a return happens
// once) but answers that sum again. Errors, joined, one per lease it could
// not settle (the rest are settled): spent's or the home's error, or a lease
// whose issues sum above its amount — that lease is closed with nothing
// returned, and the error names the excess (the budget was passed by it).
func Settle(ctx context.Context, home func(key string) Home, leases []model.Lease, spent func(leaseID string) (int64, error)) (returned int64, err error) {
	var errs []error
	for _, l := range leases {
		if l.State == model.LeaseReturned {
			continue
		}
		if err := ctx.Err(); err != nil {
			return returned, errors.Join(append(errs, err)...)
		}
		used, err := spent(l.ID)
		if err != nil {
			errs = append(errs, fmt.Errorf("budget %s: lease %s: read its spending: %w", l.Key, l.ID, err))
			continue
		}
		unspent := l.Amount - used
		if used < 0 || unspent < 0 {
			errs = append(errs, fmt.Errorf("budget %s: lease %s of %d has %d issued from it", l.Key, l.ID, l.Amount, used))
			unspent = 0
		}
		if err := home(l.Key).Return(ctx, l.Key, l.ID, unspent); err != nil {
			errs = append(errs, fmt.Errorf("budget %s: lease %s: return %d: %w", l.Key, l.ID, unspent, err))
			continue
		}
		returned += unspent
	}
	return returned, errors.Join(errs...)
}
