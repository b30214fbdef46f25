package memstore

import (
	"context"
	"fmt"
	"maps"
	"sort"

	"redcell/internal/invariant"
	"redcell/model"
)

// claimAt is one claim in a database's relay index: claim i of packet pk.
type claimAt struct {
	pk *packet
	i  int
}

func (c claimAt) pos() model.ClaimPos {
	cl := c.pk.claims[c.i]
	return model.ClaimPos{CreatedMS: cl.CreatedMS, PacketID: cl.PacketID, Seq: cl.Seq}
}

// posBefore orders claim positions by (CreatedMS, PacketID, Seq), the relay's
// paging order (model.ClaimPos).
func posBefore(a, b model.ClaimPos) bool {
	if a.CreatedMS != b.CreatedMS {
		return a.CreatedMS < b.CreatedMS
	}
	if a.PacketID != b.PacketID {
		return a.PacketID < b.PacketID
	}
	return a.Seq < b.Seq
}

// SetCreditDest implements storage.MySQL's SetCreditDest: the Dest a new
// claim's row records, from its claimant's shard (nil: "").
func (s *Store) SetCreditDest(dest func(model.ShardID) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dest = dest
}

// indexClaimLocked records claim i of pk, just written, owed to its
// claimant's shard act: its route (ActShard, and Dest from SetCreditDest)
// and its place in the relay index of pk's database. s.mu must be held.
func (s *Store) indexClaimLocked(pk *packet, i int, act model.ShardID) {
	r := route{shard: act}
	if s.dest != nil {
		r.dest = s.dest(act)
	}
	invariant.That(len(pk.routes) == i && i == len(pk.claims)-1, "a claim's route written out of order")
	pk.routes = append(pk.routes, r)
	db := pk.ref.Shard.DB()
	at := claimAt{pk, i}
	p := at.pos()
	// Claims come mostly in creation order: the search usually ends at the tail.
	list := s.byDB[db]
	j := sort.Search(len(list), func(j int) bool { return posBefore(p, list[j].pos()) })
	list = append(list, claimAt{})
	copy(list[j+1:], list[j:])
	list[j] = at
	s.byDB[db] = list
}

// fullClaim is claim i of pk with its ActShard and Dest: as the books read
// it, which answers never do.
func (pk *packet) fullClaim(i int) model.Claim {
	c := pk.claims[i]
	c.ActShard, c.Dest = pk.routes[i].shard, pk.routes[i].dest
	return c
}

// claimsAfter answers storage.ClaimsAfterQuery over the relay index of db: every
// claim of the packets of db's shards, all days. As storage.MySQL, a
// database out of 0..99 is ErrInvalidArgument.
func (s *Store) claimsAfter(ctx context.Context, db int, fromMS int64, after model.ClaimPos, beforeMS int64, limit int) ([]model.Credit, model.ClaimPos, error) {
	next := after
	if err := ctx.Err(); err != nil {
		return nil, next, err
	}
	if db < 0 || db >= model.ShardCount/10 {
		return nil, next, model.Invalidf("database %d out of range", db)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.byDB[db]
	i := sort.Search(len(list), func(i int) bool { return list[i].pk.claims[list[i].i].CreatedMS >= fromMS })
	if after != (model.ClaimPos{}) {
		i = max(i, sort.Search(len(list), func(i int) bool { return posBefore(after, list[i].pos()) }))
	}
	var out []model.Credit
	for ; i < len(list) && len(out) < limit; i++ {
		c := list[i].pk.fullClaim(list[i].i)
		if c.CreatedMS > beforeMS {
			break
		}
		out = append(out, model.CreditOf(c))
		next = list[i].pos()
	}
	return out, next, nil
}

// sendTo runs storage.RecordDest.
func (s *Store) sendTo(ctx context.Context, credits []model.Credit, dest string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, c := range credits {
		if _, _, err := model.ParseClaimID(c.ClaimID); err != nil {
			return fmt.Errorf("memstore: send to %s: %w", dest, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range credits {
		ref, seq, _ := model.ParseClaimID(c.ClaimID)
		if pk, ok := s.packets[ref.ID]; ok && seq <= int64(len(pk.claims)) {
			pk.routes[seq-1].dest = dest
		}
	}
	return nil
}

// relayPositions answers storage.RelayPositionsQuery.
func (s *Store) relayPositions(ctx context.Context, dbs []int) (map[int]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]int64{}
	for _, db := range dbs {
		if ms, ok := s.relay[db]; ok {
			out[db] = ms
		}
	}
	return out, nil
}

// saveRelayPositions runs storage.SetRelayPositions: all or nothing, and a
// position may move back.
func (s *Store) saveRelayPositions(ctx context.Context, pos map[int]int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for db := range pos {
		if db < 0 || db >= model.ShardCount/10 {
			return fmt.Errorf("memstore: save relay positions: database %d out of range", db)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.Copy(s.relay, pos)
	return nil
}
