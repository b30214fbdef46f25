//go:build race

package cell_test

// raceEnabled: under the race detector (make race) the tests that only
// wait for real time are left to make unit.
const raceEnabled = true
