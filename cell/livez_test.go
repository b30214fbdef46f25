package cell_test

import (
	"testing"

	"redcell/api"
)

// TestLivez: GET /livez answers 200 with the cell's name, unsigned; it
// reads nothing (the router's health probes ask it).
func TestLivez(t *testing.T) {
	c := startCell(t, "cell-a", "0-999", 1, nil, nil)
	var out struct{ Cell string }
	if st, code := exchange(t, newRequest(nil, "GET", c.url+api.LivePath, nil), &out); st != 200 || out.Cell != "cell-a" {
		t.Fatalf("/livez: %d %s %+v", st, code, out)
	}
}
