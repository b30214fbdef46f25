package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
)

// ArchiveResult is what one Archive pass did, for logs and metrics.
type ArchiveResult struct {
	Packets int         // packets moved to the archive
	Claims  int         // their claims, moved with them
	Cents   model.Cents // the packets' amounts
	// Unsettled counts packets older than the cut that are still open
	// (their refund has not run): left in their day table, and the day is
	// not empty when it comes round again. Zero on a healthy cell.
	Unsettled int
	Tables    int // day tables looked at
}

// ErrNoArchive: the store keeps no day tables, so it has nothing to archive
// or export (the in-memory store).
var ErrNoArchive = errors.New("storage: this store keeps no day tables to archive")

// ArchivePass is one archive step as a typed op (CommitGroup; see
// MySQL.archive for what it moves, and how): the packets created before
// BeforeMS (Unix ms) in the day tables of the shards Owns says are the
// cell's, with their claims. Result is set even when it fails (what was
// moved before the error stays moved). Errors: ErrNoArchive from a store
// without day tables (memstore), the database's.
type ArchivePass struct {
	Owns func(model.ShardID) bool
	// Enter, when set, is asked before each transaction that moves packets
	// of database db, as ExportPass.Enter: ok false skips the table.
	Enter    func(db int) (leave func(), ok bool)
	BeforeMS int64

	Result ArchiveResult
}

func (*ArchivePass) isOp() {}

// Archive runs one ArchivePass through g and answers its result.
func Archive(ctx context.Context, g Grouper, owns func(model.ShardID) bool, beforeMS int64) (ArchiveResult, error) {
	return ArchiveWith(ctx, g, ArchivePass{Owns: owns, BeforeMS: beforeMS})
}

// ArchiveWith runs ArchivePass p through g and answers its result.
func ArchiveWith(ctx context.Context, g Grouper, p ArchivePass) (ArchiveResult, error) {
	err := g.CommitGroup(ctx, []Op{&p})
	return p.Result, err
}

// archiveOps runs the ArchivePass and ExportPass ops.
func (m *MySQL) archiveOps(ctx context.Context, op Op) (bool, error) {
	switch a := op.(type) {
	case *ArchivePass:
		var err error
		a.Result, err = m.archive(ctx, a.Owns, a.Enter, a.BeforeMS)
		return true, err
	case *ExportPass:
		return true, m.export(ctx, a)
	}
	return false, nil
}

// archiveChunk is how many packets one archive transaction moves.
const archiveChunk = 500

// EnsureArchive creates shard s's archive tables (ArchiveDay) once per
// process.
func (m *MySQL) EnsureArchive(ctx context.Context, s model.ShardID) error {
	if err := m.EnsureShard(ctx, s); err != nil {
		return err
	}
	if err := m.ensureProbed(ctx, ensureKey{shard: s, day: archiveEnsure}, m.dayNeeds(s, ArchiveDay), m.dayDDL(s, ArchiveDay)); err != nil {
		return err
	}
	m.madeDayTables(s, ArchiveDay)
	return nil
}

// ArchivedClaimsAge: every claim in an archive is older than this. A cell
// archives packets created more than its retention ago, which is at least
// packet_expiry + 72h, and a claim is made before its packet expires; so a
// reconciliation window younger than this reads day tables only.
const ArchivedClaimsAge = 72 * time.Hour

