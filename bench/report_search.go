package bench

import (
	"cmp"
	"fmt"
	"io"
	"strings"
)

// The report sections of the cells' metrics, the sustained-rate search and
// the sustain run (Markdown, readable as text).

// writeCellMetrics lists what the cells' metrics say about each run.
func (s Suite) writeCellMetrics(ew *errWriter) {
	var rows [][]string
	var missing []string
	for _, r := range s.Runs {
		cm := r.CellMetrics
		if cm == nil {
			continue
		}
		credits := "n/a"
		if cm.Credits != nil {
			credits = fmt.Sprint(*cm.Credits)
		}
		rows = append(rows, []string{r.Name(), fmt.Sprint(cm.Cells), cm.commitsText(), cm.batchText(), credits, cm.lagText(), cmp.Or(cm.CommitMetric, "n/a")})
		for _, m := range cm.Missing {
			missing = append(missing, r.Name()+": "+m)
		}
	}
	if len(rows) == 0 {
		return
	}
	ew.printf("## The cells' metrics\n\nDifferences of every cell's Prometheus series between a scrape before the run and one after it " +
		"(after the wait for credits), summed over the cells: the open path's database transactions per second of the load, " +
		"requests per transaction, and the 99th percentile of the credit lag (claim committed → credit applied), " +
		"estimated from the histogram's buckets. n/a: the cells do not export the series (reasons below).\n\n")
	mdTable(ew, []string{"run", "cells", "commits/s", "mean batch", "credits", "credit-lag p99 ms", "commits from"}, rows)
	for _, m := range missing {
		ew.printf("- n/a: %s\n", m)
	}
	if len(missing) > 0 {
		ew.printf("\n")
	}
}

// writeSearch reports each strategy's highest sustained rate, the ratios and
// the steps.
func (s Suite) writeSearch(ew *errWriter) {
	if len(s.Search) == 0 {
		return
	}
	bound := s.Search[0].P99BoundMS
	ew.printf("## Highest sustained rate\n\n"+
		"Per strategy, the highest open-loop rate (opens/s offered) at which the opens' p99 stayed within %.0f ms, nothing was shed "+
		"(no OVERLOADED, TIMEOUT or RATE_LIMITED answer, no client timeout or drop), no other unexpected code came back, "+
		"and the client started at least %.0f%% of the arrivals that fell due: a ramp ×%.0f from the first rate, then bisection to within %.0f%%, "+
		"each step a short run; then, where confirmation is on, the highest passing rate runs again for longer, a tenth lower each time it fails "+
		"(at most %d runs), and only a confirmed rate counts. Latency and the cells' metrics are the confirming run's (else the passing step's).\n\n",
		bound, 100*searchAchievedMin, searchFactor, 100*searchPrecision, confirmMax)
	var rows [][]string
	for _, r := range s.Search {
		rate := fmt.Sprint(r.SustainedRate)
		if r.SustainedRate == 0 {
			rate = noRateText
		}
		row := []string{cmp.Or(r.Strategy, s.Workload), rate}
		if b := r.Best(); b != nil {
			row = append(row, f1(b.OpensPerSec), f2(b.P50MS), f2(b.P99MS), f2(b.P999MS), b.Cell.commitsText(), b.Cell.batchText(), b.Cell.lagText())
		} else {
			row = append(row, "-", "-", "-", "-", "-", "-", "-")
		}
		fail := "none"
		if r.LowestFail > 0 {
			fail = fmt.Sprint(r.LowestFail)
		}
		confirmed := "no"
		if r.Confirmed {
			confirmed = "yes"
		}
		rows = append(rows, append(row, fail, fmt.Sprint(len(r.Steps)), r.Stop, confirmed))
	}
	mdTable(ew, []string{"strategy", "sustained opens/s", "ok opens/s", "p50 ms", "p99 ms", "p99.9 ms", "commits/s", "mean batch",
		"credit-lag p99 ms", "lowest failing", "steps", "stopped", "confirmed"}, rows)
	if len(s.SearchRatios) > 0 {
		rows = nil
		for _, q := range s.SearchRatios {
			rows = append(rows, []string{fmt.Sprintf("%s ÷ %s", cmp.Or(q.Strategy, s.Workload), cmp.Or(q.Over, s.Workload)), ratioText(q.Ratio)})
		}
		mdTable(ew, []string{"sustained rate", "ratio"}, rows)
	}
	rows = nil
	for _, r := range s.Search {
		for _, st := range r.Steps {
			verdict := passText(st.Pass)
			if st.Confirm {
				verdict = "confirm: " + verdict
			}
			rows = append(rows, []string{cmp.Or(r.Strategy, s.Workload), fmt.Sprint(st.Rate), verdict, f2(st.P99MS),
				pct(st.Achieved), fmt.Sprint(st.Shed), st.Cell.commitsText(), st.Cell.batchText(), fmt.Sprintf("%.1f", float64(st.WallMS)/1000), cmp.Or(st.Why, "-")})
		}
	}
	ew.printf("The steps, in order:\n\n")
	mdTable(ew, []string{"strategy", "rate", "step", "p99 ms", "started", "shed", "commits/s", "mean batch", "wall s", "why it failed"}, rows)
}

