package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// The sustained-rate search: for each strategy, short open-loop runs at
// target rates, ramping up by searchFactor from SearchConfig.StartRate until
// one fails, then bisecting between the highest rate that passed and the
// lowest that failed. A step passes when the opens' p99 is within the bound,
// nothing was shed (no OVERLOADED, TIMEOUT, RATE_LIMITED answer, no client
// timeout or drop), no other unexpected code was answered, and the client
// started at least searchAchievedMin of the arrivals that fell due.

// Fixed shape of the search.
const (
	// searchFactor: the ramp doubles the rate (and halves it when the first
	// step fails).
	searchFactor = 2.0
	// searchPrecision: the bisection stops when the lowest failing rate is
	// within 10% of the highest passing one, finer than the noise of a
	// few-second step on a shared machine.
	searchPrecision = 0.10
	// searchRateMin: below this many opens/s the search gives up (reported as
	// sustained rate 0).
	searchRateMin = 10
	// searchSettle bounds a step's wait for its credits: the steps leave the
	// money to the audits of the other runs.
	searchSettle = 2 * time.Second
	// searchIdlePoll is how often the cells' queues are read while waiting for
	// them to drain between steps.
	searchIdlePoll = 250 * time.Millisecond
	// searchRunIDBase numbers the steps' run IDs after the suite's own runs
	// (at most strategiesMax × 2 paths × 2 clusters of them).
	searchRunIDBase = 1000
	// searchInFlightFactor: a step keeps up to this many times rate × bound
	// opens in flight, so the client drops an open only when far more than
	// 1% of them take longer than the bound (which fails the step anyway).
	searchInFlightFactor = 2
)

// searchAchievedMin: a step whose client started less than 95% of the
// schedule measured the client, not the cluster. A variable so that tests on
// a loaded machine, whose client stalls, can lower it.
var searchAchievedMin = 0.95

// SearchConfig is the sustained-rate search of a suite (SuiteConfig.Search).
type SearchConfig struct {
	// P99Bound is the highest open p99 a sustained rate may have (from the
	// scheduled start, as every open-loop latency), in (0, 10s].
	P99Bound time.Duration
	// Step is the load phase of one step, in [200ms, 1m]: long enough for a p99
	// of a few thousand opens, short enough for several steps per strategy.
	Step time.Duration
	// Budget bounds the whole search, every strategy together, in [Step,
	// 1h]: each gets an equal share of what the ones before it left. A step
	// is started only when the longest step so far still fits in the
	// strategy's share; the first always is.
	Budget time.Duration
	// StartRate is the first step's rate in opens/s, 1..rateMax.
	StartRate int
	// MaxRate caps the ramp, StartRate..rateMax.
	MaxRate int
	// StepsMax bounds the steps per strategy, 1..100.
	StepsMax int
	// IdleWait bounds the wait, between two steps, for the cells' open queues
	// and relay lanes to empty (read from their metrics), in [0, 1m].
	IdleWait time.Duration
	// Confirm is the load phase of the confirmation: once the short steps
	// have found the highest passing rate, it runs again for Confirm; if
	// that fails, a tenth lower, at most confirmMax runs in all. A short
	// step's p99 on two shared cores moves by more than the search's
	// precision, so an unconfirmed rate can be one the cluster does not
	// sustain. 0: no confirmation; else in [Step, 2m]. Confirmation runs
	// are outside Budget and StepsMax (confirmMax bounds them).
	Confirm time.Duration
}

// DefaultSearchConfig: the search of four strategies in about four minutes.
func DefaultSearchConfig() SearchConfig {
	return SearchConfig{
		P99Bound:  50 * time.Millisecond, // what a user waits for a red packet without noticing
		Step:      4 * time.Second,       // ~3 s of festival opens after the first second's ramp
		Budget:    4 * time.Minute,       // a minute per strategy: about 8 steps of ~7 s with setup and drain
		StartRate: 250,                   // below any strategy's rate on a 2-core machine: the ramp goes up
		MaxRate:   200_000,               // far above a loopback cluster; a typo cannot ask for more
		StepsMax:  12,                    // ramp of ~6 and bisection of ~4, with room
		IdleWait:  10 * time.Second,      // a failed step's backlog drains in a few seconds
		Confirm:   12 * time.Second,      // three steps' worth: a rate that holds for 12 s holds for the sustain run
	}
}

