package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"
)

// WorkloadCoupons: a payment app's coupon drop. Every request is a fresh
// person taking one coupon (POST /v1/coupons/issue), of a hot batch with
// probability HotShare, else of a cold one; the cells accept it at once and
// issue behind (cell/couponq). One invocation measures, against the same
// cluster:
//
//   - ceiling: closed-loop, Concurrency workers: the highest accept rate,
//     and how long the cells take to issue what was accepted;
//   - sustain: open-loop at SustainFraction of the sustained rate (the
//     lower of the ceiling's accept and issue rates): accept latency and
//     the accepted→issued latency (from the cells' histogram, whose 0.5 s
//     bucket is the seed's target);
//   - merged and single: MergeBacklog requests of the first hot batch
//     accepted while the coupon_issue degrade switch holds the layers, then
//     released and timed until all are issued, with the cells' merge bound
//     at its setting and at 1 (a deduction per request): the ratio is what
//     merged stock deduction buys.
//
// It changes the cells' coupon_issue switch and merge bound through their
// admin ports and puts each cell's back as it found it: for the seconds a
// side holds the layers, real coupon requests wait too (accepted, none
// lost), and the cells' latency histogram the issue counts come from holds
// both spaces: run it on a quiet cluster. It runs through RunCoupons.
const WorkloadCoupons = "coupons"

// Bounds of a coupons run.
const (
	couponBacklogMax = 1_000_000
	couponRateMax    = 1_000_000
	couponDrainMax   = 10 * time.Minute
	// couponIssueSeries is the cells' accepted→issued histogram: its count
	// is the coupons issued (both spaces: run it on a quiet cluster).
	couponIssueSeries = "redcell_coupon_issue_latency_seconds"
	// couponTargetS is the seed's target: 99% issued within 0.5 s.
	couponTargetS = 0.5
)

// CouponsConfig describes one invocation. Start from DefaultCouponsConfig.
type CouponsConfig struct {
	RouterURL string
	// Work, when set, measures what each run cost per accepted request, its
	// issue included (Work).
	Work *WorkSources
	// APIKey needs the coupon scope; ClusterSecret signs the stress traffic
	// (the requests go to the shadow tables, as all bench traffic).
	APIKey, ClusterSecret string
	// AdminURLs are the cells' admin ports ("http://host:port"), AdminToken
	// their token: the merge comparison switches coupon_issue and the merge
	// bound there. Metrics are the cells' GET /metrics.
	AdminURLs  []string
	AdminToken string
	Metrics    []MetricsTarget
	// Hot and Cold are batch IDs of the cells' batches file; every request
	// is of a hot one with probability HotShare.
	Hot, Cold []string
	HotShare  float64
	// Concurrency is the closed-loop workers and the open-loop in-flight bound.
	Concurrency int
	Duration    time.Duration // the ceiling's and the sustain run's load
	// SustainFraction of the ceiling's accept rate is the sustain run's
	// rate (0 skips the run).
	SustainFraction float64
	// Rate, when above 0, skips the ceiling: the sustain run offers Rate
	// requests per second (SustainFraction is then unused).
	Rate int
	// MergeBacklog is the requests each side of the merge comparison
	// accepts before it releases them (0 skips the comparison).
	MergeBacklog int
	// DrainWait bounds each wait for the accepted requests to be issued.
	DrainWait time.Duration
	Seed      uint64
	RunID     string
	Progress  io.Writer
	// Real sends real traffic (Config.Real): real requests in the real
	// tables, taking the batches' real stock, under the router's
	// per-person limit. For a test cluster.
	Real bool
	// Baseline, when set, is a second cluster (say, the build before a
	// change) the ceiling and the sustain run also run against,
	// interleaved (the ceiling here first, the sustain run there first, at
	// this cluster's rate); its Name, RouterURL, ClusterSecret, APIKey,
	// Cells (its metrics: the issue latency) and Work are used. The merge
	// comparison runs here only. The suite's VsBaseline pairs the runs.
	Baseline *Cluster
}

