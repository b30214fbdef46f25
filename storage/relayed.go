package storage

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
	"redcell/sharding"
)

// claimCreditCols are what a claim row gives of the credit it owes, in
// scanClaimCredit's order.
const claimCreditCols = "packet_id, seq, act_id, amount, created_ms, act_shard, dest"

// scanClaimCredit reads a row of claimCreditCols as the credit the claim owes
// its claimant; a row made before act_shard existed (-1) gets the shard
// computed from its act_id.
func scanClaimCredit(r rowScanner) (model.Credit, model.ClaimPos, error) {
	var c model.Credit
	var pid string
	var seq int64
	var shard int
	if err := r.Scan(&pid, &seq, &c.ActID, &c.Amount, &c.CreatedMS, &shard, &c.Dest); err != nil {
		return c, model.ClaimPos{}, err
	}
	c.PacketID, c.ClaimID = model.PacketID(pid), model.ClaimID(model.PacketID(pid), seq)
	c.Shard = model.ShardID(shard)
	if shard < 0 {
		c.Shard = sharding.ShardOfAct(c.ActID)
	}
	return c, model.ClaimPos{CreatedMS: c.CreatedMS, PacketID: c.PacketID, Seq: seq}, nil
}

// claimsAfter answers ClaimsAfterQuery: one statement, a UNION ALL of every claim
// table of db known to exist (each read through its k_created index, which
// InnoDB keeps in (created_ms, packet_id, seq) order), each part limited and
// the whole ordered and limited again. A table listed but gone since (a
// shard handed over) makes it read the list again and retry once.
func (m *MySQL) claimsAfter(ctx context.Context, db int, fromMS int64, after model.ClaimPos, beforeMS int64, limit int) ([]model.Credit, model.ClaimPos, error) {
	if db < 0 || db >= model.ShardCount/10 {
		return nil, after, model.Invalidf("database %d out of range", db)
	}
	if limit <= 0 {
		return nil, after, nil
	}
	var out []model.Credit
	next := after
	missing := func(err error) bool { return isMySQLErr(err, errNoSuchTable) }
	err := retry.Do(ctx, retry.Policy{Attempts: 2, Retryable: missing, Clock: m.clock}, func(int) error {
		out, next = nil, after
		tables, err := m.dayTables(ctx)
		if err != nil {
			return err
		}
		var u union
		for _, t := range tables {
			if t.kind != "claim" || t.shard.DB() != db {
				continue
			}
			q := "SELECT " + claimCreditCols + " FROM " + m.claimTable(t.shard, t.day) + " WHERE created_ms >= ? AND created_ms <= ?"
			args := []any{max(fromMS, after.CreatedMS), beforeMS}
			if after != (model.ClaimPos{}) {
				q += " AND (created_ms > ? OR (created_ms = ? AND (packet_id > ? OR (packet_id = ? AND seq > ?))))"
				args = append(args, after.CreatedMS, after.CreatedMS, string(after.PacketID), string(after.PacketID), after.Seq)
			}
			u.add(q+" ORDER BY created_ms, packet_id, seq LIMIT ?", append(args, limit)...)
		}
		if len(u.parts) == 0 {
			return nil
		}
		q, args := u.sql()
		rows, err := m.db.QueryContext(ctx, q+" ORDER BY created_ms, packet_id, seq LIMIT ?", append(args, limit)...)
		if err != nil {
			if missing(err) {
				m.forgetTables()
			}
			return err
		}
		defer rows.Close()
		for rows.Next() {
			c, pos, err := scanClaimCredit(rows)
			if err != nil {
				return err
			}
			out, next = append(out, c), pos
		}
		return rows.Err()
	})
	if err != nil {
		return nil, after, fmt.Errorf("storage: claims of db_%02d after %+v: %w", db, after, err)
	}
	return out, next, nil
}