// archive moves the settled packets of the owned shards' day tables that
// were created before beforeMS (Unix ms), with their claims, into the
// shards' archive tables (t_packet_Y_00, t_claim_Y_00): at most archiveChunk
// packets per transaction, each packet with all its claims in one, so every
// snapshot sees a packet and its claims in one place, and the audits, which
// read the archive as one more day, see the same sums before and after. A
// packet still open (status 0) is left where it is and counted Unsettled.
// Flows stay: they live in tables of their own. A claim keeps its columns (the
// credit it owes, ActShard and Dest): the relay and the books read the archive as a day. Run it with
// a cut older than the packet expiry plus the refund's own time (the cell's
// retention), so no open or refund reaches a moved packet; reads by ID find
// it in the archive (Packet, Claims, ClaimsOf).
//
// It first counts, 100 day tables per statement, each table's old settled
// and old open packets through the k_created index, then moves only from
// the tables that have some, oldest first, in READ COMMITTED transactions
// that lock the rows they move and no gaps, so sends and opens on the same
// tables do not wait for it. Errors: the database's; what was moved before an error
// stays moved.
func (m *MySQL) archive(ctx context.Context, owns func(model.ShardID) bool, enter func(db int) (func(), bool), beforeMS int64) (ArchiveResult, error) {
	var res ArchiveResult
	all, err := m.tables(ctx, m.db)
	if err != nil {
		return res, err
	}
	claims := map[tableRef]bool{}
	var packets []tableRef
	for _, t := range all {
		switch {
		case t.day == ArchiveDay || !owns(t.shard):
		case t.kind == "packet":
			packets = append(packets, t)
		case t.kind == "claim":
			claims[t] = true
		}
	}
	packets = slices.DeleteFunc(packets, func(t tableRef) bool {
		return !claims[tableRef{kind: "claim", shard: t.shard, day: t.day}] // being created: holds nothing yet
	})
	slices.SortFunc(packets, func(a, b tableRef) int { return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.day, b.day)) })
	res.Tables = len(packets)
	var due []tableRef
	for start := 0; start < len(packets); start += ledgerChunk {
		chunk := packets[start:min(start+ledgerChunk, len(packets))]
		parts := make([]string, 0, len(chunk))
		args := make([]any, 0, 3*len(chunk))
		for i, t := range chunk {
			parts = append(parts, fmt.Sprintf("(SELECT %d AS i, COALESCE(SUM(status <> 0), 0) AS settled, COALESCE(SUM(status = 0), 0) AS open FROM %s "+
				"WHERE created_ms < ?)", i, m.packetTable(t.shard, t.day)))
			args = append(args, beforeMS)
		}
		rows, err := m.db.QueryContext(ctx, strings.Join(parts, " UNION ALL "), args...)
		if err != nil {
			return res, fmt.Errorf("storage: archive: count old packets: %w", err)
		}
		for rows.Next() {
			var i, settled, open int
			if err := rows.Scan(&i, &settled, &open); err != nil {
				rows.Close()
				return res, fmt.Errorf("storage: archive: count old packets: %w", err)
			}
			res.Unsettled += open
			if settled > 0 {
				due = append(due, chunk[i])
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, fmt.Errorf("storage: archive: count old packets: %w", err)
		}
	}
	for _, t := range due {
		for {
			leave, ok := enterDB(enter, t.shard.DB())
			if !ok {
				break
			}
			err := m.EnsureArchive(ctx, t.shard) // once per process
			n := 0
			if err == nil {
				n, err = m.archiveChunk(ctx, t, beforeMS, &res)
			}
			leave()
			if err != nil {
				return res, fmt.Errorf("storage: archive %s: %w", m.packetTable(t.shard, t.day), err)
			}
			if n < archiveChunk {
				break
			}
		}
	}
	return res, nil
}

