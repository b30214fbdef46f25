package storage

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// These tests drive applyCreditsTx's bulk path (credits.go) and its fallback
// credit by credit, and check the real rows: each claimant's balance and its
// flow rows under "claim:"+claim ID.

// sameShard returns n act IDs starting with pre whose wallets share one shard.
func sameShard(t *testing.T, pre string, n int) []string {
	t.Helper()
	first := pre + "-0"
	s := sharding.ShardOfAct(first)
	out := []string{first}
	for i := 1; len(out) < n && i < 1_000_000; i++ {
		if act := fmt.Sprintf("%s-%d", pre, i); sharding.ShardOfAct(act) == s {
			out = append(out, act)
		}
	}
	if len(out) < n {
		t.Fatalf("found %d act IDs of one shard, want %d", len(out), n)
	}
	return out
}

// bulkFixture makes two packets claimed by the same claimants, three of them
// in one shard and one elsewhere: each claimant is owed two credits, so one
// shard's bulk statements carry six credits of three wallets. The test must
// leave every credit booked: a relay of another package's test cells on this
// server that reads the claims then finds them credited.
func bulkFixture(t *testing.T, m *MySQL) (credits []model.Credit, claimants []string) {
	t.Helper()
	pre := testenv.Prefix()
	claimants = sameShard(t, pre+"-k", 3)
	other := pre + "-other"
	for sharding.ShardOfAct(other) == sharding.ShardOfAct(claimants[0]) {
		other += "x"
	}
	claimants = append(claimants, other)
	credits = append(claimsFor(t, m, pre+"-p1", claimants), claimsFor(t, m, pre+"-p2", claimants)...)
	rand.New(rand.NewPCG(7, 7)).Shuffle(len(credits), func(i, j int) { credits[i], credits[j] = credits[j], credits[i] })
	return credits, claimants
}

// checkBooked asserts from the tables that each claimant's balance is the sum
// of its booked credits and that each credit has exactly flows[claim] flow
// rows (1 booked, 0 not), with the claim's amount.
func checkBooked(t *testing.T, m *MySQL, credits []model.Credit, booked func(model.Credit) bool) {
	t.Helper()
	want := map[string]model.Cents{}
	for _, c := range credits {
		flows := 0
		want[c.ActID] += 0
		if booked(c) {
			want[c.ActID] += c.Amount
			flows = 1
		}
		var n int
		var sum sql.NullInt64
		if err := m.db.QueryRow("SELECT COUNT(*), SUM(amount) FROM "+m.flowTable(c.Shard)+" WHERE act_id = ? AND order_no = ? AND kind = ?",
			c.ActID, model.CreditOrderNo(c.ClaimID), string(model.FlowCredit)).Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		if n != flows || (n == 1 && model.Cents(sum.Int64) != c.Amount) {
			t.Errorf("claim %s of %s: %d flow rows of %d cents, want %d of %d", c.ClaimID, c.ActID, n, sum.Int64, flows, c.Amount)
		}
	}
	for act, w := range want {
		if b := balance(t, m, act); b != w {
			t.Errorf("%s: balance %d, want %d", act, b, w)
		}
	}
}

// redeliver delivers credits again until want of them are applied, for up
// to 20 s, and returns how many were: once the locks that deferred them are
// released, a transaction on a neighbouring key of the flow index (InnoDB's
// duplicate check locks the next record too) may still defer one for a
// moment, as it would a relay's delivery.
func redeliver(t *testing.T, m *MySQL, credits []model.Credit, want int) int {
	t.Helper()
	total := 0
	testenv.Until(20*time.Second, func() bool {
		applied, _, err := ApplyCredits(context.Background(), m, credits)
		if err != nil {
			t.Fatal(err)
		}
		total += applied
		return total >= want
	})
	return total
}

func paths(m *MySQL) (bulk, oneByOne int64) { return m.bulk.Bulk.Load(), m.bulk.OneByOne.Load() }

// TestApplyCreditsBulkFresh: credits never booked, in no order, two per
// wallet, go in two bulk groups (the shared shard and the other), never
// credit by credit; a second delivery books nothing.
func TestApplyCreditsBulkFresh(t *testing.T) {
	m := openStore(t)
	credits, _ := bulkFixture(t, m)
	applied, deferred, err := ApplyCredits(context.Background(), m, credits)
	if err != nil || applied != len(credits) || len(deferred) != 0 {
		t.Fatalf("applied %d, deferred %v, err %v; want all %d", applied, deferred, err, len(credits))
	}
	if bulk, one := paths(m); bulk != 2 || one != 0 {
		t.Errorf("shard groups: %d in bulk, %d one by one; want 2 and 0", bulk, one)
	}
	if f := m.bulk.Fallback.Load(); f != 0 {
		t.Errorf("%d batches fell back to shard by shard; want all in one round trip", f)
	}
	checkBooked(t, m, credits, func(model.Credit) bool { return true })
	applied, deferred, err = ApplyCredits(context.Background(), m, credits)
	if err != nil || applied != 0 || len(deferred) != 0 {
		t.Fatalf("again: applied %d, deferred %v, err %v; want nothing", applied, deferred, err)
	}
	checkBooked(t, m, credits, func(model.Credit) bool { return true })
}

