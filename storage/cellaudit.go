package storage

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
)

// CellAudit checks this store's books as model.AuditCell checks its Ledger,
// in one consistent snapshot, with the memory of the process bounded however
// many rows there are. The server sums accounts, flows, packets and claims
// per table and returns the accounts whose balance is not the sum of their
// flows and the packets that do not add up (at most 100 per table, as
// Ledger); it joins each claim table with its database's outbox by primary
// key and returns one sum row and the claims without their outbox row or
// differing from it; it counts each outbox, and names the rows without a
// claim only when the counts say there are some; and it sorts every credit
// and outbox row into one stream by claim ID, which is checked here one
// claim ID at a time. What is kept: the sums, the count of each kind of
// difference with its 10 smallest claim IDs (model.DiffTally), and up to
// oddMax claims that disagree with their outbox row (whose credits are
// compared with the claim itself, as model.AuditCell does).
//
// It reports what model.AuditCell reports of the Ledger on every store whose
// claims each sit in the database of their outbox row (they are written in
// one transaction there) and, where rows disagree, as long as at most oddMax
// claims disagree with their outbox rows. Beyond that it may name a
// difference differently: a claim is matched with the outbox of its own
// database only; past oddMax a credit is compared with the outbox row of its
// claim; a claim credited more than once is a credit_mismatch even if the
// credits sum to the claim; at most 100 "credited twice" lines are written.
//
// Tables created while it reads make it start over with a new snapshot, up
// to 5 times, as Ledger does.
func (m *MySQL) CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error) {
	var b model.CellBooks
	err := retry.Do(ctx, retry.Policy{Attempts: 5, Backoff: 100 * time.Millisecond, Max: 100 * time.Millisecond,
		Retryable: tablesMoved, Clock: m.clock}, func(int) error {
		var err error
		b, err = m.cellBooksOnce(ctx, cell, owns)
		return err
	})
	if err != nil {
		return model.CellAudit{}, err
	}
	return b.Audit(), nil
}

// doubleCreditLines bounds the "credited twice" problem lines of a cell audit.
const doubleCreditLines = 100

