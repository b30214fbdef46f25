package storage

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
)

// tableRef is a table found on the server, with its indexes parsed back to ints.
type tableRef struct {
	kind  string // account, flow, packet, claim, or a table of which a database has one (dbTables)
	shard model.ShardID
	day   int
}

var tableName = regexp.MustCompile(`^t_(account|flow|packet|claim)_([0-9])(?:_([0-9]{2}))?$`)

// dbTables are the tables of which a database has one, by name: their kind.
// (A t_outbox left by an older version is not listed: nothing reads it.
// The coupon tables of a version that kept coupons apart are read by the
// ledger alone: ledgerCoupons.)
var dbTables = map[string]string{"t_reward": "reward", "t_budget": "budget", "t_budget_lease": "lease",
	"t_coupon_req": "coupon_req", "t_coupon": "coupon_old", "t_coupon_folding": "coupon_folding", "t_coupon_folded": "coupon_folded",
	"t_export_carry": "carry", "t_flow_carry": "flowcarry", "t_export_log": "exportlog"}

// tables lists redcell's tables on the server.
func (m *MySQL) tables(ctx context.Context, tx rowsQueryer) ([]tableRef, error) {
	rows, err := tx.QueryContext(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA LIKE ?",
		strings.ReplaceAll(m.ns+"db_", "_", "\\_")+"%")
	if err != nil {
		return nil, fmt.Errorf("storage: list tables: %w", err)
	}
	defer rows.Close()
	var out []tableRef
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			return nil, err
		}
		db, err := strconv.Atoi(strings.TrimPrefix(schema, m.ns+"db_"))
		if err != nil || db < 0 || db >= model.ShardCount/10 || len(schema) != len(m.ns)+5 || !m.keeps(db) {
			continue
		}
		if kind, ok := dbTables[name]; ok {
			out = append(out, tableRef{kind: kind, shard: model.ShardID(db * 10)})
			continue
		}
		m := tableName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		t, _ := strconv.Atoi(m[2])
		ref := tableRef{kind: m[1], shard: model.ShardID(db*10 + t)}
		if m[3] != "" {
			ref.day, _ = strconv.Atoi(m[3])
			if ref.day < ArchiveDay || ref.day > 31 {
				continue
			}
		}
		if (ref.kind == "packet" || ref.kind == "claim") != (m[3] != "") {
			continue
		}
		out = append(out, ref)
	}
	return out, rows.Err()
}

// ledgerChunk is how many tables one UNION ALL statement reads: the audit makes
// a few dozen round trips instead of several per table.
const ledgerChunk = 100

// Ledger reads every money row of this store in one consistent snapshot (the
// claims, each with its ActShard and Dest, and the credits one by one, the
// rest as sums) and checks the
// row-level invariants: each balance equals the sum of its flows, each
// packet's claims + refund + remainder equal its amount and its claim count plus
// remaining count equal its count, an open packet holds at least a cent per share.
//
// Tables being created while it reads (a cell creates day tables ahead) can make
// one read fail; it then starts over with a new snapshot, up to 5 times. It
// holds every claim and credit in memory (about 1 KiB of heap per claim with
// its credit: 1 GiB for 1,000,000 claims), so
// it serves `redcell audit`, which matches claims and credits across cells;
// the cell's own audit uses CellAudit, which does not.
func (m *MySQL) Ledger(ctx context.Context, cell string) (model.Ledger, error) {
	var l model.Ledger
	err := retry.Do(ctx, retry.Policy{Attempts: 5, Backoff: 100 * time.Millisecond, Max: 100 * time.Millisecond,
		Retryable: tablesMoved, Clock: m.clock}, func(int) error {
		var err error
		l, err = m.ledgerOnce(ctx, cell)
		return err
	})
	if tablesMoved(err) {
		return model.Ledger{}, err
	}
	return l, err
}

