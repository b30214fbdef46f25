package bench

import (
	"bytes"
	"strings"
	"testing"

	"redcell/model"
	"redcell/sharding"
)

// TestPlanMoves: two cells grow to three by moving a third of the
// databases, the rest staying put; three shrink back to two; every plan
// leaves each database with one owner, shares within one of each other.
func TestPlanMoves(t *testing.T) {
	two := []LiveCell{{Name: "cell-2", Shards: "500-999"}, {Name: "cell-1", Shards: "0-499"}}
	p, err := PlanMoves(two, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []PlannedCell{
		{Name: "cell-1", Before: "0-499", After: "0-339"},
		{Name: "cell-2", Before: "500-999", After: "500-829"},
		{Name: "cell-3", After: "340-499,830-999", New: true},
	}
	if len(p.Cells) != 3 || p.Cells[0] != want[0] || p.Cells[1] != want[1] || p.Cells[2] != want[2] {
		t.Fatalf("cells %+v, want %+v", p.Cells, want)
	}
	if len(p.Moves) != 33 || p.Moves[0] != (Move{DB: 34, From: "cell-1", To: "cell-3"}) || p.Moves[32] != (Move{DB: 99, From: "cell-2", To: "cell-3"}) {
		t.Fatalf("%d moves: %+v", len(p.Moves), p.Moves)
	}
	checkCovers(t, p)
	var b bytes.Buffer
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"databases to move: 33 of 100 (330 shards)", "db_34..db_49  cell-1 → cell-3", "db_83..db_99  cell-2 → cell-3", "(new)"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("plan text lacks %q:\n%s", line, b.String())
		}
	}

	// And back: cell-3 removed, its databases to the others.
	three := []LiveCell{{Name: "cell-1", Shards: want[0].After}, {Name: "cell-2", Shards: want[1].After}, {Name: "cell-3", Shards: want[2].After}}
	back, err := PlanMoves(three, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkCovers(t, back)
	if len(back.Moves) != 33 || !back.Cells[2].Removed || back.Cells[2].After != "" {
		t.Fatalf("removing cell-3: %+v", back)
	}
	for _, m := range back.Moves {
		if m.From != "cell-3" {
			t.Fatalf("removing cell-3 moves %+v", m)
		}
	}
	// The same count: nothing moves.
	if same, err := PlanMoves(two, 2); err != nil || len(same.Moves) != 0 {
		t.Fatalf("two cells to two: %+v, %v", same, err)
	}
	// Ten cells from one: 90 databases move, each new cell gets 10.
	ten, err := PlanMoves([]LiveCell{{Name: "c1", Shards: "0-999"}}, 10)
	if err != nil || len(ten.Moves) != 90 || ten.Cells[9].Name != "c10" {
		t.Fatalf("one cell to ten: %d moves, %+v, %v", len(ten.Moves), ten.Cells, err)
	}
	checkCovers(t, ten)

	for name, live := range map[string][]LiveCell{
		"split database": {{Name: "a", Shards: "0-332"}, {Name: "b", Shards: "333-999"}},
		"uncovered":      {{Name: "a", Shards: "0-499"}},
		"owned twice":    {{Name: "a", Shards: "0-509"}, {Name: "b", Shards: "500-999"}},
	} {
		if _, err := PlanMoves(live, 2); err == nil {
			t.Errorf("%s: planned", name)
		}
	}
	for _, n := range []int{0, 101} {
		if _, err := PlanMoves(two, n); err == nil {
			t.Errorf("%d cells planned", n)
		}
	}
}

// checkCovers: after the plan every shard has one owner, and no cell owns
// more than one database more than another.
func checkCovers(t *testing.T, p MovePlan) {
	t.Helper()
	var cells []sharding.Cell
	lo, hi := model.DBCount, 0
	for _, c := range p.Cells {
		if c.Removed {
			continue
		}
		r, err := sharding.ParseRanges(c.After)
		if err != nil {
			t.Fatalf("%s after: %q: %v", c.Name, c.After, err)
		}
		cells = append(cells, sharding.Cell{Name: c.Name, Shards: r})
		lo, hi = min(lo, len(r.DBs())), max(hi, len(r.DBs()))
	}
	if m, conflicts := sharding.NewMap(cells); len(conflicts) > 0 || m.Uncovered() > 0 || hi-lo > 1 {
		t.Fatalf("after the plan: conflicts %v, %d uncovered, shares %d..%d", conflicts, m.Uncovered(), lo, hi)
	}
}

