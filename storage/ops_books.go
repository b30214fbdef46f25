package storage

import (
	"context"

	"redcell/model"
)

// The packet, expiry, relay and reconciliation ops and queries (op.go).

// PacketQuery reads one packet. Errors: ErrNotFound.
type PacketQuery struct {
	Ref model.PacketRef

	Packet model.Packet // answer
}

// ClaimsQuery returns up to Limit claims of the packet with seq > AfterSeq,
// in seq order; none (no error) for a packet that does not exist.
type ClaimsQuery struct {
	Ref      model.PacketRef
	AfterSeq int64
	Limit    int

	Claims []model.Claim // answer
}

// ClaimsOfQuery reads, without locks, the claims the requests' users hold on
// the packet, by act_id; users without one are absent. Empty (no error) for
// a packet that does not exist.
type ClaimsOfQuery struct {
	Ref  model.PacketRef
	Reqs []model.OpenRequest

	Held map[string]model.Claim // answer: by act_id
}

// ExpiredQuery lists up to Limit open packets with ExpiresMS <= NowMS in the
// packet tables of the given shards and days of month, in no promised order.
// Sold-out and refunded packets are never listed.
type ExpiredQuery struct {
	Shards []model.ShardID
	Days   []int
	NowMS  int64
	Limit  int

	IDs []model.PacketID // answer
}

// The relay's reads and writes of a cell's claims: ClaimsAfterQuery,
// RecordDest, RelayPositionsQuery, SetRelayPositions. A claim is its own
// outbox row: each owes its claimant a credit, and nothing marks it
// delivered. The relay keeps, per database of the packets' shards, a
// position below which every claim is known credited (RelayPositionsQuery),
// and after a restart reads the claims past it again (ClaimsAfterQuery); the
// receiving side refuses a second credit by claim ID.

// ClaimsAfterQuery pages through the claims of database DB (every claim
// table of its shards, every day) created in [FromMS, BeforeMS] and after
// position After (the zero ClaimPos: no such bound), in (created_ms,
// packet_id, seq) order, up to Limit, each as the credit it owes: the
// claimant's shard, CreatedMS and Dest as its row records them. Next is the
// last one's position (After when none). A database never used reads empty;
// one out of 0..99 is ErrInvalidArgument.
type ClaimsAfterQuery struct {
	DB       int
	FromMS   int64
	After    model.ClaimPos
	BeforeMS int64
	Limit    int

	Credits []model.Credit // answer
	Next    model.ClaimPos // answer
}

// RecordDest records Dest in the credits' claim rows (found by claim ID)
// before the relay delivers them to another cell than the one the rows
// name: had a delivery applied them there, the row still names where. A
// claim not found is skipped. Errors: ErrInvalidArgument for a malformed
// claim ID.
type RecordDest struct {
	Credits []model.Credit
	Dest    string
}

// RelayPositionsQuery returns the relay's saved positions of databases DBs
// (Unix ms: every claim of the database created before it is credited),
// read from each database itself, so that a position moves with its
// database. A database without one is absent (MySQL: unless it holds an
// earlier version's outbox table, whose oldest undelivered row gives it;
// see MySQL.relayPositions).
type RelayPositionsQuery struct {
	DBs []int

	Pos map[int]int64 // answer: database -> Unix ms
}

// SetRelayPositions records Pos (database -> Unix ms), in one round trip. A
// position may move back (the relay found an older claim uncredited). A
// database out of 0..99 is an error.
type SetRelayPositions struct {
	Pos map[int]int64
}

// ReconWindowQuery reads the claims created in [FromMS, ToMS) in the claim
// tables of Shards (all of database DB; a shard of another database is an
// error) for the given days of month, each with its Dest, in one statement.
// A window of more than Limit claims is cut short at the creation time of
// the claim past Limit (never below FromMS+1) and read again; the answer's
// ToMS says where it ended. A database never used reads empty. See
// MySQL.reconWindow.
type ReconWindowQuery struct {
	DB     int
	Shards []model.ShardID
	Days   []int
	FromMS int64
	ToMS   int64
	Limit  int

	Window model.ReconWindow // answer
}

