package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"redcell/sharding"
)

func TestNewPlan(t *testing.T) {
	tests := []struct {
		target, perCell, headroom float64
		cells, dbs, remainder     int
		first, last               string // the first and last cell's ranges
	}{
		{1000, 100, 0.7, 15, 6, 10, "0-69", "940-999"}, // 1000/70 = 14.3 -> 15; 10 cells own 7
		{700, 100, 0.7, 10, 10, 0, "0-99", "900-999"},  // exactly 10: float error must not make it 11
		{701, 100, 0.7, 11, 9, 1, "0-99", "910-999"},
		{1, 1e6, 0.7, 1, 100, 0, "0-999", "0-999"}, // at least one cell
		{100_000, 5000, 1, 20, 5, 0, "0-49", "950-999"},
		{3000, 1000, 1, 3, 33, 1, "0-339", "670-999"}, // one cell owns 34
		{100_000, 1000, 1, 100, 1, 0, "0-9", "990-999"},
	}
	for _, tt := range tests {
		p, err := NewPlan(tt.target, tt.perCell, tt.headroom, "test")
		if err != nil {
			t.Errorf("NewPlan(%v, %v, %v): %v", tt.target, tt.perCell, tt.headroom, err)
			continue
		}
		if p.Cells != tt.cells || p.DBsPerCell != tt.dbs || p.DBsRemainder != tt.remainder {
			t.Errorf("NewPlan(%v, %v, %v) = %d cells of %d (+%d), want %d of %d (+%d)",
				tt.target, tt.perCell, tt.headroom, p.Cells, p.DBsPerCell, p.DBsRemainder, tt.cells, tt.dbs, tt.remainder)
		}
		if p.Cells*p.DBsPerCell+p.DBsRemainder != 100 {
			t.Errorf("%d cells × %d + %d != 100 databases", p.Cells, p.DBsPerCell, p.DBsRemainder)
		}
		// The layout covers every shard once, in whole databases.
		if len(p.Layout) != p.Cells || p.Layout[0] != tt.first || p.Layout[len(p.Layout)-1] != tt.last {
			t.Errorf("NewPlan(%v, %v, %v) layout %v, want %d cells from %s to %s", tt.target, tt.perCell, tt.headroom, p.Layout, tt.cells, tt.first, tt.last)
			continue
		}
		var cells []sharding.Cell
		for i, l := range p.Layout {
			r, err := sharding.ParseRanges(l)
			if err == nil {
				err = r.CheckWholeDBs()
			}
			if err != nil {
				t.Fatalf("layout %q: %v", l, err)
			}
			cells = append(cells, sharding.Cell{Name: fmt.Sprintf("cell-%03d", i), Shards: r})
		}
		if m, conflicts := sharding.NewMap(cells); len(conflicts) > 0 || m.Uncovered() > 0 {
			t.Errorf("layout %v: conflicts %v, %d shards without an owner", p.Layout, conflicts, m.Uncovered())
		}
	}
	for _, bad := range [][3]float64{{0, 100, 0.7}, {100, 0, 0.7}, {100, 100, 0}, {100, 100, 1.2}, {100_001, 1000, 1}} {
		if _, err := NewPlan(bad[0], bad[1], bad[2], "test"); err == nil {
			t.Errorf("NewPlan(%v) accepted", bad)
		}
	}
	p, _ := NewPlan(3000, 1000, 0.7, "measured")
	var b bytes.Buffer
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cells                        5 = ceil(3000.0 / (1000.0 × 0.70))", "databases per cell          20", "cell 5   shards 800-999", "assumptions:", "one packet lives in one cell"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("plan text lacks %q:\n%s", want, b.String())
		}
	}
}

func TestPerCellRateFrom(t *testing.T) {
	s := comparedSuite()           // hot runs at 100, 200, 300 opens/s, all passing
	s.Runs[2].Audit.Difference = 1 // the fastest lost money: it does not count
	b, _ := json.Marshal(s)
	rate, src, err := PerCellRateFrom(b)
	if err != nil || rate != 200 || !strings.Contains(src, "serial") {
		t.Fatalf("PerCellRateFrom(suite) = %v %q %v", rate, src, err)
	}
	r := passing() // smoke at 20 opens/s over 4 cells
	r.Cells = 4
	b, _ = json.Marshal(r)
	if rate, _, err := PerCellRateFrom(b); err != nil || rate != 5 {
		t.Fatalf("PerCellRateFrom(report) = %v %v", rate, err)
	}
	r.Open.Errors["OVERLOADED"] = 1
	b, _ = json.Marshal(r)
	if _, _, err := PerCellRateFrom(b); err == nil {
		t.Fatal("a failed run was planned from")
	}
	if _, _, err := PerCellRateFrom([]byte("nope")); err == nil {
		t.Fatal("garbage accepted")
	}
}
