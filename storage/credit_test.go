package storage

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

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
		res, _, err := m.OpenBatch(context.Background(), ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 1)))
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
	applied, deferred, err := m.ApplyCredits(ctx, credits)
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
	// Now the two apply. Another transaction on a neighbouring key of the flow
	// index (InnoDB's duplicate check locks the next record too) could still
	// defer one for a moment, as it would a relay's delivery: retry briefly.
	total := 0
	for try := 0; try < 20 && total < 2; try++ {
		applied, _, err := m.ApplyCredits(bg, credits)
		if err != nil {
			t.Fatal(err)
		}
		total += applied
		if total < 2 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if total != 2 {
		t.Fatalf("after the locks: %d applied, want the 2 deferred ones", total)
	}
	if applied, deferred, err := m.ApplyCredits(bg, credits); err != nil || applied != 0 || len(deferred) != 0 {
		t.Fatalf("one more delivery: applied %d, deferred %v, err %v; want nothing", applied, deferred, err)
	}
	for _, c := range credits {
		if b, n := balance(t, m, c.ActID), creditFlows(t, m, c); b != c.Amount || n != 1 {
			t.Errorf("%s: balance %d with %d credit flows, want %d with 1", c.ActID, b, n, c.Amount)
		}
	}
	if skipped, err := m.MarkDelivered(bg, credits); err != nil || skipped != 0 {
		t.Fatal(skipped, err)
	}
}

