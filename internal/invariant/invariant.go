// Package invariant holds the assertion used for broken invariants: a condition
// that can only be false through a bug. Operating conditions (sold out, bad input,
// a lost connection) are errors, never assertions.
package invariant

// That panics with msg when cond is false.
func That(cond bool, msg string) {
	if !cond {
		panic("invariant violated: " + msg)
	}
}
