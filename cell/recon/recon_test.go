package recon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// world is one cell owning every shard, its books in memory, and a clock the
// test moves.
type world struct {
	t        *testing.T
	clk      *clock.Manual
	store    *memstore.Store
	books    *flakyBooks
	ctx      context.Context
	n        int                       // claims made so far
	redriven map[string][]model.Credit // by space: what the reconcilers handed to Config.Redrive
}

// flakyBooks is a store whose position saves fail while failSave is set, as
// a crash between a round's checks and its save would leave them.
type flakyBooks struct {
	*memstore.Store
	failSave bool
	failRead atomic.Bool // ReconPositions fails
}

// Read fails a storage.ReconPositionsQuery while failRead is set; the rest
// is the store's.
func (b *flakyBooks) Read(ctx context.Context, q storage.Query) error {
	if _, ok := q.(*storage.ReconPositionsQuery); ok && b.failRead.Load() {
		return errors.New("injected: positions unreadable")
	}
	return b.Store.Read(ctx, q)
}

// CommitGroup fails a storage.AdvanceReconPositions while failSave is set;
// the rest is the store's.
func (b *flakyBooks) CommitGroup(ctx context.Context, ops []storage.Op) error {
	if len(ops) == 1 && b.failSave {
		if _, ok := ops[0].(*storage.AdvanceReconPositions); ok {
			return errors.New("injected: position not saved")
		}
	}
	return b.Store.CommitGroup(ctx, ops)
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
	w := &world{t: t, clk: clk, store: s, books: &flakyBooks{Store: s}, ctx: context.Background(), redriven: map[string][]model.Credit{}}
	if _, err := storage.Deposit(w.ctx, s, 7, "ann", "d1", 1_000_000); err != nil {
		t.Fatal(err)
	}
	return w
}

// reconciler builds a reconciler as a (re)started cell would: fresh metrics.
func (w *world) reconciler() *Reconciler {
	all := sharding.Ranges{{From: 0, To: model.ShardCount - 1}}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: "a:1", Shards: all}})
	return w.reconcilerOf("a", m, all, noCells{})
}

// reconcilerOf builds the reconciler of cell, serving shards, with map m
// and client for other cells; what it re-drives is kept in w.redriven.
func (w *world) reconcilerOf(cell string, m *sharding.Map, shards sharding.Ranges, client Client) *Reconciler {
	return New(Config{Cell: cell, DBs: shards.DBs, Owns: shards.Contains, Peers: peers{m}, Interval: interval, Settle: settle,
		PacketExpiry: 24 * time.Hour, RelayOff: func() bool { return false }, Clock: w.clk,
		Redrive: func(space string, cs []model.Credit) { w.redriven[space] = append(w.redriven[space], cs...) },
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)), Reg: prometheus.NewRegistry()},
		Space{Name: "real", Books: w.books, Client: client})
}

// open makes a claim of a new packet for each of acts, one per millisecond
// from now, and moves the clock past them; it answers the credits they owe.
func (w *world) open(acts ...string) []model.Credit {
	w.t.Helper()
	n := len(acts)
	id := model.NewPacketID(7, w.clk.Now())
	if _, _, err := storage.Send(w.ctx, w.store, 7, model.SendRequest{Sender: "ann", Amount: model.Cents(10 * n), Count: int64(n),
		Kind: model.KindRandom, OrderNo: string(id)}, id, w.clk.Now().Add(time.Hour).UnixMilli()); err != nil {
		w.t.Fatal(err)
	}
	ref, _ := model.ParsePacketID(string(id))
	var credits []model.Credit
	for _, act := range acts {
		w.clk.Advance(time.Millisecond)
		w.n++
		res, _, err := storage.OpenBatch(w.ctx, w.store, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil || res[0].Err != nil {
			w.t.Fatal(err, res)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(act), Amount: c.Amount})
	}
	w.clk.Advance(time.Millisecond)
	return credits
}

// claims makes n claims of a new packet, one per millisecond from now,
// credits them, and moves the clock past them.
func (w *world) claims(n int) {
	w.t.Helper()
	acts := make([]string, n)
	for i := range acts {
		acts[i] = fmt.Sprintf("user%d", w.n+i)
	}
	w.credit(w.open(acts...)...)
}

