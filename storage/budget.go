package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"redcell/model"
)

// budgetDay is the ensureKey.day of a database's budget tables (keyed by
// the database's first shard): made on first use, since most databases home
// no budget. (identityDay is -1; the reward tables take -2.)
const budgetDay = -3

func (m *MySQL) budgetTable(s model.ShardID) string { return m.dbName(s) + ".t_budget" }
func (m *MySQL) leaseTable(s model.ShardID) string  { return m.dbName(s) + ".t_budget_lease" }

func (m *MySQL) budgetDDL(s model.ShardID) []string {
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + m.dbName(s) + dbDefaults,
		// The CHECK is the rule of model/budget.go once more, where the rows
		// are: a write that would pass the budget fails.
		`CREATE TABLE IF NOT EXISTS ` + m.budgetTable(s) + ` (
  budget_key VARCHAR(98) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  total      BIGINT NOT NULL,
  granted    BIGINT NOT NULL DEFAULT 0,
  returned   BIGINT NOT NULL DEFAULT 0,
  updated_ms BIGINT NOT NULL,
  CONSTRAINT ck_budget CHECK (returned >= 0 AND returned <= granted AND granted - returned <= total)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + m.leaseTable(s) + ` (
  lease_id    CHAR(20) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  budget_key  VARCHAR(98) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  holder      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  amount      BIGINT NOT NULL,
  unspent     BIGINT NOT NULL DEFAULT 0,
  state       VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  created_ms  BIGINT NOT NULL,
  expires_ms  BIGINT NOT NULL,
  returned_ms BIGINT NOT NULL DEFAULT 0,
  KEY k_key_state (budget_key, state),
  KEY k_holder_state (holder, state),
  CONSTRAINT ck_lease CHECK (amount >= 1 AND unspent >= 0 AND unspent <= amount)
) ENGINE=InnoDB`,
	}
}

func (m *MySQL) ensureBudgets(ctx context.Context, s model.ShardID) error {
	return m.ensure(ctx, ensureKey{shard: model.ShardID(s.DB() * 10), day: budgetDay}, m.budgetDDL(s))
}

const leaseCols = "lease_id, budget_key, holder, amount, unspent, state, created_ms, expires_ms, returned_ms"

func scanLease(row interface{ Scan(...any) error }) (model.Lease, error) {
	var l model.Lease
	err := row.Scan(&l.ID, &l.Key, &l.Holder, &l.Amount, &l.Unspent, &l.State, &l.CreatedMS, &l.ExpiresMS, &l.ReturnedMS)
	return l, err
}

// readBudget reads key's row, with a lock (FOR UPDATE) when lock is set. Errors: ErrNotFound.
func (m *MySQL) readBudget(ctx context.Context, q queryer, s model.ShardID, key string, lock bool) (model.Budget, error) {
	query := "SELECT budget_key, total, granted, returned, updated_ms FROM " + m.budgetTable(s) + " WHERE budget_key = ?"
	if lock {
		query += " FOR UPDATE"
	}
	var b model.Budget
	err := q.QueryRowContext(ctx, query, key).Scan(&b.Key, &b.Total, &b.Granted, &b.Returned, &b.UpdatedMS)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Budget{}, model.Errorf(model.ErrNotFound, "no budget %s in shard %d", key, s)
	}
	if err != nil {
		return model.Budget{}, fmt.Errorf("storage: read budget %s: %w", key, err)
	}
	return b, nil
}

func (m *MySQL) writeBudget(ctx context.Context, tx *sql.Tx, s model.ShardID, b model.Budget) error {
	_, err := tx.ExecContext(ctx, "UPDATE "+m.budgetTable(s)+" SET total = ?, granted = ?, returned = ?, updated_ms = ? WHERE budget_key = ?",
		b.Total, b.Granted, b.Returned, b.UpdatedMS, b.Key)
	return err
}

// setBudget runs SetBudgetTotal: make sure the row exists (total 0), lock it,
// decide (model.SetBudgetTotal), write.
func (m *MySQL) setBudget(ctx context.Context, s model.ShardID, key string, total int64) (model.Budget, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Budget{}, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return model.Budget{}, err
	}
	var out model.Budget
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		now := m.nowMS()
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+m.budgetTable(s)+" (budget_key, total, updated_ms) VALUES (?, 0, ?) ON DUPLICATE KEY UPDATE budget_key = budget_key",
			key, now); err != nil {
			return err
		}
		b, err := m.readBudget(ctx, tx, s, key, true)
		if err != nil {
			return err
		}
		if out, err = model.SetBudgetTotal(b, total, now); err != nil {
			return err
		}
		return m.writeBudget(ctx, tx, s, out)
	})
	if errors.Is(err, errCommitUnknown) {
		// Setting a total twice is harmless: the re-read tells whether it holds.
		if ok, known := m.settleCommit(ctx, func() (bool, error) {
			b, _, rerr := m.budget(ctx, s, key)
			return rerr == nil && b.Total == total, rerr
		}); known && ok {
			b, _, err := m.budget(ctx, s, key)
			return b, err
		}
	}
	if err != nil {
		return model.Budget{}, fmt.Errorf("storage: set budget %s: %w", key, err)
	}
	return out, nil
}

// grantLease runs GrantBudgetLease: lock the budget row, decide
// (model.GrantLease), insert the lease and write the row. The lease ID is
// drawn before the transaction, so a lost COMMIT answer is settled by
// looking for it.
func (m *MySQL) grantLease(ctx context.Context, s model.ShardID, key, holder string, want, reserve, expiresMS int64) (model.Lease, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Lease{}, err
	}
	if err := model.ValidateLeaseHolder(holder); err != nil {
		return model.Lease{}, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return model.Lease{}, err
	}
	id := model.NewLeaseID()
	var out model.Lease
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		b, err := m.readBudget(ctx, tx, s, key, true)
		if err != nil {
			return err
		}
		b, out, err = model.GrantLease(model.GrantInput{Budget: b, ID: id, Holder: holder, Want: want, Reserve: reserve,
			NowMS: m.nowMS(), ExpiresMS: expiresMS})
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+m.leaseTable(s)+" ("+leaseCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
			out.ID, out.Key, out.Holder, out.Amount, out.Unspent, string(out.State), out.CreatedMS, out.ExpiresMS, out.ReturnedMS); err != nil {
			return err
		}
		return m.writeBudget(ctx, tx, s, b)
	})
	if errors.Is(err, errCommitUnknown) {
		var l model.Lease
		if ok, known := m.settleCommit(ctx, func() (bool, error) {
			var rerr error
			l, rerr = m.lease(ctx, m.db, s, id, false)
			if errors.Is(rerr, model.ErrNotFound) {
				return false, nil
			}
			return rerr == nil, rerr
		}); known && ok {
			return l, nil
		}
	}
	if err != nil {
		return model.Lease{}, fmt.Errorf("storage: grant lease of %s: %w", key, err)
	}
	return out, nil
}

// lease reads one lease, with a lock when lock is set. Errors: ErrNotFound.
func (m *MySQL) lease(ctx context.Context, q queryer, s model.ShardID, id string, lock bool) (model.Lease, error) {
	query := "SELECT " + leaseCols + " FROM " + m.leaseTable(s) + " WHERE lease_id = ?"
	if lock {
		query += " FOR UPDATE"
	}
	l, err := scanLease(q.QueryRowContext(ctx, query, id))
	if errors.Is(err, sql.ErrNoRows) {
		return model.Lease{}, model.Errorf(model.ErrNotFound, "no lease %s in database %d", id, s.DB())
	}
	if err != nil {
		return model.Lease{}, fmt.Errorf("storage: read lease %s: %w", id, err)
	}
	return l, nil
}

// returnLease runs ReturnBudgetLease: find the lease's budget, lock the budget
// row and then the lease (the order GrantLease locks in), decide
// (model.ReturnLease), write both rows.
func (m *MySQL) returnLease(ctx context.Context, s model.ShardID, leaseID string, unspent int64) (model.Lease, error) {
	if err := model.ValidateLeaseID(leaseID); err != nil {
		return model.Lease{}, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return model.Lease{}, err
	}
	first, err := m.lease(ctx, m.db, s, leaseID, false)
	if err != nil {
		return model.Lease{}, err
	}
	var out model.Lease
	err = m.inTx(ctx, func(tx *sql.Tx) error {
		b, err := m.readBudget(ctx, tx, s, first.Key, true)
		if err != nil {
			return err
		}
		l, err := m.lease(ctx, tx, s, leaseID, true)
		if err != nil {
			return err
		}
		var changed bool
		b, out, changed, err = model.ReturnLease(b, l, unspent, m.nowMS())
		if err != nil || !changed {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+m.leaseTable(s)+" SET state = ?, unspent = ?, returned_ms = ? WHERE lease_id = ?",
			string(out.State), out.Unspent, out.ReturnedMS, out.ID); err != nil {
			return err
		}
		return m.writeBudget(ctx, tx, s, b)
	})
	if errors.Is(err, errCommitUnknown) {
		var l model.Lease
		if ok, known := m.settleCommit(ctx, func() (bool, error) {
			var rerr error
			l, rerr = m.lease(ctx, m.db, s, leaseID, false)
			return rerr == nil && l.State == model.LeaseReturned, rerr
		}); known && ok {
			return l, nil
		}
	}
	if err != nil {
		return model.Lease{}, fmt.Errorf("storage: return lease %s: %w", leaseID, err)
	}
	return out, nil
}

// expireLeases runs ExpireBudgetLeases in one UPDATE (by k_key_state): no budget
// total changes, so the budget row is not locked.
func (m *MySQL) expireLeases(ctx context.Context, s model.ShardID, key string, nowMS int64) (int, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return 0, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return 0, err
	}
	res, err := m.db.ExecContext(ctx, "UPDATE "+m.leaseTable(s)+" SET state = ? WHERE budget_key = ? AND state = ? AND expires_ms <= ?",
		string(model.LeaseExpired), key, string(model.LeaseOpen), nowMS)
	if err != nil {
		return 0, fmt.Errorf("storage: expire leases of %s: %w", key, err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// budget runs BudgetQuery: both reads in one read-only transaction, so
// they see one snapshot.
func (m *MySQL) budget(ctx context.Context, s model.ShardID, key string) (model.Budget, []model.Lease, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Budget{}, nil, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return model.Budget{}, nil, err
	}
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return model.Budget{}, nil, fmt.Errorf("storage: begin: %w", err)
	}
	defer tx.Rollback()
	// The first SELECT takes InnoDB's snapshot (REPEATABLE READ); the second reads it.
	b, err := m.readBudget(ctx, tx, s, key, false)
	if err != nil {
		return model.Budget{}, nil, err
	}
	ls, err := m.leases(ctx, tx, "SELECT "+leaseCols+" FROM "+m.leaseTable(s)+" WHERE budget_key = ? ORDER BY created_ms, lease_id", key)
	if err != nil {
		return model.Budget{}, nil, err
	}
	return b, ls, tx.Commit()
}

// budgetLevel runs BudgetLevelQuery: the row and the open and expired
// leases' sum (by k_key_state) in one statement, so in one snapshot
// without a transaction of its own: one statement and one round trip.
func (m *MySQL) budgetLevel(ctx context.Context, s model.ShardID, key string) (model.Budget, int64, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return model.Budget{}, 0, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return model.Budget{}, 0, err
	}
	var b model.Budget
	var held int64
	err := m.db.QueryRowContext(ctx, "SELECT b.budget_key, b.total, b.granted, b.returned, b.updated_ms, "+
		"(SELECT COALESCE(SUM(l.amount), 0) FROM "+m.leaseTable(s)+" l WHERE l.budget_key = b.budget_key AND l.state IN (?, ?)) "+
		"FROM "+m.budgetTable(s)+" b WHERE b.budget_key = ?", string(model.LeaseOpen), string(model.LeaseExpired), key).
		Scan(&b.Key, &b.Total, &b.Granted, &b.Returned, &b.UpdatedMS, &held)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Budget{}, 0, model.Errorf(model.ErrNotFound, "no budget %s in shard %d", key, s)
	}
	if err != nil {
		return model.Budget{}, 0, fmt.Errorf("storage: read budget %s's level: %w", key, err)
	}
	return b, held, nil
}

// leasesOf runs HolderLeasesQuery (by k_holder_state).
func (m *MySQL) leasesOf(ctx context.Context, s model.ShardID, holder string) ([]model.Lease, error) {
	if err := model.ValidateLeaseHolder(holder); err != nil {
		return nil, err
	}
	if err := m.ensureBudgets(ctx, s); err != nil {
		return nil, err
	}
	return m.leases(ctx, m.db, "SELECT "+leaseCols+" FROM "+m.leaseTable(s)+
		" WHERE holder = ? AND state IN (?, ?) ORDER BY created_ms, lease_id", holder, string(model.LeaseOpen), string(model.LeaseExpired))
}

func (m *MySQL) leases(ctx context.Context, q rowsQueryer, query string, args ...any) ([]model.Lease, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: read leases: %w", err)
	}
	defer rows.Close()
	var out []model.Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("storage: read leases: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}
