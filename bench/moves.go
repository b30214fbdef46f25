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
	// RateBefore and RateAfter are the cell's money operations a second
	// (the sums of its databases' measured rates), now and after the plan:
	// set in a plan by rates (PlanMovesByRate).
	RateBefore float64 `json:"rate_before,omitempty"`
	RateAfter  float64 `json:"rate_after,omitempty"`
}

// MovePlan is how the databases of a live map spread over another number
// of cells, moving as few as it can.
type MovePlan struct {
	Cells []PlannedCell `json:"cells"`
	Moves []Move        `json:"moves"`
	// ByRate: planned by measured rates (PlanMovesByRate), not by count.
	ByRate bool `json:"by_rate,omitempty"`
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
	lm, err := readLive(live, cells)
	if err != nil {
		return MovePlan{}, err
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
	for i, name := range lm.targets {
		dbs := lm.have[name]
		keep := min(len(dbs), share(i))
		after[name] = slices.Clone(dbs[:keep])
		pool = append(pool, dbs[keep:]...)
	}
	for _, name := range lm.removed {
		pool = append(pool, lm.have[name]...)
	}
	slices.Sort(pool)
	for i, name := range lm.targets {
		for len(after[name]) < share(i) && len(pool) > 0 {
			after[name] = append(after[name], pool[0])
			pool = pool[1:]
		}
	}
	if len(pool) > 0 {
		return MovePlan{}, fmt.Errorf("bench: %d databases left without a cell (a bug)", len(pool))
	}
	return lm.plan(after, nil), nil
}

// RateTolerance is how far above the mean a cell's rate may stay in a plan
// by rates (PlanMovesByRate): moves that would only even out less than that
// are not worth their write pauses, nor measurements this noisy.
const RateTolerance = 0.10

// PlanMovesByRate is PlanMoves by measured load instead of by count:
// rates[db] is database db's rate of money operations (per second, from the
// cells' redcell_cell_db_ops_total), and the plan evens out the cells' sums
// of them. The cells are chosen and named as PlanMoves does. The removed
// cells' databases go first, hottest first, each to the cell whose sum is
// lowest then; after that, while the highest sum is more than
// RateTolerance above the mean, the highest cell gives the lowest the
// database whose rate is nearest half their difference (and below it, so
// that every move lowers the higher of the two). A database that would go
// back and forth stays where it is. Errors: PlanMoves', and no rate
// measured at all (plan by count then).
func PlanMovesByRate(live []LiveCell, cells int, rates map[int]float64) (MovePlan, error) {
	lm, err := readLive(live, cells)
	if err != nil {
		return MovePlan{}, err
	}
	var total float64
	for db := range model.DBCount {
		total += max(rates[db], 0)
	}
	if total <= 0 {
		return MovePlan{}, fmt.Errorf("bench: no database had a measured rate: plan by count")
	}
	b := newRateBalance(lm, rates)
	b.placeRemoved()
	b.even(total / float64(len(lm.targets)))
	p := lm.plan(b.after, b.load)
	for i := range p.Cells {
		for _, db := range lm.have[p.Cells[i].Name] {
			p.Cells[i].RateBefore += b.rate(db)
		}
	}
	return p, nil
}

// rateBalance is PlanMovesByRate's work in progress: which databases each
// target cell holds after the moves planned so far, and their sum of rates.
type rateBalance struct {
	lm    liveMap
	rates map[int]float64  // by database: measured operations per second
	after map[string][]int // by target cell: its databases after the moves
	load  map[string]float64
}

// newRateBalance starts from the databases each target cell holds now.
func newRateBalance(lm liveMap, rates map[int]float64) *rateBalance {
	b := &rateBalance{lm: lm, rates: rates, after: map[string][]int{}, load: map[string]float64{}}
	for _, name := range lm.targets {
		b.after[name] = slices.Clone(lm.have[name])
		for _, db := range b.after[name] {
			b.load[name] += b.rate(db)
		}
	}
	return b
}

// rate is database db's measured rate; a negative one counts as 0.
func (b *rateBalance) rate(db int) float64 { return max(b.rates[db], 0) }

// lowest is the target cell with the lowest sum of rates.
func (b *rateBalance) lowest() string {
	return slices.MinFunc(b.lm.targets, func(x, y string) int { return cmp.Compare(b.load[x], b.load[y]) })
}

// highest is the target cell with the highest sum of rates.
func (b *rateBalance) highest() string {
	return slices.MaxFunc(b.lm.targets, func(x, y string) int { return cmp.Compare(b.load[x], b.load[y]) })
}

// give moves database db from cell from ("": a removed cell) to cell to.
func (b *rateBalance) give(db int, from, to string) {
	if from != "" {
		b.after[from] = slices.DeleteFunc(b.after[from], func(d int) bool { return d == db })
		b.load[from] -= b.rate(db)
	}
	b.after[to] = append(b.after[to], db)
	b.load[to] += b.rate(db)
}

// placeRemoved gives the removed cells' databases, hottest first, each to
// the cell whose sum is lowest then.
func (b *rateBalance) placeRemoved() {
	var pool []int
	for _, name := range b.lm.removed {
		pool = append(pool, b.lm.have[name]...)
	}
	hottestFirst := func(x, y int) int {
		if c := cmp.Compare(b.rate(y), b.rate(x)); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	}
	slices.SortFunc(pool, hottestFirst)
	for _, db := range pool {
		b.give(db, "", b.lowest())
	}
}

// even moves databases from the highest cell to the lowest while the
// highest sum is more than RateTolerance above mean: each time the
// database whose rate is nearest half their difference, and below it. A
// database moves at most once.
func (b *rateBalance) even(mean float64) {
	moved := map[int]bool{}
	for range model.DBCount * len(b.lm.targets) { // each move lowers the sum of squares: bounded anyway
		hi, lo := b.highest(), b.lowest()
		gap := b.load[hi] - b.load[lo]
		if b.load[hi] <= mean*(1+RateTolerance) || gap <= 0 {
			break
		}
		best, bestOff := -1, 0.0
		for _, db := range b.after[hi] {
			r := b.rate(db)
			if r <= 0 || r >= gap || moved[db] {
				continue
			}
			if off := abs(gap/2 - r); best < 0 || off < bestOff || off == bestOff && db < best {
				best, bestOff = db, off
			}
		}
		if best < 0 {
			break
		}
		moved[best] = true
		b.give(best, hi, lo)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// liveMap is a live map read for a plan: each database's owner, each cell's
// databases (lowest first), the cells the plan keeps or adds (targets, in
// order) and those it removes.
type liveMap struct {
	owner            []string
	have             map[string][]int
	targets, removed []string
	isNew            map[string]bool
}

func readLive(live []LiveCell, cells int) (liveMap, error) {
	if cells < 1 || cells > model.DBCount {
		return liveMap{}, fmt.Errorf("bench: plan for %d cells: must be 1..%d (a cell owns whole databases)", cells, model.DBCount)
	}
	lm := liveMap{owner: make([]string, model.DBCount), have: map[string][]int{}, isNew: map[string]bool{}}
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
			return liveMap{}, fmt.Errorf("bench: live cell %s: %w", c.Name, err)
		}
		if _, dup := lm.have[c.Name]; dup {
			return liveMap{}, fmt.Errorf("bench: live map lists cell %s twice", c.Name)
		}
		names = append(names, c.Name)
		lm.have[c.Name] = nil
		for _, db := range r.DBs() {
			if lm.owner[db] != "" {
				return liveMap{}, fmt.Errorf("bench: db_%02d is owned by %s and %s", db, lm.owner[db], c.Name)
			}
			lm.owner[db] = c.Name
			lm.have[c.Name] = append(lm.have[c.Name], db)
		}
	}
	for db, o := range lm.owner {
		if o == "" {
			return liveMap{}, fmt.Errorf("bench: db_%02d has no owner in the live map (a cell down?): plan when every database is served", db)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(a, b) })
	lm.targets = names
	if cells < len(names) {
		lm.targets, lm.removed = slices.Clone(names[:cells]), names[cells:]
	}
	lm.targets = slices.Clone(lm.targets)
	prefix, next := "cell-", 0
	for _, n := range names {
		if m := cellNumber.FindStringSubmatch(n); m != nil {
			if v, _ := strconv.Atoi(m[2]); v >= next {
				prefix, next = m[1], v+1
			}
		}
	}
	for len(lm.targets) < cells {
		name := prefix + strconv.Itoa(next)
		next++
		lm.targets = append(lm.targets, name)
		lm.isNew[name] = true
	}
	return lm, nil
}

// plan is the MovePlan from the live map to after (each target's databases);
// load, when given, is each target's rate after, and the rates before are
// summed from it and the moves.
func (lm liveMap) plan(after map[string][]int, load map[string]float64) MovePlan {
	var p MovePlan
	for _, name := range lm.targets {
		for _, db := range after[name] {
			if lm.owner[db] != name {
				p.Moves = append(p.Moves, Move{DB: db, From: lm.owner[db], To: name})
			}
		}
	}
	slices.SortFunc(p.Moves, func(a, b Move) int { return cmp.Compare(a.DB, b.DB) })
	for _, name := range append(slices.Clone(lm.targets), lm.removed...) {
		pc := PlannedCell{Name: name, New: lm.isNew[name], Removed: slices.Contains(lm.removed, name)}
		if r, err := sharding.RangesOfDBs(lm.have[name]); err == nil && len(r) > 0 {
			pc.Before = r.String()
		}
		dbs := slices.Sorted(slices.Values(after[name]))
		if r, err := sharding.RangesOfDBs(dbs); err == nil && len(r) > 0 {
			pc.After = r.String()
		}
		p.Cells = append(p.Cells, pc)
	}
	if load != nil {
		p.ByRate = true
		for i := range p.Cells {
			p.Cells[i].RateAfter = load[p.Cells[i].Name]
		}
	}
	return p
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
		if p.ByRate {
			note = fmt.Sprintf("  %.1f → %.1f ops/s%s", c.RateBefore, c.RateAfter, note)
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
