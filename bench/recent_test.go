package bench

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestRecentPickEmpty(t *testing.T) {
	r := newRecent(4, 10)
	if _, _, ok := r.pick(rand.New(rand.NewPCG(1, 1)), nil); ok {
		t.Fatal("pick on an empty ring returned a packet")
	}
	if got := r.liveCount(); got != 0 {
		t.Fatalf("liveCount = %d, want 0", got)
	}
}

func TestRecentEvictsOldest(t *testing.T) {
	r := newRecent(3, 10)
	for i := range 5 {
		if seq := r.add(fmt.Sprintf("p%d", i)); seq != uint64(i) {
			t.Fatalf("add #%d returned seq %d", i, seq)
		}
	}
	if got := r.oldest(); got != 2 {
		t.Fatalf("oldest = %d, want 2", got)
	}
	if got := r.liveCount(); got != 3 {
		t.Fatalf("liveCount = %d, want 3 (the ring size)", got)
	}
	seen := map[string]uint64{}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		seq, id, ok := r.pick(rnd, nil)
		if !ok {
			t.Fatal("pick found nothing in a full ring")
		}
		seen[id] = seq
	}
	want := map[string]uint64{"p2": 2, "p3": 3, "p4": 4}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("picked %v, want exactly %v", seen, want)
	}
}

func TestRecentSkipsOpenedAndRetired(t *testing.T) {
	r := newRecent(8, 10)
	for i := range 4 {
		r.add(fmt.Sprintf("p%d", i))
	}
	r.retire(1)
	r.retire(1) // twice is harmless
	skip := map[uint64]struct{}{0: {}, 3: {}}
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		seq, id, ok := r.pick(rnd, skip)
		if !ok || seq != 2 || id != "p2" {
			t.Fatalf("pick = %d %q %v, want 2 p2 true", seq, id, ok)
		}
	}
	skip[2] = struct{}{}
	if seq, id, ok := r.pick(rnd, skip); ok {
		t.Fatalf("pick = %d %q, want nothing: every packet is opened or retired", seq, id)
	}
	if got := r.liveCount(); got != 3 {
		t.Fatalf("liveCount = %d, want 3", got)
	}
}

func TestRecentRetireAfterAttempts(t *testing.T) {
	r := newRecent(4, 3)
	seq := r.add("p0")
	r.attempted(seq)
	r.attempted(seq)
	if got := r.liveCount(); got != 1 {
		t.Fatalf("after 2 of 3 attempts liveCount = %d, want 1", got)
	}
	r.attempted(seq)
	if got := r.liveCount(); got != 0 {
		t.Fatalf("after 3 of 3 attempts liveCount = %d, want 0", got)
	}
	r.attempted(seq) // after retirement: no effect, no negative count
	if got := r.liveCount(); got != 0 {
		t.Fatalf("liveCount = %d after an extra attempt, want 0", got)
	}
}

func TestRecentRetireIgnoresEvictedSlot(t *testing.T) {
	r := newRecent(2, 10)
	r.add("p0")
	r.add("p1")
	r.add("p2") // evicts p0; its slot now holds p2
	r.retire(0) // stale: must not retire p2
	r.attempted(0)
	seen := map[string]bool{}
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 100 {
		_, id, _ := r.pick(rnd, nil)
		seen[id] = true
	}
	if !seen["p1"] || !seen["p2"] || len(seen) != 2 {
		t.Fatalf("picked %v, want p1 and p2", seen)
	}
}

func TestRecentPrune(t *testing.T) {
	r := newRecent(2, 10)
	for i := range 5 {
		r.add(fmt.Sprintf("p%d", i))
	}
	opened := map[uint64]struct{}{0: {}, 1: {}, 2: {}, 3: {}, 4: {}}
	r.prune(opened)
	if len(opened) != 2 {
		t.Fatalf("after prune opened = %v, want only 3 and 4", opened)
	}
	for _, s := range []uint64{3, 4} {
		if _, ok := opened[s]; !ok {
			t.Fatalf("prune dropped %d, still in the ring", s)
		}
	}
}

// TestRecentConcurrent runs adds, picks and retires at once; with -race it
// checks the locking, and the live count must end consistent.
func TestRecentConcurrent(t *testing.T) {
	r := newRecent(16, 2)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			opened := map[uint64]struct{}{}
			for i := range 500 {
				r.add(fmt.Sprintf("w%d-%d", w, i))
				if seq, _, ok := r.pick(rnd, opened); ok {
					opened[seq] = struct{}{}
					r.attempted(seq)
				}
				r.prune(opened)
			}
		})
	}
	wg.Wait()
	live := 0
	for _, s := range r.slots {
		if s.id != "" {
			live++
		}
	}
	if live != r.liveCount() {
		t.Fatalf("liveCount = %d, but %d slots hold a packet", r.liveCount(), live)
	}
}
