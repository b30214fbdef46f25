package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// These tests drive the relay on synctest's fake clock, with the store and
// the other cells faked: which credits go where, when, and how often, what
// the relay holds, what it reads and what positions it saves. The real ones
// are exercised in cell's relay_test.go and stall_test.go.

// fakeStore is the Store the relay uses, in memory: the claims of each
// database (what ClaimsAfter reads), the saved positions, and the wallets
// of this cell's claimants (ApplyCredits).
type fakeStore struct {
	mu        sync.Mutex
	claims    map[int][]model.Credit    // by database of the packet's shard, in ClaimPos order (addClaims)
	positions map[int]int64             // the saved positions, by database
	saves     []map[int]int64           // every SaveRelayPositions call, in order
	posReads  [][]int                   // the databases of every RelayPositions call, in order
	reads     map[int]int               // ClaimsAfter calls by database
	froms     map[int][]int64           // the fromMS of each ClaimsAfter call by database
	batches   [][]string                // claim IDs of each ApplyCredits call, in order
	applied   map[string]int            // times each claim was applied or found applied
	sent      map[string]string         // the dest each claim was last recorded as sent to (SendTo)
	defer_    func(c model.Credit) bool // deferred by this call? (nil: never)
	release   chan struct{}             // when set, ApplyCredits waits for it to close
	took      time.Duration             // how long each ApplyCredits takes (on the test's clock)
	readGap   chan struct{}             // when set, a ClaimsAfter that found claims waits for it before it returns
}

var _ Store = (*fakeStore)(nil)

func newFakeStore() *fakeStore {
	return &fakeStore{claims: map[int][]model.Credit{}, positions: map[int]int64{}, reads: map[int]int{}, froms: map[int][]int64{},
		applied: map[string]int{}, sent: map[string]string{}}
}

// posOf is a credit's claim position (model.ClaimPos).
func posOf(c model.Credit) model.ClaimPos {
	_, seq, _ := model.ParseClaimID(c.ClaimID)
	return model.ClaimPos{CreatedMS: c.CreatedMS, PacketID: c.PacketID, Seq: seq}
}

func comparePos(a, b model.ClaimPos) int {
	return cmp.Or(cmp.Compare(a.CreatedMS, b.CreatedMS), strings.Compare(string(a.PacketID), string(b.PacketID)), cmp.Compare(a.Seq, b.Seq))
}

// addClaims commits cs: ClaimsAfter finds them under their packets' databases.
func (f *fakeStore) addClaims(cs ...model.Credit) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		ref, err := model.ParsePacketID(string(c.PacketID))
		if err != nil {
			panic(err)
		}
		db := ref.Shard.DB()
		f.claims[db] = append(f.claims[db], c)
		slices.SortFunc(f.claims[db], func(a, b model.Credit) int { return comparePos(posOf(a), posOf(b)) })
	}
}

// Read answers the relay's queries (storage.ClaimsAfterQuery,
// storage.RelayPositionsQuery) from the fake's claims and positions.
func (f *fakeStore) Read(ctx context.Context, q storage.Query) error {
	var err error
	switch q := q.(type) {
	case *storage.ClaimsAfterQuery:
		q.Credits, q.Next, err = f.claimsAfter(ctx, q.DB, q.FromMS, q.After, q.BeforeMS, q.Limit)
	case *storage.RelayPositionsQuery:
		q.Pos, err = f.relayPositions(ctx, q.DBs)
	default:
		return storage.UnknownOp(q)
	}
	return err
}

// CommitGroup runs the relay's ops (storage.SetRelayPositions,
// storage.RecordDest) on the fake's positions and dests.
func (f *fakeStore) CommitGroup(ctx context.Context, ops []storage.Op) error {
	if len(ops) == 1 {
		switch o := ops[0].(type) {
		case *storage.SetRelayPositions:
			return f.saveRelayPositions(ctx, o.Pos)
		case *storage.RecordDest:
			return f.sendTo(ctx, o.Credits, o.Dest)
		}
	}
	return storage.UnknownOp(ops)
}

func (f *fakeStore) claimsAfter(ctx context.Context, db int, fromMS int64, after model.ClaimPos, beforeMS int64, limit int) ([]model.Credit, model.ClaimPos, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads[db]++
	f.froms[db] = append(f.froms[db], fromMS)
	next := after
	var out []model.Credit
	for _, c := range f.claims[db] {
		if c.CreatedMS < fromMS || after != (model.ClaimPos{}) && comparePos(posOf(c), after) <= 0 {
			continue
		}
		if c.CreatedMS > beforeMS || len(out) == limit {
			break
		}
		out, next = append(out, c), posOf(c)
	}
	if gap := f.readGap; gap != nil && len(out) > 0 {
		f.mu.Unlock()
		<-gap
		f.mu.Lock()
	}
	return out, next, nil
}

func (f *fakeStore) relayPositions(ctx context.Context, dbs []int) (map[int]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posReads = append(f.posReads, slices.Clone(dbs))
	out := map[int]int64{}
	for _, db := range dbs {
		if p, ok := f.positions[db]; ok {
			out[db] = p
		}
	}
	return out, nil
}

func (f *fakeStore) saveRelayPositions(ctx context.Context, pos map[int]int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saves = append(f.saves, maps.Clone(pos))
	maps.Copy(f.positions, pos)
	return nil
}

func (f *fakeStore) ApplyCredits(ctx context.Context, cs []model.Credit) (int, []string, error) {
	f.mu.Lock()
	wait, took := f.release, f.took
	f.mu.Unlock()
	time.Sleep(took)
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids, deferred []string
	for _, c := range cs {
		ids = append(ids, c.ClaimID)
		if f.defer_ != nil && f.defer_(c) {
			deferred = append(deferred, c.ClaimID)
			continue
		}
		f.applied[c.ClaimID]++
	}
	f.batches = append(f.batches, ids)
	return len(cs) - len(deferred), deferred, nil
}

func (f *fakeStore) sendTo(ctx context.Context, cs []model.Credit, dest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		f.sent[c.ClaimID] = dest
	}
	return nil
}

func (f *fakeStore) count(m map[string]int, id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[id]
}

// savedSince returns the SaveRelayPositions calls after the first n.
func (f *fakeStore) savedSince(n int) []map[int]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.saves[n:])
}

