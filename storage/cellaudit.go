package storage

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
	"redcell/sharding"
)

// CellAudit checks this store's books as model.AuditCell checks its Ledger,
// with the memory of the process bounded however many rows there are. The
// server sums accounts, flows and packets per table and returns the accounts
// whose balance is not the sum of their flows and the packets that do not add
// up (at most 100 per table, as Ledger). Claims and credits are compared as
// two streams sorted by claim ID, merged here one claim ID at a time: every
// credit flow in one statement over the flow tables; the claims in a series
// of statements of at most claimChunk tables each, one per date of the claim
// IDs (the packets' creation dates, read first) and run of shards, each
// statement's claims following the last's. Per claim ID it counts and sums
// the claim; a claim whose claimant's shard the cell owns (its act_shard, or
// sharding.ShardOfAct of its act_id in a row made before that column) is
// pending while no credit of it is booked here, and a credit_mismatch when
// its credit names another account or amount; a credit of an owned packet
// shard without its claim is a credit_orphan, or a credit_mismatch when it
// differs from its claim (and was not compared from the claim's side); a
// credit of another cell's packet is counted (CreditsElsewhere). What is
// kept: the sums and the count of each kind of difference with its 10
// smallest claim IDs (model.DiffTally).
//
// Everything but the credit stream is read in one consistent snapshot; the
// credit stream in one of its own, begun just before it: every credit it
// sees has its claim (committed before the credit) in the other, and a
// credit booked in between only makes its claim look pending. It holds two
// of the pool's connections while it reads (a cell's pool has at least two).
//
// It reports what model.AuditCell reports of the Ledger, but where a claim
// is credited more than once: that is a credit_mismatch even if the credits
// sum to the claim, and at most 100 "credited twice" lines are written;
// where a claim ID is found in two claim tables: it is counted once, as its
// first row; and where a claim sits in the table of another shard or day
// than its ID names: it is counted, named in a problem line and not compared.
//
// Tables created while it reads make it start over with new snapshots, up
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
	// The credits' snapshot begins first (see CellAudit).
	cr, err := m.db.Conn(ctx)
	if err != nil {
		return b, fmt.Errorf("storage: cell audit: %w", err)
	}
	if _, err := cr.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		cr.Close()
		return b, fmt.Errorf("storage: cell audit: %w", err)
	}
	defer func() {
		_, _ = cr.ExecContext(context.Background(), "ROLLBACK")
		cr.Close()
	}()
	tx, byKind, exists, done, err := m.snapshotTables(ctx, "cell audit")
	if err != nil {
		return b, err
	}
	defer done()

	// Sums and row-level problems of accounts and packets: Ledger's statements.
	l := model.NewLedger(cell)
	for _, r := range []struct {
		kind string
		sql  func(t tableRef) string
		scan func(rows *sql.Rows, l *model.Ledger) error
	}{
		{"account", m.ledgerAccountSQL(exists), scanAccounts},
		{"packet", m.ledgerPacketSQL, scanPackets},
	} {
		if err := readTables(ctx, tx, byKind[r.kind], r.sql, r.scan, func() model.Ledger { return model.NewLedger("") }, l.Merge); err != nil {
			return b, fmt.Errorf("storage: cell audit of %s tables: %w", r.kind, err)
		}
	}
	b.Balances, b.PacketTotals, b.OpenRemaining, b.RefundAmounts, b.Packets = l.Balances, l.PacketTotals, l.OpenRemaining, l.RefundAmounts, l.Packets
	b.Problems = l.Problems

	// What the retention export carried out of the tables.
	x, err := m.exportedSums(ctx, tx, byKind["carry"], byKind["flowcarry"])
	if err != nil {
		return b, err
	}
	b.Exported = x.Exported
	b.Deposits, b.Sends, b.RefundFlows, b.Rewards, b.Withdrawals = x.Deposits, x.Sends, x.RefundFlows, x.Rewards, x.Withdrawals
	b.CreditsIn, b.Claimed = x.Exported.CreditCents, x.Exported.ClaimCents
	b.PacketTotals += x.PacketTotals
	b.RefundAmounts += x.RefundAmounts
	b.OpenRemaining += x.OpenRemaining
	b.Packets += x.Packets
	b.Problems = append(b.Problems, x.Problems...)

	// Flows as sums by kind.
	flowSQL := func(t tableRef) string {
		return "SELECT kind, COALESCE(SUM(amount), 0) FROM " + m.flowTable(t.shard) + " GROUP BY kind"
	}
	err = readTables(ctx, tx, byKind["flow"], flowSQL, scanFlowSums, func() model.CellBooks { return model.CellBooks{} }, func(p model.CellBooks) { mergeBooks(&b, p) })
	if err != nil {
		return b, fmt.Errorf("storage: cell audit of flow tables: %w", err)
	}

	segs, err := m.claimSegments(ctx, tx, byKind["claim"])
	if err != nil {
		return b, err
	}
	if err := m.auditClaims(ctx, cr, tx, byKind["flow"], segs, owns, &b); err != nil {
		return b, err
	}
	sort.Strings(b.Problems)
	return b, nil
}

