package storage

// Tests of applyCreditsTx's one-round-trip path (creditAll) where it must
// fall back: a failure in the last shard's statements after earlier shards'
// ran, batches over creditRowsMax, the same credits twice in one
// transaction, and overlapping batches at once. Synthetic credits (no
// claims) in a namespace of their own.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
)

// ownNamespaceStore is a store with a namespace of its own (dropped at the end), so
// synthetic credits (no claims) never meet other tests' rows.
func ownNamespaceStore(t *testing.T) *MySQL {
	t.Helper()
	m := openStore(t)
	m.ns = "rv" + testenv.Prefix()[1:] + "_"
	t.Cleanup(func() { dropNamespace(t, m) })
	return m
}

// synth makes, for each shard, wallets wallets with per credits each.
func synthCredits(t *testing.T, m *MySQL, pre string, shards []model.ShardID, wallets, per int) []model.Credit {
	t.Helper()
	var cs []model.Credit
	for _, s := range shards {
		if err := m.EnsureShard(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		for w := 0; w < wallets; w++ {
			for k := 0; k < per; k++ {
				cs = append(cs, model.Credit{ClaimID: fmt.Sprintf("%s-%d-%d-%d", pre, s, w, k), PacketID: "rv",
					ActID: fmt.Sprintf("%s-w%d-%d", pre, s, w), Shard: s, Amount: model.Cents(1 + k + 10*w)})
			}
		}
	}
	return cs
}

// checkRows asserts each credit has exactly one flow row iff booked, and each
// wallet's balance is the sum of its booked credits.
func checkCreditRows(t *testing.T, m *MySQL, cs []model.Credit, booked func(model.Credit) bool) {
	t.Helper()
	type wk struct {
		s   model.ShardID
		act string
	}
	want := map[wk]model.Cents{}
	for _, c := range cs {
		want[wk{c.Shard, c.ActID}] += 0
		n := 0
		if booked(c) {
			want[wk{c.Shard, c.ActID}] += c.Amount
			n = 1
		}
		if got := creditFlows(t, m, c); got != n {
			t.Errorf("claim %s: %d flow rows, want %d", c.ClaimID, got, n)
		}
	}
	for k, w := range want {
		var b int64
		err := m.db.QueryRow("SELECT balance FROM "+m.accountTable(k.s)+" WHERE act_id = ?", k.act).Scan(&b)
		if err != nil && err != sql.ErrNoRows {
			t.Fatal(err)
		}
		if model.Cents(b) != w {
			t.Errorf("%s: balance %d, want %d", k.act, b, w)
		}
	}
}

// TestStatementListStopsAtItsError: a statement list whose third
// statement fails with 1062 returns that error from ExecContext, leaves the
// connection clean (the next statement in the tx works), runs nothing after
// the failing statement, keeps the statements before it and the transaction,
// and ROLLBACK TO SAVEPOINT takes them back.
func TestStatementListStopsAtItsError(t *testing.T) {
	m := ownNamespaceStore(t)
	db := m.ns + "mstest"
	if _, err := m.db.Exec("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Exec("CREATE TABLE " + db + ".t (x INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Exec("INSERT INTO " + db + ".t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	tx, err := m.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tx.Exec("SAVEPOINT sp; INSERT INTO "+db+".t VALUES (?); INSERT INTO "+db+".t VALUES (?), (?); INSERT INTO "+db+".t VALUES (?)", 2, 3, 1, 4)
	if !isMySQLErr(err, errDupEntry) {
		t.Fatalf("err %v, want 1062", err)
	}
	count := func(x int) int {
		var n int
		if err := tx.QueryRow("SELECT COUNT(*) FROM "+db+".t WHERE x = ?", x).Scan(&n); err != nil {
			t.Fatalf("after the error: %v", err)
		}
		return n
	}
	if err := stillInTx(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if c2, c3, c4 := count(2), count(3), count(4); c2 != 1 || c3 != 0 || c4 != 0 {
		t.Fatalf("before the failing statement kept %d, the failing statement's own row %d, after it %d; want 1 0 0", c2, c3, c4)
	}
	if _, err := tx.Exec("ROLLBACK TO SAVEPOINT sp"); err != nil {
		t.Fatal(err)
	}
	if c2 := count(2); c2 != 0 {
		t.Fatalf("after the rollback to the savepoint: %d", c2)
	}
}

// lastShard returns the last shard of cs in lock order.
func lastShard(cs []model.Credit) model.ShardID {
	return slices.MaxFunc(cs, func(a, b model.Credit) int { return int(a.Shard) - int(b.Shard) }).Shard
}

// TestApplyCreditsBookedBeforeInLastShard: one credit of the last shard (the last
// statements of the list) was booked before; earlier shards' statements ran
// and are rolled back; everything else is booked exactly once.
func TestApplyCreditsBookedBeforeInLastShard(t *testing.T) {
	m := ownNamespaceStore(t)
	shards := []model.ShardID{3, 17, 250, 901}
	cs := synthCredits(t, m, testenv.Prefix(), shards, 3, 2)
	var before model.Credit
	for _, c := range cs {
		if c.Shard == lastShard(cs) {
			before = c
		}
	}
	if a, _, err := ApplyCredits(context.Background(), m, []model.Credit{before}); err != nil || a != 1 {
		t.Fatal(a, err)
	}
	fb := m.bulk.Fallback.Load()
	a, d, err := ApplyCredits(context.Background(), m, cs)
	if err != nil || a != len(cs)-1 || len(d) != 0 {
		t.Fatalf("applied %d deferred %v err %v; want %d", a, d, err, len(cs)-1)
	}
	if m.bulk.Fallback.Load() != fb+1 {
		t.Error("no fallback")
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// TestApplyCreditsLockedWalletInLastShard: the wallet held is in the last shard.
func TestApplyCreditsLockedWalletInLastShard(t *testing.T) {
	m := ownNamespaceStore(t)
	shards := []model.ShardID{3, 17, 250, 901}
	cs := synthCredits(t, m, testenv.Prefix(), shards, 3, 2)
	locked := cs[len(cs)-1]
	if _, err := m.db.Exec("INSERT INTO "+m.accountTable(locked.Shard)+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", locked.ActID); err != nil {
		t.Fatal(err)
	}
	release := hold(t, m, sql.LevelReadCommitted, "SELECT balance FROM "+m.accountTable(locked.Shard)+" WHERE act_id = ? FOR UPDATE", locked.ActID)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	a, d, err := ApplyCredits(ctx, m, cs)
	var want []string
	for _, c := range cs {
		if c.ActID == locked.ActID {
			want = append(want, c.ClaimID)
		}
	}
	slices.Sort(want)
	slices.Sort(d)
	if err != nil || a != len(cs)-len(want) || !slices.Equal(d, want) {
		t.Fatalf("applied %d deferred %v err %v; want %d and %v", a, d, err, len(cs)-len(want), want)
	}
	checkCreditRows(t, m, cs, func(c model.Credit) bool { return c.ActID != locked.ActID })
	release()
	a, d, err = ApplyCredits(context.Background(), m, cs)
	if err != nil || a != len(want) || len(d) != 0 {
		t.Fatalf("after release: applied %d deferred %v err %v", a, d, err)
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// TestApplyCreditsAcrossChunks: 1,500 credits over 3 shards, a shard and a wallet
// spanning the chunk boundary (1,000), one credit of each chunk booked
// before, and a wallet of the second chunk held.
func TestApplyCreditsAcrossChunks(t *testing.T) {
	m := ownNamespaceStore(t)
	pre := testenv.Prefix()
	// shard 5: 2 wallets x 200; shard 6: 1 wallet x 800 (credits 400..1199, spanning 1000); shard 7: 3 x 100.
	cs := append(synthCredits(t, m, pre+"a", []model.ShardID{5}, 2, 200), synthCredits(t, m, pre+"b", []model.ShardID{6}, 1, 800)...)
	cs = append(cs, synthCredits(t, m, pre+"c", []model.ShardID{7}, 3, 100)...)
	sorted := lockOrder(cs)
	if sorted[999].Shard != 6 || sorted[1000].Shard != 6 || sorted[999].ActID != sorted[1000].ActID {
		t.Fatalf("fixture: no wallet spans the chunk boundary")
	}
	pre1, pre2 := sorted[10], sorted[1300]
	if a, _, err := ApplyCredits(context.Background(), m, []model.Credit{pre1, pre2}); err != nil || a != 2 {
		t.Fatal(a, err)
	}
	lockedAct := sorted[1450].ActID
	if _, err := m.db.Exec("INSERT INTO "+m.accountTable(7)+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", lockedAct); err != nil {
		t.Fatal(err)
	}
	release := hold(t, m, sql.LevelReadCommitted, "SELECT balance FROM "+m.accountTable(7)+" WHERE act_id = ? FOR UPDATE", lockedAct)
	a, d, err := ApplyCredits(context.Background(), m, cs)
	nLocked := 0
	for _, c := range cs {
		if c.ActID == lockedAct {
			nLocked++
		}
	}
	if err != nil || a != len(cs)-2-nLocked || len(d) != nLocked {
		t.Fatalf("applied %d deferred %d err %v; want %d, %d", a, len(d), err, len(cs)-2-nLocked, nLocked)
	}
	checkCreditRows(t, m, cs, func(c model.Credit) bool { return c.ActID != lockedAct })
	release()
	if a, d, err := ApplyCredits(context.Background(), m, cs); err != nil || a != nLocked || len(d) != 0 {
		t.Fatalf("after release: %d %v %v", a, d, err)
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// TestApplyCreditsTwiceInOneTx: the same credits through applyCreditsTx twice in
// one transaction (two credit ops of one group): booked once, counted once.
func TestApplyCreditsTwiceInOneTx(t *testing.T) {
	m := ownNamespaceStore(t)
	cs := synthCredits(t, m, testenv.Prefix(), []model.ShardID{3, 17, 250}, 2, 2)
	bg := context.Background()
	err := m.inTx(bg, func(tx *sql.Tx) error {
		a1, _, err := m.applyCreditsTx(bg, tx, cs, m.nowMS(), true) // first in the transaction
		if err != nil {
			return err
		}
		a2, _, err := m.applyCreditsTx(bg, tx, append(slices.Clone(cs[2:5]), cs...), m.nowMS(), false)
		if err != nil {
			return err
		}
		if a1 != len(cs) || a2 != 0 {
			return fmt.Errorf("applied %d then %d", a1, a2)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// TestApplyCreditsFlowRowHeldInLastShard: another transaction has inserted (not
// committed) the flow row of one credit of the last shard: that credit is
// deferred, the rest booked once.
func TestApplyCreditsFlowRowHeldInLastShard(t *testing.T) {
	m := ownNamespaceStore(t)
	cs := synthCredits(t, m, testenv.Prefix(), []model.ShardID{3, 17, 250, 901}, 3, 2)
	held := cs[len(cs)-2]
	other, err := m.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	out := model.ApplyCredit(model.CreditInput{Credit: held, NowMS: 1})
	if _, err := other.Exec(m.flowInsert(held.Shard), flowArgs(out.Flow)...); err != nil {
		t.Fatal(err)
	}
	a, d, err := ApplyCredits(context.Background(), m, cs)
	if err != nil || a != len(cs)-1 || !slices.Equal(d, []string{held.ClaimID}) {
		t.Fatalf("applied %d deferred %v err %v", a, d, err)
	}
	other.Rollback()
	checkCreditRows(t, m, cs, func(c model.Credit) bool { return c.ClaimID != held.ClaimID })
	if a, d, err := ApplyCredits(context.Background(), m, cs); err != nil || a != 1 || len(d) != 0 {
		t.Fatalf("after: %d %v %v", a, d, err)
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// TestApplyCreditsConcurrentOverlap: goroutines book overlapping batches at once,
// re-offering what was deferred or failed, until all are applied; every
// credit is booked exactly once and applied is counted exactly once overall.
func TestApplyCreditsConcurrentOverlap(t *testing.T) {
	m := ownNamespaceStore(t)
	cs := synthCredits(t, m, testenv.Prefix(), []model.ShardID{3, 17, 250, 901, 902}, 4, 3)
	const workers = 4
	total := make(chan int, workers)
	for w := 0; w < workers; w++ {
		go func(w int) {
			sum := 0
			mine := slices.Clone(cs)
			for i := range mine { // each its own order
				j := (i*7 + w*13) % len(mine)
				mine[i], mine[j] = mine[j], mine[i]
			}
			for try := 0; try < 200; try++ {
				a, d, err := ApplyCredits(context.Background(), m, mine)
				if err != nil {
					t.Logf("worker %d: %v", w, err)
					continue
				}
				sum += a
				if len(d) == 0 {
					break
				}
			}
			total <- sum
		}(w)
	}
	sum := 0
	for w := 0; w < workers; w++ {
		sum += <-total
	}
	if sum != len(cs) {
		t.Errorf("applied %d in all, want %d", sum, len(cs))
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}

// comSavepoints is the SAVEPOINT statements tx's connection has run.
func comSavepoints(t *testing.T, tx *sql.Tx) int64 {
	t.Helper()
	return sessionCount(t, tx, "Com_savepoint")
}

// sessionCount is the session status counter name (Com_select, say) of
// q's connection: a transaction's, or a pool of one connection's.
func sessionCount(t *testing.T, q interface {
	QueryRow(string, ...any) *sql.Row
}, name string) int64 {
	t.Helper()
	var got string
	var n int64
	if err := q.QueryRow("SHOW SESSION STATUS LIKE ?", name).Scan(&got, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// First in its transaction (fresh), a bulk list runs without a SAVEPOINT;
// when it cannot be written whole it answers errBulkUnfit and writes
// nothing the transaction keeps, and ApplyCredits runs it again with the
// savepoint path: a batch holding a credit booked before books the rest,
// each once.
func TestCreditsFreshWithoutSavepoint(t *testing.T) {
	m := ownNamespaceStore(t)
	cs := synthCredits(t, m, testenv.Prefix(), []model.ShardID{3, 17, 250}, 2, 2)
	bg := context.Background()
	for _, fresh := range []bool{true, false} {
		tx, err := m.db.BeginTx(bg, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := comSavepoints(t, tx)
		a, d, err := m.applyCreditsTx(bg, tx, cs, m.nowMS(), fresh)
		after := comSavepoints(t, tx)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		want := int64(1)
		if fresh {
			want = 0
		}
		if err != nil || a != len(cs) || len(d) != 0 || after-before != want {
			t.Errorf("fresh %v: applied %d, deferred %v, %v; %d savepoints, want %d", fresh, a, d, err, after-before, want)
		}
	}
	// One credit booked before: the fresh list cannot be written whole.
	if a, _, err := ApplyCredits(bg, m, cs[:1]); err != nil || a != 1 {
		t.Fatalf("the first credit: %d %v", a, err)
	}
	tx, err := m.db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.applyCreditsTx(bg, tx, cs, m.nowMS(), true); !errors.Is(err, errBulkUnfit) {
		t.Errorf("a fresh list over a booked credit: %v, want errBulkUnfit", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	checkCreditRows(t, m, cs, func(c model.Credit) bool { return c.ClaimID == cs[0].ClaimID })
	if a, d, err := ApplyCredits(bg, m, cs); err != nil || a != len(cs)-1 || len(d) != 0 {
		t.Fatalf("the batch after: applied %d, deferred %v, %v; want %d", a, d, err, len(cs)-1)
	}
	checkCreditRows(t, m, cs, func(model.Credit) bool { return true })
}