// fixedPeers is a shard map that does not change.
type fixedPeers struct{ m *sharding.Map }

func (p fixedPeers) Map() *sharding.Map { return p.m }

// remoteCall is one delivery the fake network saw.
type remoteCall struct {
	addr     string
	ids      []string
	at       time.Time
	deadline time.Duration // the attempt's deadline, from its start
}

// fakeNet stands in for the other cells: answer decides what each call gets.
type fakeNet struct {
	mu     sync.Mutex
	calls  []remoteCall
	answer func(ctx context.Context, addr string) ([]string, error)
	// copies answers ReconCopy: whether the cell at addr has c applied in its
	// copy (nil: none has).
	copies func(addr string, c model.Credit) (bool, error)
	asked  []string // "addr claim" of every ReconCopy question, in order
}

func (n *fakeNet) ReconCopy(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error) {
	n.mu.Lock()
	copies := n.copies
	for _, c := range cs {
		n.asked = append(n.asked, addr+" "+c.ClaimID)
	}
	n.mu.Unlock()
	out := api.ReconResponse{Missing: []string{}, Mismatched: []string{}}
	for _, c := range cs {
		found := false
		if copies != nil {
			var err error
			if found, err = copies(addr, c); err != nil {
				return api.ReconResponse{}, err
			}
		}
		if found {
			out.Matched++
			out.MatchedCents += int64(c.Amount)
		} else {
			out.Missing = append(out.Missing, c.ClaimID)
		}
	}
	return out, nil
}

func (n *fakeNet) Credits(ctx context.Context, addr string, cs []model.Credit) (api.CreditsResponse, error) {
	ids, err := n.send(ctx, addr, cs)
	return api.CreditsResponse{Deferred: ids}, err
}

func (n *fakeNet) send(ctx context.Context, addr string, cs []model.Credit) ([]string, error) {
	d, _ := ctx.Deadline()
	call := remoteCall{addr: addr, at: time.Now(), deadline: time.Until(d)}
	for _, c := range cs {
		call.ids = append(call.ids, c.ClaimID)
	}
	n.mu.Lock()
	n.calls = append(n.calls, call)
	answer := n.answer
	n.mu.Unlock()
	return answer(ctx, addr)
}

// to returns the calls made to addr.
func (n *fakeNet) to(addr string) []remoteCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []remoteCall
	for _, c := range n.calls {
		if c.addr == addr {
			out = append(out, c)
		}
	}
	return out
}

// stalled answers like a cell that never answers: only when the attempt's
// deadline ends.
func stalled(ctx context.Context) ([]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// stallC answers like cell-c stalled (stalled) and every other cell taking
// every credit.
func stallC(ctx context.Context, addr string) ([]string, error) {
	if addr == "c" {
		return stalled(ctx)
	}
	return nil, nil
}

var errRefused = errors.New("connection refused")

// relayRig is cell-a (shards 0-499) with a real relay over a fake store and a
// fake network; the shard map gives 500-749 to cell-b (addr "b") and 750-999
// to cell-c (addr "c") unless cells says otherwise.
type relayRig struct {
	r     *Relay
	store *fakeStore
	net   *fakeNet
	start time.Time
	stop  func() // stops the relay (flushing) and waits for it
}

// rigOpts is what newRig builds a rig from; every field may be left zero.
type rigOpts struct {
	store *fakeStore      // nil: a new one (a rig over another rig's store: a restart)
	net   *fakeNet        // nil: one that takes every credit
	tune  func(*Config)   // applied to the relay's Config first
	prep  func(r *Relay)  // called before Run
	cells []sharding.Cell // the other cells (nil: cell-b and cell-c)
}

func newRelayRig(t *testing.T, cells ...sharding.Cell) *relayRig {
	t.Helper()
	return newRig(t, rigOpts{cells: cells})
}

// newRelayRigWith is newRelayRig with tune (if not nil) applied to the
// relay's Config first.
func newRelayRigWith(t *testing.T, tune func(*Config), cells ...sharding.Cell) *relayRig {
	t.Helper()
	return newRig(t, rigOpts{tune: tune, cells: cells})
}

func newRig(t *testing.T, o rigOpts) *relayRig {
	t.Helper()
	own, _ := sharding.ParseRanges("0-499")
	cells := o.cells
	if cells == nil {
		b, _ := sharding.ParseRanges("500-749")
		c, _ := sharding.ParseRanges("750-999")
		cells = []sharding.Cell{{Name: "cell-b", Addr: "b", Shards: b}, {Name: "cell-c", Addr: "c", Shards: c}}
	}
	m, _ := sharding.NewMap(append([]sharding.Cell{{Name: "cell-a", Addr: "a", Shards: own}}, cells...))
	store, net := o.store, o.net
	if store == nil {
		store = newFakeStore()
	}
	if net == nil {
		net = &fakeNet{answer: func(context.Context, string) ([]string, error) { return nil, nil }}
	}
	cfg := Config{Cell: "cell-a", Space: "real", Interval: 200 * time.Millisecond, DBs: own.DBs,
		Owns: func(sh model.ShardID) bool { return sh < 500 }, Off: func() bool { return false },
		Store: store, Client: net, Peers: fixedPeers{m}, Log: slog.New(slog.DiscardHandler)}
	if o.tune != nil {
		o.tune(&cfg)
	}
	r := New(cfg)
	if o.prep != nil {
		o.prep(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &relayRig{r: r, store: store, net: net, start: time.Now(), stop: stop}
}

// holds tells whether the relay holds c (not yet known credited).
func (rig *relayRig) holds(c model.Credit) bool {
	rig.r.trackMu.Lock()
	defer rig.r.trackMu.Unlock()
	for _, t := range rig.r.dbs {
		if _, ok := t.pending[c.ClaimID]; ok {
			return true
		}
	}
	return false
}

// held is how many credits the relay holds (Relay.Held).
func (rig *relayRig) held() int {
	n, _ := rig.r.Held()
	return n
}

// appliedOnceNoneHeld checks the end of a run: each of cs applied exactly
// once, and the relay holding no credit.
func (rig *relayRig) appliedOnceNoneHeld(t *testing.T, cs ...model.Credit) {
	t.Helper()
	for _, c := range cs {
		if a := rig.store.count(rig.store.applied, c.ClaimID); a != 1 {
			t.Fatalf("%s applied %d times, want once", c.ClaimID, a)
		}
	}
	if n := rig.held(); n != 0 {
		t.Fatalf("the relay holds %d credits after every one was applied, want 0", n)
	}
}

// credit makes a credit for a claimant of shard sh; n names it. Its packet is
// in a shard cell-a owns (sh%500, database sh%500/10), as every packet whose
// claims its relay delivers is.
func credit(sh model.ShardID, n int) model.Credit { return claimIn(sh%500, sh, n, time.Time{}) }

// claimAt is credit(sh, n) of a claim made at made.
func claimAt(sh model.ShardID, n int, made time.Time) model.Credit {
	return claimIn(sh%500, sh, n, made)
}

// claimIn makes the credit of a claim of a packet of shard pkt (one packet
// per pkt and sh) for a claimant of shard sh, made at made (zero: unknown);
// n names it.
func claimIn(pkt, sh model.ShardID, n int, made time.Time) model.Credit {
	id := model.PacketID(fmt.Sprintf("20260101%03d%03d3456789abcdef", pkt, sh))
	c := model.Credit{ClaimID: fmt.Sprintf("%sc%d", id, n+1), PacketID: id, ActID: fmt.Sprintf("u%d", n), Shard: sh, Amount: 1}
	if !made.IsZero() {
		c.CreatedMS = made.UnixMilli()
	}
	return c
}

func ids(cs ...model.Credit) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ClaimID)
	}
	return out
}

