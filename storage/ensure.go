package storage

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"redcell/model"
)

// EnsureShard creates the shard's database and account and flow tables, and the database's relay position table,
// once per process; concurrent callers wait for the first.
//
// A process that finds them made (by another process, or before a restart:
// schemaHas) runs one SELECT instead of the DDL: a CREATE TABLE IF NOT EXISTS
// or ALTER TABLE on a table that open transactions use waits for them, and
// makes every statement on the table wait behind it, seconds under load.
func (m *MySQL) EnsureShard(ctx context.Context, s model.ShardID) error {
	return m.ensureProbed(ctx, ensureKey{shard: s}, m.shardNeeds(s), m.shardDDL(s))
}

// shardNeeds is what shardDDL(s) makes, as schemaPresent checks it.
func (m *MySQL) shardNeeds(s model.ShardID) []schemaNeed {
	return []schemaNeed{
		needOf(m.accountTable(s), "", ""),
		needOf(m.flowTable(s), "", "k_act_time"),
		needOf(m.relayPosTable(s.DB()), "", ""),
	}
}

// ensureProbeMax is the most shards one schema read of EnsureShards asks
// about (three needs each).
const ensureProbeMax = 100

// EnsureShards is EnsureShard for each of shards (repeats allowed), with the
// schema of those this process has not made sure of yet read in one round
// trip per ensureProbeMax shards rather than one each: a batch of credits
// to hundreds of shards, the first after a start, waited seconds for those
// reads under load. Shards found made are recorded as such; the others go
// through EnsureShard (its DDL).
func (m *MySQL) EnsureShards(ctx context.Context, shards []model.ShardID) error {
	var todo []model.ShardID
	seen := map[model.ShardID]bool{}
	m.mu.Lock()
	gen := m.forgets
	for _, s := range shards {
		if _, ok := m.ensured[ensureKey{shard: s}]; !ok && !seen[s] {
			todo = append(todo, s)
		}
		seen[s] = true
	}
	m.mu.Unlock()
	for len(todo) > 1 {
		chunk := todo[:min(len(todo), ensureProbeMax)]
		todo = todo[len(chunk):]
		var needs []schemaNeed
		for _, s := range chunk {
			needs = append(needs, m.shardNeeds(s)...)
		}
		present, err := m.schemaPresent(ctx, needs)
		if err != nil {
			break // EnsureShard below asks again, shard by shard
		}
		for i, s := range chunk {
			if !slices.Contains(present[3*i:3*i+3], false) {
				m.ensuredAlready(ensureKey{shard: s}, gen)
			}
		}
	}
	for s := range seen {
		if err := m.EnsureShard(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// ensuredAlready records k as made sure of by this process (found made by
// a schema read begun when forgets was gen), unless a call for it has begun
// or databases were dropped since the read began (forgetDBs).
func (m *MySQL) ensuredAlready(k ensureKey, gen int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ensured[k]; ok || m.forgets != gen {
		return
	}
	once := new(sync.Once)
	once.Do(func() {})
	m.ensured[k] = once
	m.errs[k] = nil
}

// EnsureDay creates the packet and claim tables of shard s for day-of-month day.
func (m *MySQL) EnsureDay(ctx context.Context, s model.ShardID, day int) error {
	if err := m.EnsureShard(ctx, s); err != nil {
		return err
	}
	if err := m.ensureProbed(ctx, ensureKey{shard: s, day: day}, m.dayNeeds(s, day), m.dayDDL(s, day)); err != nil {
		return err
	}
	m.madeDayTables(s, day)
	return nil
}

// madeDayTables adds shard s's packet and claim tables of day (ArchiveDay
// for its archive) to the table list, made sure of by this process.
func (m *MySQL) madeDayTables(s model.ShardID, day int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tableMade == nil {
		m.tableMade = map[tableRef]bool{}
	}
	for _, kind := range []string{"packet", "claim"} {
		t := tableRef{kind: kind, shard: s, day: day}
		m.tableMade[t] = true
		if m.tableList != nil && !m.tableKnown[t] {
			m.tableList = append(m.tableList, t)
			m.tableKnown[t] = true
		}
	}
}

// dayNeeds is what dayDDL(s, day) makes, as schemaHas checks it: the packet
// and claim tables with the indexes added after their first version.
func (m *MySQL) dayNeeds(s model.ShardID, day int) []schemaNeed {
	return []schemaNeed{
		needOf(m.packetTable(s, day), "", "k_created"),
		needOf(m.claimTable(s, day), "", "k_created"),
		needOf(m.claimTable(s, day), "dest", ""),
	}
}

// needOf is the need of table ("db.t_name", as the DDL names it), with the
// column or index the DDL may add to an older version of it.
func needOf(table, column, index string) schemaNeed {
	schema, name, _ := strings.Cut(table, ".")
	return schemaNeed{schema: schema, table: name, column: column, index: index}
}

// schemaNeed is one table a DDL list makes, and what of it the list may add
// to an older version of the table (a column or an index; neither: the
// table itself).
type schemaNeed struct {
	schema, table string
	column, index string
}

// schemaHas reports whether every need is in the server's schema, in one
// round trip (schemaPresent).
func (m *MySQL) schemaHas(ctx context.Context, needs []schemaNeed) (bool, error) {
	present, err := m.schemaPresent(ctx, needs)
	if err != nil {
		return false, err
	}
	return !slices.Contains(present, false), nil
}

// schemaPresent reports which needs are in the server's schema, in one round
// trip: a SELECT from information_schema per need (each names its schema and
// table, so the server opens only that table's definition), joined by UNION
// ALL, each answering its need's index.
func (m *MySQL) schemaPresent(ctx context.Context, needs []schemaNeed) ([]bool, error) {
	parts := make([]string, len(needs))
	var args []any
	for i, n := range needs {
		switch {
		case n.column != "":
			parts[i] = "SELECT ? FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?"
			args = append(args, i, n.schema, n.table, n.column)
		case n.index != "":
			parts[i] = "SELECT ? FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND INDEX_NAME = ? AND SEQ_IN_INDEX = 1"
			args = append(args, i, n.schema, n.table, n.index)
		default:
			parts[i] = "SELECT ? FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?"
			args = append(args, i, n.schema, n.table)
		}
	}
	rows, err := m.db.QueryContext(ctx, strings.Join(parts, " UNION ALL "), args...)
	if err != nil {
		return nil, fmt.Errorf("storage: read the schema: %w", err)
	}
	defer rows.Close()
	present := make([]bool, len(needs))
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, fmt.Errorf("storage: read the schema: %w", err)
		}
		if i >= 0 && i < len(needs) {
			present[i] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: read the schema: %w", err)
	}
	return present, nil
}

// ensureProbed is ensure, asking the schema first (schemaHas): when every
// need is there, the DDL is not run. A failed probe runs the DDL.
func (m *MySQL) ensureProbed(ctx context.Context, k ensureKey, needs []schemaNeed, ddl []string) error {
	return m.ensureWith(ctx, k, func() error {
		if ok, err := m.schemaHas(ctx, needs); err == nil && ok {
			return nil
		}
		return m.runDDL(ctx, k, ddl)
	})
}

// runDDL runs the statements of ddl in order, stopping at the first error.
func (m *MySQL) runDDL(ctx context.Context, k ensureKey, ddl []string) error {
	for _, q := range ddl {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("storage: create tables of shard %d day %d: %w", k.shard, k.day, err)
		}
	}
	return nil
}

// ensure runs ddl once per process for k (ensureWith).
func (m *MySQL) ensure(ctx context.Context, k ensureKey, ddl []string) error {
	return m.ensureWith(ctx, k, func() error { return m.runDDL(ctx, k, ddl) })
}

// ensuredOK reports whether k was made sure of in this process, without
// error (nothing sent to the server).
func (m *MySQL) ensuredOK(k ensureKey) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	err, ok := m.errs[k]
	return ok && err == nil
}

