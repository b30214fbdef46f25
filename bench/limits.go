package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"redcell/sharding"
)

// Bounds of the limits measurements.
const (
	noopConcurrencyMax = 4096
	limitDurationMax   = time.Minute
	// noopActs is the size of the act_id pool the no-op requests cycle over,
	// all owned by the measured cell.
	noopActs = 1024
	// noopCandidatesMax bounds the act_ids tried to fill the pool (a cell that
	// owns one shard in 1000 needs about a million).
	noopCandidatesMax = 5_000_000
	// noopMax bounds the requests of one no-op measurement.
	noopMax = 100_000_000
)

// LimitsConfig says how to measure the ceilings of the stack: (a) the
// database's rate for batched opens of one hot packet without HTTP, through
// DBLimit, once per batch size; (b) the raw HTTP rate of bench → router → cell
// with the no-op route, and of bench → cell directly, closed-loop.
type LimitsConfig struct {
	RouterURL string
	// RunID prefixes the no-op act_ids; empty: derived from the start time.
	RunID string
	// Concurrency is the number of no-op workers, 1..noopConcurrencyMax.
	Concurrency int
	// HTTPDuration is how long each no-op measurement runs, (0, 1m].
	HTTPDuration time.Duration
	// DBBatches are the batch sizes given to DBLimit, each run for DBDuration.
	DBBatches  []int
	DBDuration time.Duration
	// DBLimit measures opens/s of one writer on one hot packet committing
	// batches of batch opens, for d. nil: the database is not measured.
	DBLimit func(ctx context.Context, batch int, d time.Duration) (float64, error)
	// Progress, when set, gets a progress bar per no-op measurement.
	Progress io.Writer
	// ClusterSecret signs the no-op requests: the router takes the stress
	// mark only signed, and cells refuse unsigned calls; empty: the direct
	// no-op is not measured (and the router refuses its no-op).
	ClusterSecret string
	// APIKey authenticates the router no-op (Authorization: Bearer).
	APIKey string
	// Wrk is the wrk binary (FindWrk) that checks the bench client: the
	// router no-op is sent by the bench and by wrk in turn, the same ordinary
	// API key requests, and the report says bench ÷ wrk (ClientCheck). "":
	// no check; WrkSkipped says why, when it was asked for.
	Wrk, WrkSkipped string
	// RouterPprof is the router's pprof address (host:port; make run with
	// REDCELL_PPROF=1 serves it on 127.0.0.1:6060). When set, the router's
	// CPU is profiled during the signed router no-op and its top functions
	// and CPU per request are reported (RouterProfile). "": not profiled.
	RouterPprof string
}

// DefaultLimitsConfig measures a few seconds each: 3 s per batch size and per
// no-op path, enough for a stable rate on loopback.
func DefaultLimitsConfig(routerURL string) LimitsConfig {
	return LimitsConfig{
		RouterURL:    routerURL,
		Concurrency:  256, // enough connections to keep the router's and a cell's cores busy
		HTTPDuration: 3 * time.Second,
		DBBatches:    []int{1, 16, 64, 256},
		DBDuration:   3 * time.Second,
	}
}

// Validate checks the config.
func (lc LimitsConfig) Validate() error {
	if (Config{RouterURL: lc.RouterURL}).validateRouter() != nil {
		return fmt.Errorf("bench: limits RouterURL %q must be an http(s) URL with a host", lc.RouterURL)
	}
	if lc.Concurrency < 1 || lc.Concurrency > noopConcurrencyMax {
		return fmt.Errorf("bench: limits Concurrency must be 1..%d, got %d", noopConcurrencyMax, lc.Concurrency)
	}
	if lc.HTTPDuration <= 0 || lc.HTTPDuration > limitDurationMax || lc.DBDuration <= 0 || lc.DBDuration > limitDurationMax {
		return fmt.Errorf("bench: limits durations must be in (0, %v]", limitDurationMax)
	}
	for _, b := range lc.DBBatches {
		if b < 1 || b > 4096 {
			return fmt.Errorf("bench: limits batch sizes must be 1..4096, got %d", b)
		}
	}
	if lc.RunID != "" {
		return validateRunID(lc.RunID)
	}
	return nil
}