// tablesMoved reports whether a read failed because a table went away or was
// created after its snapshot began: a read on a new snapshot may succeed.
func tablesMoved(err error) bool {
	return isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errTableDefChanged)
}

// errTableDefChanged: a table was created or altered after the snapshot began.
const errTableDefChanged = 1412

// snapshotTables opens a read-only connection in one consistent snapshot and
// lists the tables by kind, with the set of those that exist. The snapshot
// starts before the tables are listed, so a table created (and filled) after
// the listing cannot hold rows the snapshot reads elsewhere. A table is read
// with its partner (account with flow, packet with claim): a partner not
// created yet means the pair is being created and holds no rows, so it is
// left out. done ends the snapshot and gives the connection back. what names
// the caller in errors.
func (m *MySQL) snapshotTables(ctx context.Context, what string) (tx *sql.Conn, byKind map[string][]tableRef, exists map[tableRef]bool, done func(), err error) {
	tx, err = m.db.Conn(ctx)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("storage: %s: %w", what, err)
	}
	if _, err := tx.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		tx.Close()
		return nil, nil, nil, nil, fmt.Errorf("storage: %s: %w", what, err)
	}
	done = func() {
		_, _ = tx.ExecContext(context.Background(), "ROLLBACK")
		tx.Close()
	}
	ts, err := m.tables(ctx, tx)
	if err != nil {
		done()
		return nil, nil, nil, nil, err
	}
	exists = map[tableRef]bool{}
	for _, t := range ts {
		exists[t] = true
	}
	partner := map[string]string{"account": "flow", "packet": "claim"}
	byKind = map[string][]tableRef{}
	for _, t := range ts {
		if p, ok := partner[t.kind]; ok && !exists[tableRef{kind: p, shard: t.shard, day: t.day}] {
			continue
		}
		byKind[t.kind] = append(byKind[t.kind], t)
	}
	return tx, byKind, exists, done, nil
}

func (m *MySQL) ledgerOnce(ctx context.Context, cell string) (model.Ledger, error) {
	l := model.NewLedger(cell)
	tx, byKind, exists, done, err := m.snapshotTables(ctx, "ledger")
	if err != nil {
		return l, err
	}
	defer done()
	readers := []struct {
		kind string
		sql  func(t tableRef) string
		scan func(rows *sql.Rows, l *model.Ledger) error
	}{
		{"account", m.ledgerAccountSQL(exists), scanAccounts},
		{"flow", m.ledgerFlowSQL, scanFlows},
		{"packet", m.ledgerPacketSQL, scanPackets},
		{"claim", m.ledgerClaimSQL, scanClaims},
	}
	if err := m.ledgerRewards(ctx, tx, byKind, &l); err != nil {
		return l, err
	}
	if err := m.ledgerCoupons(ctx, tx, byKind, &l); err != nil {
		return l, err
	}
	exported, err := m.exportedSums(ctx, tx, byKind["carry"], byKind["flowcarry"])
	if err != nil {
		return l, err
	}
	l.Merge(exported)
	for _, r := range readers {
		list := byKind[r.kind]
		for start := 0; start < len(list); start += ledgerChunk {
			end := min(start+ledgerChunk, len(list))
			parts := make([]string, 0, end-start)
			for _, t := range list[start:end] {
				parts = append(parts, "("+r.sql(t)+")")
			}
			if err := readChunk(ctx, tx, parts, r.scan, &l); err != nil {
				return l, fmt.Errorf("storage: ledger of %s tables: %w", r.kind, err)
			}
		}
	}
	return l, nil
}

// Every per-table query returns rows of the same shape so they can be UNIONed:
// a row type tag first, then the values.

