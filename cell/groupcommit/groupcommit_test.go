package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
)

// fakeStore records the groups it is asked to commit. While gate is set,
// each commit first tells started and then waits for gate to close.
type fakeStore struct {
	mu      sync.Mutex
	groups  [][]storage.MoneyOp
	lanes   []Lane
	err     error
	gate    chan struct{}
	started chan struct{}
	active  map[Lane]int // commits in flight per lane
	overlap bool         // two commits of one lane ran at once
}

func (f *fakeStore) commit(ctx context.Context, ln Lane, ops []storage.MoneyOp) error {
	f.mu.Lock()
	if f.active == nil {
		f.active = map[Lane]int{}
	}
	f.active[ln]++
	if f.active[ln] > 1 {
		f.overlap = true
	}
	gate, started := f.gate, f.started
	f.mu.Unlock()
	if started != nil {
		started <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active[ln]--
	f.groups = append(f.groups, ops)
	f.lanes = append(f.lanes, ln)
	for _, op := range ops {
		if d, ok := op.(*storage.DepositOp); ok {
			d.Deposit.Balance = model.Cents(len(f.groups)) // which group committed it
		}
	}
	return f.err
}

func (f *fakeStore) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.groups)
}

func newCommitter(f *fakeStore, tune func(*Config)) *Committer {
	cfg := Config{Max: 8, Wait: 0, QueueMax: 1000, CommitTimeout: 5 * time.Second, Commit: f.commit}
	if tune != nil {
		tune(&cfg)
	}
	return New(cfg)
}

func deposit(n int) *storage.DepositOp {
	return &storage.DepositOp{OrderNo: fmt.Sprintf("o%d", n), Amount: 1}
}

var lane0 = Lane{Space: 0, ID: 3}

// submitAsync submits op and sends its error on the returned channel.
func submitAsync(c *Committer, ctx context.Context, ln Lane, op storage.MoneyOp) chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.Submit(ctx, ln, op) }()
	return ch
}

// waitQueued waits until lane ln holds n queued requests.
func waitQueued(t *testing.T, c *Committer, ln Lane, n int) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("lane %s to hold %d queued requests", ln, n), func() bool {
		c.mu.Lock()
		l := c.lanes[ln]
		c.mu.Unlock()
		if l == nil {
			return false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.reqs == n
	})
}

