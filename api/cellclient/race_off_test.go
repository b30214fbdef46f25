//go:build !race

package cellclient

// raceEnabled: see race_on_test.go.
const raceEnabled = false
