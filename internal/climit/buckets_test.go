package climit

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"golang.org/x/time/rate"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

// routers makes n Buckets of one family on the test memcached (one per
// process sharing the limit), on clk.
func routers(t *testing.T, n, perSec, burst int, clk clock.Clock) []*Buckets {
	t.Helper()
	mc := memcache.New(testenv.Memcached(t))
	prefix := "rc:test:user:" + testenv.Prefix() + ":"
	return makeN(t, n, func() (*Buckets, error) {
		return NewBuckets(BucketsConfig{Prefix: prefix, PerSec: perSec, Burst: burst, Procs: func() int { return n }}, mc, clk)
	})
}

// One person at 3x the limit, spread across two routers for 10 s: the shared
// buckets accept the limit plus the burst, where two buckets per process
// accept about twice that (measured in the same run).
func TestBucketsHoldAcrossProcesses(t *testing.T) {
	const perSec, burst, secs, factor = 20, 40, 10, 3
	clk := clock.NewManual(time.Unix(1_900_000_000, 0))
	shared := routers(t, 2, perSec, burst, clk)
	local := []*rate.Limiter{rate.NewLimiter(perSec, burst), rate.NewLimiter(perSec, burst)}
	step := time.Second / (perSec * factor)
	var sharedOK, localOK int
	for i := range perSec * factor * secs {
		r := i % 2 // alternate routers
		ok, wait := shared[r].Allow("act-1")
		if ok {
			sharedOK++
		} else if wait <= 0 || wait > time.Second {
			t.Fatalf("request %d refused with wait %v: want (0, 1s]", i, wait)
		}
		if local[r].AllowN(clk.Now(), 1) {
			localOK++
		}
		clk.Advance(step)
	}
	bound := perSec*secs + burst
	if sharedOK > bound || sharedOK < bound-2 {
		t.Fatalf("shared buckets accepted %d of %d, want about %d (limit x time + burst), at most that", sharedOK, perSec*factor*secs, bound)
	}
	if localOK < 2*bound-4 {
		t.Fatalf("per-process buckets accepted %d: the baseline should be about twice %d", localOK, bound)
	}
	t.Logf("3x the limit over two routers for %d s: shared %d accepted (bound %d), per-process %d (%.2fx)",
		secs, sharedOK, bound, localOK, float64(localOK)/float64(sharedOK))
	for _, b := range shared {
		if s := b.Stats(); s.Fallbacks != 0 || s.Failures != 0 {
			t.Fatalf("memcached was up, yet: %+v", s)
		}
	}
	// Another act_id has a bucket of its own, full.
	for i := range burst {
		if ok, _ := shared[i%2].Allow("act-2"); !ok {
			t.Fatalf("act-2's request %d refused: its bucket is not act-1's", i)
		}
	}
	if ok, _ := shared[0].Allow("act-2"); ok {
		t.Fatal("act-2 got more than its burst at one instant")
	}
}

