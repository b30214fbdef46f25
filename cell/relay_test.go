package cell_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/cell"
	"redcell/cell/api"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// The relay tests below measure, per credit, the time from the open's answer
// to the moment the claimant's balance, read straight from its cell's rows,
// shows the claim. One slow destination must not delay the others: each
// credit to a healthy wallet is applied within creditDelayMax.
const creditDelayMax = time.Second

// probeClaim is one claim the relay tests follow until it is credited.
type probeClaim struct {
	act      string
	kind     string  // which group of claimants it belongs to, for the report
	db       *sql.DB // the database of the cell that holds the claimant's wallet
	claim    api.OpenResponse
	answered time.Time // when the open answered
	credited time.Time // when the balance first showed the claim (zero: not yet)
	marked   time.Time // when the sender's outbox first showed it delivered (zero: not yet)
}

// actsInShard returns n act_ids (prefix-0, prefix-1, ...) whose shard is sh.
func actsInShard(t *testing.T, prefix string, sh model.ShardID, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n && i < 10_000_000; i++ {
		if a := fmt.Sprintf("%s-%d", prefix, i); sharding.ShardOfAct(a) == sh {
			out = append(out, a)
		}
	}
	if len(out) < n {
		t.Fatalf("found %d act_ids in shard %d, want %d", len(out), sh, n)
	}
	return out
}

// openEach opens packet id at cell c for each claimant in turn, as the groups
// say (claimant -> kind, database holding its wallet).
func openEach(t *testing.T, c *testCell, id string, order []string, kind map[string]string, db map[string]*sql.DB) []*probeClaim {
	t.Helper()
	var out []*probeClaim
	for _, act := range order {
		claim := openOne(t, c, nil, id, act)
		out = append(out, &probeClaim{act: act, kind: kind[act], db: db[act], claim: claim, answered: time.Now()})
	}
	return out
}

// interleave takes one from each group in turn until all are used.
func interleave(groups ...[]string) []string {
	var out []string
	for i := 0; ; i++ {
		added := false
		for _, g := range groups {
			if i < len(g) {
				out = append(out, g[i])
				added = true
			}
		}
		if !added {
			return out
		}
	}
}

// walletBalance reads act's balance from its account row (0 without one, or
// before its table exists), without locking: a row another transaction holds
// is read as last committed.
func walletBalance(t *testing.T, db *sql.DB, act string) int64 {
	t.Helper()
	sh := sharding.ShardOfAct(act)
	var b int64
	err := db.QueryRow(fmt.Sprintf("SELECT balance FROM db_%02d.t_account_%d WHERE act_id = ?", sh.DB(), sh.Table()), act).Scan(&b)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // no such table yet
		return 0
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("read balance of %s: %v", act, err)
	}
	return b
}