// Validate checks the fields.
func (c SearchConfig) Validate() error {
	switch {
	case c.P99Bound <= 0 || c.P99Bound > 10*time.Second:
		return fmt.Errorf("bench: search p99 bound must be in (0, 10s], got %v", c.P99Bound)
	case c.Step < 200*time.Millisecond || c.Step > time.Minute:
		return fmt.Errorf("bench: search step must be in [200ms, 1m], got %v", c.Step)
	case c.Budget < c.Step || c.Budget > time.Hour:
		return fmt.Errorf("bench: search budget must be in [step, 1h], got %v", c.Budget)
	case c.StartRate < 1 || c.StartRate > rateMax:
		return fmt.Errorf("bench: search start rate must be 1..%d opens/s, got %d", rateMax, c.StartRate)
	case c.MaxRate < c.StartRate || c.MaxRate > rateMax:
		return fmt.Errorf("bench: search max rate must be %d..%d opens/s, got %d", c.StartRate, rateMax, c.MaxRate)
	case c.StepsMax < 1 || c.StepsMax > 100:
		return fmt.Errorf("bench: search steps must be 1..100, got %d", c.StepsMax)
	case c.IdleWait < 0 || c.IdleWait > time.Minute:
		return fmt.Errorf("bench: search idle wait must be in [0, 1m], got %v", c.IdleWait)
	case c.Confirm != 0 && (c.Confirm < c.Step || c.Confirm > 2*time.Minute):
		return fmt.Errorf("bench: search confirmation must be 0 or in [step %v, 2m], got %v", c.Step, c.Confirm)
	}
	return nil
}

// SearchStep is one step of a search: a short open-loop run at Rate.
type SearchStep struct {
	Rate        int     `json:"rate_per_sec"`
	OpensPerSec float64 `json:"opens_per_sec"` // successful opens per second of the load
	// Achieved is the fraction of the schedule the client started: opens
	// (hot) or packets (festival, cold: their opens follow), of those due.
	Achieved float64          `json:"achieved"`
	P50MS    float64          `json:"p50_ms"`
	P99MS    float64          `json:"p99_ms"`
	P999MS   float64          `json:"p99_9_ms"`
	Shed     int64            `json:"shed"`             // shedding answers, client timeouts and drops, every op
	Errors   map[string]int64 `json:"errors,omitempty"` // every op's error codes
	Cell     *CellMetrics     `json:"cell_metrics,omitempty"`
	Pass     bool             `json:"pass"`
	Confirm  bool             `json:"confirm,omitempty"` // a confirmation run (SearchConfig.Confirm), not a short step
	Why      string           `json:"why,omitempty"`     // why it failed
	WallMS   int64            `json:"wall_ms"`           // the whole step: setup, load, settle
}

// SearchResult is one strategy's search.
type SearchResult struct {
	Strategy string `json:"strategy"` // "" the cells as they were
	// SustainedRate is the highest rate that passed, opens/s; 0 when none did.
	SustainedRate int `json:"sustained_rate_per_sec"`
	// LowestFail is the lowest rate that failed; 0 when none did (the ramp
	// reached MaxRate or the budget first).
	LowestFail int          `json:"lowest_fail_per_sec,omitempty"`
	P99BoundMS float64      `json:"p99_bound_ms"`
	Steps      []SearchStep `json:"steps"`
	// Stop says why the search ended: "converged" (within searchPrecision),
	// "max rate", "nothing passes", "budget", "steps", or an error.
	Stop string `json:"stop"`
	// Confirmed: a confirmation run passed at SustainedRate. With
	// confirmation on and no run passing, SustainedRate is 0.
	Confirmed bool `json:"confirmed"`
}