// archiveChunk moves up to archiveChunk settled packets of day table t
// created before beforeMS, with their claims, in one transaction; it returns
// how many it moved.
func (m *MySQL) archiveChunk(ctx context.Context, t tableRef, beforeMS int64, res *ArchiveResult) (int, error) {
	pt, ct := m.packetTable(t.shard, t.day), m.claimTable(t.shard, t.day)
	at, act := m.packetTable(t.shard, ArchiveDay), m.claimTable(t.shard, ArchiveDay)
	var moved, claims int
	var cents model.Cents
	err := retry.Do(ctx, retry.Policy{Attempts: 3, Retryable: lockVictim, Clock: m.clock}, func(int) error {
		moved, claims, cents = 0, 0, 0
		tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		// Locked, so a late refund or open (none is due past the retention)
		// waits and then finds the packet gone, never half moved.
		ids, sum, err := lockArchivable(ctx, tx, pt, beforeMS)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		in := " WHERE packet_id IN (" + placeholders(len(ids)) + ")"
		r, err := tx.ExecContext(ctx, "INSERT INTO "+at+" ("+packetCols+") SELECT "+packetCols+" FROM "+pt+in, ids...)
		if err != nil {
			return err
		}
		if pn, err := r.RowsAffected(); err != nil || pn != int64(len(ids)) {
			return errors.Join(err, fmt.Errorf("locked %d packets, copied %d", len(ids), pn))
		}
		r, err = tx.ExecContext(ctx, "INSERT INTO "+act+" (packet_id, seq, act_id, amount, created_ms, act_shard, dest) SELECT packet_id, seq, act_id, amount, created_ms, act_shard, dest FROM "+ct+in, ids...)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return err
		}
		d, err := tx.ExecContext(ctx, "DELETE FROM "+ct+in, ids...)
		if err != nil {
			return err
		}
		if dn, err := d.RowsAffected(); err != nil || dn != n {
			return errors.Join(err, fmt.Errorf("copied %d claims, deleted %d", n, dn))
		}
		d, err = tx.ExecContext(ctx, "DELETE FROM "+pt+in, ids...)
		if err != nil {
			return err
		}
		if dn, err := d.RowsAffected(); err != nil || dn != int64(len(ids)) {
			return errors.Join(err, fmt.Errorf("copied %d packets, deleted %d", len(ids), dn))
		}
		if err := tx.Commit(); err != nil {
			return commitUnknown(err)
		}
		moved, claims, cents = len(ids), int(n), sum
		return nil
	})
	if err != nil {
		return 0, err
	}
	res.Packets += moved
	res.Claims += claims
	res.Cents += cents
	return moved, nil
}

// lockArchivable locks and reads, in packet table pt, the oldest closed
// packets created before beforeMS (archiveChunk of them at most), returning
// their IDs and total amount. Errors: the database's.
func lockArchivable(ctx context.Context, tx *sql.Tx, pt string, beforeMS int64) (ids []any, sum model.Cents, err error) {
	rows, err := tx.QueryContext(ctx, "SELECT packet_id, amount FROM "+pt+
		" WHERE created_ms < ? AND status <> 0 ORDER BY created_ms, packet_id LIMIT ? FOR UPDATE",
		beforeMS, archiveChunk)
	if err != nil {
		return nil, 0, err
	}
	for rows.Next() {
		var id string
		var amount model.Cents
		if err := rows.Scan(&id, &amount); err != nil {
			rows.Close()
			return nil, 0, err
		}
		ids = append(ids, id)
		sum += amount
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	return ids, sum, nil
}

// archived reports whether err, from a read of a packet's day table, means
// "not there": the packet may be in the archive.
func archived(err error) bool {
	return errors.Is(err, sql.ErrNoRows) || isMySQLErr(err, errNoSuchTable)
}

// archiveRef is ref as found in its shard's archive tables.
func archiveRef(ref model.PacketRef) model.PacketRef {
	ref.Day = ArchiveDay
	return ref
}

// mayBeArchived reports whether packet ref is old enough to be in the
// archive: made on a day before now - ArchivedClaimsAge. Reads of younger
// packets (a sold-out rain's latecomers, say) never look there.
func (m *MySQL) mayBeArchived(ref model.PacketRef) bool {
	return time.Date(ref.Year, ref.Month, ref.Day, 0, 0, 0, 0, time.UTC).Before(m.clock.Now().Add(-ArchivedClaimsAge))
}

// inArchive reports whether packet ref is in its shard's archive (false,
// not an error, when the archive does not exist).
func (m *MySQL) inArchive(ctx context.Context, q rowsQueryer, ref model.PacketRef) (bool, error) {
	rows, err := q.QueryContext(ctx, "SELECT 1 FROM "+m.packetTable(ref.Shard, ArchiveDay)+" WHERE packet_id = ?", string(ref.ID))
	if isMySQLErr(err, errNoSuchTable) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer rows.Close()
	return rows.Next(), rows.Err()
}
