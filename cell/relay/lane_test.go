package relay

import (
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
	"redcell/model"
	"redcell/sharding"
)

// These tests drive the relay's lanes on synctest's fake clock, with the
// store and the other cells faked: which credits go where, when, and how
// often. The real ones are exercised in relay_test.go and stall_test.go.

// fakeOutbox is the Store the relay uses, in memory.
type fakeOutbox struct {
	mu      sync.Mutex
	pending []model.Credit            // what PendingCredits finds (db 0 only); marking removes
	batches [][]string                // claim IDs of each ApplyCredits call, in order
	applied map[string]int            // times each claim was applied or found applied
	marked  map[string]int            // times each claim was marked delivered
	dests   map[string]string         // the Dest each claim was last marked with
	sent    map[string]string         // the dest each claim was last recorded as sent to (SendTo)
	defer_  func(c model.Credit) bool // deferred by this call? (nil: never)
	release chan struct{}             // when set, ApplyCredits waits for it to close
	readGap chan struct{}             // when set, PendingCredits waits for it after reading db 0
	reads   map[int]int               // PendingCredits calls by database
}

func newFakeOutbox() *fakeOutbox {
	return &fakeOutbox{applied: map[string]int{}, marked: map[string]int{}, dests: map[string]string{}, sent: map[string]string{}, reads: map[int]int{}}
}

func (f *fakeOutbox) ApplyCredits(ctx context.Context, cs []model.Credit) (int, []string, error) {
	f.mu.Lock()
	wait := f.release
	f.mu.Unlock()
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

func (f *fakeOutbox) MarkDelivered(ctx context.Context, cs []model.Credit) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		f.marked[c.ClaimID]++
		f.dests[c.ClaimID] = c.Dest
		f.pending = slices.DeleteFunc(f.pending, func(p model.Credit) bool { return p.ClaimID == c.ClaimID })
	}
	return 0, nil
}

func (f *fakeOutbox) SendTo(ctx context.Context, cs []model.Credit, dest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		f.sent[c.ClaimID] = dest
	}
	return nil
}

func (f *fakeOutbox) PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) ([]model.Credit, model.OutboxPos, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads[db]++
	if db != 0 {
		return nil, model.OutboxPos{}, nil
	}
	sorted := slices.SortedFunc(slices.Values(f.pending), func(a, b model.Credit) int { return strings.Compare(a.ClaimID, b.ClaimID) })
	var out []model.Credit
	for _, c := range sorted {
		if c.ClaimID > afterID && len(out) < limit {
			out = append(out, c)
		}
	}
	var next model.OutboxPos
	if len(out) > 0 {
		next.ClaimID = out[len(out)-1].ClaimID
	}
	if gap := f.readGap; gap != nil {
		f.mu.Unlock()
		<-gap
		f.mu.Lock()
	}
	return out, next, nil
}

