package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"redcell/internal/retry"
	"redcell/model"
)

// strategiesMax bounds the strategies one comparison runs.
const strategiesMax = 8

// restoreTimeout bounds putting the cells' strategy back, which runs even when
// the suite's ctx has ended.
const restoreTimeout = 30 * time.Second

// SuiteConfig is one invocation of the bench: the workload run once, or once
// per strategy, each through the router and (CompareDirect) straight to the
// cells; then, with Limits, the ceilings of the stack.
type SuiteConfig struct {
	// Run is the workload; RunSuite sets Label, Direct and RunID per run.
	Run Config
	// SkipLoad runs no workload: limits only.
	SkipLoad bool
	// Strategies, when set, runs the workload once per strategy, switching every
	// cell with SetStrategy before each run. GetStrategy reads the strategy the
	// cells had before, which RunSuite restores at the end whatever happened.
	Strategies  []string
	SetStrategy func(ctx context.Context, strategy string) error
	GetStrategy func(ctx context.Context) (string, error)
	// CompareDirect runs every workload run twice: through the router, then
	// direct to the cells, and reports router rate / direct rate.
	CompareDirect bool
	// Limits, when set, measures the ceilings after the runs (see Limits).
	Limits *LimitsConfig
	// Log, when set, gets one line per step (switching strategy, starting a run).
	Log io.Writer
	// Baseline, when set, is a second cluster every run also runs against
	// (an older build of redcell, say), interleaved with the main cluster's
	// run of the same strategy, so that the two builds are measured under the
	// same workload (one seed) on the same machine at nearly the same time.
	Baseline *Cluster
	// Cells, when set, are scraped before and after every run on the main
	// cluster: Report.CellMetrics.
	Cells []MetricsTarget
	// Search, when set, finds each strategy's highest sustained open-loop
	// rate on the main cluster after the runs (search.go); SearchOnly skips
	// the runs. Sustain, which needs Search, then runs at a fraction of one
	// strategy's rate.
	Search     *SearchConfig
	SearchOnly bool
	Sustain    *SustainConfig
	// Bare, when set, runs the bare open (bare.go) after the runs, on the
	// main cluster's first database server, measured by Run.Work: the floor
	// beside every run's figures (Suite.Bare).
	Bare *BareConfig
}

// Cluster is a second cluster a suite compares the main one with (see
// SuiteConfig.Baseline). Its runs carry Name in Report.Cluster and in their
// labels.
type Cluster struct {
	Name          string // e.g. "baseline"; 1..24 characters, not empty
	RouterURL     string
	ClusterSecret string // signs its stress traffic
	APIKey        string
	// Audit, SetStrategy and GetStrategy work as the suite's own (Run.Audit,
	// SuiteConfig.SetStrategy, GetStrategy), on this cluster; the strategy
	// pair is needed when the suite compares strategies.
	Audit       func(ctx context.Context) (model.AuditReport, error)
	SetStrategy func(ctx context.Context, strategy string) error
	GetStrategy func(ctx context.Context) (string, error)
	// Cells are scraped around this cluster's runs, as SuiteConfig.Cells.
	Cells []MetricsTarget
	// Work measures this cluster's runs, as Config.Work does the main one's.
	Work *WorkSources
}

// validateTarget checks what every workload needs of a baseline cluster:
// its name and where to send its traffic.
func (b *Cluster) validateTarget() error {
	switch {
	case b.Name == "" || len(b.Name) > runIDLenMax:
		return fmt.Errorf("bench: the baseline cluster needs a name of 1..%d characters", runIDLenMax)
	case b.RouterURL == "" || b.ClusterSecret == "":
		return errors.New("bench: the baseline cluster needs a router URL and its cluster secret")
	}
	return nil
}