func (m *MySQL) cellBooksOnce(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellBooks, error) {
	b := model.CellBooks{Cell: cell}
	tx, byKind, exists, done, err := m.snapshotTables(ctx, "cell audit")
	if err != nil {
		return b, err
	}
	defer done()
	hasOutbox := func(db int) bool { return exists[tableRef{kind: "outbox", shard: model.ShardID(db * 10)}] }

	// Sums and row-level problems of accounts and packets: Ledger's statements.
	l := model.NewLedger(cell)
	for _, r := range []struct {
		kind string
		sql  func(t tableRef) string
		scan func(rows *sql.Rows, l *model.Ledger) error
	}{
		{"account", m.ledgerAccountSQL, scanAccounts},
		{"packet", m.ledgerPacketSQL, scanPackets},
	} {
		if err := readTables(ctx, tx, byKind[r.kind], r.sql, r.scan, func() model.Ledger { return model.NewLedger("") }, l.Merge); err != nil {
			return b, fmt.Errorf("storage: cell audit of %s tables: %w", r.kind, err)
		}
	}
	b.Balances, b.PacketTotals, b.OpenRemaining, b.RefundAmounts, b.Packets = l.Balances, l.PacketTotals, l.OpenRemaining, l.RefundAmounts, l.Packets
	b.Problems = l.Problems

	// Flows as sums by kind.
	flowSQL := func(t tableRef) string {
		return "SELECT kind, COALESCE(SUM(amount), 0) FROM " + m.flowTable(t.shard) + " GROUP BY kind"
	}
	err = readTables(ctx, tx, byKind["flow"], flowSQL, func(rows *sql.Rows, p *model.CellBooks) error {
		for rows.Next() {
			var kind string
			var sum int64
			if err := rows.Scan(&kind, &sum); err != nil {
				return err
			}
			switch kind {
			case string(model.FlowDeposit):
				p.Deposits += model.Cents(sum)
			case string(model.FlowSend):
				p.Sends += model.Cents(-sum)
			case string(model.FlowRefund):
				p.RefundFlows += model.Cents(sum)
			case string(model.FlowCredit):
				p.CreditsIn += model.Cents(sum)
			case string(model.FlowReward):
				p.Rewards += model.Cents(sum)
			case string(model.FlowWithdraw):
				p.Withdrawals += model.Cents(-sum)
			default:
				p.Problems = append(p.Problems, fmt.Sprintf("unknown flow kind %q", kind))
			}
		}
		return nil
	}, func() model.CellBooks { return model.CellBooks{} }, func(p model.CellBooks) { mergeBooks(&b, p) })
	if err != nil {
		return b, fmt.Errorf("storage: cell audit of flow tables: %w", err)
	}

	// Claims against their database's outbox: one sum row per table, then
	// one row per claim without its outbox row ('m') or differing from it ('x').
	withRow := map[int]int64{} // by database: claims that have an outbox row
	var odd oddClaims          // claims and outbox rows that disagree
	claimSQL := func(t tableRef) string {
		c := m.claimTable(t.shard, t.day)
		if !hasOutbox(t.shard.DB()) {
			return fmt.Sprintf("SELECT 's' AS k, %d AS db, COUNT(*) AS n, COALESCE(SUM(amount), 0) AS v, 0 AS w, 0 AS p, '' AS id, '' AS act FROM %s "+
				"UNION ALL SELECT 'm', 0, 0, amount, 0, 0, CONCAT(packet_id, 'c', seq), act_id FROM %s", t.shard.DB(), c, c)
		}
		o := m.outboxTable(t.shard.DB())
		join := " FROM " + c + " c LEFT JOIN " + o + " o ON o.claim_id = CONCAT(c.packet_id, 'c', c.seq)"
		agree := "(o.act_id = c.act_id AND o.amount = c.amount)"
		return fmt.Sprintf("SELECT 's' AS k, %d AS db, COUNT(*) AS n, COALESCE(SUM(c.amount), 0) AS v, COALESCE(SUM(o.claim_id IS NOT NULL), 0) AS w, "+
			"COALESCE(SUM(o.claim_id IS NOT NULL AND %s AND o.state <> 1), 0) AS p, '' AS id, '' AS act%s "+
			"UNION ALL SELECT IF(o.claim_id IS NULL, 'm', 'x'), 0, 0, c.amount, 0, 0, CONCAT(c.packet_id, 'c', c.seq), c.act_id%s "+
			"WHERE o.claim_id IS NULL OR NOT %s", t.shard.DB(), agree, join, join, agree)
	}
	type claimPart struct {
		b       model.CellBooks
		withRow map[int]int64
		odd     oddClaims
	}
	err = readTables(ctx, tx, byKind["claim"], claimSQL, func(rows *sql.Rows, p *claimPart) error {
		for rows.Next() {
			var k, id, act string
			var db, n, sum, with, pending int64
			if err := rows.Scan(&k, &db, &n, &sum, &with, &pending, &id, &act); err != nil {
				return err
			}
			if k != "s" {
				p.odd.add(id, &model.Claim{ID: id, ActID: act, Amount: model.Cents(sum)})
			}
			switch k {
			case "s":
				p.b.Claims += int(n)
				p.b.Claimed += model.Cents(sum)
				p.b.OutboxPending += int(pending)
				p.withRow[int(db)] += with
			case "m":
				p.b.Diffs.Add(model.DiffOutboxMissing, id)
			default:
				p.b.Diffs.Add(model.DiffOutboxMismatch, id)
			}
		}
		return nil
	}, func() claimPart { return claimPart{withRow: map[int]int64{}} }, func(p claimPart) {
		mergeBooks(&b, p.b)
		for db, n := range p.withRow {
			withRow[db] += n
		}
		odd.merge(p.odd)
	})
	if err != nil {
		return b, fmt.Errorf("storage: cell audit of claim tables: %w", err)
	}

	// Outbox rows without their claim: counted per database, named only when
	// there are some.
	var outboxes []tableRef
	claimsOf := map[int][]tableRef{}
	for _, t := range byKind["claim"] {
		claimsOf[t.shard.DB()] = append(claimsOf[t.shard.DB()], t)
	}
	for _, t := range byKind["outbox"] {
		outboxes = append(outboxes, t)
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+m.outboxTable(t.shard.DB())).Scan(&n); err != nil {
			return b, fmt.Errorf("storage: cell audit of outbox of db %d: %w", t.shard.DB(), err)
		}
		if n == withRow[t.shard.DB()] {
			continue
		}
		if err := m.outboxOrphans(ctx, tx, t.shard.DB(), claimsOf[t.shard.DB()], &b.Diffs, &odd); err != nil {
			return b, err
		}
	}

	if err := m.auditCredits(ctx, tx, byKind["flow"], outboxes, owns, odd, &b); err != nil {
		return b, err
	}
	sort.Strings(b.Problems)
	return b, nil
}