// TestLanesKeepDestinationsApart: cell-c hangs; its credits wait for their
// own lane's timeout (relayAttemptTimeout, also the receiver's deadline), then its backoff,
// while the local credits and cell-b's are delivered within the linger,
// including ones handed over while cell-c's call hangs.
func TestLanesKeepDestinationsApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		rig.net.answer = stallC
		local, toB, toC := credit(10, 0), credit(600, 1), credit(800, 2)
		rig.r.Enqueue([]model.Credit{toC, local, toB})
		if d := rig.r.Stats.Dropped.Load(); d != 0 {
			t.Fatalf("%d credits no lane took, want 0", d)
		}
		testenv.Advance(50 * time.Millisecond)
		if rig.store.count(rig.store.applied, local.ClaimID) != 1 || len(rig.net.to("b")) != 1 || rig.holds(local) || rig.holds(toB) {
			t.Fatalf("after 50 ms: local applied %d times, %d calls to cell-b, held %v %v; want 1, 1, and neither held",
				rig.store.count(rig.store.applied, local.ClaimID), len(rig.net.to("b")), rig.holds(local), rig.holds(toB))
		}
		testenv.Advance(time.Second) // cell-c's first call still hangs
		local2, toB2 := credit(11, 3), credit(601, 4)
		rig.r.Enqueue([]model.Credit{local2, toB2})
		testenv.Advance(50 * time.Millisecond)
		if rig.store.count(rig.store.applied, local2.ClaimID) != 1 || len(rig.net.to("b")) != 2 {
			t.Fatalf("while cell-c hangs: the new local credit applied %d times, %d calls to cell-b; want 1 and 2",
				rig.store.count(rig.store.applied, local2.ClaimID), len(rig.net.to("b")))
		}
		testenv.Advance(relayAttemptTimeout + time.Second) // past the first call's timeout and the backoff
		calls := rig.net.to("c")
		if len(calls) != 2 {
			t.Fatalf("%d calls to cell-c, want 2 (one timing out after %s, one after the 100 ms backoff)", len(calls), relayAttemptTimeout)
		}
		for _, c := range calls {
			if c.deadline != relayAttemptTimeout {
				t.Errorf("a call's deadline was %s after its start, want %s", c.deadline, relayAttemptTimeout)
			}
		}
		if gap := calls[1].at.Sub(calls[0].at); gap != relayAttemptTimeout+relayBackoffMin {
			t.Errorf("second call to cell-c %s after the first, want %s", gap, relayAttemptTimeout+relayBackoffMin)
		}
		if !rig.holds(toC) || rig.held() != 1 {
			t.Errorf("while cell-c hangs: its credit held %v, %d held in all; want it, alone", rig.holds(toC), rig.held())
		}
	})
}

// TestLaneBackoff: a destination that refuses every call is tried after
// 100 ms, then 200 ms, ... up to 5 s between attempts; while the lane backs
// off it takes no credits (the relay holds them); the first success ends
// the backoff, so the next failure waits 100 ms again.
func TestLaneBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		var mu sync.Mutex
		refuse := true
		rig.net.answer = func(ctx context.Context, addr string) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				return nil, errRefused
			}
			return nil, nil
		}
		rig.r.dispatch([]model.Credit{credit(600, 0)}, time.Time{})
		testenv.Advance(20 * time.Second)
		calls := rig.net.to("b")
		var gaps []time.Duration
		for i := 1; i < len(calls); i++ {
			gaps = append(gaps, calls[i].at.Sub(calls[i-1].at))
		}
		ms := time.Millisecond
		want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms}
		if !slices.Equal(gaps[:min(len(gaps), len(want))], want) {
			t.Fatalf("gaps between attempts %v, want %v then 5 s", gaps, want)
		}
		if left := rig.r.dispatch([]model.Credit{credit(601, 1)}, time.Time{}); left != 1 {
			t.Fatalf("a lane backing off took a credit (left %d, want 1)", left)
		}
		mu.Lock()
		refuse = false
		mu.Unlock()
		testenv.Advance(relayBackoffMax)
		n := len(rig.net.to("b"))
		mu.Lock()
		refuse = true
		mu.Unlock()
		rig.r.dispatch([]model.Credit{credit(602, 2)}, time.Time{})
		testenv.Advance(time.Second)
		calls = rig.net.to("b")
		if len(calls) < n+2 || calls[n+1].at.Sub(calls[n].at) != relayBackoffMin {
			t.Fatalf("after a success, a failure then the next attempt: %d calls; want the retry 100 ms after the failure", len(calls)-n)
		}
	})
}

