package bench

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"time"

	"redcell/api"
)

// WriteMarkdown writes the suite as a Markdown report: the verdict, one row per
// run, the comparisons, the limits, the error codes, the problems and, when
// chart is not "", a link to the SVG chart of that name next to the report.
// It returns the first write error.
func (s Suite) WriteMarkdown(w io.Writer, chart string) error {
	ew := &errWriter{w: w}
	ew.printf("# redcell bench: %s\n\n", s.Workload)
	ew.printf("Started %s, finished after %s. **%s**\n\n", s.StartedAt.Format(time.RFC3339),
		s.FinishedAt.Sub(s.StartedAt).Round(time.Second), verdict(s.OK()))
	if len(s.Runs) > 0 {
		ew.printf("## Runs\n\n")
		ew.printf("Latency in ms (HDR histogram, µs resolution; open-loop runs count from the scheduled start). " +
			"Rates are successful opens per second of the load phase.\n\n")
		rows := [][]string{}
		for _, r := range s.Runs {
			l := r.Open.LatencyMS
			rows = append(rows, []string{r.Name(), r.describe(), fmt.Sprint(r.Open.OK), f1(r.OpensPerSec),
				f2(l.P50), f2(l.P90), f2(l.P99), f2(l.P999), f2(l.Max), codes(r), money(r), verdict(r.OK())})
		}
		mdTable(ew, []string{"run", "what", "opens ok", "opens/s", "p50", "p90", "p99", "p99.9", "max", "errors", "money", "verdict"}, rows)
	}
	switch {
	case chart != "" && len(s.Runs) > 0:
		ew.printf("![throughput and p99 over time](%s)\n\n", chart)
	case chart != "" && s.Limits != nil:
		ew.printf("![the ceilings](%s)\n\n", chart)
	}
	s.writeSummary(ew)
	s.writeOps(ew)
	s.writeProblems(ew)
	return ew.err
}

// WriteSummary writes what the per-run text reports do not say: the
// comparisons, the limits and the verdict, as Markdown tables (readable as
// text). It returns the first write error.
func (s Suite) WriteSummary(w io.Writer) error {
	ew := &errWriter{w: w}
	s.writeSummary(ew)
	s.writeProblems(ew)
	return ew.err
}