func (f *fakeOutbox) count(m map[string]int, id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[id]
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
	call := remoteCall{addr: addr, at: time.Now(), deadline: d.Sub(time.Now())}
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

var errRefused = errors.New("connection refused")

// relayRig is cell-a (shards 0-499) with a real relay over a fake store and a
// fake network; the shard map gives 500-749 to cell-b (addr "b") and 750-999
// to cell-c (addr "c") unless cells says otherwise.
type relayRig struct {
	r     *Relay
	store *fakeOutbox
	net   *fakeNet
	start time.Time
	stop  func() // stops the relay (flushing) and waits for it
}

func newRelayRig(t *testing.T, cells ...sharding.Cell) *relayRig {
	t.Helper()
	return newRelayRigWith(t, nil, cells...)
}

// newRelayRigWith is newRelayRig with tune (if not nil) applied to the
// relay's Config first.
func newRelayRigWith(t *testing.T, tune func(*Config), cells ...sharding.Cell) *relayRig {
	t.Helper()
	own, _ := sharding.ParseRanges("0-499")
	if cells == nil {
		b, _ := sharding.ParseRanges("500-749")
		c, _ := sharding.ParseRanges("750-999")
		cells = []sharding.Cell{{Name: "cell-b", Addr: "b", Shards: b}, {Name: "cell-c", Addr: "c", Shards: c}}
	}
	m, _ := sharding.NewMap(append([]sharding.Cell{{Name: "cell-a", Addr: "a", Shards: own}}, cells...))
	store := newFakeOutbox()
	net := &fakeNet{answer: func(context.Context, string) ([]string, error) { return nil, nil }}
	cfg := Config{Cell: "cell-a", Space: "real", Interval: 200 * time.Millisecond, DBs: own.DBs,
		Owns: func(sh model.ShardID) bool { return sh < 500 }, Off: func() bool { return false },
		Store: store, Client: net, Peers: fixedPeers{m}, Log: slog.New(slog.DiscardHandler)}
	if tune != nil {
		tune(&cfg)
	}
	r := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &relayRig{r: r, store: store, net: net, start: time.Now(), stop: stop}
}

// credit makes a credit for a claimant of shard sh; n names it. Its packet is
// in a shard cell-a owns, as every packet of its outbox is.
func credit(sh model.ShardID, n int) model.Credit {
	id := model.PacketID(fmt.Sprintf("20260101%03d%03d3456789abcdef", sh%500, sh))
	return model.Credit{ClaimID: fmt.Sprintf("%sc%d", id, n+1), PacketID: id, ActID: fmt.Sprintf("u%d", n), Shard: sh, Amount: 1}
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
		rig.net.answer = func(ctx context.Context, addr string) ([]string, error) {
			if addr == "c" {
				return stalled(ctx)
			}
			return nil, nil
		}
		local, toB, toC := credit(10, 0), credit(600, 1), credit(800, 2)
		if left := rig.r.dispatch([]model.Credit{toC, local, toB}, time.Time{}); left != 0 {
			t.Fatalf("%d credits left in the outbox, want 0", left)
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if rig.store.count(rig.store.marked, local.ClaimID) != 1 || len(rig.net.to("b")) != 1 {
			t.Fatalf("after 50 ms: local marked %d times, %d calls to cell-b; want 1 and 1", rig.store.count(rig.store.marked, local.ClaimID), len(rig.net.to("b")))
		}
		time.Sleep(time.Second) // cell-c's first call still hangs
		local2, toB2 := credit(11, 3), credit(601, 4)
		rig.r.dispatch([]model.Credit{local2, toB2}, time.Time{})
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if rig.store.count(rig.store.marked, local2.ClaimID) != 1 || len(rig.net.to("b")) != 2 {
			t.Fatalf("while cell-c hangs: the new local credit marked %d times, %d calls to cell-b; want 1 and 2",
				rig.store.count(rig.store.marked, local2.ClaimID), len(rig.net.to("b")))
		}
		time.Sleep(relayAttemptTimeout + time.Second) // past the first call's timeout and the backoff
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
		if n := rig.store.count(rig.store.marked, toC.ClaimID); n != 0 {
			t.Errorf("cell-c's credit marked %d times while it hangs", n)
		}
	})
}

// TestLaneBackoff: a destination that refuses every call is tried after
// 100 ms, then 200 ms, ... up to 5 s between attempts; while the lane backs
// off it takes no credits (they stay in the outbox); the first success ends
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
		time.Sleep(20 * time.Second)
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
		time.Sleep(relayBackoffMax)
		synctest.Wait()
		n := len(rig.net.to("b"))
		mu.Lock()
		refuse = true
		mu.Unlock()
		rig.r.dispatch([]model.Credit{credit(602, 2)}, time.Time{})
		time.Sleep(time.Second)
		calls = rig.net.to("b")
		if len(calls) < n+2 || calls[n+1].at.Sub(calls[n].at) != relayBackoffMin {
			t.Fatalf("after a success, a failure then the next attempt: %d calls; want the retry 100 ms after the failure", len(calls)-n)
		}
	})
}