// TestLaneBoundAndNoDoubleHandOff: with its deliveries stuck, a lane holds at
// most laneDepthMax credits, the relay the rest; the offers of every held
// credit meanwhile (every 2 Intervals) hand it nothing it holds. Once
// deliveries go through, each credit is applied exactly once, the ones it
// had no room for through a later offer, and the relay holds nothing.
func TestLaneBoundAndNoDoubleHandOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		stuck := make(chan struct{})
		rig.store.release = stuck
		var all []model.Credit
		for i := range laneDepthMax + 100 {
			all = append(all, credit(model.ShardID(i%500), i))
		}
		rig.r.Enqueue(all)
		if d := rig.r.Stats.Dropped.Load(); d != 100 {
			t.Fatalf("%d credits no lane took, want the 100 beyond the lane's bound", d)
		}
		testenv.Advance(time.Second + 50*time.Millisecond) // five Intervals
		if held, _ := rig.r.local.state(); held != laneDepthMax {
			t.Fatalf("the lane holds %d credits, want %d", held, laneDepthMax)
		}
		if n := rig.held(); n != len(all) {
			t.Fatalf("the relay holds %d credits, want %d", n, len(all))
		}
		close(stuck)
		testenv.Advance(2 * time.Second)
		rig.appliedOnceNoneHeld(t, all...)
	})
}

// TestReadDoesNotHoldWhatWasJustDelivered: after a restart the relay reads a
// claim past the saved position; before it holds the credit and hands it
// over, the lane (given it fresh by the open path meanwhile) delivers it.
// Neither the lane nor the relay takes it again from that read: it is
// applied once and the relay holds nothing.
func TestReadDoesNotHoldWhatWasJustDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newFakeStore()
		x := claimAt(30, 0, time.Now().Add(-time.Second))
		store.addClaims(x)
		applying, reading := make(chan struct{}), make(chan struct{})
		store.release, store.readGap = applying, reading
		rig := newRig(t, rigOpts{store: store})
		rig.r.Enqueue([]model.Credit{x})        // its delivery waits for applying
		testenv.Advance(300 * time.Millisecond) // the tick at 200 ms has read x and waits for reading
		close(applying)                         // x is delivered, acknowledged and let go
		synctest.Wait()
		close(reading) // the read hands x over
		testenv.Advance(2 * time.Second)
		rig.appliedOnceNoneHeld(t, x)
	})
}

// TestLaneDeferredCredit: a credit whose wallet row is locked is deferred
// three times: the lane tries it again after 100, 200 and 400 ms, and the
// relay holds it until it is applied; the other credits of its batch, and
// credits handed over meanwhile, are applied at once and let go.
func TestLaneDeferredCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		locked := credit(20, 0)
		tries := []time.Time{}
		rig.store.defer_ = func(c model.Credit) bool {
			if c.ClaimID != locked.ClaimID {
				return false
			}
			tries = append(tries, time.Now())
			return len(tries) <= 3
		}
		others := []model.Credit{credit(21, 1), credit(22, 2)}
		rig.r.Enqueue(append([]model.Credit{locked}, others...))
		testenv.Advance(50 * time.Millisecond)
		for _, c := range others {
			if a := rig.store.count(rig.store.applied, c.ClaimID); a != 1 || rig.holds(c) {
				t.Fatalf("%s applied %d times, held %v; want 1, let go", c.ClaimID, a, rig.holds(c))
			}
		}
		if !rig.holds(locked) || rig.held() != 1 {
			t.Fatalf("the deferred credit held %v, %d held in all; want it, alone", rig.holds(locked), rig.held())
		}
		later := credit(23, 3)
		rig.r.Enqueue([]model.Credit{later})
		testenv.Advance(50 * time.Millisecond)
		if a := rig.store.count(rig.store.applied, later.ClaimID); a != 1 {
			t.Fatalf("a credit handed over while another waits: applied %d times, want 1", a)
		}
		testenv.Advance(2 * time.Second)
		rig.store.mu.Lock() // defer_ runs under it
		defer rig.store.mu.Unlock()
		var gaps []time.Duration
		for i := 1; i < len(tries); i++ {
			gaps = append(gaps, tries[i].Sub(tries[i-1]).Round(10*time.Millisecond))
		}
		ms := time.Millisecond
		if !slices.Equal(gaps, []time.Duration{100 * ms, 200 * ms, 400 * ms}) {
			t.Errorf("gaps between tries of the deferred credit %v, want [100ms 200ms 400ms]", gaps)
		}
		if a := rig.store.applied[locked.ClaimID]; a != 1 {
			t.Errorf("the deferred credit applied %d times, want once", a)
		}
		if n := rig.r.Stats.Deferred.Load(); n != 3 {
			t.Errorf("relayDeferred %d, want 3", n)
		}
		if n, _ := rig.r.Held(); n != 0 {
			t.Errorf("the relay holds %d credits once the deferred one is applied, want 0", n)
		}
	})
}

// TestRelayStopFlushes: when the cell stops, each lane delivers what it holds
// at once (not after the linger, not waiting for the scan), and all of it
// within relayFlushMax even when a destination hangs (one try, bounded by the
// attempt timeout); the relay still holds the hanging cell's credits when
// it stops (read again past their position at the next start).
func TestRelayStopFlushes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		rig.net.answer = stallC
		cs := []model.Credit{credit(10, 0), credit(600, 1), credit(800, 2), credit(11, 3)}
		rig.r.Enqueue(cs)
		start := time.Now()
		rig.stop()
		if took := time.Since(start); took > relayFlushMax {
			t.Errorf("stopping took %s, want at most %s", took, relayFlushMax)
		}
		for i, want := range []bool{false, false, true, false} {
			if h := rig.holds(cs[i]); h != want {
				t.Errorf("credit %d held %v after the stop, want %v", i, h, want)
			}
		}
		for _, i := range []int{0, 3} {
			if a := rig.store.count(rig.store.applied, cs[i].ClaimID); a != 1 {
				t.Errorf("local credit %d applied %d times, want 1", i, a)
			}
		}
		if b := rig.net.to("b"); len(b) != 1 || !slices.Equal(b[0].ids, ids(cs[1])) {
			t.Errorf("calls to cell-b: %+v", b)
		}
		if len(rig.net.to("c")) != 1 {
			t.Errorf("%d calls to cell-c, want 1", len(rig.net.to("c")))
		}
		if left := rig.r.dispatch(cs, time.Time{}); left != len(cs) {
			t.Errorf("a stopped relay took %d credits, want none", len(cs)-left)
		}
	})
}