// Validate checks the suite and its run config.
func (sc SuiteConfig) Validate() error {
	if !sc.SkipLoad {
		if err := sc.Run.Validate(); err != nil {
			return err
		}
	} else if sc.Limits == nil {
		return errors.New("bench: a suite without load must measure limits")
	}
	if sc.CompareDirect && !sc.SkipLoad && sc.Run.ClusterSecret == "" {
		return errDirectUnsigned
	}
	if len(sc.Strategies) > 0 {
		if sc.SkipLoad {
			return errors.New("bench: comparing strategies needs a workload")
		}
		if sc.SetStrategy == nil || sc.GetStrategy == nil {
			return errors.New("bench: comparing strategies needs SetStrategy and GetStrategy (a cluster config)")
		}
		if len(sc.Strategies) > strategiesMax {
			return fmt.Errorf("bench: at most %d strategies, got %d", strategiesMax, len(sc.Strategies))
		}
		seen := map[string]bool{}
		for _, s := range sc.Strategies {
			if s == "" || seen[s] {
				return fmt.Errorf("bench: strategies must be distinct and not empty: %q", sc.Strategies)
			}
			seen[s] = true
		}
	}
	if b := sc.Baseline; b != nil {
		switch {
		case sc.SkipLoad:
			return errors.New("bench: comparing with a baseline cluster needs a workload")
		case b.validateTarget() != nil:
			return b.validateTarget()
		case sc.CompareDirect:
			return errors.New("bench: a baseline comparison runs through the routers only (no --compare-direct)")
		case len(sc.Strategies) > 0 && (b.SetStrategy == nil || b.GetStrategy == nil):
			return errors.New("bench: comparing strategies with a baseline needs the baseline's SetStrategy and GetStrategy")
		}
	}
	if err := sc.validateSearch(); err != nil {
		return err
	}
	if sc.Limits != nil {
		return sc.Limits.Validate()
	}
	return nil
}

// validateSearch checks Search, SearchOnly and Sustain.
func (sc SuiteConfig) validateSearch() error {
	if sc.Search == nil {
		if sc.SearchOnly || sc.Sustain != nil {
			return errors.New("bench: a search-only suite or a sustain run needs the search")
		}
		return nil
	}
	if sc.SkipLoad {
		return errors.New("bench: the rate search needs a workload")
	}
	if w := sc.Run.Workload; w == "" || w == WorkloadSmoke {
		return errors.New("bench: the rate search runs open-loop: use the hot, festival or cold workload")
	}
	if err := sc.Search.Validate(); err != nil {
		return err
	}
	if c := sc.Sustain; c != nil {
		switch {
		case !(c.Fraction > 0 && c.Fraction <= 1):
			return fmt.Errorf("bench: the sustain fraction must be in (0, 1], got %v", c.Fraction)
		case c.Duration < 0 || c.Duration > durationMax:
			return fmt.Errorf("bench: the sustain duration must be in [0, %v], got %v", durationMax, c.Duration)
		case c.LagBound <= 0:
			return fmt.Errorf("bench: the credit-lag bound must be > 0, got %v", c.LagBound)
		case len(sc.Strategies) == 0 && c.Strategy != "":
			return fmt.Errorf("bench: the sustain run's strategy %q is not compared (give it with the strategies)", c.Strategy)
		case len(sc.Strategies) > 0 && !slices.Contains(sc.Strategies, c.Strategy):
			return fmt.Errorf("bench: the sustain run's strategy %q is not among the strategies %q", c.Strategy, sc.Strategies)
		}
	}
	return nil
}

