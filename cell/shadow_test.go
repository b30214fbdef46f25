package cell_test

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestShadowCleanup: two cells carry real and stress traffic (a packet
// each, opened by a claimant of each cell, credits relayed both ways).
// POST /admin/shadow/cleanup (refused without the token) drops on each cell
// the shadow databases of the databases it owns, and no other: the real rows
// keep their counts and checksums, no real table goes, the shadow databases
// of databases a cell does not own stay. The audit of the shadow space is
// then clean (and empty where no other range's shadow databases share the
// server), a second cleanup drops nothing, and the old
// shadow packet is gone for opens and grabs (no closed-packet or grab-cache
// copy of it is read). Stress traffic then works as on a new cluster, and
// the audits of the shadow space stay clean.
func TestShadowCleanup(t *testing.T) {
	ns := privateDatabases(t) // the cleanup drops the shadow databases of the layout: only this test's
	a, b := twoCells(t, shadowCells(t, ""))
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	near, far := actIn(t, pre+"-near", a.cfg.Shards), actIn(t, pre+"-far", b.cfg.Shards)
	owner := map[string]*testCell{near: a, far: b}

	// Real money, settled: every claim credited, and let go by the relay.
	a.deposit(t, sender, 5000)
	realPacket := a.send(t, sender, 1000, 2, "snd-real")
	for _, who := range []string{near, far} {
		o := openOne(t, a, nil, realPacket, who)
		waitFor(t, 10*time.Second, func() bool { return owner[who].balance(t, who) == o.Amount }, "real credit of "+who)
	}
	waitFor(t, 10*time.Second, func() bool { return creditsPending(t, a, "real") == 0 }, "the real relay to let the delivered credits go")
	// Stress traffic: the same people in the shadow tables; the packet sells out.
	stressDeposit(t, a, sender, "dep-1", 3000)
	oldPacket := stressSend(t, a, sender, 600, 2, "snd-1")
	for _, who := range []string{near, far} {
		o := openOne(t, a, stress, oldPacket, who)
		waitFor(t, 10*time.Second, func() bool { return stressBalance(t, owner[who], who) == o.Amount }, "shadow credit of "+who)
	}
	if g := stressGrab(t, a, oldPacket, sender); g.Status != "sold_out" {
		t.Fatalf("grab of the sold-out shadow packet: %+v", g)
	}
	realRows := func() map[string][2]int64 {
		return merge(realPrint(t, a.db, ns, []string{sender, near}, []string{realPacket}), realPrint(t, b.db, ns, []string{far}, nil))
	}
	rowsBefore, tablesA, tablesB := realRows(), realTables(t, a.db, ns), realTables(t, b.db, ns)
	othersA, othersB := shadowSchemas(t, a.db, ns, b.cfg.Shards), shadowSchemas(t, b.db, ns, a.cfg.Shards)

	// The cleanup: the admin token only.
	cleanupURL := func(c *testCell) string { return c.adminURL + "/admin/shadow/cleanup" }
	if st, code := call(t, "POST", cleanupURL(a), nil, nil); st != 401 {
		t.Fatalf("cleanup without the admin token: %d %s", st, code)
	}
	for _, c := range []*testCell{a, b} {
		out := cleanShadow(t, c)
		// cell-a made the sender's wallet, packet and claim tables and a
		// relay position; cell-b its claimant's wallet tables.
		mine := shadowName(ns, sharding.ShardOfAct(map[*testCell]string{a: sender, b: far}[c]))
		if out.Cell != c.name || !slices.Contains(out.Databases, mine) || out.Tables < map[*testCell]int{a: 5, b: 2}[c] || out.Owned != 50 || out.Reason != "admin" {
			t.Fatalf("cleanup of %s: %+v, want %s among the databases", c.name, out, mine)
		}
		if left := shadowSchemas(t, c.db, ns, c.cfg.Shards); len(left) != 0 {
			t.Fatalf("%s: shadow databases left after the cleanup: %v", c.name, left)
		}
	}
	if got := realRows(); !mapsEqual(got, rowsBefore) {
		t.Fatalf("real rows changed by the cleanup:\nbefore %v\nafter  %v", rowsBefore, got)
	}
	for _, x := range []struct {
		c      *testCell
		before []string
	}{{a, tablesA}, {b, tablesB}} {
		// Tables may appear (a relay delivers what earlier tests on these
		// servers left uncredited, and saves positions); none may go.
		if now := realTables(t, x.c.db, ns); slices.ContainsFunc(tableDiff(x.before, now), func(d string) bool { return d[0] == '-' }) {
			t.Fatalf("real tables of %s's server dropped by the cleanup: %v", x.c.name, tableDiff(x.before, now))
		}
	}
	if !slices.Equal(shadowSchemas(t, a.db, ns, b.cfg.Shards), othersA) || !slices.Equal(shadowSchemas(t, b.db, ns, a.cfg.Shards), othersB) {
		t.Fatal("a cell dropped shadow databases it does not own")
	}
	// A cell audits every shadow table on its server: on servers shared with
	// other tests, the shadow databases of the other range are counted too.
	// Without them the books are empty; with them, what follows is counted
	// from here.
	after := map[*testCell]model.CellAudit{}
	for c, others := range map[*testCell][]string{a: othersA, b: othersB} {
		books := shadowAudit(t, c)
		if len(others) == 0 && (books.Deposits != 0 || books.Claims != 0 || books.Balances != 0 || books.CreditsIn != 0) {
			t.Fatalf("%s: shadow books after the cleanup: %+v", c.name, books)
		}
		after[c] = books
		if out := cleanShadow(t, c); len(out.Databases) != 0 || out.Tables != 0 {
			t.Fatalf("%s: a second cleanup dropped %+v", c.name, out)
		}
	}
	// The old packet is gone: no closed-packet entry or grab-cache copy of it.
	if st, code := callH(t, stress, "POST", a.url+"/v1/packets/"+oldPacket+"/open", api.ActRequest{ActID: sender}, nil); st != 404 || code != "NOT_FOUND" {
		t.Fatalf("open of a dropped shadow packet: %d %s, want 404 NOT_FOUND", st, code)
	}
	if st, code := callH(t, stress, "POST", a.url+"/v1/packets/"+oldPacket+"/grab", api.ActRequest{ActID: sender}, nil); st != 404 {
		t.Fatalf("grab of a dropped shadow packet: %d %s, want 404 (a cached copy answered?)", st, code)
	}

	// Stress traffic afterwards: the tables are made again, as on a new cluster.
	stressDeposit(t, a, sender, "dep-1", 3000) // the order number is free again
	if got := stressBalance(t, a, sender); got != 3000 {
		t.Fatalf("shadow balance after the cleanup and one deposit: %d", got)
	}
	packet := stressSend(t, a, sender, 400, 2, "snd-1")
	for _, who := range []string{near, far} {
		o := openOne(t, a, stress, packet, who)
		waitFor(t, 10*time.Second, func() bool { return stressBalance(t, owner[who], who) == o.Amount }, "new shadow credit of "+who)
	}
	waitFor(t, 10*time.Second, func() bool { return creditsPending(t, a, "shadow") == 0 }, "the shadow relay to let the new credits go")
	if books, was := shadowAudit(t, a), after[a]; books.Claims-was.Claims != 2 || books.Claimed-was.Claimed != 400 || books.Deposits-was.Deposits != 3000 {
		t.Fatalf("shadow books of %s after new traffic: %+v, after the cleanup %+v", a.name, books, was)
	}
	shadowAudit(t, b)
	if got := realRows(); !mapsEqual(got, rowsBefore) {
		t.Fatalf("real rows changed by the stress traffic after the cleanup:\nbefore %v\nafter  %v", rowsBefore, got)
	}
	if n := metric(t, a, `redcell_cell_shadow_cleanups_total{reason="admin"}`); n != 2 {
		t.Fatalf("%v admin cleanups counted on %s, want 2", n, a.name)
	}
}

// shadowCells tunes test cells for the cleanup: an admin port, and a fast
// reconciliation, so that a cleanup waits a few seconds after the last
// stress traffic rather than 100 (cell.shadowQuiet). strategy "" keeps the
// default.
func shadowCells(t *testing.T, strategy string) func(*cell.Config) {
	return func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		cfg.ReconInterval, cfg.ReconSettle = 300*time.Millisecond, time.Second
		if strategy != "" {
			cfg.OpenStrategy = strategy
		}
	}
}

