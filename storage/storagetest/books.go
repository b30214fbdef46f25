package storagetest

import (
	"maps"
	"slices"
	"testing"
	"time"

	"redcell/model"
)

func init() {
	register("ContractReconWindow", contractReconWindow)
	register("ContractReconPositions", contractReconPositions)
}

// Reconciliation's positions read back as saved, per database; a save below
// the stored position keeps the stored one (a repeated or late save changes
// nothing); a database out of range is an error and saves nothing.
func contractReconPositions(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	read := func() map[int]int64 {
		t.Helper()
		pos, err := f.s.ReconPositions(f.ctx)
		if err != nil {
			t.Fatalf("recon positions: %v", err)
		}
		return pos
	}
	save := func(pos map[int]int64) {
		t.Helper()
		if err := f.s.SaveReconPositions(f.ctx, pos); err != nil {
			t.Fatalf("save recon positions %v: %v", pos, err)
		}
	}
	if pos := read(); len(pos) != 0 {
		t.Fatalf("a new store's positions: %v", pos)
	}
	save(map[int]int64{})
	save(map[int]int64{3: 1000, 99: 2000})
	save(map[int]int64{3: 1000, 99: 2000}) // again
	if pos := read(); !maps.Equal(pos, map[int]int64{3: 1000, 99: 2000}) {
		t.Fatalf("positions %v", pos)
	}
	save(map[int]int64{3: 900, 0: 5, 99: 2500}) // 3 moves back: kept
	if pos := read(); !maps.Equal(pos, map[int]int64{0: 5, 3: 1000, 99: 2500}) {
		t.Fatalf("positions after a late save %v", pos)
	}
	for _, bad := range []int{-1, 100} {
		if err := f.s.SaveReconPositions(f.ctx, map[int]int64{bad: 1, 4: 1}); err == nil {
			t.Fatalf("save of database %d: no error", bad)
		}
	}
	if pos := read(); !maps.Equal(pos, map[int]int64{0: 5, 3: 1000, 99: 2500}) {
		t.Fatalf("positions after refused saves %v", pos)
	}
}

// ReconWindow reads, of one database, the claims created in [from, to) in
// the claim tables of the shards and days asked, and the database's outbox
// rows created in the window (all of them: the outbox is per database),
// delivered or not. A window of more than 2×limit rows is cut at the creation
// time of the outbox row past limit (never below from+1) and ToMS says so.
// Shards of another database are an error; a database never used reads empty.
func contractReconWindow(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	_, ref := f.send(sA, sendReq("ann", "s1", 600, 3), time.Hour)
	var claims []model.Claim
	for i, act := range []string{"bob", "cy", "dee"} { // one open per millisecond
		f.h.Clock.Advance(time.Millisecond)
		res, _ := f.open(ref, uint64(i), opener(act, sC))
		claims = append(claims, res[0].Claim)
	}
	db := sA.DB()
	var shards []model.ShardID
	for s := db * 10; s < db*10+10; s++ {
		shards = append(shards, model.ShardID(s))
	}
	from, to := claims[0].CreatedMS, claims[2].CreatedMS+1
	read := func(shards []model.ShardID, days []int, from, to int64, limit int) model.ReconWindow {
		t.Helper()
		w, err := f.s.ReconWindow(f.ctx, db, shards, days, from, to, limit)
		if err != nil {
			t.Fatalf("recon window [%d, %d) limit %d: %v", from, to, limit, err)
		}
		return w
	}
	expect := func(w model.ReconWindow, toMS int64, claimsIn []model.Claim, outboxOf []model.Claim, delivered bool) {
		t.Helper()
		if w.FromMS != from || w.ToMS != toMS {
			t.Fatalf("window [%d, %d), want [%d, %d)", w.FromMS, w.ToMS, from, toMS)
		}
		if got, want := claimIDs(w.Claims), idsOf(claimsIn); !slices.Equal(got, want) {
			t.Fatalf("window claims %v, want %v", got, want)
		}
		for _, c := range claimsIn {
			if w.Claims[c.ID] != c {
				t.Fatalf("window claim %+v, want %+v", w.Claims[c.ID], c)
			}
		}
		if len(w.Outbox) != len(outboxOf) {
			t.Fatalf("window outbox %+v, want rows of %v", w.Outbox, idsOf(outboxOf))
		}
		for _, c := range outboxOf {
			want := model.OutboxRow{ClaimID: c.ID, ActID: c.ActID, Shard: sC, Amount: c.Amount, Delivered: delivered, CreatedMS: c.CreatedMS}
			if w.Outbox[c.ID] != want {
				t.Fatalf("window outbox row %+v, want %+v", w.Outbox[c.ID], want)
			}
		}
	}
	expect(read(shards, []int{14}, from, to, 100), to, claims, claims, false)
	if w := read(shards, []int{14}, from+1, to-1, 100); len(w.Claims) != 1 || w.Claims[claims[1].ID] != claims[1] || len(w.Outbox) != 1 {
		t.Fatalf("middle millisecond: %+v", w)
	}
	// Six rows with a limit of 1: cut at the second outbox row's millisecond.
	expect(read(shards, []int{14}, from, to, 1), from+1, claims[:1], claims[:1], false)
	// Claims of shards or days not asked are left out; the outbox rows are not.
	expect(read([]model.ShardID{sB}, []int{14}, from, to, 100), to, nil, claims, false)
	expect(read(shards, []int{15}, from, to, 100), to, nil, claims, false)

	credits := []model.Credit{creditOf(claims[0], sC), creditOf(claims[1], sC), creditOf(claims[2], sC)}
	f.applyCredits(credits)
	f.markDelivered(credits)
	expect(read(shards, []int{14}, from, to, 100), to, claims, claims, true)

	if _, err := f.s.ReconWindow(f.ctx, db, []model.ShardID{sC}, []int{14}, from, to, 100); err == nil {
		t.Fatal("recon window of db 12 with a shard of db 56: no error")
	}
	empty, err := f.s.ReconWindow(f.ctx, 77, []model.ShardID{770, 771}, []int{14}, from, to, 100)
	if err != nil || empty.FromMS != from || empty.ToMS != to || len(empty.Claims) != 0 || len(empty.Outbox) != 0 {
		t.Fatalf("recon window of a database never used: %+v, %v", empty, err)
	}
	f.check(books{deposits: 1000, balances: 1000, sends: 600, packets: 1, claims: 3, credits: 3})
}

func idsOf(cs []model.Claim) []string {
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}