// Suite is everything one invocation measured. Money is in cents; rates and
// latencies are floats.
type Suite struct {
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Workload   string    `json:"workload"`
	Runs       []Report  `json:"runs"`
	// Comparison has one row per strategy, in the order run: ratios against the
	// first strategy's successful opens/s (router runs).
	Comparison []StrategyRow `json:"comparison,omitempty"`
	// BaselineComparison is Comparison for the baseline cluster's runs, and
	// VsBaseline pairs each strategy's run on the main cluster with its run on
	// the baseline (SuiteConfig.Baseline).
	BaselineComparison []StrategyRow `json:"baseline_comparison,omitempty"`
	VsBaseline         []BaselineRow `json:"vs_baseline,omitempty"`
	// RouterVsDirect has one row per pair of runs that differ only in the path.
	RouterVsDirect []DirectRow   `json:"router_vs_direct,omitempty"`
	Limits         *LimitsReport `json:"limits,omitempty"`
	Ceilings       []CeilingRow  `json:"ceilings,omitempty"`
	StrategyBefore string        `json:"strategy_before,omitempty"` // what the cells ran before; restored at the end
	Errors         []string      `json:"errors,omitempty"`          // steps that failed: a strategy switch, a run that could not start, the restore
	// Search is each strategy's sustained-rate search (SuiteConfig.Search),
	// SearchRatios every strategy's sustained rate over each earlier one's,
	// and Sustain the run at a fraction of one strategy's rate.
	Search       []SearchResult `json:"search,omitempty"`
	SearchRatios []SearchRatio  `json:"search_ratios,omitempty"`
	Sustain      *SustainResult `json:"sustain,omitempty"`
	// Bare is the bare open's run (SuiteConfig.Bare): the floor.
	Bare   *BareReport    `json:"bare,omitempty"`
	Config map[string]any `json:"config,omitempty"` // the command line, for the record
}

// StrategyRow compares one strategy's run with the first strategy's.
type StrategyRow struct {
	Strategy    string  `json:"strategy"`
	OpensPerSec float64 `json:"opens_per_sec"`
	Ratio       float64 `json:"ratio"` // OpensPerSec / the first row's OpensPerSec; 0 when that is 0
	P99MS       float64 `json:"p99_ms"`
	P999MS      float64 `json:"p99_9_ms"`
	OK          bool    `json:"ok"` // the run passed, money checks included
	// P50MS and Cell (the run's CellMetrics: commits/s, mean batch size,
	// credit-lag p99) complete the row.
	P50MS float64      `json:"p50_ms"`
	Cell  *CellMetrics `json:"cell_metrics,omitempty"`
}

// BaselineRow compares one strategy's run on the main cluster with the same
// run on the baseline cluster.
type BaselineRow struct {
	Strategy            string  `json:"strategy"` // empty: the cells as they were
	OpensPerSec         float64 `json:"opens_per_sec"`
	BaselineOpensPerSec float64 `json:"baseline_opens_per_sec"`
	Ratio               float64 `json:"ratio"` // main / baseline: above 1 the main cluster is faster
	P99MS               float64 `json:"p99_ms"`
	BaselineP99MS       float64 `json:"baseline_p99_ms"`
	// Work is both runs' work per open and their ratios, when the clusters'
	// work was measured (Cluster.Work, Config.Work).
	Work *WorkVsBaseline `json:"work,omitempty"`
}

// DirectRow compares a run through the router with the same run sent direct.
type DirectRow struct {
	Name              string  `json:"name"`
	RouterOpensPerSec float64 `json:"router_opens_per_sec"`
	DirectOpensPerSec float64 `json:"direct_opens_per_sec"`
	Ratio             float64 `json:"ratio"` // router / direct: 1 means the router costs nothing
	RouterP99MS       float64 `json:"router_p99_ms"`
	DirectP99MS       float64 `json:"direct_p99_ms"`
}

// OK reports whether every run passed and every step succeeded: see Problems.
func (s Suite) OK() bool { return len(s.Problems()) == 0 }

// Problems lists every run's problems (prefixed by the run's name), the steps
// that failed, and the limits that could not be measured.
func (s Suite) Problems() []string {
	ps := append([]string(nil), s.Errors...)
	for _, r := range s.Runs {
		for _, p := range r.Problems() {
			ps = append(ps, r.Name()+": "+p)
		}
	}
	if s.Limits != nil {
		ps = append(ps, s.Limits.Problems()...)
	}
	if su := s.Sustain; su != nil {
		ps = append(ps, su.Problems()...)
	}
	return ps
}

