package model

import (
	"math/rand/v2"

	"redcell/internal/invariant"
)

// DrawSeed is an open batch's own seed, taken once per batch from the
// caller's source (TakeDrawSeed): the batch's double-mean draws come from a
// source made from it (Rand). A batch decided again, because its
// transaction ran again (a deadlock, or a repeat the claim table's unique
// key caught), draws the same shares in the same order, and a store that
// decides a batch once draws what one that decided it twice does.
type DrawSeed [2]uint64

// TakeDrawSeed takes a batch's seed from r: two draws, whatever the batch
// holds. r must not be nil (a broken invariant: it panics).
func TakeDrawSeed(r *rand.Rand) DrawSeed {
	invariant.That(r != nil, "an open batch without a random source")
	return DrawSeed{r.Uint64(), r.Uint64()}
}

// Rand is a new source of the batch's draws, from the first: each call
// starts the same sequence again.
func (s DrawSeed) Rand() *rand.Rand { return rand.New(rand.NewPCG(s[0], s[1])) }
