package bench

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
)

// runAll runs the workload once per strategy (or once), per path and per
// cluster, and restores the cells' strategy.
func (s *Suite) runAll(ctx context.Context, sc SuiteConfig) (err error) {
	if sc.SkipLoad || sc.SearchOnly {
		return nil
	}
	targets := suiteTargets(sc)
	strategies := sc.Strategies
	if len(strategies) == 0 {
		strategies = []string{""} // the cells as they are
	} else {
		restore, serr := s.saveStrategies(ctx, sc, targets)
		defer restore()
		if serr != nil {
			return serr
		}
	}
	paths := []bool{sc.Run.Direct}
	if sc.CompareDirect {
		paths = []bool{false, true}
	}
	n := 0
	for si, strategy := range strategies {
		order := targets
		if len(targets) == 2 && si%2 == 1 {
			order = []target{targets[1], targets[0]} // A B, B A, ...: drift of the machine hits both alike
		}
		for _, t := range order {
			if err := s.runOn(ctx, sc, t, strategy, paths, &n); err != nil {
				return err
			}
		}
	}
	return nil
}

// suiteTargets are the clusters sc runs against: the main one, then the
// baseline when there is one.
func suiteTargets(sc SuiteConfig) []target {
	targets := []target{{run: sc.Run, set: sc.SetStrategy, get: sc.GetStrategy, cells: sc.Cells}}
	if b := sc.Baseline; b != nil {
		run := sc.Run
		run.RouterURL, run.ClusterSecret, run.APIKey, run.Audit, run.Work = b.RouterURL, b.ClusterSecret, b.APIKey, b.Audit, b.Work
		run.RouterPprof = "" // the profile address is the main cluster's router's
		targets = append(targets, target{name: b.Name, run: run, set: b.SetStrategy, get: b.GetStrategy, cells: b.Cells})
	}
	return targets
}

// saveStrategies reads each target's cells' strategy before the suite
// switches it (the main cluster's into s.StrategyBefore). restore sets
// them back, the last target's first, and notes in s.Errors what it could
// not; it restores those read even when err says a later one was not.
func (s *Suite) saveStrategies(ctx context.Context, sc SuiteConfig, targets []target) (restore func(), err error) {
	var restores []func()
	restore = func() {
		for i := len(restores) - 1; i >= 0; i-- {
			restores[i]()
		}
	}
	for i := range targets {
		t := &targets[i]
		before, err := t.get(ctx)
		if err != nil {
			return restore, fmt.Errorf("bench: read the %s cells' strategy before switching it: %w", t.describe(), err)
		}
		if t.name == "" {
			s.StrategyBefore = before
		}
		restores = append(restores, func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
			defer cancel()
			logf(sc.Log, "restoring the %s cells' strategy %s", t.describe(), before)
			if rerr := t.set(rctx, before); rerr != nil {
				s.Errors = append(s.Errors, fmt.Sprintf("restore the %s strategy %s: %v", t.describe(), before, rerr))
			}
		})
	}
	return restore, nil
}

// runOn switches t's cells to strategy ("" leaves them as they are) and
// runs the workload on each of paths (direct or through the router), *n
// counting the suite's runs. A switch or a run that fails is noted in
// s.Errors; it returns an error only when ctx ended.
func (s *Suite) runOn(ctx context.Context, sc SuiteConfig, t target, strategy string, paths []bool, n *int) error {
	if strategy != "" {
		logf(sc.Log, "switching the %s cells to strategy %s", t.describe(), strategy)
		if err := t.set(ctx, strategy); err != nil {
			s.Errors = append(s.Errors, fmt.Sprintf("switch the %s cells to strategy %s: %v", t.describe(), strategy, err))
			return nil
		}
	}
	for _, direct := range paths {
		cfg := t.run
		cfg.Direct = direct
		cfg.Label = runLabel(strategy, direct, sc.CompareDirect, cfg.Label)
		if t.name != "" {
			cfg.Label = t.name + "/" + cmp.Or(cfg.Label, s.Workload)
		}
		cfg.RunID = suiteRunID(sc.Run.RunID, *n)
		*n++
		if cfg.Label == "" {
			cfg.Label = s.Workload
		}
		if *n > 1 {
			quiesce(ctx, sc)
		}
		logf(sc.Log, "run %d (%s): %s for %v", *n, cfg.Label, s.Workload, cfg.Duration)
		rep, err := runMeasured(ctx, cfg, t.cells, strategy)
		if rep.RunID == "" && err != nil && ctx.Err() == nil {
			s.Errors = append(s.Errors, fmt.Sprintf("run %s: %v", cfg.Label, err))
			continue
		}
		rep.Strategy, rep.Cluster = strategy, t.name
		s.Runs = append(s.Runs, rep)
		if err != nil {
			return err // ctx ended
		}
	}
	return nil
}

// target is one cluster a suite runs against: the main one (name "") or the
// baseline.
type target struct {
	name  string
	run   Config
	set   func(ctx context.Context, strategy string) error
	get   func(ctx context.Context) (string, error)
	cells []MetricsTarget // scraped around each run
}

func (t target) describe() string { return cmp.Or(t.name, "main") }

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