// Shed lists every run's shedding answers (Report.Shed) that its AllowShed
// counted instead of failing, as "run: open TIMEOUT=69, ...": what the
// cluster shed by design, reported with the verdict.
func (s Suite) Shed() []string {
	var out []string
	runs := s.Runs
	if su := s.Sustain; su != nil && su.Run != nil {
		runs = append(runs[:len(runs):len(runs)], *su.Run)
	}
	for _, r := range runs {
		if shed := r.Shed(); len(shed) > 0 && r.AllowShed {
			out = append(out, r.Name()+": "+strings.Join(shed, ", "))
		}
	}
	if s.Limits != nil {
		out = append(out, s.Limits.Shed()...)
	}
	return out
}

// Unrated lists the strategies whose search confirmed no rate (a
// measurement, not a failure).
func (s Suite) Unrated() []string {
	var out []string
	for _, r := range s.Search {
		if r.SustainedRate == 0 {
			out = append(out, cmp.Or(r.Strategy, s.Workload))
		}
	}
	return out
}

// RunSuite runs sc and returns what it measured. Runs that fail (money or
// codes) do not stop it; they make Suite.OK false. It returns an error when sc
// is invalid, when the cells' strategy cannot be read before switching it, and
// ctx.Err() with what was measured when ctx ends.
func RunSuite(ctx context.Context, sc SuiteConfig) (Suite, error) {
	if err := sc.Validate(); err != nil {
		return Suite{}, err
	}
	s := Suite{StartedAt: time.Now(), Workload: sc.Run.Workload}
	if s.Workload == "" {
		s.Workload = WorkloadSmoke
	}
	if sc.SkipLoad {
		s.Workload = "limits"
	}
	if sc.Run.Seed == 0 {
		sc.Run.Seed = uint64(time.Now().UnixNano()) // one workload for every run compared
	}
	err := s.runAll(ctx, sc)
	if err == nil {
		err = s.runSearch(ctx, sc)
	}
	if err == nil && sc.Bare != nil && !sc.SkipLoad {
		quiesce(ctx, sc)
		bc := *sc.Bare
		bc.Work = sc.Run.Work
		logf(sc.Log, "bare open: %d workers, %d packets a transaction, for %v", cmp.Or(bc.Workers, 4), BarePackets, cmp.Or(bc.Duration, 5*time.Second))
		rep, berr := RunBare(ctx, bc)
		s.Bare = rep
		if berr != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			} else {
				s.Errors = append(s.Errors, berr.Error())
			}
		}
	}
	if err == nil && sc.Limits != nil {
		quiesce(ctx, sc)
		lim, lerr := MeasureLimits(ctx, *sc.Limits)
		lim.AllowShed = sc.Run.AllowShed // the no-op sheds as the runs may
		s.Limits = &lim
		err = lerr
	}
	s.compare(sc)
	s.FinishedAt = time.Now()
	return s, err
}