// probe polls, every 10 ms for up to limit, the balances of the claims not yet
// credited (and, with outbox set, the sender's outbox state of the claims not
// yet marked), noting when each first shows; it returns when done reports true
// or the time is up, and says which.
func probe(t *testing.T, claims []*probeClaim, outbox *sql.DB, limit time.Duration, done func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		for _, c := range claims {
			if c.credited.IsZero() && walletBalance(t, c.db, c.act) == c.claim.Amount {
				c.credited = time.Now()
			}
			if outbox != nil && c.marked.IsZero() && outboxState(t, outbox, "", c.claim.ClaimID) == 1 {
				c.marked = time.Now()
			}
		}
		if done() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allCredited(cs []*probeClaim) func() bool {
	return func() bool {
		return !slices.ContainsFunc(cs, func(c *probeClaim) bool { return c.credited.IsZero() })
	}
}

func allMarked(cs []*probeClaim) func() bool {
	return func() bool {
		return !slices.ContainsFunc(cs, func(c *probeClaim) bool { return c.marked.IsZero() })
	}
}

// only returns the claims of the given kinds.
func only(cs []*probeClaim, kinds ...string) []*probeClaim {
	var out []*probeClaim
	for _, c := range cs {
		if slices.Contains(kinds, c.kind) {
			out = append(out, c)
		}
	}
	return out
}

// delays returns, for each claim, the time from its open's answer to what at
// reads (its credit or its mark); a claim not seen counts as missing.
func delays(cs []*probeClaim, at func(*probeClaim) time.Time) (ds []time.Duration, missing int) {
	for _, c := range cs {
		if at(c).IsZero() {
			missing++
			continue
		}
		ds = append(ds, at(c).Sub(c.answered))
	}
	slices.Sort(ds)
	return ds, missing
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted ds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	return ds[max(i, 1)-1]
}

// report logs the delays of cs (p50, p99, max) and fails the test for each one
// above creditDelayMax or never seen.
func report(t *testing.T, what string, cs []*probeClaim, at func(*probeClaim) time.Time) {
	t.Helper()
	ds, missing := delays(cs, at)
	var top time.Duration
	if len(ds) > 0 {
		top = ds[len(ds)-1]
	}
	t.Logf("%s: n=%d p50=%s p99=%s max=%s not seen=%d", what, len(cs), percentile(ds, 50).Round(time.Millisecond),
		percentile(ds, 99).Round(time.Millisecond), top.Round(time.Millisecond), missing)
	if missing > 0 || top > creditDelayMax {
		t.Errorf("%s: %d not seen, slowest %s; want every one within %s", what, missing, top.Round(time.Millisecond), creditDelayMax)
	}
}

func creditedAt(c *probeClaim) time.Time { return c.credited }
func markedAt(c *probeClaim) time.Time   { return c.marked }

// holdLocked runs q (a locking read) in a transaction of its own on db and
// keeps it open, so the rows it read stay locked, until release is called or
// the test ends. READ COMMITTED: it locks the rows it names, no gaps.
func holdLocked(t *testing.T, db *sql.DB, q string, args ...any) (release func()) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if n == 0 {
		t.Fatalf("%s locked no row", q)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// checkExactlyOnce: each claimant holds exactly its claim, in one credit flow
// keyed by the claim, and the sender's outbox (db sender) marks every claim
// delivered (waiting up to 5 s for the marks). Then, after a few more relay
// scans, nothing has changed.
func checkExactlyOnce(t *testing.T, claims []*probeClaim, sender *testCell) {
	t.Helper()
	check := func() {
		for _, c := range claims {
			sh := sharding.ShardOfAct(c.act)
			var flows, ours int
			var sum int64
			c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(amount), 0), COALESCE(SUM(order_no = ?), 0) FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = 'credit'", sh.DB(), sh.Table()),
				"claim:"+c.claim.ClaimID, c.act).Scan(&flows, &sum, &ours)
			if b := walletBalance(t, c.db, c.act); b != c.claim.Amount || flows != 1 || ours != 1 || sum != c.claim.Amount {
				t.Errorf("%s (%s): balance %d, %d credit flows (%d for its claim) summing to %d; want exactly its claim of %d once",
					c.act, c.kind, b, flows, ours, sum, c.claim.Amount)
			}
		}
	}
	check()
	waitFor(t, 5*time.Second, func() bool {
		return !slices.ContainsFunc(claims, func(c *probeClaim) bool { return outboxState(t, sender.db, "", c.claim.ClaimID) != 1 })
	}, "every outbox row marked delivered")
	time.Sleep(4 * sender.cfg.RelayInterval)
	check()
}

