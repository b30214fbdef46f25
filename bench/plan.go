package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"redcell/model"
	"redcell/sharding"
)

// DefaultHeadroom plans cells to run at 70% of their measured rate: room for a
// cell to fail over, for traffic to spike, and for the measurement to flatter.
const DefaultHeadroom = 0.7

// Plan is how many cells a target open rate needs.
type Plan struct {
	TargetOpensPerSec  float64 `json:"target_opens_per_sec"`
	PerCellOpensPerSec float64 `json:"per_cell_opens_per_sec"`
	Headroom           float64 `json:"headroom"`
	Source             string  `json:"source"` // where the per-cell rate came from
	// Cells = ceil(Target / (PerCell × Headroom)).
	Cells int `json:"cells"`
	// DBsPerCell = floor(100 / Cells) databases (db_XX, ten shards each);
	// DBsRemainder cells own one more, so every database has an owner: a
	// cell owns whole databases (sharding.Ranges.CheckWholeDBs).
	DBsPerCell   int `json:"dbs_per_cell"`
	DBsRemainder int `json:"dbs_remainder"`
	// Layout is each cell's shard ranges in that split, in order, as a
	// config's cells[].shards: the first DBsRemainder cells own the extra
	// database.
	Layout      []string `json:"layout"`
	Assumptions []string `json:"assumptions"`
}

// NewPlan computes the plan: cells = ceil(target / (perCell × headroom)), at
// least 1, and the databases each cell owns. target and perCell are opens per
// second (> 0); headroom is in (0, 1]. A plan that needs more cells than there
// are databases is an error: a cell owns at least one whole database.
func NewPlan(target, perCell, headroom float64, source string) (Plan, error) {
	switch {
	case !(target > 0) || math.IsInf(target, 0):
		return Plan{}, fmt.Errorf("bench: target must be > 0 opens/s, got %v", target)
	case !(perCell > 0) || math.IsInf(perCell, 0):
		return Plan{}, fmt.Errorf("bench: per-cell rate must be > 0 opens/s, got %v", perCell)
	case !(headroom > 0 && headroom <= 1):
		return Plan{}, fmt.Errorf("bench: headroom must be in (0, 1], got %v", headroom)
	}
	// The epsilon absorbs float error in perCell×headroom, so 700 / (100×0.7)
	// is 10 cells, not 11.
	q := target / (perCell * headroom)
	if q > model.DBCount {
		return Plan{}, fmt.Errorf("bench: %.0f opens/s at %.1f per cell (headroom %.2f) needs %.0f cells, more than the %d databases (a cell owns whole databases)",
			target, perCell, headroom, math.Ceil(q), model.DBCount)
	}
	cells := max(1, int(math.Ceil(q-1e-9)))
	per, extra := model.DBCount/cells, model.DBCount%cells
	var layout []string
	for i, db := 0, 0; i < cells; i++ {
		n := per
		if i < extra {
			n++
		}
		dbs := make([]int, n)
		for j := range dbs {
			dbs[j] = db + j
		}
		db += n
		r, err := sharding.RangesOfDBs(dbs)
		if err != nil {
			return Plan{}, err
		}
		layout = append(layout, r.String())
	}
	return Plan{
		TargetOpensPerSec: target, PerCellOpensPerSec: perCell, Headroom: headroom, Source: source,
		Cells: cells, DBsPerCell: per, DBsRemainder: extra, Layout: layout,
		Assumptions: []string{
			"throughput grows linearly with cells: shards spread the keys evenly (xxhash) and cells share nothing",
			fmt.Sprintf("each cell sustains %.1f opens/s (%s) and is planned at %.0f%% of it", perCell, source, 100*headroom),
			"one packet lives in one cell: no number of cells lifts a single packet above the per-cell rate",
			"credits to claimants in other cells, sends and deposits take what the measurement took, no more",
			"the databases grow with the cells: one MariaDB per cell, as measured",
		},
	}, nil
}

// WriteText prints the plan and its assumptions.
func (p Plan) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("target            %12.1f opens/s\n", p.TargetOpensPerSec)
	ew.printf("per cell          %12.1f opens/s (%s)\n", p.PerCellOpensPerSec, p.Source)
	ew.printf("headroom          %12.2f (plan each cell at %.1f opens/s)\n", p.Headroom, p.PerCellOpensPerSec*p.Headroom)
	ew.printf("cells             %12d = ceil(%.1f / (%.1f × %.2f))\n", p.Cells, p.TargetOpensPerSec, p.PerCellOpensPerSec, p.Headroom)
	if p.DBsRemainder == 0 {
		ew.printf("databases per cell %11d (%d databases of %d shards / %d cells)\n", p.DBsPerCell, model.DBCount, model.ShardsPerDB, p.Cells)
	} else {
		ew.printf("databases per cell %11d (%d cells own %d: %d databases of %d shards / %d cells)\n",
			p.DBsPerCell, p.DBsRemainder, p.DBsPerCell+1, model.DBCount, model.ShardsPerDB, p.Cells)
	}
	if len(p.Layout) <= 10 {
		for i, r := range p.Layout {
			ew.printf("  cell %-3d shards %s\n", i+1, r)
		}
	}
	ew.printf("assumptions:\n")
	for _, a := range p.Assumptions {
		ew.printf("  - %s\n", a)
	}
	return ew.err
}

// PerCellRate is the open rate one cell sustained in run r, and how it was
// derived. A hot run's packet lives in one cell, so its rate is that cell's;
// the other workloads spread over every cell the router listed.
func (r Report) PerCellRate() (float64, string) {
	name := fmt.Sprintf("run %s (%s)", r.Name(), r.RunID)
	if r.Workload == WorkloadHot {
		return r.OpensPerSec, name + ": hot, one packet in one cell"
	}
	if r.Cells <= 0 {
		return r.OpensPerSec, name + ": cell count unknown, taken as 1"
	}
	return r.OpensPerSec / float64(r.Cells), fmt.Sprintf("%s: %.1f opens/s over %d cells", name, r.OpensPerSec, r.Cells)
}

// PerCellRateFrom reads a report.json (a Suite) or a single run's JSON report
// and returns the best per-cell open rate among the runs that passed.
func PerCellRateFrom(b []byte) (float64, string, error) {
	var probe struct {
		Runs json.RawMessage `json:"runs"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return 0, "", fmt.Errorf("bench: read report: %w", err)
	}
	var runs []Report
	if probe.Runs != nil {
		if err := json.Unmarshal(probe.Runs, &runs); err != nil {
			return 0, "", fmt.Errorf("bench: read report runs: %w", err)
		}
	} else {
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return 0, "", fmt.Errorf("bench: read report: %w", err)
		}
		runs = []Report{r}
	}
	best, source := 0.0, ""
	for _, r := range runs {
		if !r.OK() {
			continue // a failed run's speed proves nothing
		}
		if rate, src := r.PerCellRate(); rate > best {
			best, source = rate, src
		}
	}
	if best == 0 {
		return 0, "", errors.New("bench: the report has no passing run with opens to plan from")
	}
	return best, source, nil
}