// DefaultCouponsConfig is the bench batches make run loads
// (deploy/local/coupons.yaml): two hot, six cold.
func DefaultCouponsConfig() CouponsConfig {
	return CouponsConfig{
		RouterURL:       "http://127.0.0.1:8080",
		Hot:             []string{"bench-hot-1", "bench-hot-2"},
		Cold:            []string{"bench-cold-1", "bench-cold-2", "bench-cold-3", "bench-cold-4", "bench-cold-5", "bench-cold-6"},
		HotShare:        0.5,              // a few batches take half the drop
		Concurrency:     32,               // as the rewards workload
		Duration:        10 * time.Second, // as the other workloads
		SustainFraction: 0.7,              // the issue's figure
		MergeBacklog:    3000,             // a few seconds of issuing one by one
		DrainWait:       2 * time.Minute,
	}
}

// Validate checks every field.
func (c CouponsConfig) Validate() error {
	base := Config{RouterURL: c.RouterURL}
	if err := base.validateRouter(); err != nil {
		return err
	}
	switch {
	case c.ClusterSecret == "":
		return errors.New("bench: coupons: its stress traffic must be signed: give the cluster secret")
	case len(c.Hot) == 0 && len(c.Cold) == 0:
		return errors.New("bench: coupons: name at least one batch")
	case c.HotShare < 0 || c.HotShare > 1 || (c.HotShare > 0 && len(c.Hot) == 0) || (c.HotShare < 1 && len(c.Cold) == 0):
		return fmt.Errorf("bench: coupons: HotShare %v must be 0..1, with hot batches when above 0 and cold ones when below 1", c.HotShare)
	case c.Concurrency < 1 || c.Concurrency > openersMax:
		return fmt.Errorf("bench: coupons: Concurrency must be 1..%d, got %d", openersMax, c.Concurrency)
	case c.Duration <= 0 || c.Duration > durationMax:
		return fmt.Errorf("bench: coupons: Duration must be in (0, %v], got %v", durationMax, c.Duration)
	case c.SustainFraction < 0 || c.SustainFraction > 1:
		return fmt.Errorf("bench: coupons: SustainFraction must be 0..1, got %v", c.SustainFraction)
	case c.Rate < 0 || c.Rate > couponRateMax:
		return fmt.Errorf("bench: coupons: Rate must be 0..%d per second, got %d", couponRateMax, c.Rate)
	case c.MergeBacklog < 0 || c.MergeBacklog > couponBacklogMax:
		return fmt.Errorf("bench: coupons: MergeBacklog must be 0..%d, got %d", couponBacklogMax, c.MergeBacklog)
	case c.MergeBacklog > 0 && (len(c.AdminURLs) == 0 || c.AdminToken == "" || len(c.Hot) == 0):
		return errors.New("bench: coupons: the merge comparison needs the cells' admin ports, their token and a hot batch")
	case c.DrainWait <= 0 || c.DrainWait > couponDrainMax:
		return fmt.Errorf("bench: coupons: DrainWait must be in (0, %v]", couponDrainMax)
	case len(c.Metrics) == 0:
		return errors.New("bench: coupons: the cells' metrics are needed (the issue latency is theirs)")
	}
	if b := c.Baseline; b != nil {
		if err := b.validateTarget(); err != nil {
			return fmt.Errorf("bench: coupons: %w", err)
		}
		if len(b.Cells) == 0 {
			return errors.New("bench: coupons: the baseline cluster's cell metrics are needed (the issue latency is theirs)")
		}
	}
	if c.RunID != "" {
		return validateRunID(c.RunID)
	}
	return nil
}

// CouponsSuite is what one invocation measured.
type CouponsSuite struct {
	StartedAt  time.Time    `json:"started_at"`
	FinishedAt time.Time    `json:"finished_at"`
	Workload   string       `json:"workload"`
	Real       bool         `json:"real,omitempty"` // real traffic (CouponsConfig.Real), not stress
	Runs       []CouponsRun `json:"runs"`
	// VsBaseline pairs the ceiling and sustain runs with their runs on the
	// baseline cluster (CouponsConfig.Baseline): accepts/s, accept p99 and
	// work per request.
	VsBaseline []OpsVsBaseline `json:"vs_baseline,omitempty"`
	// Sustained is the ceiling's lower rate of accepts and issues, per
	// second: the rate the sustain run takes its fraction of.
	Sustained float64 `json:"sustained_per_sec"`
	// MergedOverSingle is the merged side's issues/s over the single side's.
	MergedOverSingle float64 `json:"merged_over_single,omitempty"`
	// Bare is the bare open run after the runs (the floor; bare.go).
	Bare   *BareReport    `json:"bare,omitempty"`
	Config map[string]any `json:"config,omitempty"`
}

