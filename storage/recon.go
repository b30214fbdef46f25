package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"

	"redcell/model"
)

// reconRowsFactor bounds the rows one ReconWindow statement may return, as a
// multiple of its outbox limit: claims and outbox rows of a window match one
// to one unless the books are broken, so more than this means they are badly.
const reconRowsFactor = 4

// ReconWindow reads what reconciliation compares for database db (0..99): the
// claims created in [fromMS, toMS) in the claim tables of shards (all of db)
// for the given days of month, and db's outbox rows created in the same
// window. Both come from one statement, so from one consistent read: a claim
// and its outbox row commit together, and the read sees both or neither.
//
// When the window holds more than limit outbox rows it is cut short at the
// creation time of the first row past the limit (never below fromMS+1, so one
// millisecond's rows are read whole however many); the result's ToMS says
// where it ended. A window holding more than 4×limit rows in all is an error:
// its claims and outbox rows then disagree by more than a window's worth.
func (m *MySQL) ReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error) {
	w := model.ReconWindow{FromMS: fromMS, ToMS: toMS, Claims: map[string]model.Claim{}, Outbox: map[string]model.OutboxRow{}}
	for _, s := range shards {
		if s.DB() != db {
			return w, fmt.Errorf("storage: recon window: shard %d is not in db %d", s, db)
		}
	}
	var cut int64
	err := m.db.QueryRowContext(ctx, "SELECT created_ms FROM "+m.outboxTable(db)+
		" WHERE state IN (0, 1) AND created_ms >= ? AND created_ms < ? ORDER BY created_ms LIMIT 1 OFFSET ?",
		fromMS, toMS, limit).Scan(&cut)
	switch {
	case isMySQLErr(err, errNoSuchTable):
		return w, nil // no shard of db was ever used: no claims either
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return w, fmt.Errorf("storage: recon window of db %d: %w", db, err)
	default:
		w.ToMS = max(cut, fromMS+1)
	}
	for attempt := 0; ; attempt++ {
		err = m.readReconWindow(ctx, db, shards, days, limit, &w)
		if !isMySQLErr(err, errNoSuchTable) || attempt == 1 {
			break
		}
		m.forgetTables() // a table in the cached list went away; read the list again
		clear(w.Claims)
		clear(w.Outbox)
	}
	if err != nil {
		return w, fmt.Errorf("storage: recon window of db %d: %w", db, err)
	}
	return w, nil
}

func (m *MySQL) readReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, limit int, w *model.ReconWindow) error {
	tables, err := m.dayTables(ctx)
	if err != nil {
		return err
	}
	want := map[tableRef]bool{}
	for _, s := range shards {
		for _, d := range days {
			want[tableRef{kind: "claim", shard: s, day: d}] = true
		}
	}
	// Every part returns: kind, packet or claim ID, act_id, shard (outbox) or
	// seq (claim), amount, state, created_ms.
	parts := []string{"(SELECT 'o', claim_id, act_id, act_shard, amount, state, created_ms FROM " + m.outboxTable(db) +
		" WHERE state IN (0, 1) AND created_ms >= ? AND created_ms < ?)"}
	args := []any{w.FromMS, w.ToMS}
	for _, t := range tables {
		if want[t] {
			parts = append(parts, "(SELECT 'c', packet_id, act_id, seq, amount, 0, created_ms FROM "+m.claimTable(t.shard, t.day)+
				" WHERE created_ms >= ? AND created_ms < ?)")
			args = append(args, w.FromMS, w.ToMS)
		}
	}
	maxRows := reconRowsFactor * limit
	args = append(args, maxRows+1)
	rows, err := m.db.QueryContext(ctx, strings.Join(parts, " UNION ALL ")+" LIMIT ?", args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		if n++; n > maxRows {
			return fmt.Errorf("window [%d, %d) holds more than %d claims and outbox rows", w.FromMS, w.ToMS, maxRows)
		}
		var kind, id, act string
		var num, amount, createdMS int64
		var state int
		if err := rows.Scan(&kind, &id, &act, &num, &amount, &state, &createdMS); err != nil {
			return err
		}
		if kind == "o" {
			w.Outbox[id] = model.OutboxRow{ClaimID: id, ActID: act, Shard: model.ShardID(num), Amount: model.Cents(amount),
				Delivered: state == 1, CreatedMS: createdMS}
			continue
		}
		c := model.Claim{ID: model.ClaimID(model.PacketID(id), num), PacketID: model.PacketID(id), Seq: num, ActID: act,
			Amount: model.Cents(amount), CreatedMS: createdMS}
		w.Claims[c.ID] = c
	}
	return rows.Err()
}

// CreditsOf returns the credit flows booked in this store for the given
// claims, by claim ID, as they are (account and amount), so the caller can
// compare them with the claims. Credits whose claimant's shard is not in this
// store's databases are not found. At most 10,000 credits per call.
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
		if err := m.EnsureShard(ctx, s); err != nil {
			return nil, err
		}
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	found := map[string]model.Credit{}
	for start := 0; start < len(shards); start += ledgerChunk {
		var parts []string
		var args []any
		for _, s := range shards[start:min(start+ledgerChunk, len(shards))] {
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
		if err := m.readCredits(ctx, strings.Join(parts, " UNION ALL "), args, found); err != nil {
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
		found[c.ClaimID] = c
	}
	return rows.Err()
}
