package relay

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// These tests drive what the relay holds and what it keeps in the store:
// fresh claims held until a delivery is acknowledged, offered again when no
// lane took them, per-database positions saved every PositionEvery and read
// back after a restart, MarkDB, Reset and the HeldMax bound. The rig and
// the fakes are lane_test.go's.

// seedPositions saves position at for every database cell-a serves, as a
// relay before this one would have.
func seedPositions(s *fakeStore, at time.Time) {
	own, _ := sharding.ParseRanges("0-499")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, db := range own.DBs() {
		s.positions[db] = at.UnixMilli()
	}
}

// seededStore is a new fake store with every position of cell-a saved age
// before now (seedPositions); it returns now too.
func seededStore(age time.Duration) (*fakeStore, time.Time) {
	store, t0 := newFakeStore(), time.Now()
	seedPositions(store, t0.Add(-age))
	return store, t0
}

// hungC is a hangable with cell-c hung (hangC).
func hungC() *hangable {
	h := &hangable{}
	h.hangC()
	return h
}

// hangable answers like cell-b and cell-c, except that a call to cell-c
// waits, while hung, for release or for its deadline.
type hangable struct {
	mu   sync.Mutex
	hang chan struct{} // nil: cell-c answers
}

func (h *hangable) hangC() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hang = make(chan struct{})
}

func (h *hangable) releaseC() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.hang)
	h.hang = nil
}

func (h *hangable) answer(ctx context.Context, addr string) ([]string, error) {
	h.mu.Lock()
	hang := h.hang
	h.mu.Unlock()
	if addr != "c" || hang == nil {
		return nil, nil
	}
	select {
	case <-hang:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// sentIDs lists the claim IDs of every call to addr, in order.
func sentIDs(n *fakeNet, addr string) []string {
	var out []string
	for _, c := range n.to(addr) {
		out = append(out, c.ids...)
	}
	return out
}

// TestHeldUntilAcknowledged: a fresh claim is held from Enqueue until a
// delivery is acknowledged, then forgotten: Held counts it (and its creation
// time as the oldest) while its delivery waits, and goes to 0 after. A
// claim handed over twice is held once.
func TestHeldUntilAcknowledged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		release := make(chan struct{})
		rig.store.release = release // the local delivery waits
		made := time.Now().Add(-time.Second)
		x, y := claimAt(10, 0, made), claimAt(600, 1, made.Add(time.Millisecond))
		rig.r.Enqueue([]model.Credit{x, y})
		if n, oldest := rig.r.Held(); n != 2 || oldest != x.CreatedMS {
			t.Fatalf("after Enqueue: Held %d, oldest %d; want 2, %d", n, oldest, x.CreatedMS)
		}
		testenv.Advance(100 * time.Millisecond)
		if n, oldest := rig.r.Held(); n != 1 || oldest != x.CreatedMS || !rig.holds(x) || rig.holds(y) {
			t.Fatalf("cell-b acknowledged y, x's delivery waits: Held %d, oldest %d, x held %v, y held %v; want 1, %d, x alone",
				n, oldest, rig.holds(x), rig.holds(y), x.CreatedMS)
		}
		rig.r.Enqueue([]model.Credit{x})
		if n := rig.held(); n != 1 {
			t.Fatalf("x handed over again: Held %d, want 1", n)
		}
		close(release)
		testenv.Advance(100 * time.Millisecond)
		if n, oldest := rig.r.Held(); n != 0 || oldest != 0 {
			t.Fatalf("both acknowledged: Held %d, oldest %d; want 0, 0", n, oldest)
		}
		if a, r := rig.store.count(rig.store.applied, x.ClaimID), rig.r.Stats.Relayed.Load(); a != 1 || r != 2 {
			t.Fatalf("x applied %d times, Stats.Relayed %d; want 1 and 2", a, r)
		}
	})
}

