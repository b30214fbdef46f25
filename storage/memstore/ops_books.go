package memstore

import (
	"context"

	"redcell/storage"
)

// The packet, expiry, relay and reconciliation ops and queries (storage/op.go).

// bookOps runs the packet, expiry, relay and reconciliation ops of CommitGroup.
func (s *Store) bookOps(ctx context.Context, op storage.Op) (bool, error) {
	switch o := op.(type) {
	case *storage.RecordDest:
		return true, s.sendTo(ctx, o.Credits, o.Dest)
	case *storage.SetRelayPositions:
		return true, s.saveRelayPositions(ctx, o.Pos)
	case *storage.AdvanceReconPositions:
		return true, s.saveReconPositions(ctx, o.Pos)
	}
	return false, nil
}

// bookReads answers the packet, expiry, relay and reconciliation queries of Read.
func (s *Store) bookReads(ctx context.Context, q storage.Query) (bool, error) {
	var err error
	switch o := q.(type) {
	case *storage.PacketQuery:
		o.Packet, err = s.readPacket(ctx, o.Ref)
	case *storage.ClaimsQuery:
		o.Claims, err = s.packetClaims(ctx, o.Ref, o.AfterSeq, o.Limit)
	case *storage.ClaimsOfQuery:
		o.Held, err = s.claimsOfPacket(ctx, o.Ref, o.Reqs)
	case *storage.ExpiredQuery:
		o.IDs, err = s.expiredIn(ctx, o.Shards, o.Days, o.NowMS, o.Limit)
	case *storage.ClaimsAfterQuery:
		o.Credits, o.Next, err = s.claimsAfter(ctx, o.DB, o.FromMS, o.After, o.BeforeMS, o.Limit)
	case *storage.RelayPositionsQuery:
		o.Pos, err = s.relayPositions(ctx, o.DBs)
	case *storage.ReconWindowQuery:
		o.Window, err = s.reconWindow(ctx, o.DB, o.Shards, o.Days, o.FromMS, o.ToMS, o.Limit)
	case *storage.CreditsOfQuery:
		o.Found, err = s.creditsOf(ctx, o.Credits)
	case *storage.ReconPositionsQuery:
		o.Pos, err = s.reconPositions(ctx)
	default:
		return false, nil
	}
	return true, err
}