// cleanShadow calls POST /admin/shadow/cleanup on c with the admin token.
func cleanShadow(t *testing.T, c *testCell) api.ShadowCleanupResponse {
	t.Helper()
	return adminAnswer[api.ShadowCleanupResponse](t, c, "POST", "/admin/shadow/cleanup")
}

// shadowAudit audits c's shadow space through the admin port and fails
// the test unless it is clean; it answers the books.
func shadowAudit(t *testing.T, c *testCell) model.CellAudit {
	t.Helper()
	rep := adminAnswer[api.AuditResponse](t, c, "POST", "/admin/audit?space=shadow")
	books := rep.Spaces["shadow"]
	if !rep.OK || !books.OK() {
		t.Fatalf("shadow audit of %s not clean: %+v", c.name, books)
	}
	return books
}

// stressDeposit deposits amount into act's shadow wallet at c (order: its
// order number); stressSend sends a shadow packet and answers its ID. Either
// fails the test unless c answers 200.
func stressDeposit(t *testing.T, c *testCell, act, order string, amount int64) {
	t.Helper()
	if st, code := callH(t, stress, "POST", c.url+"/v1/accounts/"+act+"/deposit", api.DepositRequest{Amount: amount, OrderNo: order}, nil); st != 200 {
		t.Fatalf("stress deposit: %d %s", st, code)
	}
}