// TestUntakenOfferedAgain: a fresh claim no lane took (its lane backs off)
// is held and offered again at the first Interval at least reofferIntervals
// Intervals after it was offered (within 3 Intervals), then delivered; one
// whose claimant's shard has no owner is offered again every 2 Intervals,
// each time counted as an error, and stays held.
func TestUntakenOfferedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := sharding.ParseRanges("500-749") // 750-999: no owner
		rig := newRelayRig(t, sharding.Cell{Name: "cell-b", Addr: "b", Shards: b})
		var calls atomic.Int64
		rig.net.answer = func(context.Context, string) ([]string, error) {
			if calls.Add(1) == 1 {
				return nil, errRefused // the lane backs off 100 ms
			}
			return nil, nil
		}
		nobody := credit(900, 9)
		rig.r.Enqueue([]model.Credit{credit(600, 0), nobody})
		if e := rig.r.Stats.Errors.Load(); e != 1 {
			t.Fatalf("Stats.Errors %d after a claim with no owner, want 1", e)
		}
		testenv.Advance(50 * time.Millisecond) // refused at 20 ms: backing off
		x := credit(601, 1)
		rig.r.Enqueue([]model.Credit{x})
		if d := rig.r.Stats.Dropped.Load(); d != 2 || !rig.holds(x) {
			t.Fatalf("Stats.Dropped %d, x held %v; want 2 (the claim with no owner, x), held", d, rig.holds(x))
		}
		testenv.Advance(540 * time.Millisecond) // 590 ms: the Intervals at 200 and 400 ms did not offer x again
		if slices.Contains(sentIDs(rig.net, "b"), x.ClaimID) || !rig.holds(x) {
			t.Fatalf("x offered again before 2 Intervals: sent to cell-b %v", sentIDs(rig.net, "b"))
		}
		testenv.Advance(60 * time.Millisecond) // the Interval at 600 ms offers it, the lane delivers it after the linger
		if !slices.Contains(sentIDs(rig.net, "b"), x.ClaimID) || rig.holds(x) {
			t.Fatalf("x not delivered within 3 Intervals: sent to cell-b %v, held %v", sentIDs(rig.net, "b"), rig.holds(x))
		}
		// nobody's: offered at 0, 400 and 800 ms (Errors 1, 2, 3).
		testenv.Advance(250 * time.Millisecond) // 900 ms
		if e := rig.r.Stats.Errors.Load(); e != 3+1 || !rig.holds(nobody) || rig.held() != 1 {
			t.Fatalf("Stats.Errors %d (want 4: the refused call, and the claim with no owner offered at 0, 400 and 800 ms), held %v, Held %d",
				e, rig.holds(nobody), rig.held())
		}
	})
}

// TestRestartReadsPastPosition: the relay saves database 1's position at its
// oldest held claim (b, whose cell hangs), not past it, and only database
// 1's (no other database's claims came or went), and saves nothing while
// nothing changes. A new relay over the same store (a restart) reads the
// claims past the saved position and delivers them: b, and c again (the
// receiver refuses the repeat); a, before the position, is not read. Once
// nothing is held the position moves on to Slack before now.
func TestRestartReadsPastPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, t0 := seededStore(time.Second)
		a, b, c := claimIn(10, 10, 0, t0.Add(-20*time.Second)), claimIn(10, 800, 1, t0.Add(-15*time.Second)), claimIn(10, 11, 2, t0.Add(-12*time.Second))
		store.addClaims(a, b, c)
		h := hungC()
		rig := newRig(t, rigOpts{store: store, net: &fakeNet{answer: h.answer}})
		rig.r.Enqueue([]model.Credit{a, b, c})
		testenv.Advance(300 * time.Millisecond)
		if a1, c1 := store.count(store.applied, a.ClaimID), store.count(store.applied, c.ClaimID); a1 != 1 || c1 != 1 || !rig.holds(b) || rig.held() != 1 {
			t.Fatalf("a applied %d, c %d times, b held %v, Held %d; want 1, 1, b alone held", a1, c1, rig.holds(b), rig.held())
		}
		if saves := store.savedSince(0); len(saves) != 1 || !maps.Equal(saves[0], map[int]int64{1: b.CreatedMS}) {
			t.Fatalf("saved %v, want one save of database 1 at b's creation %d", saves, b.CreatedMS)
		}
		testenv.Advance(PositionEvery) // b still held: nothing came or went
		if saves := store.savedSince(1); len(saves) != 0 {
			t.Fatalf("saved %v with nothing changed, want nothing", saves)
		}
		rig.stop() // b's delivery still hangs: lost with the relay
		if !rig.holds(b) {
			t.Fatal("b not held when the relay stopped")
		}
		if got := store.positions[1]; got != b.CreatedMS {
			t.Fatalf("database 1's position %d at the stop, want b's creation %d", got, b.CreatedMS)
		}

		again := newRig(t, rigOpts{store: store}) // every cell answers
		testenv.Advance(300 * time.Millisecond)
		store.mu.Lock()
		froms := slices.Clone(store.froms[1])
		store.mu.Unlock()
		if len(froms) != 2 || froms[1] != b.CreatedMS {
			t.Fatalf("database 1 read from %v, want a second read (the restart's) from b's creation %d", froms, b.CreatedMS)
		}
		if got := sentIDs(again.net, "c"); !slices.Equal(got, ids(b)) {
			t.Errorf("after the restart, sent to cell-c %v, want b", got)
		}
		if a2, c2 := store.count(store.applied, a.ClaimID), store.count(store.applied, c.ClaimID); a2 != 1 || c2 != 2 {
			t.Errorf("after the restart: a applied %d times (want 1: before the position), c %d (want 2: past it, delivered again)", a2, c2)
		}
		if n := again.held(); n != 0 {
			t.Errorf("after the restart the relay holds %d credits, want 0", n)
		}
		testenv.Advance(PositionEvery)
		// Saved at the first Interval when the deliveries were acknowledged
		// before it saved (a new lane delivers at once), else at 5.2 s.
		first, second := again.start.Add(200*time.Millisecond-Slack).UnixMilli(), again.start.Add(5200*time.Millisecond-Slack).UnixMilli()
		if p := store.positions[1]; p != first && p != second {
			t.Errorf("database 1's position %d once nothing was held, want Slack before the save (%d or %d)", p, first, second)
		}
	})
}

