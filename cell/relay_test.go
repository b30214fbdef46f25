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

	"redcell/api"
	"redcell/cell"
	"redcell/cell/relay"
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

// creditWatch follows claims, from its own goroutine, from the moment each is
// answered: every 5 ms it reads the balances of those not credited yet (one
// query per account table), and notes when each first shows credited.
type creditWatch struct {
	mu     sync.Mutex // guards claims, the times in them, and errs
	claims []*probeClaim
	errs   []error

	stop chan struct{}
	done chan struct{}
}

func watchCredits(t *testing.T) *creditWatch {
	w := &creditWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			w.poll()
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		w.halt()
		for _, err := range w.errs {
			t.Errorf("watching credits: %v", err)
		}
	})
	return w
}

// halt stops the polling; the times stay as they are.
func (w *creditWatch) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// open opens packet id at cell c for each claimant in turn (kind and the
// database holding its wallet as the maps say) and watches each claim from
// its answer on.
func (w *creditWatch) open(t *testing.T, c *testCell, id string, order []string, kind map[string]string, db map[string]*sql.DB) []*probeClaim {
	t.Helper()
	var out []*probeClaim
	for _, act := range order {
		claim := openOne(t, c, nil, id, act)
		pc := &probeClaim{act: act, kind: kind[act], db: db[act], claim: claim, answered: time.Now()}
		w.mu.Lock()
		w.claims = append(w.claims, pc)
		w.mu.Unlock()
		out = append(out, pc)
	}
	return out
}

// poll reads once what the claims not seen yet show.
func (w *creditWatch) poll() {
	type table struct {
		db   *sql.DB
		name string
	}
	accounts := map[table][]*probeClaim{}
	w.mu.Lock()
	for _, c := range w.claims {
		if c.credited.IsZero() {
			sh := sharding.ShardOfAct(c.act)
			k := table{c.db, fmt.Sprintf("db_%02d.t_account_%d", sh.DB(), sh.Table())}
			accounts[k] = append(accounts[k], c)
		}
	}
	w.mu.Unlock()
	// read runs q over the claims cs of one table and calls seen with each row
	// read (its key and value) and the time it was read.
	read := func(tb table, q string, cs []*probeClaim, arg func(*probeClaim) any, seen func(c *probeClaim, key string, v int64, at time.Time)) {
		args := make([]any, len(cs))
		for i, c := range cs {
			args[i] = arg(c)
		}
		rows, err := tb.db.Query(fmt.Sprintf(q, tb.name, strings.Repeat("?, ", len(cs)-1)+"?"), args...)
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 { // no such table yet
			return
		}
		if err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
			return
		}
		defer rows.Close()
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		for rows.Next() {
			var key string
			var v int64
			if err := rows.Scan(&key, &v); err != nil {
				w.errs = append(w.errs, err)
				return
			}
			for _, c := range cs {
				seen(c, key, v, now)
			}
		}
	}
	for tb, cs := range accounts {
		read(tb, "SELECT act_id, balance FROM %s WHERE act_id IN (%s)", cs, func(c *probeClaim) any { return c.act },
			func(c *probeClaim, act string, balance int64, at time.Time) {
				if c.act == act && balance == c.claim.Amount && c.credited.IsZero() {
					c.credited = at
				}
			})
	}
}

// until waits, for up to limit, until done reports true (called with the
// times stable), and says whether it did.
func (w *creditWatch) until(limit time.Duration, done func() bool) bool {
	return testenv.Until(limit, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return done()
	})
}

// seen reports whether c has been seen credited.
func (w *creditWatch) seen(c *probeClaim) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !c.credited.IsZero()
}