// ledgerAccountSQL answers, for the tables that exist, a table's statement:
// ('sum', shard, SUM(balance), ”, 0) and one ('bad', shard, balance, act_id,
// flows) per account whose balance differs from its flows (those in the
// table and, where its database exported some, the exported ones'
// sum: t_flow_carry).
func (m *MySQL) ledgerAccountSQL(exists map[tableRef]bool) func(t tableRef) string {
	return func(t tableRef) string {
		s := t.shard
		flows, total := "", "COALESCE(f.total, 0)"
		if carried := m.flowCarried(s, exists); carried != "" {
			flows = " LEFT JOIN (" + carried + ") x ON x.act_id = a.act_id"
			total = "COALESCE(f.total, 0) + COALESCE(x.total, 0)"
		}
		return fmt.Sprintf("SELECT 'sum' AS k, %d AS shard, COALESCE(SUM(balance), 0) AS v, '' AS id, 0 AS w FROM %s "+
			"UNION ALL (SELECT 'bad', %d, a.balance, a.act_id, %s FROM %s a LEFT JOIN "+
			"(SELECT act_id, SUM(amount) AS total FROM %s GROUP BY act_id) f ON f.act_id = a.act_id%s "+
			"WHERE a.balance <> %s OR a.balance < 0 LIMIT 100)",
			int(s), m.accountTable(s), int(s), total, m.accountTable(s), m.flowTable(s), flows, total)
	}
}

func scanAccounts(rows *sql.Rows, l *model.Ledger) error {
	for rows.Next() {
		var k, act string
		var shard, v, flows int64
		if err := rows.Scan(&k, &shard, &v, &act, &flows); err != nil {
			return err
		}
		if k == "sum" {
			l.Balances += model.Cents(v)
		} else {
			l.Problems = append(l.Problems, fmt.Sprintf("account %s (shard %d): balance %d, flows sum to %d", act, shard, v, flows))
		}
	}
	return nil
}

// ledgerFlowSQL: (kind, SUM) per kind other than credit, and (order_no, amount)
// per credit.
func (m *MySQL) ledgerFlowSQL(t tableRef) string {
	f := m.flowTable(t.shard)
	return fmt.Sprintf("SELECT kind AS k, '' AS id, SUM(amount) AS v, %d AS sh FROM %s WHERE kind <> 'credit' GROUP BY kind "+
		"UNION ALL SELECT 'credit', CONCAT(order_no, ' ', act_id), amount, %d FROM %s WHERE kind = 'credit'", int(t.shard), f, int(t.shard), f)
}

func scanFlows(rows *sql.Rows, l *model.Ledger) error {
	for rows.Next() {
		var kind, order string
		var sum int64
		var shard model.ShardID
		if err := rows.Scan(&kind, &order, &sum, &shard); err != nil {
			return err
		}
		switch kind {
		case "deposit":
			l.Deposits += model.Cents(sum)
		case "send":
			l.Sends += model.Cents(-sum)
		case "refund":
			l.RefundFlows += model.Cents(sum)
		case string(model.FlowReward):
			l.Rewards += model.Cents(sum)
		case string(model.FlowWithdraw):
			l.Withdrawals += model.Cents(-sum)
		case "credit":
			order, act, _ := strings.Cut(order, " ")
			id := strings.TrimPrefix(order, "claim:")
			if prev, dup := l.Credits[id]; dup {
				l.Problems = append(l.Problems, fmt.Sprintf("claim %s credited twice (to %s and %s)", id, prev.ActID, act))
				sum += int64(prev.Amount)
			}
			l.Credits[id] = model.Credit{ClaimID: id, ActID: act, Shard: shard, Amount: model.Cents(sum)}
		default:
			l.Problems = append(l.Problems, fmt.Sprintf("unknown flow kind %q", kind))
		}
	}
	return nil
}