// Best is the step at SustainedRate, its confirmation run when there is one;
// nil when none passed.
func (r SearchResult) Best() *SearchStep {
	for i := len(r.Steps) - 1; i >= 0; i-- {
		if s := &r.Steps[i]; s.Pass && s.Rate == r.SustainedRate {
			return s
		}
	}
	return nil
}

// confirmMax bounds a search's confirmation runs (SearchConfig.Confirm):
// the rate found, then up to three a tenth lower each, down to 73% of it.
const confirmMax = 4

// SearchRatio is one strategy's sustained rate over another's.
type SearchRatio struct {
	Strategy string   `json:"strategy"`
	Over     string   `json:"over"`
	Ratio    *float64 `json:"ratio"` // null when Over's rate is 0
}

// searchParams are the numbers of one strategy's search.
type searchParams struct {
	start, max, stepsMax int
	budget               time.Duration
	confirm              bool // confirm the rate found (SearchConfig.Confirm)
}

// searchRate runs one strategy's search with step (a run at a rate, a
// confirmation run when confirm is set); now is the clock the budget is kept
// with. It never calls step more than stepsMax times for short steps, never
// starts one when the longest so far would overrun the budget (the first
// always runs), never tries a rate at or above one that failed nor at or
// below one that passed. An error from step ends it. Then, with p.confirm,
// the highest passing rate is confirmed (confirmSearch).
func searchRate(ctx context.Context, p searchParams, now func() time.Time,
	step func(ctx context.Context, rate int, confirm bool) (SearchStep, error)) SearchResult {
	var res SearchResult
	lo, hi := 0, 0 // highest pass, lowest fail; 0 none
	begin := now()
	var longest time.Duration
	for {
		rate, stop := nextRate(lo, hi, p)
		switch {
		case stop != "":
			res.Stop = stop
		case len(res.Steps) >= p.stepsMax:
			res.Stop = "steps"
		case len(res.Steps) > 0 && now().Sub(begin)+longest > p.budget:
			res.Stop = "budget"
		case ctx.Err() != nil:
			res.Stop = ctx.Err().Error()
		}
		if res.Stop != "" {
			break
		}
		t0 := now()
		st, err := step(ctx, rate, false)
		longest = max(longest, now().Sub(t0))
		if err != nil {
			res.Stop = err.Error()
			res.SustainedRate, res.LowestFail = lo, hi
			return res
		}
		st.Rate = rate
		res.Steps = append(res.Steps, st)
		if st.Pass {
			lo = max(lo, rate)
		} else if hi == 0 || rate < hi {
			hi = rate
		}
	}
	if p.confirm && lo > 0 && ctx.Err() == nil {
		lo, hi = confirmSearch(ctx, &res, lo, hi, step)
	}
	res.SustainedRate, res.LowestFail = lo, hi
	return res
}

// confirmSearch runs the confirmation of rate lo (the highest short step that
// passed; hi the lowest that failed, 0 none): a confirmation run at lo, and
// while it fails, at a tenth lower, at most confirmMax runs. It returns the
// confirmed rate (0 when none passed) and the lowest failing rate, and
// appends the runs to res.Steps.
func confirmSearch(ctx context.Context, res *SearchResult, lo, hi int,
	step func(ctx context.Context, rate int, confirm bool) (SearchStep, error)) (int, int) {
	for rate, i := lo, 0; i < confirmMax && rate >= searchRateMin && ctx.Err() == nil; i++ {
		st, err := step(ctx, rate, true)
		if err != nil {
			res.Stop += "; confirmation: " + err.Error()
			return 0, hi
		}
		st.Rate, st.Confirm = rate, true
		res.Steps = append(res.Steps, st)
		if st.Pass {
			res.Confirmed = true
			return rate, hi
		}
		if hi == 0 || rate < hi {
			hi = rate
		}
		rate = int(float64(rate) * (1 - searchPrecision))
	}
	res.Stop += "; not confirmed"
	return 0, hi
}

