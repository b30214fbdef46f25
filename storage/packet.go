package storage

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"redcell/model"
)

// MariaDB error numbers: a table that does not exist, one that does.
const (
	errNoSuchTable = 1146
	errTableExists = 1050
)

const packetCols = "packet_id, sender, order_no, kind, greeting, amount, count, remaining_amount, remaining_count, refund_amount, status, created_ms, expires_ms"

func scanPacket(row interface{ Scan(...any) error }) (model.Packet, error) {
	var p model.Packet
	err := row.Scan(&p.ID, &p.Sender, &p.OrderNo, &p.Kind, &p.Greeting, &p.Amount, &p.Count,
		&p.RemainingAmount, &p.RemainingCount, &p.RefundAmount, &p.Status, &p.CreatedMS, &p.ExpiresMS)
	return p, err
}

// readPacket reads a packet row, from its day table or, once archived, from its
// shard's archive (Archive). Errors: ErrNotFound.
func (m *MySQL) readPacket(ctx context.Context, ref model.PacketRef) (model.Packet, error) {
	read := func(day int) (model.Packet, error) {
		return scanPacket(m.db.QueryRowContext(ctx, "SELECT "+packetCols+" FROM "+m.packetTable(ref.Shard, day)+
			" WHERE packet_id = ?", string(ref.ID)))
	}
	p, err := read(ref.Day)
	if archived(err) && m.mayBeArchived(ref) {
		p, err = read(ArchiveDay)
	}
	if archived(err) {
		return model.Packet{}, model.Errorf(model.ErrNotFound, "red packet %s not found", ref.ID)
	}
	if err != nil {
		return model.Packet{}, fmt.Errorf("storage: read packet: %w", err)
	}
	return p, nil
}

// packetClaims returns up to limit claims of the packet with seq > afterSeq, by
// seq, from its day table or, once the packet is archived, its archive.
func (m *MySQL) packetClaims(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error) {
	out, err := m.claimsPage(ctx, ref, afterSeq, limit)
	if err != nil || len(out) > 0 || !m.mayBeArchived(ref) {
		return out, err
	}
	if in, err := m.inArchive(ctx, m.db, ref); err != nil || !in {
		return nil, err
	}
	return m.claimsPage(ctx, archiveRef(ref), afterSeq, limit)
}

// claimsPage is Claims of the table ref.Day names.
func (m *MySQL) claimsPage(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error) {
	rows, err := m.db.QueryContext(ctx, "SELECT seq, act_id, amount, created_ms FROM "+m.claimTable(ref.Shard, ref.Day)+
		" WHERE packet_id = ? AND seq > ? ORDER BY seq LIMIT ?", string(ref.ID), afterSeq, limit)
	if isMySQLErr(err, errNoSuchTable) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: read claims: %w", err)
	}
	defer rows.Close()
	var out []model.Claim
	for rows.Next() {
		c := model.Claim{PacketID: ref.ID}
		if err := rows.Scan(&c.Seq, &c.ActID, &c.Amount, &c.CreatedMS); err != nil {
			return nil, fmt.Errorf("storage: scan claim: %w", err)
		}
		c.ID = model.ClaimID(ref.ID, c.Seq)
		out = append(out, c)
	}
	return out, rows.Err()
}

// claimsOfPacket returns the claims the requests' users hold on the packet, read
// without locks: used to answer opens of a packet known to be sold out or
// expired, archived ones too.
func (m *MySQL) claimsOfPacket(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error) {
	c, err := m.claimsOf(ctx, m.db, ref, reqs)
	if isMySQLErr(err, errNoSuchTable) {
		c, err = map[string]model.Claim{}, nil
	}
	if err != nil || len(c) > 0 || !m.mayBeArchived(ref) {
		return c, err
	}
	if in, err := m.inArchive(ctx, m.db, ref); err != nil || !in {
		return c, err
	}
	c, err = m.claimsOf(ctx, m.db, archiveRef(ref), reqs)
	if isMySQLErr(err, errNoSuchTable) {
		return map[string]model.Claim{}, nil
	}
	return c, err
}

type rowsQueryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// claimsOf returns the existing claims of the requests' users on the packet.
func (m *MySQL) claimsOf(ctx context.Context, tx rowsQueryer, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error) {
	args := make([]any, 0, len(reqs)+1)
	args = append(args, string(ref.ID))
	for _, rq := range reqs {
		args = append(args, rq.ActID)
	}
	rows, err := tx.QueryContext(ctx, "SELECT seq, act_id, amount, created_ms FROM "+m.claimTable(ref.Shard, ref.Day)+
		" WHERE packet_id = ? AND act_id IN ("+placeholders(len(reqs))+")", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]model.Claim)
	for rows.Next() {
		c := model.Claim{PacketID: ref.ID}
		if err := rows.Scan(&c.Seq, &c.ActID, &c.Amount, &c.CreatedMS); err != nil {
			return nil, err
		}
		c.ID = model.ClaimID(ref.ID, c.Seq)
		out[c.ActID] = c
	}
	return out, rows.Err()
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

func rowsOf(n, cols int) string {
	row := "(" + placeholders(cols) + ")"
	return strings.TrimSuffix(strings.Repeat(row+",", n), ",")
}

