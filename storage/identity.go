package storage

import (
	"context"
	"database/sql"
	"fmt"

	"redcell/model"
)

// identityDay is the ensureKey.day of a shard's identity table: made on first
// use, not with the shard's money tables, since most shards of a cell never
// home a binding on a given run.
const identityDay = -1

func (m *MySQL) identityTable(s model.ShardID) string {
	return fmt.Sprintf("%s.t_identity_%d", m.dbName(s), s.Table())
}

func (m *MySQL) identityDDL(s model.ShardID) []string {
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + m.dbName(s) + dbDefaults,
		`CREATE TABLE IF NOT EXISTS ` + m.identityTable(s) + ` (
  app         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  app_user_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  act_id      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  phone_hash  CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  created_ms  BIGINT NOT NULL,
  PRIMARY KEY (app, app_user_id)
) ENGINE=InnoDB`,
	}
}

// bindIdentity runs BindAccount. One statement stores want unless the
// account's row is there (INSERT ... ON DUPLICATE KEY UPDATE app = app: 1 row
// affected when it was stored, 0 when a row was there); then the row is read
// and decided against (model.Bind). A row of a legacy form is re-keyed by one
// UPDATE of its phone_hash, made only while it still holds the hash read, so
// that it never overwrites another request's: its act_id stays. A lost answer
// is harmless: the retry finds the row and answers it as a repeat.
func (m *MySQL) bindIdentity(ctx context.Context, s model.ShardID, want model.IdentityBinding, legacy ...string) (model.IdentityBinding, bool, error) {
	if err := m.ensure(ctx, ensureKey{shard: s, day: identityDay}, m.identityDDL(s)); err != nil {
		return model.IdentityBinding{}, false, err
	}
	var have model.IdentityBinding
	for attempt := 1; ; attempt++ {
		stored, found, err := m.insertOrReadIdentity(ctx, s, want, &have)
		if err != nil {
			return model.IdentityBinding{}, false, err
		}
		if stored {
			return model.Bind(nil, want)
		}
		if found {
			break
		}
		// The INSERT met the row of a concurrent bind and the read after it
		// found none (seen once under load, in TestFreshOnce). Rows are never
		// deleted and the INSERT is idempotent: both are asked again.
		if attempt == 3 {
			return model.IdentityBinding{}, false, fmt.Errorf("storage: bind identity: the row of %s/%s is gone", want.App, want.AppUserID)
		}
	}
	// The keys compare byte for byte (ascii_bin): the row is this account's,
	// never another's that a case-blind collation would have matched.
	if have.App != want.App || have.AppUserID != want.AppUserID {
		return model.IdentityBinding{}, false, fmt.Errorf("storage: bind identity: %s/%s found the row of %s/%s (the table's collation ignores case)",
			want.App, want.AppUserID, have.App, have.AppUserID)
	}
	b, repeat, err := model.Bind(&have, want, legacy...)
	if err == nil && b.PhoneHash != have.PhoneHash {
		if _, err := m.db.ExecContext(ctx, "UPDATE "+m.identityTable(s)+" SET phone_hash = ? WHERE app = ? AND app_user_id = ? AND phone_hash = ?",
			b.PhoneHash, have.App, have.AppUserID, have.PhoneHash); err != nil {
			return model.IdentityBinding{}, false, fmt.Errorf("storage: bind identity: re-key the legacy row of %s/%s: %w", have.App, have.AppUserID, err)
		}
	}
	return b, repeat, err
}

// insertOrReadIdentity stores want unless the account's row is there (one
// INSERT ... ON DUPLICATE KEY UPDATE app = app: 1 row affected when stored,
// 0 when a row was there), else reads that row into have. found is false
// when the row the INSERT met was not found by the read.
func (m *MySQL) insertOrReadIdentity(ctx context.Context, s model.ShardID, want model.IdentityBinding, have *model.IdentityBinding) (stored, found bool, err error) {
	res, err := m.db.ExecContext(ctx, "INSERT INTO "+m.identityTable(s)+
		" (app, app_user_id, act_id, phone_hash, created_ms) VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE app = app",
		want.App, want.AppUserID, want.ActID, want.PhoneHash, want.CreatedMS)
	if err != nil {
		return false, false, fmt.Errorf("storage: bind identity: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, false, err
	} else if n == 1 {
		return true, false, nil
	}
	err = m.db.QueryRowContext(ctx, "SELECT app, app_user_id, act_id, phone_hash, created_ms FROM "+m.identityTable(s)+
		" WHERE app = ? AND app_user_id = ?", want.App, want.AppUserID).Scan(&have.App, &have.AppUserID, &have.ActID, &have.PhoneHash, &have.CreatedMS)
	if err == sql.ErrNoRows {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("storage: bind identity: %w", err)
	}
	return false, true, nil
}