// writeSustain reports the run at a fraction of a strategy's sustained rate.
func (s Suite) writeSustain(ew *errWriter) {
	su := s.Sustain
	if su == nil {
		return
	}
	name := cmp.Or(su.Strategy, s.Workload)
	ew.printf("## At %.0f%% of %s's sustained rate\n\n", 100*su.Fraction, name)
	if su.Error != "" {
		ew.printf("Not run: %s.\n\n", su.Error)
		return
	}
	if su.NoRate {
		audit := "not run"
		switch a := su.Audit; {
		case su.AuditError != "":
			audit = "failed: " + su.AuditError
		case a != nil && a.Difference != 0:
			audit = fmt.Sprintf("money differs by %d cents", a.Difference)
		case a != nil && len(a.Problems) > 0:
			audit = fmt.Sprintf("%d problems", len(a.Problems))
		case a != nil:
			audit = "clean"
		}
		ew.printf("Not run: %s has %s (a measurement, not a failure). The audit after the search: %s.\n\n", name, noRateText, audit)
		return
	}
	r := su.Run
	if r == nil {
		ew.printf("Not run.\n\n")
		return
	}
	l := r.Open.LatencyMS
	ew.printf("%s open-loop at %d opens/s (%.0f%% of %d) for %.0f s. Targets: open p99 ≤ %.0f ms, credit-lag p99 ≤ %.0f ms, "+
		"only SOLD_OUT/EXPIRED errors, audit clean.\n\n",
		r.Workload, su.Rate, 100*su.Fraction, su.SustainedRate, float64(r.DurationMS)/1000, su.P99BoundMS, su.LagBoundMS)
	mdTable(ew, []string{"opens ok", "opens/s", "p50 ms", "p99 ms", "p99.9 ms", "credit-lag p99 ms", "commits/s", "mean batch", "errors by code", "audit", "targets"},
		[][]string{{fmt.Sprint(r.Open.OK), f1(r.OpensPerSec), f2(l.P50), f2(l.P99), f2(l.P999), r.CellMetrics.lagText(),
			r.CellMetrics.commitsText(), r.CellMetrics.batchText(), codes(*r), auditText(*r), metText(su.Missed)}})
	for _, m := range su.Missed {
		ew.printf("- missed: %s\n", m)
	}
	if len(su.Missed) > 0 {
		ew.printf("\n")
	}
}

// noRateText is how reports show a strategy whose search confirmed no rate.
const noRateText = "no confirmed rate"

func passText(ok bool) string {
	if ok {
		return "pass"
	}
	return "fail"
}

func metText(missed []string) string {
	if len(missed) == 0 {
		return "MET"
	}
	return fmt.Sprintf("MISSED %d", len(missed))
}

// ratioText is a ratio with two decimals, "n/a" when it has none.
func ratioText(x *float64) string { return naF(x, "%.2f") }

// writeSearchSVG draws a search-only invocation: each strategy's sustained
// rate (× the first strategy's) and its p99 at that rate, as bars.
func (s Suite) writeSearchSVG(w io.Writer) error {
	var names, colors, rateLabels, p99Labels []string
	var rates, p99s []float64
	for i, r := range s.Search {
		names, colors = append(names, cmp.Or(r.Strategy, s.Workload)), append(colors, chartColors[i%len(chartColors)])
		rates = append(rates, float64(r.SustainedRate))
		rateLabels = append(rateLabels, fmt.Sprintf("%d/s ×%s", r.SustainedRate,
			ratioText(ratioPtr(float64(r.SustainedRate), float64(s.Search[0].SustainedRate)))))
		p99 := 0.0
		if b := r.Best(); b != nil {
			p99 = b.P99MS
		}
		p99s, p99Labels = append(p99s, p99), append(p99Labels, fmt.Sprintf("%.1f ms", p99))
	}
	height := chartTop + chartPanelHeight + chartPanelGap
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">redcell bench: %s, highest sustained open-loop rate (p99 ≤ %.0f ms, nothing shed)</text>`+"\n",
		chartMarginLeft, esc(s.Workload), s.Search[0].P99BoundMS)
	half := float64(chartWidth-chartMarginLeft-chartMarginRight-40) / 2
	barPanel(&b, chartMarginLeft, chartTop, half, "sustained opens/s by strategy (× the first)", names, rates, colors, rateLabels)
	barPanel(&b, chartMarginLeft+half+40, chartTop, half, "p99 of opens at that rate, ms", names, p99s, colors, p99Labels)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ratioPtr is a/b, nil when b is 0.
func ratioPtr(a, b float64) *float64 {
	if b == 0 {
		return nil
	}
	return ptr(a / b)
}