// TestLanesBoundedAndRetired: at most lanesMax lanes to other cells; credits
// for one more cell are left to the relay. A lane that held nothing for
// laneIdleStop stops; the next credit for its cell starts it again.
func TestLanesBoundedAndRetired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cells []sharding.Cell
		var cs []model.Credit
		for i := range lanesMax + 1 {
			sh := model.ShardID(500 + i)
			cells = append(cells, sharding.Cell{Name: fmt.Sprintf("cell-%03d", i), Addr: fmt.Sprint(i), Shards: sharding.Ranges{{From: sh, To: sh}}})
			cs = append(cs, credit(sh, i))
		}
		rig := newRelayRig(t, cells...)
		if left := rig.r.dispatch(cs[:lanesMax], time.Time{}); left != 0 {
			t.Fatalf("%d credits no lane took, want 0", left)
		}
		if left := rig.r.dispatch(cs[lanesMax:], time.Time{}); left != 1 {
			t.Fatalf("a credit for a cell beyond %d lanes was taken", lanesMax)
		}
		if n := len(rig.r.lanes()); n != lanesMax {
			t.Fatalf("%d lanes, want %d", n, lanesMax)
		}
		testenv.Advance(laneIdleStop + time.Second)
		if n := len(rig.r.lanes()); n != 0 {
			t.Fatalf("%d lanes after they held nothing for %s, want 0", n, laneIdleStop)
		}
		if left := rig.r.dispatch(cs[lanesMax:], time.Time{}); left != 0 {
			t.Fatalf("the last cell's credit was not taken after the others retired")
		}
		testenv.Advance(50 * time.Millisecond)
		if n := len(rig.net.to(fmt.Sprint(lanesMax))); n != 1 {
			t.Fatalf("%d calls to the last cell, want 1", n)
		}
	})
}

// lagLog records what Config.CreditLag observes.
type lagLog struct {
	mu   sync.Mutex
	lags []time.Duration
	kind []bool
}

func (g *lagLog) observe(local bool, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lags, g.kind = append(g.lags, d), append(g.kind, local)
}

func (g *lagLog) seen() ([]time.Duration, []bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.lags), slices.Clone(g.kind)
}

// TestLanesYieldToOpens: while the load probe says the cell is loaded, a
// lane holds back a small batch for YieldMax (not longer) and delivers a full
// one at once; when the load drops it catches up within yieldPoll and the
// linger. The remote lane yields as the local one does.
func TestLanesYieldToOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var busy atomic.Bool
		busy.Store(true)
		rig := newRelayRigWith(t, func(c *Config) { c.Busy = busy.Load })
		small := []model.Credit{credit(10, 0), credit(11, 1), credit(600, 2)}
		rig.r.dispatch(small, time.Time{})
		testenv.Advance(YieldMax - 10*time.Millisecond)
		if n, calls := rig.store.count(rig.store.applied, small[0].ClaimID), len(rig.net.to("b")); n != 0 || calls != 0 {
			t.Fatalf("loaded, before YieldMax: local credit applied %d times, %d calls to cell-b; want none", n, calls)
		}
		if y := rig.r.Stats.Yields.Load(); y != 2 {
			t.Errorf("%d yields, want 2 (one per lane)", y)
		}
		testenv.Advance(10*time.Millisecond + yieldPoll)
		for _, c := range small[:2] {
			if n := rig.store.count(rig.store.applied, c.ClaimID); n != 1 {
				t.Errorf("loaded, after YieldMax: %s applied %d times, want 1", c.ClaimID, n)
			}
		}
		if calls := len(rig.net.to("b")); calls != 1 {
			t.Errorf("loaded, after YieldMax: %d calls to cell-b, want 1", calls)
		}

		full := make([]model.Credit, BatchMax)
		for i := range full {
			full[i] = credit(model.ShardID(20+i%400), 100+i)
		}
		rig.r.dispatch(full, time.Time{})
		testenv.Advance(time.Millisecond)
		if n := rig.store.count(rig.store.applied, full[BatchMax-1].ClaimID); n != 1 {
			t.Errorf("loaded, a full batch: applied %d times at once, want 1", n)
		}

		late := []model.Credit{credit(30, 900), credit(31, 901)}
		rig.r.dispatch(late, time.Time{})
		testenv.Advance(50 * time.Millisecond)
		if n := rig.store.count(rig.store.applied, late[0].ClaimID); n != 0 {
			t.Fatalf("loaded: a small batch applied after 50 ms, want it held back")
		}
		busy.Store(false)
		testenv.Advance(yieldPoll + Linger)
		for _, c := range late {
			if n := rig.store.count(rig.store.applied, c.ClaimID); n != 1 {
				t.Errorf("load dropped: %s applied %d times within %s, want 1", c.ClaimID, n, yieldPoll+Linger)
			}
		}
	})
}

// TestCreditLagObserved: every credit a delivery acknowledges is observed
// once with the time since its claim's creation, by lane kind; a credit the
// receiver deferred is observed only when a later delivery applies it, and
// one without a creation time is not observed.
func TestCreditLagObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lags lagLog
		rig := newRelayRigWith(t, func(c *Config) { c.CreditLag = lags.observe })
		made := time.Now().Add(-time.Second)
		local, remote, deferred, unknown := credit(10, 0), credit(600, 1), credit(11, 2), credit(12, 3)
		for _, c := range []*model.Credit{&local, &remote, &deferred} {
			c.CreatedMS = made.UnixMilli()
		}
		rig.store.defer_ = func(c model.Credit) bool {
			return c.ClaimID == deferred.ClaimID && time.Since(made) < 1500*time.Millisecond
		}
		rig.r.dispatch([]model.Credit{local, remote, deferred, unknown}, time.Time{})
		testenv.Advance(Linger + time.Millisecond)
		got, kinds := lags.seen()
		if len(got) != 2 {
			t.Fatalf("observed %d lags after the first deliveries, want 2 (local and remote; none deferred or unknown)", len(got))
		}
		for i, d := range got {
			if d < time.Second || d > time.Second+Linger {
				t.Errorf("lag %d (local %v): %s, want 1 s (the claim made 1 s before the dispatch) to 1 s + the linger", i, kinds[i], d)
			}
		}
		if kinds[0] == kinds[1] {
			t.Errorf("both lags of lane kind local=%v, want one of each", kinds[0])
		}
		testenv.Advance(time.Second) // the deferred credit's backoff (100 ms, 200 ms, ...) runs past 1.5 s
		got, _ = lags.seen()
		if len(got) != 3 || got[2] < 1500*time.Millisecond {
			t.Fatalf("after the deferral: lags %v, want a third of at least 1.5 s", got)
		}
	})
}