// ledgerPacketSQL: one 'sum' row of totals, then one 'bad' row per packet whose
// claims, refund and remainder do not add up or whose state is impossible.
func (m *MySQL) ledgerPacketSQL(t tableRef) string {
	p, c := m.packetTable(t.shard, t.day), m.claimTable(t.shard, t.day)
	return fmt.Sprintf("SELECT 'sum' AS k, '' AS id, COUNT(*) AS a, COALESCE(SUM(amount), 0) AS b, COALESCE(SUM(remaining_amount), 0) AS c, "+
		"COALESCE(SUM(refund_amount), 0) AS d, 0 AS e, 0 AS f, 0 AS g, 0 AS h FROM %s "+
		"UNION ALL (SELECT 'bad', p.packet_id, p.amount, p.count, p.remaining_amount, p.remaining_count, p.refund_amount, p.status, "+
		"COALESCE(c.paid, 0), COALESCE(c.n, 0) FROM %s p LEFT JOIN "+
		"(SELECT packet_id, SUM(amount) AS paid, COUNT(*) AS n FROM %s GROUP BY packet_id) c ON c.packet_id = p.packet_id "+
		"WHERE COALESCE(c.paid, 0) + p.refund_amount + p.remaining_amount <> p.amount OR COALESCE(c.n, 0) + p.remaining_count <> p.count "+
		"OR (p.status = 0 AND p.remaining_amount < p.remaining_count) OR (p.status = 0 AND p.remaining_count = 0) "+
		"OR (p.status = 1 AND (p.remaining_count <> 0 OR p.remaining_amount <> 0)) "+
		"OR (p.status = 2 AND p.remaining_amount <> 0) LIMIT 100)", p, p, c)
}

func scanPackets(rows *sql.Rows, l *model.Ledger) error {
	for rows.Next() {
		var k, id string
		var v [8]int64
		if err := rows.Scan(&k, &id, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]); err != nil {
			return err
		}
		if k == "sum" {
			l.Packets += v[0]
			l.PacketTotals += model.Cents(v[1])
			l.OpenRemaining += model.Cents(v[2])
			l.RefundAmounts += model.Cents(v[3])
			continue
		}
		l.Problems = append(l.Problems, fmt.Sprintf("packet %s: amount %d count %d, claims %d in %d, refund %d, remaining %d in %d, status %d",
			id, v[0], v[1], v[6], v[7], v[4], v[2], v[3], v[5]))
	}
	return nil
}

func (m *MySQL) ledgerClaimSQL(t tableRef) string {
	return "SELECT " + claimCreditCols + " FROM " + m.claimTable(t.shard, t.day)
}

// scanClaims reads claims as the ledger holds them: ID, packet, seq,
// account, amount, ActShard (computed from act_id for a row made before the
// column existed) and Dest. CreatedMS is left 0, as the in-memory store's
// ledger leaves it: the audits do not read it.
func scanClaims(rows *sql.Rows, l *model.Ledger) error {
	for rows.Next() {
		cr, pos, err := scanClaimCredit(rows)
		if err != nil {
			return err
		}
		l.Claims[cr.ClaimID] = model.Claim{ID: cr.ClaimID, PacketID: cr.PacketID, Seq: pos.Seq, ActID: cr.ActID, Amount: cr.Amount,
			ActShard: cr.Shard, Dest: cr.Dest}
	}
	return nil
}

// readChunk runs the UNION ALL of parts, scans it into a fresh ledger and
// merges that into l only when the whole read succeeded, so a read that fails
// halfway never counts a row twice. A table created after the snapshot began
// (error 1412) holds no row the snapshot can see, so when one is in the chunk
// the tables are read one by one and that one is skipped: cells create day
// tables while they serve, so this is routine, not a fault.
func readChunk(ctx context.Context, q rowsQueryer, parts []string, scan func(*sql.Rows, *model.Ledger) error, l *model.Ledger) error {
	run := func(query string) error {
		rows, err := q.QueryContext(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		part := model.NewLedger("")
		if err := scan(rows, &part); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		l.Merge(part)
		return nil
	}
	err := run(strings.Join(parts, " UNION ALL "))
	if !isMySQLErr(err, errTableDefChanged) {
		return err
	}
	for _, p := range parts {
		if err := run(p); err != nil && !isMySQLErr(err, errTableDefChanged) {
			return err
		}
	}
	return nil
}