// TestPositionsSaved: every PositionEvery the relay saves, in one call
// inside Config.Enter, the positions of the databases whose claims came or
// went: never past a claim it holds, never for a database the cell no
// longer owns (its move's freeze began: Owns is false while DBs still lists
// it), and nothing when nothing changed.
func TestPositionsSaved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var gone atomic.Bool // database 2 is being moved away
		var mu sync.Mutex
		var entered [][]int
		store, t0 := seededStore(10 * time.Second)
		h := hungC()
		rig := newRig(t, rigOpts{store: store, net: &fakeNet{answer: h.answer}, tune: func(c *Config) {
			c.Owns = func(sh model.ShardID) bool { return sh < 500 && !(gone.Load() && sh.DB() == 2) }
			c.Enter = func(dbs []int) func() {
				mu.Lock()
				defer mu.Unlock()
				entered = append(entered, slices.Clone(dbs))
				return func() {}
			}
		}})
		lastEntered := func() []int {
			mu.Lock()
			defer mu.Unlock()
			return entered[len(entered)-1]
		}
		x := claimIn(10, 800, 0, t0.Add(-8*time.Second)) // database 1, for cell-c, which hangs
		y := claimIn(20, 21, 1, t0.Add(-time.Second))    // database 2, local
		rig.r.Enqueue([]model.Credit{x, y})
		testenv.Advance(300 * time.Millisecond) // the Interval at 200 ms saves
		want := map[int]int64{1: x.CreatedMS, 2: t0.Add(200*time.Millisecond - Slack).UnixMilli()}
		if saves := store.savedSince(0); len(saves) != 1 || !maps.Equal(saves[0], want) {
			t.Fatalf("saved %v, want one save %v (database 1 at its held claim, 2 at Slack before now)", saves, want)
		}
		if e := lastEntered(); !slices.Equal(e, []int{1, 2}) {
			t.Errorf("saved inside Enter(%v), want Enter([1 2])", e)
		}
		gone.Store(true)
		rig.r.Enqueue([]model.Credit{claimIn(20, 600, 2, time.Now())}) // database 2's claims come and go
		testenv.Advance(200 * time.Millisecond)
		h.releaseC()                   // x is delivered at its next try
		testenv.Advance(PositionEvery) // 5.5 s: the Interval at 5.2 s saved
		if saves := store.savedSince(1); len(saves) != 1 || !maps.Equal(saves[0], map[int]int64{1: t0.Add(5200*time.Millisecond - Slack).UnixMilli()}) {
			t.Fatalf("saved %v, want database 1 alone, at Slack before 5.2 s (x delivered), not database 2 (no longer owned)", saves)
		}
		if e := lastEntered(); !slices.Equal(e, []int{1, 2}) {
			t.Errorf("saved inside Enter(%v), want Enter([1 2]) (Owns is asked inside it)", e)
		}
		for _, s := range store.savedSince(0) {
			if p, ok := s[1]; ok && p > x.CreatedMS && rig.holds(x) {
				t.Errorf("saved database 1 at %d past x (%d) while it was held", p, x.CreatedMS)
			}
		}
		testenv.Advance(2 * PositionEvery) // nothing comes or goes
		if saves := store.savedSince(2); len(saves) != 0 {
			t.Fatalf("saved %v with nothing changed, want nothing", saves)
		}
	})
}

