package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"redcell/model"
)

// SustainConfig is the run at a fraction of one strategy's sustained rate
// (SuiteConfig.Sustain), after the search.
type SustainConfig struct {
	// Strategy is whose sustained rate is used; one of the suite's
	// Strategies ("" when the suite sets none).
	Strategy string
	// Fraction of the sustained rate to run at, in (0, 1].
	Fraction float64
	// Duration of the run's load; 0 means the suite's Run.Duration.
	Duration time.Duration
	// LagBound is the credit-lag p99 the run should stay within, > 0.
	LagBound time.Duration
}

// DefaultSustainConfig runs at 70% of strategy's sustained rate.
func DefaultSustainConfig(strategy string) SustainConfig {
	return SustainConfig{Strategy: strategy, Fraction: DefaultHeadroom, LagBound: time.Second}
}

// SustainResult is the run at a fraction of a strategy's sustained rate.
type SustainResult struct {
	Strategy      string  `json:"strategy"`
	Fraction      float64 `json:"fraction"`
	SustainedRate int     `json:"sustained_rate_per_sec"`
	Rate          int     `json:"rate_per_sec"`
	P99BoundMS    float64 `json:"p99_bound_ms"`
	LagBoundMS    float64 `json:"credit_lag_bound_ms"`
	Run           *Report `json:"run,omitempty"`
	// Missed lists the targets the run missed: p99 above the bound, credit-lag
	// p99 above its bound or unknown, an error code other than SOLD_OUT and
	// EXPIRED, an audit that was not clean. Empty: every target met.
	Missed []string `json:"missed,omitempty"`
	Error  string   `json:"error,omitempty"` // why the run could not be made (a switch or setup that failed)
	// NoRate says the run was not made because the search confirmed no rate
	// for Strategy: a measurement (that strategy sustains nothing within the
	// bounds here), not a failure. The audit then runs alone so that the
	// search's money is still checked: Audit and AuditError.
	NoRate     bool               `json:"no_rate,omitempty"`
	Audit      *model.AuditReport `json:"audit,omitempty"`
	AuditError string             `json:"audit_error,omitempty"`
}

// Problems lists why the sustain run counts against the suite: it could not
// be made, its money did not balance (its run's problems; with AllowShed,
// shedding is counted there, not failed), or, when no rate was confirmed,
// the audit that ran instead failed or found money wrong. Missed targets are
// reported, not failed.
func (su SustainResult) Problems() []string {
	var ps []string
	if su.Error != "" {
		ps = append(ps, "sustain run: "+su.Error)
	}
	if su.Run != nil {
		for _, p := range su.Run.Problems() {
			ps = append(ps, su.Run.Name()+": "+p)
		}
	}
	return append(ps, auditProblems("audit after the search", su.Audit, su.AuditError)...)
}

// runSustain runs the workload open-loop at Fraction of the strategy's
// sustained rate, with the audit, and judges it against the bounds.
func (s *Suite) runSustain(ctx context.Context, sc SuiteConfig) error {
	c := *sc.Sustain
	res := &SustainResult{Strategy: c.Strategy, Fraction: c.Fraction, P99BoundMS: ms(sc.Search.P99Bound), LagBoundMS: ms(c.LagBound)}
	s.Sustain = res
	for _, r := range s.Search {
		if r.Strategy == c.Strategy {
			res.SustainedRate = r.SustainedRate
		}
	}
	res.Rate = int(math.Round(c.Fraction * float64(res.SustainedRate)))
	if res.Rate < 1 {
		// Nothing to run at: reported as "no confirmed rate", and the money
		// of the search's steps (which run without an audit) is audited here.
		res.NoRate = true
		if sc.Run.Audit != nil {
			quiesce(ctx, sc)
			actx, cancel := context.WithTimeout(ctx, auditTimeout)
			a, err := sc.Run.Audit(actx)
			cancel()
			if err != nil {
				res.AuditError = err.Error()
			} else {
				res.Audit = &a
			}
		}
		return ctx.Err()
	}
	if c.Strategy != "" {
		logf(sc.Log, "switching the cells to strategy %s", c.Strategy)
		if err := sc.SetStrategy(ctx, c.Strategy); err != nil {
			res.Error = fmt.Sprintf("switch the cells to strategy %s: %v", c.Strategy, err)
			return nil
		}
	}
	quiesce(ctx, sc)
	run := sustainRunConfig(sc, res.Rate)
	logf(sc.Log, "run at %.0f%% of %s's sustained %d opens/s: %d opens/s for %v", 100*c.Fraction,
		cmp.Or(c.Strategy, run.Workload), res.SustainedRate, res.Rate, run.Duration)
	rep, err := runMeasured(ctx, run, sc.Cells, c.Strategy)
	if rep.RunID == "" && err != nil && ctx.Err() == nil {
		res.Error = err.Error()
		return nil
	}
	rep.Strategy = c.Strategy
	res.Run = &rep
	res.Missed = sustainMissed(rep, sc.Search.P99Bound, c.LagBound)
	return err
}

// sustainRunConfig is the sustain run at rate: the suite's run open-loop,
// with the suite's AllowShed (shedding is counted, and a missed target, or
// fails the run as in the suite's other runs).
func sustainRunConfig(sc SuiteConfig, rate int) Config {
	c := *sc.Sustain
	run := sc.Run
	run.Rate = rate
	run.Duration = cmp.Or(c.Duration, sc.Run.Duration)
	inFlight := int(math.Ceil(float64(rate) * sc.Search.P99Bound.Seconds() * searchInFlightFactor))
	run.MaxInFlight = min(max(run.inFlight(), inFlight), inFlightMax)
	run.Label = fmt.Sprintf("%s@%.0f%%", cmp.Or(c.Strategy, run.Workload), 100*c.Fraction)
	run.RunID = suiteRunID(sc.Run.RunID, searchRunIDBase-1)
	return run
}

// sustainMissed lists the targets a sustain run missed.
func sustainMissed(rep Report, p99Bound, lagBound time.Duration) []string {
	var missed []string
	if p99 := rep.Open.LatencyMS.P99; p99 > ms(p99Bound) {
		missed = append(missed, fmt.Sprintf("open p99 %.1f ms > %.0f ms", p99, ms(p99Bound)))
	}
	switch cm := rep.CellMetrics; {
	case cm == nil || cm.CreditLagP99MS == nil:
		missed = append(missed, "credit-lag p99 unknown (n/a)")
	case cm.CreditLagAbove || *cm.CreditLagP99MS > ms(lagBound):
		missed = append(missed, fmt.Sprintf("credit-lag p99 %s ms > %.0f ms", cm.lagText(), ms(lagBound)))
	}
	for o := op(0); o < opCount; o++ {
		for _, code := range sortedCodes(rep.op(o).Errors) {
			if !expectedCodes[o][code] {
				missed = append(missed, fmt.Sprintf("%s: %d %s", o, rep.op(o).Errors[code], code))
			}
		}
	}
	if a := auditText(rep); a != "clean" {
		missed = append(missed, "audit "+a)
	}
	return missed
}

// auditText says what a run's audit found: "clean", or what was wrong.
func auditText(r Report) string {
	switch a := r.Audit; {
	case r.AuditError != "":
		return "failed: " + r.AuditError
	case a == nil:
		return "not run"
	case a.Difference != 0:
		return fmt.Sprintf("money differs by %d cents", a.Difference)
	case len(a.Problems) > 0:
		return fmt.Sprintf("%d problems", len(a.Problems))
	}
	return "clean"
}
