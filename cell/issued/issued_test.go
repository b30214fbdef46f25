package issued_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/cell/admission"
	"redcell/cell/issued"
	"redcell/internal/clock"
	"redcell/internal/testenv"
)

var quiet = slog.New(slog.DiscardHandler)

// testMemcached returns a client of the test memcached and a key prefix no
// other test uses.
func testMemcached(t *testing.T) (*memcache.Client, string) {
	t.Helper()
	return admission.NewClient([]string{testenv.Memcached(t)}), "test:" + testenv.Prefix() + ":"
}

// Two cells count one scene: each sees its own additions at once, and both
// see the sum once each has flushed and read back; the memcached key holds
// the sum.
func TestTwoCellsSum(t *testing.T) {
	mc, pre := testMemcached(t)
	a, b := issued.New(mc, pre, quiet), issued.New(mc, pre, quiet)
	ka, err := a.Counter("rain/official")
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := b.Counter("rain/official")
	ka.Add(300)
	kb.Add(45)
	if ka.Read() != 300 || kb.Read() != 45 {
		t.Fatalf("before any flush: %d, %d; want each its own", ka.Read(), kb.Read())
	}
	for _, c := range []*issued.Counters{a, b, a} { // a reads b's flush on its second
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if ka.Read() != 345 || kb.Read() != 345 {
		t.Errorf("after both flushed and read back: %d, %d; want 345", ka.Read(), kb.Read())
	}
	it, err := mc.Get(pre + "rain/official")
	if err != nil || string(it.Value) != "345" {
		t.Errorf("the memcached key: %v %v", it, err)
	}
	ka.Add(5)
	if got := ka.Read(); got != 350 {
		t.Errorf("an addition after the flush: %d, want 350 at once", got)
	}
	if _, err := a.Counter("bad name"); err == nil {
		t.Error("a name with a space was accepted")
	}
}

// Reads never go down: not while a flush moves the additions from pending
// to the total, and not when memcached loses the key (a restart): the count
// holds until the new total passes it.
func TestMonotonic(t *testing.T) {
	mc, pre := testMemcached(t)
	c := issued.New(mc, pre, quiet)
	k, _ := c.Counter("card/gray")
	k.Add(1000)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := mc.Delete(pre + "card/gray"); err != nil { // memcached lost it
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	lowest := make(chan int64, 1)
	wg.Go(func() {
		last := int64(0)
		for i := 0; i < 2_000_000; i++ { // bounded; stops at the signal well before
			select {
			case <-stop:
				lowest <- last
				return
			default:
			}
			v := k.Read()
			if v < last {
				lowest <- v
				return
			}
			last = v
		}
		lowest <- last
	})
	for range 20 {
		k.Add(10)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if v := <-lowest; v < 1000 {
		t.Errorf("a read went down to %d", v)
	}
	if got := k.Read(); got != 1200 {
		t.Errorf("after the key was lost and 200 more were added: %d, want 1200 (the old 1000 is kept, then the additions)", got)
	}
}

// flakyMC fails Increment and Add while down.
type flakyMC struct {
	issued.Memcache
	down bool
}

var errDown = errors.New("memcached down")

func (f *flakyMC) Increment(key string, d uint64) (uint64, error) {
	if f.down {
		return 0, errDown
	}
	return f.Memcache.Increment(key, d)
}

func (f *flakyMC) Add(it *memcache.Item) error {
	if f.down {
		return errDown
	}
	return f.Memcache.Add(it)
}

// A flush that cannot reach memcached keeps the additions: Read still counts
// them, and the next flush that can takes them, once.
func TestFlushWhileDown(t *testing.T) {
	real, pre := testMemcached(t)
	f := &flakyMC{Memcache: real, down: true}
	c := issued.New(f, pre, quiet)
	k, _ := c.Counter("rain/test")
	k.Add(7)
	if err := c.Flush(); !errors.Is(err, errDown) {
		t.Fatalf("flush while down: %v", err)
	}
	if k.Read() != 7 {
		t.Errorf("while down: %d, want 7", k.Read())
	}
	f.down = false
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil { // nothing pending: only the read-back
		t.Fatal(err)
	}
	if it, err := real.Get(pre + "rain/test"); err != nil || string(it.Value) != "7" || k.Read() != 7 {
		t.Errorf("after memcached came back: key %v %v, read %d; want 7 once", it, err, k.Read())
	}
}

// Run flushes on its clock's ticks and once more when it stops.
func TestRun(t *testing.T) {
	mc, pre := testMemcached(t)
	c := issued.New(mc, pre, quiet)
	k, _ := c.Counter("rain/official")
	k.Add(11)
	clk := clock.NewManual(time.Unix(1e9, 0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, clk); close(done) }()
	testenv.WaitFor(t, 20*time.Second, "a flush of 11 to memcached as the clock moves", func() bool {
		clk.Advance(issued.Interval)
		it, err := mc.Get(pre + "rain/official")
		return err == nil && string(it.Value) == "11"
	})
	k.Add(4)
	cancel()
	<-done
	if it, err := mc.Get(pre + "rain/official"); err != nil || string(it.Value) != "15" {
		t.Errorf("after Run stopped: %v %v; want the last 4 flushed too", it, err)
	}
}

// BenchmarkRead is the "issued so far" read upstream calls at high rates: in
// process only (the target is >= 1,000,000 reads/s per core).
func BenchmarkRead(b *testing.B) {
	c := issued.New(nil, "bench:", quiet)
	k, _ := c.Counter("rain/official")
	k.Add(42)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if k.Read() < 42 {
				b.Fatal("lost the count")
			}
		}
	})
}
