package storagetest

import (
	"maps"
	"slices"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
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
		pos, err := storage.ReconPositions(f.ctx, f.s)
		if err != nil {
			t.Fatalf("recon positions: %v", err)
		}
		return pos
	}
	save := func(pos map[int]int64) {
		t.Helper()
		if err := storage.SaveReconPositions(f.ctx, f.s, pos); err != nil {
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
		if err := storage.SaveReconPositions(f.ctx, f.s, map[int]int64{bad: 1, 4: 1}); err == nil {
			t.Fatalf("save of database %d: no error", bad)
		}
	}
	if pos := read(); !maps.Equal(pos, map[int]int64{0: 5, 3: 1000, 99: 2500}) {
		t.Fatalf("positions after refused saves %v", pos)
	}
}

// ReconWindow reads, of one database, the claims created in [from, to) in
// the claim tables of the shards and days asked, each with its claimant's
// shard (ActShard) and Dest, credited or not. A window of more than limit
// claims is cut at the creation time of the claim past limit (never below
// from+1: one millisecond's claims are read whole) and ToMS says so.
// Shards of another database are an error; a database never used reads
// empty.
func contractReconWindow(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	_, ref := f.send(sA, sendReq("ann", "s1", 600, 5), time.Hour)
	var claims []model.Claim // bob and eve in the first millisecond, then cy, then dee
	acts := []model.ShardID{sC, sB, sA, sC}
	for i, reqs := range [][]model.OpenRequest{{opener("bob", sC), opener("eve", sB)}, {opener("cy", sA)}, {opener("dee", sC)}} {
		f.h.Clock.Advance(time.Millisecond)
		res, _ := f.open(ref, uint64(i), reqs...)
		for _, r := range res {
			claims = append(claims, r.Claim)
		}
	}
	// As the window reads them: with the claimant's shard.
	full := make([]model.Claim, len(claims))
	for i, c := range claims {
		full[i] = c
		full[i].ActShard = acts[i]
	}
	db := sA.DB()
	var shards []model.ShardID
	for s := db * 10; s < db*10+10; s++ {
		shards = append(shards, model.ShardID(s))
	}
	from, to := claims[0].CreatedMS, claims[3].CreatedMS+1
	if claims[1].CreatedMS != from || claims[2].CreatedMS != from+1 || claims[3].CreatedMS != from+2 {
		t.Fatalf("claims created at %d, %d, %d, %d", claims[0].CreatedMS, claims[1].CreatedMS, claims[2].CreatedMS, claims[3].CreatedMS)
	}
	read := func(shards []model.ShardID, days []int, from, to int64, limit int) model.ReconWindow {
		t.Helper()
		w, err := storage.ReconWindow(f.ctx, f.s, db, shards, days, from, to, limit)
		if err != nil {
			t.Fatalf("recon window [%d, %d) limit %d: %v", from, to, limit, err)
		}
		return w
	}
	expect := func(what string, w model.ReconWindow, fromMS, toMS int64, claimsIn []model.Claim) {
		t.Helper()
		if w.FromMS != fromMS || w.ToMS != toMS {
			t.Fatalf("%s: window [%d, %d), want [%d, %d)", what, w.FromMS, w.ToMS, fromMS, toMS)
		}
		if got, want := claimIDs(w.Claims), idsOf(claimsIn); !slices.Equal(got, want) {
			t.Fatalf("%s: window claims %v, want %v", what, got, want)
		}
		for _, c := range claimsIn {
			if w.Claims[c.ID] != c {
				t.Fatalf("%s: window claim %+v, want %+v", what, w.Claims[c.ID], c)
			}
		}
	}
	expect("all", read(shards, []int{14}, from, to, 100), from, to, full)
	expect("limit 4", read(shards, []int{14}, from, to, 4), from, to, full)
	expect("middle millisecond", read(shards, []int{14}, from+1, to-1, 100), from+1, to-1, full[2:3])
	// Cut at the creation time of the claim past limit.
	expect("limit 3", read(shards, []int{14}, from, to, 3), from, from+2, full[:3])
	expect("limit 2", read(shards, []int{14}, from, to, 2), from, from+1, full[:2])
	// The claim past limit was made at from: cut at from+1, its millisecond read whole.
	expect("limit 1", read(shards, []int{14}, from, to, 1), from, from+1, full[:2])
	// Claims of shards or days not asked are left out.
	expect("another shard", read([]model.ShardID{sB}, []int{14}, from, to, 100), from, to, nil)
	expect("another day", read(shards, []int{15}, from, to, 100), from, to, nil)

	credits := make([]model.Credit, len(claims))
	for i, c := range claims {
		credits[i] = creditOf(c, acts[i])
	}
	f.applyCredits(credits)
	expect("all, credited", read(shards, []int{14}, from, to, 100), from, to, full)

	if _, err := storage.ReconWindow(f.ctx, f.s, db, []model.ShardID{sC}, []int{14}, from, to, 100); err == nil {
		t.Fatal("recon window of db 12 with a shard of db 56: no error")
	}
	empty, err := storage.ReconWindow(f.ctx, f.s, 77, []model.ShardID{770, 771}, []int{14}, from, to, 100)
	if err != nil || empty.FromMS != from || empty.ToMS != to || len(empty.Claims) != 0 {
		t.Fatalf("recon window of a database never used: %+v, %v", empty, err)
	}
	f.check(books{deposits: 1000, balances: 400 + sum(credits[0].Amount, credits[1].Amount, credits[2].Amount, credits[3].Amount),
		open: 600 - sum(credits[0].Amount, credits[1].Amount, credits[2].Amount, credits[3].Amount), sends: 600, packets: 1, claims: 4, credits: 4})
}

func idsOf(cs []model.Claim) []string {
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}