// ensureWith runs make once per process for k: concurrent callers wait for
// the first and get its error; after an error a later call tries again.
func (m *MySQL) ensureWith(ctx context.Context, k ensureKey, create func() error) error {
	m.mu.Lock()
	once, ok := m.ensured[k]
	if !ok {
		once = new(sync.Once)
		m.ensured[k] = once
	}
	m.mu.Unlock()
	once.Do(func() {
		err := create()
		m.mu.Lock()
		if err != nil {
			delete(m.ensured, k) // let a later call try again
		}
		m.errs[k] = err
		m.mu.Unlock()
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.errs[k]
}

// EnsureDays creates the day tables for every shard in shards for each of days,
// with up to parallel connections, calling progress after each shard.
func (m *MySQL) EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error {
	jobs := make(chan model.ShardID)
	errc := make(chan error, parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range jobs {
				for _, d := range days {
					if err := m.EnsureDay(ctx, s, d); err != nil {
						select {
						case errc <- err:
						default:
						}
						return
					}
				}
				mu.Lock()
				done++
				if progress != nil {
					progress(done, len(shards))
				}
				mu.Unlock()
			}
		}()
	}
	var firstErr error
feed:
	for _, s := range shards {
		select {
		case jobs <- s:
		case firstErr = <-errc:
			break feed
		case <-ctx.Done():
			firstErr = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr == nil {
		select {
		case firstErr = <-errc:
		default:
		}
	}
	return firstErr
}