// CouponsRun is one run: ceiling, sustain, merged or single.
type CouponsRun struct {
	Name        string  `json:"name"`
	Cluster     string  `json:"cluster,omitempty"` // the baseline's Name for its runs; "" this cluster's
	RunID       string  `json:"run_id"`
	Mode        string  `json:"mode"` // closed or open
	Rate        int     `json:"rate_per_sec,omitempty"`
	Concurrency int     `json:"concurrency"`
	MergeMax    int     `json:"merge_max,omitempty"` // the cells' merge bound during the run (merge comparison)
	Accept      OpStats `json:"accept"`
	// AcceptsPerSec is new requests accepted per second of the load.
	AcceptsPerSec float64 `json:"accepts_per_sec"`
	ElapsedMS     int64   `json:"elapsed_ms"` // the load
	Due           int64   `json:"due,omitempty"`
	Started       int64   `json:"started,omitempty"`
	// Issued is the coupons the cells issued from the load's start until
	// every accepted request was issued or DrainWait passed; DrainMS is that
	// time, from the load's start (the merge comparison: from the release).
	Issued       int64   `json:"issued"`
	DrainMS      int64   `json:"drain_ms"`
	IssuedPerSec float64 `json:"issued_per_sec"` // Issued over DrainMS
	// IssueLatency is accepted→issued from the cells' histogram, ms
	// (interpolated in its buckets); WithinTarget the share issued within
	// 0.5 s.
	IssueLatency LatencyMS `json:"issue_latency_ms"`
	WithinTarget float64   `json:"issued_within_500ms"`
	Note         string    `json:"note,omitempty"`
	// Work is what the run cost per accepted request, its issue included
	// (CouponsConfig.Work).
	Work *Work `json:"work,omitempty"`
}

// label is the run's name, after its cluster's for a baseline run.
func (r CouponsRun) label() string {
	if r.Cluster != "" {
		return r.Cluster + "/" + r.Name
	}
	return r.Name
}

// RunCoupons runs cfg. Failed requests are counted, never returned; see
// CouponsSuite.Problems. It returns an error for an invalid cfg or a cell
// it cannot switch, and ctx.Err() with what was measured when ctx ends.
func RunCoupons(ctx context.Context, cfg CouponsConfig) (CouponsSuite, error) {
	if err := cfg.Validate(); err != nil {
		return CouponsSuite{}, err
	}
	s := CouponsSuite{StartedAt: time.Now(), Workload: WorkloadCoupons}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(s.StartedAt.UnixNano())
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID(s.StartedAt)
	}
	s.Real = cfg.Real
	p := newCouponsPair(cfg, &s)
	defer p.close()
	p.runLoads(ctx)
	s.VsBaseline = pairWithBaseline(s.Runs, func(r CouponsRun) (string, string) { return r.Cluster, r.Name },
		func(r, b CouponsRun) OpsVsBaseline {
			return newOpsVsBaseline(r.Name, r.AcceptsPerSec, b.AcceptsPerSec, r.Accept.LatencyMS.P99, b.Accept.LatencyMS.P99, r.Work, b.Work)
		})
	if err := p.runMergeComparison(ctx); err != nil {
		s.FinishedAt = time.Now()
		return s, err
	}
	s.FinishedAt = time.Now()
	return s, ctx.Err()
}

// couponsPair runs the runs of one coupons suite on this cluster and, with
// a baseline, on the baseline too, and records them in s.
type couponsPair struct {
	cfg CouponsConfig
	s   *CouponsSuite
	cr  *couponsRunner // this cluster's
	br  *couponsRunner // the baseline's, or nil
}