func (s Suite) writeSummary(ew *errWriter) {
	if len(s.Comparison) > 0 {
		ew.printf("## Strategies\n\nEach strategy's successful opens/s divided by the first one's")
		if s.StrategyBefore != "" {
			ew.printf(" (the cells ran %s before and were set back to it)", s.StrategyBefore)
		}
		ew.printf(".\n\n")
		var rows [][]string
		for _, c := range s.Comparison {
			rows = append(rows, []string{c.Strategy, f1(c.OpensPerSec), f2(c.Ratio), f2(c.P50MS), f2(c.P99MS), f2(c.P999MS),
				c.Cell.commitsText(), c.Cell.batchText(), c.Cell.lagText(), verdict(c.OK)})
		}
		mdTable(ew, []string{"strategy", "opens/s", "ratio", "p50 ms", "p99 ms", "p99.9 ms",
			"commits/s", "mean batch", "credit-lag p99 ms", "verdict"}, rows)
	}
	s.writeCellMetrics(ew)
	s.writeWork(ew)
	s.writeBare(ew)
	if len(s.VsBaseline) > 0 {
		ew.printf("## Against the baseline cluster\n\nThe same workload (one seed) on both clusters, interleaved; ratio = this cluster's successful opens/s / the baseline's.\n\n")
		var rows [][]string
		for _, b := range s.VsBaseline {
			rows = append(rows, []string{cmp.Or(b.Strategy, s.Workload), f1(b.OpensPerSec), f1(b.BaselineOpensPerSec), f2(b.Ratio), f2(b.P99MS), f2(b.BaselineP99MS)})
		}
		mdTable(ew, []string{"strategy", "opens/s", "baseline opens/s", "ratio", "p99 ms", "baseline p99 ms"}, rows)
		writeWorkVsBaseline(ew, "open", s.VsBaseline, func(b BaselineRow) (string, *WorkVsBaseline) { return cmp.Or(b.Strategy, s.Workload), b.Work })
		if len(s.BaselineComparison) > 0 {
			ew.printf("The baseline's own strategies, each against its first:\n\n")
			rows = nil
			for _, c := range s.BaselineComparison {
				rows = append(rows, []string{c.Strategy, f1(c.OpensPerSec), f2(c.Ratio), f2(c.P99MS), f2(c.P999MS), verdict(c.OK)})
			}
			mdTable(ew, []string{"strategy", "opens/s", "ratio", "p99 ms", "p99.9 ms", "verdict"}, rows)
		}
	}
	var classRows [][]string
	for _, r := range s.Runs {
		if r.OpenHot != nil && r.OpenCold != nil {
			h, c := r.OpenHot.LatencyMS, r.OpenCold.LatencyMS
			classRows = append(classRows, []string{r.Label, fmt.Sprint(r.OpenHot.Count), f2(h.P50), f2(h.P99),
				fmt.Sprint(r.OpenCold.Count), f2(c.P50), f2(c.P99)})
		}
	}
	if len(classRows) > 0 {
		ew.printf("## Hot and cold packets\n\nFestival opens split by packet: groups of %d members or more (hot) and the rest (cold).\n\n", hotGroupMin)
		mdTable(ew, []string{"run", "hot opens", "hot p50 ms", "hot p99 ms", "cold opens", "cold p50 ms", "cold p99 ms"}, classRows)
	}
	if len(s.RouterVsDirect) > 0 {
		ew.printf("## Router against direct\n\nRouter rate / direct rate: 1.00 means the router costs nothing.\n\n")
		var rows [][]string
		for _, d := range s.RouterVsDirect {
			rows = append(rows, []string{d.Name, f1(d.RouterOpensPerSec), f1(d.DirectOpensPerSec), f2(d.Ratio), f2(d.RouterP99MS), f2(d.DirectP99MS)})
		}
		mdTable(ew, []string{"run", "router opens/s", "direct opens/s", "router/direct", "router p99 ms", "direct p99 ms"}, rows)
	}
	s.writeSearch(ew)
	s.writeSustain(ew)
	for _, r := range s.Runs {
		if p := r.RouterProfile; p != nil {
			p.writeMarkdown(ew, "The router's CPU during run "+r.Name())
		}
	}
	if l := s.Limits; l != nil {
		l.writeMarkdown(ew)
	}
	if len(s.Ceilings) > 0 {
		ew.printf("## Hot opens against the ceilings\n\nThe product's hot-open rate as a fraction of each ceiling measured in this invocation.\n\n")
		var rows [][]string
		for _, c := range s.Ceilings {
			rows = append(rows, []string{c.Run, f1(c.OpensPerSec),
				fmt.Sprintf("%s of %s (batch %d)", pct(c.OfDB), f1(c.DBOpensPerSec), c.DBBatch),
				fmt.Sprintf("%s of %s", pct(c.OfNoopRouter), f1(c.NoopRouterPerSec)),
				fmt.Sprintf("%s of %s", pct(c.OfNoopDirect), f1(c.NoopDirectPerSec)), verdict(c.OK)})
		}
		mdTable(ew, []string{"run", "hot opens/s", "of the database", "of HTTP via router", "of HTTP direct", "verdict"}, rows)
	}
}

