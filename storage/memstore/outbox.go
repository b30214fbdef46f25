package memstore

import (
	"context"
	"fmt"
	"sort"

	"redcell/internal/invariant"
	"redcell/model"
)

// before orders outbox rows by (CreatedMS, ClaimID), the outbox's paging order.
func before(aMS int64, aID string, bMS int64, bID string) bool {
	return aMS < bMS || aMS == bMS && aID < bID
}

// SetCreditDest implements storage.MySQL's SetCreditDest: how a new outbox
// row names the cell its credit goes to (nil: "").
func (s *Store) SetCreditDest(dest func(model.ShardID) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dest = dest
}

// addOutboxLocked writes a new outbox row of database db, pending, with its
// dest (SetCreditDest). s.mu must be held.
func (s *Store) addOutboxLocked(e *entry, db int) {
	if s.dest != nil {
		e.dest = s.dest(e.row.Shard)
	}
	rows, ok := s.outbox[db]
	if !ok {
		rows = map[string]*entry{}
		s.outbox[db] = rows
	}
	_, dup := rows[e.row.ClaimID]
	invariant.That(!dup, "outbox row written twice")
	rows[e.row.ClaimID] = e
	// Rows come mostly in creation order: the search usually ends at the tail.
	list := s.pending[db]
	i := sort.Search(len(list), func(i int) bool {
		return before(e.row.CreatedMS, e.row.ClaimID, list[i].row.CreatedMS, list[i].row.ClaimID)
	})
	list = append(list, nil)
	copy(list[i+1:], list[i:])
	list[i] = e
	s.pending[db] = list
}

// PendingCredits implements storage.Outbox.
func (s *Store) PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) ([]model.Credit, model.OutboxPos, error) {
	var next model.OutboxPos
	if err := ctx.Err(); err != nil {
		return nil, next, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.pending[db]
	i := sort.Search(len(list), func(i int) bool { return before(afterMS, afterID, list[i].row.CreatedMS, list[i].row.ClaimID) })
	var out []model.Credit
	for ; i < len(list) && len(out) < limit && list[i].row.CreatedMS <= beforeMS; i++ {
		o := list[i].row
		out = append(out, model.Credit{ClaimID: o.ClaimID, PacketID: list[i].pid, ActID: o.ActID, Shard: o.Shard, Amount: o.Amount, CreatedMS: o.CreatedMS, Dest: list[i].dest})
		next = model.OutboxPos{CreatedMS: o.CreatedMS, ClaimID: o.ClaimID}
	}
	return out, next, nil
}

// MarkDelivered implements storage.Outbox. No row is ever held by another
// call: skipped counts only rows not found.
func (s *Store) MarkDelivered(ctx context.Context, credits []model.Credit) (skipped int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	for _, c := range credits {
		if _, _, err := model.ParseClaimID(c.ClaimID); err != nil {
			return 0, fmt.Errorf("memstore: mark delivered: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range credits {
		ref, _, _ := model.ParseClaimID(c.ClaimID)
		db := ref.Shard.DB()
		e, ok := s.outbox[db][c.ClaimID]
		if !ok {
			skipped++
			continue
		}
		if e.row.Delivered {
			continue
		}
		e.row.Delivered = true
		if c.Dest != "" {
			e.dest = c.Dest
		}
		list := s.pending[db]
		i := sort.Search(len(list), func(i int) bool {
			return !before(list[i].row.CreatedMS, list[i].row.ClaimID, e.row.CreatedMS, e.row.ClaimID)
		})
		invariant.That(i < len(list) && list[i] == e, "pending outbox row not in the pending list")
		s.pending[db] = append(list[:i], list[i+1:]...)
	}
	return skipped, nil
}

// SendTo implements storage.Outbox.
func (s *Store) SendTo(ctx context.Context, credits []model.Credit, dest string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, c := range credits {
		if _, _, err := model.ParseClaimID(c.ClaimID); err != nil {
			return fmt.Errorf("memstore: send to: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range credits {
		ref, _, _ := model.ParseClaimID(c.ClaimID)
		if e, ok := s.outbox[ref.Shard.DB()][c.ClaimID]; ok && !e.row.Delivered {
			e.dest = dest
		}
	}
	return nil
}

// OutboxLag implements storage.Outbox.
func (s *Store) OutboxLag(ctx context.Context, db int) (pending int64, oldestMS int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.pending[db]
	if len(list) == 0 {
		return 0, 0, nil
	}
	// The oldest by creation time is the first: the list is in that order.
	return int64(len(list)), s.nowMS() - list[0].row.CreatedMS, nil
}
