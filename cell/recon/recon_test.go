package recon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage/memstore"
)

// world is one cell owning every shard, its books in memory, and a clock the
// test moves.
type world struct {
	t     *testing.T
	clk   *clock.Manual
	store *memstore.Store
	books *flakyBooks
	ctx   context.Context
	n     int // claims made so far
}

// flakyBooks is a store whose position saves fail while failSave is set, as
// a crash between a round's checks and its save would leave them.
type flakyBooks struct {
	*memstore.Store
	failSave bool
	failRead atomic.Bool // ReconPositions fails
}

func (b *flakyBooks) ReconPositions(ctx context.Context) (map[int]int64, error) {
	if b.failRead.Load() {
		return nil, errors.New("injected: positions unreadable")
	}
	return b.Store.ReconPositions(ctx)
}

func (b *flakyBooks) SaveReconPositions(ctx context.Context, pos map[int]int64) error {
	if b.failSave {
		return errors.New("injected: position not saved")
	}
	return b.Store.SaveReconPositions(ctx, pos)
}

type peers struct{ m *sharding.Map }

func (p peers) Map() *sharding.Map { return p.m }

type noCells struct{}

func (noCells) Recon(context.Context, string, []model.Credit) (api.ReconResponse, error) {
	return api.ReconResponse{}, errors.New("no other cell")
}

func (noCells) ReconCopy(context.Context, string, []model.Credit) (api.ReconResponse, error) {
	return api.ReconResponse{}, errors.New("no other cell")
}

const (
	interval = time.Minute
	settle   = 30 * time.Second
)

func newWorld(t *testing.T) *world {
	clk := clock.NewManual(time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC))
	s := memstore.New(clk)
	w := &world{t: t, clk: clk, store: s, books: &flakyBooks{Store: s}, ctx: context.Background()}
	if _, err := s.Deposit(w.ctx, 7, "ann", "d1", 1_000_000); err != nil {
		t.Fatal(err)
	}
	return w
}

// reconciler builds a reconciler as a (re)started cell would: fresh metrics.
func (w *world) reconciler() *Reconciler {
	all := sharding.Ranges{{From: 0, To: model.ShardCount - 1}}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: "a:1", Shards: all}})
	return New(Config{DBs: all.DBs, Owns: all.Contains, Peers: peers{m}, Interval: interval, Settle: settle,
		PacketExpiry: 24 * time.Hour, RelayOff: func() bool { return false }, Clock: w.clk,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Reg: prometheus.NewRegistry()},
		Space{Name: "real", Books: w.books, Client: noCells{}})
}

// claims makes n claims of a new packet, one per millisecond from now,
// credits them and marks them delivered, and moves the clock past them.
func (w *world) claims(n int) {
	w.t.Helper()
	id := model.NewPacketID(7, w.clk.Now())
	if _, _, err := w.store.Send(w.ctx, 7, model.SendRequest{Sender: "ann", Amount: model.Cents(10 * n), Count: int64(n),
		Kind: model.KindRandom, OrderNo: string(id)}, id, w.clk.Now().Add(time.Hour).UnixMilli()); err != nil {
		w.t.Fatal(err)
	}
	ref, _ := model.ParsePacketID(string(id))
	var credits []model.Credit
	for range n {
		w.clk.Advance(time.Millisecond)
		act := fmt.Sprintf("user%d", w.n)
		w.n++
		res, _, err := w.store.OpenBatch(w.ctx, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil || res[0].Err != nil {
			w.t.Fatal(err, res)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(act), Amount: c.Amount})
	}
	if _, _, err := w.store.ApplyCredits(w.ctx, credits); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.store.MarkDelivered(w.ctx, credits); err != nil {
		w.t.Fatal(err)
	}
	w.clk.Advance(time.Millisecond)
}

// run resumes r as Run does at its start and runs one pass now.
func (w *world) run(r *Reconciler) (pass, map[int]int64) {
	w.t.Helper()
	cursors, err := r.resume(w.ctx, 0, w.clk.Now().UnixMilli())
	if err != nil {
		w.t.Fatal(err)
	}
	return r.pass(w.ctx, 0, cursors, 0), cursors
}

