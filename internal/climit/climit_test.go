package climit

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

// cells makes n limiters of one limit on the test memcached, sharing a
// manual clock.
func cells(t *testing.T, n, rate, chunk int, clk clock.Clock) []*Limiter {
	t.Helper()
	mc := memcache.New(testenv.Memcached(t))
	name := "lim-" + testenv.Prefix()
	return makeN(t, n, func() (*Limiter, error) {
		return New(Config{Name: name, Prefix: "rc:test:", Rate: rate, Chunk: chunk, Cells: func() int { return n }}, mc, clk)
	})
}

// makeN makes n of what mk makes (one per process sharing a limit), failing
// t on an error.
func makeN[T any](t *testing.T, n int, mk func() (T, error)) []T {
	t.Helper()
	var out []T
	for range n {
		x, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, x)
	}
	return out
}

// drain takes tokens from the limiters in turn until every one refuses, and
// returns how many each took.
func drain(ls []*Limiter) []int {
	took := make([]int, len(ls))
	for open := len(ls); open > 0; {
		open = 0
		for i, l := range ls {
			if l.Allow() {
				took[i]++
				open++
			}
		}
	}
	return took
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func TestCellsShareTheRate(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_000, 0))
	for _, c := range []struct{ n, rate, chunk int }{{3, 300, 15}, {3, 100, 30}, {2, 7, 5}, {4, 50, 0}} {
		ls := cells(t, c.n, c.rate, c.chunk, clk)
		for window := range 3 {
			took := drain(ls)
			if sum(took) != c.rate {
				t.Fatalf("%+v window %d: the cells took %v = %d, want the rate %d", c, window, took, sum(took), c.rate)
			}
			for i, x := range took {
				if x == 0 && c.rate >= c.n*max(c.chunk, 1) {
					t.Fatalf("%+v: cell %d took nothing: %v", c, i, took)
				}
			}
			clk.Advance(time.Second)
		}
		if s := ls[0].Stats(); s.Refills == 0 || s.FellBack != 0 {
			t.Fatalf("stats: %+v", s)
		}
	}
}

func TestConcurrentTakersNeverPassTheRate(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_100, 0))
	ls := cells(t, 3, 500, 10, clk)
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 4 {
			wg.Go(func() {
				n := 0
				for range 400 {
					if l.Allow() {
						n++
					}
				}
				mu.Lock()
				total += n
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if total != 500 {
		t.Fatalf("12 takers of 400 tries took %d in one window, want 500", total)
	}
}

// flaky is a memcached that fails while down is set.
type flaky struct {
	Memcache
	mu   sync.Mutex
	down bool
}

func (f *flaky) set(down bool) { f.mu.Lock(); f.down = down; f.mu.Unlock() }

func (f *flaky) Increment(key string, delta uint64) (uint64, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return 0, errors.New("memcache: connection refused")
	}
	return f.Memcache.Increment(key, delta)
}

func TestFallbackIsRateOverCells(t *testing.T) {
	start := time.Unix(1_900_000_200, 0)
	clk := clock.NewManual(start)
	mc := &flaky{Memcache: memcache.New(testenv.Memcached(t)), down: true}
	const n, rate = 4, 400
	var ls []*Limiter
	name := "lim-" + testenv.Prefix()
	for range n {
		l, err := New(Config{Name: name, Prefix: "rc:test:", Rate: rate, Chunk: 20, Cells: func() int { return n }}, mc, clk)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	// Two seconds in 10 ms steps, memcached down: each cell runs at
	// rate/N = 100/s (plus its bucket's burst of one token).
	took := make([]int, n)
	for range 200 {
		for i, l := range ls {
			for l.Allow() {
				took[i]++
			}
		}
		clk.Advance(10 * time.Millisecond)
	}
	for i, x := range took {
		if x < 199 || x > 201 {
			t.Fatalf("cell %d took %d in 2 s on the fallback, want 200 (100/s, a burst of 1)", i, x)
		}
	}
	if s := ls[0].Stats(); s.FellBack < 1 || s.Refills != 0 {
		t.Fatalf("stats on the fallback: %+v", s)
	}
	// memcached back: after retryAfter the cells use the counter again,
	// and one window gives the rate exactly.
	mc.set(false)
	clk.Set(time.Unix(start.Unix()+10, 0))
	if got := sum(drain(ls)); got != rate {
		t.Fatalf("back on the counter: %d in a window, want %d", got, rate)
	}
	if s := ls[0].Stats(); s.Refills == 0 {
		t.Fatalf("no refill after memcached came back: %+v", s)
	}
}

func TestUnreachableMemcachedFallsBack(t *testing.T) {
	mc := unreachable(t, 50*time.Millisecond)
	clk := clock.NewManual(time.Unix(1_900_000_300, 0))
	l, err := New(Config{Name: "lim", Rate: 50, Chunk: 5, Cells: func() int { return 2 }}, mc, clk)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for l.Allow() {
		n++
	}
	if n != 1 || l.Stats().FellBack != 1 { // the fallback bucket's burst of one token; 25/s after
		t.Fatalf("took %d, stats %+v; want the burst of 1 and one failure", n, l.Stats())
	}
}

func TestNewRefuses(t *testing.T) {
	for _, c := range []Config{{Rate: 5}, {Name: "x"}, {Name: string(make([]byte, 240)), Rate: 1}} {
		if _, err := New(c, nil, nil); err == nil {
			t.Fatalf("New(%+v) accepted", c)
		}
	}
}