// TestRelayLockedWalletRow: one claimant's wallet row in the other cell is
// held locked by another transaction. The credits of every other claimant, in
// that cell and in the sending cell's own shards, are applied within a second
// of their claims; the locked one waits, and is applied once the lock is
// released, exactly once. Balances, credit flows and outbox rows end exact.
func TestRelayLockedWalletRow(t *testing.T) {
	a, b := twoCells(t, nil)
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	local := actsInShard(t, pre+"-l", 123, 8)
	remote := actsInShard(t, pre+"-r", 678, 8)
	locked := remote[0]
	kind, db := map[string]string{}, map[string]*sql.DB{}
	for _, act := range local {
		kind[act], db[act] = "local", a.db
	}
	for _, act := range remote {
		kind[act], db[act] = "remote", b.db
	}
	kind[locked] = "locked"

	// The locked claimant has a wallet row (balance 0, no flow), and another
	// connection holds it FOR UPDATE in an open transaction.
	b.balance(t, locked) // creates the shard's tables
	sh := sharding.ShardOfAct(locked)
	account := fmt.Sprintf("db_%02d.t_account_%d", sh.DB(), sh.Table())
	exec(t, b.db, "INSERT INTO "+account+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", locked)
	release := holdLocked(t, b.db, "SELECT balance FROM "+account+" WHERE act_id = ? FOR UPDATE", locked)

	n := len(local) + len(remote)
	a.deposit(t, sender, 100_000)
	id := a.send(t, sender, int64(n)*100, int64(n), "snd-1")
	claims := openEach(t, a, id, append([]string{locked}, interleave(local, remote[1:])...), kind, db)
	others := only(claims, "local", "remote")

	probe(t, claims, nil, 12*time.Second, allCredited(others))
	if c := only(claims, "locked")[0]; !c.credited.IsZero() {
		t.Errorf("the locked claimant was credited while its wallet row was locked")
	}
	release()
	if !probe(t, claims, nil, 15*time.Second, allCredited(claims)) {
		t.Errorf("not every claim credited within 15 s of the lock's release")
	}
	report(t, "credit delay, other credits while one wallet row is locked", others, creditedAt)
	report(t, "  of which in the sending cell", only(claims, "local"), creditedAt)
	report(t, "  of which in the locked row's cell", only(claims, "remote"), creditedAt)
	checkExactlyOnce(t, claims, a)
}

// TestRelayLockedOutboxRows: the outbox rows of four claims (two local, two in
// the other cell) are held locked by another transaction while the relay
// takes them up. Fresh claims made meanwhile are credited and marked
// delivered within a second each; the locked rows stay pending while locked
// and are marked once released; nothing is credited twice.
func TestRelayLockedOutboxRows(t *testing.T) {
	a, b := twoCells(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken })
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	local := actsInShard(t, pre+"-l", 123, 6)
	remote := actsInShard(t, pre+"-r", 678, 6)
	kind, db := map[string]string{}, map[string]*sql.DB{}
	for i, act := range local {
		kind[act], db[act] = "fresh", a.db
		kind[remote[i]], db[remote[i]] = "fresh", b.db
		if i < 2 {
			kind[act], kind[remote[i]] = "held", "held"
		}
	}
	n := len(local) + len(remote)
	a.deposit(t, sender, 100_000)
	id := a.send(t, sender, int64(n)*100, int64(n), "snd-1")

	// The held claims are made while the relay is off, and their outbox rows
	// locked before it is back on.
	degrade(t, a, `{"relay":"off"}`)
	held := openEach(t, a, id, interleave(local[:2], remote[:2]), kind, db)
	ref, _ := model.ParsePacketID(id)
	ids := []any{}
	for _, c := range held {
		ids = append(ids, c.claim.ClaimID)
	}
	release := holdLocked(t, a.db, fmt.Sprintf("SELECT state FROM db_%02d.t_outbox WHERE claim_id IN (?%s) FOR UPDATE",
		ref.Shard.DB(), strings.Repeat(", ?", len(ids)-1)), ids...)
	degrade(t, a, `{"relay":"on"}`)
	time.Sleep(4 * a.cfg.RelayInterval) // the outbox scan hands the held rows to the relay

	fresh := openEach(t, a, id, interleave(local[2:], remote[2:]), kind, db)
	probe(t, fresh, a.db, 12*time.Second, func() bool { return allCredited(fresh)() && allMarked(fresh)() })
	for _, c := range held {
		if st := outboxState(t, a.db, "", c.claim.ClaimID); st != 0 {
			t.Errorf("%s: outbox state %d while its row was locked", c.act, st)
		}
	}
	release()
	claims := append(held, fresh...)
	if !probe(t, claims, a.db, 15*time.Second, func() bool { return allCredited(claims)() && allMarked(claims)() }) {
		t.Errorf("not every claim credited and marked within 15 s of the lock's release")
	}
	report(t, "credit delay, fresh credits while outbox rows are locked", fresh, creditedAt)
	report(t, "delivered-mark delay, fresh credits while outbox rows are locked", fresh, markedAt)
	checkExactlyOnce(t, claims, a)
}