// scanFlowSums reads the rows of a flow table's sums by kind into p; an
// unknown kind is a problem of p. Errors: the scan's.
func scanFlowSums(rows *sql.Rows, p *model.CellBooks) error {
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
	b.CreditsPending += p.CreditsPending
	b.Problems = append(b.Problems, p.Problems...)
	b.Diffs.Merge(p.Diffs)
}

// claimChunk bounds the claim tables one statement of a cell audit reads
// (a statement over thousands of tables fails).
const claimChunk = ledgerChunk

// claimSegment is one statement of the claim stream: the claims of date (the
// first 8 characters of their IDs) in tables, all of other shards than the
// segments of that date before it, in shard order.
type claimSegment struct {
	date   string
	tables []tableRef
}

// claimSegments reads which dates the claim IDs of each claim table hold
// (claimChunk tables a statement) and lays out the claim stream: by date,
// then by shard, claimChunk tables (with a shard's day and archive tables
// in one) a segment. A table created after the snapshot began holds no row
// it sees and is left out.
func (m *MySQL) claimSegments(ctx context.Context, tx rowsQueryer, claims []tableRef) ([]claimSegment, error) {
	byDate := map[string][]tableRef{}
	datesSQL := func(t tableRef) string {
		return fmt.Sprintf("SELECT %d AS s, %d AS d, LEFT(packet_id, 8) AS dt FROM %s GROUP BY dt", int(t.shard), t.day, m.claimTable(t.shard, t.day))
	}
	err := readTables(ctx, tx, claims, datesSQL, func(rows *sql.Rows, p *map[string][]tableRef) error {
		for rows.Next() {
			var t tableRef
			var date string
			if err := rows.Scan(&t.shard, &t.day, &date); err != nil {
				return err
			}
			t.kind = "claim"
			(*p)[date] = append((*p)[date], t)
		}
		return nil
	}, func() map[string][]tableRef { return map[string][]tableRef{} }, func(p map[string][]tableRef) {
		for d, ts := range p {
			byDate[d] = append(byDate[d], ts...)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("storage: cell audit, dates of claims: %w", err)
	}
	var segs []claimSegment
	for _, date := range slices.Sorted(maps.Keys(byDate)) {
		ts := byDate[date]
		slices.SortFunc(ts, func(a, b tableRef) int { return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.day, b.day)) })
		for len(ts) > 0 {
			n := min(claimChunk, len(ts))
			for n < len(ts) && n > 1 && ts[n].shard == ts[n-1].shard {
				n-- // a shard's tables in one segment: their claims interleave
			}
			segs = append(segs, claimSegment{date: date, tables: ts[:n]})
			ts = ts[n:]
		}
	}
	return segs, nil
}

// auditClaims compares every claim with the credits booked for it, and every
// credit with its claim, as model.CellBooksOf does (see CellAudit), and
// counts and sums the claims. The credits stream from cr, the claims from
// tx, segment after segment; both sorted by claim ID, they are merged here
// one claim ID at a time, so it holds only the rows of one claim.
func (m *MySQL) auditClaims(ctx context.Context, cr, tx rowsQueryer, flows []tableRef, segs []claimSegment, owns func(model.ShardID) bool, b *model.CellBooks) error {
	credits := &creditStream{}
	if len(flows) > 0 {
		parts := make([]string, 0, len(flows))
		for _, t := range flows {
			parts = append(parts, "SELECT IF(order_no LIKE 'claim:%', SUBSTRING(order_no, 7), order_no) AS id, act_id AS act, amount FROM "+
				m.flowTable(t.shard)+" WHERE kind = 'credit'")
		}
		rows, err := cr.QueryContext(ctx, "SELECT id, act, amount FROM ("+strings.Join(parts, " UNION ALL ")+") u ORDER BY CAST(id AS BINARY)")
		if err != nil {
			return fmt.Errorf("storage: cell audit of credits: %w", err)
		}
		defer rows.Close()
		credits.rows = rows
	}
	claims := &claimStream{ctx: ctx, m: m, tx: tx, segs: segs}
	defer claims.close()
	if err := credits.next(); err != nil {
		return err
	}
	if err := claims.next(b); err != nil {
		return err
	}
	twice := 0
	for credits.ok || claims.ok {
		id := claims.id
		if !claims.ok || credits.ok && credits.id < id {
			id = credits.id
		}
		g := claimGroup{id: id}
		for claims.ok && claims.id == id {
			if g.claim == nil { // a second row of one claim ID (in two tables) is not counted again
				c := claims.claim
				g.claim = &c
				b.Claims++
				b.Claimed += c.Amount
			}
			if err := claims.next(b); err != nil {
				return err
			}
		}
		for credits.ok && credits.id == id {
			g.acts = append(g.acts, credits.act)
			g.sum += credits.amount
			if err := credits.next(); err != nil {
				return err
			}
		}
		twice += g.check(owns, b, twice)
	}
	if twice > doubleCreditLines {
		b.Problems = append(b.Problems, fmt.Sprintf("%d more credits of claims credited twice", twice-doubleCreditLines))
	}
	return nil
}