// TestApplyCreditsBulkMixed: half the credits were booked before; the batch
// of all books the other half once (the bulk INSERT's row count shows the
// earlier ones, so those shards go credit by credit) and the balances hold
// every credit once.
func TestApplyCreditsBulkMixed(t *testing.T) {
	m := openStore(t)
	credits, _ := bulkFixture(t, m)
	first := credits[:len(credits)/2]
	if applied, _, err := ApplyCredits(context.Background(), m, first); err != nil || applied != len(first) {
		t.Fatal(applied, err)
	}
	_, oneBefore := paths(m)
	fallbackBefore := m.bulk.Fallback.Load()
	applied, deferred, err := ApplyCredits(context.Background(), m, credits)
	if err != nil || applied != len(credits)-len(first) || len(deferred) != 0 {
		t.Fatalf("applied %d, deferred %v, err %v; want the other %d", applied, deferred, err, len(credits)-len(first))
	}
	if _, one := paths(m); one == oneBefore {
		t.Error("no shard group went credit by credit, yet some credits were booked before")
	}
	if f := m.bulk.Fallback.Load(); f != fallbackBefore+1 {
		t.Errorf("%d batches fell back from one round trip; want the 1 with credits booked before", f-fallbackBefore)
	}
	checkBooked(t, m, credits, func(model.Credit) bool { return true })
}

// TestApplyCreditsBulkLockedWallet: one wallet of the shared shard is held
// FOR UPDATE by another open transaction. Its two credits are deferred with
// nothing written, the rest are booked at once (no lock wait), and once the
// lock is gone they are booked, once.
func TestApplyCreditsBulkLockedWallet(t *testing.T) {
	m := openStore(t)
	credits, claimants := bulkFixture(t, m)
	locked := claimants[1]
	s := sharding.ShardOfAct(locked)
	bg := context.Background()
	if err := m.EnsureShard(bg, s); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Exec("INSERT INTO "+m.accountTable(s)+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", locked); err != nil {
		t.Fatal(err)
	}
	release := hold(t, m, sql.LevelReadCommitted, "SELECT balance FROM "+m.accountTable(s)+" WHERE act_id = ? FOR UPDATE", locked)
	ctx, cancel := context.WithTimeout(bg, 3*time.Second)
	defer cancel()
	start := time.Now()
	applied, deferred, err := ApplyCredits(ctx, m, credits)
	if took := time.Since(start); err != nil || applied != len(credits)-2 || took > time.Second {
		t.Fatalf("applied %d, err %v after %s; want all but %s's 2 at once", applied, err, took, locked)
	}
	var want []string
	for _, c := range credits {
		if c.ActID == locked {
			want = append(want, c.ClaimID)
		}
	}
	slices.Sort(want)
	slices.Sort(deferred)
	if !slices.Equal(deferred, want) {
		t.Errorf("deferred %v, want %v", deferred, want)
	}
	checkBooked(t, m, credits, func(c model.Credit) bool { return c.ActID != locked })
	release()
	if total := redeliver(t, m, credits, 2); total != 2 { // a neighbouring key's lock may defer one a moment more
		t.Fatalf("after the lock: %d applied, want the 2 deferred", total)
	}
	checkBooked(t, m, credits, func(model.Credit) bool { return true })
}

// TestApplyCreditsListedTwice: a batch that names some credits twice books
// each once and counts it once; a deferral would name it once.
func TestApplyCreditsListedTwice(t *testing.T) {
	m := openStore(t)
	credits, _ := bulkFixture(t, m)
	twice := append(slices.Clone(credits), credits[0], credits[3], credits[0])
	applied, deferred, err := ApplyCredits(context.Background(), m, twice)
	if err != nil || applied != len(credits) || len(deferred) != 0 {
		t.Fatalf("applied %d, deferred %v, err %v; want %d", applied, deferred, err, len(credits))
	}
	if _, one := paths(m); one != 0 {
		t.Errorf("%d shard groups went credit by credit; a repeat within the batch needs none", one)
	}
	checkBooked(t, m, credits, func(model.Credit) bool { return true })
}

