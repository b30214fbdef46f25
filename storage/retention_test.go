package storage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestRetentionExport runs a cell's money over 20 days of a fake clock, then
// exports what is older than 14 days (ExportPass, two rows a step):
//   - day 0: two deposits, two packets (one claimed out, one refunded the
//     next day) with their claims credited, two cash rewards booked, three
//     coupon requests (two refused), a withdrawal; day 20: a deposit and a
//     packet with a credited claim, which must stay;
//   - a pass over databases the cell no longer serves (ExportPass.Enter)
//     exports nothing;
//   - a first pass before reconciliation has checked any database keeps the
//     claims, the packets and the credits (Held) and exports the rest;
//     once reconciliation's positions are saved but one database's, a
//     second exports the packets and claims and the credits but those of
//     that database (a claim gone, its credit still there); once that
//     one's is saved too, a third exports them; a fourth finds nothing;
//   - after each pass: the exported rows are gone from their tables and the
//     young ones are not; every balance is what it was; the cell audit (in
//     SQL, and the model's over the ledger) and the cluster audit are clean
//     with every cent still in the identity, and count what was exported;
//   - the files: each with a .sha256 that matches it and a log row naming
//     it, their lines exactly the exported rows (the flows' amounts sum to
//     the balance they made), no step above the chunk; a file no log row
//     names (a step that died before its commit) is removed by the next pass.
func TestRetentionExport(t *testing.T) {
	start := time.Date(2027, 3, 1, 9, 0, 0, 0, time.UTC)
	clk := newSetTime(start)
	m, _, _ := ContractMySQL(t, clk)
	ctx := context.Background()
	owns := func(model.ShardID) bool { return true }
	r := rand.New(rand.NewPCG(3, 14))

	// Day 0.
	deposit(t, m, "ann", 100_000)
	deposit(t, m, "bob", 50_000)
	var delivered []model.Credit // every credit booked, in order
	credit := func(ref model.PacketRef, act string) model.Cents {
		t.Helper()
		res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, r)
		if err != nil || res[0].Err != nil {
			t.Fatalf("open: %v %v", err, res)
		}
		c := res[0].Claim
		cr := model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount, CreatedMS: c.CreatedMS}
		n, _, err := ApplyCredits(ctx, m, []model.Credit{cr})
		if err != nil || n != 1 {
			t.Fatalf("credit %s: %d, %v", c.ID, n, err)
		}
		delivered = append(delivered, cr)
		return c.Amount
	}
	// u1's database keeps its claims a pass longer than the others (its
	// reconciliation position is saved later): it is neither ann's nor bob's.
	u1 := "u1"
	for i := 0; sharding.ShardOfAct(u1).DB() == sharding.ShardOfAct("ann").DB() || sharding.ShardOfAct(u1).DB() == sharding.ShardOfAct("bob").DB(); i++ {
		u1 = "u1-" + strconv.Itoa(i)
	}
	heldDB := sharding.ShardOfAct(u1).DB()
	p1 := send(t, m, "ann", 900, 3, 24*time.Hour)
	var heldCredits int64
	var heldCents model.Cents
	for _, u := range []string{u1, "u2", "u3"} {
		c := credit(p1, u)
		if sharding.ShardOfAct(u).DB() == heldDB {
			heldCredits++
			heldCents += c
		}
	}
	p2 := send(t, m, "bob", 500, 2, 24*time.Hour)
	u4 := credit(p2, "u4")
	if sharding.ShardOfAct("u4").DB() == heldDB {
		heldCredits++
		heldCents += u4
	}
	var rewards []model.Reward
	for i, act := range []string{"carl", "dora"} {
		rw := issueReward(sharding.ShardOfAct(act), act, "rain-1", "tok-"+act, model.Cents(100+i*50), clk.Now().UnixMilli())
		op := &IssueOp{Reward: rw}
		if err := m.CommitGroup(ctx, []Op{op}); err != nil || op.Err != nil {
			t.Fatalf("issue: %v %v", err, op.Err)
		}
		rewards = append(rewards, op.Issued)
	}
	book := &BookOp{Rewards: rewards}
	if err := m.CommitGroup(ctx, []Op{book}); err != nil || book.Err != nil || book.Applied != 2 {
		t.Fatalf("book: %v %v, %d booked", err, book.Err, book.Applied)
	}
	var reqs []model.CouponRequest
	for _, act := range []string{"erin", "fay", "gus"} {
		q := model.CouponRequest{App: "pay", Serial: "s-" + act, ActID: act, Shard: sharding.ShardOfAct(act), Batch: "b1", AcceptedMS: clk.Now().UnixMilli()}
		op := &AcceptOp{Coupon: q}
		if err := m.CommitGroup(ctx, []Op{op}); err != nil || op.Err != nil {
			t.Fatalf("accept: %v %v", err, op.Err)
		}
		reqs = append(reqs, op.Accepted)
	}
	if err := RefuseCoupons(ctx, m, reqs[:2], model.ReasonRisk); err != nil {
		t.Fatal(err)
	}
	if _, err := Withdraw(ctx, m, sharding.ShardOfAct("ann"), "ann", "w-1", 1_000); err != nil {
		t.Fatal(err)
	}
	clk.Set(start.Add(25 * time.Hour))
	if _, err := Refund(ctx, m, p2); err != nil {
		t.Fatal(err)
	}
	// What day 0 and 1 made, as balance: every flow among them.
	oldFlows := model.Cents(150_000 - 900 - 500 + 900 + 500 + 100 + 150 - 1_000)

	// Day 20: archive the settled packets, then young activity.
	clk.Set(start.Add(20 * 24 * time.Hour))
	if res, err := Archive(ctx, m, owns, clk.Now().Add(-7*24*time.Hour).UnixMilli()); err != nil || res.Packets != 2 || res.Claims != 4 {
		t.Fatalf("archive: %+v, %v; want 2 packets, 4 claims", res, err)
	}
	deposit(t, m, "eve", 10_000)
	p3 := send(t, m, "eve", 300, 2, 24*time.Hour)
	young := credit(p3, "u5")

	accounts := []string{"ann", "bob", "carl", "dora", "eve", u1, "u2", "u3", "u4", "u5"}
	balances := map[string]model.Cents{}
	for _, a := range accounts {
		balances[a] = balance(t, m, a)
	}
	dir := t.TempDir()
	pass := ExportPass{Owns: owns, BeforeMS: clk.Now().Add(-14 * 24 * time.Hour).UnixMilli(), Dir: dir, Chunk: 2}
	exported := map[string]int64{}
	check := func(step string, res ExportResult, wantRows map[string]int64) model.CellAudit {
		t.Helper()
		for k, n := range res.Rows {
			exported[k] += n
		}
		for _, k := range []string{"packets", "claims", "flows", "rewards", "coupons"} {
			if exported[k] != wantRows[k] {
				t.Fatalf("%s: exported %v in all, want %v", step, exported, wantRows)
			}
		}
		for _, a := range accounts {
			if b := balance(t, m, a); b != balances[a] {
				t.Fatalf("%s: %s's balance %d, was %d", step, a, b, balances[a])
			}
		}
		// Both cell audits agree (sameCellAudit), clean, every cent in.
		a := sameCellAudit(t, m, owns)
		if !a.OK() || a.PacketTotals != 1_700 || a.Sends != 1_700 || a.Claimed != 900+u4+young || a.Deposits != 160_000 || a.Withdrawals != 1_000 ||
			a.Rewards != 250 || a.RefundFlows != 500-u4 || a.CreditsPending != 0 {
			t.Fatalf("%s: cell audit %+v", step, a)
		}
		if a.Exported.Claims != exported["claims"] || a.Exported.Packets != exported["packets"] || a.Exported.Rewards != exported["rewards"] ||
			a.Exported.Coupons != exported["coupons"] || a.Exported.Flows != exported["flows"] {
			t.Fatalf("%s: the audit counts %+v exported, the passes %v", step, a.Exported, exported)
		}
		l, err := m.Ledger(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		rep := model.Audit([]model.Ledger{l})
		if !rep.OK() || rep.InFlight != 0 || rep.Deposits != 160_000 || rep.RewardRows.Booked != 250 || rep.RewardRows.IntoWall != 250 ||
			rep.Coupons.Requests["refused"] != 2 || rep.Coupons.Requests["accepted"] != 1 {
			t.Fatalf("%s: audit %+v", step, rep)
		}
		return a
	}

	// A database the cell stopped serving (Enter refuses it) is left as
	// it is.
	refused := pass
	refused.Enter = func(int) (func(), bool) { return nil, false }
	if res, err := Export(ctx, m, refused); err != nil || res.Files != 0 || len(res.Rows) != 0 {
		t.Fatalf("a pass whose databases are all refused: %+v, %v", res, err)
	}
	// Pass 1: reconciliation has checked no database, so claims, packets
	// and credits stay. Every step entered is left.
	enters, leaves := 0, 0
	counted := pass
	counted.Enter = func(int) (func(), bool) { enters++; return func() { leaves++ }, true }
	res, err := Export(ctx, m, counted)
	if enters == 0 || leaves != enters {
		t.Fatalf("pass 1 entered %d steps, left %d", enters, leaves)
	}
	if err != nil || res.Held == 0 {
		t.Fatalf("pass 1: %+v, %v; want databases held", res, err)
	}
	// Old flows less the 4 credits: 2 deposits, 2 sends, a refund, 2 rewards, a withdrawal.
	a := check("pass 1", res, map[string]int64{"flows": 8, "rewards": 2, "coupons": 2})
	if a.Exported.Horizon != "" || a.Exported.FlowCents != oldFlows-900-u4 {
		t.Fatalf("pass 1: exported %+v, want no horizon and %d cents of flows", a.Exported, oldFlows-900-u4)
	}

	// Pass 2, once reconciliation is past day 20 everywhere but in u1's
	// database: the packets and claims leave, u1's credit stays, and the
	// audits compare what is below the horizon by sums.
	pos := map[int]int64{}
	for db := range model.ShardCount / 10 {
		if db != heldDB {
			pos[db] = clk.Now().UnixMilli()
		}
	}
	if err := SaveReconPositions(ctx, m, pos); err != nil {
		t.Fatal(err)
	}
	res, err = Export(ctx, m, pass)
	if err != nil || res.Held != 1 {
		t.Fatalf("pass 2: %+v, %v; want u1's database held", res, err)
	}
	a = check("pass 2", res, map[string]int64{"packets": 2, "claims": 4, "flows": 12 - heldCredits, "rewards": 2, "coupons": 2})
	if a.Exported.Horizon != "20270302" || a.Exported.ClaimCents != 900+u4 || a.Exported.CreditCents != 900+u4-heldCents {
		t.Fatalf("pass 2: exported %+v", a.Exported)
	}
	if err := SaveReconPositions(ctx, m, map[int]int64{heldDB: clk.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	res, err = Export(ctx, m, pass)
	if err != nil || res.Held != 0 {
		t.Fatalf("pass 3: %+v, %v", res, err)
	}
	a = check("pass 3", res, map[string]int64{"packets": 2, "claims": 4, "flows": 12, "rewards": 2, "coupons": 2})
	if a.Exported.Horizon != "20270302" || a.Exported.FlowCents != oldFlows || a.Exported.ClaimCents != 900+u4 || a.Exported.CreditCents != 900+u4 ||
		a.Exported.PacketCents != 1_400 {
		t.Fatalf("pass 3: exported %+v", a.Exported)
	}
	for _, ref := range []model.PacketRef{p1, p2} {
		if n := countRows(t, m, m.packetTable(ref.Shard, ArchiveDay), string(ref.ID)) + countRows(t, m, m.claimTable(ref.Shard, ArchiveDay), string(ref.ID)); n != 0 {
			t.Fatalf("packet %s: %d rows left in the archive", ref.ID, n)
		}
	}
	if n := countRows(t, m, m.claimTable(p3.Shard, p3.Day), string(p3.ID)); n != 1 {
		t.Fatalf("the young packet's claim: %d rows", n)
	}
	var left int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM " + m.flowTable(sharding.ShardOfAct("eve")) + " WHERE act_id = 'eve'").Scan(&left); err != nil || left != 2 {
		t.Fatalf("eve's young flows: %d, %v; want her deposit and send", left, err)
	}
	if rw, err := Reward(ctx, m, rewards[0].Shard, rewards[0].OrderNo); err == nil {
		t.Fatalf("an exported reward still read: %+v", rw)
	}
	if q, err := CouponRequestOf(ctx, m, reqs[2].Shard, "pay", reqs[2].Serial); err != nil || q.State != model.CouponAccepted {
		t.Fatalf("the open coupon request: %+v, %v", q, err)
	}

	// A relay delivering the exported credits again (its position lost,
	// say) books none of them: below the horizon of their databases, in
	// this process and in a new one that reads it from the carry table.
	again := delivered[:4]
	for _, st := range []*MySQL{m, freshStore(t, m)} {
		n, deferred, err := ApplyCredits(ctx, st, again)
		if err != nil || n != 0 || len(deferred) != 0 || st.CreditsBelowHorizon() != 4 {
			t.Fatalf("old credits delivered again: %d booked, %v deferred, %v, %d counted below the horizon; want none, none, 4",
				n, deferred, err, st.CreditsBelowHorizon())
		}
	}
	// While an export step holds a database's credits horizon, its old
	// credits are deferred at once, not waited for.
	db := again[0].Shard.DB()
	release := hold(t, m, sql.LevelReadCommitted, "UPDATE "+m.carryTable(db)+" SET amount = amount WHERE k = ?", creditsHorizon)
	n, deferred, err := ApplyCredits(ctx, m, again[:1])
	release()
	if err != nil || n != 0 || len(deferred) != 1 || deferred[0] != again[0].ClaimID {
		t.Fatalf("an old credit while its horizon is held: %d booked, %v deferred, %v; want it deferred", n, deferred, err)
	}
	// The young credit, delivered again, is a plain repeat: not looked up.
	if n, _, err := ApplyCredits(ctx, m, delivered[4:]); err != nil || n != 0 || m.CreditsBelowHorizon() != 4 {
		t.Fatalf("the young credit again: %d booked, %v, %d below the horizon", n, err, m.CreditsBelowHorizon())
	}
	check("old credits again", ExportResult{}, map[string]int64{"packets": 2, "claims": 4, "flows": 12, "rewards": 2, "coupons": 2})

	// Pass 4 finds nothing.
	if res, err := Export(ctx, m, pass); err != nil || res.Files != 0 {
		t.Fatalf("pass 4: %+v, %v", res, err)
	}

	// The files against the export logs.
	logged := map[string]string{} // file -> sha256
	var loggedRows int64
	for db := range model.ShardCount / 10 {
		rows, err := m.db.Query("SELECT file, n, sha256 FROM " + m.exportLogTable(db))
		if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var f, sum string
			var n int64
			if err := rows.Scan(&f, &n, &sum); err != nil {
				t.Fatal(err)
			}
			logged[f], loggedRows = sum, loggedRows+n
			// A chunk of 2 rows; a packet with all its claims, a reward
			// with its flow.
			if limit := map[bool]int64{true: 4, false: 2}[strings.HasPrefix(filepath.Base(f), "rewards-")]; !strings.HasPrefix(filepath.Base(f), "packets-") && n > limit {
				t.Errorf("file %s holds %d rows, above %d", f, n, limit)
			}
		}
		rows.Close()
	}
	lines, flowSum := int64(0), model.Cents(0)
	files := 0
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".jsonl") {
			return err
		}
		files++
		rel, _ := filepath.Rel(dir, path)
		body, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		side, err := os.ReadFile(path + ".sha256")
		if err != nil {
			return err
		}
		h := sha256.Sum256(body)
		if sum := hex.EncodeToString(h[:]); logged[filepath.ToSlash(rel)] != sum || string(side) != sum+"  "+filepath.Base(path)+"\n" {
			t.Errorf("%s: sha256 %s, logged %q, beside it %q", rel, sum, logged[filepath.ToSlash(rel)], side)
		}
		sc := bufio.NewScanner(strings.NewReader(string(body)))
		for sc.Scan() {
			var row map[string]any
			if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
				t.Fatalf("%s: %q: %v", rel, sc.Text(), err)
			}
			lines++
			if tb, _ := row["table"].(string); strings.Contains(tb, ".t_flow_") {
				flowSum += model.Cents(row["amount"].(float64))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files != len(logged) || lines != loggedRows || lines != exported["packets"]+exported["claims"]+exported["flows"]+exported["rewards"]+exported["coupons"] {
		t.Fatalf("%d files holding %d lines; %d logged holding %d rows; exported %v", files, lines, len(logged), loggedRows, exported)
	}
	if flowSum != oldFlows {
		t.Fatalf("the exported flows sum to %d, the balance they made %d", flowSum, oldFlows)
	}

	// A file of a step that never committed goes with the next pass.
	orphan := filepath.Join(dir, m.tableNamesOf().db[sharding.ShardOfAct("ann").DB()], "flows-20270321T090000-1.jsonl")
	if err := os.WriteFile(orphan, []byte("{}\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if res, err := Export(ctx, m, pass); err != nil || res.Orphans != 1 || res.Files != 0 {
		t.Fatalf("pass 5: %+v, %v; want the orphan removed", res, err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("the orphan file is still there: %v", err)
	}
}

// BenchmarkExportFlows measures the retention export of flow rows: each
// iteration exports 20,000 deposit flows of one shard (inserted old, in one
// statement, outside the timer) in steps of DefaultExportChunk. Reported:
// rows/s and steps (files) per iteration.
func BenchmarkExportFlows(b *testing.B) {
	start := time.Date(2027, 3, 1, 9, 0, 0, 0, time.UTC)
	clk := newSetTime(start)
	m, _, _ := ContractMySQL(b, clk)
	ctx := context.Background()
	s := model.ShardID(123)
	if err := m.EnsureShard(ctx, s); err != nil {
		b.Fatal(err)
	}
	const rows = 20_000
	dir := b.TempDir()
	pass := ExportPass{Owns: func(model.ShardID) bool { return true }, BeforeMS: start.Add(-24 * time.Hour).UnixMilli(), Dir: dir}
	files := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := m.db.Exec("INSERT INTO "+m.flowTable(s)+" (act_id, order_no, kind, amount, balance_after, created_ms) "+
			"SELECT CONCAT('a', seq % 500), CONCAT('o-', ?, '-', seq), 'deposit', 1, NULL, ? FROM mysql.seq_1_to_20000",
			i, start.Add(-48*time.Hour).UnixMilli()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := Export(ctx, m, pass)
		if err != nil || res.Rows["flows"] != rows {
			b.Fatalf("export: %+v, %v", res, err)
		}
		files += res.Files
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(files)/float64(b.N), "files/op")
}

// freshStore opens a second store on m's server and namespace: a new
// process's view, nothing cached.
func freshStore(t *testing.T, m *MySQL) *MySQL {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(cfg.FormatDSN(), 4)
	if err != nil {
		t.Fatal(err)
	}
	st.ns, st.base = m.ns, m.base
	st.SetClock(m.clock)
	t.Cleanup(func() { st.Close() })
	return st
}