// mergeBooks adds the sums, problems and differences of part to b.
func mergeBooks(b *model.CellBooks, p model.CellBooks) {
	b.Deposits += p.Deposits
	b.Rewards += p.Rewards
	b.CreditsIn += p.CreditsIn
	b.RefundFlows += p.RefundFlows
	b.Sends += p.Sends
	b.Withdrawals += p.Withdrawals
	b.Claimed += p.Claimed
	b.Claims += p.Claims
	b.OutboxPending += p.OutboxPending
	b.Problems = append(b.Problems, p.Problems...)
	b.Diffs.Merge(p.Diffs)
}

// outboxOrphans names the outbox rows of database db whose claim is in none
// of its claim tables (claims). Only called when the counts say there are some.
func (m *MySQL) outboxOrphans(ctx context.Context, tx rowsQueryer, db int, claims []tableRef, d *model.DiffTally, odd *oddClaims) error {
	q := "SELECT claim_id FROM " + m.outboxTable(db) + " o"
	var conds []string
	for _, t := range claims {
		conds = append(conds, "NOT EXISTS (SELECT 1 FROM "+m.claimTable(t.shard, t.day)+
			" c WHERE c.packet_id = LEFT(o.claim_id, 27) AND CONCAT(c.packet_id, 'c', c.seq) = o.claim_id)")
	}
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	rows, err := tx.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("storage: cell audit, outbox orphans of db %d: %w", db, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		d.Add(model.DiffOutboxOrphan, id)
		odd.add(id, nil)
	}
	return rows.Err()
}

// auditCredits compares every credit with the outbox rows and the claims, as
// model.AuditCell does: delivered rows of owned claimants without their
// credit or differing from it, credits of owned packets without their claim
// or differing from it (unless compared from the outbox side already),
// credits of other cells' packets (counted), and claims credited more than
// once. The server reads every credit and outbox row into one stream sorted
// by claim ID; this merges it one claim ID at a time, so it holds only the
// rows of one claim. odd holds the claims that disagree with their outbox
// row (or have none), which are compared with the claim itself.
func (m *MySQL) auditCredits(ctx context.Context, tx rowsQueryer, flows, outboxes []tableRef, owns func(model.ShardID) bool, odd oddClaims, b *model.CellBooks) error {
	var parts []string
	for _, t := range flows {
		parts = append(parts, "SELECT IF(order_no LIKE 'claim:%', SUBSTRING(order_no, 7), order_no) AS id, 1 AS src, act_id AS act, "+
			"amount, 0 AS state, 0 AS shard FROM "+m.flowTable(t.shard)+" WHERE kind = 'credit'")
	}
	for _, t := range outboxes {
		parts = append(parts, "SELECT claim_id, 0, act_id, amount, state, act_shard FROM "+m.outboxTable(t.shard.DB()))
	}
	if len(parts) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT id, src, act, amount, state, shard FROM ("+strings.Join(parts, " UNION ALL ")+
		") u ORDER BY CAST(id AS BINARY), src")
	if err != nil {
		return fmt.Errorf("storage: cell audit of credits: %w", err)
	}
	defer rows.Close()
	var g creditGroup
	twice := 0
	for rows.Next() {
		var id, act string
		var src, state int
		var amount int64
		var shard model.ShardID
		if err := rows.Scan(&id, &src, &act, &amount, &state, &shard); err != nil {
			return fmt.Errorf("storage: cell audit of credits: %w", err)
		}
		if id != g.id {
			twice += g.check(owns, odd, b, twice)
			g = creditGroup{id: id}
		}
		if src == 0 {
			if !g.hasOutbox { // a second row of one claim ID (in two databases) is an orphan of its own
				g.hasOutbox, g.outbox = true, model.OutboxRow{ClaimID: id, ActID: act, Amount: model.Cents(amount), Delivered: state == 1, Shard: shard}
			}
			continue
		}
		g.acts = append(g.acts, act)
		g.sum += model.Cents(amount)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("storage: cell audit of credits: %w", err)
	}
	twice += g.check(owns, odd, b, twice)
	if twice > doubleCreditLines {
		b.Problems = append(b.Problems, fmt.Sprintf("%d more credits of claims credited twice", twice-doubleCreditLines))
	}
	return nil
}

// creditGroup is what the cell holds of one claim ID: its outbox row and
// the credits booked for it.
type creditGroup struct {
	id        string
	hasOutbox bool
	outbox    model.OutboxRow
	acts      []string    // accounts credited, as read
	sum       model.Cents // credited in all
}