// TestMarkDBReadsSlack: claims committed but never handed over (a commit
// whose outcome was unknown) are not read while nothing calls for it;
// MarkDB makes the next Interval read the database's claims of the last
// Slack, and deliver them: not the older ones, nor another database's.
func TestMarkDBReadsSlack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, _ := seededStore(10 * time.Second)
		rig := newRig(t, rigOpts{store: store})
		testenv.Advance(300 * time.Millisecond) // the first Interval reads every database once
		recent, old := claimIn(10, 10, 0, time.Now().Add(-3*time.Second)), claimIn(10, 11, 1, time.Now().Add(-8*time.Second))
		store.addClaims(recent, old)
		testenv.Advance(time.Second)
		if r := store.count(store.applied, recent.ClaimID); r != 0 || store.reads[1] != 1 {
			t.Fatalf("before MarkDB: recent applied %d times, database 1 read %d times; want 0 and 1", r, store.reads[1])
		}
		marked := time.Now()
		rig.r.MarkDB(1, marked.Add(-Slack))
		testenv.Advance(200 * time.Millisecond)
		store.mu.Lock()
		reads, froms := maps.Clone(store.reads), slices.Clone(store.froms[1])
		store.mu.Unlock()
		if reads[1] != 2 || froms[1] != marked.Add(-Slack).UnixMilli() {
			t.Fatalf("after MarkDB: database 1 read %d times from %v, want twice, the second from %d", reads[1], froms, marked.Add(-Slack).UnixMilli())
		}
		for db, n := range reads {
			if db != 1 && n != 1 {
				t.Errorf("database %d read %d times, want once", db, n)
			}
		}
		if r, o := store.count(store.applied, recent.ClaimID), store.count(store.applied, old.ClaimID); r != 1 || o != 0 {
			t.Errorf("recent applied %d times (want 1), old %d (want 0: older than Slack)", r, o)
		}
		if n := rig.held(); n != 0 {
			t.Errorf("the relay holds %d credits, want 0", n)
		}
	})
}

// TestResetForgets: Reset forgets every credit held, which is never
// delivered, and every position, read again at the next Interval.
func TestResetForgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var off atomic.Bool
		off.Store(true)
		rig := newRelayRigWith(t, func(c *Config) { c.Off = off.Load })
		testenv.Advance(300 * time.Millisecond)
		x, y := credit(10, 0), credit(600, 1)
		rig.r.Enqueue([]model.Credit{x, y}) // switched off: held
		if n := rig.held(); n != 2 {
			t.Fatalf("switched off: Held %d, want 2", n)
		}
		rig.r.Reset()
		if n := rig.held(); n != 0 {
			t.Fatalf("after Reset: Held %d, want 0", n)
		}
		off.Store(false)
		testenv.Advance(time.Second)
		if a, b := rig.store.count(rig.store.applied, x.ClaimID), len(rig.net.to("b")); a != 0 || b != 0 {
			t.Fatalf("after Reset: x applied %d times, %d calls to cell-b; want none", a, b)
		}
		rig.store.mu.Lock()
		posReads := slices.Clone(rig.store.posReads)
		rig.store.mu.Unlock()
		if len(posReads) != 2 || len(posReads[1]) != 50 {
			t.Fatalf("positions read %d times, want twice: at the start and after the Reset, of every database", len(posReads))
		}
	})
}