// LimitsReport is what MeasureLimits found.
type LimitsReport struct {
	DB         []DBLimit   `json:"db,omitempty"`
	DBSkipped  string      `json:"db_skipped,omitempty"` // why the database was not measured
	NoopRouter *NoopResult `json:"noop_router,omitempty"`
	NoopDirect *NoopResult `json:"noop_direct,omitempty"`
	// NoopDirectSkipped says why the direct no-op was not measured.
	NoopDirectSkipped string `json:"noop_direct_skipped,omitempty"`
	// RouterOverDirect is the no-op rate through the router / directly to the
	// cell: what the extra hop leaves of the HTTP ceiling.
	RouterOverDirect float64 `json:"router_over_direct,omitempty"`
	// Client is the bench client checked against wrk (LimitsConfig.Wrk).
	Client *ClientCheck `json:"client_check,omitempty"`
	// RouterProfile is the router's CPU during the signed router no-op
	// (LimitsConfig.RouterPprof).
	RouterProfile *CPUProfile `json:"router_profile,omitempty"`
	Errors        []string    `json:"errors,omitempty"`
	// AllowShed: the no-op measurements' shedding answers (runShedCode, and
	// wrk's timeouts) are counted in Shed, not failed, as in the suite's runs.
	AllowShed bool `json:"allow_shed,omitempty"`
}

// noops lists the no-op measurements made: via the router, direct, and the
// client check's by the bench and by wrk.
func (l LimitsReport) noops() []*NoopResult {
	noops := []*NoopResult{l.NoopRouter, l.NoopDirect}
	if c := l.Client; c != nil {
		for i := range c.Bench {
			noops = append(noops, &c.Bench[i])
		}
		for i := range c.WrkRuns {
			noops = append(noops, &c.WrkRuns[i])
		}
	}
	return noops
}

// noopShedCode: a no-op answer that is load shed (wrk's timeouts too).
func noopShedCode(code string) bool { return runShedCode(code) || code == "WRK_TIMEOUT" }

// Shed lists the no-op measurements' shedding answers that AllowShed
// counted instead of failing, one line per measurement.
func (l LimitsReport) Shed() []string {
	if !l.AllowShed {
		return nil
	}
	var out []string
	for _, n := range l.noops() {
		if n == nil {
			continue
		}
		var parts []string
		for _, code := range sortedCodes(n.Errors) {
			if noopShedCode(code) {
				parts = append(parts, fmt.Sprintf("%s=%d", code, n.Errors[code]))
			}
		}
		if len(parts) > 0 {
			out = append(out, fmt.Sprintf("no-op %s: %s", n.Path, strings.Join(parts, ", ")))
		}
	}
	return out
}

// DBLimit is the database's rate for one batch size.
type DBLimit struct {
	Batch       int     `json:"batch"`
	OpensPerSec float64 `json:"opens_per_sec"`
	Error       string  `json:"error,omitempty"`
}

// NoopResult is one closed-loop no-op measurement.
type NoopResult struct {
	Path        string           `json:"path"` // "router" or "direct"
	Cell        string           `json:"cell"` // the cell that answered
	URL         string           `json:"url"`
	Concurrency int              `json:"concurrency"`
	ElapsedMS   int64            `json:"elapsed_ms"`
	Count       int64            `json:"count"`
	OK          int64            `json:"ok"`
	PerSec      float64          `json:"per_sec"` // successful requests per second
	LatencyMS   LatencyMS        `json:"latency_ms"`
	Errors      map[string]int64 `json:"errors,omitempty"`
}

// Problems lists the measurements that failed.
func (l LimitsReport) Problems() []string {
	ps := append([]string(nil), l.Errors...)
	for _, d := range l.DB {
		if d.Error != "" {
			ps = append(ps, fmt.Sprintf("db limit at batch %d: %s", d.Batch, d.Error))
		}
	}
	if c := l.Client; c != nil && c.Error != "" {
		ps = append(ps, "client check: "+c.Error)
	}
	for _, n := range l.noops() {
		if n == nil || len(n.Errors) == 0 {
			continue
		}
		failed := n.Errors
		if l.AllowShed && n.OK > 0 {
			failed = map[string]int64{}
			for code, k := range n.Errors {
				if !noopShedCode(code) {
					failed[code] = k
				}
			}
		}
		if len(failed) > 0 {
			ps = append(ps, fmt.Sprintf("no-op %s: %d of %d requests failed %v", n.Path, n.Count-n.OK, n.Count, failed))
		}
	}
	if p := l.RouterProfile; p != nil && p.Error != "" {
		ps = append(ps, "router profile: "+p.Error)
	}
	return ps
}

