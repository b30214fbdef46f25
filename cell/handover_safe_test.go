package cell_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// handOverPair starts two cells on the test's own databases, a owning
// 0-499 and b 500-999, with their admin ports and a copy kept for an hour
// after a release (nothing is dropped), and a map setter.
func handOverPair(t *testing.T, name string) (a, b *testCell, setMap func(extra ...sharding.Cell)) {
	t.Helper()
	privateDatabases(t)
	peers := &staticPeers{}
	tune := func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken, cfg.MoveGrace = freeAddr(t), adminToken, time.Hour
	}
	a = startCell(t, name+"-a", "0-499", 1, peers, tune)
	b = startCell(t, name+"-b", "500-999", 2, peers, tune)
	setMap = func(extra ...sharding.Cell) {
		sa, sb := movesState(t, a), movesState(t, b)
		ra, _ := sharding.ParseRanges(sa.Shards)
		rb, _ := sharding.ParseRanges(sb.Shards)
		// NewMap reports shards two cells claim (the point of these tests),
		// and builds the map all the same: the higher version wins.
		m, _ := sharding.NewMap(append([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: ra, Version: sa.Version},
			{Name: b.name, Addr: b.addr, Shards: rb, Version: sb.Version}}, extra...))
		peers.m.Store(m)
	}
	for _, c := range []*testCell{a, b} {
		waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	}
	setMap()
	return a, b, setMap
}

// TestHandOverAdoptEmpty: the adoption of a database whose copy on the new
// owner is not the one the mover verified (here: the new owner holds none of
// its rows) is refused, and the new owner never serves it; the old owner,
// thawed as the mover then does, serves it with its rows, and the other
// cell answers WRONG_CELL for it.
func TestHandOverAdoptEmpty(t *testing.T) {
	a, b, _ := handOverPair(t, "hae")
	pre := testenv.Prefix()
	act := actIn(t, pre+"-hae", a.cfg.Shards)
	db := sharding.ShardOfAct(act).DB()
	a.deposit(t, act, 5_000)
	verified := copyDigest(t, a, db) // what the mover verified: the source's copy
	if empty := copyDigest(t, b, db); empty == verified {
		t.Fatalf("cell-b's copy of db_%02d already matches cell-a's", db)
	}
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "freeze", DB: db}); st != 200 {
		t.Fatalf("freeze: %d %s", st, code)
	}
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "seal", DB: db, Version: 2}); st != 200 {
		t.Fatalf("seal: %d %s", st, code)
	}
	if st, code, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: db, Version: 2, Digest: verified}); st != 400 || code != "INVALID_ARGUMENT" {
		t.Fatalf("adoption of a copy without the rows: %d %s, want 400 INVALID_ARGUMENT", st, code)
	}
	if st := movesState(t, b); containsDB(st.DBs, db) || st.Version != 1 {
		t.Fatalf("cell-b after the refused adoption: %+v; want db_%02d not held, version 1", st, db)
	}
	if s, code := call(t, "GET", b.url+"/v1/accounts/"+act, nil, nil); s != 421 || code != "WRONG_CELL" {
		t.Fatalf("cell-b on the account: %d %s, want 421 WRONG_CELL", s, code)
	}
	// The mover finds the database not adopted and thaws the source.
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "thaw", DB: db}); st != 200 {
		t.Fatalf("thaw: %d %s", st, code)
	}
	if got := a.balance(t, act); got != 5_000 {
		t.Fatalf("cell-a serves the account with %d, want 5000", got)
	}
	if sa := movesState(t, a); !containsDB(sa.DBs, db) || len(sa.Frozen) != 0 {
		t.Fatalf("cell-a after the thaw: %+v", sa)
	}
}

