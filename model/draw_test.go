package model

import (
	"math/rand/v2"
	"testing"
)

// TestDrawSeed: a seed's sources draw the same sequence each time, two
// batches' seeds taken in turn from one source differ, and taking a seed
// moves the caller's source by exactly two draws; a nil source panics.
func TestDrawSeed(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	a, b := TakeDrawSeed(r), TakeDrawSeed(r)
	if a == b {
		t.Fatalf("two batches share the seed %v", a)
	}
	x, y := a.Rand(), a.Rand()
	for i := 0; i < 10; i++ {
		if u, v := x.Uint64(), y.Uint64(); u != v {
			t.Fatalf("draw %d: %d then %d from one seed", i, u, v)
		}
	}
	ref := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 4; i++ {
		ref.Uint64()
	}
	if got, want := r.Uint64(), ref.Uint64(); got != want {
		t.Errorf("after two seeds the source gives %d, want %d (four draws taken)", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("a nil source gave a seed")
		}
	}()
	TakeDrawSeed(nil)
}
