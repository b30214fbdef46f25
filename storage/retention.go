package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	for rows.Next() {
		var k string
		var db int
		var n, amount int64
		if err := rows.Scan(&db, &k, &n, &amount); err != nil {
			return l, err
		}
		addExportedSum(&l, db, k, n, amount)
	}
	return l, rows.Err()
}

// addExportedSum adds one row of the export's carry tables (db's; key k,
// count n, amount in cents or, for a horizon, its day) to l: a flow kind's
// sums, a lease's spending, a horizon, or the sums of packets, claims,
// rewards and coupons; an unknown key is a problem of l.
func addExportedSum(l *model.Ledger, db int, k string, n, amount int64) {
	e := &l.Exported
	cents := model.Cents(amount)
	if kind, ok := strings.CutPrefix(k, "flow:"); ok {
		addExportedFlow(l, kind, n, cents)
		return
	}
	if id, ok := strings.CutPrefix(k, "lease:"); ok {
		if l.RewardRows.LeaseSpent == nil {
			l.RewardRows.LeaseSpent = map[string]int64{}
		}
		l.RewardRows.LeaseSpent[id] += amount
		return
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

// addExportedFlow adds the exported sums of flows of kind (count n, total
// cents) to l; an unknown kind is a problem of l.
func addExportedFlow(l *model.Ledger, kind string, n int64, cents model.Cents) {
	e := &l.Exported
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
}

// flowCarried is the SQL of the exported flow sums of shard s's accounts
// (act_id, total), or "" when its database has exported none.
func (m *MySQL) flowCarried(s model.ShardID, exists map[tableRef]bool) string {
	if !exists[tableRef{kind: "flowcarry", shard: model.ShardID(s.DB() * 10)}] {
		return ""
	}
	return "SELECT act_id, amount AS total FROM " + m.flowCarryTable(s.DB())
}