// Many goroutines in several processes take one key's tokens at the same
// instant: compare-and-swap lets exactly the burst through, never more.
func TestBucketsConcurrentTakersGetTheBurst(t *testing.T) {
	const burst = 30
	clk := clock.NewManual(time.Unix(1_900_000_200, 0))
	bs := routers(t, 3, 10, burst, clk)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if o, _ := bs[g%3].Allow("hot"); o {
					ok.Add(1)
				} else {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() > burst {
		t.Fatalf("%d taken at one instant, burst is %d", ok.Load(), burst)
	}
	// Refusals after casAttempts conflicts are allowed (counted), never extra tokens.
	var conflicts int64
	for _, b := range bs {
		conflicts += b.Stats().Conflicts
	}
	if ok.Load()+conflicts < burst {
		t.Fatalf("only %d taken and %d refused for conflicts: the burst is %d", ok.Load(), conflicts, burst)
	}
	t.Logf("120 concurrent tries: %d taken, %d refused (%d after CAS conflicts)", ok.Load(), refused.Load(), conflicts)
}

// With memcached unreachable each process decides alone from PerSec/N and
// Burst/N, reports it, and goes back to memcached a second later.
func TestBucketsFallBackToTheirShare(t *testing.T) {
	mc := unreachable(t, 100*time.Millisecond)
	clk := clock.NewManual(time.Unix(1_900_000_400, 0))
	procs := 4
	b, err := NewBuckets(BucketsConfig{Prefix: "rc:test:fb:", PerSec: 20, Burst: 40, Procs: func() int { return procs }}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range 100 {
		if ok, _ := b.Allow("act-1"); ok {
			got++
		}
	}
	if got != 10 { // Burst/N = 40/4
		t.Fatalf("on the fallback one instant gave %d, want Burst/N = 10", got)
	}
	if !b.FallingBack() {
		t.Fatal("FallingBack false while memcached is down")
	}
	s := b.Stats()
	if s.Failures != 1 || s.Fallbacks != 100 {
		t.Fatalf("one failure should put 1 s of calls on the fallback: %+v", s)
	}
	clk.Advance(time.Second) // the fallback's second is over: memcached is asked again
	if b.FallingBack() {
		t.Fatal("still on the fallback a second later")
	}
	procs = 2 // fewer routers: a bigger share each
	got = 0
	for range 100 {
		if ok, _ := b.Allow("act-1"); ok {
			got++
		}
	}
	if s := b.Stats(); s.Failures != 2 {
		t.Fatalf("after a second the buckets should ask memcached again (failures %d, want 2)", s.Failures)
	}
	// The second passed at the old share (20/4 a second): 5 tokens, then the
	// share of 2 (10/s, burst 20) applies from now.
	if got != 5 {
		t.Fatalf("a second later: %d, want 5", got)
	}
	clk.Advance(time.Second) // now at 10/s, still failing: 10 more
	got = 0
	for range 100 {
		if ok, _ := b.Allow("act-1"); ok {
			got++
		}
	}
	if got != 10 {
		t.Fatalf("a second on a share of 2 routers gave %d, want 10", got)
	}
}

// A value that is not a TAT (damaged, or an old format) starts the bucket full.
func TestBucketsDamagedItem(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_600, 0))
	mc := memcache.New(testenv.Memcached(t))
	prefix := "rc:test:dmg:" + testenv.Prefix() + ":"
	if err := mc.Set(&memcache.Item{Key: prefix + "a", Value: []byte("garbage"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	b, err := NewBuckets(BucketsConfig{Prefix: prefix, PerSec: 5, Burst: 3}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range 10 {
		if ok, _ := b.Allow("a"); ok {
			got++
		}
	}
	if got != 3 {
		t.Fatalf("took %d, want the burst 3", got)
	}
	if _, err := NewBuckets(BucketsConfig{PerSec: 0, Burst: 1}, mc, clk); err == nil {
		t.Fatal("PerSec 0 accepted")
	}
	// A bucket that takes above 30 days to fill would outlive what
	// memcached takes as a relative expiration (or a Duration).
	for _, burst := range []int{30 * 86400, 1 << 62} {
		if _, err := NewBuckets(BucketsConfig{PerSec: 1, Burst: burst}, mc, clk); err == nil {
			t.Fatalf("Burst %d at 1/s accepted", burst)
		}
	}
	if _, err := NewBuckets(BucketsConfig{PerSec: 1000, Burst: 1_000_000}, mc, clk); err != nil {
		t.Fatal(err)
	}
}

// A TAT far ahead of this process's clock (written by a process whose clock
// runs an hour ahead) refuses the key until the item expires, but the wait
// it reports, a client's Retry-After, stays within a whole bucket's refill.
func TestBucketsTATFarAhead(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_800, 0))
	mc := memcache.New(testenv.Memcached(t))
	prefix := "rc:test:ahead:" + testenv.Prefix() + ":"
	ahead := clk.Now().Add(time.Hour).UnixNano()
	if err := mc.Set(&memcache.Item{Key: prefix + "a", Value: []byte(strconv.FormatInt(ahead, 10)), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	b, err := NewBuckets(BucketsConfig{Prefix: prefix, PerSec: 5, Burst: 3}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	ok, wait := b.Allow("a")
	if ok || wait <= 0 || wait > 800*time.Millisecond { // (Burst+1)/PerSec
		t.Fatalf("Allow with a TAT an hour ahead: %v, wait %v; want refused, wait in (0, 800ms]", ok, wait)
	}
}

// unreachable is a client of a memcached address nothing listens on (a port
// taken and let go), so each call fails at once with the connection refused.
func unreachable(t *testing.T, timeout time.Duration) *memcache.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	mc := memcache.New(addr)
	mc.Timeout = timeout
	return mc
}

// blackhole is a memcached that accepts connections and never answers (a
// server hung, or packets dropped): each call waits out the client's timeout.
func blackhole(t *testing.T) *memcache.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	mc := memcache.New(ln.Addr().String())
	mc.Timeout = 50 * time.Millisecond
	return mc
}

// After a failure, one call at a time asks a memcached that does not answer;
// the others keep to the fallback meanwhile instead of each waiting out the
// timeout. Counted by the failed calls, not by time.
func TestOneProbeAtATime(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_800, 0))
	mc := blackhole(t)
	b, err := NewBuckets(BucketsConfig{Prefix: "rc:test:bh:", PerSec: 1000, Burst: 1000}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{Name: "bh", Prefix: "rc:test:", Rate: 1000, FallbackBurst: 1000}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	b.Allow("a") // the first failure
	l.Allow()
	if b.Stats().Failures != 1 || l.Stats().FellBack != 1 {
		t.Fatalf("first failure: %+v %+v", b.Stats(), l.Stats())
	}
	clk.Advance(time.Second) // the fallback's second is over
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Add(2)
		go func() { defer wg.Done(); b.Allow(fmt.Sprintf("k%d", g)) }()
		go func() { defer wg.Done(); l.Allow() }()
	}
	wg.Wait()
	if f := b.Stats().Failures; f != 2 {
		t.Fatalf("buckets: %d failed calls after 20 concurrent ones, want 2 (one probe)", f)
	}
	if f := l.Stats().FellBack; f != 2 {
		t.Fatalf("limiter: %d failed calls after 20 concurrent ones, want 2 (one probe)", f)
	}
	// The limiter's probe runs without its lock: a call while it waits on
	// memcached is answered by the fallback, not held behind it.
	mc.Timeout = time.Second
	clk.Advance(time.Second)
	probed := make(chan struct{})
	go func() { defer close(probed); l.Allow() }()
	testenv.WaitFor(t, 10*time.Second, "the limiter's probe to start", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.probing
	})
	if !l.Allow() {
		t.Fatal("a call during the probe was refused; the fallback has tokens")
	}
	l.mu.Lock()
	still := l.probing
	l.mu.Unlock()
	if !still {
		t.Fatal("the call returned only after the probe (a second against a blackhole) ended: it waited for it")
	}
	<-probed
}

