package guard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/internal/testenv"
)

// realMemcache is the test memcached behind a proxy the test can cut, reached
// through a cell's client (admission.NewClient) and a breaker with the
// default settings (5 failures, 2 s cooldown).
type realMemcache struct {
	proxy  *testenv.Proxy
	client *memcache.Client // under the breaker
	reg    *prometheus.Registry
	b      *guard.Breaker
	mc     *guard.Memcache
	slots  *admission.Slots
	cache  *admission.Cache
}

func newRealMemcache(t *testing.T) *realMemcache {
	t.Helper()
	proxy := testenv.NewProxy(testenv.Memcached(t))
	proxy.Start(t)
	reg := prometheus.NewRegistry()
	b, err := guard.NewBreaker("memcached", guard.DefaultConfig(), reg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	client := admission.NewClient([]string{proxy.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	mc := guard.NewMemcache(client, b)
	return &realMemcache{proxy: proxy, client: client, reg: reg, b: b, mc: mc, slots: admission.NewSlots(mc, 1, quiet), cache: admission.NewCache(mc, quiet)}
}

// fillPool makes concurrent calls until the client keeps at least n
// connections open (idle in its pool once the calls return). It calls the
// client directly: a slow answer on a busy machine must not open the breaker
// before the test begins.
func (r *realMemcache) fillPool(t *testing.T, n int) {
	t.Helper()
	for round := 0; r.proxy.Conns() < n; round++ {
		if round == 50 {
			t.Fatalf("%d connections after 50 rounds of concurrent calls, want %d", r.proxy.Conns(), n)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range n {
			wg.Go(func() {
				<-start
				for i := range 5 {
					_, _ = r.client.Get(fmt.Sprintf("fill-%d-%d", g, i)) // a timeout only closes that connection
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if r.b.State() != guard.StateClosed {
		t.Fatal("the breaker opened while the pool filled")
	}
}

// use makes one call of each kind the cell makes: take and give back a
// transaction slot, write and read a grab-cache copy.
func (r *realMemcache) use(t *testing.T, key string) (fromMemcached bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	release, err := r.slots.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	release()
	want := admission.Remaining{Count: 3, ExpiresMS: time.Now().Add(time.Hour).UnixMilli()}
	r.cache.Set(key, want, time.Minute)
	got, ok := r.cache.Get(key)
	return ok && !got.Local && got.Count == want.Count
}

// failures returns the infrastructure failures the breaker counted.
func (r *realMemcache) failures(t *testing.T) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "redcell_breaker_failures_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no redcell_breaker_failures_total")
	return 0
}

func isMiss(err error) bool { return errors.Is(err, memcache.ErrCacheMiss) }

func (r *realMemcache) onMemcached() bool {
	cacheDown, _ := r.cache.FallingBack()
	return r.b.State() == guard.StateClosed && !r.slots.FallingBack() && !cacheDown
}

// TestMemcacheBackAfterOutage: a client whose pool holds many idle
// connections loses memcached (every connection cut, new ones refused) for
// longer than a cooldown, so the breaker opens and the slots and grab cache
// fall back. When memcached accepts again, the breaker closes and both are on
// memcached within 5 s, however many dead connections the pool held: the
// first call that finds one drops them all, instead of each half-open probe
// failing on the next one (one cooldown per dead connection).
func TestMemcacheBackAfterOutage(t *testing.T) {
	r := newRealMemcache(t)
	r.fillPool(t, 24)
	pooled := r.proxy.Conns()

	r.proxy.Stop()
	// The outage lasts past a cooldown: the breaker opened on Failures
	// failures, and a half-open probe failed after it (one failure more).
	failures := float64(guard.DefaultConfig().Failures + 1)
	if !testenv.Until(30*time.Second, func() bool { r.use(t, "outage"); return r.failures(t) >= failures }) {
		t.Fatalf("memcached refused for 30 s: %v failures counted, want %v (a probe failed after the breaker opened)", r.failures(t), failures)
	}
	if r.b.State() == guard.StateClosed || !r.slots.FallingBack() {
		t.Fatalf("memcached refused past a cooldown: breaker %d, slots falling back %v", r.b.State(), r.slots.FallingBack())
	}
	if down, _ := r.cache.FallingBack(); !down {
		t.Fatal("memcached refused for 3 s and the grab cache does not fall back")
	}

	r.proxy.Start(t) // memcached is back, on the same port
	back := time.Now()
	// One cooldown (2 s) and a probe bring it back; a probe failing on each
	// dead pooled connection in turn would take a cooldown per connection
	// (48 s and more): 20 s tells them apart on a slow machine too.
	if !testenv.Until(20*time.Second, func() bool { r.use(t, "back"); return r.onMemcached() }) {
		t.Fatalf("20 s after memcached came back (the pool held %d connections): breaker %d, slots falling back %v, "+
			"%v failures counted", pooled, r.b.State(), r.slots.FallingBack(), r.failures(t))
	}
	if !r.use(t, "after") {
		t.Fatal("the grab cache did not read its copy from memcached")
	}
	t.Logf("the pool held %d connections; back on memcached %s after it returned", pooled, time.Since(back).Round(time.Millisecond))
}

// TestMemcacheRestartBetweenCalls: memcached restarts between two calls (every
// pooled connection is dead, the server accepts new ones): the next call
// fails on a pooled connection, is tried again on a fresh one and succeeds, so
// no failure reaches the breaker and nothing falls back.
func TestMemcacheRestartBetweenCalls(t *testing.T) {
	r := newRealMemcache(t)
	r.fillPool(t, 24)
	r.proxy.Stop()
	r.proxy.Start(t)
	// Stop closed both ends of every pooled connection before it returned: a
	// call on one reads EOF or a reset, never an answer, whenever it comes.
	for i := range 10 {
		if _, err := r.mc.Get(fmt.Sprintf("after-restart-%d", i)); err != nil && !isMiss(err) {
			t.Fatalf("call %d after memcached restarted: %v", i, err)
		}
	}
	if !r.use(t, "after-restart") || !r.onMemcached() || r.failures(t) != 0 {
		t.Fatalf("after the restart: breaker %d, slots falling back %v, %v failures counted",
			r.b.State(), r.slots.FallingBack(), r.failures(t))
	}
}

// scriptedMemcache fails its first call with err, answers every later one,
// and counts calls and Closes.
type scriptedMemcache struct {
	fakeMemcache
	first  error
	closes atomic.Int64
}

func (s *scriptedMemcache) Get(string) (*memcache.Item, error) {
	if s.calls.Add(1) == 1 {
		return nil, s.first
	}
	return &memcache.Item{Value: []byte("1")}, nil
}
func (s *scriptedMemcache) Close() error { s.closes.Add(1); return nil }

// TestMemcacheRetriesOnlyDeadConnections: a call that broke on a connection
// the server closed or reset drops the idle connections and is tried once
// more; a refused dial, a timeout (the command may have been applied) and
// memcached's own answers are not tried again.
func TestMemcacheRetriesOnlyDeadConnections(t *testing.T) {
	for _, c := range []struct {
		err   error
		retry bool
	}{
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ETIMEDOUT}, false},
		{memcache.ErrCacheMiss, false},
		{memcache.ErrServerError, false},
	} {
		b, err := guard.NewBreaker("memcached", guard.DefaultConfig(), nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		f := &scriptedMemcache{first: c.err}
		_, err = guard.NewMemcache(f, b).Get("k")
		retried := f.calls.Load() == 2
		if retried != c.retry || (f.closes.Load() == 1) != c.retry || (c.retry && err != nil) || (!c.retry && err != c.err) {
			t.Errorf("%v: %d calls, %d closes, error %v; want retried %v", c.err, f.calls.Load(), f.closes.Load(), err, c.retry)
		}
	}
}