// TestLaneShrinksAfterTimeouts: a local store too slow to book a full batch
// within the attempt's time makes the lane halve its batches (500, 250, 125)
// instead of rolling back the same 500 again and again; once batches go
// through, each success doubles the size back towards BatchMax.
func TestLaneShrinksAfterTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		release := make(chan struct{})
		rig.store.release = release
		cs := make([]model.Credit, 600)
		for i := range cs {
			cs[i] = credit(model.ShardID(i%500), i)
		}
		rig.r.Enqueue(cs)
		testenv.Advance(2*relayLocalTimeout + time.Second) // two attempts time out (500, then 250), the third (125) waits
		rig.store.mu.Lock()
		rig.store.release = nil
		rig.store.mu.Unlock()
		close(release)
		testenv.Advance(time.Second)
		rig.store.mu.Lock()
		var sizes []int
		for _, b := range rig.store.batches {
			sizes = append(sizes, len(b))
		}
		rig.store.mu.Unlock()
		if want := []int{125, 250, 225}; !slices.Equal(sizes, want) {
			t.Errorf("batches applied: %v, want %v", sizes, want)
		}
		rig.appliedOnceNoneHeld(t, cs...)
	})
}

// TestReadsOnlyWhereNeeded: the first Interval reads the saved positions of
// every database the cell serves, in one call, and the claims past them,
// once per database (one page each here: none is full); the Intervals after
// read nothing while nothing calls for it. A database the cell gains is
// read from its position at the next Interval, once; one it loses is no
// longer read or saved.
func TestReadsOnlyWhereNeeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var gained atomic.Bool
		own, _ := sharding.ParseRanges("0-499")
		more, _ := sharding.ParseRanges("10-509")
		rig := newRelayRigWith(t, func(c *Config) {
			c.DBs = func() []int {
				if gained.Load() {
					return more.DBs() // gains database 50, loses 0
				}
				return own.DBs()
			}
			c.Owns = func(sh model.ShardID) bool {
				if gained.Load() {
					return sh >= 10 && sh < 510
				}
				return sh < 500
			}
		})
		rig.store.mu.Lock()
		rig.store.positions[50] = time.Now().Add(-time.Minute).UnixMilli()
		rig.store.mu.Unlock()
		snapshot := func() (map[int]int, [][]int, map[int][]int64) {
			rig.store.mu.Lock()
			defer rig.store.mu.Unlock()
			return maps.Clone(rig.store.reads), slices.Clone(rig.store.posReads), maps.Clone(rig.store.froms)
		}
		testenv.Advance(300 * time.Millisecond) // the first Interval, at 200 ms
		reads, posReads, froms := snapshot()
		if len(posReads) != 1 || !slices.Equal(posReads[0], own.DBs()) {
			t.Fatalf("positions read %v, want the 50 databases in one call", posReads)
		}
		if len(reads) != 50 || reads[0] != 1 || reads[49] != 1 || froms[7][0] != 0 {
			t.Fatalf("after the first Interval: reads %v (database 7 from %v), want each of the 50 databases once, from its first claim (no position saved)", reads, froms[7])
		}
		testenv.Advance(2 * time.Second) // ten more Intervals
		if again, posAgain, _ := snapshot(); !maps.Equal(again, reads) || len(posAgain) != 1 {
			t.Fatalf("Intervals with nothing to read read claims %v and positions %v, want nothing more", again, posAgain)
		}
		if n := rig.r.Stats.Scans.Load(); n != 11 {
			t.Errorf("%d Intervals worked by 2.3 s, want 11", n)
		}
		saves := len(rig.store.savedSince(0))
		gained.Store(true)
		testenv.Advance(time.Second)
		reads, posReads, froms = snapshot()
		if len(posReads) != 2 || !slices.Equal(posReads[1], []int{50}) {
			t.Fatalf("positions read %v, want database 50's alone after the first", posReads)
		}
		if reads[50] != 1 || froms[50][0] != rig.store.positions[50] {
			t.Errorf("database 50 read %d times from %v, want once from its saved position %d", reads[50], froms[50], rig.store.positions[50])
		}
		for db, n := range reads {
			if db != 50 && n != 1 {
				t.Errorf("database %d read %d times, want once (at the start)", db, n)
			}
		}
		rig.r.Enqueue([]model.Credit{claimAt(5, 0, time.Now())}) // database 0, lost: held until the next Interval forgets it
		testenv.Advance(PositionEvery)
		for _, pos := range rig.store.savedSince(saves) {
			if _, ok := pos[0]; ok {
				t.Errorf("saved a position of database 0, which the cell no longer serves: %v", pos)
			}
		}
		if n := rig.held(); n != 0 {
			t.Errorf("the relay holds %d credits of a database it no longer serves, want 0", n)
		}
	})
}