// TestMarkDeliveredSkipsLockedRows: one of three outbox rows is held locked by
// another transaction; MarkDelivered does not wait for it: it marks the other
// two at once and leaves that one pending, to be marked by a later call.
func TestMarkDeliveredSkipsLockedRows(t *testing.T) {
	m := openStore(t)
	pre := testenv.Prefix()
	credits := claimsFor(t, m, pre, []string{pre + "-a", pre + "-b", pre + "-c"})
	bg := context.Background()
	if _, _, err := m.ApplyCredits(bg, credits); err != nil {
		t.Fatal(err)
	}
	ref, _, _ := model.ParseClaimID(credits[0].ClaimID)
	outbox := m.outboxTable(ref.Shard.DB())
	state := func(c model.Credit) (st int) {
		if err := m.db.QueryRow("SELECT state FROM "+outbox+" WHERE claim_id = ?", c.ClaimID).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	release := hold(t, m, sql.LevelReadCommitted, "SELECT state FROM "+outbox+" WHERE claim_id = ? FOR UPDATE", credits[1].ClaimID)
	ctx, cancel := context.WithTimeout(bg, 3*time.Second)
	defer cancel()
	start := time.Now()
	skipped, err := m.MarkDelivered(ctx, credits)
	if took := time.Since(start); err != nil || skipped != 1 || took > time.Second {
		t.Fatalf("with one row locked: %d skipped, err %v after %s; want the other 2 marked at once", skipped, err, took)
	}
	for i, want := range []int{1, 0, 1} {
		if st := state(credits[i]); st != want {
			t.Errorf("row %d: state %d, want %d", i, st, want)
		}
	}
	release()
	if skipped, err := m.MarkDelivered(bg, credits); err != nil || skipped != 0 {
		t.Fatal(skipped, err)
	}
	for i := range credits {
		if st := state(credits[i]); st != 1 {
			t.Errorf("row %d after the lock: state %d, want 1", i, st)
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

// TestMarkDeliveredAcrossDatabases: one call marks the outbox rows of claims
// on packets of two databases (one transaction); a row held locked in one of
// them is skipped and the rest of both are marked.
func TestMarkDeliveredAcrossDatabases(t *testing.T) {
	m := openStore(t)
	pre := testenv.Prefix()
	a, b := claimsInTwoDBs(t, m, pre)
	refA, _, _ := model.ParseClaimID(a[0].ClaimID)
	refB, _, _ := model.ParseClaimID(b[0].ClaimID)
	all := append(slices.Clone(a), b...)
	if n, _, err := m.ApplyCredits(context.Background(), all); err != nil || n != len(all) {
		t.Fatal(n, err) // credited first, as the relay does, so the rows stay ones the audit accepts
	}
	state := func(c model.Credit) (st int) {
		ref, _, _ := model.ParseClaimID(c.ClaimID)
		if err := m.db.QueryRow("SELECT state FROM "+m.outboxTable(ref.Shard.DB())+" WHERE claim_id = ?", c.ClaimID).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	release := hold(t, m, sql.LevelReadCommitted, "SELECT state FROM "+m.outboxTable(refB.Shard.DB())+" WHERE claim_id = ? FOR UPDATE", b[1].ClaimID)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if skipped, err := m.MarkDelivered(ctx, all); err != nil || skipped != 1 {
		t.Fatalf("%d skipped, err %v; want the locked one", skipped, err)
	}
	for i, want := range []int{1, 1, 1, 0} {
		if st := state(all[i]); st != want {
			t.Errorf("row %d (db %d): state %d, want %d", i, []int{refA.Shard.DB(), refA.Shard.DB(), refB.Shard.DB(), refB.Shard.DB()}[i], st, want)
		}
	}
	release()
	if skipped, err := m.MarkDelivered(context.Background(), all); err != nil || skipped != 0 {
		t.Fatal(skipped, err)
	}
	if st := state(all[3]); st != 1 {
		t.Errorf("the row locked before: state %d, want 1", st)
	}
}

// TestMarkDeliveredOneRoundTrip: a delivered batch whose rows are all
// pending and unlocked, over two databases and two dests, is marked in one
// round trip, each row with its dest; marking it again (every row marked
// before) takes the exact path and skips nothing.
func TestMarkDeliveredOneRoundTrip(t *testing.T) {
	m := openStore(t)
	pre := testenv.Prefix()
	a, b := claimsInTwoDBs(t, m, pre)
	all := append(slices.Clone(a), b...)
	ctx := context.Background()
	if n, _, err := m.ApplyCredits(ctx, all); err != nil || n != len(all) {
		t.Fatal(n, err)
	}
	all[0].Dest, all[1].Dest, all[2].Dest = "cell-x", "cell-y", "cell-x"
	before := m.RoundTrips()
	if skipped, err := m.MarkDelivered(ctx, all); err != nil || skipped != 0 {
		t.Fatalf("mark: %d skipped, %v", skipped, err)
	}
	if n := m.RoundTrips() - before; n != 1 {
		t.Errorf("marking 4 pending rows of 2 databases: %d round trips, want 1", n)
	}
	for i, want := range []string{"cell-x", "cell-y", "cell-x", ""} {
		ref, _, _ := model.ParseClaimID(all[i].ClaimID)
		var st int
		var dest string
		if err := m.db.QueryRow("SELECT state, dest FROM "+m.outboxTable(ref.Shard.DB())+" WHERE claim_id = ?", all[i].ClaimID).Scan(&st, &dest); err != nil {
			t.Fatal(err)
		}
		if st != 1 || dest != want {
			t.Errorf("row %d: state %d dest %q, want 1 %q", i, st, dest, want)
		}
	}
	all[3].Dest = "cell-z" // marked before: its dest stays
	before = m.RoundTrips()
	if skipped, err := m.MarkDelivered(ctx, all); err != nil || skipped != 0 {
		t.Fatalf("mark again: %d skipped, %v; want 0 (marked before)", skipped, err)
	}
	if n := m.RoundTrips() - before; n < 2 {
		t.Errorf("marking rows marked before: %d round trips, want the exact path's", n)
	}
	ref, _, _ := model.ParseClaimID(all[3].ClaimID)
	var dest string
	if err := m.db.QueryRow("SELECT dest FROM "+m.outboxTable(ref.Shard.DB())+" WHERE claim_id = ?", all[3].ClaimID).Scan(&dest); err != nil || dest != "" {
		t.Errorf("a row marked before took a new dest: %q (%v)", dest, err)
	}
}

// TestMarkDeliveredOneStatement: a delivered batch of one database and dest
// (a hot packet's credits) is marked by its UPDATE alone, in autocommit: one
// statement, no BEGIN or COMMIT (the session counters of the store's only
// connection); two databases take the transaction.
func TestMarkDeliveredOneStatement(t *testing.T) {
	m, err := Open(testenv.MySQLDSN(t, 1), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx := context.Background()
	pre := testenv.Prefix()
	a, b := claimsInTwoDBs(t, m, pre)
	all := append(slices.Clone(a), b...)
	if n, _, err := m.ApplyCredits(ctx, all); err != nil || n != len(all) {
		t.Fatal(n, err)
	}
	counters := func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		for _, k := range []string{"Com_update", "Com_begin", "Com_commit"} {
			out[k] = sessionCount(t, m.db, k)
		}
		return out
	}
	mark := func(cs []model.Credit) map[string]int64 {
		t.Helper()
		before := counters()
		if skipped, err := m.MarkDelivered(ctx, cs); err != nil || skipped != 0 {
			t.Fatalf("mark: %d skipped, %v", skipped, err)
		}
		after := counters()
		for k := range after {
			after[k] -= before[k]
		}
		return after
	}
	if got := mark(a); got["Com_update"] != 1 || got["Com_begin"] != 0 || got["Com_commit"] != 0 {
		t.Errorf("one database: %v, want 1 UPDATE and no BEGIN or COMMIT", got)
	}
	if got := mark(b); got["Com_update"] != 1 || got["Com_begin"] != 0 || got["Com_commit"] != 0 {
		t.Errorf("the other database: %v", got)
	}
	for _, c := range all {
		ref, _, _ := model.ParseClaimID(c.ClaimID)
		var st int
		if err := m.db.QueryRow("SELECT state FROM "+m.outboxTable(ref.Shard.DB())+" WHERE claim_id = ?", c.ClaimID).Scan(&st); err != nil || st != 1 {
			t.Errorf("%s: state %d (%v), want 1", c.ClaimID, st, err)
		}
	}
	c, d := claimsInTwoDBs(t, m, pre+"2")
	two := append(slices.Clone(c), d...)
	if n, _, err := m.ApplyCredits(ctx, two); err != nil || n != len(two) {
		t.Fatal(n, err)
	}
	if got := mark(two); got["Com_update"] != 2 || got["Com_begin"] != 1 || got["Com_commit"] != 1 {
		t.Errorf("two databases: %v, want 2 UPDATEs in one transaction", got)
	}
}
