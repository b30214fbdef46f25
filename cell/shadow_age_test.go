package cell

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"redcell/internal/clock"
	"redcell/internal/testaudit"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
)

// shadowAgeDB is the database index these tests drop the shadow copy of, in
// databases of their own (testaudit.PrivatePrefix).
const shadowAgeDB = 98

// shadowRig is a shadowCleaner over the shadow store of test database 1,
// owning database shadowAgeDB only, on a manual clock; what it waits for
// and resets are counters the test reads and sets.
type shadowRig struct {
	c          *shadowCleaner
	clk        *clock.Manual
	store, sh  *storage.MySQL
	db         *sql.DB
	held       atomic.Int64 // credits the "relay" holds
	holds      atomic.Int64 // audits held
	settled    atomic.Int64
	forgotten  atomic.Int64
	real       string // an act_id with a real balance in shadowAgeDB
	shard      model.ShardID
	retention  time.Duration
	checkEvery time.Duration
}

func newShadowRig(t *testing.T) *shadowRig {
	t.Helper()
	dsn := testenv.MySQLDSN(t, 1)
	// Databases of its own: the rig drops a shadow database, whose rows
	// other tests' books may hold the other half of.
	ns := testaudit.PrivatePrefix(t, dsn)
	store, err := storage.OpenPrefixed(dsn, 8, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	r := &shadowRig{clk: clock.NewManual(time.Now()), store: store, sh: store.Shadow(), db: db,
		real: testenv.Prefix() + "-real", shard: model.ShardID(shadowAgeDB*10 + 4), retention: 2 * time.Hour, checkEvery: time.Minute}
	if _, err := storage.Deposit(context.Background(), store, r.shard, r.real, "real-1", 999); err != nil {
		t.Fatal(err)
	}
	r.c = newShadowCleaner(shadowParts{cell: "age", drop: r.sh, dbs: func() []int { return []int{shadowAgeDB} }, retention: r.retention,
		every: r.checkEvery, relayHeld: func() int { return int(r.held.Load()) }, audits: holdCounter{&r.holds},
		settle: func(context.Context) error { r.settled.Add(1); return nil }, forget: func() { r.forgotten.Add(1) },
		clock: r.clk, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, prometheus.NewRegistry())
	return r
}

// holdCounter is an audit that never runs: Hold counts.
type holdCounter struct{ n *atomic.Int64 }

func (h holdCounter) Hold(context.Context) (func(), error) { h.n.Add(1); return func() {}, nil }

// makeShadow writes a shadow row (its tables made first) in shadowAgeDB.
func (r *shadowRig) makeShadow(t *testing.T, order string) {
	t.Helper()
	if _, err := storage.Deposit(context.Background(), r.sh, r.shard, r.real, order, 5); err != nil {
		t.Fatal(err)
	}
}

// shadowExists reports whether shadow_db_98 exists; it also checks that the
// real row of the rig is as it was.
func (r *shadowRig) shadowExists(t *testing.T) bool {
	t.Helper()
	if a, err := storage.Account(context.Background(), r.store, r.shard, r.real); err != nil || a.Balance != 999 {
		t.Fatalf("real balance %d, %v: a shadow cleanup touched real money", a.Balance, err)
	}
	var n int
	if err := r.db.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", r.store.Prefix()+"shadow_db_98").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestShadowCleanupWaits: a cleanup closes the space at once (a stress
// request is refused, 503 OVERLOADED, and the relay reads as off), then waits
// for the stress request in flight and for the relay's lanes before it
// drops; it gives the leases back first and forgets the space's state after,
// holding the audit meanwhile; then the space opens again.
func TestShadowCleanupWaits(t *testing.T) {
	r := newShadowRig(t)
	r.makeShadow(t, "s-1")
	if err := r.c.enter(true); err != nil {
		t.Fatal(err)
	}
	r.held.Store(3)
	type result struct {
		out error
		n   int
	}
	done := make(chan result, 1)
	go func() {
		out, err := r.c.CleanShadow(context.Background())
		done <- result{err, len(out.Databases)}
	}()
	testenv.WaitFor(t, 10*time.Second, "the cleanup to close the space", r.c.isClosed)
	if err := r.c.enter(true); !errors.Is(err, model.ErrOverloaded) {
		t.Fatalf("a stress request while the space is dropped: %v, want OVERLOADED", err)
	}
	r.lookedAgain(t)
	if !r.shadowExists(t) {
		t.Fatal("dropped while a stress request was in flight")
	}
	r.c.leave()
	r.lookedAgain(t)
	if !r.shadowExists(t) || r.settled.Load() != 1 {
		t.Fatalf("dropped while the relay held credits (or leases not given back first: %d)", r.settled.Load())
	}
	r.held.Store(0)
	r.poll(t) // the cleanup's next look finds the relay idle
	res := <-done
	if res.out != nil || res.n != 1 || r.shadowExists(t) {
		t.Fatalf("cleanup: %v, %d databases dropped", res.out, res.n)
	}
	if r.holds.Load() != 1 || r.forgotten.Load() != 1 || r.c.isClosed() {
		t.Fatalf("audit held %d times, state forgotten %d times, closed %v", r.holds.Load(), r.forgotten.Load(), r.c.isClosed())
	}
	if err := r.c.enter(true); err != nil {
		t.Fatalf("a stress request after the cleanup: %v", err)
	}
	r.c.leave()
	r.makeShadow(t, "s-2") // the store makes the tables again
	if out, err := r.c.CleanShadow(context.Background()); err != nil || len(out.Databases) != 1 || out.Owned != 1 || out.Tables < 3 {
		t.Fatalf("second cleanup: %+v, %v", out, err)
	}
	if out, err := r.c.CleanShadow(context.Background()); err != nil || len(out.Databases) != 0 || out.Tables != 0 {
		t.Fatalf("cleanup with nothing left: %+v, %v", out, err)
	}
	if got := testutil.ToFloat64(r.c.cleanups.WithLabelValues(shadowReasonAdmin)); got != 3 {
		t.Fatalf("%v admin cleanups counted, want 3", got)
	}
}

// TestShadowRetention: on a manual clock, the cell drops its shadow space
// once it has served no stress traffic for the retention, not before: its
// start counts as stress traffic, and so does each stress request. Once
// dropped it drops nothing more until new stress traffic has aged again.
func TestShadowRetention(t *testing.T) {
	r := newShadowRig(t)
	r.makeShadow(t, "s-1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.c.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	drops := func() float64 { return testutil.ToFloat64(r.c.cleanups.WithLabelValues(shadowReasonAge)) }
	// advance moves the clock by d, one check, and waits for it to end.
	advance := func(d time.Duration) {
		t.Helper()
		waitWaiting(t, r.clk)
		r.clk.Advance(d)
		waitWaiting(t, r.clk)
	}

	advance(r.retention - r.checkEvery) // the start counts as the last stress traffic
	if !r.shadowExists(t) || drops() != 0 {
		t.Fatal("dropped before the retention passed since the start")
	}
	if err := r.c.enter(true); err != nil { // stress traffic now
		t.Fatal(err)
	}
	r.c.leave()
	advance(r.retention - r.checkEvery)
	if !r.shadowExists(t) || drops() != 0 {
		t.Fatal("dropped before the retention passed since the last stress request")
	}
	if err := r.c.enter(false); err != nil { // a maintenance call of another cell: no traffic
		t.Fatal(err)
	}
	r.c.leave()
	advance(r.checkEvery)
	if r.shadowExists(t) || drops() != 1 {
		t.Fatalf("not dropped once the retention passed (%v drops)", drops())
	}
	r.makeShadow(t, "s-2") // written behind the cleaner's back: no stress request
	advance(3 * r.retention)
	if !r.shadowExists(t) || drops() != 1 {
		t.Fatalf("dropped again with no stress traffic since (%v drops)", drops())
	}
	if err := r.c.enter(true); err != nil {
		t.Fatal(err)
	}
	r.c.leave()
	advance(r.retention)
	if r.shadowExists(t) || drops() != 2 {
		t.Fatalf("new stress traffic aged past the retention: %v drops", drops())
	}
}

// waitWaiting waits until the rig's loop waits on the clock (bounded: 10 s).
func waitWaiting(t *testing.T, m *clock.Manual) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "a wait on the clock", func() bool { return m.Waiters() > 0 })
}

// lookedAgain waits until the running cleanup has looked twice more at
// what it waits for and found it not done (shadowCleaner.waited), moving
// the clock a poll (shadowPoll) each time the cleanup waits on it, and
// until it waits on the clock again: from then on, what the test checks is
// what the cleanup saw and keeps waiting on, and a move of the clock
// reaches its wait.
func (r *shadowRig) lookedAgain(t *testing.T) {
	t.Helper()
	from := r.c.waited.Load()
	for r.c.waited.Load() < from+2 {
		r.poll(t)
	}
	waitWaiting(t, r.clk)
}

// poll waits until the running cleanup waits on the clock and moves the
// clock on by a poll, so that it looks again.
func (r *shadowRig) poll(t *testing.T) {
	t.Helper()
	waitWaiting(t, r.clk)
	r.clk.Advance(shadowPoll)
}

// TestShadowCleanupQuiet: a cleanup asked for soon after stress traffic
// waits, with the space still open, until the other cells' reconciliation
// is past it (quiet), then drops.
func TestShadowCleanupQuiet(t *testing.T) {
	r := newShadowRig(t)
	r.c.p.quiet = 100 * time.Second
	r.makeShadow(t, "s-1")
	if err := r.c.enter(true); err != nil {
		t.Fatal(err)
	}
	r.c.leave()
	done := make(chan error, 1)
	go func() { _, err := r.c.CleanShadow(context.Background()); done <- err }()
	r.lookedAgain(t)
	if r.c.isClosed() || !r.shadowExists(t) || r.holds.Load() != 0 {
		t.Fatal("the cleanup closed the space or dropped before the quiet time passed")
	}
	r.clk.Advance(99 * time.Second)
	r.lookedAgain(t)
	if !r.shadowExists(t) {
		t.Fatal("dropped 99 s after the last stress traffic")
	}
	r.clk.Advance(time.Second)
	if err := <-done; err != nil || r.shadowExists(t) {
		t.Fatalf("cleanup once quiet: %v", err)
	}
}
