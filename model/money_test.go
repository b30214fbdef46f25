package model

import (
	"math/rand/v2"
	"testing"
)

// TestSplitProperties checks the double-mean split over many random packets:
// every share >= 1 cent, the shares sum to exactly the total, the count is right,
// and no draw exceeds twice the remaining average.
func TestSplitProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		count := 1 + r.Int64N(200)
		total := Cents(count + r.Int64N(100000))
		if i%10 == 0 {
			total = Cents(count) // the tightest case: every share exactly 1
		}
		remaining, left := total, count
		var sum Cents
		for left > 0 {
			s := SplitNext(remaining, left, r)
			if s < 1 {
				t.Fatalf("share %d < 1 (total %d count %d)", s, total, count)
			}
			if left > 1 && s > 2*remaining/Cents(left) {
				t.Fatalf("share %d above twice the mean of %d over %d", s, remaining, left)
			}
			remaining -= s
			left--
			if remaining < Cents(left) {
				t.Fatalf("remaining %d cannot give %d shares a cent", remaining, left)
			}
			sum += s
		}
		if sum != total || remaining != 0 {
			t.Fatalf("shares sum to %d, total %d", sum, total)
		}
	}
}

func TestSplitKinds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fixed := Split(KindFixed, 1000, 10, r)
	for _, s := range fixed {
		if s != 100 {
			t.Fatalf("fixed share %d, want 100", s)
		}
	}
	random := Split(KindRandom, 1000, 10, r)
	var sum Cents
	distinct := map[Cents]bool{}
	for _, s := range random {
		sum += s
		distinct[s] = true
	}
	if sum != 1000 || len(random) != 10 {
		t.Fatalf("random split %v sums to %d", random, sum)
	}
	if len(distinct) < 3 {
		t.Fatalf("random split %v is not random", random)
	}
	// The last share takes the exact remainder.
	if got := SplitNext(7, 1, r); got != 7 {
		t.Fatalf("last share %d, want 7", got)
	}
}

func TestSplitPanicsOnImpossiblePacket(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("split of 3 cents into 4 shares did not panic")
		}
	}()
	SplitNext(3, 4, rand.New(rand.NewPCG(1, 1)))
}

func BenchmarkSplitNext(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		SplitNext(100000, 100, r)
	}
}
