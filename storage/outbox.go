package storage

import (
	"context"
	"fmt"

	"redcell/model"
)

// PendingCredits lists up to limit outbox rows of database db (0..99) not yet
// delivered, created at or before beforeMS (Unix ms) and after the position
// (afterMS, afterID), in (created_ms, claim_id) order. next is the position of
// the last row returned, to page on from.
func (m *MySQL) PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) ([]model.Credit, model.OutboxPos, error) {
	var next model.OutboxPos
	rows, err := m.db.QueryContext(ctx, "SELECT claim_id, packet_id, act_id, act_shard, amount, created_ms FROM "+m.outboxTable(db)+
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
		if err := rows.Scan(&c.ClaimID, &c.PacketID, &c.ActID, &c.Shard, &c.Amount, &next.CreatedMS); err != nil {
			return nil, next, err
		}
		next.ClaimID = c.ClaimID
		out = append(out, c)
	}
	return out, next, rows.Err()
}

// MarkDelivered marks outbox rows as delivered once the claimant's cell has
// applied them. Marking twice is harmless.
func (m *MySQL) MarkDelivered(ctx context.Context, credits []model.Credit) error {
	byDB := map[int][]any{}
	for _, c := range credits {
		ref, _, err := model.ParseClaimID(c.ClaimID)
		if err != nil {
			return fmt.Errorf("storage: mark delivered: %w", err)
		}
		byDB[ref.Shard.DB()] = append(byDB[ref.Shard.DB()], c.ClaimID)
	}
	now := m.now().UnixMilli()
	for db, ids := range byDB {
		args := append([]any{now}, ids...)
		if _, err := m.db.ExecContext(ctx, "UPDATE "+m.outboxTable(db)+" SET state = 1, delivered_ms = ? WHERE state = 0 AND claim_id IN ("+
			placeholders(len(ids))+")", args...); err != nil {
			return fmt.Errorf("storage: mark delivered: %w", err)
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
		oldestMS = m.now().UnixMilli() - *oldest
	}
	return pending, oldestMS, nil
}
