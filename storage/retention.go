package storage

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"redcell/model"
)

// The retention export (ExportPass) takes rows past a cut out of a
// database's tables into checksummed files, in steps of at most Chunk rows,
// each step one transaction: the rows are written to a file (fsynced, with
// its SHA-256 beside it), then deleted, their sums added to the database's
// carry tables and the file recorded in its export log, in one commit. A
// file no log row names (a step that failed or died before its commit) is
// removed by the next pass over that database, so the files on disk hold
// each exported row exactly once.
//
// Three tables in each database (db_XX) keep what the audits need of the
// rows that left, and move with the database:
//   - t_export_carry: sums by key (k): "flow:KIND" (rows, signed sum),
//     "packets", "packet_refunds", "packet_remaining", "claims",
//     "rewards", "reward_issued", "reward_booked", "reward_into_wallet",
//     "lease:ID" (what the lease's exported rewards spent), "coupon_refused",
//     "coupon_refused_no_reason", and the two horizons (claimsHorizon,
//     creditsHorizon);
//   - t_flow_carry: per account, the sum of its exported flows, so its
//     balance is still carry + the flows in the table;
//   - t_export_log: one row per file (relative name, kind, rows, cents,
//     SHA-256).
const (
	exportEnsure = -7 // the ensureKey.day of a database's export tables

	// DefaultExportChunk is ExportPass.Chunk's default: rows one step exports.
	DefaultExportChunk = 1000
	// DefaultClaimWindow is ExportPass.ClaimWindow's default: a packet
	// made at the end of its day, expiring after 24 h, takes opens for 48 h
	// more; and a day to spare.
	DefaultClaimWindow = 24*time.Hour + 24*time.Hour + 72*time.Hour
)

func (m *MySQL) carryTable(db int) string     { return m.tableNamesOf().db[db] + ".t_export_carry" }
func (m *MySQL) flowCarryTable(db int) string { return m.tableNamesOf().db[db] + ".t_flow_carry" }
func (m *MySQL) exportLogTable(db int) string { return m.tableNamesOf().db[db] + ".t_export_log" }

// exportDDL makes database db's export tables: t_export_carry last, so that
// an audit whose snapshot can read it can read the other two (a table made
// after a snapshot began fails its reads), and with its two horizon rows,
// which every export step of claims or credits locks first.
func (m *MySQL) exportDDL(db int) []string {
	return []string{
		"CREATE TABLE IF NOT EXISTS " + m.flowCarryTable(db) + ` (
  act_id VARCHAR(64) NOT NULL PRIMARY KEY,
  n      BIGINT NOT NULL,
  amount BIGINT NOT NULL
) ENGINE=InnoDB`,
		"CREATE TABLE IF NOT EXISTS " + m.exportLogTable(db) + ` (
  file       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  kind       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  n          BIGINT NOT NULL,
  cents      BIGINT NOT NULL,
  sha256     CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  created_ms BIGINT NOT NULL
) ENGINE=InnoDB`,
		"CREATE TABLE IF NOT EXISTS " + m.carryTable(db) + ` (
  k      VARCHAR(80) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  n      BIGINT NOT NULL DEFAULT 0,
  amount BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB`,
		"INSERT IGNORE INTO " + m.carryTable(db) + " (k, n, amount) VALUES ('" + claimsHorizon + "', 0, 0), ('" + creditsHorizon + "', 0, 0)",
	}
}

// The carry keys of the two horizons (YYYYMMDD as a number; 0: none):
// claimsHorizon, of the database's claims (with their packets) exported,
// all dated before it; creditsHorizon, of the credit flows exported from
// its wallets, all of claims dated before it.
const (
	claimsHorizon  = "claims_horizon"
	creditsHorizon = "credits_horizon"
	flowCarryProbe = "(t_flow_carry rows)" // exportedSums' rows of t_flow_carry counts, never a carry key
)

// ExportResult is what one ExportPass did, for logs and metrics.
type ExportResult struct {
	Files   int              // files written and recorded
	Rows    map[string]int64 // rows exported, by kind: "packets", "claims", "flows", "rewards", "coupons"
	Cents   model.Cents      // the exported packets' and flows' amounts (flows as absolute values)
	Orphans int              // files of earlier steps that never committed, removed
	// Held counts databases whose claims and credits were not exported:
	// reconciliation has not checked them (no position), so their claims
	// stay until it has.
	Held int
}

