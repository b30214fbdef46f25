//go:build race

package memstore

// raceEnabled: under the race detector (make race) the long single-goroutine
// money runs take a fraction of their ops: the race run adds nothing to them
// but time, and make unit runs them whole.
const raceEnabled = true
