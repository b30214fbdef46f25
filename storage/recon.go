package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"redcell/internal/retry"
	"redcell/model"
)

// ReconWindow reads what reconciliation compares for database db (0..99): the
// claims created in [fromMS, toMS) in the claim tables of shards (all of db)
// for the given days of month (and the archive's, for a window older than
// ArchivedClaimsAge), and db's outbox rows created in the same window. Both come from one statement, so from one consistent read: a claim
// and its outbox row commit together, and the read sees both or neither.
//
// A window is read whole when it holds at most 2×limit rows (claims and outbox
// rows together, about limit of each). A bigger one is cut short at the
// creation time of the first outbox row past limit (never below fromMS+1, so
// one millisecond's rows are read whole however many) and read again; the
// result's ToMS says where it ended. If the cut window still holds more than
// 4×limit rows, its claims and outbox rows disagree by more than a window's
// worth, and that is an error.
func (m *MySQL) ReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error) {
	w := model.ReconWindow{FromMS: fromMS, ToMS: toMS, Claims: map[string]model.Claim{}, Outbox: map[string]model.OutboxRow{}}
	for _, s := range shards {
		if s.DB() != db {
			return w, fmt.Errorf("storage: recon window: shard %d is not in db %d", s, db)
		}
	}
	if fromMS < m.nowMS()-ArchivedClaimsAge.Milliseconds() {
		// A window this old may hold claims the archive moved.
		days = append(slices.Clone(days), ArchiveDay)
	}
	err := m.readReconWindowRetry(ctx, db, shards, days, 2*limit, &w)
	if errors.Is(err, errWindowFull) {
		var cut int64
		err = m.db.QueryRowContext(ctx, "SELECT created_ms FROM "+m.outboxTable(db)+
			" WHERE state IN (0, 1) AND created_ms >= ? AND created_ms < ? ORDER BY created_ms LIMIT 1 OFFSET ?",
			fromMS, toMS, limit).Scan(&cut)
		if err == nil || errors.Is(err, sql.ErrNoRows) { // no row: the claims, not the outbox, filled the window
			if err == nil {
				w.ToMS = max(cut, fromMS+1)
			}
			err = m.readReconWindowRetry(ctx, db, shards, days, 4*limit, &w)
		}
	}
	if errors.Is(err, errNoOutbox) {
		return w, nil // no shard of db was ever used: nothing to read
	}
	if err != nil {
		return w, fmt.Errorf("storage: recon window of db %d: %w", db, err)
	}
	return w, nil
}

// Why a window was not read.
var (
	errWindowFull = errors.New("storage: recon window holds too many rows")
	errNoOutbox   = errors.New("storage: no outbox table")
)

// readReconWindowRetry reads the window; when a claim table in the cached list
// went away it reads the list again and retries once. errNoOutbox: the
// database has no outbox table and no claim table is known in it.
func (m *MySQL) readReconWindowRetry(ctx context.Context, db int, shards []model.ShardID, days []int, maxRows int, w *model.ReconWindow) error {
	missing := func(err error) bool { return isMySQLErr(err, errNoSuchTable) }
	return retry.Do(ctx, retry.Policy{Attempts: 2, Retryable: missing, Clock: m.clock}, func(int) error {
		clear(w.Claims)
		clear(w.Outbox)
		claimTables, err := m.readReconWindow(ctx, db, shards, days, maxRows, w)
		if !missing(err) {
			return err
		}
		if claimTables == 0 {
			// Only the outbox was read, so it is what is missing; the claim
			// tables of a shard are made after its outbox, so none exist either.
			return errNoOutbox
		}
		m.forgetTables()
		return err
	})
}

