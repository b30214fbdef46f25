package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewPlan(t *testing.T) {
	tests := []struct {
		target, perCell, headroom float64
		cells, shards, remainder  int
	}{
		{1000, 100, 0.7, 15, 66, 10}, // 1000/70 = 14.3 -> 15
		{700, 100, 0.7, 10, 100, 0},  // exactly 10: float error must not make it 11
		{701, 100, 0.7, 11, 90, 10},
		{1, 1e6, 0.7, 1, 1000, 0}, // at least one cell
		{100_000, 5000, 1, 20, 50, 0},
		{3000, 1000, 1, 3, 333, 1}, // one cell owns 334
		{1_000_000, 1000, 1, 1000, 1, 0},
	}
	for _, tt := range tests {
		p, err := NewPlan(tt.target, tt.perCell, tt.headroom, "test")
		if err != nil {
			t.Errorf("NewPlan(%v, %v, %v): %v", tt.target, tt.perCell, tt.headroom, err)
			continue
		}
		if p.Cells != tt.cells || p.ShardsPerCell != tt.shards || p.ShardsRemainder != tt.remainder {
			t.Errorf("NewPlan(%v, %v, %v) = %d cells of %d (+%d), want %d of %d (+%d)",
				tt.target, tt.perCell, tt.headroom, p.Cells, p.ShardsPerCell, p.ShardsRemainder, tt.cells, tt.shards, tt.remainder)
		}
		if p.Cells*p.ShardsPerCell+p.ShardsRemainder != 1000 {
			t.Errorf("%d cells × %d + %d != 1000 shards", p.Cells, p.ShardsPerCell, p.ShardsRemainder)
		}
	}
	for _, bad := range [][3]float64{{0, 100, 0.7}, {100, 0, 0.7}, {100, 100, 0}, {100, 100, 1.2}, {2_000_000, 1000, 1}} {
		if _, err := NewPlan(bad[0], bad[1], bad[2], "test"); err == nil {
			t.Errorf("NewPlan(%v) accepted", bad)
		}
	}
	p, _ := NewPlan(3000, 1000, 0.7, "measured")
	var b bytes.Buffer
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cells                        5 = ceil(3000.0 / (1000.0 × 0.70))", "shards per cell            200", "assumptions:", "one packet lives in one cell"} {
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