// BestDB returns the highest database rate measured; ok is false when none was.
func (l LimitsReport) BestDB() (DBLimit, bool) {
	var best DBLimit
	for _, d := range l.DB {
		if d.Error == "" && d.OpensPerSec > best.OpensPerSec {
			best = d
		}
	}
	return best, best.OpensPerSec > 0
}

// MeasureLimits measures the ceilings lc asks for. Failures are recorded in the
// report (see Problems); it returns an error only when lc is invalid or ctx ends.
func MeasureLimits(ctx context.Context, lc LimitsConfig) (LimitsReport, error) {
	var rep LimitsReport
	if err := lc.Validate(); err != nil {
		return rep, err
	}
	if lc.RunID == "" {
		lc.RunID = newRunID(time.Now())
	}
	if lc.DBLimit == nil {
		rep.DBSkipped = "no cluster config (--config) to reach the database"
	}
	for _, b := range lc.DBBatches {
		if lc.DBLimit == nil {
			break
		}
		rate, err := lc.DBLimit(ctx, b, lc.DBDuration)
		d := DBLimit{Batch: b, OpensPerSec: rate}
		if err != nil {
			d.Error = err.Error()
		}
		rep.DB = append(rep.DB, d)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	if err := measureNoops(ctx, lc, &rep); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	if rep.NoopRouter != nil && rep.NoopDirect != nil {
		rep.RouterOverDirect = ratio(rep.NoopRouter.PerSec, rep.NoopDirect.PerSec)
	}
	return rep, ctx.Err()
}

// measureNoops picks the first cell the router lists and measures the no-op
// rate to it through the router, then directly, over the same act_ids.
func measureNoops(ctx context.Context, lc LimitsConfig, rep *LimitsReport) error {
	rc := newClient(lc.RouterURL, lc.Concurrency, lc.APIKey, lc.ClusterSecret)
	defer rc.hc.CloseIdleConnections()
	cells, _, err := discoverCells(rc)
	if err != nil {
		return err
	}
	if len(cells) == 0 {
		return errors.New("bench: the router lists no cell")
	}
	cell := cells[0]
	acts, err := actsOwnedBy(lc.RunID, cell)
	if err != nil {
		return err
	}
	var prof <-chan CPUProfile
	if lc.RouterPprof != "" {
		prof = profileDuring(ctx, lc.RouterPprof, lc.HTTPDuration)
	}
	r := noop(ctx, rc, lc, "router", cell.Name, acts, true)
	rep.NoopRouter = &r
	if prof != nil {
		p := <-prof
		p.perRequest(r.PerSec)
		rep.RouterProfile = &p
	}
	switch {
	case lc.WrkSkipped != "":
		rep.Client = &ClientCheck{Skipped: lc.WrkSkipped}
	case lc.Wrk != "" && ctx.Err() == nil:
		rep.Client = checkClient(ctx, lc, rc, cell)
		rep.Client.SignedOverWrk = ratio(r.PerSec, rep.Client.WrkPerSec)
	}
	if ctx.Err() != nil {
		return nil
	}
	if lc.ClusterSecret == "" {
		rep.NoopDirectSkipped = "no cluster secret (--config or REDCELL_CLUSTER_SECRET) to sign requests to the cell"
		return nil
	}
	dc := newClient("http://"+cell.Addr, lc.Concurrency, "", lc.ClusterSecret)
	defer dc.hc.CloseIdleConnections()
	d := noop(ctx, dc, lc, "direct", cell.Name, acts, true)
	rep.NoopDirect = &d
	return nil
}

// actsOwnedBy returns noopActs act_ids whose shard cell owns.
func actsOwnedBy(runID string, cell CellInfo) ([]string, error) {
	return actsOwnedByN(runID, cell, noopActs)
}

// actsOwnedByN returns up to n act_ids ("<runID>-n<k>") whose shard cell
// owns, trying noopCandidatesMax at most; an error when it finds none.
func actsOwnedByN(runID string, cell CellInfo, n int) ([]string, error) {
	ranges, err := sharding.ParseRanges(cell.Shards)
	if err != nil {
		return nil, fmt.Errorf("bench: cell %s: %w", cell.Name, err)
	}
	var acts []string
	for k := 0; len(acts) < n && k < noopCandidatesMax; k++ {
		act := fmt.Sprintf("%s-n%d", runID, k)
		if ranges.Contains(sharding.ShardOfAct(act)) {
			acts = append(acts, act)
		}
	}
	if len(acts) == 0 {
		return nil, fmt.Errorf("bench: found no act_id for cell %s (shards %s)", cell.Name, cell.Shards)
	}
	return acts, nil
}

// noop sends POST api.NoopPath+act closed-loop with lc.Concurrency workers for
// lc.HTTPDuration (see noopLoad) and checks each answer names the expected
// cell. stress: the request is marked and signed as stress traffic, as the
// bench's workloads send it; otherwise it is an ordinary API key request.
func noop(ctx context.Context, c *client, lc LimitsConfig, path, cell string, acts []string, stress bool) NoopResult {
	recs := newStripes(noopStripes)
	start := time.Now()
	load, cancel := context.WithTimeout(ctx, lc.HTTPDuration)
	defer cancel()
	stop := startProgress(lc.Progress, "no-op "+path, start, lc.HTTPDuration, func() progressSnapshot {
		return progressSnapshot{noun: "requests", opens: stripesOK(recs), errors: stripesErrors(recs)}
	})
	noopLoad{c: c, cell: cell, acts: acts, stress: stress}.run(load, lc.Concurrency, recs)
	elapsed := time.Since(start)
	stop()
	s := mergedStats(recs)
	r := NoopResult{Path: path, Cell: cell, URL: c.base, Concurrency: lc.Concurrency, ElapsedMS: elapsed.Milliseconds(),
		Count: s.Count, OK: s.OK, LatencyMS: s.LatencyMS, Errors: s.Errors}
	if sec := elapsed.Seconds(); sec > 0 {
		r.PerSec = float64(s.OK) / sec
	}
	return r
}

// CeilingRow puts one hot run's open rate against the ceilings measured in the
// same invocation: each Of* is the run's rate divided by that ceiling (0 when
// the ceiling was not measured).
type CeilingRow struct {
	Run              string  `json:"run"`
	OpensPerSec      float64 `json:"opens_per_sec"`
	OK               bool    `json:"ok"`
	DBOpensPerSec    float64 `json:"db_opens_per_sec"`
	DBBatch          int     `json:"db_batch"`
	OfDB             float64 `json:"of_db"`
	NoopRouterPerSec float64 `json:"noop_router_per_sec"`
	OfNoopRouter     float64 `json:"of_noop_router"`
	NoopDirectPerSec float64 `json:"noop_direct_per_sec"`
	OfNoopDirect     float64 `json:"of_noop_direct"`
}

// ceilings compares every hot run with the ceilings: the product's hot-open
// rate as a fraction of what the database and HTTP alone reach.
func (l LimitsReport) ceilings(runs []Report) []CeilingRow {
	best, _ := l.BestDB()
	var rows []CeilingRow
	for _, r := range runs {
		if r.Workload != WorkloadHot {
			continue
		}
		row := CeilingRow{Run: r.Name(), OpensPerSec: r.OpensPerSec, OK: r.OK(),
			DBOpensPerSec: best.OpensPerSec, DBBatch: best.Batch, OfDB: ratio(r.OpensPerSec, best.OpensPerSec)}
		if l.NoopRouter != nil {
			row.NoopRouterPerSec, row.OfNoopRouter = l.NoopRouter.PerSec, ratio(r.OpensPerSec, l.NoopRouter.PerSec)
		}
		if l.NoopDirect != nil {
			row.NoopDirectPerSec, row.OfNoopDirect = l.NoopDirect.PerSec, ratio(r.OpensPerSec, l.NoopDirect.PerSec)
		}
		rows = append(rows, row)
	}
	return rows
}
