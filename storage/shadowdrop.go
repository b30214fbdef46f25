package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"redcell/internal/invariant"
	"redcell/model"
)

// ErrNotShadow is what DropShadow answers on a store of real money: only the
// shadow store (Shadow) drops anything.
var ErrNotShadow = errors.New("storage: only the shadow store drops databases; real money is never dropped")

// DropShadow drops the shadow databases (ShadowPrefix + "db_XX") of the
// database indexes dbs (0..99) that exist, with every table in them, and
// forgets that this store made their tables: its next call that needs one
// makes it again, as on a server that never held them. It answers the
// databases dropped, in index order, and how many tables they held. A
// database that does not exist is skipped, so a second call drops nothing
// and answers nothing. Nothing else is touched: not the real databases, not
// the shadow reconciliation positions ([shadow_]redcell_meta), not the
// shadow databases of indexes left out of dbs.
//
// Only the shadow store drops: on any other (ns "", real money) it drops
// nothing and answers ErrNotShadow, whatever dbs says. Calls that use a
// database while it is dropped fail as they would on a server without it
// (unknown database, no such table); the caller keeps them away
// (cell.shadowCleaner). Safe for concurrent use.
func (m *MySQL) DropShadow(ctx context.Context, dbs []int) (dropped []string, tables int, err error) {
	if m.ns != m.base+ShadowPrefix {
		return nil, 0, ErrNotShadow
	}
	names := make([]string, 0, len(dbs))
	for _, db := range dbs {
		invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
		names = append(names, m.shadowDBName(db))
	}
	slices.Sort(names)
	names = slices.Compact(names)
	dropped = []string{}
	if len(names) == 0 {
		return dropped, 0, nil
	}
	// Forget the tables made even if a drop fails halfway: some may be gone.
	defer m.forgetDBs(dbs)
	held, err := m.shadowTables(ctx, names)
	if err != nil {
		return dropped, 0, err
	}
	for _, name := range names {
		n, ok := held[name]
		if !ok {
			continue // never made, or dropped before
		}
		if _, err := m.db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			return dropped, tables, fmt.Errorf("storage: drop %s: %w", name, err)
		}
		dropped = append(dropped, name)
		tables += n
	}
	return dropped, tables, nil
}

// shadowDBName is the shadow database of db index db. Built from the
// constant prefix after the store's namespace (OpenPrefixed) only, and
// checked again: a name DropShadow drops must be a shadow one.
func (m *MySQL) shadowDBName(db int) string {
	name := fmt.Sprintf("%s%sdb_%02d", m.base, ShadowPrefix, db)
	invariant.That(strings.HasPrefix(name, m.base+"shadow_db_") && len(name) == len(m.base+"shadow_db_00"), "a shadow database name")
	return name
}

// shadowTables answers, of the databases names, those that exist, with how
// many tables each holds.
func (m *MySQL) shadowTables(ctx context.Context, names []string) (map[string]int, error) {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	rows, err := m.db.QueryContext(ctx, "SELECT s.SCHEMA_NAME, COUNT(t.TABLE_NAME) FROM information_schema.SCHEMATA s "+
		"LEFT JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = s.SCHEMA_NAME WHERE s.SCHEMA_NAME IN ("+placeholders(len(names))+
		") GROUP BY s.SCHEMA_NAME", args...)
	if err != nil {
		return nil, fmt.Errorf("storage: list shadow databases: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, rows.Err()
}

// forgetDBs forgets which tables of databases dbs this store made (their
// EnsureShard, EnsureDay, coupon, reward, budget, identity and archive
// tables: every ensureKey names its database by its shard) and the cached
// table list, so the next call that needs one of them makes it again.
func (m *MySQL) forgetDBs(dbs []int) {
	gone := map[int]bool{}
	for _, db := range dbs {
		gone[db] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgets++ // a schema read begun before this may have seen the dropped tables (EnsureShards)
	for k := range m.ensured {
		if gone[k.shard.DB()] {
			delete(m.ensured, k)
			delete(m.errs, k)
		}
	}
	m.tableList, m.tableMade = nil, nil
}
