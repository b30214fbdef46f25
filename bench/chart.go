package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Chart geometry, in SVG user units (pixels).
const (
	chartWidth       = 960
	chartMarginLeft  = 70
	chartMarginRight = 20
	chartPanelHeight = 200
	chartPanelGap    = 70 // title above, axis labels below
	chartTop         = 60 // title and legend
)

// chartBucketMinMS: shorter buckets (the last one, when requests in flight
// finish a few ms after the load's end) are left off the chart, where their
// rate would be noise; report.json keeps them.
const chartBucketMinMS = 500

// chartColors are told apart in print and by most color-blind readers (Okabe-Ito).
var chartColors = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

// series is one run's line on a time panel.
type series struct {
	name   string
	color  string
	xs, ys []float64 // seconds, value
}

// WriteSVG writes the suite's chart: the successful opens per second and the
// p99 latency of every run over time (1 s buckets by completion time), and,
// when there are several runs (strategy against strategy, router against
// direct), bars of each run's opens/s and p99. It returns the first write error.
func (s Suite) WriteSVG(w io.Writer) error {
	if len(s.Runs) == 0 && len(s.Search) > 0 {
		return s.writeSearchSVG(w)
	}
	if len(s.Runs) == 0 && s.Limits != nil {
		return s.Limits.writeSVG(w)
	}
	var b strings.Builder
	panels := 2
	bars := len(s.Runs) > 1 // a row of bars comparing the runs
	if bars {
		panels++
	}
	worked := false
	for _, r := range s.Runs {
		worked = worked || r.Work != nil
	}
	if worked {
		panels++
	}
	height := chartTop + panels*(chartPanelHeight+chartPanelGap)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">redcell bench: %s (%s)</text>`+"\n",
		chartMarginLeft, esc(s.Workload), verdict(s.OK()))

	var rate, p99 []series
	xMax := 1.0
	for i, r := range s.Runs {
		c := chartColors[i%len(chartColors)]
		rs, ps := series{name: r.Name(), color: c}, series{name: r.Name(), color: c}
		for _, bk := range r.Timeline {
			if bk.MS < chartBucketMinMS {
				continue
			}
			x := float64(bk.T) + float64(bk.MS)/2000 // the middle of the bucket
			rs.xs, rs.ys = append(rs.xs, x), append(rs.ys, bk.Rate())
			if bk.OK+bk.Errors > 0 {
				ps.xs, ps.ys = append(ps.xs, x), append(ps.ys, bk.P99MS)
			}
			xMax = math.Max(xMax, float64(bk.T)+float64(bk.MS)/1000)
		}
		rate, p99 = append(rate, rs), append(p99, ps)
	}
	legend(&b, rate)
	top := float64(chartTop + chartPanelGap/2)
	linePanel(&b, top, "successful opens per second", rate, xMax)
	top += chartPanelHeight + chartPanelGap
	linePanel(&b, top, "p99 latency of opens, ms", p99, xMax)
	if bars {
		top += chartPanelHeight + chartPanelGap
		var names, colors, rateLabels, p99Labels []string
		var rates, p99s []float64
		for i, r := range s.Runs {
			names, colors = append(names, r.Name()), append(colors, chartColors[i%len(chartColors)])
			rates, p99s = append(rates, r.OpensPerSec), append(p99s, r.Open.LatencyMS.P99)
			rateLabels = append(rateLabels, fmt.Sprintf("%.0f/s ×%.2f", r.OpensPerSec, ratio(r.OpensPerSec, s.Runs[0].OpensPerSec)))
			p99Labels = append(p99Labels, fmt.Sprintf("%.1f ms", r.Open.LatencyMS.P99))
		}
		half := float64(chartWidth-chartMarginLeft-chartMarginRight-40) / 2
		barPanel(&b, chartMarginLeft, top, half, "opens/s by run (× the first)", names, rates, colors, rateLabels)
		barPanel(&b, chartMarginLeft+half+40, top, half, "p99 of opens by run, ms", names, p99s, colors, p99Labels)
	}
	if worked {
		top += chartPanelHeight + chartPanelGap
		var names []string
		var works []*Work
		for _, r := range s.Runs {
			names, works = append(names, r.Name()), append(works, r.Work)
		}
		workBars(&b, top, "open", names, works)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSVG draws the ceilings of a limits-only invocation as bars: the
// database's rate per batch size and the no-op rates.
func (l LimitsReport) writeSVG(w io.Writer) error {
	var names, colors, labels []string
	var values []float64
	add := func(name string, v float64, color string) {
		names, values, colors = append(names, name), append(values, v), append(colors, color)
		labels = append(labels, fmt.Sprintf("%.0f/s", v))
	}
	for _, d := range l.DB {
		add(fmt.Sprintf("db batch %d", d.Batch), d.OpensPerSec, chartColors[0])
	}
	if l.NoopRouter != nil {
		add("HTTP via router", l.NoopRouter.PerSec, chartColors[1])
	}
	if l.NoopDirect != nil {
		add("HTTP direct", l.NoopDirect.PerSec, chartColors[2])
	}
	height := chartTop + chartPanelHeight + chartPanelGap
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">redcell bench: the ceilings (opens/s, requests/s)</text>`+"\n", chartMarginLeft)
	if len(values) > 0 {
		barPanel(&b, chartMarginLeft, chartTop, float64(chartWidth-chartMarginLeft-chartMarginRight), "rate", names, values, colors, labels)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// legend draws a colored square and the name of each series under the title.
func legend(b *strings.Builder, ss []series) {
	x := float64(chartMarginLeft)
	for _, s := range ss {
		fmt.Fprintf(b, `<rect x="%.1f" y="34" width="10" height="10" fill="%s"/>`, x, s.color)
		fmt.Fprintf(b, `<text x="%.1f" y="43">%s</text>`+"\n", x+14, esc(s.name))
		x += 24 + 7*float64(len(s.name))
	}
}

// linePanel draws one time panel: axes, grid, one polyline per series.
func linePanel(b *strings.Builder, top float64, title string, ss []series, xMax float64) {
	left, width := float64(chartMarginLeft), float64(chartWidth-chartMarginLeft-chartMarginRight)
	yMax := 0.0
	for _, s := range ss {
		for _, y := range s.ys {
			yMax = math.Max(yMax, y)
		}
	}
	yMax = niceCeil(yMax)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-weight="bold">%s</text>`+"\n", left, top-8, esc(title))
	grid(b, left, top, width, yMax)
	xStep := niceCeil(xMax / 10)
	for t := 0.0; t <= xMax+1e-9; t += xStep {
		x := left + width*t/xMax
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x, top+chartPanelHeight+16, num(t))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">seconds</text>`+"\n", left+width, top+chartPanelHeight+32)
	for _, s := range ss {
		if len(s.xs) == 0 {
			continue
		}
		var pts []string
		for i := range s.xs {
			x := left + width*s.xs[i]/xMax
			y := top + chartPanelHeight - chartPanelHeight*s.ys[i]/yMax
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n",
			s.color, strings.Join(pts, " "), esc(s.name))
	}
}

// barPanel draws one bar per value, labelled under the bar and above it.
func barPanel(b *strings.Builder, left, top, width float64, title string, names []string, values []float64, colors, labels []string) {
	yMax := 0.0
	for _, v := range values {
		yMax = math.Max(yMax, v)
	}
	yMax = niceCeil(yMax)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-weight="bold">%s</text>`+"\n", left, top-8, esc(title))
	grid(b, left, top, width, yMax)
	slot := width / float64(len(values))
	for i, v := range values {
		h := chartPanelHeight * v / yMax
		x := left + slot*float64(i) + slot*0.15
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
			x, top+chartPanelHeight-h, slot*0.7, h, colors[i], esc(names[i]+": "+labels[i]))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x+slot*0.35, top+chartPanelHeight-h-4, esc(labels[i]))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x+slot*0.35, top+chartPanelHeight+16, esc(names[i]))
	}
}

// grid draws the frame, five horizontal grid lines and their labels.
func grid(b *strings.Builder, left, top, width, yMax float64) {
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#888"/>`+"\n", left, top, width, chartPanelHeight)
	for i := 0; i <= 5; i++ {
		v := yMax * float64(i) / 5
		y := top + chartPanelHeight - chartPanelHeight*float64(i)/5
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, y, left+width, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, num(v))
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0), so
// axes end on a round number.
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// num formats an axis value compactly.
func num(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

func esc(s string) string { return html.EscapeString(s) }

// barRun is one run of a bar chart (writeRunsSVG): its rate of fresh
// operations, p99 in ms, and work per operation (nil: not measured).
type barRun struct {
	name      string
	rate, p99 float64
	work      *Work
}

// writeRunsSVG draws the runs of a workload without a timeline (rewards,
// coupons) as bars: the rate (× the first run), the p99, and, when any run's
// work was measured, statements and CPU µs (all processes) per operation
// (op names it). A figure a run could not measure is drawn as 0 and
// labelled n/a.
func writeRunsSVG(w io.Writer, title, rateTitle, op string, runs []barRun) error {
	rows := 1
	for _, r := range runs {
		if r.work != nil {
			rows = 2
		}
	}
	height := chartTop + rows*(chartPanelHeight+chartPanelGap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", chartMarginLeft, esc(title))
	if len(runs) == 0 {
		b.WriteString("</svg>\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	var names, colors, rateL, p99L []string
	var rates, p99s []float64
	var works []*Work
	for i, r := range runs {
		names, colors = append(names, r.name), append(colors, chartColors[i%len(chartColors)])
		rates, rateL = append(rates, r.rate), append(rateL, fmt.Sprintf("%.0f/s ×%s", r.rate, naF(ratioPtr(r.rate, runs[0].rate), "%.2f")))
		p99s, p99L = append(p99s, r.p99), append(p99L, fmt.Sprintf("%.1f ms", r.p99))
		if r.p99 == 0 { // not measured (an external load's)
			p99L[len(p99L)-1] = "n/a"
		}
		works = append(works, r.work)
	}
	half := float64(chartWidth-chartMarginLeft-chartMarginRight-40) / 2
	top := float64(chartTop + chartPanelGap/2)
	barPanel(&b, chartMarginLeft, top, half, rateTitle+" by run (× the first)", names, rates, colors, rateL)
	barPanel(&b, chartMarginLeft+half+40, top, half, "p99 by run, ms", names, p99s, colors, p99L)
	if rows == 2 {
		workBars(&b, top+chartPanelHeight+chartPanelGap, op, names, works)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// workBars draws a row of two bar panels at top: each run's statements and
// CPU µs (all processes) per operation (op names it), n/a where a run (its
// work nil, or the figure unread) has none. Runs take chartColors in order.
func workBars(b *strings.Builder, top float64, op string, names []string, works []*Work) {
	var colors, stmL, cpuL []string
	var stms, cpus []float64
	for i, w := range works {
		colors = append(colors, chartColors[i%len(chartColors)])
		st, c := w.statementsPtr(), w.cpuPtr("total")
		stms, stmL = append(stms, valueOr0(st)), append(stmL, naF(st, "%.2f"))
		cpus, cpuL = append(cpus, valueOr0(c)), append(cpuL, naF(c, "%.0f µs"))
	}
	half := float64(chartWidth-chartMarginLeft-chartMarginRight-40) / 2
	barPanel(b, chartMarginLeft, top, half, "SQL statements per "+op+" (idle taken off)", names, stms, colors, stmL)
	barPanel(b, chartMarginLeft+half+40, top, half, "CPU µs per "+op+", all processes", names, cpus, colors, cpuL)
}

// valueOr0 is *v, or 0 for nil.
func valueOr0(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// WriteSVG writes the suite's chart (writeRunsSVG): every run's issues/s,
// p99, statements and CPU µs per reward.
func (s RewardsSuite) WriteSVG(w io.Writer) error {
	var runs []barRun
	for _, r := range s.Runs {
		name := r.Booking
		if r.Cluster != "" {
			name = r.Cluster + "/" + name
		}
		runs = append(runs, barRun{name, r.IssuesPerSec, r.Issue.LatencyMS.P99, r.Work})
	}
	return writeRunsSVG(w, fmt.Sprintf("redcell bench: rewards of %s/%s (%s)", s.Parent, s.Scene, verdict(s.OK())), "new rewards/s", "reward", runs)
}

// WriteSVG writes the suite's chart (writeRunsSVG): the ceiling's and the
// sustain runs' accepts/s, accept p99, statements and CPU µs per coupon
// request. The merge comparison (issues/s after a release) is the text's.
func (s CouponsSuite) WriteSVG(w io.Writer) error {
	var runs []barRun
	for _, r := range s.Runs {
		if r.MergeMax == 0 {
			runs = append(runs, barRun{r.label(), r.AcceptsPerSec, r.Accept.LatencyMS.P99, r.Work})
		}
	}
	return writeRunsSVG(w, fmt.Sprintf("redcell bench: coupons (%s)", verdict(s.OK())), "accepts/s", "request", runs)
}