// sendTo runs RecordDest: one UPDATE per claim table, all in one
// statement list, autocommit: the claim's day table and, where the shard
// has one listed, its archive (the claim may have moved there). A table
// gone makes it read the list of tables again and send the list once more,
// with the listed tables only.
func (m *MySQL) sendTo(ctx context.Context, credits []model.Credit, dest string) error {
	byShard := map[model.ShardID]map[int][]any{} // shard → day → (packet_id, seq) pairs
	for _, c := range credits {
		ref, seq, err := model.ParseClaimID(c.ClaimID)
		if err != nil {
			return fmt.Errorf("storage: send to: %w", err)
		}
		if byShard[ref.Shard] == nil {
			byShard[ref.Shard] = map[int][]any{}
		}
		byShard[ref.Shard][ref.Day] = append(byShard[ref.Shard][ref.Day], string(ref.ID), seq)
	}
	if len(byShard) == 0 {
		return nil
	}
	missing := func(err error) bool { return isMySQLErr(err, errNoSuchTable) }
	err := retry.Do(ctx, retry.Policy{Attempts: 2, Retryable: missing, Clock: m.clock}, func(attempt int) error {
		tables, err := m.dayTables(ctx)
		if err != nil {
			return err
		}
		known := make(map[tableRef]bool, len(tables))
		for _, t := range tables {
			known[t] = true
		}
		var b sqlBatch
		update := func(sh model.ShardID, day int, keys []any) {
			// A claim's day table exists unless the list was stale (then
			// read again): the archive only where listed.
			if known[tableRef{kind: "claim", shard: sh, day: day}] || day != ArchiveDay && attempt == 0 {
				b.add("UPDATE "+m.claimTable(sh, day)+" SET dest = ? WHERE (packet_id, seq) IN ("+
					strings.TrimSuffix(strings.Repeat("(?, ?),", len(keys)/2), ",")+")", append([]any{dest}, keys...)...)
			}
		}
		for _, sh := range slices.Sorted(maps.Keys(byShard)) {
			var all []any
			for _, day := range slices.Sorted(maps.Keys(byShard[sh])) {
				update(sh, day, byShard[sh][day])
				all = append(all, byShard[sh][day]...)
			}
			update(sh, ArchiveDay, all)
		}
		if len(b.parts) == 0 {
			return nil
		}
		q, args := b.sql()
		_, err = m.db.ExecContext(ctx, q, args...)
		if missing(err) {
			m.forgetTables()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("storage: send to: %w", err)
	}
	return nil
}

// relayPositions answers RelayPositionsQuery: one statement over the databases'
// position tables; when one of them is missing (a database never used since
// the table existed), each database is read by itself. A database without
// a saved position that still has the outbox table of an earlier version
// answers the position that table gives (legacyPosition): one more
// statement per such database, at a relay's start only.
func (m *MySQL) relayPositions(ctx context.Context, dbs []int) (map[int]int64, error) {
	out := map[int]int64{}
	if len(dbs) == 0 {
		return out, nil
	}
	read := func(dbs []int) error {
		var u union
		for _, db := range dbs {
			if db < 0 || db >= model.ShardCount/10 {
				return model.Invalidf("database %d out of range", db)
			}
			u.add("SELECT ? AS db, pos_ms FROM "+m.relayPosTable(db)+" WHERE id = 1", db)
		}
		q, args := u.sql()
		rows, err := m.db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var db int
			var ms int64
			if err := rows.Scan(&db, &ms); err != nil {
				return err
			}
			out[db] = ms
		}
		return rows.Err()
	}
	err := read(dbs)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		err = nil
		for _, db := range dbs {
			if e := read([]int{db}); e != nil && !isMySQLErr(e, errNoSuchTable) && !isMySQLErr(e, errUnknownDB) {
				err = e
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("storage: relay positions: %w", err)
	}
	for _, db := range dbs {
		if _, ok := out[db]; ok {
			continue
		}
		p, ok, err := m.legacyPosition(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("storage: relay positions: %w", err)
		}
		if ok {
			out[db] = p
		}
	}
	return out, nil
}

// legacyUndelivered is how far back before its clock's time the store
// places the position of a database upgraded from an outbox with nothing
// undelivered: claims this version made there before the relay's first save.
const legacyUndelivered = time.Minute

// legacyPosition is the position of database db, which has none saved, as
// its outbox table of a version before claims were their own outbox (kept,
// no longer written) gives it: the creation time of its oldest undelivered
// row, or legacyUndelivered before now when none is. ok is false when db
// has no such table: a database never used, or made by this version. So
// the first start of this version reads back the claims the outbox still
// owed, not every claim the tables hold.
func (m *MySQL) legacyPosition(ctx context.Context, db int) (pos int64, ok bool, err error) {
	var oldest sql.NullInt64
	err = m.db.QueryRowContext(ctx, "SELECT MIN(created_ms) FROM "+m.tableNamesOf().db[db]+".t_outbox WHERE state = 0").Scan(&oldest)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	pos = m.clock.Now().Add(-legacyUndelivered).UnixMilli()
	if oldest.Valid {
		pos = min(pos, oldest.Int64)
	}
	return pos, true, nil
}

// saveRelayPositions runs SetRelayPositions: one upsert per database, all in one
// statement list, autocommit. When a database lacks the table (made by an
// earlier version) each is saved by itself, its table made first; a
// database that does not exist is skipped: it holds no claims (a shadow
// space dropped, say), and a save must not make it.
func (m *MySQL) saveRelayPositions(ctx context.Context, pos map[int]int64) error {
	if len(pos) == 0 {
		return nil
	}
	dbs := slices.Sorted(maps.Keys(pos))
	for _, db := range dbs {
		if db < 0 || db >= model.ShardCount/10 {
			return fmt.Errorf("storage: save relay positions: %w", model.Invalidf("database %d out of range", db))
		}
	}
	now := m.nowMS()
	upsert := func(db int) (string, []any) {
		return "INSERT INTO " + m.relayPosTable(db) + " (id, pos_ms, updated_ms) VALUES (1, ?, ?) ON DUPLICATE KEY UPDATE pos_ms = VALUES(pos_ms), updated_ms = VALUES(updated_ms)",
			[]any{pos[db], now}
	}
	var b sqlBatch
	for _, db := range dbs {
		q, args := upsert(db)
		b.add(q, args...)
	}
	q, args := b.sql()
	_, err := m.db.ExecContext(ctx, q, args...)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		err = nil
		for _, db := range dbs {
			q, args := upsert(db)
			_, e := m.db.ExecContext(ctx, q, args...)
			if isMySQLErr(e, errNoSuchTable) {
				if _, e = m.db.ExecContext(ctx, m.relayPosDDL(db)); e == nil {
					_, e = m.db.ExecContext(ctx, q, args...)
				}
			}
			if e != nil && !isMySQLErr(e, errUnknownDB) {
				err = e
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("storage: save relay positions: %w", err)
	}
	return nil
}