// creditStream is the credit flows in claim ID order: the current one
// (ok false once read to the end).
type creditStream struct {
	rows   *sql.Rows
	ok     bool
	id     string
	act    string
	amount model.Cents
}

func (c *creditStream) next() error {
	c.ok = false
	if c.rows == nil {
		return nil
	}
	if c.rows.Next() {
		c.ok = true
		if err := c.rows.Scan(&c.id, &c.act, &c.amount); err != nil {
			return fmt.Errorf("storage: cell audit of credits: %w", err)
		}
		return nil
	}
	if err := c.rows.Err(); err != nil {
		return fmt.Errorf("storage: cell audit of credits: %w", err)
	}
	return nil
}

// claimStream is the claims in claim ID order, read segment by segment: the
// current one (ok false once read to the end).
type claimStream struct {
	ctx   context.Context
	m     *MySQL
	tx    rowsQueryer
	segs  []claimSegment
	rows  *sql.Rows
	ok    bool
	id    string
	claim model.Claim
}

// next moves to the next claim. A claim in the table of another shard or
// day than its ID names cannot be placed in the order: it is counted in b,
// named in a problem line and skipped.
func (c *claimStream) next(b *model.CellBooks) error {
	c.ok = false
	for {
		if c.rows == nil {
			if len(c.segs) == 0 {
				return nil
			}
			seg := c.segs[0]
			c.segs = c.segs[1:]
			var u union
			for _, t := range seg.tables {
				u.add(fmt.Sprintf("SELECT CONCAT(packet_id, 'c', seq) AS id, act_id, amount, act_shard, %d AS s, %d AS d FROM %s WHERE packet_id LIKE ?",
					int(t.shard), t.day, c.m.claimTable(t.shard, t.day)), seg.date+"%")
			}
			q, args := u.sql()
			rows, err := c.tx.QueryContext(c.ctx, "SELECT id, act_id, amount, act_shard, s, d FROM ("+q+") u ORDER BY CAST(id AS BINARY)", args...)
			if err != nil {
				return fmt.Errorf("storage: cell audit of claims of %s: %w", seg.date, err)
			}
			c.rows = rows
		}
		if !c.rows.Next() {
			err := c.rows.Err()
			c.close()
			if err != nil {
				return fmt.Errorf("storage: cell audit of claims: %w", err)
			}
			continue
		}
		var cl model.Claim
		var shard, tableShard model.ShardID
		var day int
		if err := c.rows.Scan(&cl.ID, &cl.ActID, &cl.Amount, &shard, &tableShard, &day); err != nil {
			return fmt.Errorf("storage: cell audit of claims: %w", err)
		}
		cl.ActShard = shard
		if shard < 0 {
			cl.ActShard = sharding.ShardOfAct(cl.ActID)
		}
		if ref, _, err := model.ParseClaimID(cl.ID); err != nil || ref.Shard != tableShard || day != ArchiveDay && ref.Day != day {
			b.Claims++
			b.Claimed += cl.Amount
			b.Problems = append(b.Problems, fmt.Sprintf("claim %s of %d cents to %s is in the claim table of shard %d, day %d",
				cl.ID, cl.Amount, cl.ActID, tableShard, day))
			continue
		}
		c.ok, c.id, c.claim = true, cl.ID, cl
		return nil
	}
}

func (c *claimStream) close() {
	if c.rows != nil {
		c.rows.Close()
		c.rows = nil
	}
}

// claimGroup is what the cell holds of one claim ID: its claim (nil when
// there is none) and the credits booked for it.
type claimGroup struct {
	id    string
	claim *model.Claim
	acts  []string    // accounts credited, as read
	sum   model.Cents // credited in all
}

// check adds what the group shows to b, as model.CellBooksOf does, and
// returns how many "credited twice" lines it found (written while shown+found
// stays within doubleCreditLines).
func (g claimGroup) check(owns func(model.ShardID) bool, b *model.CellBooks, shown int) int {
	if g.claim == nil && len(g.acts) == 0 {
		return 0
	}
	differs := func() bool {
		return len(g.acts) != 1 || g.acts[0] != g.claim.ActID || g.sum != g.claim.Amount
	}
	checked := false // compared from the claim's side
	if c := g.claim; c != nil {
		if owns(c.ActShard) {
			checked = true
			switch {
			case len(g.acts) == 0 && b.Exported.CreditMayBeExported(g.id, c.ActShard.DB()):
				// its credit may be in an export file
			case len(g.acts) == 0:
				b.CreditsPending++
			case differs():
				b.Diffs.Add(model.DiffCreditMismatch, g.id)
			}
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
	case g.claim == nil && b.Exported.ClaimMayBeExported(g.id):
		// its claim may be in an export file
	case err != nil || g.claim == nil:
		b.Diffs.Add(model.DiffCreditOrphan, g.id)
	case !checked && differs():
		b.Diffs.Add(model.DiffCreditMismatch, g.id)
	}
	return found
}

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
