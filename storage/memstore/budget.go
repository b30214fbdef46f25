package memstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"redcell/internal/invariant"
	"redcell/model"
)

// budgetBook is db_XX.t_budget and db_XX.t_budget_lease of every database:
// rows keyed by (database, key), leases by ID with their database, as the
// MariaDB store keys them. Guarded by Store.mu; made on first use. Budget
// calls meet no commit fault (FailNextCommit): they move no wallet money, and
// a lost answer is settled by the holder (LeasesOf) as with MariaDB.
type budgetBook struct {
	rows   map[budgetRowKey]*model.Budget
	leases map[string]*leaseRow         // by lease ID
	byKey  map[budgetRowKey][]*leaseRow // each budget's leases, oldest first
	seq    int64                        // leases granted, for their IDs
}

type budgetRowKey struct {
	db  int
	key string
}

type leaseRow struct {
	db int
	l  model.Lease
}

func (b *budgetBook) initLocked() {
	if b.rows == nil {
		b.rows = map[budgetRowKey]*model.Budget{}
		b.leases = map[string]*leaseRow{}
		b.byKey = map[budgetRowKey][]*leaseRow{}
	}
}

// leaseIDLocked is the next lease's ID: unlike MariaDB's (random), derived
// from the key and a counter, so the store stays deterministic; the key makes
// it unique across the stores of a simulated cluster, each budget having one
// home. s.mu must be held.
func (s *Store) leaseIDLocked(key string) string {
	s.budgets.seq++
	h := sha256.Sum256([]byte(key + "\x00" + strconv.FormatInt(s.budgets.seq, 10)))
	return hex.EncodeToString(h[:model.LeaseIDLen/2])
}

// setBudget runs storage.SetBudgetTotal.
func (s *Store) setBudget(ctx context.Context, sh model.ShardID, key string, total int64) (model.Budget, error) {
	if err := ctx.Err(); err != nil {
		return model.Budget{}, err
	}
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Budget{}, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budgets.initLocked()
	k := budgetRowKey{sh.DB(), key}
	b := model.Budget{Key: key}
	if have, ok := s.budgets.rows[k]; ok {
		b = *have
	}
	out, err := model.SetBudgetTotal(b, total, s.nowMS())
	if err != nil {
		return model.Budget{}, err
	}
	s.budgets.rows[k] = &out
	return out, nil
}

// grantLease runs storage.GrantBudgetLease.
func (s *Store) grantLease(ctx context.Context, sh model.ShardID, key, holder string, want, reserve, expiresMS int64) (model.Lease, error) {
	if err := ctx.Err(); err != nil {
		return model.Lease{}, err
	}
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Lease{}, err
	}
	if err := model.ValidateLeaseHolder(holder); err != nil {
		return model.Lease{}, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budgets.initLocked()
	k := budgetRowKey{sh.DB(), key}
	have, ok := s.budgets.rows[k]
	if !ok {
		return model.Lease{}, model.Errorf(model.ErrNotFound, "no budget %s in shard %d", key, sh)
	}
	b, l, err := model.GrantLease(model.GrantInput{Budget: *have, ID: s.leaseIDLocked(key), Holder: holder, Want: want,
		Reserve: reserve, NowMS: s.nowMS(), ExpiresMS: expiresMS})
	if err != nil {
		return model.Lease{}, err
	}
	_, dup := s.budgets.leases[l.ID]
	invariant.That(!dup, "lease ID drawn twice")
	*have = b
	row := &leaseRow{db: sh.DB(), l: l}
	s.budgets.leases[l.ID] = row
	s.budgets.byKey[k] = append(s.budgets.byKey[k], row)
	return l, nil
}

// returnLease runs storage.ReturnBudgetLease.
func (s *Store) returnLease(ctx context.Context, sh model.ShardID, leaseID string, unspent int64) (model.Lease, error) {
	if err := ctx.Err(); err != nil {
		return model.Lease{}, err
	}
	if err := model.ValidateLeaseID(leaseID); err != nil {
		return model.Lease{}, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budgets.initLocked()
	row, ok := s.budgets.leases[leaseID]
	if !ok || row.db != sh.DB() {
		return model.Lease{}, model.Errorf(model.ErrNotFound, "no lease %s in database %d", leaseID, sh.DB())
	}
	have := s.budgets.rows[budgetRowKey{row.db, row.l.Key}]
	invariant.That(have != nil, "a lease without its budget row")
	b, l, changed, err := model.ReturnLease(*have, row.l, unspent, s.nowMS())
	if err != nil || !changed {
		return l, err
	}
	*have, row.l = b, l
	return l, nil
}

// expireLeases runs storage.ExpireBudgetLeases.
func (s *Store) expireLeases(ctx context.Context, sh model.ShardID, key string, nowMS int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := model.ValidateBudgetKey(key); err != nil {
		return 0, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, row := range s.budgets.byKey[budgetRowKey{sh.DB(), key}] {
		if model.LeaseDue(row.l, nowMS) {
			row.l.State = model.LeaseExpired
			n++
		}
	}
	return n, nil
}

// budget runs storage.BudgetQuery.
func (s *Store) budget(ctx context.Context, sh model.ShardID, key string) (model.Budget, []model.Lease, error) {
	if err := ctx.Err(); err != nil {
		return model.Budget{}, nil, err
	}
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Budget{}, nil, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	k := budgetRowKey{sh.DB(), key}
	have, ok := s.budgets.rows[k]
	if !ok {
		return model.Budget{}, nil, model.Errorf(model.ErrNotFound, "no budget %s in shard %d", key, sh)
	}
	var ls []model.Lease
	for _, row := range s.budgets.byKey[k] {
		ls = append(ls, row.l)
	}
	sortLeases(ls)
	return *have, ls, nil
}

// budgetLevel runs storage.BudgetLevelQuery.
func (s *Store) budgetLevel(ctx context.Context, sh model.ShardID, key string) (model.Budget, int64, error) {
	b, ls, err := s.budget(ctx, sh, key)
	if err != nil {
		return model.Budget{}, 0, err
	}
	var held int64
	for _, l := range ls {
		if l.State == model.LeaseOpen || l.State == model.LeaseExpired {
			held += l.Amount
		}
	}
	return b, held, nil
}

// leasesOf runs storage.HolderLeasesQuery.
func (s *Store) leasesOf(ctx context.Context, sh model.ShardID, holder string) ([]model.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := model.ValidateLeaseHolder(holder); err != nil {
		return nil, err
	}
	invariant.That(sh.Valid(), "shard out of range")
	s.mu.Lock()
	defer s.mu.Unlock()
	var ls []model.Lease
	for _, row := range s.budgets.leases {
		if row.db == sh.DB() && row.l.Holder == holder && row.l.State != model.LeaseReturned {
			ls = append(ls, row.l)
		}
	}
	sortLeases(ls)
	return ls, nil
}

// sortLeases puts leases in the stores' order: (CreatedMS, ID).
func sortLeases(ls []model.Lease) {
	slices.SortFunc(ls, func(a, b model.Lease) int {
		if c := cmp.Compare(a.CreatedMS, b.CreatedMS); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}