// TestCreditAppliedOnceAcrossCells: before a credit goes to a cell other
// than the one its claim row says it was sent to (Credit.Dest), the relay
// asks that cell's copy of the claimant's database. Found there and not
// where the database is served now: not delivered again, acknowledged
// (Stats.Elsewhere); found at both (moved with its rows): acknowledged, not
// counted. Not found: recorded as sent to the new destination (SendTo),
// delivered. That cell not in the map: recorded as sent to the new
// destination and delivered unasked (Stats.Unasked). That cell unable to
// answer: held by the relay (Stats.Held) and asked about again. A claim
// sent nowhere else, or never sent, is delivered without a question.
func TestCreditAppliedOnceAcrossCells(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		rig.net.copies = func(addr string, c model.Credit) (bool, error) {
			return addr == "c" && (c.ActID == "u0" || c.ActID == "u3" || c.ActID == "u7") || addr == "b" && c.ActID == "u7", nil
		}
		x, y, z := credit(600, 0), credit(601, 1), credit(602, 2) // cell-b's claimants
		w, v, u := credit(10, 3), credit(11, 4), credit(603, 5)   // cell-a's, cell-a's, cell-b's
		r := credit(605, 7)                                       // cell-b's, found at cell-c and cell-b: moved with its rows
		x.Dest, y.Dest, z.Dest, w.Dest, v.Dest, r.Dest = "cell-c", "cell-c", "cell-gone", "cell-c", "cell-a", "cell-c"
		all := []model.Credit{x, y, z, w, v, u, r}
		rig.r.Enqueue(all)
		if d := rig.r.Stats.Dropped.Load(); d != 0 {
			t.Fatalf("%d credits no lane took, want 0", d)
		}
		testenv.Advance(100 * time.Millisecond)
		var sentB []string
		for _, c := range rig.net.to("b") {
			sentB = append(sentB, c.ids...)
		}
		slices.Sort(sentB)
		if want := slices.Sorted(slices.Values(ids(y, z, u))); !slices.Equal(sentB, want) {
			t.Errorf("delivered to cell-b: %v, want %v (y not found at cell-c, z's cell gone, u never sent elsewhere)", sentB, want)
		}
		if a := rig.store.count(rig.store.applied, v.ClaimID); a != 1 {
			t.Errorf("v applied %d times here, want 1", a)
		}
		if a := rig.store.count(rig.store.applied, w.ClaimID); a != 0 {
			t.Errorf("w, applied at cell-c's copy, applied %d times here, want 0", a)
		}
		for _, c := range all {
			if rig.holds(c) {
				t.Errorf("%s (%s) still held, want acknowledged", c.ClaimID, c.ActID)
			}
		}
		rig.store.mu.Lock()
		sent := maps.Clone(rig.store.sent)
		rig.store.mu.Unlock()
		if want := map[string]string{y.ClaimID: "cell-b", z.ClaimID: "cell-b", u.ClaimID: "cell-b"}; !maps.Equal(sent, want) {
			t.Errorf("recorded as sent before delivery: %v, want %v (the two delivered to another cell than their rows named, and u, whose row named none)", sent, want)
		}
		rig.net.mu.Lock()
		asked := slices.Sorted(slices.Values(rig.net.asked))
		rig.net.mu.Unlock()
		// x, y, w, r at cell-c; then the found ones where they are served: x and r at cell-b, w here.
		if wantAsked := slices.Sorted(slices.Values([]string{"c " + x.ClaimID, "c " + y.ClaimID, "c " + w.ClaimID, "c " + r.ClaimID,
			"b " + x.ClaimID, "b " + r.ClaimID, "a " + w.ClaimID})); !slices.Equal(asked, wantAsked) {
			t.Errorf("asked %v, want %v", asked, wantAsked)
		}
		if e, h, un := rig.r.Stats.Elsewhere.Load(), rig.r.Stats.Held.Load(), rig.r.Stats.Unasked.Load(); e != 2 || h != 0 || un != 1 {
			t.Errorf("Stats.Elsewhere %d, Held %d, Unasked %d; want 2, 0 and 1", e, h, un)
		}

		// cell-c cannot answer: the relay holds its credits and asks about
		// them again at its next offers.
		rig.net.mu.Lock()
		rig.net.copies = func(string, model.Credit) (bool, error) { return false, errRefused }
		rig.net.mu.Unlock()
		callsB := len(rig.net.to("b"))
		q := credit(604, 6)
		q.Dest = "cell-c"
		rig.r.Enqueue([]model.Credit{q})
		testenv.Advance(100 * time.Millisecond)
		if a := len(rig.net.to("b")); a != callsB || !rig.holds(q) {
			t.Errorf("while cell-c cannot answer: %d calls to cell-b (want still %d), q held %v (want true)", a, callsB, rig.holds(q))
		}
		if h := rig.r.Stats.Held.Load(); h != 1 {
			t.Errorf("Stats.Held %d, want 1", h)
		}
		testenv.Advance(time.Second) // offered again at the Intervals 2 and 4 after (600 ms and 1 s)
		if h := rig.r.Stats.Held.Load(); h < 2 || !rig.holds(q) {
			t.Errorf("after a second: Stats.Held %d, q held %v; want it asked about again, and held", h, rig.holds(q))
		}
		rig.net.mu.Lock()
		rig.net.copies = nil // cell-c answers: not there
		rig.net.mu.Unlock()
		testenv.Advance(time.Second)
		rig.store.mu.Lock()
		sentQ := rig.store.sent[q.ClaimID]
		rig.store.mu.Unlock()
		if rig.holds(q) || sentQ != "cell-b" || len(rig.net.to("b")) != callsB+1 {
			t.Errorf("cell-c answering again: q held %v, sent to %q, %d calls to cell-b; want delivered to cell-b, once", rig.holds(q), sentQ, len(rig.net.to("b"))-callsB)
		}
	})
}

// TestRelayBehind: Behind is the age of the oldest fresh credit a lane
// holds, in flight or queued, from its claim's creation (from when the lane
// took it when that is unknown): not a credit a scan found, nor one the
// receiver deferred, nor those of a lane backing off after a failure, nor
// any while the relay is switched off.
func TestRelayBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var off atomic.Bool
		rig := newRelayRigWith(t, func(c *Config) { c.Off = off.Load })
		rig.net.answer = func(context.Context, string) ([]string, error) { return nil, errRefused }
		release := make(chan struct{})
		rig.store.release = release // the local lane's delivery waits
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Fatalf("holding nothing: behind %s, want 0", b)
		}
		old := credit(12, 9)
		old.CreatedMS = time.Now().Add(-time.Hour).UnixMilli()
		rig.r.dispatch([]model.Credit{old}, time.Now()) // found by a scan: a backlog, not counted
		fresh, unknown := credit(10, 0), credit(13, 3)
		fresh.CreatedMS = time.Now().Add(-500 * time.Millisecond).UnixMilli()
		rig.r.dispatch([]model.Credit{fresh, unknown, credit(600, 1)}, time.Time{})
		testenv.Advance(time.Second)
		// The local attempt is in flight since the linger; cell-b refused
		// its credit, and that lane backs off: not counted.
		if b := rig.r.Behind(time.Now()); b != 1500*time.Millisecond {
			t.Errorf("local delivery in flight for 1 s, its claim made 0.5 s before: behind %s, want 1.5s (not the scan's credit's age, nor the failing lane's)", b)
		}
		off.Store(true)
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("relay switched off: behind %s, want 0", b)
		}
		off.Store(false)

		rig.store.defer_ = func(c model.Credit) bool { return c.ClaimID == credit(11, 2).ClaimID }
		rig.r.dispatch([]model.Credit{credit(11, 2)}, time.Time{}) // queued behind the attempt in flight
		rig.store.mu.Lock()
		rig.store.release = nil
		rig.store.mu.Unlock()
		close(release)
		testenv.Advance(50 * time.Millisecond)
		if n := rig.store.count(rig.store.applied, fresh.ClaimID); n != 1 {
			t.Fatalf("local credit applied %d times after the release, want 1", n)
		}
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("only a deferred credit held (and a failing lane's): behind %s, want 0", b)
		}
	})
}

