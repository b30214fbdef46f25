package memstore

import (
	"context"
	"slices"

	"redcell/internal/invariant"
	"redcell/model"
)

// writeSendLocked writes a send's flow and its new packet, open, in the
// packet table of ref's shard and day. s.mu must be held.
func (s *Store) writeSendLocked(ref model.PacketRef, out model.SendOutcome) {
	s.writeFlowLocked(ref.Shard, out.Flow)
	pk := &packet{p: out.Packet, ref: ref, byUser: map[string]int{}}
	s.packets[out.Packet.ID] = pk
	t := s.tableLocked(tableKey{ref.Shard, ref.Day})
	t.packets = append(t.packets, pk)
	t.open[out.Packet.ID] = pk
}

// tableLocked returns the table of k, made on first use. s.mu must be held.
func (s *Store) tableLocked(k tableKey) *table {
	t, ok := s.tables[k]
	if !ok {
		t = &table{open: map[model.PacketID]*packet{}}
		s.tables[k] = t
	}
	return t
}

// readPacket answers storage.PacketQuery.
func (s *Store) readPacket(ctx context.Context, ref model.PacketRef) (model.Packet, error) {
	if err := ctx.Err(); err != nil {
		return model.Packet{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pk, ok := s.packets[ref.ID]
	if !ok {
		return model.Packet{}, model.Errorf(model.ErrNotFound, "red packet %s not found", ref.ID)
	}
	return pk.p, nil
}

// packetClaims answers storage.ClaimsQuery.
func (s *Store) packetClaims(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pk, ok := s.packets[ref.ID]
	if !ok || afterSeq >= int64(len(pk.claims)) || limit <= 0 {
		return nil, nil
	}
	from := max(afterSeq, 0)
	to := min(from+int64(limit), int64(len(pk.claims)))
	return slices.Clone(pk.claims[from:to]), nil
}

// writeOpenLocked writes an open's new claims, each owed to the shard its
// credit names (ActShard), and the packet after. s.mu must be held.
func (s *Store) writeOpenLocked(pk *packet, out model.OpenOutcome) {
	for i, c := range out.Fresh {
		invariant.That(c.Seq == int64(len(pk.claims))+1, "claim out of seq order")
		_, dup := pk.byUser[c.ActID]
		invariant.That(!dup, "a second claim for one user")
		pk.byUser[c.ActID] = len(pk.claims)
		pk.claims = append(pk.claims, c)
		s.indexClaimLocked(pk, len(pk.claims)-1, out.Credits[i].Shard)
	}
	pk.p = out.Packet
	if pk.p.Status != model.StatusOpen {
		delete(s.tables[tableKey{pk.ref.Shard, pk.ref.Day}].open, pk.p.ID)
	}
}

// claimsOfLocked returns the claims the requests' users hold. s.mu must be held.
func (pk *packet) claimsOfLocked(reqs []model.OpenRequest) map[string]model.Claim {
	held := make(map[string]model.Claim)
	for _, rq := range reqs {
		if i, ok := pk.byUser[rq.ActID]; ok {
			held[rq.ActID] = pk.claims[i]
		}
	}
	return held
}

// claimsOfPacket answers storage.ClaimsOfQuery.
func (s *Store) claimsOfPacket(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pk, ok := s.packets[ref.ID]
	if !ok {
		return map[string]model.Claim{}, nil
	}
	return pk.claimsOfLocked(reqs), nil
}

// expiredIn answers storage.ExpiredQuery. It lists the packets by ID, so a
// limit below the number expired picks the same ones every time.
func (s *Store) expiredIn(ctx context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []model.PacketID
	for _, k := range s.tableKeysLocked(shards, days) {
		for id, pk := range s.tables[k].open {
			if pk.p.ExpiresMS <= nowMS {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	if len(out) > limit {
		out = out[:max(limit, 0)]
	}
	return out, nil
}

// tableKeysLocked lists the tables of shards × days that hold packets, each
// once, in (shard, day) order. s.mu must be held.
func (s *Store) tableKeysLocked(shards []model.ShardID, days []int) []tableKey {
	var keys []tableKey
	seen := make(map[tableKey]bool, len(shards)*len(days))
	for _, sh := range shards {
		for _, d := range days {
			k := tableKey{sh, d}
			if _, ok := s.tables[k]; ok && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	slices.SortFunc(keys, func(a, b tableKey) int {
		if a.shard != b.shard {
			return int(a.shard) - int(b.shard)
		}
		return a.day - b.day
	})
	return keys
}

// writeRefundLocked writes a refund that is due: its flow and balance, and
// the packet refunded (no longer open). s.mu is held.
func (s *Store) writeRefundLocked(pk *packet, out model.RefundOutcome) {
	s.writeFlowLocked(pk.ref.Shard, out.Flow)
	pk.p = out.Packet
	delete(s.tables[tableKey{pk.ref.Shard, pk.ref.Day}].open, pk.p.ID)
}
