package storage

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestReconWindow: the window read returns exactly the claims and outbox rows
// created inside it, agreeing row for row; a limit cuts it at a millisecond
// boundary; CreditsOf finds the credits as booked, and a changed claim shows up.
func TestReconWindow(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	base := time.Now().Truncate(time.Millisecond)
	clk := newSetTime(base)
	m.SetClock(clk)
	pre := testenv.Prefix()
	sender := pre + "-s"
	deposit(t, m, sender, 1000)
	ref := send(t, m, sender, 600, 3, time.Hour)
	db := ref.Shard.DB()
	var shards []model.ShardID
	for s := db * 10; s < db*10+10; s++ {
		shards = append(shards, model.ShardID(s))
	}
	var credits []model.Credit
	for i := range 3 { // one open per millisecond: base+1, base+2, base+3
		clk.Set(base.Add(time.Duration(i+1) * time.Millisecond))
		act := pre + "-c" + string(rune('a'+i))
		res, _, err := m.OpenBatch(ctx, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount})
	}
	from, to := base.Add(time.Millisecond).UnixMilli(), base.Add(4*time.Millisecond).UnixMilli()
	days := []int{ref.Day}
	w, err := m.ReconWindow(ctx, db, shards, days, from, to, 100)
	if err != nil {
		t.Fatal(err)
	}
	ob := model.CompareOutbox(w.Claims, w.Outbox)
	if w.ToMS != to || ob.Diffs.Count() != 0 || ob.Matched != (model.Tally{Count: 3, Cents: 600}) || len(ob.Pending) != 3 {
		t.Fatalf("window %+v: %+v", w, ob)
	}
	// A limit of 1 (2 rows read whole) cuts the window after the first millisecond.
	w, err = m.ReconWindow(ctx, db, shards, days, from, to, 1)
	if err != nil || w.ToMS != from+1 || len(w.Claims) != 1 || len(w.Outbox) != 1 {
		t.Fatalf("cut window %+v, %v", w, err)
	}
	// Credited and marked: the rows read as delivered and CreditsOf finds them.
	if _, _, err := m.ApplyCredits(ctx, credits); err != nil {
		t.Fatal(err)
	}
	if _, err := m.MarkDelivered(ctx, credits); err != nil {
		t.Fatal(err)
	}
	w, _ = m.ReconWindow(ctx, db, shards, days, from, to, 100)
	ob = model.CompareOutbox(w.Claims, w.Outbox)
	found, err := m.CreditsOf(ctx, ob.Delivered)
	if err != nil {
		t.Fatal(err)
	}
	if cc := model.CompareCredits(ob.Delivered, found); len(ob.Delivered) != 3 || cc.Matched != (model.Tally{Count: 3, Cents: 600}) || cc.Diffs.Count() != 0 {
		t.Fatalf("credits: %+v %+v", ob, cc)
	}
	// A claim whose amount changed no longer matches its outbox row.
	claimTable := m.claimTable(ref.Shard, ref.Day)
	if _, err := m.db.Exec("UPDATE "+claimTable+" SET amount = amount + 1 WHERE packet_id = ? AND seq = 1", string(ref.ID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.db.Exec("UPDATE "+claimTable+" SET amount = amount - 1 WHERE packet_id = ? AND seq = 1", string(ref.ID))
	})
	w, _ = m.ReconWindow(ctx, db, shards, days, from, to, 100)
	if ob = model.CompareOutbox(w.Claims, w.Outbox); len(ob.Diffs[model.DiffOutboxMismatch]) != 1 || ob.Diffs[model.DiffOutboxMismatch][0] != credits[0].ClaimID {
		t.Fatalf("changed claim: %+v", ob.Diffs)
	}
	// Outside the window nothing is read.
	if w, err = m.ReconWindow(ctx, db, shards, days, to, to+1000, 100); err != nil || len(w.Claims)+len(w.Outbox) != 0 {
		t.Fatalf("empty window %+v, %v", w, err)
	}
}

// TestEnsureDayAddsCreatedIndex: a claim table made before k_created existed
// gets the index when a cell ensures its day (reconciliation reads by it).
func TestEnsureDayAddsCreatedIndex(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	s := sharding.ShardOfAct(testenv.Prefix())
	day := 1 + int(time.Now().Unix()%28)
	if err := m.EnsureDay(ctx, s, day); err != nil {
		t.Fatal(err)
	}
	table := m.claimTable(s, day)
	if _, err := m.db.Exec("ALTER TABLE " + table + " DROP INDEX k_created"); err != nil {
		t.Fatal(err)
	}
	fresh := openStore(t) // a new process: its ensure cache is empty
	if err := fresh.EnsureDay(ctx, s, day); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM information_schema.statistics WHERE CONCAT(table_schema, '.', table_name) = ? AND index_name = 'k_created'",
		table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%s has %d k_created index columns after EnsureDay, want 1", table, n)
	}
}

// TestCreditsOfDoubleCredit: one claim credited to two accounts comes back
// with both amounts summed, which never matches the claim: reconciliation
// reports it as credit_mismatch instead of reading one of the two as matched.
func TestCreditsOfDoubleCredit(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	a := pre + "-a"
	s := sharding.ShardOfAct(a)
	b := ""
	for i := 0; b == ""; i++ { // a second account in the same shard
		if c := fmt.Sprintf("%s-b%d", pre, i); sharding.ShardOfAct(c) == s {
			b = c
		}
	}
	if err := m.EnsureShard(ctx, s); err != nil {
		t.Fatal(err)
	}
	pid := model.NewPacketID(s, time.Now())
	claimX, claimY := model.ClaimID(pid, 1), model.ClaimID(pid, 2)
	now := time.Now().UnixMilli()
	// The rows are not money any test moved: they go again, so the audits of
	// the shared test databases stay clean.
	t.Cleanup(func() {
		if _, err := m.db.Exec("DELETE FROM "+m.flowTable(s)+" WHERE act_id IN (?, ?)", a, b); err != nil {
			t.Error(err)
		}
	})
	for _, row := range []struct {
		act, claim string
		amount     int64
	}{{a, claimX, 300}, {b, claimY, 200}, {b, claimX, 300}} { // claimX credited to a and, wrongly, to b
		if _, err := m.db.Exec("INSERT INTO "+m.flowTable(s)+" (act_id, order_no, kind, amount, ref, created_ms) VALUES (?, ?, 'credit', ?, ?, ?)",
			row.act, "claim:"+row.claim, row.amount, string(pid), now); err != nil {
			t.Fatal(err)
		}
	}
	asked := []model.Credit{
		{ClaimID: claimX, PacketID: pid, ActID: a, Shard: s, Amount: 300},
		{ClaimID: claimY, PacketID: pid, ActID: b, Shard: s, Amount: 200},
	}
	found, err := m.CreditsOf(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if found[claimX].Amount != 600 || found[claimY].Amount != 200 || found[claimY].ActID != b {
		t.Fatalf("credits found: %+v", found)
	}
	cc := model.CompareCredits(asked, found)
	if cc.Matched.Count != 1 || len(cc.Diffs[model.DiffCreditMismatch]) != 1 || cc.Diffs[model.DiffCreditMismatch][0] != claimX {
		t.Fatalf("comparison: matched %+v, diffs %v", cc.Matched, cc.Diffs)
	}
}