// TestHeldMaxLeavesToTheStore: past HeldMax (3 here, held for cell-c,
// which hangs) fresh claims are not held but left to a read from the
// store, which waits while the relay holds HeldMax credits; the position
// is not saved past them. Once there is room the read holds what fits,
// reads the rest again from the first claim it left out, and every claim
// is delivered once.
func TestHeldMaxLeavesToTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, t0 := seededStore(10 * time.Second)
		h := hungC()
		rig := newRig(t, rigOpts{store: store, net: &fakeNet{answer: h.answer}, prep: func(r *Relay) { r.heldMax = 3 }})
		testenv.Advance(300 * time.Millisecond) // the first Interval read every database
		var ds, cs []model.Credit
		for i := range 3 {
			ds = append(ds, claimIn(20, model.ShardID(800+i), i, t0)) // database 2, for cell-c
		}
		for i := range 5 {
			cs = append(cs, claimIn(10, model.ShardID(600+i), 10+i, t0.Add(time.Duration(i)*time.Millisecond))) // database 1, for cell-b
		}
		store.addClaims(append(slices.Clone(ds), cs...)...)
		rig.r.Enqueue(ds)
		rig.r.Enqueue(cs)
		if n := rig.held(); n != 3 || rig.holds(cs[0]) {
			t.Fatalf("Held %d, want the 3 for cell-c and none past them", n)
		}
		testenv.Advance(5200 * time.Millisecond) // 5.5 s: the Interval at 5.2 s saved
		if n, sent := store.reads[1], sentIDs(rig.net, "b"); n != 1 || len(sent) != 0 {
			t.Fatalf("while HeldMax credits are held: database 1 read %d times (want once, at the start), sent to cell-b %v (want nothing)", n, sent)
		}
		if p := store.positions[1]; p > cs[0].CreatedMS {
			t.Fatalf("database 1's position %d is past the claims left out (from %d)", p, cs[0].CreatedMS)
		}
		h.releaseC()
		testenv.Advance(time.Second)
		// Each left out is sent, once, or twice: a claim left out while a
		// reading is under way asks for one more reading after it, which
		// may send again what the first one sent (the receiver refuses it).
		got := sentIDs(rig.net, "b")
		sent := map[string]int{}
		for _, id := range got {
			sent[id]++
		}
		for _, c := range cs {
			if n := sent[c.ClaimID]; n < 1 || n > 2 {
				t.Fatalf("sent to cell-b %v: %s %d times, want once or twice", got, c.ClaimID, n)
			}
		}
		if len(sent) != len(cs) {
			t.Fatalf("sent to cell-b %v, want the %d claims left out only", got, len(cs))
		}
		store.mu.Lock()
		froms := slices.Clone(store.froms[1])
		store.mu.Unlock()
		// The start, the first claim left out, the first the read left out;
		// then a few more readings, each asked for by a claim left out while
		// one was under way, none from before the first claim left out.
		want := []int64{t0.Add(-10 * time.Second).UnixMilli(), cs[0].CreatedMS, cs[3].CreatedMS}
		ok := len(froms) >= 3 && len(froms) <= 3+len(cs) && slices.Equal(froms[:3], want)
		for _, f := range froms[min(3, len(froms)):] {
			ok = ok && f >= cs[0].CreatedMS
		}
		if !ok {
			t.Errorf("database 1 read from %v, want %v, then at most %d more, none before %d", froms, want, len(cs), cs[0].CreatedMS)
		}
		if n := rig.held(); n != 0 {
			t.Errorf("Held %d at the end, want 0", n)
		}
	})
}

// TestHeldMaxCutsARead: a read after a restart finds more claims past the
// position than the relay may hold (HeldMax, 3 here): it holds the first 3
// and reads the others again, from the first left out, once there is room;
// every claim is delivered once.
func TestHeldMaxCutsARead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, t0 := seededStore(10 * time.Second)
		var cs []model.Credit
		for i := range 5 {
			cs = append(cs, claimIn(10, model.ShardID(800+i), i, t0.Add(-5*time.Second+time.Duration(i)*time.Millisecond)))
		}
		store.addClaims(cs...)
		h := hungC()
		rig := newRig(t, rigOpts{store: store, net: &fakeNet{answer: h.answer}, prep: func(r *Relay) { r.heldMax = 3 }})
		testenv.Advance(300 * time.Millisecond) // the first Interval reads database 1: 5 claims
		if n := rig.held(); n != 3 || rig.holds(cs[3]) || rig.holds(cs[4]) {
			t.Fatalf("Held %d, want the first 3", n)
		}
		testenv.Advance(time.Second)
		h.releaseC()
		testenv.Advance(time.Second)
		got := sentIDs(rig.net, "c")
		slices.Sort(got)
		if want := slices.Sorted(slices.Values(ids(cs...))); !slices.Equal(got, want) {
			t.Fatalf("sent to cell-c %v, want each of %v once", got, want)
		}
		store.mu.Lock()
		froms := slices.Clone(store.froms[1])
		store.mu.Unlock()
		if len(froms) < 2 || len(froms) > 3 || froms[1] != cs[3].CreatedMS || len(froms) == 3 && froms[2] <= froms[1] {
			t.Errorf("database 1 read from %v, want a second read from the first claim left out (%d), and at most one more, later", froms, cs[3].CreatedMS)
		}
		if n := rig.held(); n != 0 {
			t.Errorf("Held %d at the end, want 0", n)
		}
	})
}