// ExportPass is one retention export over the databases Owns says are the
// cell's (as a typed op through CommitGroup): rows created before BeforeMS
// (Unix ms) leave their tables for files under Dir/<database>/:
//   - archived packets with their claims (t_packet_Y_00, t_claim_Y_00), by
//     the date in their IDs, and credit flows by their claims' dates: dated
//     before the day of the earliest of BeforeMS, the relay's position and
//     reconciliation's position in the database, less ClaimWindow (a claim
//     is made at most that long after its packet's day began), so every
//     claim of an exported packet was made before both positions; a
//     database reconciliation never checked keeps them (Result.Held);
//   - other flows (deposits, sends, refunds, withdrawals) created before
//     BeforeMS;
//   - booked reward rows created and booked before BeforeMS, each with its
//     reward flow (written at the booking) in the same step;
//   - refused coupon requests accepted before BeforeMS (an issued request is
//     the coupon its person holds, and stays).
//
// An order number repeated after its row left is a new request: the
// retention must be longer than any client retries. Errors: ErrNoArchive
// from a store without these tables (memstore), the database's, the file
// system's; what a step committed before an error stays exported.
type ExportPass struct {
	Owns func(model.ShardID) bool
	// Enter, when set, is asked before each step of database db: ok false
	// ends the database's export for this pass (it stopped being served,
	// say a move froze it); else leave is called once the step ended, so a
	// freeze can wait for the step in flight.
	Enter    func(db int) (leave func(), ok bool)
	BeforeMS int64
	Dir      string
	Chunk    int // rows per step (a packet with all its claims may pass it); 0: DefaultExportChunk
	// ClaimWindow bounds how long after its packet's day began a claim can
	// be made (a day + the cell's packet expiry + 72 h); 0:
	// DefaultClaimWindow.
	ClaimWindow time.Duration

	Result ExportResult
}

func (*ExportPass) isOp() {}

// Export runs one ExportPass through g and answers its result.
func Export(ctx context.Context, g Grouper, p ExportPass) (ExportResult, error) {
	err := g.CommitGroup(ctx, []Op{&p})
	return p.Result, err
}

// export runs ExportPass p, database after database.
func (m *MySQL) export(ctx context.Context, p *ExportPass) error {
	p.Result.Rows = map[string]int64{}
	if p.Dir == "" {
		return errors.New("storage: export: no directory for the export files")
	}
	if p.Chunk <= 0 {
		p.Chunk = DefaultExportChunk
	}
	if p.ClaimWindow <= 0 {
		p.ClaimWindow = DefaultClaimWindow
	}
	all, err := m.tables(ctx, m.db)
	if err != nil {
		return err
	}
	byDB := map[int][]tableRef{}
	for _, t := range all {
		if p.Owns(model.ShardID(t.shard.DB() * 10)) {
			byDB[t.shard.DB()] = append(byDB[t.shard.DB()], t)
		}
	}
	recon, err := m.reconPositions(ctx)
	if err != nil {
		return err
	}
	for _, db := range sortedKeys(byDB) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := m.exportDB(ctx, p, db, byDB[db], recon); err != nil {
			return fmt.Errorf("storage: export of %s: %w", m.tableNamesOf().db[db], err)
		}
	}
	return nil
}

// exportDB exports one database's rows past the cut (ExportPass).
func (m *MySQL) exportDB(ctx context.Context, p *ExportPass, db int, tables []tableRef, recon map[int]int64) error {
	leave, ok := enterDB(p.Enter, db)
	if !ok {
		return nil
	}
	err := m.ensure(ctx, ensureKey{shard: model.ShardID(db * 10), day: exportEnsure}, m.exportDDL(db))
	leave()
	if err != nil {
		return err
	}
	dir := filepath.Join(p.Dir, m.tableNamesOf().db[db]) // made by the first file
	if err := m.removeOrphans(ctx, db, dir, &p.Result); err != nil {
		return err
	}
	// Claims and credits: dated before the day of the claim cut.
	var date string
	claimCut := p.BeforeMS
	pos, err := m.relayPositions(ctx, []int{db})
	if err != nil {
		return err
	}
	if r, ok := recon[db]; !ok {
		claimCut = 0
		p.Result.Held++
	} else {
		claimCut = min(claimCut, r)
		if rp, ok := pos[db]; ok {
			claimCut = min(claimCut, rp)
		}
	}
	if claimCut > 0 {
		date = time.UnixMilli(claimCut).Add(-p.ClaimWindow).UTC().Format("20060102")
	}
	has := map[string]bool{}
	for _, t := range tables {
		has[t.kind] = true
	}
	x := exporter{m: m, p: p, db: db, dir: dir, date: date}
	for _, t := range tables {
		if date != "" && t.kind == "packet" && t.day == ArchiveDay && slices.Contains(tables, tableRef{kind: "claim", shard: t.shard, day: ArchiveDay}) {
			if err := x.loop(ctx, func(ctx context.Context) (bool, error) { return x.packets(ctx, t.shard) }); err != nil {
				return err
			}
		}
	}
	for _, t := range tables {
		if t.kind == "flow" {
			after := int64(0)
			if err := x.loop(ctx, func(ctx context.Context) (bool, error) { return x.flows(ctx, t.shard, &after) }); err != nil {
				return err
			}
		}
	}
	if has["reward"] {
		if err := x.loop(ctx, x.rewards); err != nil {
			return err
		}
	}
	if has["coupon_req"] {
		if err := x.loop(ctx, x.coupons); err != nil {
			return err
		}
	}
	return nil
}