func stressSend(t *testing.T, c *testCell, sender string, amount, count int64, order string) string {
	t.Helper()
	var out api.SendResponse
	if st, code := callH(t, stress, "POST", c.url+"/v1/packets", api.SendRequest{Sender: sender, Amount: amount, Count: count, OrderNo: order}, &out); st != 200 {
		t.Fatalf("stress send: %d %s", st, code)
	}
	return out.PacketID
}

func stressBalance(t *testing.T, c *testCell, act string) int64 {
	t.Helper()
	var acc model.Account
	if st, code := callH(t, stress, "GET", c.url+"/v1/accounts/"+act, nil, &acc); st != 200 {
		t.Fatalf("stress account: %d %s", st, code)
	}
	return int64(acc.Balance)
}

func stressGrab(t *testing.T, c *testCell, id, act string) api.GrabResponse {
	t.Helper()
	var g api.GrabResponse
	if st, code := callH(t, stress, "POST", c.url+"/v1/packets/"+id+"/grab", api.ActRequest{ActID: act}, &g); st != 200 {
		t.Fatalf("stress grab: %d %s", st, code)
	}
	return g
}

// shadowName is the shadow database of shard sh (names prefixed with ns).
func shadowName(ns string, sh model.ShardID) string {
	return fmt.Sprintf("%sshadow_db_%02d", ns, sh.DB())
}

// likePrefix is a LIKE pattern of the names that start with s.
func likePrefix(s string) string { return strings.ReplaceAll(s, "_", `\_`) + "%" }

// shadowSchemas lists the shadow databases (names prefixed with ns) on db's
// server of the databases in r, sorted.
func shadowSchemas(t *testing.T, db *sql.DB, ns string, r sharding.Ranges) []string {
	t.Helper()
	var out []string
	for _, name := range listStrings(t, db, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE '"+likePrefix(ns+"shadow_db_")+"' ORDER BY 1") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, ns), "shadow_db_%d", &n); err == nil && strings.HasPrefix(name, ns) && r.Contains(model.ShardID(n*10)) {
			out = append(out, name)
		}
	}
	return out
}

// realTables lists every real table (ns+db_XX.name) on db's server, sorted.
func realTables(t *testing.T, db *sql.DB, ns string) []string {
	t.Helper()
	return listStrings(t, db, "SELECT CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) FROM information_schema.TABLES WHERE TABLE_SCHEMA LIKE '"+likePrefix(ns+"db_")+"' ORDER BY 1")
}

// tableDiff names the tables only one of two sorted lists has.
func tableDiff(before, after []string) []string {
	var out []string
	for _, x := range before {
		if !slices.Contains(after, x) {
			out = append(out, "-"+x)
		}
	}
	for _, x := range after {
		if !slices.Contains(before, x) {
			out = append(out, "+"+x)
		}
	}
	return out
}