// TestLaneBoundAndNoDoubleHandOff: with its deliveries stuck, a lane holds at
// most laneDepthMax credits, the rest stay in the outbox; the scans that find
// every pending row meanwhile hand it nothing it holds. Once deliveries go
// through, each credit is applied and marked exactly once, the ones it had no
// room for through a later scan.
func TestLaneBoundAndNoDoubleHandOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		stuck := make(chan struct{})
		rig.store.release = stuck
		var all []model.Credit
		for i := range laneDepthMax + 100 {
			all = append(all, credit(model.ShardID(i%500), i))
		}
		rig.store.mu.Lock()
		rig.store.pending = slices.Clone(all)
		rig.store.mu.Unlock()
		if left := rig.r.dispatch(all, time.Time{}); left != 100 {
			t.Fatalf("%d credits left in the outbox, want the 100 beyond the lane's bound", left)
		}
		time.Sleep(time.Second + 50*time.Millisecond) // five scans
		synctest.Wait()
		if held, _ := rig.r.local.state(); held != laneDepthMax {
			t.Fatalf("the lane holds %d credits, want %d", held, laneDepthMax)
		}
		close(stuck)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, c := range all {
			if a, m := rig.store.count(rig.store.applied, c.ClaimID), rig.store.count(rig.store.marked, c.ClaimID); a != 1 || m != 1 {
				t.Fatalf("%s applied %d and marked %d times, want once each", c.ClaimID, a, m)
			}
		}
	})
}

// TestScanDoesNotHandBackWhatWasJustDelivered: the scan reads a pending row;
// before it hands the credit over, the lane delivers and marks it. The lane
// does not take it again from that scan: it is applied once.
func TestScanDoesNotHandBackWhatWasJustDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		x := credit(30, 0)
		applying, reading := make(chan struct{}), make(chan struct{})
		rig.store.mu.Lock()
		rig.store.pending, rig.store.release, rig.store.readGap = []model.Credit{x}, applying, reading
		rig.store.mu.Unlock()
		rig.r.dispatch([]model.Credit{x}, time.Time{}) // its delivery waits for applying
		time.Sleep(300 * time.Millisecond)             // the scan at 200 ms has read x's row and waits for reading
		synctest.Wait()
		close(applying) // x is delivered, marked and let go
		synctest.Wait()
		close(reading) // the scan hands x over
		time.Sleep(time.Second)
		synctest.Wait()
		if a, m := rig.store.count(rig.store.applied, x.ClaimID), rig.store.count(rig.store.marked, x.ClaimID); a != 1 || m != 1 {
			t.Fatalf("applied %d and marked %d times, want once each", a, m)
		}
	})
}

// TestLaneDeferredCredit: a credit whose wallet row is locked is deferred
// three times: the lane tries it again after 100, 200 and 400 ms, and marks
// it only once applied; the other credits of its batch, and credits handed
// over meanwhile, are applied and marked at once.
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
		rig.r.dispatch(append([]model.Credit{locked}, others...), time.Time{})
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		for _, c := range others {
			if m := rig.store.count(rig.store.marked, c.ClaimID); m != 1 {
				t.Fatalf("%s marked %d times, want 1", c.ClaimID, m)
			}
		}
		if m := rig.store.count(rig.store.marked, locked.ClaimID); m != 0 {
			t.Fatalf("the deferred credit was marked")
		}
		later := credit(23, 3)
		rig.r.dispatch([]model.Credit{later}, time.Time{})
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if m := rig.store.count(rig.store.marked, later.ClaimID); m != 1 {
			t.Fatalf("a credit handed over while another waits: marked %d times, want 1", m)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
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
		if a, m := rig.store.applied[locked.ClaimID], rig.store.marked[locked.ClaimID]; a != 1 || m != 1 {
			t.Errorf("the deferred credit applied %d and marked %d times, want once each", a, m)
		}
		if n := rig.r.Stats.Deferred.Load(); n != 3 {
			t.Errorf("relayDeferred %d, want 3", n)
		}
	})
}

