package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"redcell/internal/retry"
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
	if sc.Limits != nil {
		return sc.Limits.Validate()
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
	// RouterVsDirect has one row per pair of runs that differ only in the path.
	RouterVsDirect []DirectRow    `json:"router_vs_direct,omitempty"`
	Limits         *LimitsReport  `json:"limits,omitempty"`
	Ceilings       []CeilingRow   `json:"ceilings,omitempty"`
	StrategyBefore string         `json:"strategy_before,omitempty"` // what the cells ran before; restored at the end
	Errors         []string       `json:"errors,omitempty"`          // steps that failed: a strategy switch, a run that could not start, the restore
	Config         map[string]any `json:"config,omitempty"`          // the command line, for the record
}

// StrategyRow compares one strategy's run with the first strategy's.
type StrategyRow struct {
	Strategy    string  `json:"strategy"`
	OpensPerSec float64 `json:"opens_per_sec"`
	Ratio       float64 `json:"ratio"` // OpensPerSec / the first row's OpensPerSec; 0 when that is 0
	P99MS       float64 `json:"p99_ms"`
	P999MS      float64 `json:"p99_9_ms"`
	OK          bool    `json:"ok"` // the run passed, money checks included
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
	return ps
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
	if err == nil && sc.Limits != nil {
		quiesce(ctx, sc)
		lim, lerr := MeasureLimits(ctx, *sc.Limits)
		s.Limits = &lim
		err = lerr
	}
	s.compare(sc)
	s.FinishedAt = time.Now()
	return s, err
}

// runAll runs the workload once per strategy (or once) and per path, and
// restores the cells' strategy.
func (s *Suite) runAll(ctx context.Context, sc SuiteConfig) (err error) {
	if sc.SkipLoad {
		return nil
	}
	strategies := sc.Strategies
	if len(strategies) == 0 {
		strategies = []string{""} // the cells as they are
	} else {
		if s.StrategyBefore, err = sc.GetStrategy(ctx); err != nil {
			return fmt.Errorf("bench: read the cells' strategy before switching it: %w", err)
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
			defer cancel()
			logf(sc.Log, "restoring the cells' strategy %s", s.StrategyBefore)
			if rerr := sc.SetStrategy(rctx, s.StrategyBefore); rerr != nil {
				s.Errors = append(s.Errors, fmt.Sprintf("restore strategy %s: %v", s.StrategyBefore, rerr))
			}
		}()
	}
	paths := []bool{sc.Run.Direct}
	if sc.CompareDirect {
		paths = []bool{false, true}
	}
	n := 0
	for _, strategy := range strategies {
		if strategy != "" {
			logf(sc.Log, "switching the cells to strategy %s", strategy)
			if err := sc.SetStrategy(ctx, strategy); err != nil {
				s.Errors = append(s.Errors, fmt.Sprintf("switch to strategy %s: %v", strategy, err))
				continue
			}
		}
		for _, direct := range paths {
			cfg := sc.Run
			cfg.Direct = direct
			cfg.Label = runLabel(strategy, direct, sc.CompareDirect, cfg.Label)
			cfg.RunID = suiteRunID(sc.Run.RunID, n)
			n++
			if cfg.Label == "" {
				cfg.Label = s.Workload
			}
			if n > 1 {
				quiesce(ctx, sc)
			}
			logf(sc.Log, "run %d (%s): %s for %v", n, cfg.Label, s.Workload, cfg.Duration)
			rep, err := Run(ctx, cfg)
			if rep.RunID == "" && err != nil && ctx.Err() == nil {
				s.Errors = append(s.Errors, fmt.Sprintf("run %s: %v", cfg.Label, err))
				continue
			}
			rep.Strategy = strategy
			s.Runs = append(s.Runs, rep)
			if err != nil {
				return err // ctx ended
			}
		}
	}
	return nil
}

// runLabel names a run after its strategy and path.
func runLabel(strategy string, direct, compareDirect bool, label string) string {
	switch {
	case strategy != "" && compareDirect && direct:
		return strategy + "/direct"
	case strategy != "" && compareDirect:
		return strategy + "/router"
	case strategy != "":
		return strategy
	case compareDirect && direct:
		return "direct"
	case compareDirect:
		return "router"
	}
	return label
}

// suiteRunID derives run n's ID from a fixed base (empty: each run derives its
// own from its start time, distinct since runs last milliseconds at least).
func suiteRunID(base string, n int) string {
	if base == "" {
		return ""
	}
	suffix := "-" + strconv.Itoa(n)
	if len(base)+len(suffix) > runIDLenMax {
		base = base[:runIDLenMax-len(suffix)]
	}
	return base + suffix
}

// compare fills the comparison tables from the runs and the limits.
func (s *Suite) compare(sc SuiteConfig) {
	var first float64
	for _, r := range s.Runs {
		if r.Strategy == "" || r.Direct && sc.CompareDirect {
			continue
		}
		row := StrategyRow{Strategy: r.Strategy, OpensPerSec: r.OpensPerSec, P99MS: r.Open.LatencyMS.P99,
			P999MS: r.Open.LatencyMS.P999, OK: r.OK()}
		if len(s.Comparison) == 0 {
			first = r.OpensPerSec
		}
		row.Ratio = ratio(r.OpensPerSec, first)
		s.Comparison = append(s.Comparison, row)
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
	if sc.Run.Audit == nil {
		return
	}
	start := time.Now()
	wait, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	// One audit a second (quiesceInterval) until none is in flight or the time is up.
	err := retry.Do(wait, retry.Policy{Attempts: int(quiesceTimeout/quiesceInterval) + 1, Backoff: quiesceInterval, Max: quiesceInterval},
		func(int) error {
			actx, cancel := context.WithTimeout(ctx, auditTimeout)
			a, err := sc.Run.Audit(actx)
			cancel()
			if err != nil {
				return err
			}
			if a.InFlightCount > 0 {
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