// CreditsOfQuery returns the credit flows booked here for the given claims
// (matched by the claimant's shard, act_id and claim ID), by claim ID, with
// ClaimID, ActID and Amount as booked; a claim credited to two of the
// accounts asked about comes back with the amounts summed. At most 10,000
// credits per query; more, or a shard out of range, is an error. It creates
// nothing: a database or flow table that does not exist holds no credit (a
// cell's kept copy of a database it handed over is read as it is).
type CreditsOfQuery struct {
	Credits []model.Credit

	Found map[string]model.Credit // answer: by claim ID
}

// ReconPositionsQuery returns where reconciliation has checked up to, by
// database (0..99), as last saved: claims created before that Unix ms were
// checked. Databases never saved are absent.
type ReconPositionsQuery struct {
	Pos map[int]int64 // answer: database -> Unix ms
}

// AdvanceReconPositions records Pos (database -> Unix ms) durably, in one
// write. A position never moves back: a save below the stored one keeps the
// stored one, so a repeated or late save changes nothing. A database out of
// 0..99 is an error.
type AdvanceReconPositions struct {
	Pos map[int]int64
}

func (*RecordDest) isOp()            {}
func (*SetRelayPositions) isOp()     {}
func (*AdvanceReconPositions) isOp() {}

func (*PacketQuery) isQuery()         {}
func (*ClaimsQuery) isQuery()         {}
func (*ClaimsOfQuery) isQuery()       {}
func (*ExpiredQuery) isQuery()        {}
func (*ClaimsAfterQuery) isQuery()    {}
func (*RelayPositionsQuery) isQuery() {}
func (*ReconWindowQuery) isQuery()    {}
func (*CreditsOfQuery) isQuery()      {}
func (*ReconPositionsQuery) isQuery() {}

// bookOps runs the packet, expiry, relay and reconciliation ops of CommitGroup.
func (m *MySQL) bookOps(ctx context.Context, op Op) (bool, error) {
	switch o := op.(type) {
	case *RecordDest:
		return true, m.sendTo(ctx, o.Credits, o.Dest)
	case *SetRelayPositions:
		return true, m.saveRelayPositions(ctx, o.Pos)
	case *AdvanceReconPositions:
		return true, m.saveReconPositions(ctx, o.Pos)
	}
	return false, nil
}

// bookReads answers the packet, expiry, relay and reconciliation queries of Read.
func (m *MySQL) bookReads(ctx context.Context, q Query) (bool, error) {
	var err error
	switch o := q.(type) {
	case *PacketQuery:
		o.Packet, err = m.readPacket(ctx, o.Ref)
	case *ClaimsQuery:
		o.Claims, err = m.packetClaims(ctx, o.Ref, o.AfterSeq, o.Limit)
	case *ClaimsOfQuery:
		o.Held, err = m.claimsOfPacket(ctx, o.Ref, o.Reqs)
	case *ExpiredQuery:
		o.IDs, err = m.expiredIn(ctx, o.Shards, o.Days, o.NowMS, o.Limit)
	case *ClaimsAfterQuery:
		o.Credits, o.Next, err = m.claimsAfter(ctx, o.DB, o.FromMS, o.After, o.BeforeMS, o.Limit)
	case *RelayPositionsQuery:
		o.Pos, err = m.relayPositions(ctx, o.DBs)
	case *ReconWindowQuery:
		o.Window, err = m.reconWindow(ctx, o.DB, o.Shards, o.Days, o.FromMS, o.ToMS, o.Limit)
	case *CreditsOfQuery:
		o.Found, err = m.creditsOf(ctx, o.Credits)
	case *ReconPositionsQuery:
		o.Pos, err = m.reconPositions(ctx)
	default:
		return false, nil
	}
	return true, err
}

// Packet reads one packet (PacketQuery). Errors: ErrNotFound.
func Packet(ctx context.Context, r Reader, ref model.PacketRef) (model.Packet, error) {
	q := &PacketQuery{Ref: ref}
	err := r.Read(ctx, q)
	return q.Packet, err
}

