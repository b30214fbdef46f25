package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// comparedSuite is a suite of three strategies with limits, as a
// `--workload hot --compare naive,serial,batched --limits` run produces.
func comparedSuite() Suite {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := Suite{StartedAt: start, FinishedAt: start.Add(time.Minute), Workload: WorkloadHot, StrategyBefore: "batched"}
	for i, st := range []string{"naive", "serial", "batched"} {
		r := passing()
		r.Workload, r.Label, r.Strategy, r.Mode = WorkloadHot, st, st, modeClosed
		r.OpensPerSec = float64(100 * (i + 1))
		r.Open.LatencyMS = LatencyMS{P50: 1, P90: 2, P99: float64(30 - 10*i), P999: 40, Max: 50}
		for sec := range 5 {
			r.Timeline = append(r.Timeline, Bucket{T: sec, MS: 1000, OK: int64(100 * (i + 1)), P99MS: float64(30 - 10*i)})
		}
		r.Timeline[4].MS = 500
		s.Runs = append(s.Runs, r)
	}
	s.Limits = &LimitsReport{DB: []DBLimit{{Batch: 1, OpensPerSec: 500}, {Batch: 64, OpensPerSec: 9000}},
		NoopRouter: &NoopResult{Path: "router", Cell: "cell-1", PerSec: 20000},
		NoopDirect: &NoopResult{Path: "direct", Cell: "cell-1", PerSec: 40000}, RouterOverDirect: 0.5}
	s.compare(SuiteConfig{Strategies: []string{"naive", "serial", "batched"}})
	return s
}

func TestSuiteMarkdown(t *testing.T) {
	s := comparedSuite()
	var b bytes.Buffer
	if err := s.WriteMarkdown(&b, ChartFile); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# redcell bench: hot",
		"**PASS**",
		"## Runs",
		"| naive | workload hot, closed-loop",
		"## Strategies",
		"| serial | 200.0 | 2.00 | 1.00 | 20.00 |",
		"| batched | 300.0 | 3.00 | 1.00 | 10.00 |",
		"set back to it",
		"## Limits",
		"| 64 | 9000.0 |",
		"Router / direct no-op rate: 0.50",
		"## Hot opens against the ceilings",
		"| batched | 300.0 | 3.3% of 9000.0 (batch 64) | 1.5% of 20000.0 | 0.8% of 40000.0 | PASS |",
		"![throughput and p99 over time](chart.svg)",
		"## Operations",
		"SOLD_OUT=7",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}

	s.Runs[1].Audit.Difference = 3 // money lost: the run fails whatever its speed
	b.Reset()
	if err := s.WriteMarkdown(&b, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DIFFERS by 3 cents", "**FAIL**", "serial: audit: money differs by 3 cents"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("failing markdown lacks %q", want)
		}
	}
	if s.OK() {
		t.Error("a suite with a money difference is OK")
	}
}

// The chart is well-formed XML with a line per run on both time panels and a
// bar per run in compare mode.
func TestSuiteSVG(t *testing.T) {
	var b bytes.Buffer
	if err := comparedSuite().WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	dec := xml.NewDecoder(&b)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
	if counts["svg"] != 1 || counts["polyline"] != 6 || counts["rect"] < 3+6+1 {
		t.Fatalf("elements %v: want 6 polylines (3 runs × 2 panels) and bars", counts)
	}

	one := comparedSuite()
	one.Runs = one.Runs[:1]
	one.Runs[0].Label = `a<b & "c"`
	b.Reset()
	if err := one.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("escaped chart: %v", err)
	}
	if strings.Contains(b.String(), "opens/s by run") {
		t.Error("a single run got a comparison bar chart")
	}
}

