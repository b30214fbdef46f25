package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The cells' Prometheus series the bench reads (GET /metrics on each cell's
// admin port, which needs no token), before and after every run. Every name
// the bench reads is in this table and nowhere else, so a renamed series is
// changed here only.
var cellMetricNames = struct {
	// commits lists, per open strategy, the histograms observed once per
	// database transaction of the open path, with the requests the
	// transaction carried as the value: their _count is the transactions,
	// _sum the requests. A strategy not listed uses the "" entry. When a
	// strategy lists several, the first whose count moved during the run is
	// read (an idle path's histogram stays where it was). The open batch
	// histogram is observed as a transaction begins, so transactions that
	// failed count too; grouped's counts the groups committed, whose
	// requests include the sends, deposits and credits that joined them.
	commits map[string][]string
	// creditLag is the histogram of the time from a claim's commit to its
	// credit being applied, in seconds.
	creditLag string
	// claims is the counter of claims made by opens, read per cell.
	claims string
	// idle are gauges that are 0 when a cell is idle: opens waiting in the
	// FIFOs, requests waiting in the commit lanes, credits the relay lanes
	// hold. The search waits for them between steps.
	idle []string
}{
	commits: map[string][]string{
		"grouped": {"redcell_cell_group_requests", "redcell_cell_open_batch_size"},
		"":        {"redcell_cell_open_batch_size"},
	},
	creditLag: "redcell_credit_lag_seconds",
	claims:    "redcell_cell_opens_total",
	idle:      []string{"redcell_cell_open_queue_depth", "redcell_cell_group_queued", "redcell_cell_relay_lane_credits"},
}

// MetricsTarget is one cell whose metrics a suite scrapes.
type MetricsTarget struct {
	Cell string // the cell's name, for messages
	URL  string // its metrics, e.g. "http://127.0.0.1:9111/metrics"
}

// CellMetrics is what the cells' own metrics say about one run: the
// differences of their series between a scrape before the run and one after
// it (after the settle phase, so the credits of the run's last claims are in),
// summed over the cells. A number the metrics cannot give (a series missing
// from a cell, a scrape that failed, a counter that went back) is nil, shown
// as "n/a", and Missing says why.
type CellMetrics struct {
	Cells int `json:"cells"` // cells scraped
	// CommitMetric is the histogram the commits were read from.
	CommitMetric string `json:"commit_metric,omitempty"`
	// Commits are the open path's database transactions during the run and
	// CommitsPerSec them per second of the load phase (Report.ElapsedMS).
	Commits       *int64   `json:"commits"`
	CommitsPerSec *float64 `json:"commits_per_sec"`
	// MeanBatch is requests per transaction: the histogram's sum / count.
	MeanBatch *float64 `json:"mean_batch_size"`
	// Credits is how many credits the lag histogram observed during the run;
	// CreditLagP99MS their 99th percentile in ms, estimated from the bucket
	// counts as Prometheus' histogram_quantile does (linear within a bucket).
	// CreditLagAbove: the percentile lies beyond the largest finite bucket,
	// whose bound CreditLagP99MS then is: the lag is at least that.
	Credits        *int64   `json:"credits"`
	CreditLagP99MS *float64 `json:"credit_lag_p99_ms"`
	CreditLagAbove bool     `json:"credit_lag_p99_above,omitempty"`
	// ClaimsPerSecByCell is each cell's claims made by opens
	// (redcell_cell_opens_total) per second of the load phase: where the load
	// went (a cell added during a run shows up here). A cell whose counter
	// could not be read both times is left out.
	ClaimsPerSecByCell map[string]float64 `json:"claims_per_sec_by_cell,omitempty"`
	Missing            []string           `json:"missing,omitempty"`
}

// scrapeTimeout bounds one cell's GET /metrics; scrapeBytesMax its body.
const (
	scrapeTimeout  = 5 * time.Second
	scrapeBytesMax = 16 << 20
)

