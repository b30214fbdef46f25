package admission

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

// flakyMemcache is an in-memory memcached that can be made unreachable. Its
// CompareAndSwap does not check the CAS ID: the tests here are sequential.
type flakyMemcache struct {
	down atomic.Bool
	mu   sync.Mutex // guards items
	m    map[string][]byte
}

var errRefused = errors.New("dial tcp 127.0.0.1:11211: connect: connection refused")

func (f *flakyMemcache) Get(key string) (*memcache.Item, error) {
	if f.down.Load() {
		return nil, errRefused
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[key]
	if !ok {
		return nil, memcache.ErrCacheMiss
	}
	return &memcache.Item{Key: key, Value: append([]byte(nil), v...)}, nil
}

func (f *flakyMemcache) Add(it *memcache.Item) error {
	if f.down.Load() {
		return errRefused
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.m[it.Key]; ok {
		return memcache.ErrNotStored
	}
	f.m[it.Key] = append([]byte(nil), it.Value...)
	return nil
}

func (f *flakyMemcache) Set(it *memcache.Item) error {
	if f.down.Load() {
		return errRefused
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[it.Key] = append([]byte(nil), it.Value...)
	return nil
}

func (f *flakyMemcache) CompareAndSwap(it *memcache.Item) error { return f.Set(it) }

// logBuffer collects log lines for the tests to count.
type logBuffer = testenv.Buffer

// TestGrabCacheFallsBackAndReturns: with memcached unreachable the grab cache
// serves in-process copies and logs that once; when memcached answers again it
// logs that once, goes back to it, and trusts no copy written before the outage.
func TestGrabCacheFallsBackAndReturns(t *testing.T) {
	mc := &flakyMemcache{m: map[string][]byte{}}
	logs := &logBuffer{}
	c := NewCache(mc, slog.New(slog.NewTextHandler(logs, nil)))
	c.probeEvery = 20 * time.Millisecond
	clk := clock.NewManual(time.Now()) // a probe is due only when the test moves it
	c.Clock = clk
	open := Remaining{Count: 3, ExpiresMS: time.Now().Add(time.Hour).UnixMilli()}
	c.Set("p1", open, time.Minute)
	if r, ok := c.Get("p1"); !ok || r != open {
		t.Fatalf("with memcached up: %+v %v", r, ok)
	}

	mc.down.Store(true)
	if _, ok := c.Get("p1"); ok {
		t.Fatal("a copy only memcached held was served while it is down")
	}
	two := open
	two.Count = 2
	c.Set("p1", two, time.Minute) // an open committed during the outage
	for range 5 {
		if r, ok := c.Get("p1"); !ok || r.Count != 2 || !r.Local {
			t.Fatalf("in-process copy: %+v %v", r, ok)
		}
	}
	c.Fill("p1", open, time.Minute) // an older read never overwrites it
	if r, _ := c.Get("p1"); r.Count != 2 {
		t.Fatalf("Fill overwrote the in-process copy: %+v", r)
	}
	if active, served := c.FallingBack(); !active || served < 7 {
		t.Fatalf("falling back %v, served %d", active, served)
	}
	if n := logs.Count("grab cache falls back to in-process"); n != 1 {
		t.Fatalf("fallback logged %d times, want once:\n%s", n, logs.String())
	}

	mc.down.Store(false) // back, still holding the copy of 3 shares written before the outage
	// The probe interval passes: the next call probes memcached.
	clk.Advance(2 * c.probeEvery)
	if r, ok := c.Get("p1"); ok {
		t.Fatalf("a copy from before the outage was trusted: %+v", r)
	}
	c.Fill("p1", two, time.Minute) // the grab path: read the database, fill
	if r, ok := c.Get("p1"); !ok || r.Count != 2 || r.Local {
		t.Fatalf("after memcached came back: %+v %v", r, ok)
	}
	if active, _ := c.FallingBack(); active {
		t.Fatal("still falling back with memcached up")
	}
	if n := logs.Count("grab cache uses it again"); n != 1 {
		t.Fatalf("return logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestSlotsLogEachTransitionOnce: the transaction cap says once that it falls
// back and once that it is back, however many calls there are in between.
func TestSlotsLogEachTransitionOnce(t *testing.T) {
	mc := &flakyMemcache{m: map[string][]byte{}}
	logs := &logBuffer{}
	s := NewSlots(mc, 1, slog.New(slog.NewTextHandler(logs, nil)))
	ctx := context.Background()
	acquire := func() {
		t.Helper()
		release, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	acquire()
	mc.down.Store(true)
	for range 5 {
		acquire()
	}
	if !s.FallingBack() || s.Fallbacks.Load() < 5 {
		t.Fatalf("falling back %v after %d fallbacks", s.FallingBack(), s.Fallbacks.Load())
	}
	mc.down.Store(false)
	for range 3 {
		acquire()
	}
	if s.FallingBack() {
		t.Fatal("still falling back with memcached up")
	}
	if down, up := logs.Count("transaction cap falls back to in-process"), logs.Count("transaction cap uses it again"); down != 1 || up != 1 {
		t.Fatalf("logged %d fallbacks and %d returns, want one each:\n%s", down, up, logs.String())
	}
}

// TestFlappingMemcacheLogsBounded: a memcached that fails every other call
// (overloaded, timing out some calls) is one incident in the log, not a
// warning and a notice per failed call; the calls themselves still fall
// back and return each time.
func TestFlappingMemcacheLogsBounded(t *testing.T) {
	mc := &flakyMemcache{m: map[string][]byte{}}
	logs := &logBuffer{}
	s := NewSlots(mc, 1, slog.New(slog.NewTextHandler(logs, nil)))
	for i := range 200 {
		mc.down.Store(i%2 == 1)
		release, err := s.Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		release()
		if s.FallingBack() != (i%2 == 1) {
			t.Fatalf("call %d: falling back %v", i, s.FallingBack())
		}
	}
	if down, up := logs.Count("transaction cap falls back to in-process"), logs.Count("transaction cap uses it again"); down != 1 || up != 1 {
		t.Fatalf("100 flaps logged %d fallbacks and %d returns, want one each (then one line per 10 s):\n%s", down, up, logs.String())
	}
}