// TestCreditsAnswerNamesDeferred: /internal/credits does not wait for a
// wallet row another transaction holds. To a sender that reads the deferred
// list (api.HeaderPartial) it answers 200 with that claim listed and the
// others applied; to one that does not, a retryable 503 OVERLOADED, so such a
// sender marks nothing it cannot be sure of. Once the row is free the relay
// delivers the deferred credit, once.
func TestCreditsAnswerNamesDeferred(t *testing.T) {
	peers := &staticPeers{}
	a := startCell(t, "cell-a", "0-499", 1, peers, nil)
	b := startCell(t, "cell-b", "500-999", 2, peers, nil)
	// cell-a's relay cannot reach cell-b at first: the test posts the credits itself.
	hidden, _ := sharding.NewMap([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: a.cfg.Shards}, {Name: b.name, Addr: "127.0.0.1:1", Shards: b.cfg.Shards}})
	peers.m.Store(hidden)
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	acts := actsInShard(t, pre+"-c", 678, 2)
	free, locked := acts[0], acts[1]
	b.balance(t, locked)
	sh := sharding.ShardOfAct(locked)
	account := fmt.Sprintf("db_%02d.t_account_%d", sh.DB(), sh.Table())
	exec(t, b.db, "INSERT INTO "+account+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", locked)
	release := holdLocked(t, b.db, "SELECT balance FROM "+account+" WHERE act_id = ? FOR UPDATE", locked)
	a.deposit(t, sender, 200)
	id := a.send(t, sender, 200, 2, "snd-1")
	kind, db := map[string]string{free: "free", locked: "locked"}, map[string]*sql.DB{free: b.db, locked: b.db}
	claims := openEach(t, a, id, acts, kind, db)
	var credits []model.Credit
	for _, c := range claims {
		credits = append(credits, model.Credit{ClaimID: c.claim.ClaimID, PacketID: model.PacketID(id), ActID: c.act, Shard: sharding.ShardOfAct(c.act), Amount: model.Cents(c.claim.Amount)})
	}
	post := func(partial bool, out any) (int, string) {
		body, _ := json.Marshal(api.CreditsRequest{Credits: credits})
		req := newRequest(nil, "POST", b.url+"/internal/credits", body)
		if partial {
			req.Header.Set(api.HeaderPartial, "1")
		}
		signer.SignRequest(req, time.Now())
		return exchange(t, req, out)
	}
	var out api.CreditsResponse
	if st, code := post(true, &out); st != 200 || out.Applied != 1 || !slices.Equal(out.Deferred, []string{claims[1].claim.ClaimID}) {
		t.Fatalf("with the deferred list read: %d %s %+v; want 200, 1 applied, %s deferred", st, code, out, claims[1].claim.ClaimID)
	}
	if st, code := post(false, nil); st != 503 || code != "OVERLOADED" {
		t.Fatalf("without it: %d %s; want 503 OVERLOADED", st, code)
	}
	if got, want := walletBalance(t, b.db, free), claims[0].claim.Amount; got != want {
		t.Fatalf("free claimant's balance %d, want %d", got, want)
	}
	if got := walletBalance(t, b.db, locked); got != 0 {
		t.Fatalf("locked claimant's balance %d while locked", got)
	}
	release()
	good, _ := sharding.NewMap([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: a.cfg.Shards}, {Name: b.name, Addr: b.addr, Shards: b.cfg.Shards}})
	peers.m.Store(good)
	if !probe(t, claims, nil, 10*time.Second, allCredited(claims)) {
		t.Fatalf("not credited within 10 s of the release")
	}
	checkExactlyOnce(t, claims, a)
}