// credit books credits in the claimants' wallets.
func (w *world) credit(cs ...model.Credit) {
	w.t.Helper()
	if _, _, err := storage.ApplyCredits(w.ctx, w.store, cs); err != nil {
		w.t.Fatal(err)
	}
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
	saved, _ := storage.ReconPositions(w.ctx, w.store)
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
// an error), or 10 s pass; then stops it.
func (w *world) runFor(r *Reconciler, want float64) {
	w.t.Helper()
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	waiters := w.clk.Waiters()
	go func() { defer close(done); r.Run(ctx) }()
	testenv.Until(10*time.Second, func() bool { return w.clk.Waiters() != waiters }) // Run waits for its Interval
	w.clk.Advance(interval)
	saved := func() bool {
		pos, _ := storage.ReconPositions(w.ctx, w.store)
		return pos[0] >= w.clk.Now().Add(-settle).UnixMilli()
	}
	over := func() bool {
		if want < 0 {
			return testutil.ToFloat64(r.metrics[0].errors) > 0
		}
		return testutil.ToFloat64(r.metrics[0].checkedClaims) >= want && saved()
	}
	testenv.Until(10*time.Second, over)
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

// TestReconLagIsRedriven: a claim not credited at the settle age is lag, not
// a difference: it is counted, and handed to Config.Redrive once, as the
// credit it owes; a credit of another amount is a credit_mismatch and is
// not re-driven. Nothing is checked twice.
func TestReconLagIsRedriven(t *testing.T) {
	w := newWorld(t)
	r := w.reconciler()
	cursors, err := r.resume(w.ctx, 0, w.clk.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	cs := w.open("lag-a", "lag-b", "lag-c", "lag-d")
	wrong := cs[2]
	wrong.Amount++
	w.credit(cs[0], cs[1], wrong) // cs[3] not credited
	w.clk.Advance(settle)
	p := r.pass(w.ctx, 0, cursors, 0)
	r.report(0, p, cursors)
	var cents model.Cents
	for _, c := range cs {
		cents += c.Amount
	}
	if p.checked != (model.Tally{Count: 4, Cents: cents}) || p.credited.Count != 2 || p.lagging != 1 || p.unverified != 0 ||
		p.diffs.Count() != 1 || len(p.diffs[model.DiffCreditMismatch]) != 1 || p.diffs[model.DiffCreditMismatch][0] != cs[2].ClaimID {
		t.Fatalf("pass: %+v", p)
	}
	got := w.redriven["real"]
	if len(got) != 1 || got[0].ClaimID != cs[3].ClaimID || got[0].ActID != "lag-d" || got[0].Shard != cs[3].Shard ||
		got[0].Amount != cs[3].Amount || got[0].PacketID != cs[3].PacketID || got[0].CreatedMS == 0 {
		t.Fatalf("re-driven: %+v, want the credit %+v", got, cs[3])
	}
	m := r.metrics[0]
	if testutil.ToFloat64(m.lagging) != 1 || testutil.ToFloat64(m.diffs[slices.Index(model.DiffKinds[:], model.DiffCreditMissing)]) != 0 ||
		testutil.ToFloat64(m.differences) != 1 {
		t.Fatalf("metrics: lagging %v, credit_missing %v, differences %v", testutil.ToFloat64(m.lagging),
			testutil.ToFloat64(m.diffs[slices.Index(model.DiffKinds[:], model.DiffCreditMissing)]), testutil.ToFloat64(m.differences))
	}
	w.clk.Advance(interval)
	if p = r.pass(w.ctx, 0, cursors, 1); p.checked.Count != 0 || p.lagging != 0 || len(w.redriven["real"]) != 1 {
		t.Fatalf("next pass: %+v, re-driven %d", p, len(w.redriven["real"]))
	}
}

// otherCell answers /internal/recon as the cell b that serves the claimants
// of shards 500-999: credited holds the credits its wallets have, by claim
// ID, and copied the claims whose credits its copy of a database it handed
// over holds (ReconCopy).
type otherCell struct {
	credited map[string]model.Cents
	copied   map[string]bool
	asked    []string // the addresses asked, call by call
}

func (o *otherCell) Recon(_ context.Context, addr string, cs []model.Credit) (api.ReconResponse, error) {
	o.asked = append(o.asked, "recon "+addr)
	out := api.ReconResponse{Missing: []string{}, Mismatched: []string{}}
	for _, c := range cs {
		amount, ok := o.credited[c.ClaimID]
		switch {
		case !ok:
			out.Missing = append(out.Missing, c.ClaimID)
		case amount != c.Amount:
			out.Mismatched = append(out.Mismatched, c.ClaimID)
		default:
			out.Matched++
			out.MatchedCents += int64(c.Amount)
		}
	}
	return out, nil
}

func (o *otherCell) ReconCopy(_ context.Context, addr string, cs []model.Credit) (api.ReconResponse, error) {
	o.asked = append(o.asked, "copy "+addr)
	out := api.ReconResponse{Missing: []string{}, Mismatched: []string{}}
	for _, c := range cs {
		if o.copied[c.ClaimID] {
			out.Matched++
		} else {
			out.Missing = append(out.Missing, c.ClaimID)
		}
	}
	return out, nil
}

// TestReconOtherCells: cell a (shards 0-499) checks its claims of cell b's
// claimants by asking b. One b credited is credited; one b lacks is lag and
// re-driven; one b lacks but whose credit was sent to a (Dest), which still
// holds it in its copy of the claimant's database, is credit_elsewhere and
// not re-driven; one sent to a and not in its copy either is lag; one b
// credited with another amount is credit_mismatch. A claim of a's own
// claimant is looked up locally.
func TestReconOtherCells(t *testing.T) {
	w := newWorld(t)
	a, b := sharding.Ranges{{From: 0, To: 499}}, sharding.Ranges{{From: 500, To: 999}}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: "a:1", Shards: a}, {Name: "b", Addr: "b:1", Shards: b}})
	actIn := func(pre string, rs sharding.Ranges) string {
		for i := 0; ; i++ {
			if act := fmt.Sprintf("%s%d", pre, i); rs.Contains(sharding.ShardOfAct(act)) {
				return act
			}
		}
	}
	other := &otherCell{credited: map[string]model.Cents{}, copied: map[string]bool{}}
	r := w.reconcilerOf("a", m, a, other)
	cursors, err := r.resume(w.ctx, 0, w.clk.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	w.store.SetCreditDest(func(s model.ShardID) string { return map[bool]string{true: "a", false: "b"}[a.Contains(s)] })
	sent := w.open(actIn("ok", b), actIn("lag", b), actIn("wrong", b), actIn("local", a))
	w.store.SetCreditDest(func(model.ShardID) string { return "a" }) // b's claimants were a's when these were made
	moved := w.open(actIn("kept", b), actIn("lost", b))
	other.credited[sent[0].ClaimID] = sent[0].Amount
	other.credited[sent[2].ClaimID] = sent[2].Amount + 1
	other.copied[moved[0].ClaimID] = true
	w.credit(sent[3])
	w.clk.Advance(settle)
	p := r.pass(w.ctx, 0, cursors, 0)
	if p.checked.Count != 6 || p.credited.Count != 2 || p.lagging != 2 || p.unverified != 0 || p.diffs.Count() != 2 ||
		!slices.Equal(p.diffs[model.DiffCreditMismatch], []string{sent[2].ClaimID}) ||
		!slices.Equal(p.diffs[model.DiffCreditElsewhere], []string{moved[0].ClaimID}) {
		t.Fatalf("pass: %+v", p)
	}
	var redriven []string
	for _, c := range w.redriven["real"] {
		redriven = append(redriven, c.ClaimID)
	}
	slices.Sort(redriven)
	want := []string{sent[1].ClaimID, moved[1].ClaimID}
	slices.Sort(want)
	if !slices.Equal(redriven, want) {
		t.Fatalf("re-driven %v, want %v (the lagging claims, not the one found elsewhere)", redriven, want)
	}
	if !slices.Equal(other.asked, []string{"recon b:1", "copy a:1"}) {
		t.Fatalf("calls %v, want b asked, then a's copy for the claims sent to a", other.asked)
	}
}