// histSnap is one histogram summed over its series: cumulative bucket counts
// by upper bound (ascending, +Inf last).
type histSnap struct {
	count   uint64
	sum     float64
	uppers  []float64
	buckets []uint64
}

// cellScrape is one cell's metrics at one moment.
type cellScrape struct {
	cell   string
	err    error                // the scrape failed; nothing else is set
	hists  map[string]*histSnap // by family name
	gauges map[string]float64   // by family name, summed over the series; counters too
}

// scrapeCells reads every target's metrics at once.
func scrapeCells(ctx context.Context, hc *http.Client, targets []MetricsTarget) []cellScrape {
	out := make([]cellScrape, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { out[i] = scrapeCell(ctx, hc, t) })
	}
	wg.Wait()
	return out
}

func scrapeCell(ctx context.Context, hc *http.Client, t MetricsTarget) cellScrape {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	sc := cellScrape{cell: t.Cell}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		sc.err = err
		return sc
	}
	resp, err := hc.Do(req)
	if err != nil {
		sc.err = err
		return sc
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		sc.err = fmt.Errorf("GET %s: %s", t.URL, resp.Status)
		return sc
	}
	sc.hists, sc.gauges, sc.err = parseMetrics(io.LimitReader(resp.Body, scrapeBytesMax))
	return sc
}

// parseMetrics reads Prometheus text exposition: every histogram and gauge
// family, each summed over its series (labels).
func parseMetrics(r io.Reader) (map[string]*histSnap, map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: parse metrics: %w", err)
	}
	hists, gauges := map[string]*histSnap{}, map[string]float64{}
	for name, f := range fams {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			h, err := sumHistogram(f.GetMetric())
			if err != nil {
				return nil, nil, fmt.Errorf("bench: metric %s: %w", name, err)
			}
			hists[name] = h
		case dto.MetricType_GAUGE:
			var v float64
			for _, m := range f.GetMetric() {
				v += m.GetGauge().GetValue()
			}
			gauges[name] = v
		case dto.MetricType_COUNTER:
			var v float64
			for _, m := range f.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			gauges[name] = v
		}
	}
	return hists, gauges, nil
}

// sumHistogram adds the series of one histogram family; they must share
// their buckets.
func sumHistogram(ms []*dto.Metric) (*histSnap, error) {
	h := &histSnap{}
	for i, m := range ms {
		mh := m.GetHistogram()
		h.count += mh.GetSampleCount()
		h.sum += mh.GetSampleSum()
		bs := mh.GetBucket()
		if i == 0 {
			for _, b := range bs {
				h.uppers = append(h.uppers, b.GetUpperBound())
			}
			h.buckets = make([]uint64, len(bs))
		} else if len(bs) != len(h.uppers) {
			return nil, fmt.Errorf("series with different buckets")
		}
		for j, b := range bs {
			if b.GetUpperBound() != h.uppers[j] {
				return nil, fmt.Errorf("series with different buckets")
			}
			h.buckets[j] += b.GetCumulativeCount()
		}
	}
	// The text format may leave out the +Inf bucket; its count is the total.
	if n := len(h.uppers); n == 0 || !math.IsInf(h.uppers[n-1], 1) {
		h.uppers = append(h.uppers, math.Inf(1))
		h.buckets = append(h.buckets, h.count)
	}
	return h, nil
}

