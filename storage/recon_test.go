package storage

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestReconWindow: the window read returns exactly the claims created inside
// it, each with the credit it owes (claimant's shard, computed from act_id
// for a row made before act_shard existed; its Dest); a limit cuts it at a
// millisecond boundary, never inside one millisecond; CreditsOf finds the
// credits as booked, and a changed claim no longer matches its credit.
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
		res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount,
			CreatedMS: clk.Now().UnixMilli()})
	}
	from, to := base.Add(time.Millisecond).UnixMilli(), base.Add(4*time.Millisecond).UnixMilli()
	days := []int{ref.Day}
	owed := func(w model.ReconWindow) []model.Credit {
		var out []model.Credit
		for _, id := range slices.Sorted(maps.Keys(w.Claims)) {
			out = append(out, model.CreditOf(w.Claims[id]))
		}
		return out
	}
	w, err := ReconWindow(ctx, m, db, shards, days, from, to, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(credits)
	slices.SortFunc(want, func(a, b model.Credit) int { return strings.Compare(a.ClaimID, b.ClaimID) })
	if w.ToMS != to || !reflect.DeepEqual(owed(w), want) {
		t.Fatalf("window to %d: %+v\nwant the credits %+v", w.ToMS, owed(w), want)
	}
	// A limit of 1 cuts the window after the first millisecond, 2 after the second.
	for limit := 1; limit <= 3; limit++ {
		w, err = ReconWindow(ctx, m, db, shards, days, from, to, limit)
		if end := min(from+int64(limit), to); err != nil || w.ToMS != end || len(w.Claims) != limit {
			t.Fatalf("window of limit %d: %+v, %v (want it cut at %d)", limit, w, err, end)
		}
	}
	// Two claims in one millisecond are read whole, whatever the limit.
	clk.Set(base.Add(10 * time.Millisecond))
	ref2 := send(t, m, sender, 200, 2, time.Hour)
	clk.Set(base.Add(11 * time.Millisecond))
	res, _, err := OpenBatch(ctx, m, ref2, []model.OpenRequest{{ActID: pre + "-cx", Shard: sharding.ShardOfAct(pre + "-cx")},
		{ActID: pre + "-cy", Shard: sharding.ShardOfAct(pre + "-cy")}}, rand.New(rand.NewPCG(1, 2)))
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err, res)
	}
	ms := clk.Now().UnixMilli()
	if w, err = ReconWindow(ctx, m, db, shards, []int{ref2.Day}, ms, ms+5, 1); err != nil || w.ToMS != ms+1 || len(w.Claims) != 2 {
		t.Fatalf("one millisecond of 2 claims with limit 1: %+v, %v", w, err)
	}

	// A row made before act_shard existed reads with the shard of its act_id;
	// a row's dest reads as its Dest.
	claimTable := m.claimTable(ref.Shard, ref.Day)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := m.db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec("UPDATE "+claimTable+" SET act_shard = -1, dest = 'cell-x' WHERE packet_id = ? AND seq = 1", string(ref.ID))
	w, _ = ReconWindow(ctx, m, db, shards, days, from, to, 100)
	if c := w.Claims[credits[0].ClaimID]; c.ActShard != credits[0].Shard || c.Dest != "cell-x" || !reflect.DeepEqual(w.Claims[credits[1].ClaimID], model.Claim{
		ID: credits[1].ClaimID, PacketID: ref.ID, Seq: 2, ActID: credits[1].ActID, Amount: credits[1].Amount, CreatedMS: credits[1].CreatedMS, ActShard: credits[1].Shard}) {
		t.Fatalf("claims read: %+v", w.Claims)
	}

	// Credited: CreditsOf finds the credits the claims owe.
	if _, _, err := ApplyCredits(ctx, m, credits); err != nil {
		t.Fatal(err)
	}
	found, err := CreditsOf(ctx, m, owed(w))
	if err != nil {
		t.Fatal(err)
	}
	if cc := model.CompareCredits(owed(w), found); cc.Matched != (model.Tally{Count: 3, Cents: 600}) || cc.Diffs.Count() != 0 {
		t.Fatalf("credits: %+v", cc)
	}
	// A claim whose amount changed no longer matches its credit.
	exec("UPDATE "+claimTable+" SET amount = amount + 1 WHERE packet_id = ? AND seq = 1", string(ref.ID))
	t.Cleanup(func() {
		m.db.Exec("UPDATE "+claimTable+" SET amount = amount - 1 WHERE packet_id = ? AND seq = 1", string(ref.ID))
	})
	w, _ = ReconWindow(ctx, m, db, shards, days, from, to, 100)
	if cc := model.CompareCredits(owed(w), found); !slices.Equal(cc.Diffs[model.DiffCreditMismatch], []string{credits[0].ClaimID}) || cc.Matched.Count != 2 {
		t.Fatalf("changed claim: %+v", cc)
	}
	// Outside the window nothing is read.
	if w, err = ReconWindow(ctx, m, db, shards, days, to, base.Add(10*time.Millisecond).UnixMilli(), 100); err != nil || len(w.Claims) != 0 {
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
	found, err := CreditsOf(ctx, m, asked)
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