// readReconWindow reads the window in one statement and returns how many
// claim tables it read.
func (m *MySQL) readReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, maxRows int, w *model.ReconWindow) (int, error) {
	tables, err := m.dayTables(ctx)
	if err != nil {
		return 0, err
	}
	want := map[tableRef]bool{}
	for _, s := range shards {
		for _, d := range days {
			want[tableRef{kind: "claim", shard: s, day: d}] = true
		}
	}
	// Every part returns: kind, claim or packet ID, act_id, shard (outbox) or
	// seq (claim), amount, state, created_ms, dest (outbox; '' for claims).
	parts := []string{"(SELECT 'o', claim_id, act_id, act_shard, amount, state, created_ms, dest FROM " + m.outboxTable(db) +
		" WHERE state IN (0, 1) AND created_ms >= ? AND created_ms < ?)"}
	args := []any{w.FromMS, w.ToMS}
	for _, t := range tables {
		if want[t] {
			parts = append(parts, "(SELECT 'c', packet_id, act_id, seq, amount, 0, created_ms, '' FROM "+m.claimTable(t.shard, t.day)+
				" WHERE created_ms >= ? AND created_ms < ?)")
			args = append(args, w.FromMS, w.ToMS)
		}
	}
	args = append(args, maxRows+1)
	claimTables := len(parts) - 1
	rows, err := m.db.QueryContext(ctx, strings.Join(parts, " UNION ALL ")+" LIMIT ?", args...)
	if err != nil {
		return claimTables, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		if n++; n > maxRows {
			return claimTables, fmt.Errorf("window [%d, %d) holds more than %d claims and outbox rows: %w", w.FromMS, w.ToMS, maxRows, errWindowFull)
		}
		var kind, id, act, dest string
		var num, amount, createdMS int64
		var state int
		if err := rows.Scan(&kind, &id, &act, &num, &amount, &state, &createdMS, &dest); err != nil {
			return claimTables, err
		}
		if kind == "o" {
			w.Outbox[id] = model.OutboxRow{ClaimID: id, ActID: act, Shard: model.ShardID(num), Amount: model.Cents(amount),
				Delivered: state == 1, CreatedMS: createdMS, Dest: dest}
			continue
		}
		c := model.Claim{ID: model.ClaimID(model.PacketID(id), num), PacketID: model.PacketID(id), Seq: num, ActID: act,
			Amount: model.Cents(amount), CreatedMS: createdMS}
		w.Claims[c.ID] = c
	}
	return claimTables, rows.Err()
}