// check adds what the group shows to b, as model.CellBooksOf does, and
// returns how many "credited twice" lines it found (written while shown+found
// stays within doubleCreditLines).
func (g creditGroup) check(owns func(model.ShardID) bool, odd oddClaims, b *model.CellBooks, shown int) int {
	if g.id == "" && !g.hasOutbox && len(g.acts) == 0 {
		return 0
	}
	// The claim: from the outbox row when the two agree, else as found.
	var claim *model.Claim
	if odd.has(g.id) {
		claim = odd.claims[g.id]
	} else if g.hasOutbox {
		claim = &model.Claim{ID: g.id, ActID: g.outbox.ActID, Amount: g.outbox.Amount}
	}
	differs := func(act string, amount model.Cents) bool {
		return len(g.acts) != 1 || g.acts[0] != act || g.sum != amount
	}
	checked := g.hasOutbox && g.outbox.Delivered && !odd.has(g.id) && owns(g.outbox.Shard)
	if checked {
		switch {
		case len(g.acts) == 0:
			b.Diffs.Add(model.DiffCreditMissing, g.id)
		case differs(g.outbox.ActID, g.outbox.Amount):
			b.Diffs.Add(model.DiffCreditMismatch, g.id)
		}
	}
	if len(g.acts) == 0 {
		return 0
	}
	found := 0
	if len(g.acts) > 1 {
		acts := slices.Clone(g.acts)
		slices.Sort(acts)
		for i := 1; i < len(acts); i++ {
			if found++; shown+found <= doubleCreditLines {
				b.Problems = append(b.Problems, fmt.Sprintf("claim %s credited twice (to %s and %s)", g.id, acts[i-1], acts[i]))
			}
		}
	}
	ref, _, err := model.ParseClaimID(g.id)
	switch {
	case err == nil && !owns(ref.Shard):
		b.CreditsElsewhere++ // its claim lives in the cell its packet was sent in
	case err != nil || claim == nil:
		b.Diffs.Add(model.DiffCreditOrphan, g.id)
	case !checked && differs(claim.ActID, claim.Amount):
		b.Diffs.Add(model.DiffCreditMismatch, g.id)
	}
	return found
}

// oddMax bounds the claims a cell audit compares with their credits one by
// one (claims that disagree with their outbox rows). Past it the audit names
// those differences as the server's joins find them.
const oddMax = 10_000

// oddClaims are claims that disagree with their outbox row, by claim ID: the
// claim (nil for an outbox row without one). Over oddMax it holds none and
// says so: has then answers false for every ID.
type oddClaims struct {
	claims map[string]*model.Claim
	over   bool
}

func (o *oddClaims) add(id string, c *model.Claim) {
	if o.over {
		return
	}
	if o.claims == nil {
		o.claims = map[string]*model.Claim{}
	}
	o.claims[id] = c
	if len(o.claims) > oddMax {
		o.claims, o.over = nil, true
	}
}

func (o *oddClaims) merge(p oddClaims) {
	if p.over {
		o.claims, o.over = nil, true
	}
	for id, c := range p.claims {
		o.add(id, c)
	}
}

func (o oddClaims) has(id string) bool { _, ok := o.claims[id]; return ok }

// readTables runs sqlOf of each table, ledgerChunk tables to a UNION ALL
// statement, scans each statement's rows into a fresh part (newPart) and
// hands it to merge only when the whole statement was read, so a statement
// failing halfway never counts a row twice. A table created after the
// snapshot began (error 1412) holds no row the snapshot can see: when one is
// in a chunk, the chunk's tables are read one by one and that one skipped.
func readTables[T any](ctx context.Context, q rowsQueryer, tables []tableRef, sqlOf func(tableRef) string,
	scan func(*sql.Rows, *T) error, newPart func() T, merge func(T)) error {
	run := func(query string) error {
		rows, err := q.QueryContext(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		part := newPart()
		if err := scan(rows, &part); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		merge(part)
		return nil
	}
	for start := 0; start < len(tables); start += ledgerChunk {
		end := min(start+ledgerChunk, len(tables))
		parts := make([]string, 0, end-start)
		for _, t := range tables[start:end] {
			parts = append(parts, "("+sqlOf(t)+")")
		}
		err := run(strings.Join(parts, " UNION ALL "))
		if !isMySQLErr(err, errTableDefChanged) {
			if err != nil {
				return err
			}
			continue
		}
		for _, p := range parts {
			if err := run(p); err != nil && !isMySQLErr(err, errTableDefChanged) {
				return err
			}
		}
	}
	return nil
}