// TestReconResumesFromSavedPosition: a restarted reconciler goes on from the
// positions the last one saved, not from its own start: the claims made
// while no reconciler ran are checked, those checked before are not checked
// again. A round whose positions could not be saved is checked again after a
// restart rather than skipped.
func TestReconResumesFromSavedPosition(t *testing.T) {
	w := newWorld(t)
	r1 := w.reconciler()
	cursors, err := r1.resume(w.ctx, 0, w.clk.Now().UnixMilli()) // nothing saved: from now
	if err != nil {
		t.Fatal(err)
	}
	w.claims(3)
	w.clk.Advance(settle)
	p := r1.pass(w.ctx, 0, cursors, 0)
	if p.checked.Count != 3 || p.credited.Count != 3 || p.diffs.Count() != 0 {
		t.Fatalf("first pass: %+v", p)
	}
	saved, _ := w.store.ReconPositions(w.ctx)
	for db, c := range cursors { // every owned database, read empty or not
		if saved[db] != c {
			t.Fatalf("db %d saved at %d, checked up to %d", db, saved[db], c)
		}
	}

	// The cell is down while 4 more claims are made; it restarts later.
	w.claims(4)
	w.clk.Advance(10 * time.Minute)
	p, _ = w.run(w.reconciler())
	if p.checked.Count != 4 || p.credited.Count != 4 || p.diffs.Count() != 0 {
		t.Fatalf("after a restart: checked %+v credited %+v (want the 4 claims made while down, not the 3 before)", p.checked, p.credited)
	}

	// A pass checks 5 claims but cannot save; restarted, the next checks them again.
	w.claims(5)
	w.clk.Advance(settle)
	w.books.failSave = true
	if p, _ = w.run(w.reconciler()); p.checked.Count != 5 {
		t.Fatalf("pass whose save fails: %+v", p.checked)
	}
	w.books.failSave = false
	if p, _ = w.run(w.reconciler()); p.checked.Count != 5 || p.credited.Count != 5 {
		t.Fatalf("after a restart following a lost save: %+v (want the 5 claims again)", p.checked)
	}
	if p, _ = w.run(w.reconciler()); p.checked.Count != 0 {
		t.Fatalf("nothing new: %+v", p.checked)
	}
}

// TestReconCatchesUpInOnePass: a backlog of more rows than a round reads is
// worked off in one pass of several rounds, every claim checked once.
func TestReconCatchesUpInOnePass(t *testing.T) {
	w := newWorld(t)
	r := w.reconciler()
	cursors, err := r.resume(w.ctx, 0, w.clk.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	const n = 2*windowRows + 17
	for w.n < n {
		w.claims(min(5000, n-w.n))
	}
	w.clk.Advance(settle)
	p := r.pass(w.ctx, 0, cursors, 0)
	if p.checked.Count != n || p.credited.Count != n || p.diffs.Count() != 0 {
		t.Fatalf("backlog of %d claims: checked %+v credited %+v diffs %v", n, p.checked, p.credited, p.diffs.Count())
	}
	if lag := float64(w.clk.Now().UnixMilli()-r.checked[0].Load()) / 1000; lag > settle.Seconds()+0.001 {
		t.Fatalf("lag %.3f s after catching up", lag)
	}
}

// runFor runs r.Run until, after the next Interval, its pass has counted
// want checked claims and saved its positions (or, with want < 0, has counted
// an error), or 5 s pass; then stops it.
func (w *world) runFor(r *Reconciler, want float64) {
	w.t.Helper()
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	waiters := w.clk.Waiters()
	go func() { defer close(done); r.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for w.clk.Waiters() == waiters && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	w.clk.Advance(interval)
	saved := func() bool {
		pos, _ := w.store.ReconPositions(w.ctx)
		return pos[0] >= w.clk.Now().Add(-settle).UnixMilli()
	}
	over := func() bool {
		if want < 0 {
			return testutil.ToFloat64(r.metrics[0].errors) > 0
		}
		return testutil.ToFloat64(r.metrics[0].checkedClaims) >= want && saved()
	}
	for !over() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

// TestReconRunResumes: Run itself resumes from the saved positions; while
// they cannot be read it checks nothing (starting from its own start could
// skip a window), and once they can it checks what it would have skipped.
func TestReconRunResumes(t *testing.T) {
	w := newWorld(t)
	r1 := w.reconciler()
	w.runFor(r1, 0) // saves every database's position: its start
	w.claims(3)
	w.clk.Advance(settle)
	w.runFor(r1, 3)
	if got := testutil.ToFloat64(r1.metrics[0].checkedClaims); got != 3 {
		t.Fatalf("first run checked %v claims", got)
	}

	w.claims(4) // made while no reconciler runs
	w.clk.Advance(10 * time.Minute)
	w.books.failRead.Store(true)
	r2 := w.reconciler()
	w.runFor(r2, -1)
	if got := testutil.ToFloat64(r2.metrics[0].checkedClaims); got != 0 || testutil.ToFloat64(r2.metrics[0].errors) == 0 {
		t.Fatalf("positions unreadable: checked %v claims, %v errors", got, testutil.ToFloat64(r2.metrics[0].errors))
	}
	w.books.failRead.Store(false)
	r3 := w.reconciler()
	w.runFor(r3, 4)
	if got := testutil.ToFloat64(r3.metrics[0].checkedClaims); got != 4 {
		t.Fatalf("restarted run checked %v claims, want the 4 made while down", got)
	}
}
