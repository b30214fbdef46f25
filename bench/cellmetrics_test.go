package bench

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cellText renders the series the bench reads, as a cell's /metrics would:
// the open-batch histogram (count, sum), the credit-lag histogram with the
// cumulative bucket counts given (bounds 0.01, 0.1, 1, +Inf), the gauges.
func cellText(batchCount, batchSum int, lag [4]int, queue float64) string {
	var b strings.Builder
	b.WriteString("# HELP redcell_cell_open_batch_size Opens committed by one open transaction.\n")
	b.WriteString("# TYPE redcell_cell_open_batch_size histogram\n")
	b.WriteString("redcell_cell_open_batch_size_bucket{le=\"1\"} 0\n")
	b.WriteString("redcell_cell_open_batch_size_bucket{le=\"+Inf\"} " + itoa(batchCount) + "\n")
	b.WriteString("redcell_cell_open_batch_size_sum " + itoa(batchSum) + "\n")
	b.WriteString("redcell_cell_open_batch_size_count " + itoa(batchCount) + "\n")
	b.WriteString("# TYPE redcell_credit_lag_seconds histogram\n")
	for i, le := range []string{"0.01", "0.1", "1", "+Inf"} {
		b.WriteString("redcell_credit_lag_seconds_bucket{le=\"" + le + "\"} " + itoa(lag[i]) + "\n")
	}
	b.WriteString("redcell_credit_lag_seconds_sum 1.5\n")
	b.WriteString("redcell_credit_lag_seconds_count " + itoa(lag[3]) + "\n")
	b.WriteString("# TYPE redcell_cell_open_queue_depth gauge\n")
	b.WriteString("redcell_cell_open_queue_depth " + itoa(int(queue)) + "\n")
	b.WriteString("# TYPE redcell_cell_relay_lane_credits gauge\n")
	b.WriteString("redcell_cell_relay_lane_credits{space=\"shadow\",dest=\"cell-2\",kind=\"remote\"} 0\n")
	b.WriteString("redcell_cell_relay_lane_credits{space=\"shadow\",dest=\"cell-1\",kind=\"local\"} 0\n")
	return b.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

func scrapeOf(t *testing.T, cell, text string) cellScrape {
	t.Helper()
	h, g, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return cellScrape{cell: cell, hists: h, gauges: g}
}

func TestCellMetricsFromDeltas(t *testing.T) {
	before := []cellScrape{
		scrapeOf(t, "cell-1", cellText(100, 400, [4]int{10, 20, 30, 30}, 0)),
		scrapeOf(t, "cell-2", cellText(50, 50, [4]int{0, 0, 0, 0}, 0)),
	}
	// During the run: cell-1 committed 200 transactions of 1000 opens and saw
	// 60 credits (40 under 10 ms, 20 in 10..100 ms); cell-2 40 transactions of
	// 200 opens and 40 credits (all in 10..100 ms, one above 1 s).
	after := []cellScrape{
		scrapeOf(t, "cell-1", cellText(300, 1400, [4]int{50, 80, 90, 90}, 0)),
		scrapeOf(t, "cell-2", cellText(90, 250, [4]int{0, 39, 39, 40}, 0)),
	}
	cm := cellMetricsOf(before, after, "batched", 2*time.Second)
	if cm.Cells != 2 || cm.CommitMetric != "redcell_cell_open_batch_size" || len(cm.Missing) != 0 {
		t.Fatalf("%+v", cm)
	}
	if *cm.Commits != 240 || *cm.CommitsPerSec != 120 {
		t.Errorf("commits %d, %v/s; want 240, 120/s", *cm.Commits, *cm.CommitsPerSec)
	}
	if want := 1200.0 / 240; math.Abs(*cm.MeanBatch-want) > 1e-9 {
		t.Errorf("mean batch %v, want %v", *cm.MeanBatch, want)
	}
	// 100 credits: 40 ≤ 10 ms, 59 in (10, 100] ms, 0 in (100 ms, 1 s], 1 above.
	// Rank 99 lies in the second bucket: 10 + 90 × (99-40)/59 ms = 100 ms.
	if *cm.Credits != 100 || cm.CreditLagAbove || math.Abs(*cm.CreditLagP99MS-100) > 1e-9 {
		t.Errorf("credits %d, lag p99 %v ms (above %v), want 100, 100 ms", *cm.Credits, *cm.CreditLagP99MS, cm.CreditLagAbove)
	}
	if got := cm.lagText(); got != "100.0" {
		t.Errorf("lagText %q", got)
	}
}

func TestCellMetricsQuantile(t *testing.T) {
	h := histSnap{count: 100, uppers: []float64{0.01, 0.1, 1, math.Inf(1)}, buckets: []uint64{50, 90, 90, 100}}
	// 10 observations above 1 s: p99 is beyond the largest finite bound.
	if v, above, ok := h.quantile(0.99); !ok || !above || v != 1 {
		t.Errorf("p99 = %v above %v ok %v, want 1 above", v, above, ok)
	}
	// p50: rank 50 at the top of the first bucket.
	if v, above, _ := h.quantile(0.5); above || math.Abs(v-0.01) > 1e-12 {
		t.Errorf("p50 = %v above %v, want 0.01", v, above)
	}
	// p70: rank 70 halfway through the second bucket: 0.01 + 0.09 × 20/40.
	if v, _, _ := h.quantile(0.7); math.Abs(v-0.055) > 1e-12 {
		t.Errorf("p70 = %v, want 0.055", v)
	}
	if _, _, ok := (histSnap{}).quantile(0.99); ok {
		t.Error("an empty histogram has a quantile")
	}
}

func TestCellMetricsMissing(t *testing.T) {
	full := cellText(10, 10, [4]int{1, 1, 1, 1}, 0)
	noLag := cellText(10, 10, [4]int{1, 1, 1, 1}, 0)
	noLag = noLag[:strings.Index(noLag, "# TYPE redcell_credit_lag_seconds")] +
		noLag[strings.Index(noLag, "# TYPE redcell_cell_open_queue_depth"):]

	t.Run("a cell without the lag histogram", func(t *testing.T) {
		before := []cellScrape{scrapeOf(t, "cell-1", full), scrapeOf(t, "cell-2", noLag)}
		after := []cellScrape{scrapeOf(t, "cell-1", cellText(20, 30, [4]int{2, 2, 2, 2}, 0)), scrapeOf(t, "cell-2", noLag)}
		cm := cellMetricsOf(before, after, "naive", time.Second)
		if cm.CreditLagP99MS != nil || cm.Credits != nil || cm.lagText() != "n/a" {
			t.Errorf("lag %v from a cell without the series", cm.CreditLagP99MS)
		}
		if len(cm.Missing) != 1 || !strings.Contains(cm.Missing[0], "cell-2 has no redcell_credit_lag_seconds") {
			t.Errorf("missing %q", cm.Missing)
		}
		if *cm.Commits != 10 || *cm.MeanBatch != 2 {
			t.Errorf("commits %d mean batch %v, want 10, 2", *cm.Commits, *cm.MeanBatch)
		}
	})
	t.Run("a failed scrape", func(t *testing.T) {
		before := []cellScrape{scrapeOf(t, "cell-1", full)}
		after := []cellScrape{{cell: "cell-1", err: errTest}}
		cm := cellMetricsOf(before, after, "batched", time.Second)
		if cm.Commits != nil || cm.CommitsPerSec != nil || cm.MeanBatch != nil || cm.CreditLagP99MS != nil {
			t.Errorf("numbers from a failed scrape: %+v", cm)
		}
		if cm.commitsText() != "n/a" || cm.batchText() != "n/a" || len(cm.Missing) != 2 {
			t.Errorf("texts %q %q, missing %q", cm.commitsText(), cm.batchText(), cm.Missing)
		}
	})
	t.Run("a counter that went back", func(t *testing.T) {
		before := []cellScrape{scrapeOf(t, "cell-1", cellText(100, 100, [4]int{5, 5, 5, 5}, 0))}
		after := []cellScrape{scrapeOf(t, "cell-1", cellText(3, 3, [4]int{1, 1, 1, 1}, 0))}
		cm := cellMetricsOf(before, after, "batched", time.Second)
		if cm.Commits != nil || cm.CreditLagP99MS != nil || !strings.Contains(strings.Join(cm.Missing, ";"), "went back") {
			t.Errorf("a restarted cell gave numbers: %+v", cm)
		}
	})
	t.Run("a histogram made during the run", func(t *testing.T) {
		before := []cellScrape{scrapeOf(t, "cell-1", noLag)}
		after := []cellScrape{scrapeOf(t, "cell-1", cellText(10, 10, [4]int{3, 4, 4, 4}, 0))}
		cm := cellMetricsOf(before, after, "batched", time.Second)
		if cm.Credits == nil || *cm.Credits != 4 || cm.CreditLagP99MS == nil || len(cm.Missing) != 1 {
			t.Errorf("credits %v lag %v missing %q", cm.Credits, cm.CreditLagP99MS, cm.Missing)
		}
	})
	t.Run("no credit during the run", func(t *testing.T) {
		s := []cellScrape{scrapeOf(t, "cell-1", full)}
		cm := cellMetricsOf(s, s, "batched", time.Second)
		if cm.CreditLagP99MS != nil || *cm.Credits != 0 || *cm.Commits != 0 || cm.MeanBatch != nil {
			t.Errorf("%+v", cm)
		}
	})
}

// A strategy with a commit histogram of its own reads it when it moved, and
// the open-batch histogram when it did not (or is missing).
func TestCellMetricsCommitSource(t *testing.T) {
	group := func(count, sum int) string {
		return "# TYPE redcell_cell_group_requests histogram\n" +
			"redcell_cell_group_requests_bucket{le=\"+Inf\"} " + itoa(count) + "\n" +
			"redcell_cell_group_requests_sum " + itoa(sum) + "\n" +
			"redcell_cell_group_requests_count " + itoa(count) + "\n"
	}
	base := cellText(10, 10, [4]int{0, 0, 0, 0}, 0)
	before := []cellScrape{scrapeOf(t, "c", base+group(5, 50))}
	after := []cellScrape{scrapeOf(t, "c", cellText(12, 14, [4]int{0, 0, 0, 0}, 0)+group(25, 850))}
	cm := cellMetricsOf(before, after, "grouped", time.Second)
	if cm.CommitMetric != "redcell_cell_group_requests" || *cm.Commits != 20 || *cm.MeanBatch != 40 {
		t.Errorf("grouped: from %s, %d commits, batch %v", cm.CommitMetric, *cm.Commits, *cm.MeanBatch)
	}
	// Other strategies never read the group histogram.
	cm = cellMetricsOf(before, after, "batched", time.Second)
	if cm.CommitMetric != "redcell_cell_open_batch_size" || *cm.Commits != 2 {
		t.Errorf("batched: from %s, %d commits", cm.CommitMetric, *cm.Commits)
	}
	// A cell without the group histogram: grouped falls back.
	before = []cellScrape{scrapeOf(t, "c", base)}
	after = []cellScrape{scrapeOf(t, "c", cellText(12, 14, [4]int{0, 0, 0, 0}, 0))}
	cm = cellMetricsOf(before, after, "grouped", time.Second)
	if cm.CommitMetric != "redcell_cell_open_batch_size" || *cm.Commits != 2 {
		t.Errorf("grouped without its histogram: from %s, %v", cm.CommitMetric, cm.Commits)
	}
}

func TestCellMetricsIdle(t *testing.T) {
	if !idle([]cellScrape{scrapeOf(t, "c", cellText(1, 1, [4]int{}, 0))}) {
		t.Error("empty queues are not idle")
	}
	if idle([]cellScrape{scrapeOf(t, "c", cellText(1, 1, [4]int{}, 3))}) {
		t.Error("a queue of 3 is idle")
	}
	if idle([]cellScrape{{cell: "c", err: errTest}}) {
		t.Error("a failed scrape is idle")
	}
}

func TestParseMetricsRejectsGarbage(t *testing.T) {
	if _, _, err := parseMetrics(strings.NewReader("not metrics {{{\n")); err == nil {
		t.Error("garbage parsed")
	}
}

// TestClaimsPerSecByCell: each cell's claims per second come from its own
// counter's difference; a cell added during the run (0 before) counts all
// its claims, one whose scrape failed is left out.
func TestClaimsPerSecByCell(t *testing.T) {
	counter := func(n int) string {
		return "# TYPE redcell_cell_opens_total counter\nredcell_cell_opens_total " + itoa(n) + "\n"
	}
	before := []cellScrape{scrapeOf(t, "cell-1", counter(1000)), scrapeOf(t, "cell-2", counter(500)), scrapeOf(t, "cell-3", counter(0)),
		{cell: "cell-4", err: errScrape}}
	after := []cellScrape{scrapeOf(t, "cell-1", counter(1400)), scrapeOf(t, "cell-2", counter(700)), scrapeOf(t, "cell-3", counter(100)),
		scrapeOf(t, "cell-4", counter(9))}
	cm := cellMetricsOf(before, after, "batched", 4*time.Second)
	want := map[string]float64{"cell-1": 100, "cell-2": 50, "cell-3": 25}
	if len(cm.ClaimsPerSecByCell) != len(want) {
		t.Fatalf("by cell %v, want %v", cm.ClaimsPerSecByCell, want)
	}
	for c, v := range want {
		if cm.ClaimsPerSecByCell[c] != v {
			t.Errorf("%s: %v claims/s, want %v", c, cm.ClaimsPerSecByCell[c], v)
		}
	}
	if got := cm.byCellText(); got != "cell-1 100.0, cell-2 50.0, cell-3 25.0" {
		t.Errorf("text %q", got)
	}
}

var errScrape = errors.New("connection refused")