func (l LimitsReport) writeMarkdown(ew *errWriter) {
	ew.printf("## Limits\n\n")
	if l.DBSkipped != "" {
		ew.printf("Database not measured: %s.\n\n", l.DBSkipped)
	}
	if l.NoopDirectSkipped != "" {
		ew.printf("HTTP direct not measured: %s.\n\n", l.NoopDirectSkipped)
	}
	if len(l.DB) > 0 {
		ew.printf("The database alone: one writer opening one hot packet, committing batches of the given size (no HTTP).\n\n")
		var rows [][]string
		for _, d := range l.DB {
			rate := f1(d.OpensPerSec)
			if d.Error != "" {
				rate = "error: " + d.Error
			}
			rows = append(rows, []string{fmt.Sprint(d.Batch), rate})
		}
		mdTable(ew, []string{"batch", "opens/s"}, rows)
	}
	if l.NoopRouter != nil || l.NoopDirect != nil {
		ew.printf("HTTP alone: `POST %s<act_id>` answered by the cell at once, closed-loop.\n\n", api.NoopPath)
		var rows [][]string
		for _, n := range []*NoopResult{l.NoopRouter, l.NoopDirect} {
			if n == nil {
				continue
			}
			rows = append(rows, []string{n.Path, n.Cell, fmt.Sprint(n.Concurrency), f1(n.PerSec),
				f2(n.LatencyMS.P50), f2(n.LatencyMS.P99), f2(n.LatencyMS.Max), codeList(n.Errors)})
		}
		mdTable(ew, []string{"path", "cell", "concurrency", "requests/s", "p50 ms", "p99 ms", "max ms", "errors"}, rows)
		if l.RouterOverDirect > 0 {
			ew.printf("Router / direct no-op rate: %s.\n\n", f2(l.RouterOverDirect))
		}
	}
	if c := l.Client; c != nil {
		c.writeMarkdown(ew)
	}
	if p := l.RouterProfile; p != nil {
		p.writeMarkdown(ew, "The router's CPU during the router no-op")
	}
}

func (c ClientCheck) writeMarkdown(ew *errWriter) {
	ew.printf("### The bench client against wrk\n\n")
	if c.Skipped != "" {
		ew.printf("Not checked: %s.\n\n", c.Skipped)
		return
	}
	ew.printf("The same requests through the router (%s), %d connections each (wrk: %d threads), sent by the bench and by wrk in turn.\n\n",
		c.Request, c.Connections, c.WrkThreads)
	var rows [][]string
	for i := range c.Bench {
		rows = append(rows, noopRow("bench", c.Bench[i]))
		if i < len(c.WrkRuns) {
			rows = append(rows, noopRow("wrk", c.WrkRuns[i]))
		}
	}
	mdTable(ew, []string{"client", "requests/s", "p50 ms", "p99 ms", "max ms", "errors"}, rows)
	if c.Error != "" {
		ew.printf("Check failed: %s.\n\n", c.Error)
		return
	}
	v := "the bench client is not what bounds the rate"
	if c.BenchOverWrk < ClientCheckMin {
		v = fmt.Sprintf("below %s: the bench client may bound the rates it measures", pct(ClientCheckMin))
	}
	ew.printf("Bench ÷ wrk: **%s** (mean %s vs %s requests/s; %s).", f2(c.BenchOverWrk), f1(c.BenchPerSec), f1(c.WrkPerSec), v)
	if c.SignedOverWrk > 0 {
		ew.printf(" The bench's own no-op (stress-marked and signed, checked by the router) ÷ wrk: %s.", f2(c.SignedOverWrk))
	}
	ew.printf("\n\n")
}

func noopRow(client string, n NoopResult) []string {
	return []string{client, f1(n.PerSec), f2(n.LatencyMS.P50), f2(n.LatencyMS.P99), f2(n.LatencyMS.Max), codeList(n.Errors)}
}

func (p CPUProfile) writeMarkdown(ew *errWriter, title string) {
	ew.printf("### %s\n\n", title)
	if p.Error != "" {
		ew.printf("Not profiled: %s.\n\n", p.Error)
		return
	}
	ew.printf("%s over %.0f s: %.2f s of CPU, %.2f cores busy", p.URL, p.Seconds, p.CPUSeconds, p.CoresBusy)
	if p.CPUMicrosPerRequest > 0 {
		ew.printf(", **%.1f µs of CPU per request**", p.CPUMicrosPerRequest)
	}
	ew.printf(".\n\n")
	var rows [][]string
	for i := range max(len(p.Flat), len(p.Cum)) {
		row := []string{"", "", "", ""}
		if i < len(p.Flat) {
			row[0], row[1] = "`"+p.Flat[i].Name+"`", fmt.Sprintf("%.1f %%", p.Flat[i].Pct)
		}
		if i < len(p.Cum) {
			row[2], row[3] = "`"+p.Cum[i].Name+"`", fmt.Sprintf("%.1f %%", p.Cum[i].Pct)
		}
		rows = append(rows, row)
	}
	mdTable(ew, []string{"own CPU (flat)", "share", "with callees (cum)", "share"}, rows)
}