// listStrings runs query q (with args) on db and answers its one column.
func listStrings(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// realPrint reads the real rows of acts (accounts and flows) and packets
// (packet, claims) on db's server: per table, the row count and
// a checksum, the sum of CRC32 over every column of each row.
func realPrint(t *testing.T, db *sql.DB, ns string, acts, packets []string) map[string][2]int64 {
	t.Helper()
	out := map[string][2]int64{}
	read := func(table, col, val string) {
		cols := listStrings(t, db, fmt.Sprintf("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) = '%s' ORDER BY ORDINAL_POSITION", table))
		if len(cols) == 0 {
			t.Fatalf("no table %s", table)
		}
		var v [2]int64
		q := fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', %s))), 0) FROM %s WHERE %s = ?", strings.Join(cols, ", "), table, col)
		if err := db.QueryRow(q, val).Scan(&v[0], &v[1]); err != nil {
			t.Fatal(err)
		}
		out[table+" "+val] = v
	}
	for _, act := range acts {
		sh := sharding.ShardOfAct(act)
		read(fmt.Sprintf("%sdb_%02d.t_account_%d", ns, sh.DB(), sh.Table()), "act_id", act)
		read(fmt.Sprintf("%sdb_%02d.t_flow_%d", ns, sh.DB(), sh.Table()), "act_id", act)
	}
	for _, id := range packets {
		ref, err := model.ParsePacketID(id)
		if err != nil {
			t.Fatal(err)
		}
		read(fmt.Sprintf("%sdb_%02d.t_packet_%d_%02d", ns, ref.Shard.DB(), ref.Shard.Table(), ref.Day), "packet_id", id)
		read(fmt.Sprintf("%sdb_%02d.t_claim_%d_%02d", ns, ref.Shard.DB(), ref.Shard.Table(), ref.Day), "packet_id", id)
	}
	for k, v := range out {
		if v[0] == 0 {
			t.Fatalf("no real rows in %s: the print checks nothing", k)
		}
	}
	return out
}

func merge(a, b map[string][2]int64) map[string][2]int64 {
	for k, v := range b {
		a[k] = v
	}
	return a
}

func mapsEqual(a, b map[string][2]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestShadowCleanupRelayHeld: a credit the shadow relay's local lane holds
// when the cleanup begins (deferred: its claimant's wallet row is locked) is
// let go, never applied to the tables made again after the drop: the audit
// of the shadow space finds no credit of a dropped claim, and the claimant's
// new wallet stays empty.
func TestShadowCleanupRelayHeld(t *testing.T) {
	// batched: credits are applied by the store itself, which defers one
	// whose wallet row is locked (grouped commits wait for the lock).
	privateDatabases(t) // the cleanup drops the shadow databases of the layout: only this test's
	c := oneCell(t, shadowCells(t, cell.StrategyBatched))
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	pre := testenv.Prefix()
	sender, claimant := actIn(t, pre+"-s", c.cfg.Shards), actIn(t, pre+"-c", c.cfg.Shards)
	stressDeposit(t, c, sender, "dep-1", 1000)
	stressDeposit(t, c, claimant, "dep-1", 1) // its wallet row, to lock
	packet := stressSend(t, c, sender, 500, 1, "snd-1")

	sh := sharding.ShardOfAct(claimant)
	tx, err := c.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var bal int64
	if err := tx.QueryRow(fmt.Sprintf("SELECT balance FROM %sshadow_db_%02d.t_account_%d WHERE act_id = ? FOR UPDATE", c.ns, sh.DB(), sh.Table()), claimant).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	deferred := func() float64 { return counter(t, c.reg, "redcell_cell_relay_deferred_total", nil) }
	from := deferred()
	openOne(t, c, stress, packet, claimant)
	waitFor(t, 10*time.Second, func() bool { return deferred() > from }, "the credit deferred by the locked wallet row")
	// The lock goes once the cleanup has closed the space: the lane holds
	// the credit then. The drop waits for it.
	go func() {
		defer tx.Rollback()
		testenv.Until(15*time.Second, func() bool { return counter(t, c.reg, "redcell_cell_shadow_closed", nil) == 1 })
	}()
	out := cleanShadow(t, c)
	if !slices.Contains(out.Databases, shadowName(c.ns, sh)) {
		t.Fatalf("cleanup: %+v, want %s dropped", out, shadowName(c.ns, sh))
	}
	waitScans(t, c, "shadow", 3)
	if got := stressBalance(t, c, claimant); got != 0 {
		t.Fatalf("the claimant's shadow wallet holds %d after the cleanup: a dropped claim's credit was applied", got)
	}
	if books := shadowAudit(t, c); books.CreditsIn != 0 || books.Claims != 0 {
		t.Fatalf("shadow books after the cleanup: %+v", books)
	}
}