// TestHandOverAdoptLate: an adoption that is still saving when the mover
// gives up waiting for its answer is never reported as "not adopted": the
// new owner's GET /admin/moves waits for the step (here the mover's own
// deadline passes first, and it leaves the source frozen and sealed), and
// once the adoption ends it reports the database held. The old owner,
// sealed, then releases it as soon as the map shows the new owner: one cell
// serves the database throughout.
func TestHandOverAdoptLate(t *testing.T) {
	a, b, setMap := handOverPair(t, "hal")
	pre := testenv.Prefix()
	act := actIn(t, pre+"-hal", a.cfg.Shards)
	db := sharding.ShardOfAct(act).DB() // no rows on either side: the copies match
	for _, st := range []api.MoveStep{{Op: "freeze", DB: db, TTLMS: 500}, {Op: "seal", DB: db, Version: 2}} {
		if s, code, _ := moveStep(t, a, st); s != 200 {
			t.Fatalf("%s: %d %s", st.Op, s, code)
		}
	}
	// cell-b's ownership table is held (LOCK TABLES): its adoption stalls in
	// its save. The table is made first, by a freeze and thaw of one of
	// cell-b's own databases; its name has no prefix (the moves' records
	// know none, storage.OpenPrefixed).
	for _, st := range []api.MoveStep{{Op: "freeze", DB: 60}, {Op: "thaw", DB: 60}} {
		if s, code, _ := moveStep(t, b, st); s != 200 {
			t.Fatalf("cell-b %s db_60: %d %s", st.Op, s, code)
		}
	}
	conn, err := b.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "LOCK TABLES redcell_meta.t_ownership WRITE"); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, _ = conn.ExecContext(context.Background(), "UNLOCK TABLES")
			conn.Close()
		}
	}
	t.Cleanup(unlock)

	// The mover's adoption, given up after a second.
	short := &http.Client{Timeout: time.Second}
	post := func(step api.MoveStep) error {
		body, _ := json.Marshal(step)
		req, _ := http.NewRequest("POST", b.adminURL+"/admin/moves", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := short.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := post(api.MoveStep{Op: "adopt", DB: db, Version: 2, Digest: copyDigest(t, b, db)}); err == nil {
		t.Fatal("the stalled adoption answered within a second")
	}
	// What the mover asks next, with its own deadline: never "not held"
	// while the adoption is under way.
	req, _ := http.NewRequest("GET", b.adminURL+"/admin/moves", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req); err == nil {
		var st api.MovesState
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if resp.StatusCode == 200 && !containsDB(st.DBs, db) {
			t.Fatalf("GET /admin/moves during the adoption answered db_%02d not held: %+v", db, st)
		}
	}
	// The save goes through: cell-b holds it, under version 2; cell-a,
	// sealed, is still frozen.
	unlock()
	if sa := movesState(t, a); !containsDB(sa.Frozen, db) {
		t.Fatalf("cell-a is no longer frozen: %+v", sa)
	}
	waitFor(t, 20*time.Second, func() bool { st := movesState(t, b); return containsDB(st.DBs, db) && st.Version == 2 }, "the late adoption done")
	setMap()
	waitFor(t, 20*time.Second, func() bool { return !containsDB(movesState(t, a).DBs, db) }, "cell-a releases the database the map gives cell-b")
	if s, code := call(t, "GET", a.url+"/v1/accounts/"+act, nil, nil); s != 421 || code != "WRONG_CELL" {
		t.Fatalf("cell-a on the account after the hand-over: %d %s, want 421 WRONG_CELL", s, code)
	}
	if s, code := call(t, "GET", b.url+"/v1/accounts/"+act, nil, nil); s != 200 {
		t.Fatalf("cell-b on the account after the hand-over: %d %s, want 200", s, code)
	}
}

// TestHandOverStaleConfig: a cell that serves databases the shard map gives
// to other cells under higher versions — as a cell restarted from a config
// file that still names databases it handed over would, its saved ownership
// lost — stops serving all of them within a few passes, in one release
// under the highest of those versions (one by one, its version would rise
// above the next owner's and win that database back), and keeps their
// copies (never dropped: no mover verified them).
func TestHandOverStaleConfig(t *testing.T) {
	a, b, setMap := handOverPair(t, "hsc")
	pre := testenv.Prefix()
	notFirst, _ := sharding.ParseRanges("10-499")
	act := actIn(t, pre+"-hsc", notFirst)
	db := sharding.ShardOfAct(act).DB()
	// db_00, given to a third cell under version 3: the cell meets it first,
	// so released alone its version would rise to 3, above cell-b's 2.
	other := 0
	// cell-b adopts the database under version 2 (its copy as it is: the
	// hand-over's rows are not what this test is about); cell-a, from its
	// stale config, still holds both under version 1.
	if st, code, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: db, Version: 2, Digest: copyDigest(t, b, db)}); st != 200 {
		t.Fatalf("adopt at cell-b: %d %s", st, code)
	}
	if st := movesState(t, a); !containsDB(st.DBs, db) || !containsDB(st.DBs, other) || st.Version != 1 {
		t.Fatalf("cell-a before the map shows the new owners: %+v", st)
	}
	third, _ := sharding.RangesOfDBs([]int{other})
	setMap(sharding.Cell{Name: "hsc-c", Addr: "127.0.0.1:1", Shards: third, Version: 3})
	waitFor(t, 20*time.Second, func() bool {
		st := movesState(t, a)
		return !containsDB(st.DBs, db) && !containsDB(st.DBs, other)
	}, "cell-a stops serving both databases the map gives to others")
	st := movesState(t, a)
	if st.Version != 3 || len(st.Frozen) != 0 {
		t.Fatalf("cell-a after it yielded: %+v; want version 3, nothing frozen", st)
	}
	kept := map[int]bool{}
	for _, mo := range st.MovedOut {
		kept[mo.DB] = true
	}
	if !kept[db] || !kept[other] {
		t.Fatalf("cell-a's copies after it yielded: %+v; want both kept", st.MovedOut)
	}
	if s, code := call(t, "GET", a.url+"/v1/accounts/"+act, nil, nil); s != 421 || code != "WRONG_CELL" {
		t.Fatalf("cell-a on the account: %d %s, want 421 WRONG_CELL", s, code)
	}
	if s, code := call(t, "GET", b.url+"/v1/accounts/"+act, nil, nil); s != 200 {
		t.Fatalf("cell-b on the account: %d %s, want 200", s, code)
	}
}