// histDelta is after − before for one histogram over every cell. ok is false,
// with why, when a cell's scrape failed, a cell lacks the histogram after the
// run, or a count went back (a cell restarted during the run). A histogram a
// cell had not yet made before the run counts from zero: all of it is the run's.
func histDelta(before, after []cellScrape, name string) (d histSnap, ok bool, why string) {
	if len(before) != len(after) || len(after) == 0 {
		return d, false, "no cell scraped"
	}
	for i := range after {
		b, a := before[i], after[i]
		switch {
		case b.err != nil:
			return d, false, fmt.Sprintf("cell %s: scrape before the run: %v", b.cell, b.err)
		case a.err != nil:
			return d, false, fmt.Sprintf("cell %s: scrape after the run: %v", a.cell, a.err)
		}
		hb, hasB := b.hists[name]
		ha, hasA := a.hists[name]
		if !hasA {
			return d, false, fmt.Sprintf("cell %s has no %s", a.cell, name)
		}
		if !hasB {
			hb = &histSnap{uppers: ha.uppers, buckets: make([]uint64, len(ha.buckets))}
		}
		if !slices.Equal(hb.uppers, ha.uppers) || (d.uppers != nil && !slices.Equal(d.uppers, ha.uppers)) {
			return d, false, fmt.Sprintf("%s: buckets differ between scrapes or cells", name)
		}
		if ha.count < hb.count {
			return d, false, fmt.Sprintf("cell %s: %s went back (restarted?)", a.cell, name)
		}
		if d.uppers == nil {
			d.uppers = ha.uppers
			d.buckets = make([]uint64, len(ha.uppers))
		}
		d.count += ha.count - hb.count
		d.sum += ha.sum - hb.sum
		for j := range d.buckets {
			if ha.buckets[j] < hb.buckets[j] {
				return histSnap{}, false, fmt.Sprintf("cell %s: %s went back (restarted?)", a.cell, name)
			}
			d.buckets[j] += ha.buckets[j] - hb.buckets[j]
		}
	}
	return d, true, ""
}

// quantile estimates the q-quantile (0 < q < 1) of h's observations as
// Prometheus' histogram_quantile does: find the bucket holding rank q·count
// and interpolate linearly between its bounds (the first bucket's lower bound
// is 0). above is true when the rank falls in the +Inf bucket; v is then the
// largest finite bound. ok is false when h is empty.
func (h histSnap) quantile(q float64) (v float64, above, ok bool) {
	if h.count == 0 || len(h.buckets) == 0 {
		return 0, false, false
	}
	rank := q * float64(h.count)
	lower, below := 0.0, uint64(0)
	for i, cum := range h.buckets {
		if float64(cum) >= rank {
			upper := h.uppers[i]
			if math.IsInf(upper, 1) {
				return lower, true, true
			}
			in := cum - below
			if in == 0 {
				return upper, false, true
			}
			return lower + (upper-lower)*(rank-float64(below))/float64(in), false, true
		}
		lower, below = h.uppers[i], cum
	}
	return lower, true, true // counts inconsistent with the total: be pessimistic
}

// cellMetricsOf computes a run's CellMetrics from the scrapes around it;
// strategy picks the commit histograms (cellMetricNames.commits) and elapsed
// is the load phase.
func cellMetricsOf(before, after []cellScrape, strategy string, elapsed time.Duration) *CellMetrics {
	cm := &CellMetrics{Cells: len(after)}
	names, ok := cellMetricNames.commits[strategy]
	if !ok {
		names = cellMetricNames.commits[""]
	}
	var commit histSnap
	var found bool
	var whys []string
	for _, name := range names {
		d, ok, why := histDelta(before, after, name)
		if !ok {
			whys = append(whys, why)
			continue
		}
		if !found || commit.count == 0 && d.count > 0 {
			commit, found, cm.CommitMetric = d, true, name
		}
	}
	if found {
		n := int64(commit.count)
		cm.Commits = &n
		if s := elapsed.Seconds(); s > 0 {
			cm.CommitsPerSec = ptr(float64(n) / s)
		}
		if n > 0 {
			cm.MeanBatch = ptr(commit.sum / float64(n))
		} else {
			cm.Missing = append(cm.Missing, "mean batch size: no transaction in "+cm.CommitMetric)
		}
	} else {
		cm.Missing = append(cm.Missing, "commits: "+strings.Join(whys, "; "))
	}
	lag, ok, why := histDelta(before, after, cellMetricNames.creditLag)
	switch {
	case !ok:
		cm.Missing = append(cm.Missing, "credit lag: "+why)
	case lag.count == 0:
		cm.Credits = ptr(int64(0))
		cm.Missing = append(cm.Missing, "credit lag: no credit observed during the run")
	default:
		cm.Credits = ptr(int64(lag.count))
		v, above, _ := lag.quantile(0.99)
		cm.CreditLagP99MS, cm.CreditLagAbove = ptr(v*1000), above
	}
	if s := elapsed.Seconds(); s > 0 && len(before) == len(after) {
		for i, a := range after {
			b := before[i]
			vb, okB := b.gauges[cellMetricNames.claims]
			va, okA := a.gauges[cellMetricNames.claims]
			if b.err != nil || a.err != nil || !okB || !okA || va < vb {
				continue
			}
			if cm.ClaimsPerSecByCell == nil {
				cm.ClaimsPerSecByCell = map[string]float64{}
			}
			cm.ClaimsPerSecByCell[a.cell] = (va - vb) / s
		}
	}
	return cm
}

