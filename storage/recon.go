package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"redcell/internal/retry"
	"redcell/model"
)

// reconWindow reads what reconciliation compares for database db (0..99): the
// claims created in [fromMS, toMS) in the claim tables of shards (all of db)
// for the given days of month (and the archive's, for a window older than
// ArchivedClaimsAge), each with the credit it owes: its claimant's shard
// (ActShard; a row made before the column existed gets
// sharding.ShardOfAct(act_id)) and Dest. They come from one statement, a
// UNION ALL of the claim tables, each read by its k_created index.
//
// A window is read whole when it holds at most limit claims. A bigger one is
// cut short at the creation time of the claim past limit (never below
// fromMS+1, so one millisecond's claims are read whole however many) and
// read again; the result's ToMS says where it ended. If the cut window then
// holds more than 2×limit claims (claims appeared in it between the two
// reads), that is an error, and the window is read again by the next pass.
// A database none of whose claim tables exists reads empty.
func (m *MySQL) reconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error) {
	w := model.ReconWindow{FromMS: fromMS, ToMS: toMS, Claims: map[string]model.Claim{}}
	for _, s := range shards {
		if s.DB() != db {
			return w, fmt.Errorf("storage: recon window: shard %d is not in db %d", s, db)
		}
	}
	if limit < 1 {
		return w, fmt.Errorf("storage: recon window: limit %d", limit)
	}
	if fromMS < m.nowMS()-ArchivedClaimsAge.Milliseconds() {
		// A window this old may hold claims the archive moved.
		days = append(slices.Clone(days), ArchiveDay)
	}
	err := m.readReconWindowRetry(ctx, shards, days, limit, &w)
	if errors.Is(err, errWindowFull) {
		var cut int64
		if cut, err = m.reconCut(ctx, shards, days, fromMS, toMS, limit); err == nil {
			w.ToMS = max(cut, fromMS+1)
			maxRows := 2 * limit
			if w.ToMS == fromMS+1 {
				maxRows = math.MaxInt - 1 // one millisecond is read whole
			}
			err = m.readReconWindowRetry(ctx, shards, days, maxRows, &w)
		}
	}
	if err != nil {
		return w, fmt.Errorf("storage: recon window of db %d: %w", db, err)
	}
	return w, nil
}

// errWindowFull: a recon window holds more claims than a read takes.
var errWindowFull = errors.New("storage: recon window holds too many claims")

// retryMissing runs read, and when a table in the cached list went away
// (a shard handed over) reads the list again and runs it once more.
func (m *MySQL) retryMissing(ctx context.Context, read func() error) error {
	missing := func(err error) bool { return isMySQLErr(err, errNoSuchTable) }
	return retry.Do(ctx, retry.Policy{Attempts: 2, Retryable: missing, Clock: m.clock}, func(int) error {
		err := read()
		if missing(err) {
			m.forgetTables()
		}
		return err
	})
}

// reconCut returns the creation time of the claim past limit in [fromMS,
// toMS) (toMS when there is none): each table gives its first limit+1 claims
// by k_created, and the server picks from those.
func (m *MySQL) reconCut(ctx context.Context, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (int64, error) {
	cut := toMS
	err := m.retryMissing(ctx, func() error {
		tables, err := m.dayTablesOf(ctx, "claim", shards, days)
		if err != nil || len(tables) == 0 {
			return err
		}
		var u union
		for _, t := range tables {
			u.add("SELECT created_ms FROM "+m.claimTable(t.shard, t.day)+" WHERE created_ms >= ? AND created_ms < ? ORDER BY created_ms LIMIT ?",
				fromMS, toMS, limit+1)
		}
		q, args := u.sql()
		err = m.db.QueryRowContext(ctx, "SELECT created_ms FROM ("+q+") u ORDER BY created_ms LIMIT 1 OFFSET ?", append(args, limit)...).Scan(&cut)
		if errors.Is(err, sql.ErrNoRows) { // fewer claims now than the read found: it is read again whole
			cut, err = toMS, nil
		}
		return err
	})
	return cut, err
}

// readReconWindowRetry reads the window's claims in one statement, at most
// maxRows of them (errWindowFull past that).
func (m *MySQL) readReconWindowRetry(ctx context.Context, shards []model.ShardID, days []int, maxRows int, w *model.ReconWindow) error {
	return m.retryMissing(ctx, func() error {
		clear(w.Claims)
		tables, err := m.dayTablesOf(ctx, "claim", shards, days)
		if err != nil || len(tables) == 0 {
			return err // none: no shard of db was ever used on these days
		}
		var u union
		for _, t := range tables {
			u.add("SELECT "+claimCreditCols+" FROM "+m.claimTable(t.shard, t.day)+" WHERE created_ms >= ? AND created_ms < ?", w.FromMS, w.ToMS)
		}
		q, args := u.sql()
		rows, err := m.db.QueryContext(ctx, q+" LIMIT ?", append(args, maxRows+1)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for n := 0; rows.Next(); n++ {
			if n >= maxRows {
				return fmt.Errorf("window [%d, %d) holds more than %d claims: %w", w.FromMS, w.ToMS, maxRows, errWindowFull)
			}
			c, pos, err := scanClaimCredit(rows)
			if err != nil {
				return err
			}
			w.Claims[c.ClaimID] = model.Claim{ID: c.ClaimID, PacketID: c.PacketID, Seq: pos.Seq, ActID: c.ActID, Amount: c.Amount,
				CreatedMS: c.CreatedMS, ActShard: c.Shard, Dest: c.Dest}
		}
		return rows.Err()
	})
}

// creditsOf returns the credit flows booked in this store for the given
// claims, by claim ID, as they are (account and amount), so the caller can
// compare them with the claims; a claim credited to two of the accounts asked
// about comes back with the two amounts summed. Credits whose claimant's shard
// is not in this store's databases are not found. At most 10,000 credits per call.
func (m *MySQL) creditsOf(ctx context.Context, credits []model.Credit) (map[string]model.Credit, error) {
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

// reconPositions returns, by database (0..99), where reconciliation has
// checked up to as last saved: claims created before that Unix ms have been
// checked. A database never saved is absent; a store never saved reads empty.
func (m *MySQL) reconPositions(ctx context.Context) (map[int]int64, error) {
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

// saveReconPositions records, in one statement, where reconciliation has
// checked up to for each database in pos (database 0..99 -> Unix ms). A
// position never moves back: saving one below what is stored keeps the stored
// one, so a save repeated or replayed out of order changes nothing. The table
// is made on first use.
func (m *MySQL) saveReconPositions(ctx context.Context, pos map[int]int64) error {
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