// TestRelayBehindRemoteStall: a lane to another cell counts while its
// attempt has run up to remoteStall, not after (the peer is stalled); the
// credits it held through the failed attempt are a backlog when the peer
// answers again, not a lag to shed opens for.
func TestRelayBehindRemoteStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		var mu sync.Mutex
		hang := true
		rig.net.answer = func(ctx context.Context, addr string) ([]string, error) {
			mu.Lock()
			h := hang
			mu.Unlock()
			if h {
				return stalled(ctx)
			}
			select {
			case <-time.After(200 * time.Millisecond):
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		rig.r.Enqueue([]model.Credit{credit(600, 1)})
		testenv.Advance(Linger + 100*time.Millisecond)
		if b := rig.r.Behind(time.Now()); b != Linger+100*time.Millisecond {
			t.Errorf("remote attempt in flight 100 ms: behind %s, want %s", b, Linger+100*time.Millisecond)
		}
		testenv.Advance(remoteStall)
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("remote attempt in flight over %s: behind %s, want 0 (stalled peer)", remoteStall, b)
		}
		rig.r.Enqueue([]model.Credit{credit(601, 2)}) // queued behind the stalled attempt
		mu.Lock()
		hang = false
		mu.Unlock()
		// The attempt fails at its 5 s bound, the lane backs off 100 ms, and
		// the retry (both credits) takes 200 ms: look in its middle.
		testenv.Advance(Linger + relayAttemptTimeout + relayBackoffMin + 100*time.Millisecond - (Linger + 100*time.Millisecond + remoteStall))
		if calls := len(rig.net.to("b")); calls != 2 {
			t.Fatalf("%d calls to cell-b, want 2 (the stalled one and the retry in flight)", calls)
		}
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("retry in flight after a failure: behind %s, want 0 (its credits are a backlog)", b)
		}
		testenv.Advance(200 * time.Millisecond)
		if calls := rig.net.to("b"); len(calls) != 2 || !slices.Equal(calls[1].ids, ids(credit(600, 1), credit(601, 2))) {
			t.Errorf("calls to cell-b %+v, want the retry to carry both credits", calls)
		}
		if n := rig.held(); n != 0 {
			t.Errorf("the relay holds %d credits after the retry, want 0", n)
		}
	})
}

// TestLaneLingersWhileCreditsFlow: a lone credit is delivered after one
// Linger; a lane whose credits keep coming (LingerFlow or more per Linger)
// waits again, and delivers them in batches of LingerMax's worth, each
// credit within LingerMax and a Linger of its claim; a trickle below
// LingerFlow goes one credit a batch, each after one Linger.
func TestLaneLingersWhileCreditsFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lags lagLog
		rig := newRelayRigWith(t, func(c *Config) { c.CreditLag = lags.observe })
		sizes := func() []int {
			rig.store.mu.Lock()
			defer rig.store.mu.Unlock()
			var out []int
			for _, b := range rig.store.batches {
				out = append(out, len(b))
			}
			rig.store.batches = nil
			return out
		}
		n := 0
		next := func() model.Credit { n++; return claimAt(10, n, time.Now()) }

		rig.r.Enqueue([]model.Credit{next()})
		testenv.Advance(Linger + time.Millisecond)
		if got := sizes(); !slices.Equal(got, []int{1}) {
			t.Fatalf("a lone credit: batches %v after one linger, want [1]", got)
		}

		// A flow of 600 credits a second (12 per Linger) for 400 ms.
		for range 80 {
			rig.r.Enqueue([]model.Credit{next(), next(), next()})
			testenv.Advance(5 * time.Millisecond)
		}
		testenv.Advance(LingerMax + Linger)
		got := sizes()
		total := 0
		for _, s := range got {
			total += s
		}
		if total != 240 || len(got) > 4 || slices.Max(got) < 90 {
			t.Fatalf("a flow of 240 credits over 400 ms: batches %v, want them all in at most 4 batches of up to LingerMax's worth (about 120)", got)
		}
		lagsSeen, _ := lags.seen()
		for i, d := range lagsSeen[1:] {
			if d > LingerMax+Linger {
				t.Fatalf("credit %d of the flow waited %s, want at most LingerMax + Linger (%s)", i, d, LingerMax+Linger)
			}
		}

		// The same flow for 1 s, each delivery taking 30 ms: what comes
		// during a delivery lingers too, so no batch but the last is small.
		rig.store.mu.Lock()
		rig.store.took = 30 * time.Millisecond
		rig.store.mu.Unlock()
		for range 200 {
			rig.r.Enqueue([]model.Credit{next(), next(), next()})
			testenv.Advance(5 * time.Millisecond)
		}
		testenv.Advance(LingerMax + Linger + 30*time.Millisecond)
		got = sizes()
		total = 0
		for i, s := range got {
			total += s
			if s < 60 && i < len(got)-1 {
				t.Fatalf("a flow of 600 credits a second with deliveries of 30 ms: batches %v, want each but the last of 60 or more", got)
			}
		}
		if total != 600 || len(got) > 8 {
			t.Fatalf("a flow of 600 credits over 1 s with deliveries of 30 ms: batches %v, want all 600 in at most 8", got)
		}
		rig.store.mu.Lock()
		rig.store.took = 0
		rig.store.mu.Unlock()

		// A trickle: one credit every 30 ms.
		for range 10 {
			rig.r.Enqueue([]model.Credit{next()})
			testenv.Advance(30 * time.Millisecond)
		}
		synctest.Wait()
		if got := sizes(); len(got) != 10 || slices.Max(got) != 1 {
			t.Fatalf("a trickle of 10 credits 30 ms apart: batches %v, want 10 of 1", got)
		}
		if c := rig.store.count(rig.store.applied, claimAt(10, 1, time.Time{}).ClaimID); c != 1 {
			t.Fatalf("the first credit applied %d times, want 1", c)
		}
	})
}