// TestRelayStopFlushes: when the cell stops, each lane delivers what it holds
// at once (not after the linger, not waiting for the scan), and all of it
// within relayFlushMax even when a destination hangs (one try, bounded by the
// attempt timeout); the hanging cell's credits stay in the outbox.
func TestRelayStopFlushes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newRelayRig(t)
		rig.net.answer = func(ctx context.Context, addr string) ([]string, error) {
			if addr == "c" {
				return stalled(ctx)
			}
			return nil, nil
		}
		cs := []model.Credit{credit(10, 0), credit(600, 1), credit(800, 2), credit(11, 3)}
		rig.r.dispatch(cs, time.Time{})
		start := time.Now()
		rig.stop()
		if took := time.Since(start); took > relayFlushMax {
			t.Errorf("stopping took %s, want at most %s", took, relayFlushMax)
		}
		for i, want := range []int{1, 1, 0, 1} {
			if m := rig.store.count(rig.store.marked, cs[i].ClaimID); m != want {
				t.Errorf("credit %d marked %d times, want %d", i, m, want)
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
// for one more cell stay in the outbox. A lane that held nothing for
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
			t.Fatalf("%d credits left in the outbox, want 0", left)
		}
		if left := rig.r.dispatch(cs[lanesMax:], time.Time{}); left != 1 {
			t.Fatalf("a credit for a cell beyond %d lanes was taken", lanesMax)
		}
		if n := len(rig.r.lanes()); n != lanesMax {
			t.Fatalf("%d lanes, want %d", n, lanesMax)
		}
		time.Sleep(laneIdleStop + time.Second)
		synctest.Wait()
		if n := len(rig.r.lanes()); n != 0 {
			t.Fatalf("%d lanes after they held nothing for %s, want 0", n, laneIdleStop)
		}
		if left := rig.r.dispatch(cs[lanesMax:], time.Time{}); left != 0 {
			t.Fatalf("the last cell's credit was not taken after the others retired")
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
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
		time.Sleep(YieldMax - 10*time.Millisecond)
		synctest.Wait()
		if n, calls := rig.store.count(rig.store.applied, small[0].ClaimID), len(rig.net.to("b")); n != 0 || calls != 0 {
			t.Fatalf("loaded, before YieldMax: local credit applied %d times, %d calls to cell-b; want none", n, calls)
		}
		if y := rig.r.Stats.Yields.Load(); y != 2 {
			t.Errorf("%d yields, want 2 (one per lane)", y)
		}
		time.Sleep(10*time.Millisecond + yieldPoll)
		synctest.Wait()
		for _, c := range small[:2] {
			if n := rig.store.count(rig.store.marked, c.ClaimID); n != 1 {
				t.Errorf("loaded, after YieldMax: %s marked %d times, want 1", c.ClaimID, n)
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
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n := rig.store.count(rig.store.marked, full[BatchMax-1].ClaimID); n != 1 {
			t.Errorf("loaded, a full batch: marked %d times at once, want 1", n)
		}

		late := []model.Credit{credit(30, 900), credit(31, 901)}
		rig.r.dispatch(late, time.Time{})
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if n := rig.store.count(rig.store.applied, late[0].ClaimID); n != 0 {
			t.Fatalf("loaded: a small batch applied after 50 ms, want it held back")
		}
		busy.Store(false)
		time.Sleep(yieldPoll + Linger)
		synctest.Wait()
		for _, c := range late {
			if n := rig.store.count(rig.store.marked, c.ClaimID); n != 1 {
				t.Errorf("load dropped: %s marked %d times within %s, want 1", c.ClaimID, n, yieldPoll+Linger)
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
		time.Sleep(Linger + time.Millisecond)
		synctest.Wait()
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
		time.Sleep(time.Second) // the deferred credit's backoff (100 ms, 200 ms, ...) runs past 1.5 s
		synctest.Wait()
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
		rig.r.dispatch(cs, time.Time{})
		time.Sleep(2*relayLocalTimeout + time.Second) // two attempts time out (500, then 250), the third (125) waits
		synctest.Wait()
		rig.store.mu.Lock()
		rig.store.release = nil
		rig.store.mu.Unlock()
		close(release)
		time.Sleep(time.Second)
		synctest.Wait()
		rig.store.mu.Lock()
		var sizes []int
		for _, b := range rig.store.batches {
			sizes = append(sizes, len(b))
		}
		rig.store.mu.Unlock()
		if want := []int{125, 250, 225}; !slices.Equal(sizes, want) {
			t.Errorf("batches applied: %v, want %v", sizes, want)
		}
		for _, c := range cs {
			if n := rig.store.count(rig.store.marked, c.ClaimID); n != 1 {
				t.Fatalf("%s marked %d times, want 1", c.ClaimID, n)
			}
		}
	})
}

// TestScanReadsOnlyMarkedOutboxes: the first scan reads every database's
// outbox, and so does every tenth (SweepIntervals); a sweep for an event
// (here the start) marks every database, so the two scans after it read
// them all again (rows younger than two intervals); the scans between read
// only those marked: here database 40, whose claim no lane could take (its
// claimant's shard has no owner in the map), until a scan that could see
// that row finds nothing there.
func TestScanReadsOnlyMarkedOutboxes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := sharding.ParseRanges("500-749") // 750-999: no owner
		rig := newRelayRig(t, sharding.Cell{Name: "cell-b", Addr: "b", Shards: b})
		reads := func() map[int]int {
			rig.store.mu.Lock()
			defer rig.store.mu.Unlock()
			return maps.Clone(rig.store.reads)
		}
		time.Sleep(300 * time.Millisecond) // the first scan, at 200 ms: a sweep
		synctest.Wait()
		if got := reads(); len(got) != 50 || got[0] != 1 || got[49] != 1 {
			t.Fatalf("after the first scan: reads %v, want each of the 50 databases once", got)
		}
		time.Sleep(400 * time.Millisecond) // the scans at 400 and 600 ms: the start's rows
		synctest.Wait()
		if got := reads(); len(got) != 50 || got[0] != 3 || got[49] != 3 {
			t.Fatalf("after three scans: reads %v, want each of the 50 databases three times", got)
		}
		c := credit(900, 0) // its packet is in shard 400, database 40
		rig.r.Enqueue([]model.Credit{c})
		time.Sleep(1100 * time.Millisecond) // scans at 800 ms .. 1.8 s
		synctest.Wait()
		got := reads()
		if got[40] < 3+3 || got[40] > 3+5 {
			t.Errorf("database 40 read %d times, want 3 and 3-5 after its mark (until a scan that sees rows as old as the mark finds none)", got[40])
		}
		for db, n := range got {
			if db != 40 && n != 3 {
				t.Errorf("database %d read %d times between sweeps, want 3 (the start's sweep and the two scans after it)", db, n)
			}
		}
		if n := rig.r.Stats.Scans.Load(); n != 9 {
			t.Errorf("%d scans by 1.8 s, want 9", n)
		}
		time.Sleep(500 * time.Millisecond) // the scan at 2.2 s: ten intervals after the first sweep
		synctest.Wait()
		for db, n := range reads() {
			if want := got[db] + 1; n != want {
				t.Errorf("database %d read %d times after the second sweep, want %d (a periodic sweep marks nothing)", db, n, want)
			}
		}
	})
}