// nextRate is the next rate to try given the highest that passed and the
// lowest that failed (0: none), or why to stop.
func nextRate(lo, hi int, p searchParams) (int, string) {
	switch {
	case lo == 0 && hi == 0:
		return p.start, ""
	case hi == 0:
		if lo >= p.max {
			return 0, "max rate"
		}
		return min(int(float64(lo)*searchFactor), p.max), ""
	case lo == 0:
		r := int(float64(hi) / searchFactor)
		if r < searchRateMin {
			return 0, "nothing passes"
		}
		return r, ""
	case float64(hi) <= float64(lo)*(1+searchPrecision) || hi-lo <= 1:
		return 0, "converged"
	}
	return lo + (hi-lo)/2, ""
}

// judgeStep turns a step's report into a SearchStep against the p99 bound.
func judgeStep(rep Report, bound time.Duration) SearchStep {
	l := rep.Open.LatencyMS
	st := SearchStep{Rate: rep.Rate, OpensPerSec: rep.OpensPerSec, Achieved: achieved(rep),
		P50MS: l.P50, P99MS: l.P99, P999MS: l.P999, Cell: rep.CellMetrics}
	var why []string
	var unexpected []string
	for o := op(0); o < opCount; o++ {
		for _, code := range sortedCodes(rep.op(o).Errors) {
			n := rep.op(o).Errors[code]
			if st.Errors == nil {
				st.Errors = map[string]int64{}
			}
			st.Errors[code] += n
			switch {
			case runShedCode(code):
				st.Shed += n
			case !expectedCodes[o][code]:
				unexpected = append(unexpected, fmt.Sprintf("%s %s=%d", o, code, n))
			}
		}
	}
	if st.Shed > 0 {
		why = append(why, fmt.Sprintf("shed %d", st.Shed))
	}
	if len(unexpected) > 0 {
		why = append(why, "errors "+strings.Join(unexpected, ", "))
	}
	if rep.Open.OK == 0 {
		why = append(why, "no open succeeded")
	}
	if boundMS := float64(bound) / float64(time.Millisecond); l.P99 > boundMS {
		why = append(why, fmt.Sprintf("p99 %.1f ms > %.0f ms", l.P99, boundMS))
	}
	if st.Achieved < searchAchievedMin {
		why = append(why, fmt.Sprintf("client started %.0f%% of the schedule", 100*st.Achieved))
	}
	st.Pass, st.Why = len(why) == 0, strings.Join(why, "; ")
	return st
}

// achieved is the fraction of an open-loop run's schedule its client started
// (Report.Started over Report.Due): hot, of the opens; festival and cold, of
// the packets (whose members' opens follow at random, so their count is not
// the client's doing). 0 when nothing was due.
func achieved(rep Report) float64 {
	if rep.Due <= 0 {
		return 0
	}
	return float64(rep.Started) / float64(rep.Due)
}