// Claims returns up to limit claims of the packet with seq > afterSeq, in
// seq order (ClaimsQuery).
func Claims(ctx context.Context, r Reader, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error) {
	q := &ClaimsQuery{Ref: ref, AfterSeq: afterSeq, Limit: limit}
	err := r.Read(ctx, q)
	return q.Claims, err
}

// ClaimsOf reads the claims the requests' users hold on the packet, by
// act_id (ClaimsOfQuery).
func ClaimsOf(ctx context.Context, r Reader, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error) {
	q := &ClaimsOfQuery{Ref: ref, Reqs: reqs}
	err := r.Read(ctx, q)
	return q.Held, err
}

// ExpiredIn lists up to limit open packets with ExpiresMS <= nowMS in the
// packet tables of the given shards and days of month (ExpiredQuery).
func ExpiredIn(ctx context.Context, r Reader, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error) {
	q := &ExpiredQuery{Shards: shards, Days: days, NowMS: nowMS, Limit: limit}
	err := r.Read(ctx, q)
	return q.IDs, err
}

// ClaimsAfter pages through the claims of database db created in [fromMS,
// beforeMS] and after position after, up to limit, each as the credit it
// owes; next is the last one's position (ClaimsAfterQuery).
func ClaimsAfter(ctx context.Context, r Reader, db int, fromMS int64, after model.ClaimPos, beforeMS int64, limit int) (credits []model.Credit, next model.ClaimPos, err error) {
	q := &ClaimsAfterQuery{DB: db, FromMS: fromMS, After: after, BeforeMS: beforeMS, Limit: limit, Next: after}
	err = r.Read(ctx, q)
	return q.Credits, q.Next, err
}

// SendTo records dest in the credits' claim rows (RecordDest).
func SendTo(ctx context.Context, g Grouper, credits []model.Credit, dest string) error {
	return g.CommitGroup(ctx, []Op{&RecordDest{Credits: credits, Dest: dest}})
}

// RelayPositions returns the relay's saved positions of databases dbs
// (RelayPositionsQuery).
func RelayPositions(ctx context.Context, r Reader, dbs []int) (map[int]int64, error) {
	q := &RelayPositionsQuery{DBs: dbs}
	err := r.Read(ctx, q)
	return q.Pos, err
}

// SaveRelayPositions records the relay's positions (database -> Unix ms)
// (SetRelayPositions).
func SaveRelayPositions(ctx context.Context, g Grouper, pos map[int]int64) error {
	return g.CommitGroup(ctx, []Op{&SetRelayPositions{Pos: pos}})
}

// ReconWindow reads the claims created in [fromMS, toMS) in the claim tables
// of shards (all of database db) for the given days of month, cut short
// after limit claims (ReconWindowQuery).
func ReconWindow(ctx context.Context, r Reader, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error) {
	q := &ReconWindowQuery{DB: db, Shards: shards, Days: days, FromMS: fromMS, ToMS: toMS, Limit: limit}
	err := r.Read(ctx, q)
	return q.Window, err
}

// CreditsOf returns the credit flows booked here for the given claims, by
// claim ID (CreditsOfQuery).
func CreditsOf(ctx context.Context, r Reader, credits []model.Credit) (map[string]model.Credit, error) {
	q := &CreditsOfQuery{Credits: credits}
	err := r.Read(ctx, q)
	return q.Found, err
}

// ReconPositions returns where reconciliation has checked up to, by database
// (ReconPositionsQuery).
func ReconPositions(ctx context.Context, r Reader) (map[int]int64, error) {
	q := &ReconPositionsQuery{}
	err := r.Read(ctx, q)
	return q.Pos, err
}

// SaveReconPositions records where reconciliation has checked up to
// (database -> Unix ms); a position never moves back (AdvanceReconPositions).
func SaveReconPositions(ctx context.Context, g Grouper, pos map[int]int64) error {
	return g.CommitGroup(ctx, []Op{&AdvanceReconPositions{Pos: pos}})
}