func allCredited(cs []*probeClaim) func() bool {
	return func() bool {
		return !slices.ContainsFunc(cs, func(c *probeClaim) bool { return c.credited.IsZero() })
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
// reads (its credit); a claim not seen counts as missing.
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
// keyed by the claim, and the sender's relay holds no credit any more, every
// delivery acknowledged (waiting up to 5 s). Then, after three more relay
// passes (counted by the sender), nothing has changed.
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
	waitFor(t, 5*time.Second, func() bool { return creditsPending(t, sender, "real") == 0 }, "the sender's relay to let every delivered credit go")
	waitScans(t, sender, "real", 3)
	check()
}

// relayCast is the cast of the locked-row tests: cell-a and cell-b with
// admin ports (twoCells), a sender in cell-a, and n claimants in shard 123
// (cell-a's) and n in shard 678 (cell-b's).
func relayCast(t *testing.T, n int) (a, b *testCell, sender string, local, remote []string) {
	t.Helper()
	a, b = twoCells(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken })
	pre := testenv.Prefix()
	sender = actIn(t, pre+"-s", a.cfg.Shards)
	return a, b, sender, actsInShard(t, pre+"-l", 123, n), actsInShard(t, pre+"-r", 678, n)
}

// TestRelayLockedWalletRow: one claimant's wallet row in the other cell is
// held locked by another transaction. The credits of every other claimant, in
// that cell and in the sending cell's own shards, are applied within a second
// of their claims; the locked one waits, and is applied once the lock is
// released, exactly once. Balances and credit flows end exact, the sending
// cell's relay holds nothing, and it observed every credit's lag.
func TestRelayLockedWalletRow(t *testing.T) {
	a, b, sender, local, remote := relayCast(t, 8)
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
	b.balance(t, locked)   // creates the shard's tables
	a.balance(t, local[0]) // and the local claimants': the delays measured are the relay's, not a CREATE TABLE's
	sh := sharding.ShardOfAct(locked)
	account := fmt.Sprintf("db_%02d.t_account_%d", sh.DB(), sh.Table())
	exec(t, b.db, "INSERT INTO "+account+" (act_id, balance, updated_ms) VALUES (?, 0, 0)", locked)
	release := holdLocked(t, b.db, "SELECT balance FROM "+account+" WHERE act_id = ? FOR UPDATE", locked)

	n := len(local) + len(remote)
	a.deposit(t, sender, 100_000)
	id := a.send(t, sender, int64(n)*100, int64(n), "snd-1")
	w := watchCredits(t)
	claims := w.open(t, a, id, append([]string{locked}, interleave(local, remote[1:])...), kind, db)
	others := only(claims, "local", "remote")

	w.until(12*time.Second, allCredited(others))
	if w.seen(only(claims, "locked")[0]) {
		t.Errorf("the locked claimant was credited while its wallet row was locked")
	}
	released := time.Now()
	release()
	if !w.until(15*time.Second, allCredited(claims)) {
		t.Errorf("not every claim credited within 15 s of the lock's release")
	}
	w.halt()
	if c := only(claims, "locked")[0]; !c.credited.IsZero() {
		t.Logf("the locked claimant's credit applied %s after the lock's release", c.credited.Sub(released).Round(time.Millisecond))
	}
	report(t, "credit delay, other credits while one wallet row is locked", others, creditedAt)
	report(t, "  of which in the sending cell", only(claims, "local"), creditedAt)
	report(t, "  of which in the locked row's cell", only(claims, "remote"), creditedAt)
	if n := metric(t, a, "redcell_cell_relay_deferred_total"); n < 1 {
		t.Errorf("redcell_cell_relay_deferred_total = %v, want >= 1", n)
	}
	// Every remote credit's lag is observed by the sending cell's relay; the
	// locked one's after its lock was released. The sending cell's own
	// claimants were credited in their opens' transactions: no relay lane
	// carried them.
	if n, series := metric(t, a, `redcell_credit_lag_seconds_count{kind="remote",space="real"}`), "remote"; n < float64(len(remote)) {
		t.Errorf("credit lag samples of kind %s = %v, want >= %d", series, n, len(remote))
	}
	// (one whose flow index a neighbouring key's insert held for a moment
	// goes through the relay all the same).
	if n := metric(t, a, `redcell_credit_lag_seconds_count{kind="local",space="real"}`); n >= float64(len(local)) {
		t.Errorf("credit lag samples of kind local = %v, want fewer than the %d local claimants: they are credited in their opens", n, len(local))
	}
	checkExactlyOnce(t, claims, a)
}

