package scenelimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
	"redcell/internal/testenv"
)

// cells makes n Limits on the test memcached, as n cells would, on clk.
func cells(t *testing.T, n int, clk clock.Clock) []*Limits {
	t.Helper()
	mc := memcache.New(testenv.Memcached(t))
	prefix := "rc:test:scene:" + testenv.Prefix() + ":"
	var out []*Limits
	for range n {
		out = append(out, New(mc, prefix, func() int { return n }, clk))
	}
	return out
}

// boundHolds checks every span between two accepted issues: at most burst +
// perSec·T accepted in it.
func boundHolds(t *testing.T, at []time.Time, perSec, burst int) {
	t.Helper()
	for i := range at {
		for j := i; j < len(at); j++ {
			n := j - i + 1
			if lim := float64(burst) + float64(perSec)*at[j].Sub(at[i]).Seconds(); float64(n) > lim {
				t.Fatalf("%d issues accepted in the %v from %v: above burst + per_sec·T = %.1f", n, at[j].Sub(at[i]), at[i], lim)
			}
		}
	}
}

// Two cells offered a scene at 4x its rate for 5 s (each at twice the rate,
// with a burst of 30 at the start and one in the middle): over every span T
// they accept at most burst + per_sec·T together, and all of it (the limit
// is used, not just obeyed). Two per-cell buckets of the same rate would
// accept about twice that.
func TestClusterBound(t *testing.T) {
	const perSec, burst, secs, factor = 40, 20, 5, 4
	clk := clock.NewManual(time.Unix(1_900_000_000, 0))
	cs := cells(t, 2, clk)
	scene := "fest/fest-off/rain-" + testenv.Prefix()
	var at []time.Time
	try := func(c int) {
		if ok, wait := cs[c].Allow(scene, perSec, burst); ok {
			at = append(at, clk.Now())
		} else if wait <= 0 || wait > time.Second {
			t.Fatalf("refused with wait %v: want (0, 1s]", wait)
		}
	}
	start := clk.Now()
	step := time.Second / (perSec * factor)
	for i := range perSec * factor * secs {
		if i == 0 || i == perSec*factor*secs/2 {
			for k := range 30 {
				try(k % 2)
			}
		}
		try(i % 2)
		clk.Advance(step)
	}
	span := clk.Now().Sub(start)
	boundHolds(t, at, perSec, burst)
	if lo := burst + int(perSec*span.Seconds()) - 2; len(at) < lo {
		t.Fatalf("%d accepted in %v, want at least %d: the limit is there to be used", len(at), span, lo)
	}
	t.Logf("%d accepted over %v by two cells (bound %d + %d/s)", len(at), span, burst, perSec)
}

// A new rate holds from the next call: a scene throttled at 1/s with a
// burst of 2 takes a burst of 50 at once when the rate becomes 100/s, then
// refuses the 51st; back at the old rate, the old bucket is still spent.
func TestRateChangeHoldsAtOnce(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_000, 0))
	c := cells(t, 1, clk)[0]
	scene := "fest/fest-off/change-" + testenv.Prefix()
	count := func(n, perSec, burst int) int {
		ok := 0
		for range n {
			if a, _ := c.Allow(scene, perSec, burst); a {
				ok++
			}
		}
		return ok
	}
	if got := count(10, 1, 2); got != 2 {
		t.Fatalf("at 1/s, burst 2: %d of 10 accepted, want 2", got)
	}
	if got := count(60, 100, 50); got != 50 {
		t.Fatalf("after the change to 100/s, burst 50: %d of 60 accepted, want 50", got)
	}
	if got := count(5, 1, 2); got != 0 {
		t.Fatalf("back at 1/s: %d accepted, want 0 (its bucket is still spent)", got)
	}
	clk.Advance(time.Second)
	if got := count(5, 1, 2); got != 1 {
		t.Fatalf("a second later at 1/s: %d accepted, want 1", got)
	}
}

// Without memcached each of N cells takes per_sec/N and burst/N; a scene the
// tree no longer has is forgotten by Keep.
func TestFallbackAndKeep(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_900_000_000, 0))
	l := New(nil, "rc:scene:", func() int { return 4 }, clk)
	ok := 0
	for range 20 {
		if a, _ := l.Allow("fest/off/rain", 40, 20); a {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("alone, one of 4 cells: %d of 20 accepted at once, want burst/4 = 5", ok)
	}
	clk.Advance(time.Second)
	ok = 0
	for range 20 {
		if a, _ := l.Allow("fest/off/rain", 40, 20); a {
			ok++
		}
	}
	if ok != 5 { // 10 tokens a second at 40/4, capped by the burst of 5
		t.Fatalf("a second later: %d accepted, want 5", ok)
	}
	l.Allow("fest/off/card", 40, 20)
	l.Keep(func(k string) bool { return k == "fest/off/card" })
	if _, ok := l.scenes["fest/off/rain"]; ok || len(l.scenes) != 1 {
		t.Fatalf("after Keep: %v", fmt.Sprint(l.scenes))
	}
}