// expiredIn lists up to limit open packets that expired at or before nowMS,
// from the packet tables of the given shards and days of month that exist. It
// reads the list of tables from information_schema (cached for a minute) and
// asks up to 100 tables per statement, so a pass over hundreds of shards is a
// handful of round trips, not one per table.
func (m *MySQL) expiredIn(ctx context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error) {
	list, err := m.dayTablesOf(ctx, "packet", shards, days)
	if err != nil {
		return nil, err
	}
	var out []model.PacketID
	for start := 0; start < len(list) && len(out) < limit; start += ledgerChunk {
		end := min(start+ledgerChunk, len(list))
		parts := make([]string, 0, end-start)
		args := make([]any, 0, end-start+1)
		for _, t := range list[start:end] {
			parts = append(parts, "(SELECT packet_id FROM "+m.packetTable(t.shard, t.day)+" WHERE status = 0 AND expires_ms <= ?)")
			args = append(args, nowMS)
		}
		args = append(args, limit-len(out))
		rows, err := m.db.QueryContext(ctx, strings.Join(parts, " UNION ALL ")+" LIMIT ?", args...)
		if isMySQLErr(err, errNoSuchTable) {
			m.forgetTables()
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("storage: scan expired: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, model.PacketID(id))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dayTables returns the packet and claim tables that exist, from a list at most
// a minute old. Tables this process created since are added by EnsureDay.
func (m *MySQL) dayTables(ctx context.Context) ([]tableRef, error) {
	gen := m.filterGen()
	m.mu.Lock()
	if age := m.clock.Now().Sub(m.tableListAt); m.tableList != nil && age >= 0 && age < time.Minute && m.tableListGen == gen {
		list := m.tableList
		m.mu.Unlock()
		return list, nil
	}
	m.mu.Unlock()
	if err := m.upgradeClaimTables(ctx); err != nil {
		return nil, err
	}
	all, err := m.tables(ctx, m.db)
	if err != nil {
		return nil, err
	}
	var list []tableRef
	known := map[tableRef]bool{}
	for _, t := range all {
		if t.kind == "packet" || t.kind == "claim" {
			list = append(list, t)
			known[t] = true
		}
	}
	m.mu.Lock()
	for t := range m.tableMade { // made while information_schema was read
		if !known[t] {
			list = append(list, t)
			known[t] = true
		}
	}
	m.tableList, m.tableKnown, m.tableListAt, m.tableListGen = list, known, m.clock.Now(), gen
	m.mu.Unlock()
	return list, nil
}

// dayTablesOf lists the tables of kind (packet or claim) of shards for days
// that exist (dayTables), in dayTables' order.
func (m *MySQL) dayTablesOf(ctx context.Context, kind string, shards []model.ShardID, days []int) ([]tableRef, error) {
	existing, err := m.dayTables(ctx)
	if err != nil {
		return nil, err
	}
	want := make(map[tableRef]bool, len(shards)*len(days))
	for _, s := range shards {
		for _, d := range days {
			want[tableRef{kind: kind, shard: s, day: d}] = true
		}
	}
	var list []tableRef
	for _, t := range existing {
		if want[t] {
			list = append(list, t)
		}
	}
	return list, nil
}

// forgetTables drops the cached table list (a table went away).
func (m *MySQL) forgetTables() {
	m.mu.Lock()
	m.tableList, m.tableMade = nil, nil
	m.mu.Unlock()
}

// upgradeClaimTables gives every claim table of the store's namespace made
// by a version before claims were their own outbox rows the two columns
// this one reads (act_shard, dest: dayDDL's ALTER), once per process and
// namespace: every reader of the claim tables (the relay's ClaimsAfter,
// reconciliation, the ledgers) lists them through dayTables, which calls
// it first. One read of information_schema finds those lacking dest; each
// gets one ALTER TABLE. An error leaves it to the next call.
func (m *MySQL) upgradeClaimTables(ctx context.Context) error {
	ns := m.ns
	if done := m.upgradedNS.Load(); done != nil && *done == ns {
		return nil
	}
	// Once, whatever the caller's deadline (a relay read has 2 s; the
	// schema read over thousands of tables may take longer): callers wait.
	m.upgradeMu.Lock()
	defer m.upgradeMu.Unlock()
	if done := m.upgradedNS.Load(); done != nil && *done == ns {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	pattern := strings.ReplaceAll(ns, "_", `\_`) + `db\_%`
	rows, err := m.db.QueryContext(ctx, `SELECT t.TABLE_SCHEMA, t.TABLE_NAME FROM information_schema.TABLES t
WHERE t.TABLE_SCHEMA LIKE ? AND t.TABLE_NAME LIKE 't\_claim\_%' AND NOT EXISTS (SELECT 1 FROM information_schema.COLUMNS c
WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME AND c.COLUMN_NAME = 'dest')`, pattern)
	if err != nil {
		return fmt.Errorf("storage: find claim tables to upgrade: %w", err)
	}
	var old []string
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			rows.Close()
			return err
		}
		old = append(old, schema+"."+name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range old {
		if _, err := m.db.ExecContext(ctx, "ALTER TABLE "+t+" ADD COLUMN IF NOT EXISTS act_shard SMALLINT NOT NULL DEFAULT -1 AFTER created_ms, ADD COLUMN IF NOT EXISTS dest VARCHAR(64) NOT NULL DEFAULT '' AFTER act_shard"); err != nil {
			return fmt.Errorf("storage: upgrade claim table %s: %w", t, err)
		}
	}
	m.upgradedNS.Store(&ns)
	return nil
}
