package couponq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"redcell/cell/couponbatch"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// StockKey is the budget key of a batch's stock: "coupon/<batch>". Reward
// budgets are "parent/child/scene", three parts; this is two, so the two
// never share a row.
func StockKey(batch string) string { return model.CouponStockPrefix + batch }

// BudgetStock is Stock over budget rows a store holds: each batch's stock is
// the budget row StockKey(batch) in its home shard
// (sharding.BudgetShard), and a deduction is a lease of it with no reserve,
// always returned after the issue with the units it did not spend. A lease
// whose issue lost its answer stays open until its TTL; whoever settles it
// must count its coupons (storage.CouponLeaseSpentQuery), never reward
// rows: so Holder must differ from the name under which the cell holds
// reward leases (e.g. "cell-1/coupons").
type BudgetStock struct {
	Budgets  BudgetRows
	Holder   string
	LeaseTTL time.Duration // default HeldMaxAge + 2*StepTimeout (70 s)
	Clock    clock.Clock
}

// BudgetRows is the store BudgetStock keeps the stock rows in: its writes
// are budget ops of CommitGroup (storage.SetBudgetTotal,
// storage.GrantBudgetLease, storage.ReturnBudgetLease), its reads
// storage.BudgetLevelQuery.
type BudgetRows interface {
	storage.Grouper
	storage.Reader
}

func (s *BudgetStock) home(batch string) (model.ShardID, string) {
	k := StockKey(batch)
	return sharding.BudgetShard(k), k
}

// Sync sets every batch's stock row to the catalog's stock
// (storage.SetBudgetTotal: a stock below what is out is refused there).
func (s *BudgetStock) Sync(ctx context.Context, c *couponbatch.Catalog) error {
	var errs []error
	for _, b := range c.Batches() {
		sh, k := s.home(b.ID)
		if _, err := storage.SetBudget(ctx, s.Budgets, sh, k, b.Stock); err != nil {
			errs = append(errs, fmt.Errorf("batch %s: %w", b.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Grant implements Stock: a lease of up to want units; none left is 0.
func (s *BudgetStock) Grant(ctx context.Context, batch string, want int64) (string, int64, error) {
	if strings.Contains(s.Holder, " ") || s.Holder == "" {
		return "", 0, errors.New("couponq: BudgetStock needs a holder")
	}
	ttl := s.LeaseTTL
	if ttl <= 0 {
		ttl = HeldMaxAge + 2*StepTimeout
	}
	sh, k := s.home(batch)
	l, err := storage.GrantLease(ctx, s.Budgets, sh, k, s.Holder, want, 0, clock.Or(s.Clock).Now().Add(ttl).UnixMilli())
	if errors.Is(err, model.ErrBudgetExhausted) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	return l.ID, l.Amount, nil
}

// Return implements Stock: the lease is closed with unused units unspent.
func (s *BudgetStock) Return(ctx context.Context, batch, leaseID string, unused int64) error {
	sh, _ := s.home(batch)
	_, err := storage.ReturnLease(ctx, s.Budgets, sh, leaseID, unused)
	return err
}

// Levels implements Config.Levels over the stock rows the store holds: a
// batch without a row is left out.
func (s *BudgetStock) Levels(ctx context.Context, batches []string) (map[string]Level, error) {
	out := map[string]Level{}
	var errs []error
	for _, b := range batches {
		sh, k := s.home(b)
		row, held, err := storage.BudgetLevel(ctx, s.Budgets, sh, k)
		switch {
		case errors.Is(err, model.ErrNotFound):
		case err != nil:
			errs = append(errs, fmt.Errorf("batch %s: %w", b, err))
		default:
			out[b] = Level{Left: row.Available(0), Held: held}
		}
	}
	return out, errors.Join(errs...)
}