// newCouponsPair makes the runners of cfg's cluster and of its baseline;
// close drops their idle connections.
func newCouponsPair(cfg CouponsConfig, s *CouponsSuite) *couponsPair {
	c := newClient(cfg.RouterURL, cfg.Concurrency, cfg.APIKey, cfg.ClusterSecret)
	c.real = cfg.Real
	hc := &http.Client{Timeout: 10 * time.Second}
	p := &couponsPair{cfg: cfg, s: s, cr: &couponsRunner{c: c, hc: hc, cfg: cfg}}
	if b := cfg.Baseline; b != nil {
		bc := newClient(b.RouterURL, cfg.Concurrency, b.APIKey, b.ClusterSecret)
		bc.real = cfg.Real
		bcfg := cfg
		bcfg.RouterURL, bcfg.Metrics, bcfg.Work = b.RouterURL, b.Cells, b.Work
		p.br = &couponsRunner{c: bc, hc: hc, cfg: bcfg, cluster: b.Name}
	}
	return p
}

// close drops the idle connections of both clusters' clients.
func (p *couponsPair) close() {
	if p.br != nil {
		p.br.c.hc.CloseIdleConnections()
	}
	p.cr.c.hc.CloseIdleConnections()
}

// both runs one run on this cluster and, with a baseline, on it too,
// this cluster first unless baseFirst; the runs' IDs differ (n, n+10).
// It returns this cluster's run.
func (p *couponsPair) both(ctx context.Context, name string, n, rate int, baseFirst bool) (mine CouponsRun) {
	cr, br := p.cr, p.br
	order := []*couponsRunner{cr, br}
	if baseFirst {
		order = []*couponsRunner{br, cr}
	}
	ran := 0
	for _, r := range order {
		if r == nil || (ran > 0 && !sleepCtx(ctx, rewardsPause)) {
			continue
		}
		ran++
		id := n
		if r == br {
			id += 10
		}
		out := r.run(ctx, name, suiteRunID(p.cfg.RunID, id), rate, false)
		out.Cluster = r.cluster
		p.s.Runs = append(p.s.Runs, out)
		if r == cr {
			mine = out
		}
	}
	return mine
}

// runLoads runs the load: one open-loop run at cfg.Rate when it is given,
// else the closed-loop ceiling and then, at SustainFraction of the
// sustained rate it finds, the open-loop sustain run.
func (p *couponsPair) runLoads(ctx context.Context) {
	cfg, s := p.cfg, p.s
	if cfg.Rate > 0 {
		// A given rate: no ceiling, one open-loop run at it.
		p.both(ctx, "sustain", 1, cfg.Rate, false)
		return
	}
	ceiling := p.both(ctx, "ceiling", 0, 0, false)
	// The sustained rate is what the cells both accept and issue: the
	// lower of the ceiling's accept rate and its issue rate (accepted
	// requests beyond what they issue only queue up).
	s.Sustained = min(ceiling.AcceptsPerSec, ceiling.IssuedPerSec)
	if ctx.Err() == nil && cfg.SustainFraction > 0 && s.Sustained > 0 && sleepCtx(ctx, rewardsPause) {
		rate := max(int(s.Sustained*cfg.SustainFraction), 1)
		p.both(ctx, "sustain", 1, rate, true)
	}
}

// runMergeComparison runs the merged-vs-single comparison on this cluster
// when cfg.MergeBacklog asks for it and sets s.MergedOverSingle. It returns
// the error of a cell it could not switch.
func (p *couponsPair) runMergeComparison(ctx context.Context) error {
	cfg, s := p.cfg, p.s
	if ctx.Err() == nil && cfg.MergeBacklog > 0 && sleepCtx(ctx, rewardsPause) {
		runs, err := p.cr.mergeComparison(ctx, cfg.RunID)
		s.Runs = append(s.Runs, runs...)
		if err != nil {
			return err
		}
		if len(runs) == 2 {
			s.MergedOverSingle = ratio(runs[0].IssuedPerSec, runs[1].IssuedPerSec)
		}
	}
	return nil
}

// OK reports whether the suite found no problem.
func (s CouponsSuite) OK() bool { return len(s.Problems()) == 0 }