// TestApplyCreditsTxRollsBackWithCaller: applyCreditsTx writes only inside
// the caller's transaction: rolled back, it leaves no flow row and no
// balance; committed, the credits are booked.
func TestApplyCreditsTxRollsBackWithCaller(t *testing.T) {
	m := openStore(t)
	credits, _ := bulkFixture(t, m)
	bg := context.Background()
	for _, c := range credits {
		if err := m.EnsureShard(bg, c.Shard); err != nil {
			t.Fatal(err)
		}
	}
	for _, commit := range []bool{false, true} {
		tx, err := m.db.BeginTx(bg, nil)
		if err != nil {
			t.Fatal(err)
		}
		applied, deferred, err := m.applyCreditsTx(bg, tx, credits, m.nowMS(), false)
		if err != nil || applied != len(credits) || len(deferred) != 0 {
			t.Fatal(applied, deferred, err)
		}
		if !commit {
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			checkBooked(t, m, credits, func(model.Credit) bool { return false })
			continue
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		checkBooked(t, m, credits, func(model.Credit) bool { return true })
	}
}

// BenchmarkApplyCredits books 64 fresh credits per call, each to another of
// 4,096 wallets, with the wallets spread over 1, 10 or 1,000 shards (a cell
// owning 1,000 shards sees the last: about one credit per shard table), and
// 500 per call (the relay's BatchMax) over 100 shards (a cell of 10 databases),
// three ways, each one transaction per call: "each", credit by credit
// (creditOne); "shardwise", a shard's credits in bulk, a round trip per
// statement (creditShards, the fallback); "bulk", ApplyCredits, the whole
// batch in one round trip. The ratios of their ns/op are the gains in that
// spread (each runs first, on tables just made: a cold start counts against
// it). Its store has a name prefix of its own, dropped at the end.
func BenchmarkApplyCredits(b *testing.B) {
	m, err := Open(testenv.MySQLDSN(b, 1), 8)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	m.ns = "bn" + testenv.Prefix()[1:] + "_"
	b.Cleanup(func() { dropNamespace(b, m) })
	const wallets = 4096
	ctx := context.Background()
	for _, cs := range []struct{ perCall, spread int }{{64, 1}, {64, 10}, {64, 1000}, {500, 100}} {
		perCall, spread := cs.perCall, cs.spread
		shards := make([]model.ShardID, spread)
		for i := range shards {
			shards[i] = model.ShardID(i * (model.ShardCount / spread))
			if err := m.EnsureShard(ctx, shards[i]); err != nil {
				b.Fatal(err)
			}
		}
		batch := func(run string, i int) []model.Credit {
			cs := make([]model.Credit, perCall)
			for j := range cs {
				w := (i*perCall + j) % wallets
				cs[j] = model.Credit{ClaimID: fmt.Sprintf("%s-%d-%d", run, i, j), PacketID: "bench", ActID: fmt.Sprintf("w%04d", w),
					Shard: shards[w%spread], Amount: 1}
			}
			return cs
		}
		b.Run(fmt.Sprintf("credits=%d/shards=%d/each", perCall, spread), func(b *testing.B) {
			run := testenv.Prefix()
			for i := 0; b.Loop(); i++ {
				cs := lockOrder(batch(run, i))
				err := m.inTx(ctx, func(tx *sql.Tx) error {
					now := m.nowMS()
					for _, c := range cs {
						if out, err := m.creditOne(ctx, tx, c, now, noWait); err != nil || out != creditApplied {
							return fmt.Errorf("credit %s: outcome %d, %v", c.ClaimID, out, err)
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("credits=%d/shards=%d/shardwise", perCall, spread), func(b *testing.B) {
			run := testenv.Prefix()
			for i := 0; b.Loop(); i++ {
				cs := lockOrder(batch(run, i))
				err := m.inTx(ctx, func(tx *sql.Tx) error {
					n, _, err := m.creditShards(ctx, tx, cs, m.nowMS(), noWait)
					if err == nil && n != perCall {
						err = fmt.Errorf("applied %d of %d", n, perCall)
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("credits=%d/shards=%d/bulk", perCall, spread), func(b *testing.B) {
			run := testenv.Prefix()
			for i := 0; b.Loop(); i++ {
				if n, _, err := ApplyCredits(ctx, m, batch(run, i)); err != nil || n != perCall {
					b.Fatal(n, err)
				}
			}
			b.ReportMetric(float64(m.bulk.Fallback.Load()), "fallbacks")
		})
	}
}