// CreditsOf returns the credit flows booked in this store for the given
// claims, by claim ID, as they are (account and amount), so the caller can
// compare them with the claims; a claim credited to two of the accounts asked
// about comes back with the two amounts summed. Credits whose claimant's shard
// is not in this store's databases are not found. At most 10,000 credits per call.
func (m *MySQL) CreditsOf(ctx context.Context, credits []model.Credit) (map[string]model.Credit, error) {
	if len(credits) > 10_000 {
		return nil, fmt.Errorf("storage: credits of %d claims: at most 10000 per call", len(credits))
	}
	byShard := map[model.ShardID][]model.Credit{}
	for _, c := range credits {
		if !c.Shard.Valid() {
			return nil, fmt.Errorf("storage: credits of claim %s: shard %d out of range", c.ClaimID, c.Shard)
		}
		byShard[c.Shard] = append(byShard[c.Shard], c)
	}
	shards := make([]model.ShardID, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	found := map[string]model.Credit{}
	// It creates nothing: it also reads the copies a cell keeps of databases
	// it handed over, which must stay as they were. A flow table that does
	// not exist holds no credit.
	query := func(shards []model.ShardID) error {
		var parts []string
		var args []any
		for _, s := range shards {
			acts, orders := map[string]bool{}, make([]any, 0, len(byShard[s]))
			for _, c := range byShard[s] {
				acts[c.ActID] = true
				orders = append(orders, "claim:"+c.ClaimID)
			}
			parts = append(parts, "(SELECT act_id, order_no, amount FROM "+m.flowTable(s)+" WHERE kind = 'credit' AND act_id IN ("+
				placeholders(len(acts))+") AND order_no IN ("+placeholders(len(orders))+"))")
			for a := range acts {
				args = append(args, a)
			}
			args = append(args, orders...)
		}
		return m.readCredits(ctx, strings.Join(parts, " UNION ALL "), args, found)
	}
	absent := func(err error) bool { return isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) }
	for start := 0; start < len(shards); start += ledgerChunk {
		chunk := shards[start:min(start+ledgerChunk, len(shards))]
		err := query(chunk)
		if absent(err) { // some table is missing: each shard on its own, the missing ones skipped
			err = nil
			for _, s := range chunk {
				if e := query([]model.ShardID{s}); e != nil && !absent(e) {
					err = e
					break
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("storage: credits of claims: %w", err)
		}
	}
	return found, nil
}

func (m *MySQL) readCredits(ctx context.Context, query string, args []any, found map[string]model.Credit) error {
	rows, err := m.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c model.Credit
		var order string
		if err := rows.Scan(&c.ActID, &order, &c.Amount); err != nil {
			return err
		}
		c.ClaimID = strings.TrimPrefix(order, "claim:")
		if prev, twice := found[c.ClaimID]; twice {
			// One claim credited to two accounts: report the sum, which can
			// never equal the claim's amount, so the caller sees a mismatch.
			c.Amount += prev.Amount
		}
		found[c.ClaimID] = c
	}
	return rows.Err()
}

// reconTable is where reconciliation keeps its position per database: one
// small table per money space (the space's name prefix), in its own schema
// beside the db_XX schemas.
func (m *MySQL) reconTable() string { return m.ns + "redcell_meta.t_recon_position" }

// errUnknownDB: the schema does not exist (yet).
const errUnknownDB = 1049

// ReconPositions returns, by database (0..99), where reconciliation has
// checked up to as last saved: claims created before that Unix ms have been
// checked. A database never saved is absent; a store never saved reads empty.
func (m *MySQL) ReconPositions(ctx context.Context) (map[int]int64, error) {
	out := map[int]int64{}
	rows, err := m.db.QueryContext(ctx, "SELECT db, checked_ms FROM "+m.reconTable())
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: recon positions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var db int
		var ms int64
		if err := rows.Scan(&db, &ms); err != nil {
			return nil, fmt.Errorf("storage: recon positions: %w", err)
		}
		out[db] = ms
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: recon positions: %w", err)
	}
	return out, nil
}

// SaveReconPositions records, in one statement, where reconciliation has
// checked up to for each database in pos (database 0..99 -> Unix ms). A
// position never moves back: saving one below what is stored keeps the stored
// one, so a save repeated or replayed out of order changes nothing. The table
// is made on first use.
func (m *MySQL) SaveReconPositions(ctx context.Context, pos map[int]int64) error {
	if len(pos) == 0 {
		return nil
	}
	dbs := make([]int, 0, len(pos))
	for db := range pos {
		if db < 0 || db >= model.ShardCount/10 {
			return fmt.Errorf("storage: save recon position: database %d out of range", db)
		}
		dbs = append(dbs, db)
	}
	sort.Ints(dbs)
	now := m.clock.Now().UnixMilli()
	args := make([]any, 0, 3*len(dbs))
	for _, db := range dbs {
		args = append(args, db, pos[db], now)
	}
	q := "INSERT INTO " + m.reconTable() + " (db, checked_ms, updated_ms) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(dbs)), ", ") +
		" ON DUPLICATE KEY UPDATE updated_ms = IF(VALUES(checked_ms) > checked_ms, VALUES(updated_ms), updated_ms)," +
		" checked_ms = GREATEST(checked_ms, VALUES(checked_ms))"
	_, err := m.db.ExecContext(ctx, q, args...)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		if err = m.makeReconTable(ctx); err == nil {
			_, err = m.db.ExecContext(ctx, q, args...)
		}
	}
	if err != nil {
		return fmt.Errorf("storage: save recon positions: %w", err)
	}
	return nil
}

func (m *MySQL) makeReconTable(ctx context.Context) error {
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS " + m.ns + "redcell_meta" + dbDefaults,
		"CREATE TABLE IF NOT EXISTS " + m.reconTable() + ` (
  db         SMALLINT NOT NULL PRIMARY KEY,
  checked_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL
) ENGINE=InnoDB`,
	} {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