// Problems lists why the suite failed: unexpected error codes, a run that
// accepted nothing, accepted requests not issued within the wait.
func (s CouponsSuite) Problems() []string {
	var ps []string
	for _, r := range s.Runs {
		name := r.label()
		for _, code := range sortedCodes(r.Accept.Errors) {
			if !shedCode(code) {
				ps = append(ps, fmt.Sprintf("%s: %d unexpected %s", name, r.Accept.Errors[code], code))
			}
		}
		accepted := int64(r.AcceptsPerSec*float64(r.ElapsedMS)/1000 + 0.5)
		if r.Accept.OK == 0 {
			ps = append(ps, name+": nothing was accepted")
		} else if r.Issued < accepted {
			ps = append(ps, fmt.Sprintf("%s: %d of about %d accepted requests issued within %v (%s)", name, r.Issued, accepted,
				time.Duration(r.DrainMS)*time.Millisecond, r.Note))
		}
	}
	slices.Sort(ps)
	return ps
}

// Targets compares the suite with the issue's figures: merged deduction at
// least 5x one deduction per request; at the sustain rate, 99% issued within
// 0.5 s and the accept p99 within 20 ms. Each line says met or missed.
func (s CouponsSuite) Targets() []string {
	var out []string
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	if s.MergedOverSingle > 0 {
		out = append(out, fmt.Sprintf("merged / single issues/s %.2fx (target >= 5x): %s", s.MergedOverSingle, mark(s.MergedOverSingle >= 5)))
	}
	for _, r := range s.Runs {
		if r.Name != "sustain" || r.Cluster != "" {
			continue
		}
		out = append(out, fmt.Sprintf("sustain at %d/s: %.2f%% issued within 0.5 s (target >= 99%%): %s", r.Rate, 100*r.WithinTarget, mark(r.WithinTarget >= 0.99)),
			fmt.Sprintf("sustain at %d/s: accept p99 %.1f ms (target <= 20 ms): %s", r.Rate, r.Accept.LatencyMS.P99, mark(r.Accept.LatencyMS.P99 <= 20)))
	}
	return out
}

// WriteText prints the suite for a person.
func (s CouponsSuite) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("redcell bench: coupons%s\n", realNote(s.Real))
	for _, r := range s.Runs {
		how := loopText(r.Mode, r.Rate, r.Concurrency, r.Started, r.Due)
		if r.MergeMax > 0 {
			how += fmt.Sprintf(", merge bound %d, accepted while held then released", r.MergeMax)
		}
		ew.printf("  %-7s run %s: %s, load %v\n", r.label(), r.RunID, how, time.Duration(r.ElapsedMS)*time.Millisecond)
		ew.printf("          accepts/s %.0f  p50 %.1f ms  p99 %.1f ms  p99.9 %.1f ms\n",
			r.AcceptsPerSec, r.Accept.LatencyMS.P50, r.Accept.LatencyMS.P99, r.Accept.LatencyMS.P999)
		ew.printf("          issued %d in %v (%.0f/s); accepted→issued p50 %.0f ms p99 %.0f ms, %.2f%% within 0.5 s\n",
			r.Issued, time.Duration(r.DrainMS)*time.Millisecond, r.IssuedPerSec, r.IssueLatency.P50, r.IssueLatency.P99, 100*r.WithinTarget)
		if len(r.Accept.Errors) > 0 {
			ew.printf("          errors %s\n", codeList(r.Accept.Errors))
		}
		r.Work.writeLine(ew, "          ")
	}
	for _, v := range s.VsBaseline {
		v.writeLine(ew, "  ", "accepts/s", "coupon request")
	}
	if s.Sustained > 0 {
		ew.printf("  sustained (the ceiling's lower of accepts/s and issued/s): %.0f/s\n", s.Sustained)
	}
	for _, t := range s.Targets() {
		ew.printf("  target: %s\n", t)
	}
	if s.Bare != nil {
		var works []namedWork
		for _, r := range s.Runs {
			works = appendOwnWork(works, r.Cluster, r.Name, r.Work)
		}
		s.Bare.writeFloor(ew, "  ", works)
	}
	ew.verdict(s.Problems())
	return ew.err
}
