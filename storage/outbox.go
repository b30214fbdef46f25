package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"maps"
	"slices"
	"strings"

	"redcell/model"
)

// PendingCredits lists up to limit outbox rows of database db (0..99) not yet
// delivered, created at or before beforeMS (Unix ms) and after the position
// (afterMS, afterID), in (created_ms, claim_id) order, each with its
// CreatedMS and Dest. next is the position of the last row returned, to page on from.
func (m *MySQL) PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) ([]model.Credit, model.OutboxPos, error) {
	var next model.OutboxPos
	rows, err := m.db.QueryContext(ctx, "SELECT claim_id, packet_id, act_id, act_shard, amount, created_ms, dest FROM "+m.outboxTable(db)+
		" WHERE state = 0 AND created_ms <= ? AND (created_ms > ? OR (created_ms = ? AND claim_id > ?)) ORDER BY created_ms, claim_id LIMIT ?",
		beforeMS, afterMS, afterMS, afterID, limit)
	if isMySQLErr(err, errNoSuchTable) {
		return nil, next, nil
	}
	if err != nil {
		return nil, next, fmt.Errorf("storage: read outbox: %w", err)
	}
	defer rows.Close()
	var out []model.Credit
	for rows.Next() {
		var c model.Credit
		if err := rows.Scan(&c.ClaimID, &c.PacketID, &c.ActID, &c.Shard, &c.Amount, &c.CreatedMS, &c.Dest); err != nil {
			return nil, next, err
		}
		next = model.OutboxPos{CreatedMS: c.CreatedMS, ClaimID: c.ClaimID}
		out = append(out, c)
	}
	return out, next, rows.Err()
}

// MarkDelivered marks outbox rows as delivered once the claimant's cell has
// applied them, and records where: each row's dest becomes its credit's Dest
// (kept when that is ""). Marking twice is harmless. The relay calls it once per
// delivered batch, whose claims come from packets of many databases.
//
// The common case (every row pending, none locked) is one round trip
// (markAll): one READ COMMITTED transaction of one UPDATE per database and
// dest, none waiting for a lock, sent as one statement list with its COMMIT;
// a batch of one database and dest (a hot packet's credits) is that UPDATE
// alone, its own transaction under the session's REPEATABLE READ, three
// statements fewer (a row of it another transaction holds, even one marked
// before, then fails it whole, and the exact path below marks the rest).
// The databases where that marked fewer rows than named (rows marked before,
// or gone), or all of them when a row was locked, are marked again exactly,
// in one READ COMMITTED transaction, two statements per database, in
// database order: per database it locks the rows it can (SELECT ... FOR
// UPDATE SKIP LOCKED) and marks those. It never waits for a row another
// transaction holds locked. skipped counts the rows left pending because
// they were locked (or are gone); the relay delivers those again later,
// which the receiver ignores. An error marks nothing the fast path had not
// committed (rows marked are marked rightly either way).
func (m *MySQL) MarkDelivered(ctx context.Context, credits []model.Credit) (skipped int, err error) {
	byDB := map[int][]any{}
	dest := make(map[string]string, len(credits))
	for _, c := range credits {
		ref, _, err := model.ParseClaimID(c.ClaimID)
		if err != nil {
			return 0, fmt.Errorf("storage: mark delivered: %w", err)
		}
		byDB[ref.Shard.DB()] = append(byDB[ref.Shard.DB()], c.ClaimID)
		dest[c.ClaimID] = c.Dest
	}
	if len(byDB) == 0 {
		return 0, nil
	}
	again, err := m.markAll(ctx, byDB, dest)
	if err != nil {
		return 0, fmt.Errorf("storage: mark delivered: %w", err)
	}
	if len(again) == 0 {
		return 0, nil
	}
	// READ COMMITTED: the locking reads take the rows they find, never a gap.
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("storage: mark delivered: %w", err)
	}
	defer tx.Rollback()
	for _, db := range again {
		ids := byDB[db]
		locked, err := m.markIn(ctx, tx, db, ids, dest)
		if err != nil {
			return 0, fmt.Errorf("storage: mark delivered: %w", err)
		}
		skipped += len(ids) - locked
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("storage: mark delivered: commit: %w", err)
	}
	return skipped, nil
}