// byCellText is the claims per second of each cell, by name: "cell-1 120.0,
// cell-2 98.5", or "n/a".
func (cm *CellMetrics) byCellText() string {
	if cm == nil || len(cm.ClaimsPerSecByCell) == 0 {
		return "n/a"
	}
	names := make([]string, 0, len(cm.ClaimsPerSecByCell))
	for n := range cm.ClaimsPerSecByCell {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.1f", n, cm.ClaimsPerSecByCell[n])
	}
	return strings.Join(parts, ", ")
}

func ptr[T any](v T) *T { return &v }

// idle reports whether every cell's open queue and relay lanes are empty; a
// gauge a cell does not export counts as empty, a failed scrape as busy.
func idle(scrapes []cellScrape) bool {
	for _, s := range scrapes {
		if s.err != nil {
			return false
		}
		for _, g := range cellMetricNames.idle {
			if s.gauges[g] > 0 {
				return false
			}
		}
	}
	return true
}

// naF formats an optional number with format, "n/a" when nil.
func naF(v *float64, format string) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v)
}

// lagText is a credit-lag p99 for the reports: "n/a", "12.3" or ">10000.0".
func (cm *CellMetrics) lagText() string {
	if cm == nil || cm.CreditLagP99MS == nil {
		return "n/a"
	}
	if cm.CreditLagAbove {
		return fmt.Sprintf(">%.1f", *cm.CreditLagP99MS)
	}
	return fmt.Sprintf("%.1f", *cm.CreditLagP99MS)
}

func (cm *CellMetrics) commitsText() string {
	if cm == nil {
		return "n/a"
	}
	return naF(cm.CommitsPerSec, "%.1f")
}

func (cm *CellMetrics) batchText() string {
	if cm == nil {
		return "n/a"
	}
	return naF(cm.MeanBatch, "%.2f")
}

// metricsClient scrapes the cells: a plain client of its own, so the load's
// connection pool is left alone.
var metricsClient = &http.Client{Timeout: scrapeTimeout}

// runMeasured runs cfg (see Run) between two scrapes of targets and sets the
// report's CellMetrics; without targets it is Run.
func runMeasured(ctx context.Context, cfg Config, targets []MetricsTarget, strategy string) (Report, error) {
	if len(targets) == 0 {
		return Run(ctx, cfg)
	}
	before := scrapeCells(ctx, metricsClient, targets)
	rep, err := Run(ctx, cfg)
	if rep.RunID == "" || ctx.Err() != nil {
		return rep, err
	}
	after := scrapeCells(ctx, metricsClient, targets)
	rep.CellMetrics = cellMetricsOf(before, after, strategy, time.Duration(rep.ElapsedMS)*time.Millisecond)
	return rep, err
}
