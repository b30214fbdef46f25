package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSimCommand: `redcell sim` prints each seed with its steps and ops and
// OK; with a planted bug it fails, names the seed and the command that
// replays it, and shows that the replay failed the same way.
func TestSimCommand(t *testing.T) {
	var out bytes.Buffer
	if err := simulate([]string{"--seed", "3", "--seeds", "2", "--steps", "2000"}, &out); err != nil {
		t.Fatalf("sim: %v\n%s", err, out.String())
	}
	for _, want := range []string{"2 seed(s) [3 4]", "seed 3: 2000 steps, ", "seed 4: 2000 steps, ", ": OK"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	err := simulate([]string{"--seed", "3", "--steps", "2000", "--plant", "credit-twice", "--shrink", "3"}, &out)
	if err == nil || !strings.Contains(err.Error(), "seed 3 failed") {
		t.Fatalf("planted bug: error %v\n%s", err, out.String())
	}
	for _, want := range []string{"seed 3: ", "FAILED", "replay: redcell sim --seed 3 --steps 2000 --plant credit-twice", "credited twice", "the replay failed the same way"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log(out.String())
}