// TestRelayLockedPositionRow: the row of the relay's saved position for the
// sending cell's packet database is held locked by another transaction, so
// that every save of positions waits on it and fails at its deadline, while
// the relay delivers. Four claims made while the relay was off (two local,
// two in the other cell) are credited once it is back on, and fresh claims
// made meanwhile within a second each: a save never holds up a delivery. The
// saved position stays where it was while locked; once released, the relay
// saves it again, moved on (and relay.Slack behind now at least); nothing is
// credited twice.
func TestRelayLockedPositionRow(t *testing.T) {
	a, b, sender, local, remote := relayCast(t, 6)
	a.balance(t, local[0]) // the claimants' tables exist before the clock runs
	b.balance(t, remote[0])
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
	ref, _ := model.ParsePacketID(id)
	positions := fmt.Sprintf("db_%02d.t_relay_position", ref.Shard.DB())
	position := func() int64 { // a consistent read: it never waits on the lock
		var ms int64
		a.db.QueryRow("SELECT pos_ms FROM " + positions + " WHERE id = 1").Scan(&ms)
		return ms
	}
	// A claim on another packet of the database: the relay saves a
	// position only for a database whose claims came or went.
	warm := a.send(t, sender, 100, 1, "snd-0")
	openOne(t, a, nil, warm, actsInShard(t, testenv.Prefix()+"-w", 123, 1)[0])
	waitFor(t, 10*time.Second, func() bool { return position() > 0 }, "the relay's first save of its position")

	// The held claims are made while the relay is off (it holds them), and
	// the position's row locked before it is back on.
	degrade(t, a, `{"relay":"off"}`)
	w := watchCredits(t)
	held := w.open(t, a, id, interleave(local[:2], remote[:2]), kind, db)
	if got := creditsPending(t, a, "real"); got < float64(len(held)) {
		t.Fatalf("the relay holds %v credits while off, want at least the %d claims made", got, len(held))
	}
	release := holdLocked(t, a.db, "SELECT pos_ms FROM "+positions+" WHERE id = 1 FOR UPDATE")
	locked := position()
	errs := func() float64 { return counter(t, a.reg, "redcell_cell_relay_errors_total", nil) }
	errsBefore := errs()
	degrade(t, a, `{"relay":"on"}`)
	if !w.until(10*time.Second, allCredited(held)) {
		t.Fatal("the held claims were not credited within 10 s of the relay switched on")
	}

	fresh := w.open(t, a, id, interleave(local[2:], remote[2:]), kind, db)
	w.until(12*time.Second, allCredited(fresh))
	waitFor(t, 3*relay.PositionEvery, func() bool { return errs() > errsBefore }, "a save of the positions to fail on the locked row")
	if got := position(); got != locked {
		t.Errorf("the saved position moved from %d to %d while its row was locked", locked, got)
	}
	release()
	claims := append(held, fresh...)
	if !w.until(15*time.Second, allCredited(claims)) {
		t.Errorf("not every claim credited within 15 s of the lock's release")
	}
	w.halt()
	report(t, "credit delay, fresh credits while the position's row is locked", fresh, creditedAt)
	waitFor(t, 3*relay.PositionEvery, func() bool { return position() > locked }, "the relay to save its position again, once released")
	if got, most := position(), time.Now().Add(-relay.Slack).UnixMilli(); got > most {
		t.Errorf("the saved position %d is less than relay.Slack behind now (%d at most)", got, most)
	}
	checkExactlyOnce(t, claims, a)
}

// TestCreditsAnswerNamesDeferred: /internal/credits does not wait for a
// wallet row another transaction holds. To a sender that reads the deferred
// list (api.HeaderPartial) it answers 200 with that claim listed and the
// others applied; to one that does not, a retryable 503 OVERLOADED, so such a
// sender marks nothing it cannot be sure of. Once the row is free the relay
// delivers the deferred credit, once.
func TestCreditsAnswerNamesDeferred(t *testing.T) {
	// cell-a's relay cannot reach cell-b at first: the test posts the credits itself.
	a, b, join := twoCellsApart(t)
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
	w := watchCredits(t)
	claims := w.open(t, a, id, acts, kind, db)
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
	join()
	if !w.until(10*time.Second, allCredited(claims)) {
		t.Fatalf("not credited within 10 s of the release")
	}
	w.halt()
	checkExactlyOnce(t, claims, a)
}
