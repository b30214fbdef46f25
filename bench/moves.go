package bench

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"

	"redcell/model"
	"redcell/sharding"
)

// LiveCell is one cell of the live shard map (the router's /healthz).
type LiveCell struct {
	Name   string `json:"name"`
	Shards string `json:"shards"`
}

// Move is one database to move from one cell to another.
type Move struct {
	DB   int    `json:"db"`
	From string `json:"from"`
	To   string `json:"to"`
}

// PlannedCell is one cell of a MovePlan: its ranges now and after.
type PlannedCell struct {
	Name    string `json:"name"`
	Before  string `json:"before"` // "" for a new cell
	After   string `json:"after"`  // "" for a cell removed
	New     bool   `json:"new,omitempty"`
	Removed bool   `json:"removed,omitempty"`
}

// MovePlan is how the databases of a live map spread over another number
// of cells, moving as few as it can.
type MovePlan struct {
	Cells []PlannedCell `json:"cells"`
	Moves []Move        `json:"moves"`
}

var cellNumber = regexp.MustCompile(`^(.*?)(\d+)$`)

// PlanMoves spreads the 100 databases over cells cells, starting from the
// live map: existing cells in name order come first and keep their lowest
// databases up to their share (100 / cells, the first ones one more), the
// cells past cells (the last by name) are removed, new cells are named on
// from the highest existing number ("cell-3" after "cell-2"), and every
// database over a share moves, lowest first, to the first cell under its
// share. Errors: a live range that splits a database, a database owned
// twice or by no cell, cells outside 1..100.
func PlanMoves(live []LiveCell, cells int) (MovePlan, error) {
	if cells < 1 || cells > model.DBCount {
		return MovePlan{}, fmt.Errorf("bench: plan for %d cells: must be 1..%d (a cell owns whole databases)", cells, model.DBCount)
	}
	owner := make([]string, model.DBCount)
	have := map[string][]int{}
	var names []string
	for _, c := range live {
		r, err := sharding.Ranges{}, error(nil)
		if c.Shards != "" { // a cell that owns nothing yet
			r, err = sharding.ParseRanges(c.Shards)
		}
		if err == nil {
			err = r.CheckWholeDBs()
		}
		if err != nil {
			return MovePlan{}, fmt.Errorf("bench: live cell %s: %w", c.Name, err)
		}
		if _, dup := have[c.Name]; dup {
			return MovePlan{}, fmt.Errorf("bench: live map lists cell %s twice", c.Name)
		}
		names = append(names, c.Name)
		for _, db := range r.DBs() {
			if owner[db] != "" {
				return MovePlan{}, fmt.Errorf("bench: db_%02d is owned by %s and %s", db, owner[db], c.Name)
			}
			owner[db] = c.Name
			have[c.Name] = append(have[c.Name], db)
		}
	}
	for db, o := range owner {
		if o == "" {
			return MovePlan{}, fmt.Errorf("bench: db_%02d has no owner in the live map (a cell down?): plan when every database is served", db)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(a, b) })
	kept, removed := names, []string(nil)
	if cells < len(names) {
		kept, removed = names[:cells], names[cells:]
	}
	targets := slices.Clone(kept)
	prefix, next := "cell-", 0
	for _, n := range names {
		if m := cellNumber.FindStringSubmatch(n); m != nil {
			if v, _ := strconv.Atoi(m[2]); v >= next {
				prefix, next = m[1], v+1
			}
		}
	}
	isNew := map[string]bool{}
	for len(targets) < cells {
		name := prefix + strconv.Itoa(next)
		next++
		targets = append(targets, name)
		isNew[name] = true
	}
	per, extra := model.DBCount/cells, model.DBCount%cells
	share := func(i int) int {
		if i < extra {
			return per + 1
		}
		return per
	}
	after := map[string][]int{}
	var pool []int
	for i, name := range targets {
		dbs := have[name]
		keep := min(len(dbs), share(i))
		after[name] = slices.Clone(dbs[:keep])
		pool = append(pool, dbs[keep:]...)
	}
	for _, name := range removed {
		pool = append(pool, have[name]...)
	}
	slices.Sort(pool)
	var moves []Move
	for i, name := range targets {
		for len(after[name]) < share(i) && len(pool) > 0 {
			db := pool[0]
			pool = pool[1:]
			after[name] = append(after[name], db)
			moves = append(moves, Move{DB: db, From: owner[db], To: name})
		}
	}
	if len(pool) > 0 {
		return MovePlan{}, fmt.Errorf("bench: %d databases left without a cell (a bug)", len(pool))
	}
	slices.SortFunc(moves, func(a, b Move) int { return cmp.Compare(a.DB, b.DB) })
	var plan MovePlan
	for _, name := range append(slices.Clone(targets), removed...) {
		pc := PlannedCell{Name: name, New: isNew[name], Removed: slices.Contains(removed, name)}
		if r, err := sharding.RangesOfDBs(have[name]); err == nil && len(r) > 0 {
			pc.Before = r.String()
		}
		if r, err := sharding.RangesOfDBs(after[name]); err == nil && len(r) > 0 {
			pc.After = r.String()
		}
		plan.Cells = append(plan.Cells, pc)
	}
	plan.Moves = moves
	return plan, nil
}

// WriteText prints the cells before and after and the moves, runs of
// neighbouring databases between the same two cells on one line.
func (p MovePlan) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("cells (shard ranges now → after):\n")
	for _, c := range p.Cells {
		note := ""
		switch {
		case c.New:
			note = "  (new)"
		case c.Removed:
			note = "  (removed)"
		}
		ew.printf("  %-10s %-24s → %s%s\n", c.Name, orNone(c.Before), orNone(c.After), note)
	}
	ew.printf("databases to move: %d of %d (%d shards)\n", len(p.Moves), model.DBCount, len(p.Moves)*model.ShardsPerDB)
	for i := 0; i < len(p.Moves); {
		j := i + 1
		for j < len(p.Moves) && p.Moves[j].DB == p.Moves[j-1].DB+1 && p.Moves[j].From == p.Moves[i].From && p.Moves[j].To == p.Moves[i].To {
			j++
		}
		first, last := p.Moves[i].DB, p.Moves[j-1].DB
		if first == last {
			ew.printf("  db_%02d         %s → %s\n", first, p.Moves[i].From, p.Moves[i].To)
		} else {
			ew.printf("  db_%02d..db_%02d  %s → %s\n", first, last, p.Moves[i].From, p.Moves[i].To)
		}
		i = j
	}
	return ew.err
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
