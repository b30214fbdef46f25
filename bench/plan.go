package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"redcell/model"
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
	// ShardsPerCell = floor(1000 / Cells); ShardsRemainder cells own one more,
	// so every one of the 1000 shards has an owner.
	ShardsPerCell   int      `json:"shards_per_cell"`
	ShardsRemainder int      `json:"shards_remainder"`
	Assumptions     []string `json:"assumptions"`
}

// NewPlan computes the plan: cells = ceil(target / (perCell × headroom)), at
// least 1, and the shards each cell owns. target and perCell are opens per
// second (> 0); headroom is in (0, 1]. A plan that needs more cells than there
// are shards is an error: a cell must own at least one shard.
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
	if q > model.ShardCount {
		return Plan{}, fmt.Errorf("bench: %.0f opens/s at %.1f per cell (headroom %.2f) needs %.0f cells, more than the %d shards",
			target, perCell, headroom, math.Ceil(q), model.ShardCount)
	}
	cells := max(1, int(math.Ceil(q-1e-9)))
	return Plan{
		TargetOpensPerSec: target, PerCellOpensPerSec: perCell, Headroom: headroom, Source: source,
		Cells: cells, ShardsPerCell: model.ShardCount / cells, ShardsRemainder: model.ShardCount % cells,
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
	if p.ShardsRemainder == 0 {
		ew.printf("shards per cell   %12d (%d shards / %d cells)\n", p.ShardsPerCell, model.ShardCount, p.Cells)
	} else {
		ew.printf("shards per cell   %12d (%d cells own %d: %d shards / %d cells)\n",
			p.ShardsPerCell, p.ShardsRemainder, p.ShardsPerCell+1, model.ShardCount, p.Cells)
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