// TestPlanMovesByRate: a plan by measured rates moves the hot database that
// evens two cells out (where a plan by count moves none), fills a new cell
// up to about the mean, gives a removed cell's databases hottest first to
// the cell with the least load, and refuses when nothing was measured.
func TestPlanMovesByRate(t *testing.T) {
	two := []LiveCell{{Name: "cell-1", Shards: "0-499"}, {Name: "cell-2", Shards: "500-999"}}
	rates := map[int]float64{}
	for db := range model.DBCount {
		rates[db] = 1
	}
	rates[3], rates[4] = 100, 80 // cell-1 228/s, cell-2 50/s
	p, err := PlanMovesByRate(two, 2, rates)
	if err != nil {
		t.Fatal(err)
	}
	// gap 178: db_04 (80) is nearest half of it; after it 148 and 130, within
	// 10 % of the mean (139).
	if len(p.Moves) != 1 || p.Moves[0] != (Move{DB: 4, From: "cell-1", To: "cell-2"}) || !p.ByRate {
		t.Fatalf("moves %+v (by rate %v), want db_04 cell-1 → cell-2", p.Moves, p.ByRate)
	}
	if c := p.Cells[0]; c.RateBefore != 228 || c.RateAfter != 148 || c.After != "0-39,50-499" {
		t.Fatalf("cell-1: %+v", c)
	}
	if c := p.Cells[1]; c.RateBefore != 50 || c.RateAfter != 130 || c.After != "40-49,500-999" {
		t.Fatalf("cell-2: %+v", c)
	}
	if same, err := PlanMoves(two, 2); err != nil || len(same.Moves) != 0 {
		t.Fatalf("by count the same map needs no move: %+v %v", same.Moves, err)
	}
	var buf bytes.Buffer
	if err := p.WriteText(&buf); err != nil || !strings.Contains(buf.String(), "228.0 → 148.0 ops/s") {
		t.Fatalf("text: %v\n%s", err, buf.String())
	}

	// A new cell: uniform rates, so about a third of the databases go to it.
	for db := range model.DBCount {
		rates[db] = 1
	}
	p, err = PlanMovesByRate(two, 3, rates)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, p)
	for _, c := range p.Cells {
		if c.RateAfter > 100.0/3*(1+RateTolerance) || c.RateAfter < 100.0/3*(1-2*RateTolerance) {
			t.Errorf("%s after the plan: %.1f ops/s, mean %.1f", c.Name, c.RateAfter, 100.0/3)
		}
	}
	if n := len(p.Moves); n < 27 || n > 33 {
		t.Errorf("%d moves to fill a new cell with a third of uniform load", n)
	}

	// A removed cell: its hot databases go to the least loaded cells first.
	three := []LiveCell{{Name: "cell-1", Shards: "0-339"}, {Name: "cell-2", Shards: "340-669"}, {Name: "cell-3", Shards: "670-999"}}
	rates[70], rates[71] = 50, 40
	p, err = PlanMovesByRate(three, 2, rates)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, p)
	to := map[int]string{}
	for _, m := range p.Moves {
		if m.From != "cell-3" {
			t.Errorf("move %+v: only cell-3's databases go", m)
		}
		to[m.DB] = m.To
	}
	if len(p.Moves) != 33 || to[70] == to[71] {
		t.Errorf("%d moves; db_70 to %s and db_71 to %s (the two hottest should split)", len(p.Moves), to[70], to[71])
	}

	if _, err := PlanMovesByRate(two, 2, map[int]float64{}); err == nil {
		t.Fatal("a plan by rates with no rate measured: no error")
	}
}

// checkCover fails unless the plan's ranges after cover every shard once.
func checkCover(t *testing.T, p MovePlan) {
	t.Helper()
	seen := make([]int, model.DBCount)
	for _, c := range p.Cells {
		if c.After == "" {
			continue
		}
		r, err := sharding.ParseRanges(c.After)
		if err != nil {
			t.Fatal(err)
		}
		for _, db := range r.DBs() {
			seen[db]++
		}
	}
	for db, n := range seen {
		if n != 1 {
			t.Fatalf("db_%02d owned %d times after the plan: %+v", db, n, p.Cells)
		}
	}
}