// TestLoneOpsCommitAtOnce: ops submitted one after another on an idle lane
// each commit in a group of their own, without the wait (an hour here).
func TestLoneOpsCommitAtOnce(t *testing.T) {
	f := &fakeStore{}
	var held atomic.Int64
	c := newCommitter(f, func(cfg *Config) {
		cfg.Wait = time.Hour
		cfg.Observe = func(g Group) { held.Add(int64(g.Held)) }
	})
	defer c.Stop()
	for i := 0; i < 20; i++ {
		if err := c.Submit(context.Background(), lane0, deposit(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(); n != 20 {
		t.Fatalf("%d groups for 20 lone ops, want 20", n)
	}
	if held.Load() != 0 {
		t.Fatalf("lone ops were held %s", time.Duration(held.Load()))
	}
}

// TestOpsQueuedDuringACommitShareTheNext: while one group commits, the ops
// that arrive queue and go together, in arrival order, into the next group.
func TestOpsQueuedDuringACommitShareTheNext(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	c := newCommitter(f, nil)
	defer c.Stop()
	first := submitAsync(c, context.Background(), lane0, deposit(0))
	<-f.started
	var ops []*storage.DepositOp
	var errs []chan error
	for i := 1; i <= 5; i++ {
		op := deposit(i)
		ops = append(ops, op)
		errs = append(errs, submitAsync(c, context.Background(), lane0, op))
		waitQueued(t, c, lane0, i) // keep the arrival order known
	}
	close(f.gate)
	for _, ch := range append([]chan error{first}, errs...) {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(); n != 2 {
		t.Fatalf("%d groups, want 2", n)
	}
	for i, o := range f.groups[1] {
		if op, ok := o.(*storage.DepositOp); !ok || op != ops[i] || op.Deposit.Balance != 2 {
			t.Fatalf("second group op %d is %+v, want %s of group 2 in order", i, o, ops[i].OrderNo)
		}
	}
}

// TestGroupMaxBoundsRequests: a group never carries more than Max requests
// (an open batch counts its opens), except an op heavier than Max, alone.
func TestGroupMaxBoundsRequests(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 100)}
	c := newCommitter(f, func(cfg *Config) { cfg.Max = 8 })
	defer c.Stop()
	first := submitAsync(c, context.Background(), lane0, deposit(0))
	<-f.started
	var errs []chan error
	queued := 0
	add := func(op storage.MoneyOp) {
		errs = append(errs, submitAsync(c, context.Background(), lane0, op))
		queued += op.Weight()
		waitQueued(t, c, lane0, queued)
	}
	for i := 0; i < 10; i++ {
		add(deposit(i + 1))
	}
	add(&storage.OpenOp{Reqs: make([]model.OpenRequest, 20)}) // heavier than Max
	add(&storage.OpenOp{Reqs: make([]model.OpenRequest, 5)})
	add(&storage.CreditsOp{Credits: make([]model.Credit, 3)})
	go func() {
		for range f.started {
		}
	}()
	close(f.gate)
	for _, ch := range append([]chan error{first}, errs...) {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	close(f.started)
	var sizes []int
	for _, g := range f.groups {
		n := 0
		for _, op := range g {
			n += op.Weight()
		}
		sizes = append(sizes, n)
	}
	// 1 | 8 deposits | 2 deposits (the open of 20 does not fit) | 20 alone | 5 + 3
	want := []int{1, 8, 2, 20, 8}
	if fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Fatalf("group sizes %v, want %v", sizes, want)
	}
}

// TestGroupErrorFailsEveryOp: a failed commit answers its error to every op
// of the group.
func TestGroupErrorFailsEveryOp(t *testing.T) {
	boom := fmt.Errorf("commit: %w", storage.ErrCommitUnknown)
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 10), err: boom}
	c := newCommitter(f, nil)
	defer c.Stop()
	first := submitAsync(c, context.Background(), lane0, deposit(0))
	<-f.started
	a := submitAsync(c, context.Background(), lane0, deposit(1))
	b := submitAsync(c, context.Background(), lane0, deposit(2))
	waitQueued(t, c, lane0, 2)
	go func() { <-f.started }()
	close(f.gate)
	for _, ch := range []chan error{first, a, b} {
		if err := <-ch; !errors.Is(err, storage.ErrCommitUnknown) {
			t.Fatalf("error %v, want the group's", err)
		}
	}
	if n := f.count(); n != 2 {
		t.Fatalf("%d groups, want 2", n)
	}
}

// TestDeadlineInQueueDropsTheOp: an op whose context ends while it waits in
// the queue is answered TIMEOUT and never committed; one whose context ends
// while its group commits is answered TIMEOUT wrapping ErrInFlight.
func TestDeadlineInQueueDropsTheOp(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	c := newCommitter(f, nil)
	defer c.Stop()
	ctx1, cancel1 := context.WithCancel(context.Background())
	first := submitAsync(c, ctx1, lane0, deposit(0))
	<-f.started
	ctx2, cancel2 := context.WithCancel(context.Background())
	dropped := deposit(1)
	second := submitAsync(c, ctx2, lane0, dropped)
	waitQueued(t, c, lane0, 1)
	cancel2()
	if err := <-second; !errors.Is(err, model.ErrTimeout) || errors.Is(err, ErrInFlight) {
		t.Fatalf("queued op whose context ended: %v, want TIMEOUT, not in flight", err)
	}
	waitQueued(t, c, lane0, 0)
	cancel1()
	if err := <-first; !errors.Is(err, model.ErrTimeout) || !errors.Is(err, ErrInFlight) {
		t.Fatalf("in-flight op whose context ended: %v, want TIMEOUT and ErrInFlight", err)
	}
	third := submitAsync(c, context.Background(), lane0, deposit(2))
	waitQueued(t, c, lane0, 1)
	go func() { <-f.started }()
	close(f.gate)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	for _, g := range f.groups {
		for _, op := range g {
			if op == dropped {
				t.Fatal("the dropped op was committed")
			}
		}
	}
	if n := f.count(); n != 2 {
		t.Fatalf("%d groups, want 2 (the first, then the third op alone)", n)
	}
}