// removeOrphans removes the files in dir that no row of db's export log
// names (written by a step that never committed), and temporary files. It
// looks the files up 500 names a statement.
func (m *MySQL) removeOrphans(ctx context.Context, db int, dir string, res *ExportResult) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	base := filepath.Base(dir)
	var names []any
	for _, e := range ents {
		switch name := e.Name(); {
		case strings.HasSuffix(name, ".tmp"):
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		case strings.HasSuffix(name, ".jsonl"):
			names = append(names, base+"/"+name)
		}
	}
	for len(names) > 0 {
		batch := names[:min(len(names), 500)]
		names = names[len(batch):]
		logged := map[string]bool{}
		err := scanEach(ctx, m.db, "SELECT file FROM "+m.exportLogTable(db)+" WHERE file IN ("+placeholders(len(batch))+")", func(rows *sql.Rows) error {
			var f string
			err := rows.Scan(&f)
			logged[f] = true
			return err
		}, batch...)
		if err != nil {
			return err
		}
		for _, f := range batch {
			if logged[f.(string)] {
				continue
			}
			res.Orphans++
			path := filepath.Join(dir, filepath.Base(f.(string)))
			if err := os.Remove(path); err != nil {
				return err
			}
			if err := os.Remove(path + ".sha256"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// enterDB asks enter (ArchivePass.Enter, ExportPass.Enter) about db; a nil
// enter lets every step go.
func enterDB(enter func(db int) (func(), bool), db int) (leave func(), ok bool) {
	if enter == nil {
		return func() {}, true
	}
	return enter(db)
}

// exporter runs the steps of one database's export.
type exporter struct {
	m    *MySQL
	p    *ExportPass
	db   int
	dir  string
	date string // claims and credits dated before this (YYYYMMDD) leave; "" none
}

// loop runs step until it reports it is done.
func (x *exporter) loop(ctx context.Context, step func(context.Context) (more bool, err error)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		leave, ok := enterDB(x.p.Enter, x.db)
		if !ok {
			return nil
		}
		more, err := step(ctx)
		leave()
		if err != nil || !more {
			return err
		}
	}
}

// exportRow is one row read for export: its columns as text (NULL: nil),
// and which are numbers.
type exportRow struct {
	cols []string
	vals []*string
	num  []bool
}

func (r exportRow) str(col string) string {
	if i := slices.Index(r.cols, col); i >= 0 && r.vals[i] != nil {
		return *r.vals[i]
	}
	return ""
}

func (r exportRow) int(col string) int64 {
	n, _ := strconv.ParseInt(r.str(col), 10, 64)
	return n
}

// line is the row as one JSON object, "table" first, then its columns in
// table order (numbers as numbers).
func (r exportRow) line(table string) []byte {
	var b strings.Builder
	t, _ := json.Marshal(table)
	b.WriteString(`{"table":` + string(t))
	for i, c := range r.cols {
		k, _ := json.Marshal(c)
		b.WriteString("," + string(k) + ":")
		switch v := r.vals[i]; {
		case v == nil:
			b.WriteString("null")
		case r.num[i]:
			b.WriteString(*v)
		default:
			s, _ := json.Marshal(*v)
			b.Write(s)
		}
	}
	b.WriteString("}\n")
	return []byte(b.String())
}

// readRows reads every column of the rows query answers.
func readRows(ctx context.Context, q rowsQueryer, query string, args ...any) ([]exportRow, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	types, err := rows.ColumnTypes()
	if err != nil {
		return nil, err
	}
	num := make([]bool, len(cols))
	for i, t := range types {
		switch t.DatabaseTypeName() {
		case "BIGINT", "INT", "SMALLINT", "TINYINT", "MEDIUMINT", "UNSIGNED BIGINT", "UNSIGNED INT", "UNSIGNED SMALLINT", "UNSIGNED TINYINT":
			num[i] = true
		}
	}
	var out []exportRow
	for rows.Next() {
		ns := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range ns {
			ptrs[i] = &ns[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		r := exportRow{cols: cols, vals: make([]*string, len(cols)), num: num}
		for i, v := range ns {
			if v.Valid {
				s := v.String
				r.vals[i] = &s
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// carry is what one step adds to the database's carry tables.
type carry struct {
	sums  map[string][2]int64 // key -> (rows, amount)
	accts map[string][2]int64 // act_id -> (rows, amount)
}

func (c *carry) add(k string, n, amount int64) {
	if c.sums == nil {
		c.sums = map[string][2]int64{}
	}
	v := c.sums[k]
	c.sums[k] = [2]int64{v[0] + n, v[1] + amount}
}

func (c *carry) addAct(act string, amount int64) {
	if c.accts == nil {
		c.accts = map[string][2]int64{}
	}
	v := c.accts[act]
	c.accts[act] = [2]int64{v[0] + 1, v[1] + amount}
}

// deletion is one DELETE of a step with the number of rows it must remove.
type deletion struct {
	sql  string
	args []any
	want int
}

// commit writes the step's file, then, in one transaction, raises the
// horizon named (claimsHorizon or creditsHorizon; "" none) to the step's
// claim date, first, so a crediting transaction that read it under a
// shared lock (dropExported) commits before the rows go; deletes its rows;
// adds its carry; and records the file. A file whose transaction fails is
// removed; one whose commit's answer was lost stays until the next pass
// looks it up.
func (x *exporter) commit(ctx context.Context, kind string, lines [][]byte, rows int64, cents model.Cents, c carry, dels []deletion, horizon string) error {
	now := x.m.clock.Now()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	name := fmt.Sprintf("%s-%s-%x.jsonl", kind, now.UTC().Format("20060102T150405"), b)
	path := filepath.Join(x.dir, name)
	if err := os.MkdirAll(x.dir, 0o750); err != nil {
		return err
	}
	sum, err := writeExportFile(path, lines)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = os.Remove(path)
			_ = os.Remove(path + ".sha256")
		}
	}()
	tx, err := x.m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if horizon != "" {
		h, _ := strconv.ParseInt(x.date, 10, 64)
		if _, err := tx.ExecContext(ctx, "UPDATE "+x.m.carryTable(x.db)+" SET amount = GREATEST(amount, ?) WHERE k = ?", h, horizon); err != nil {
			return err
		}
	}
	for _, d := range dels {
		r, err := tx.ExecContext(ctx, d.sql, d.args...)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n != int64(d.want) {
			return errors.Join(err, fmt.Errorf("export: read %d rows to delete, deleted %d", d.want, n))
		}
	}
	for _, u := range []struct {
		table, key string
		sums       map[string][2]int64
	}{{x.m.carryTable(x.db), "k", c.sums}, {x.m.flowCarryTable(x.db), "act_id", c.accts}} {
		if len(u.sums) == 0 {
			continue
		}
		args := make([]any, 0, 3*len(u.sums))
		for _, k := range sortedKeys(u.sums) {
			args = append(args, k, u.sums[k][0], u.sums[k][1])
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+u.table+" ("+u.key+", n, amount) VALUES "+rowsOf(len(u.sums), 3)+
			" ON DUPLICATE KEY UPDATE n = n + VALUES(n), amount = amount + VALUES(amount)", args...); err != nil {
			return err
		}
	}
	rel := filepath.Base(x.dir) + "/" + name
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+x.m.exportLogTable(x.db)+" (file, kind, n, cents, sha256, created_ms) VALUES (?, ?, ?, ?, ?, ?)",
		rel, kind, rows, int64(cents), sum, now.UnixMilli()); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		committed = true // perhaps committed: the next pass keeps it only if its log row is there
		return commitUnknown(err)
	}
	committed = true
	x.p.Result.Files++
	x.p.Result.Cents += cents
	return nil
}

// writeExportFile writes lines to path and its SHA-256 to path.sha256 (as
// sha256sum prints it), each through a temporary file, fsynced and renamed,
// then fsyncs the directory; it returns the checksum in hex.
func writeExportFile(path string, lines [][]byte) (string, error) {
	h := sha256.New()
	write := func(p string, fill func(w *bufio.Writer) error) error {
		tmp := p + ".tmp"
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
		if err != nil {
			return err
		}
		w := bufio.NewWriter(f)
		err = errors.Join(fill(w), w.Flush(), f.Sync(), f.Close())
		if err != nil {
			_ = os.Remove(tmp)
			return err
		}
		return os.Rename(tmp, p)
	}
	err := write(path, func(w *bufio.Writer) error {
		for _, l := range lines {
			h.Write(l)
			if _, err := w.Write(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	err = write(path+".sha256", func(w *bufio.Writer) error {
		_, err := fmt.Fprintf(w, "%s  %s\n", sum, filepath.Base(path))
		return err
	})
	if err != nil {
		return "", err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", err
	}
	return sum, errors.Join(d.Sync(), d.Close())
}

// packets exports shard s's archived packets dated before the claim date,
// with their claims, up to a chunk of rows (one packet with all its claims
// when it alone has more).
func (x *exporter) packets(ctx context.Context, s model.ShardID) (bool, error) {
	m := x.m
	pt, ct := m.packetTable(s, ArchiveDay), m.claimTable(s, ArchiveDay)
	ps, err := readRows(ctx, m.db, "SELECT * FROM "+pt+" WHERE packet_id < ? ORDER BY packet_id LIMIT ?", x.date, x.p.Chunk)
	if err != nil || len(ps) == 0 {
		return false, err
	}
	// A chunk of rows: packets with their claims (count - remaining_count
	// each), at least one packet, however many claims it has.
	more := len(ps) == x.p.Chunk
	for i, rows := 0, 0; i < len(ps); i++ {
		rows += 1 + int(ps[i].int("count")-ps[i].int("remaining_count"))
		if rows > x.p.Chunk && i > 0 {
			ps, more = ps[:i], true
			break
		}
	}
	ids := make([]any, len(ps))
	var c carry
	var lines [][]byte
	var cents model.Cents
	for i, r := range ps {
		ids[i] = r.str("packet_id")
		c.add("packets", 1, r.int("amount"))
		c.add("packet_refunds", 0, r.int("refund_amount"))
		c.add("packet_remaining", 0, r.int("remaining_amount"))
		cents += model.Cents(r.int("amount"))
		lines = append(lines, r.line(pt))
	}
	in := " WHERE packet_id IN (" + placeholders(len(ids)) + ")"
	cs, err := readRows(ctx, m.db, "SELECT * FROM "+ct+in+" ORDER BY packet_id, seq", ids...)
	if err != nil {
		return false, err
	}
	for _, r := range cs {
		c.add("claims", 1, r.int("amount"))
		lines = append(lines, r.line(ct))
	}
	dels := []deletion{{"DELETE FROM " + ct + in, ids, len(cs)}, {"DELETE FROM " + pt + in, ids, len(ps)}}
	if err := x.commit(ctx, "packets", lines, int64(len(ps)+len(cs)), cents, c, dels, claimsHorizon); err != nil {
		return false, err
	}
	x.p.Result.Rows["packets"] += int64(len(ps))
	x.p.Result.Rows["claims"] += int64(len(cs))
	return more, nil
}

// flows exports the flows of shard s past the cut among the next chunk of
// rows after *after (by id): credits of claims dated before the claim date,
// the others created before BeforeMS. Flows are never changed once written,
// so they are read without locks. It is done once a chunk holds only rows
// created at or after BeforeMS: a credit booked later than that for an
// older claim stays in the table (compared by sums below the horizon).
func (x *exporter) flows(ctx context.Context, s model.ShardID, after *int64) (bool, error) {
	m := x.m
	ft := m.flowTable(s)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+ft+" WHERE id > ? ORDER BY id LIMIT ?", *after, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	*after = rs[len(rs)-1].int("id")
	var c carry
	var lines [][]byte
	var ids []any
	var cents model.Cents
	newer, credits := 0, false
	for _, r := range rs {
		kind, created := r.str("kind"), r.int("created_ms")
		if created >= x.p.BeforeMS {
			newer++
		}
		// Reward flows leave with their rewards (the rewards step).
		due := created < x.p.BeforeMS && kind != string(model.FlowCredit) && kind != string(model.FlowReward)
		if kind == string(model.FlowCredit) {
			due = x.date != "" && strings.TrimPrefix(r.str("order_no"), "claim:") < x.date
			credits = credits || due
		}
		if !due {
			continue
		}
		amount := r.int("amount")
		ids = append(ids, r.int("id"))
		c.add("flow:"+kind, 1, amount)
		c.addAct(r.str("act_id"), amount)
		cents += model.Cents(max(amount, -amount))
		lines = append(lines, r.line(ft))
	}
	more := newer < len(rs) && len(rs) == x.p.Chunk
	if len(ids) == 0 {
		return more, nil
	}
	dels := []deletion{{"DELETE FROM " + ft + " WHERE id IN (" + placeholders(len(ids)) + ")", ids, len(ids)}}
	horizon := ""
	if credits {
		horizon = creditsHorizon
	}
	if err := x.commit(ctx, "flows", lines, int64(len(ids)), cents, c, dels, horizon); err != nil {
		return false, err
	}
	x.p.Result.Rows["flows"] += int64(len(ids))
	return more, nil
}

// rewards exports up to a chunk of the database's booked rewards created
// and booked before BeforeMS, with the reward flows the official cash ones
// booked into wallets (written at the booking, so before BeforeMS too).
func (x *exporter) rewards(ctx context.Context) (bool, error) {
	m := x.m
	rt := m.rewardTable(x.db)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+rt+" WHERE status = ? AND created_ms < ? AND booked_ms < ? ORDER BY status, created_ms LIMIT ?",
		int(model.RewardBooked), x.p.BeforeMS, x.p.BeforeMS, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	var c carry
	var lines [][]byte
	var cents model.Cents
	ids := make([]any, len(rs))
	flowKeys := map[model.ShardID][]any{} // (act_id, order_no) of the reward flows, by shard
	for i, r := range rs {
		ids[i] = r.str("order_no")
		rw := model.Reward{Stage: r.str("stage"), AwardType: r.str("award_type"), Status: model.RewardBooked, Amount: model.Cents(r.int("amount")), LeaseID: r.str("lease_id")}
		c.add("rewards", 1, 0)
		if rw.LeaseID != "" {
			c.add("lease:"+rw.LeaseID, 0, int64(rw.Amount))
		}
		if rw.Cash() {
			c.add("reward_issued", 0, int64(rw.Amount))
			c.add("reward_booked", 0, int64(rw.Amount))
			if rw.IntoWallet() {
				c.add("reward_into_wallet", 0, int64(rw.Amount))
				if sh := model.ShardID(r.int("act_shard")); sh.Valid() && sh.DB() == x.db {
					flowKeys[sh] = append(flowKeys[sh], r.str("act_id"), model.RewardFlowOrderNo(r.str("order_no")))
				}
			}
		}
		lines = append(lines, r.line(rt))
	}
	dels := []deletion{{"DELETE FROM " + rt + " WHERE status = " + strconv.Itoa(int(model.RewardBooked)) + " AND order_no IN (" + placeholders(len(ids)) + ")", ids, len(ids)}}
	// Their reward flows leave with them, in the same step: reconciliation
	// of rewards against their flows never sees one without the other.
	flows := int64(0)
	for _, sh := range sortedKeys(flowKeys) {
		ft, keys := m.flowTable(sh), flowKeys[sh]
		where := " WHERE kind = '" + string(model.FlowReward) + "' AND (act_id, order_no) IN (" + rowsOf(len(keys)/2, 2) + ")"
		fs, err := readRows(ctx, m.db, "SELECT * FROM "+ft+where+" ORDER BY id", keys...)
		if err != nil {
			return false, err
		}
		for _, f := range fs {
			amount := f.int("amount")
			c.add("flow:"+string(model.FlowReward), 1, amount)
			c.addAct(f.str("act_id"), amount)
			cents += model.Cents(amount)
			lines = append(lines, f.line(ft))
		}
		flows += int64(len(fs))
		dels = append(dels, deletion{"DELETE FROM " + ft + where, keys, len(fs)})
	}
	if err := x.commit(ctx, "rewards", lines, int64(len(rs))+flows, cents, c, dels, ""); err != nil {
		return false, err
	}
	x.p.Result.Rows["rewards"] += int64(len(rs))
	x.p.Result.Rows["flows"] += flows
	return len(rs) == x.p.Chunk, nil
}

// coupons exports up to a chunk of the database's refused coupon requests
// accepted before BeforeMS.
func (x *exporter) coupons(ctx context.Context) (bool, error) {
	m := x.m
	qt := m.couponReqTable(x.db)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+qt+" WHERE state = ? AND accepted_ms < ? ORDER BY state, accepted_ms LIMIT ?",
		string(model.CouponRefused), x.p.BeforeMS, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	var c carry
	var lines [][]byte
	keys := make([]any, 0, 2*len(rs))
	for _, r := range rs {
		keys = append(keys, r.str("app"), r.str("serial_no"))
		c.add("coupon_refused", 1, 0)
		if r.str("reason") == "" {
			c.add("coupon_refused_no_reason", 1, 0)
		}
		lines = append(lines, r.line(qt))
	}
	dels := []deletion{{"DELETE FROM " + qt + " WHERE state = '" + string(model.CouponRefused) + "' AND (app, serial_no) IN (" + rowsOf(len(rs), 2) + ")", keys, len(rs)}}
	if err := x.commit(ctx, "coupons", lines, int64(len(rs)), 0, c, dels, ""); err != nil {
		return false, err
	}
	x.p.Result.Rows["coupons"] += int64(len(rs))
	return len(rs) == x.p.Chunk, nil
}

// dropExported leaves out of credits those whose claims are dated before
// their claimant database's credits horizon: their credit may have been
// booked and exported, and booking it again would book it twice. Only
// credits of claims dated more than ArchivedClaimsAge ago are looked up
// (an export's claim date is always older): for each of their databases,
// one read of its horizon under a shared lock in tx, with nw's no-wait
// prefix, so an export step that raises it (first thing in its
// transaction) waits for tx, or tx reads the raised one; when that step
// holds it, the database's old credits are deferred (a relay offers them
// again), not waited for. Left out, a credit is neither applied nor
// deferred (a relay takes it as delivered before); one never booked (a
// relay that lagged past the export) is then claimed and never credited,
// which redcell audit reports. Each is counted (CreditsBelowHorizon).
func (m *MySQL) dropExported(ctx context.Context, q rowsQueryer, credits []model.Credit, nw string) (keep []model.Credit, deferred []string, err error) {
	recent := m.clock.Now().Add(-ArchivedClaimsAge).UTC().Format("20060102")
	type horizon struct {
		date string
		held bool // an export step holds it: defer
	}
	horizons := map[int]horizon{}
	changed := false
	for _, c := range credits {
		if !model.BelowHorizon(c.ClaimID, recent) {
			keep = append(keep, c)
			continue
		}
		db := c.Shard.DB()
		h, ok := horizons[db]
		if !ok {
			date, err := m.creditsHorizonOf(ctx, q, db, nw)
			switch {
			case isMySQLErr(err, errLockWait):
				h.held = true
			case err != nil:
				return nil, nil, err
			default:
				h.date = date
			}
			horizons[db] = h
		}
		switch {
		case h.held:
			deferred, changed = append(deferred, c.ClaimID), true
		case model.BelowHorizon(c.ClaimID, h.date):
			changed = true
			m.belowHorizon.Add(1)
		default:
			keep = append(keep, c)
		}
	}
	if !changed {
		return credits, nil, nil
	}
	return keep, deferred, nil
}

// creditsHorizonOf reads database db's credits horizon ("" none) in q,
// under a shared lock, the statement under nw (a no-wait prefix: error 1205
// at once when an export step holds the row).
func (m *MySQL) creditsHorizonOf(ctx context.Context, q rowsQueryer, db int, nw string) (string, error) {
	rows, err := q.QueryContext(ctx, nw+"SELECT amount FROM "+m.carryTable(db)+" WHERE k = ? LOCK IN SHARE MODE", creditsHorizon)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("storage: credits horizon of db %d: %w", db, err)
	}
	var amount int64
	if rows.Next() {
		err = rows.Scan(&amount)
	}
	if err := errors.Join(err, rows.Err(), rows.Close()); err != nil {
		return "", fmt.Errorf("storage: credits horizon of db %d: %w", db, err)
	}
	if amount <= 0 {
		return "", nil
	}
	return fmt.Sprintf("%08d", amount), nil
}

// CreditsBelowHorizon is how many times since the store was opened a
// crediting transaction left a credit unbooked because its claim was dated
// before its database's credits horizon (dropExported): each a repeat of an
// exported credit, or a credit delivered only after its claimant database
// exported that date. A transaction run again (a retry) counts again.
func (m *MySQL) CreditsBelowHorizon() int64 { return m.belowHorizon.Load() }

// exportedSums reads the carry tables among tables (in q's snapshot) as a
// ledger part: exported flows other than credits in the flow sums, exported
// packets in the packet sums, rewards and refused coupon requests in
// RewardRows and CouponRows, and Exported (claims and credits, counts, the
// horizon).
//
// It also counts the rows of each t_flow_carry among flowCarry, in the same
// statement, so that one created after the snapshot began fails the read
// (error 1412: the caller starts over) rather than the account reads that
// join it, which skip such a table and would drop its balances.
func (m *MySQL) exportedSums(ctx context.Context, q rowsQueryer, tables, flowCarry []tableRef) (model.Ledger, error) {
	l := model.NewLedger("")
	if len(tables)+len(flowCarry) == 0 {
		return l, nil
	}
	parts := make([]string, 0, len(tables)+len(flowCarry))
	for _, t := range tables {
		parts = append(parts, fmt.Sprintf("SELECT %d AS db, k, n, amount FROM %s", t.shard.DB(), m.carryTable(t.shard.DB())))
	}
	for _, t := range flowCarry {
		parts = append(parts, fmt.Sprintf("SELECT %d, '%s', COUNT(*), 0 FROM %s", t.shard.DB(), flowCarryProbe, m.flowCarryTable(t.shard.DB())))
	}
	rows, err := q.QueryContext(ctx, strings.Join(parts, " UNION ALL "))
	if err != nil {
		return l, fmt.Errorf("storage: exported sums: %w", err)
	}
	defer rows.Close()
	e := &l.Exported
	for rows.Next() {
		var k string
		var db int
		var n, amount int64
		if err := rows.Scan(&db, &k, &n, &amount); err != nil {
			return l, err
		}
		cents := model.Cents(amount)
		if kind, ok := strings.CutPrefix(k, "flow:"); ok {
			e.Flows += n
			e.FlowCents += cents
			switch model.FlowKind(kind) {
			case model.FlowDeposit:
				l.Deposits += cents
			case model.FlowSend:
				l.Sends -= cents
			case model.FlowRefund:
				l.RefundFlows += cents
			case model.FlowReward:
				l.Rewards += cents
			case model.FlowWithdraw:
				l.Withdrawals -= cents
			case model.FlowCredit:
				e.Credits += n
				e.CreditCents += cents
			default:
				l.Problems = append(l.Problems, fmt.Sprintf("unknown flow kind %q among the exported sums", kind))
			}
			continue
		}
		if id, ok := strings.CutPrefix(k, "lease:"); ok {
			if l.RewardRows.LeaseSpent == nil {
				l.RewardRows.LeaseSpent = map[string]int64{}
			}
			l.RewardRows.LeaseSpent[id] += amount
			continue
		}
		switch k {
		case flowCarryProbe:
		case claimsHorizon, creditsHorizon:
			if amount > 0 {
				e.SetHorizon(db, k == claimsHorizon, fmt.Sprintf("%08d", amount))
			}
		case "packets":
			e.Packets += n
			e.PacketCents += cents
			l.Packets += n
			l.PacketTotals += cents
		case "packet_refunds":
			l.RefundAmounts += cents
		case "packet_remaining":
			l.OpenRemaining += cents
		case "claims":
			e.Claims += n
			e.ClaimCents += cents
		case "rewards":
			e.Rewards += n
			l.RewardRows.Count += n
		case "reward_issued":
			l.RewardRows.Issued += cents
		case "reward_booked":
			l.RewardRows.Booked += cents
		case "reward_into_wallet":
			l.RewardRows.IntoWall += cents
		case "coupon_refused":
			e.Coupons += n
			if l.CouponRows.Requests == nil {
				l.CouponRows.Requests = map[model.CouponState]int64{}
			}
			l.CouponRows.Requests[model.CouponRefused] += n
		case "coupon_refused_no_reason":
			l.CouponRows.RefusedNoReason += n
		default:
			l.Problems = append(l.Problems, fmt.Sprintf("unknown exported sum %q", k))
		}
	}
	return l, rows.Err()
}

// flowCarried is the SQL of the exported flow sums of shard s's accounts
// (act_id, total), or "" when its database has exported none.
func (m *MySQL) flowCarried(s model.ShardID, exists map[tableRef]bool) string {
	if !exists[tableRef{kind: "flowcarry", shard: model.ShardID(s.DB() * 10)}] {
		return ""
	}
	return "SELECT act_id, amount AS total FROM " + m.flowCarryTable(s.DB())
}
