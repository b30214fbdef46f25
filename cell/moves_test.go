package cell_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/sharding"
	"redcell/storage"
)

// actInDB finds an act_id whose shard is in database db.
func actInDB(prefix string, db int) string {
	for i := 0; ; i++ {
		a := fmt.Sprintf("%s-%d", prefix, i)
		if sharding.ShardOfAct(a).DB() == db {
			return a
		}
	}
}

// copyDigest is the digest of c's copy of database db (storage.Digest.Sum),
// as its adoption checks it.
func copyDigest(t *testing.T, c *testCell, db int) string {
	t.Helper()
	d, err := storage.DBDigestIn(t.Context(), c.db, db, c.ns)
	if err != nil {
		t.Fatal(err)
	}
	return d.Sum()
}

func moveStep(t *testing.T, c *testCell, step api.MoveStep) (int, string, api.MoveAnswer) {
	t.Helper()
	var ans api.MoveAnswer
	st, code := callAdmin(t, c, "POST", "/admin/moves", step, &ans)
	return st, code, ans
}

func movesState(t *testing.T, c *testCell) api.MovesState {
	t.Helper()
	return adminAnswer[api.MovesState](t, c, "GET", "/admin/moves")
}

// TestMoveSteps runs a cell's side of database moves through its admin port
// against its real database: a frozen database answers MOVING while the
// others serve; a thaw serves it again; a release needs the freeze, a higher
// version and the verified digest, hands the shards over (WRONG_CELL), saves
// the new ranges, and keeps a copy that changed since the hand-over (the
// drop of an unchanged one runs in the growing drills, on their own
// servers); an adoption serves new shards; a freeze nobody ends thaws by
// itself, or releases the database when the map gives it to another cell
// under a higher version.
func TestMoveSteps(t *testing.T) {
	peers := &staticPeers{}
	tune := func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken, cfg.MoveGrace = freeAddr(t), adminToken, time.Second
	}
	a := startCell(t, "mv-a", "0-499", 1, peers, tune)
	b := startCell(t, "mv-b", "500-999", 2, peers, tune)
	setMap := func(extra ...sharding.Cell) {
		ra, _ := sharding.ParseRanges(movesState(t, a).Shards)
		rb, _ := sharding.ParseRanges(movesState(t, b).Shards)
		cells := append([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: ra, Version: movesState(t, a).Version},
			{Name: b.name, Addr: b.addr, Shards: rb, Version: movesState(t, b).Version}}, extra...)
		m, _ := sharding.NewMap(cells)
		peers.m.Store(m)
	}
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(a.adminURL + "/metrics"); return err == nil }, "admin port up")
	setMap()
	act3, act4 := actInDB("mv", 3), actInDB("mv", 4)
	a.deposit(t, act3, 10_000)
	a.deposit(t, act4, 10_000)
	packet := a.send(t, act3, 1_000, 10, "mv-send-1")

	// Freeze db_03: its shards answer MOVING, db_04's serve.
	st, code, ans := moveStep(t, a, api.MoveStep{Op: "freeze", DB: 3})
	if st != 200 || ans.Shards != "0-499" || ans.Version != 1 {
		t.Fatalf("freeze: %d %s %+v", st, code, ans)
	}
	if s, code := call(t, "GET", a.url+"/v1/accounts/"+act3, nil, nil); s != 503 || code != "MOVING" {
		t.Fatalf("account of a frozen database: %d %s, want 503 MOVING", s, code)
	}
	if s, code := call(t, "POST", a.url+"/v1/packets/"+packet+"/open", api.ActRequest{ActID: act4}, nil); s != 503 || code != "MOVING" {
		t.Fatalf("open of a packet of a frozen database: %d %s, want 503 MOVING", s, code)
	}
	if s, code := call(t, "GET", a.url+"/v1/accounts/"+act4, nil, nil); s != 200 {
		t.Fatalf("account of db_04 while db_03 is frozen: %d %s", s, code)
	}
	if fr := movesState(t, a).Frozen; len(fr) != 1 || fr[0] != 3 {
		t.Fatalf("frozen %v, want [3]", fr)
	}
	// Thaw: served again, and the packet opens.
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "thaw", DB: 3}); st != 200 {
		t.Fatalf("thaw: %d %s", st, code)
	}
	if s, code := call(t, "POST", a.url+"/v1/packets/"+packet+"/open", api.ActRequest{ActID: act4}, nil); s != 200 {
		t.Fatalf("open after the thaw: %d %s", s, code)
	}

	// A release needs the freeze, a version above the cell's, and a digest.
	if st, _, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: 3, Version: 2, Digest: "x"}); st != 400 {
		t.Fatalf("release without a freeze: %d, want 400", st)
	}
	moveStep(t, a, api.MoveStep{Op: "freeze", DB: 3})
	if st, _, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: 3, Version: 1, Digest: strings.Repeat("a", 64)}); st != 400 {
		t.Fatalf("release at the cell's own version: %d, want 400", st)
	}
	if st, _, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: 3, Version: 2, Digest: "x"}); st != 400 {
		t.Fatalf("release with a malformed digest: %d, want 400", st)
	}
	// The digest the mover verified. The copy it names is never dropped here:
	// the test database is shared with other tests, whose rows in db_03 a
	// drop would take (the growing drills drop copies on servers of their
	// own); so the releases below name digests their copies do not match,
	// and the copies are kept and counted as changed.
	d, err := storage.DBDigest(t.Context(), a.db, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d.Sum() == (storage.Digest{}).Sum() {
		t.Fatal("db_03's digest is empty: the test wrote nothing there")
	}
	st, code, ans = moveStep(t, a, api.MoveStep{Op: "release", DB: 3, Version: 2, Digest: otherDigest(d.Sum())})
	if st != 200 || ans.Shards != "0-29,40-499" || ans.Version != 2 {
		t.Fatalf("release: %d %s %+v", st, code, ans)
	}
	if s, code := call(t, "GET", a.url+"/v1/accounts/"+act3, nil, nil); s != 421 || code != "WRONG_CELL" {
		t.Fatalf("account of a released database: %d %s, want 421 WRONG_CELL", s, code)
	}
	var saved string
	if err := a.db.QueryRow("SELECT ranges FROM redcell_meta.t_ownership WHERE cell = 'mv-a'").Scan(&saved); err != nil || saved != "0-29,40-499" {
		t.Fatalf("saved ownership %q %v", saved, err)
	}
	moveStep(t, a, api.MoveStep{Op: "freeze", DB: 4})
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: 4, Version: 3, Digest: otherDigest(d.Sum())}); st != 200 {
		t.Fatalf("release db_04: %d %s", st, code)
	}
	if mo := movesState(t, a).MovedOut; len(mo) != 2 || mo[0].DB != 3 || mo[0].DropAtMS-mo[0].ReleasedMS != 1000 {
		t.Fatalf("moved out %+v, want db_03 and db_04, dropped 1 s after their release", mo)
	}
	// After move_grace (1 s) each copy is compared with its digest: both
	// differ, so both are kept, logged and counted, and nothing is dropped.
	waitFor(t, 10*time.Second, func() bool { return metric(t, a, "redcell_cell_move_copy_changed_total") == 2 }, "both changed copies counted")
	var n int
	if err := a.db.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name IN ('db_03', 'db_04')").Scan(&n); err != nil || n != 2 {
		t.Fatalf("copies that differ from their digest were dropped: %d left, %v", n, err)
	}
	if mo := movesState(t, a).MovedOut; len(mo) != 2 || metric(t, a, "redcell_cell_move_copies_dropped_total") != 0 {
		t.Fatalf("moved out %+v, dropped %v; want both kept", mo, metric(t, a, "redcell_cell_move_copies_dropped_total"))
	}

	// An adoption needs the digest the mover verified, and mv-b's copy must
	// match it: one that does not (an empty copy, a stale one) is refused and
	// not served.
	bBefore := movesState(t, b)
	if st, _, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: 3, Version: 3}); st != 400 {
		t.Fatalf("adopt without a digest: %d, want 400", st)
	}
	bd := copyDigest(t, b, 3)
	if st, code, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: 3, Version: 3, Digest: otherDigest(bd)}); st != 400 || code != "INVALID_ARGUMENT" {
		t.Fatalf("adopt of a copy that is not the one verified: %d %s, want 400 INVALID_ARGUMENT", st, code)
	}
	if st := movesState(t, b); containsDB(st.DBs, 3) || st.Version != bBefore.Version || st.Shards != bBefore.Shards {
		t.Fatalf("a refused adoption changed mv-b: %+v, before %+v", st, bBefore)
	}
	// Adopt db_03 on mv-b: it serves it, under version 3.
	if st, code, ans := moveStep(t, b, api.MoveStep{Op: "adopt", DB: 3, Version: 3, Digest: bd}); st != 200 || ans.Shards != "30-39,500-999" {
		t.Fatalf("adopt: %d %s %+v", st, code, ans)
	}
	if s, code := call(t, "GET", b.url+"/v1/accounts/"+act3, nil, nil); s != 200 && code != "NOT_FOUND" {
		t.Fatalf("account on the adopter: %d %s", s, code)
	}
	if st, _, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: 3, Version: 4, Digest: bd}); st != 400 {
		t.Fatalf("adopting a database owned already: %d, want 400", st)
	}
	setMap()

	// The freezes' own ends run on a cell of their own with a long
	// move_grace: the releases below record the copies' true digests, and a
	// drop of db_06 or db_07 would take other tests' rows from the shared
	// test database.
	peersE := &staticPeers{}
	e := startCell(t, "mv-e", "50-79", 2, peersE, func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken, cfg.MoveGrace = freeAddr(t), adminToken, time.Hour
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(e.adminURL + "/metrics"); return err == nil }, "admin port up")
	setMapE := func(extra ...sharding.Cell) {
		st := movesState(t, e)
		re, _ := sharding.ParseRanges(st.Shards)
		m, _ := sharding.NewMap(append([]sharding.Cell{{Name: e.name, Addr: e.addr, Shards: re, Version: st.Version}}, extra...))
		peersE.m.Store(m)
	}
	setMapE()
	// A freeze nobody ends thaws after its ttl.
	moveStep(t, e, api.MoveStep{Op: "freeze", DB: 5, TTLMS: 500})
	waitFor(t, 10*time.Second, func() bool { return len(movesState(t, e).Frozen) == 0 }, "db_05's freeze ended")
	if st := movesState(t, e); !containsDB(st.DBs, 5) {
		t.Fatalf("db_05 released by a lone freeze: %+v", st)
	}
	// One the map gives to another cell under a higher version is released.
	r6, _ := sharding.ParseRanges("60-69")
	setMapE(sharding.Cell{Name: "mv-c", Addr: "127.0.0.1:1", Shards: r6, Version: 10})
	moveStep(t, e, api.MoveStep{Op: "freeze", DB: 6, TTLMS: 500})
	waitFor(t, 10*time.Second, func() bool { return !containsDB(movesState(t, e).DBs, 6) }, "db_06 released to the map's higher version")
	if st := movesState(t, e); st.Version != 10 || len(st.Frozen) != 0 || len(st.MovedOut) != 1 {
		t.Fatalf("after the release to mv-c: %+v", st)
	}
	// A sealed freeze (a hand-over began) never thaws by itself: it waits
	// for the map to show the new owner under the sealed version.
	moveStep(t, e, api.MoveStep{Op: "freeze", DB: 7, TTLMS: 300})
	if st, _, _ := moveStep(t, e, api.MoveStep{Op: "freeze", DB: 7}); st != 400 {
		t.Fatalf("a second freeze of a frozen database: %d, want 400", st)
	}
	if st, code, _ := moveStep(t, e, api.MoveStep{Op: "seal", DB: 7, Version: 20}); st != 200 {
		t.Fatalf("seal: %d %s", st, code)
	}
	// Three passes of the moves loop (a second apart): the 300 ms ttl ends
	// before the second.
	passes := metric(t, e, "redcell_cell_move_passes_total")
	waitFor(t, 15*time.Second, func() bool { return metric(t, e, "redcell_cell_move_passes_total") >= passes+3 }, "three passes of the moves loop")
	if st := movesState(t, e); !containsDB(st.Frozen, 7) {
		t.Fatalf("a sealed freeze thawed by itself: %+v", st)
	}
	r7, _ := sharding.ParseRanges("70-79")
	setMapE(sharding.Cell{Name: "mv-c", Addr: "127.0.0.1:1", Shards: r6, Version: 10}, sharding.Cell{Name: "mv-d", Addr: "127.0.0.1:1", Shards: r7, Version: 20})
	waitFor(t, 10*time.Second, func() bool { return !containsDB(movesState(t, e).DBs, 7) }, "db_07 released once the map shows its new owner")
	if st := movesState(t, e); st.Shards != "50-59" || st.Version != 20 {
		t.Fatalf("mv-e owns %s (v%d) at the end, want 50-59 (v20)", st.Shards, st.Version)
	}
	if st := movesState(t, a); st.Shards != "0-29,50-499" || st.Version != 3 {
		t.Fatalf("mv-a owns %s (v%d) at the end, want 0-29,50-499 (v3)", st.Shards, st.Version)
	}
}

func containsDB(dbs []int, db int) bool {
	for _, d := range dbs {
		if d == db {
			return true
		}
	}
	return false
}

// otherDigest is a well-formed digest that is not sum.
func otherDigest(sum string) string {
	if sum[0] == '0' {
		return "1" + sum[1:]
	}
	return "0" + sum[1:]
}
