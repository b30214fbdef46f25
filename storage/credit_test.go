package storage

import (
	"context"
	"database/sql"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// claimsFor makes one real claim per claimant on a fresh packet (so the rows
// stay ones the audit of TestLedgerBalances accepts) and returns their credits.
func claimsFor(t *testing.T, m *MySQL, pre string, claimants []string) []model.Credit {
	t.Helper()
	sender := pre + "-s"
	deposit(t, m, sender, model.Cents(100*len(claimants)))
	ref := send(t, m, sender, model.Cents(100*len(claimants)), int64(len(claimants)), time.Hour)
	var credits []model.Credit
	for _, act := range claimants {
		res, _, err := OpenBatch(context.Background(), m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 1)))
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res[0].Err)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount})
	}
	return credits
}

// hold runs the locking read q in a transaction of its own (at the given
// isolation level) and keeps it open until release is called or the test ends.
func hold(t *testing.T, m *MySQL, level sql.IsolationLevel, q string, args ...any) (release func()) {
	t.Helper()
	tx, err := m.db.BeginTx(context.Background(), &sql.TxOptions{Isolation: level})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	rows.Close()
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

func creditFlows(t *testing.T, m *MySQL, c model.Credit) int {
	t.Helper()
	var n int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM "+m.flowTable(c.Shard)+" WHERE act_id = ? AND order_no = ?", c.ActID, "claim:"+c.ClaimID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestApplyCreditsSkipsLockedWallets: one claimant's account row is held FOR
// UPDATE by another transaction, and another claimant's flow index is held by
// a locking read of an order number it does not have (as a send's re-check
// takes): ApplyCredits does not wait for either. It books the other credits at
// once and answers those two as deferred, with neither a flow row nor a
// balance change for them; once the locks are gone they are applied, once.
func TestApplyCreditsSkipsLockedWallets(t *testing.T) {
	m := openStore(t)
	pre := testenv.Prefix()
	claimants := []string{pre + "-a", pre + "-b", pre + "-c", pre + "-d"}
	credits := claimsFor(t, m, pre, claimants)
	rowLocked, gapLocked := credits[1], credits[2]
	bg := context.Background()
	if err := m.EnsureShard(bg, rowLocked.Shard); err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureShard(bg, gapLocked.Shard); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Exec("INSERT INTO "+m.accountTable(rowLocked.Shard)+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", rowLocked.ActID); err != nil {
		t.Fatal(err)
	}
	releaseRow := hold(t, m, sql.LevelReadCommitted, "SELECT balance FROM "+m.accountTable(rowLocked.Shard)+" WHERE act_id = ? FOR UPDATE", rowLocked.ActID)
	releaseGap := hold(t, m, sql.LevelRepeatableRead, "SELECT kind FROM "+m.flowTable(gapLocked.Shard)+" WHERE act_id = ? AND order_no = ? LOCK IN SHARE MODE", gapLocked.ActID, "snd-zz")

	ctx, cancel := context.WithTimeout(bg, 3*time.Second)
	defer cancel()
	start := time.Now()
	applied, deferred, err := ApplyCredits(ctx, m, credits)
	took := time.Since(start)
	if err != nil || applied != 2 || took > time.Second {
		t.Fatalf("with two wallets locked: applied %d, err %v after %s; want the other 2 applied at once", applied, err, took)
	}
	want := []string{rowLocked.ClaimID, gapLocked.ClaimID}
	slices.Sort(want)
	slices.Sort(deferred)
	if !slices.Equal(deferred, want) {
		t.Errorf("deferred %v, want %v", deferred, want)
	}
	for _, c := range credits {
		want, flows := c.Amount, 1
		if c == rowLocked || c == gapLocked {
			want, flows = 0, 0
		}
		if b, n := balance(t, m, c.ActID), creditFlows(t, m, c); b != want || n != flows {
			t.Errorf("%s: balance %d with %d credit flows, want %d with %d", c.ActID, b, n, want, flows)
		}
	}
	releaseRow()
	releaseGap()
	// Now the two apply (redeliver retries briefly: a lock on a neighbouring
	// key could still defer one for a moment).
	if total := redeliver(t, m, credits, 2); total != 2 {
		t.Fatalf("after the locks: %d applied, want the 2 deferred ones", total)
	}
	if applied, deferred, err := ApplyCredits(bg, m, credits); err != nil || applied != 0 || len(deferred) != 0 {
		t.Fatalf("one more delivery: applied %d, deferred %v, err %v; want nothing", applied, deferred, err)
	}
	for _, c := range credits {
		if b, n := balance(t, m, c.ActID), creditFlows(t, m, c); b != c.Amount || n != 1 {
			t.Errorf("%s: balance %d with %d credit flows, want %d with 1", c.ActID, b, n, c.Amount)
		}
	}
}

// claimsInTwoDBs makes two claims (by pre-x, pre-y) on a packet of one
// database and two (pre-x, pre-z) on a packet of another.
func claimsInTwoDBs(t *testing.T, m *MySQL, pre string) (a, b []model.Credit) {
	t.Helper()
	a = claimsFor(t, m, pre+"-a", []string{pre + "-x", pre + "-y"})
	refA, _, _ := model.ParseClaimID(a[0].ClaimID)
	preB := pre + "-b"
	for sharding.ShardOfAct(preB+"-s").DB() == refA.Shard.DB() {
		preB += "b"
	}
	return a, claimsFor(t, m, preB, []string{pre + "-x", pre + "-z"})
}

// TestRelayReadsAndWritesOneRoundTrip: the relay's reads and writes on
// MariaDB cost one round trip each, whatever the number of claim tables or
// databases: ClaimsAfter of one database (a UNION of its claim tables) finds
// its own claims only, with their claimant shard; SendTo of claims in two
// databases records the dest in both; SaveRelayPositions of two databases
// and RelayPositions read them back.
func TestRelayReadsAndWritesOneRoundTrip(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	a, b := claimsInTwoDBs(t, m, testenv.Prefix())
	refA, _, _ := model.ParseClaimID(a[0].ClaimID)
	refB, _, _ := model.ParseClaimID(b[0].ClaimID)
	trips := func(fn func() error) int64 {
		t.Helper()
		before := m.RoundTrips()
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		return m.RoundTrips() - before
	}
	if _, err := m.dayTables(ctx); err != nil { // the table list, read once a minute
		t.Fatal(err)
	}
	var got []model.Credit
	if n := trips(func() (err error) {
		got, _, err = ClaimsAfter(ctx, m, refA.Shard.DB(), 0, model.ClaimPos{}, m.nowMS()+1, 100_000)
		return err
	}); n != 1 {
		t.Errorf("ClaimsAfter: %d round trips, want 1", n)
	}
	found := 0
	for _, c := range got {
		for _, w := range a {
			if c.ClaimID == w.ClaimID {
				found++
				if c.ActID != w.ActID || c.Amount != w.Amount || c.Shard != w.Shard || c.CreatedMS <= 0 {
					t.Errorf("claim %s read as %+v, want %+v", w.ClaimID, c, w)
				}
			}
		}
		for _, w := range b {
			if c.ClaimID == w.ClaimID {
				t.Errorf("claim %s of db_%02d read from db_%02d", w.ClaimID, refB.Shard.DB(), refA.Shard.DB())
			}
		}
	}
	if found != len(a) {
		t.Fatalf("ClaimsAfter of db_%02d found %d of its %d claims", refA.Shard.DB(), found, len(a))
	}
	both := append(append([]model.Credit(nil), a...), b...)
	if n := trips(func() error { return SendTo(ctx, m, both, "cell-q") }); n != 1 {
		t.Errorf("SendTo of claims in two databases: %d round trips, want 1", n)
	}
	for _, c := range both {
		ref, seq, _ := model.ParseClaimID(c.ClaimID)
		var dest string
		if err := m.db.QueryRow("SELECT dest FROM "+m.claimTable(ref.Shard, ref.Day)+" WHERE packet_id = ? AND seq = ?", string(ref.ID), seq).Scan(&dest); err != nil || dest != "cell-q" {
			t.Errorf("claim %s: dest %q (%v), want cell-q", c.ClaimID, dest, err)
		}
	}
	pos := map[int]int64{refA.Shard.DB(): 1_000, refB.Shard.DB(): 2_000}
	if n := trips(func() error { return SaveRelayPositions(ctx, m, pos) }); n != 1 {
		t.Errorf("SaveRelayPositions of two databases: %d round trips, want 1", n)
	}
	var read map[int]int64
	if n := trips(func() (err error) {
		read, err = RelayPositions(ctx, m, []int{refA.Shard.DB(), refB.Shard.DB()})
		return err
	}); n != 1 || read[refA.Shard.DB()] != 1_000 || read[refB.Shard.DB()] != 2_000 {
		t.Errorf("RelayPositions: %v in %d round trips, want %v in 1", read, n, pos)
	}
}

// TestRelayPositionFromLegacyOutbox: a database upgraded from a version with
// an outbox table has no saved position; RelayPositions gives the creation
// time of its oldest undelivered outbox row, or a minute before now when
// none is undelivered, and a saved position wins over both. A database
// without either is absent.
func TestRelayPositionFromLegacyOutbox(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{}) // a namespace of its own, dropped at the end
	ctx := context.Background()
	const a, b, c = 31, 32, 33
	now := m.nowMS()
	for _, db := range []int{a, b} {
		d := m.tableNamesOf().db[db]
		for _, q := range []string{"CREATE DATABASE IF NOT EXISTS " + d + dbDefaults,
			"CREATE TABLE " + d + ".t_outbox (claim_id VARCHAR(40) NOT NULL PRIMARY KEY, state TINYINT NOT NULL, created_ms BIGINT NOT NULL)"} {
			if _, err := m.db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	da := m.tableNamesOf().db[a]
	if _, err := m.db.ExecContext(ctx, "INSERT INTO "+da+".t_outbox VALUES ('x1', 1, 1000), ('x2', 0, 5000), ('x3', 0, 7000)"); err != nil {
		t.Fatal(err)
	}
	pos, err := RelayPositions(ctx, m, []int{a, b, c})
	if err != nil {
		t.Fatal(err)
	}
	if pos[a] != 5000 || pos[b] < now-2*legacyUndelivered.Milliseconds() || pos[b] > m.nowMS() || len(pos) != 2 {
		t.Fatalf("positions %v, want db %d at 5000 (its oldest undelivered row), db %d about a minute before %d, db %d absent", pos, a, b, now, c)
	}
	if err := SaveRelayPositions(ctx, m, map[int]int64{a: 9000}); err != nil {
		t.Fatal(err)
	}
	if pos, err := RelayPositions(ctx, m, []int{a}); err != nil || pos[a] != 9000 {
		t.Fatalf("after a save: %v, %v; want the saved 9000", pos, err)
	}
}

// TestRelaySkipsMissingDatabases: a save of positions for a database that
// does not exist (no claims; a shadow space just dropped) makes nothing and
// stores nothing, and the others of the same save are stored; a database
// made by an earlier version, without the position table, gets it.
func TestRelaySkipsMissingDatabases(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	if err := m.EnsureShard(ctx, 120); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.ExecContext(ctx, "CREATE DATABASE "+m.tableNamesOf().db[13]+dbDefaults); err != nil {
		t.Fatal(err)
	}
	if err := SaveRelayPositions(ctx, m, map[int]int64{12: 100, 13: 200, 14: 300}); err != nil {
		t.Fatal(err)
	}
	pos, err := RelayPositions(ctx, m, []int{12, 13, 14})
	if err != nil || !maps.Equal(pos, map[int]int64{12: 100, 13: 200}) {
		t.Fatalf("positions %v (%v), want 12 and 13 saved, 14 absent", pos, err)
	}
	var n int
	if err := m.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", m.tableNamesOf().db[14]).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database 14 exists after the save (%d, %v), want it never made", n, err)
	}
}

// TestOldClaimTablesUpgraded: a claim table of an earlier version, without
// act_shard and dest, holding a claim, is given both columns by the first
// read of the claim tables (dayTables), so the relay's ClaimsAfter reads
// it (the claimant's shard computed from its act_id) instead of failing
// on an unknown column.
func TestOldClaimTablesUpgraded(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	const s, day = model.ShardID(345), 3
	if err := m.EnsureDay(ctx, s, day); err != nil {
		t.Fatal(err)
	}
	ct := m.claimTable(s, day)
	pid := "20260303345" + "00000000000000a1"
	for _, q := range []string{
		"ALTER TABLE " + ct + " DROP COLUMN dest, DROP COLUMN act_shard",
		"INSERT INTO " + ct + " (packet_id, seq, act_id, amount, created_ms) VALUES ('" + pid + "', 1, 'old-claimant', 25, 5000)",
	} {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := ClaimsAfter(ctx, m, s.DB(), 0, model.ClaimPos{}, 10_000, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ClaimID != model.ClaimID(model.PacketID(pid), 1) || got[0].Shard != sharding.ShardOfAct("old-claimant") ||
		got[0].Amount != 25 || got[0].Dest != "" {
		t.Fatalf("claims read %+v, want the old claim owed to shard %d", got, sharding.ShardOfAct("old-claimant"))
	}
	if ok, err := m.schemaHas(ctx, []schemaNeed{needOf(ct, "act_shard", ""), needOf(ct, "dest", "")}); err != nil || !ok {
		t.Fatalf("after the read: the columns present = %v (%v), want true", ok, err)
	}
}