// markAll is MarkDelivered's one round trip: SET TRANSACTION ISOLATION LEVEL
// READ COMMITTED, START TRANSACTION, per database (in order) and dest one
// UPDATE of the pending rows named (without waiting for a lock: noWait),
// COMMIT, as one statement list on a connection of its own; a single UPDATE
// is sent alone, in autocommit. It returns the
// databases (in order) to mark again exactly: those whose UPDATEs changed
// fewer rows than they name (committed: what they changed is marked), or,
// when a row was locked, every database (rolled back: nothing marked).
func (m *MySQL) markAll(ctx context.Context, byDB map[int][]any, dest map[string]string) (again []int, err error) {
	dbs := slices.Sorted(maps.Keys(byDB))
	var updates []string
	var args []any
	type part struct{ db, n int }
	var parts []part // one per UPDATE, in order
	now := m.nowMS()
	for _, db := range dbs {
		mine := map[string][]any{} // by dest
		for _, id := range byDB[db] {
			d := dest[id.(string)]
			mine[d] = append(mine[d], id)
		}
		for _, d := range slices.Sorted(maps.Keys(mine)) {
			ids := mine[d]
			set := "SET state = 1, delivered_ms = ?"
			args = append(args, now)
			if d != "" {
				set += ", dest = ?"
				args = append(args, d)
			}
			updates = append(updates, noWait+"UPDATE "+m.outboxTable(db)+" "+set+" WHERE state = 0 AND claim_id IN ("+placeholders(len(ids))+")")
			args = append(args, ids...)
			parts = append(parts, part{db, len(ids)})
		}
	}
	// One UPDATE goes alone: autocommit makes it its own transaction, and
	// a lock it would wait for rolls back that statement, all of it.
	list, head, tail := updates[0], 0, 0 // head, tail: statements around the UPDATEs
	if len(updates) > 1 {
		list = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;" + strings.Join(updates, ";") + "; COMMIT"
		head, tail = 2, 1
	}
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	counts, err := execList(ctx, conn, list, args...)
	if err != nil {
		// The list stopped at the failing statement, inside its transaction
		// when START TRANSACTION ran: roll it back, or drop the connection.
		// (A lone UPDATE in autocommit was rolled back with its statement.)
		if head > 0 {
			if _, rerr := conn.ExecContext(ctx, "ROLLBACK"); rerr != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}
		if isMySQLErr(err, errLockWait) {
			return dbs, nil
		}
		return nil, err
	}
	if want := head + len(parts) + tail; len(counts) != want {
		return nil, fmt.Errorf("storage: mark delivered: %d statement counts for %d statements", len(counts), want)
	}
	short := map[int]bool{}
	for i, p := range parts {
		if counts[head+i] != int64(p.n) {
			short[p.db] = true
		}
	}
	for _, db := range dbs {
		if short[db] {
			again = append(again, db)
		}
	}
	return again, nil
}

// markIn marks, inside tx, the rows of outbox db named by ids that no other
// transaction holds, each with its dest (by claim ID; "" keeps the row's),
// and returns how many it held (marked now or before). One UPDATE per
// distinct dest: a lane's batch has one.
func (m *MySQL) markIn(ctx context.Context, tx *sql.Tx, db int, ids []any, dest map[string]string) (int, error) {
	rows, err := tx.QueryContext(ctx, "SELECT claim_id FROM "+m.outboxTable(db)+" WHERE claim_id IN ("+placeholders(len(ids))+") FOR UPDATE SKIP LOCKED", ids...)
	if err != nil {
		return 0, err
	}
	mine := map[string][]any{} // by dest
	n := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		mine[dest[id]] = append(mine[dest[id]], id)
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	// The rows are this transaction's now; the UPDATE may still wait a moment
	// to insert into the k_pending index (another transaction's gap lock
	// there), bounded by ctx. Without waiting it failed under a light bench.
	now := m.nowMS()
	for _, d := range slices.Sorted(maps.Keys(mine)) {
		ids := mine[d]
		set, args := "SET state = 1, delivered_ms = ?", []any{now}
		if d != "" {
			set, args = set+", dest = ?", append(args, d)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+m.outboxTable(db)+" "+set+" WHERE state = 0 AND claim_id IN ("+
			placeholders(len(ids))+")", append(args, ids...)...); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// SendTo implements Outbox: one UPDATE per outbox database, autocommit.
func (m *MySQL) SendTo(ctx context.Context, credits []model.Credit, dest string) error {
	byDB := map[int][]any{}
	for _, c := range credits {
		ref, _, err := model.ParseClaimID(c.ClaimID)
		if err != nil {
			return fmt.Errorf("storage: send to: %w", err)
		}
		byDB[ref.Shard.DB()] = append(byDB[ref.Shard.DB()], c.ClaimID)
	}
	for _, db := range slices.Sorted(maps.Keys(byDB)) {
		ids := byDB[db]
		if _, err := m.db.ExecContext(ctx, "UPDATE "+m.outboxTable(db)+" SET dest = ? WHERE state = 0 AND claim_id IN ("+
			placeholders(len(ids))+")", append([]any{dest}, ids...)...); err != nil {
			return fmt.Errorf("storage: send to: %w", err)
		}
	}
	return nil
}

// OutboxLag counts undelivered outbox rows of database db and the age of the
// oldest in ms (0 when empty).
func (m *MySQL) OutboxLag(ctx context.Context, db int) (pending int64, oldestMS int64, err error) {
	var oldest *int64
	err = m.db.QueryRowContext(ctx, "SELECT COUNT(*), MIN(created_ms) FROM "+m.outboxTable(db)+" WHERE state = 0").Scan(&pending, &oldest)
	if isMySQLErr(err, errNoSuchTable) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("storage: outbox lag: %w", err)
	}
	if oldest != nil {
		oldestMS = m.nowMS() - *oldest
	}
	return pending, oldestMS, nil
}
