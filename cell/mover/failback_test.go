package mover

import "testing"

// TestMergeGTIDState: per domain and server id, the higher sequence number
// of the two states wins; pairs only one state has are kept.
func TestMergeGTIDState(t *testing.T) {
	got, err := mergeGTIDState("2-2-496,0-1-7", "2-2-500,12-12-900,0-1-3")
	if err != nil || got != "2-2-500,0-1-7,12-12-900" {
		t.Fatalf("merged %q, %v", got, err)
	}
	if got, err := mergeGTIDState("", "12-12-1"); err != nil || got != "12-12-1" {
		t.Fatalf("merged %q, %v", got, err)
	}
	if _, err := mergeGTIDState("2-x-1", ""); err == nil {
		t.Fatal("a bad GTID merged")
	}
}