// writeOps lists every operation of every run with its error codes.
func (s Suite) writeOps(ew *errWriter) {
	if len(s.Runs) == 0 {
		return
	}
	ew.printf("## Operations\n\n")
	var rows [][]string
	for _, r := range s.Runs {
		for o := op(0); o < opCount; o++ {
			st := r.op(o)
			if st.Count == 0 {
				continue
			}
			l := st.LatencyMS
			rows = append(rows, []string{r.Name(), o.String(), fmt.Sprint(st.Count), fmt.Sprint(st.OK), fmt.Sprint(st.Repeats),
				f2(l.P50), f2(l.P99), f2(l.P999), f2(l.Max), codeList(st.Errors)})
		}
	}
	mdTable(ew, []string{"run", "op", "count", "ok", "repeats", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors by code"}, rows)
}

// writeProblems writes the verdict: PASS or FAIL with its problems, and in
// either case what was shed by design and which strategies have no
// confirmed rate (counted and reported, never a failure).
func (s Suite) writeProblems(ew *errWriter) {
	defer s.writeNotes(ew)
	ps := s.Problems()
	if len(ps) == 0 && len(s.Runs) == 0 && s.Sustain == nil {
		ew.printf("**PASS**: every measurement succeeded.\n")
		return
	}
	if len(ps) == 0 {
		ew.printf("**PASS**: every run balanced its money.\n")
		return
	}
	ew.printf("## Problems\n\n**FAIL**\n\n")
	for _, p := range ps {
		ew.printf("- %s\n", p)
	}
}

// writeNotes lists the shedding the runs counted and the strategies without
// a confirmed rate.
func (s Suite) writeNotes(ew *errWriter) {
	if shed := s.Shed(); len(shed) > 0 {
		ew.printf("\nShed by design (counted, not failures):\n\n")
		for _, l := range shed {
			ew.printf("- %s\n", l)
		}
	}
	if un := s.Unrated(); len(un) > 0 {
		ew.printf("\n%s: %s.\n", strings.ToUpper(noRateText[:1])+noRateText[1:], strings.Join(un, ", "))
	}
}

// mdTable writes a Markdown table; cells have their '|' escaped.
func mdTable(ew *errWriter, headers []string, rows [][]string) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	ew.printf("|")
	for _, h := range headers {
		ew.printf(" %s |", esc(h))
	}
	ew.printf("\n|")
	for range headers {
		ew.printf("---|")
	}
	ew.printf("\n")
	for _, row := range rows {
		ew.printf("|")
		for _, c := range row {
			ew.printf(" %s |", esc(c))
		}
		ew.printf("\n")
	}
	ew.printf("\n")
}

// codes lists a run's open error codes, the ones a reader looks at first.
func codes(r Report) string {
	var all []string
	for o := op(0); o < opCount; o++ {
		for _, c := range sortedCodes(r.op(o).Errors) {
			all = append(all, fmt.Sprintf("%s %s=%d", o, c, r.op(o).Errors[c]))
		}
	}
	if len(all) == 0 {
		return "none"
	}
	return strings.Join(all, ", ")
}

func codeList(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, c := range sortedCodes(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", c, m[c]))
	}
	return strings.Join(parts, ", ")
}

// money says whether the run's books balanced.
func money(r Report) string {
	switch {
	case r.Audit != nil && r.Audit.Difference != 0:
		return fmt.Sprintf("DIFFERS by %d cents", r.Audit.Difference)
	case r.Audit != nil && len(r.Audit.Problems) > 0:
		return fmt.Sprintf("%d audit problems", len(r.Audit.Problems))
	case r.AuditError != "":
		return "audit failed"
	case r.BalanceMismatches > r.CreditsPending():
		return fmt.Sprintf("%d balances off", r.BalanceMismatches-r.CreditsPending())
	case r.CreditsPending() > 0:
		return fmt.Sprintf("balanced (audit); %d credits still in flight", r.CreditsPending())
	case r.Audit != nil:
		return "balanced (audit)"
	case r.BalancesChecked:
		return "balances match (no audit)"
	}
	return "not checked"
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func f1(x float64) string  { return fmt.Sprintf("%.1f", x) }
func f2(x float64) string  { return fmt.Sprintf("%.2f", x) }
func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// writeWork is the table of what each run cost per fresh operation (runs
// with Report.Work).
func (s Suite) writeWork(ew *errWriter) {
	var rows [][]string
	for _, r := range s.Runs {
		w := r.Work
		if w == nil {
			continue
		}
		idle := "n/a"
		if w.IdleStatementsPerSec != nil {
			idle = f1(*w.IdleStatementsPerSec)
		}
		rows = append(rows, []string{r.Name(), fmt.Sprint(w.Ops), w.statementsText(), w.tripsText(), w.memcachedText(),
			w.cpuText("mariadb"), w.cpuText("cells"), w.cpuText("router"), w.cpuText("memcached"), w.cpuText("bench"), w.cpuText("total"), idle})
	}
	if len(rows) == 0 {
		return
	}
	ew.printf("## Work per operation\n\nPer fresh operation of each run (opens that were not repeats), from the load's start until the servers were quiet again, " +
		"the cluster's idle rate taken off: SQL statements (the database servers' Queries), the cells' round trips to their databases, " +
		"memcached commands, and CPU µs by process. The runs' text reports break the statements down by kind.\n\n")
	mdTable(ew, []string{"run", "ops", "statements", "DB round trips", "memcached", "MariaDB µs", "cells µs", "router µs",
		"memcached µs", "bench µs", "total µs", "idle statements/s"}, rows)
}

// writeBare is the bare open's run and every run's work over it: how many
// times the floor each open cost, in statements and in MariaDB CPU.
func (s Suite) writeBare(ew *errWriter) {
	b := s.Bare
	if b == nil {
		return
	}
	ew.printf("## The floor: the bare open\n\nThe open as the database alone does it (bench/bare.go): %d workers, each %d packets a transaction "+
		"(START TRANSACTION, one locking SELECT, one multi-row claim INSERT, one multi-row packet upsert, COMMIT), "+
		"on the first cell's database server, after the runs: %d opens in %.1f s, %.0f opens/s.\n\n",
		b.Workers, b.PacketsPerTx, b.Opens, float64(b.DurationMS)/1000, b.OpensPerSec)
	rows := [][]string{{"bare", fmt.Sprint(b.Opens), b.Work.statementsText(), b.Work.cpuText("mariadb"), b.Work.cpuText("total"), "1.00", "1.00"}}
	for _, r := range s.Runs {
		if r.Work == nil {
			continue
		}
		rows = append(rows, []string{r.Name(), fmt.Sprint(r.Work.Ops), r.Work.statementsText(), r.Work.cpuText("mariadb"), r.Work.cpuText("total"),
			overFloor(r.Work.Statements, b.Work.statementsPtr()), overFloor(r.Work.cpuPtr("mariadb"), b.Work.cpuPtr("mariadb"))})
	}
	mdTable(ew, []string{"run", "ops", "statements/op", "MariaDB µs/op", "total µs/op", "statements ÷ bare", "MariaDB µs ÷ bare"}, rows)
}

// overFloor is x / floor for a table, "n/a" when either is unknown or the
// floor is 0.
func overFloor(x, floor *float64) string {
	if x == nil || floor == nil || *floor <= 0 {
		return "n/a"
	}
	return f2(*x / *floor)
}

// writeWorkVsBaseline is the work table of a comparison with the baseline
// cluster: per run, statements and CPU µs per op (op names it) on both
// clusters and their ratios. Nothing when no row has work measured.
func writeWorkVsBaseline[T any](ew *errWriter, op string, rows []T, of func(T) (string, *WorkVsBaseline)) {
	var cells [][]string
	for _, r := range rows {
		name, w := of(r)
		if w == nil {
			continue
		}
		cells = append(cells, append([]string{name}, w.cells()...))
	}
	if len(cells) == 0 {
		return
	}
	ew.printf("Work per %s on both clusters (each cluster's idle rate taken off; ratio = this cluster's / the baseline's, below 1 this build costs less):\n\n", op)
	mdTable(ew, append([]string{"run"}, workVsBaselineHeader...), cells)
}