// TestCreditAppliedOnceAcrossCells: before a credit goes to a cell other
// than the one its outbox row says it was sent to (Credit.Dest), the relay
// asks that cell's copy of the claimant's database. Found there and not
// where the database is served now: not delivered again, marked with where
// it was applied (Stats.Elsewhere); found at both (moved with its rows):
// marked with the new destination, not counted. Not found: recorded as
// sent to the new destination, delivered, marked with it. That cell not in the
// map: held in the outbox (Stats.Held). A row sent nowhere else, or never
// sent, is delivered without a question.
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
		if left := rig.r.dispatch([]model.Credit{x, y, z, w, v, u, r}, time.Time{}); left != 0 {
			t.Fatalf("%d credits left in the outbox, want 0", left)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
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
		rig.store.mu.Lock()
		dests := maps.Clone(rig.store.dests)
		rig.store.mu.Unlock()
		want := map[string]string{x.ClaimID: "cell-c", w.ClaimID: "cell-c", y.ClaimID: "cell-b", z.ClaimID: "cell-b", u.ClaimID: "cell-b",
			v.ClaimID: "cell-a", r.ClaimID: "cell-b"}
		if !maps.Equal(dests, want) {
			t.Errorf("marked with dests %v, want %v", dests, want)
		}
		rig.store.mu.Lock()
		sent := maps.Clone(rig.store.sent)
		rig.store.mu.Unlock()
		if want := map[string]string{y.ClaimID: "cell-b", z.ClaimID: "cell-b"}; !maps.Equal(sent, want) {
			t.Errorf("recorded as sent before delivery: %v, want %v (the two delivered to another cell than their rows named)", sent, want)
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

		// cell-c cannot answer: its credits stay in the outbox, asked again later.
		rig.net.copies = func(string, model.Credit) (bool, error) { return false, errRefused }
		callsB := len(rig.net.to("b"))
		q := credit(604, 6)
		q.Dest = "cell-c"
		rig.r.dispatch([]model.Credit{q}, time.Time{})
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if a, m := len(rig.net.to("b")), rig.store.count(rig.store.marked, q.ClaimID); a != callsB || m != 0 {
			t.Errorf("while cell-c cannot answer: %d calls to cell-b (want still %d), q marked %d times (want 0)", a, callsB, m)
		}
		if h := rig.r.Stats.Held.Load(); h != 1 {
			t.Errorf("Stats.Held %d, want 1", h)
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
		time.Sleep(time.Second)
		synctest.Wait()
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
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
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
		rig.r.dispatch([]model.Credit{credit(600, 1)}, time.Time{})
		time.Sleep(Linger + 100*time.Millisecond)
		synctest.Wait()
		if b := rig.r.Behind(time.Now()); b != Linger+100*time.Millisecond {
			t.Errorf("remote attempt in flight 100 ms: behind %s, want %s", b, Linger+100*time.Millisecond)
		}
		time.Sleep(remoteStall)
		synctest.Wait()
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("remote attempt in flight over %s: behind %s, want 0 (stalled peer)", remoteStall, b)
		}
		rig.r.dispatch([]model.Credit{credit(601, 2)}, time.Time{}) // queued behind the stalled attempt
		mu.Lock()
		hang = false
		mu.Unlock()
		// The attempt fails at its 5 s bound, the lane backs off 100 ms, and
		// the retry (both credits) takes 200 ms: look in its middle.
		time.Sleep(Linger + relayAttemptTimeout + relayBackoffMin + 100*time.Millisecond - (Linger + 100*time.Millisecond + remoteStall))
		synctest.Wait()
		if calls := len(rig.net.to("b")); calls != 2 {
			t.Fatalf("%d calls to cell-b, want 2 (the stalled one and the retry in flight)", calls)
		}
		if b := rig.r.Behind(time.Now()); b != 0 {
			t.Errorf("retry in flight after a failure: behind %s, want 0 (its credits are a backlog)", b)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		for _, c := range []model.Credit{credit(600, 1), credit(601, 2)} {
			if n := rig.store.count(rig.store.marked, c.ClaimID); n != 1 {
				t.Errorf("%s marked %d times, want 1", c.ClaimID, n)
			}
		}
	})
}