// A probe that gets an answer puts the buckets back on memcached.
func TestProbeBringsMemcachedBack(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_001_000, 0))
	good := memcache.New(testenv.Memcached(t))
	b, err := NewBuckets(BucketsConfig{Prefix: "rc:test:back:" + testenv.Prefix() + ":", PerSec: 10, Burst: 2}, good, clk)
	if err != nil {
		t.Fatal(err)
	}
	b.downUntil.Store(clk.Now().Add(-time.Millisecond).UnixNano()) // as after a failure a second ago
	if ok, _ := b.Allow("x"); !ok || b.downUntil.Load() != 0 || b.Stats().Fallbacks != 0 {
		t.Fatalf("the probe's answer should end the outage: down %d, %+v", b.downUntil.Load(), b.Stats())
	}
}

// countingMC counts the reads a Buckets sends.
type countingMC struct {
	CASMemcache
	gets atomic.Int64
}

func (c *countingMC) Get(key string) (*memcache.Item, error) {
	c.gets.Add(1)
	return c.CASMemcache.Get(key)
}

// A hot key well below its limit (a scene's bucket under many concurrent
// requests): every call is granted, however many race, because a process's
// calls of one key share its exchanges instead of racing each other's swaps;
// and the process reads memcached fewer times than it is called. Then, past
// the burst at one instant, exactly the rest of the burst is granted.
func TestBucketsHotKeyGroupsItsCalls(t *testing.T) {
	const burst, procs, workers, calls = 1000, 2, 16, 20
	clk := clock.NewManual(time.Unix(1_900_000_400, 0))
	mc := memcache.New(testenv.Memcached(t))
	prefix := "rc:test:scene:" + testenv.Prefix() + ":"
	var counters []*countingMC
	var bs []*Buckets
	for range procs {
		c := &countingMC{CASMemcache: mc}
		b, err := NewBuckets(BucketsConfig{Prefix: prefix, PerSec: 100, Burst: burst, Procs: func() int { return procs }}, c, clk)
		if err != nil {
			t.Fatal(err)
		}
		counters, bs = append(counters, c), append(bs, b)
	}
	var ok, refused atomic.Int64
	run := func(n int) {
		var wg sync.WaitGroup
		for w := range procs * workers {
			wg.Go(func() {
				for range n {
					if o, _ := bs[w%procs].Allow("rain"); o {
						ok.Add(1)
					} else {
						refused.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	run(calls)
	if ok.Load() != procs*workers*calls || refused.Load() != 0 {
		t.Fatalf("%d granted, %d refused of %d calls within the burst of %d (stats %+v %+v): want every one granted", ok.Load(), refused.Load(), procs*workers*calls, burst,
			bs[0].Stats(), bs[1].Stats())
	}
	gets := counters[0].gets.Load() + counters[1].gets.Load()
	if gets >= procs*workers*calls {
		t.Errorf("%d memcached reads for %d calls: want the calls of a key to share them", gets, procs*workers*calls)
	}
	t.Logf("%d calls on one key from %d goroutines in %d processes: all granted, %d memcached reads", ok.Load(), procs*workers, procs, gets)
	// The clock stands still: 360 tokens are left of the burst, and no more.
	ok.Store(0)
	refused.Store(0)
	run(calls)
	if ok.Load() != burst-procs*workers*calls {
		t.Fatalf("%d granted past %d taken at one instant: want exactly the %d left of the burst", ok.Load(), procs*workers*calls, burst-procs*workers*calls)
	}
	for _, b := range bs {
		for i := range b.shards {
			if n := len(b.shards[i].keys); n != 0 {
				t.Errorf("%d keys still held after every call returned", n)
			}
		}
	}
}

// stuckMC is a memcached whose reads wait for release, then fail.
type stuckMC struct {
	CASMemcache
	entered chan struct{}
	release chan struct{}
	gets    atomic.Int64
}

func (m *stuckMC) Get(string) (*memcache.Item, error) {
	if m.gets.Add(1) == 1 {
		close(m.entered)
	}
	<-m.release
	return nil, errors.New("memcached: i/o timeout")
}

// The calls of a key that queue behind a failing exchange go to the
// fallback with it: memcached is read once, not once per group.
func TestBucketsGroupBehindAFailureFallsBack(t *testing.T) {
	mc := &stuckMC{entered: make(chan struct{}), release: make(chan struct{})}
	b, err := NewBuckets(BucketsConfig{Prefix: "rc:test:", PerSec: 100, Burst: 100}, mc, clock.NewManual(time.Unix(1_900_000_600, 0)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ok atomic.Int64
	call := func() {
		defer wg.Done()
		if o, _ := b.Allow("rain"); o {
			ok.Add(1)
		}
	}
	wg.Add(1)
	go call()
	<-mc.entered // the first exchange is in flight
	wg.Add(3)
	for range 3 {
		go call()
	}
	sh := &b.shards[maphash.String(b.seed, "rain")%keyShards]
	deadline := time.Now().Add(10 * time.Second)
	for {
		sh.mu.Lock()
		refs := 0
		if ks := sh.keys["rain"]; ks != nil {
			refs = ks.refs
		}
		sh.mu.Unlock()
		if refs == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls joined, want 4", refs)
		}
		runtime.Gosched() // the three calls are about to join: yield until they have
	}
	close(mc.release)
	wg.Wait()
	if n := mc.gets.Load(); n != 1 {
		t.Errorf("%d memcached reads, want 1: the group queued behind the failure must not try again", n)
	}
	if s := b.Stats(); ok.Load() != 4 || s.Fallbacks != 4 || s.Failures != 1 {
		t.Errorf("%d granted, stats %+v: want all 4 from the fallback's bucket after one failure", ok.Load(), s)
	}
}