// runSearch searches each strategy's sustained rate, then runs the sustain
// run, switching the cells' strategy and putting it back at the end.
func (s *Suite) runSearch(ctx context.Context, sc SuiteConfig) error {
	if sc.Search == nil {
		return nil
	}
	strategies := sc.Strategies
	if len(strategies) == 0 {
		strategies = []string{""}
	} else {
		before, err := sc.GetStrategy(ctx)
		if err != nil {
			return fmt.Errorf("bench: read the cells' strategy before the search: %w", err)
		}
		if s.StrategyBefore == "" {
			s.StrategyBefore = before
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
			defer cancel()
			logf(sc.Log, "restoring the cells' strategy %s", before)
			if err := sc.SetStrategy(rctx, before); err != nil {
				s.Errors = append(s.Errors, fmt.Sprintf("restore the strategy %s: %v", before, err))
			}
		}()
	}
	quiesce(ctx, sc) // the credits of earlier runs, this invocation's or not
	cfg := *sc.Search
	p := searchParams{start: cfg.StartRate, max: cfg.MaxRate, stepsMax: cfg.StepsMax, confirm: cfg.Confirm > 0}
	begin := time.Now()
	n := 0
	for i, strategy := range strategies {
		// An equal share of what is left: a search that converged early
		// leaves its time to the next ones.
		p.budget = max(cfg.Budget-time.Since(begin), 0) / time.Duration(len(strategies)-i)
		if strategy != "" {
			logf(sc.Log, "search: switching the cells to strategy %s", strategy)
			if err := sc.SetStrategy(ctx, strategy); err != nil {
				s.Errors = append(s.Errors, fmt.Sprintf("search: switch the cells to strategy %s: %v", strategy, err))
				continue
			}
		}
		res := searchRate(ctx, p, time.Now, func(ctx context.Context, rate int, confirm bool) (SearchStep, error) {
			waitIdle(ctx, sc.Cells, cfg.IdleWait)
			dur, what := cfg.Step, "search"
			if confirm {
				dur, what = cfg.Confirm, "confirm"
			}
			run := searchRunConfig(sc, cfg, strategy, rate, dur, n)
			n++
			t0 := time.Now()
			logf(sc.Log, "%s %s: %d opens/s for %v", what, cmp.Or(strategy, s.Workload), rate, dur)
			rep, err := runMeasured(ctx, run, sc.Cells, strategy)
			if err != nil {
				return SearchStep{}, err
			}
			st := judgeStep(rep, cfg.P99Bound)
			st.WallMS = time.Since(t0).Milliseconds()
			logf(sc.Log, "%s %s: %d opens/s: %s", what, cmp.Or(strategy, s.Workload), rate, stepVerdict(st))
			return st, nil
		})
		res.Strategy, res.P99BoundMS = strategy, ms(cfg.P99Bound)
		s.Search = append(s.Search, res)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	s.SearchRatios = searchRatios(s.Search)
	if sc.Sustain != nil {
		return s.runSustain(ctx, sc)
	}
	return nil
}

func stepVerdict(st SearchStep) string {
	if st.Pass {
		return fmt.Sprintf("pass (p99 %.1f ms)", st.P99MS)
	}
	return "fail: " + st.Why
}

// searchRunConfig is the run of one step (or confirmation) of load phase dur.
func searchRunConfig(sc SuiteConfig, cfg SearchConfig, strategy string, rate int, dur time.Duration, n int) Config {
	run := sc.Run
	run.Rate, run.Duration = rate, dur
	run.AllowShed = true // shedding fails the step, not the suite
	run.Audit = nil      // the suite's other runs audit; a full audit per step would not fit the budget
	run.Work = nil       // the wait for quiet servers would not fit either; the sustained run measures it
	run.SettleTimeout = searchSettle
	inFlight := int(math.Ceil(float64(rate) * cfg.P99Bound.Seconds() * searchInFlightFactor))
	run.MaxInFlight = min(max(run.inFlight(), inFlight), inFlightMax)
	run.Label = fmt.Sprintf("search/%s@%d", cmp.Or(strategy, run.Workload), rate)
	run.RunID = suiteRunID(sc.Run.RunID, searchRunIDBase+n)
	return run
}

// waitIdle waits, at most d, until the cells' open queues and relay lanes
// are empty, so one step's backlog does not count against the next.
func waitIdle(ctx context.Context, targets []MetricsTarget, d time.Duration) {
	if len(targets) == 0 || d <= 0 {
		return
	}
	wait, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !idle(scrapeCells(wait, metricsClient, targets)) && sleepCtx(wait, searchIdlePoll) {
	}
}

// searchRatios divides every strategy's sustained rate by each earlier one's
// (a comparison lists the baseline strategies first).
func searchRatios(rs []SearchResult) []SearchRatio {
	var out []SearchRatio
	for j := range rs {
		for i := range j {
			out = append(out, SearchRatio{Strategy: rs[j].Strategy, Over: rs[i].Strategy,
				Ratio: ratioPtr(float64(rs[j].SustainedRate), float64(rs[i].SustainedRate))})
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