func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "bench", "x")
	s := comparedSuite()
	if err := WriteFiles(dir, s); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ReportMarkdownFile, ReportJSONFile, ChartFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, ReportJSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var back Suite
	if err := json.Unmarshal(b, &back); err != nil || len(back.Runs) != 3 || len(back.Comparison) != 3 || back.Limits == nil {
		t.Fatalf("round trip: %v, %+v", err, back)
	}
	for _, key := range []string{`"p99_9"`, `"timeline"`, `"comparison"`, `"ceilings"`, `"router_over_direct"`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Errorf("report.json lacks %s", key)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{{0, 1}, {-3, 1}, {0.7, 1}, {1, 1}, {1.01, 2}, {3, 5}, {7, 10}, {12, 20}, {4999, 5000}, {5001, 10000}} {
		if got := niceCeil(tt.in); got != tt.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// A limits-only invocation charts its ceilings as bars.
func TestLimitsOnlyOutput(t *testing.T) {
	s := comparedSuite()
	s.Runs, s.Comparison, s.Ceilings, s.Workload = nil, nil, nil, "limits"
	var b bytes.Buffer
	if err := s.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("chart: %v", err)
	}
	for _, want := range []string{"db batch 64", "HTTP via router", "HTTP direct", "9000/s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("limits chart lacks %q", want)
		}
	}
	b.Reset()
	if err := s.WriteMarkdown(&b, ChartFile); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "every measurement succeeded") || !strings.Contains(b.String(), "![the ceilings](chart.svg)") {
		t.Errorf("limits markdown:\n%s", b.String())
	}
}

// With work measured, the open chart gets a row of work bars, and the
// rewards and coupons charts draw rate, p99 and work bars per run, a run
// without work labelled n/a; all well-formed XML.
func TestWorkCharts(t *testing.T) {
	s := comparedSuite()
	s.Runs[0].Work = &Work{Statements: ptr(4.57), CPUMicros: map[string]float64{"total": 812}}
	var b bytes.Buffer
	if err := s.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("chart: %v", err)
	}
	for _, want := range []string{"SQL statements per open", ">4.57<", ">812 µs<", ">n/a<", "opens/s by run", "p99 of opens by run"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("open chart lacks %q", want)
		}
	}
	// Every panel within the picture: time, time, bars, work.
	var svg struct {
		Height float64 `xml:"height,attr"`
		Rects  []struct {
			Y float64 `xml:"y,attr"`
			H string  `xml:"height,attr"` // "100%" for the background
		} `xml:"rect"`
	}
	if err := xml.Unmarshal(b.Bytes(), &svg); err != nil {
		t.Fatal(err)
	}
	if want := float64(chartTop + 4*(chartPanelHeight+chartPanelGap)); svg.Height != want {
		t.Errorf("height %v, want 4 panels' %v", svg.Height, want)
	}
	for _, r := range svg.Rects {
		if h, err := strconv.ParseFloat(r.H, 64); err == nil && r.Y+h > svg.Height {
			t.Errorf("a rect at y %v, height %v, ends below the picture's %v", r.Y, h, svg.Height)
		}
	}
	one := comparedSuite()
	one.Runs = one.Runs[:1]
	one.Runs[0].Work = s.Runs[0].Work
	b.Reset()
	if err := one.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "opens/s by run") || !strings.Contains(b.String(), "SQL statements per open") {
		t.Error("one run with work: want the work bars and no comparison bars")
	}
	rw := RewardsSuite{Parent: "demo-festival", Scene: "rain", Runs: []RewardsRun{
		{Booking: BookingAsync, IssuesPerSec: 874, Issue: OpStats{OK: 1, LatencyMS: LatencyMS{P99: 143.5}}, Work: &Work{Statements: ptr(2.93), CPUMicros: map[string]float64{"total": 1741}}},
		{Booking: BookingAsync, Cluster: "before", IssuesPerSec: 437, Issue: OpStats{OK: 1, LatencyMS: LatencyMS{P99: 256.5}}, Work: &Work{Statements: ptr(5.48)}},
	}}
	b.Reset()
	if err := rw.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("rewards chart: %v", err)
	}
	for _, want := range []string{"new rewards/s by run", ">874/s ×1.00<", ">437/s ×0.50<", ">before/async<", ">143.5 ms<", ">5.48<", ">1741 µs<", ">n/a<", "per reward"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("rewards chart lacks %q", want)
		}
	}
	cs := CouponsSuite{Runs: []CouponsRun{{Name: "ceiling", AcceptsPerSec: 900, Accept: OpStats{OK: 1}}}}
	b.Reset()
	if err := cs.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil || !strings.Contains(b.String(), "accepts/s by run") || strings.Contains(b.String(), "SQL statements") {
		t.Fatalf("coupons chart without work (err %v):\n%s", err, b.String())
	}
}