// compare fills the comparison tables from the runs and the limits.
func (s *Suite) compare(sc SuiteConfig) {
	s.Comparison = strategyRows(s.Runs, "", sc.CompareDirect)
	if sc.Baseline != nil {
		s.BaselineComparison = strategyRows(s.Runs, sc.Baseline.Name, false)
		for _, r := range s.Runs {
			if r.Cluster != "" {
				continue
			}
			for _, b := range s.Runs {
				if b.Cluster == sc.Baseline.Name && b.Strategy == r.Strategy {
					s.VsBaseline = append(s.VsBaseline, BaselineRow{Strategy: r.Strategy,
						OpensPerSec: r.OpensPerSec, BaselineOpensPerSec: b.OpensPerSec, Ratio: ratio(r.OpensPerSec, b.OpensPerSec),
						P99MS: r.Open.LatencyMS.P99, BaselineP99MS: b.Open.LatencyMS.P99, Work: workVsBaseline(r.Work, b.Work)})
					break
				}
			}
		}
	}
	if sc.CompareDirect {
		for i := 0; i+1 < len(s.Runs); i++ {
			a, b := s.Runs[i], s.Runs[i+1]
			if a.Direct || !b.Direct || a.Strategy != b.Strategy {
				continue
			}
			name := a.Strategy
			if name == "" {
				name = s.Workload
			}
			s.RouterVsDirect = append(s.RouterVsDirect, DirectRow{Name: name,
				RouterOpensPerSec: a.OpensPerSec, DirectOpensPerSec: b.OpensPerSec, Ratio: ratio(a.OpensPerSec, b.OpensPerSec),
				RouterP99MS: a.Open.LatencyMS.P99, DirectP99MS: b.Open.LatencyMS.P99})
			i++
		}
	}
	if s.Limits != nil {
		s.Ceilings = s.Limits.ceilings(s.Runs)
	}
}

// strategyRows compares the runs of one cluster (by name; "" the main one)
// that set a strategy, each against the first of them (router runs only when
// the suite compares paths).
func strategyRows(runs []Report, cluster string, compareDirect bool) []StrategyRow {
	var rows []StrategyRow
	var first float64
	for _, r := range runs {
		if r.Cluster != cluster || r.Strategy == "" || r.Direct && compareDirect {
			continue
		}
		row := StrategyRow{Strategy: r.Strategy, OpensPerSec: r.OpensPerSec, P99MS: r.Open.LatencyMS.P99,
			P999MS: r.Open.LatencyMS.P999, OK: r.OK(), P50MS: r.Open.LatencyMS.P50, Cell: r.CellMetrics}
		if len(rows) == 0 {
			first = r.OpensPerSec
		}
		row.Ratio = ratio(r.OpensPerSec, first)
		rows = append(rows, row)
	}
	return rows
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "bench: "+format+"\n", args...)
	}
}

// quiesceTimeout bounds the wait for the cells' relays between runs.
const quiesceTimeout = 90 * time.Second

// quiesceInterval is the pause between two audits of quiesce.
const quiesceInterval = time.Second

// errInFlight: an audit found credits still in flight.
var errInFlight = errors.New("bench: credits in flight")

// quiesce waits, when an audit is configured, until no credit of earlier runs
// is in flight (or quiesceTimeout passes): a run that starts while the relays
// still deliver a previous run's credits would share the machine with them, and
// side-by-side numbers would not compare like with like.
func quiesce(ctx context.Context, sc SuiteConfig) {
	audits := []func(context.Context) (model.AuditReport, error){sc.Run.Audit}
	if sc.Baseline != nil {
		audits = append(audits, sc.Baseline.Audit)
	}
	quiet := func(ctx context.Context) bool {
		for _, audit := range audits {
			if audit == nil {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, auditTimeout)
			a, err := audit(actx)
			cancel()
			if err != nil || a.InFlightCount > 0 {
				return false
			}
		}
		return true
	}
	if sc.Run.Audit == nil && (sc.Baseline == nil || sc.Baseline.Audit == nil) {
		return
	}
	start := time.Now()
	wait, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	// One round of audits a second (quiesceInterval) until none is in flight or the time is up.
	err := retry.Do(wait, retry.Policy{Attempts: int(quiesceTimeout/quiesceInterval) + 1, Backoff: quiesceInterval, Max: quiesceInterval},
		func(int) error {
			if !quiet(ctx) {
				return errInFlight
			}
			return nil
		})
	switch {
	case err == nil:
		if d := time.Since(start); d > time.Second {
			logf(sc.Log, "waited %v for the relays to deliver earlier runs' credits", d.Round(time.Second))
		}
		return
	case ctx.Err() != nil:
		return // interrupted: nothing to say
	}
	logf(sc.Log, "credits of earlier runs still in flight after %v; going on", quiesceTimeout)
}