// TestStopDrainsAndRefuses: Stop commits what is queued, then new ops are
// answered SHUTTING_DOWN.
func TestStopDrainsAndRefuses(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	c := newCommitter(f, nil)
	first := submitAsync(c, context.Background(), lane0, deposit(0))
	<-f.started
	var errs []chan error
	for i := 1; i <= 3; i++ {
		errs = append(errs, submitAsync(c, context.Background(), lane0, deposit(i)))
	}
	waitQueued(t, c, lane0, 3)
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	testenv.WaitFor(t, 10*time.Second, "Stop to refuse new submits", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.stopped
	})
	if err := c.Submit(context.Background(), lane0, deposit(9)); !errors.Is(err, model.ErrShuttingDown) {
		t.Fatalf("submit after Stop: %v", err)
	}
	go func() { <-f.started }()
	close(f.gate)
	<-stopped
	for _, ch := range append([]chan error{first}, errs...) {
		if err := <-ch; err != nil {
			t.Fatalf("queued op at Stop: %v", err)
		}
	}
	if n := f.count(); n != 2 {
		t.Fatalf("%d groups, want 2", n)
	}
}

// TestLanesRunApart: each lane has one commit in flight at most, and lanes
// commit at the same time; many submitters on many lanes all get answers.
func TestLanesRunApart(t *testing.T) {
	f := &fakeStore{}
	var observed atomic.Int64
	c := newCommitter(f, func(cfg *Config) {
		cfg.Wait = time.Millisecond
		cfg.Observe = func(g Group) { observed.Add(int64(g.Requests)) }
	})
	var wg sync.WaitGroup
	const goroutines, each = 16, 50
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				ln := Lane{Space: g % 2, ID: (g + i) % 4}
				if err := c.Submit(context.Background(), ln, deposit(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.Stop()
	if f.overlap {
		t.Fatal("two commits of one lane ran at once")
	}
	if got := observed.Load(); got != goroutines*each {
		t.Fatalf("observed %d requests, want %d", got, goroutines*each)
	}
	if c.Lanes() != 8 {
		t.Fatalf("%d lanes, want 8", c.Lanes())
	}
}

// TestQueueMaxSheds: a lane's queue holds at most QueueMax requests.
func TestQueueMaxSheds(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	c := newCommitter(f, func(cfg *Config) { cfg.QueueMax = 2 })
	first := submitAsync(c, context.Background(), lane0, deposit(0))
	<-f.started
	a := submitAsync(c, context.Background(), lane0, deposit(1))
	b := submitAsync(c, context.Background(), lane0, deposit(2))
	waitQueued(t, c, lane0, 2)
	if err := c.Submit(context.Background(), lane0, deposit(3)); !errors.Is(err, model.ErrOverloaded) {
		t.Fatalf("submit to a full lane: %v", err)
	}
	go func() { <-f.started }()
	close(f.gate)
	for _, ch := range []chan error{first, a, b} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	c.Stop()
}

// TestWaitFor: the adaptive wait is 0 without measurements, on a full group
// or when less than one request is expected; else the smallest of the bound,
// half the commit time and the time to fill the group.
func TestWaitFor(t *testing.T) {
	c := New(Config{Max: 100, Wait: 10 * time.Millisecond, QueueMax: 1000, CommitTimeout: time.Second, Commit: (&fakeStore{}).commit})
	for _, tc := range []struct {
		rate   float64
		commit time.Duration
		reqs   int
		want   time.Duration
	}{
		{0, 4 * time.Millisecond, 1, 0},                              // no rate measured
		{10_000, 4 * time.Millisecond, 100, 0},                       // full
		{100, 4 * time.Millisecond, 1, 0},                            // 0.2 expected in 2 ms
		{10_000, 4 * time.Millisecond, 1, 2 * time.Millisecond},      // half the commit
		{10_000, 40 * time.Millisecond, 1, 9900 * time.Microsecond},  // 99 to fill at 10/ms
		{100_000, 40 * time.Millisecond, 50, 500 * time.Microsecond}, // fill
		{1_000_000, time.Second, 1, 99 * time.Microsecond},           // fill before the bound
	} {
		l := &lane{rateEWMA: tc.rate, commitEWMA: tc.commit}
		if got := c.waitFor(l, tc.reqs); got != tc.want {
			t.Errorf("rate %v/s, commit %s, %d queued: wait %s, want %s", tc.rate, tc.commit, tc.reqs, got, tc.want)
		}
	}
}
