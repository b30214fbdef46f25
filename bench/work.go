package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The work a run costs, per fresh operation: SQL statements by the database
// servers' own counters, database round trips by the cells' count, memcached
// commands, and CPU by process. Counts are exact on a noisy machine where
// times are not, so they say first what a change saved.
//
// A run's window starts when its load does (after its setup: deposits, the
// packets sent before the load) and ends when the servers are quiet again:
// the cells' queues and relay lanes empty and the statement rate back within
// workQuietFactor of the idle rate, so the credits of the run's claims count
// but its audit does not. The idle rate, measured once per cluster before
// its first run (WorkSources.IdleWindow), is taken off every figure over the
// window: what is left is what the operations cost, background excluded.

// Counter names, as WorkSources.Counters and the process scrapes give them.
// Statement kinds are counterKind+"insert", "update", ... (each server's
// Com_insert, Com_update, ... summed over the servers).
const (
	counterStatements = "statements"     // each server's Queries, summed
	counterOwn        = "own_statements" // statements the meter itself sent to read the servers
	counterKind       = "com_"           // prefix of the statement kinds
	counterTrips      = "db_round_trips" // the cells' redcell_cell_db_round_trips_total
	counterMemcached  = "memcached_commands"
	counterCPU        = "cpu_" // prefix: CPU seconds by process kind (mariadb, cells, router, memcached, bench)
)

// workQuietFactor: a window ends once the statement rate is within this
// factor of the idle rate; workQuietMax bounds the wait for it.
const (
	workQuietFactor = 1.5
	workQuietMax    = 30 * time.Second
	workQuietPoll   = 500 * time.Millisecond
)

// WorkSources says where a cluster's work is read.
type WorkSources struct {
	// Counters reads the servers' counters (names above: statements,
	// own_statements, com_*, memcached_commands, cpu_mariadb, cpu_memcached),
	// and what it could not read. Required.
	Counters func(ctx context.Context) (map[string]float64, []string)
	// Processes are the router's and the cells' GET /metrics: their
	// process_cpu_seconds_total (cpu_router for a target named "router",
	// else cpu_cells) and the cells' round trips to their databases.
	Processes []MetricsTarget
	// Cells are the cells' metrics, whose idle gauges end a window.
	Cells []MetricsTarget
	// IdleWindow is how long the idle rate is measured before the first run;
	// 0: not measured, nothing subtracted.
	IdleWindow time.Duration

	once sync.Once
	idle map[string]float64 // per second
	// idleMissing is why the idle rate is unknown, if it is.
	idleMissing []string
}

// Work is what a run cost per fresh operation (Ops), the cluster's idle
// rate over the window taken off. A figure that could not be read is left
// out and Missing says why.
type Work struct {
	Ops      int64  `json:"ops"`       // fresh operations (opens that were not repeats) in the window
	OpKind   string `json:"op_kind"`   // what Ops counts, e.g. "open"
	WindowMS int64  `json:"window_ms"` // from the load's start until the servers were quiet
	// QuietMS is how long the window ran on after the load ended, for the
	// servers to be quiet again; Quiet is false when workQuietMax ran out.
	QuietMS int64 `json:"quiet_ms"`
	Quiet   bool  `json:"quiet"`
	// IdleStatementsPerSec is the cluster's statement rate with no load, as
	// measured before its first run; IdleWindowMS how long.
	IdleStatementsPerSec *float64 `json:"idle_statements_per_sec,omitempty"`
	IdleWindowMS         int64    `json:"idle_window_ms"`
	// Per operation.
	Statements        *float64           `json:"statements,omitempty"`         // all database servers
	StatementsGross   *float64           `json:"statements_gross,omitempty"`   // the same before the idle rate is taken off
	ByKind            map[string]float64 `json:"statements_by_kind,omitempty"` // insert, update, select, begin, commit, ... (≥ 0.005 shown)
	DBRoundTrips      *float64           `json:"db_round_trips,omitempty"`     // the cells' connections to their servers
	MemcachedCommands *float64           `json:"memcached_commands,omitempty"` // get, set, cas, add, incr, delete, touch
	// CPUMicros is CPU µs per operation by process kind: mariadb (every
	// server), cells, router, memcached, bench (the client: this process, and
	// the --external command and what it ran),
	// and total.
	CPUMicros map[string]float64 `json:"cpu_us,omitempty"`
	Missing   []string           `json:"missing,omitempty"`
}

// workSnap is one reading of every counter.
type workSnap struct {
	at      time.Time
	c       map[string]float64
	missing []string
}

// snap reads every counter at once: the servers' (Counters), the
// processes' metrics, and this process's CPU.
func (w *WorkSources) snap(ctx context.Context) workSnap {
	s := workSnap{at: time.Now(), c: map[string]float64{}}
	var wg sync.WaitGroup
	var scrapes []cellScrape
	wg.Go(func() { scrapes = scrapeCells(ctx, metricsClient, w.Processes) })
	c, missing := w.Counters(ctx)
	wg.Wait()
	maps.Copy(s.c, c)
	s.missing = append(s.missing, missing...)
	for _, sc := range scrapes {
		if sc.err != nil {
			s.missing = append(s.missing, fmt.Sprintf("%s: %v", sc.cell, sc.err))
			continue
		}
		kind := counterCPU + "cells"
		if sc.cell == "router" {
			kind = counterCPU + "router"
		}
		s.c[kind] += sc.gauges["process_cpu_seconds_total"]
		s.c[counterTrips] += sc.gauges["redcell_cell_db_round_trips_total"]
	}
	s.c[counterCPU+"bench"] = selfCPUSeconds()
	return s
}

// selfCPUSeconds is this process's CPU time, user and system, and its
// children's that have ended (an --external load command and what it ran):
// the client's CPU, whichever client it was.
func selfCPUSeconds() float64 {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total.Seconds()
}

// net is after - before with the meter's own statements taken off.
func netCounters(before, after workSnap) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after.c {
		if b, ok := before.c[k]; ok {
			d[k] = v - b
		}
	}
	own := d[counterOwn]
	delete(d, counterOwn)
	if _, ok := d[counterStatements]; ok {
		d[counterStatements] -= own
		d[counterKind+"show_status"] -= own
	}
	return d
}

// measureIdle measures the idle rate once (IdleWindow), before the first run.
func (w *WorkSources) measureIdle(ctx context.Context) {
	w.once.Do(func() {
		if w.IdleWindow <= 0 {
			return
		}
		before := w.snap(ctx)
		if !sleepCtx(ctx, w.IdleWindow) {
			return
		}
		after := w.snap(ctx)
		w.idleMissing = append(before.missing, after.missing...)
		secs := after.at.Sub(before.at).Seconds()
		w.idle = map[string]float64{}
		for k, v := range netCounters(before, after) {
			w.idle[k] = max(0, v) / secs
		}
		delete(w.idle, counterCPU+"bench") // the idle bench is this process waiting: not the cluster's
	})
}

// begin measures the idle rate if it is not known yet, then takes the
// window's first reading.
func (w *WorkSources) begin(ctx context.Context) workSnap {
	w.measureIdle(ctx)
	return w.snap(ctx)
}

// end waits for the servers to be quiet (see the top of this file), takes
// the window's last reading and returns the work per op.
func (w *WorkSources) end(ctx context.Context, before workSnap, ops int64, opKind string) *Work {
	loadEnd := time.Now()
	wait, cancel := context.WithTimeout(ctx, workQuietMax)
	defer cancel()
	quiet := false
	prev := w.snap(ctx)
	for !quiet && sleepCtx(wait, workQuietPoll) {
		cur := w.snap(ctx)
		quiet = w.quiet(prev, cur) && idle(scrapeCells(wait, metricsClient, w.Cells))
		prev = cur
	}
	after := prev
	work := &Work{Ops: ops, OpKind: opKind, WindowMS: after.at.Sub(before.at).Milliseconds(),
		QuietMS: after.at.Sub(loadEnd).Milliseconds(), Quiet: quiet, IdleWindowMS: w.IdleWindow.Milliseconds()}
	work.Missing = append(append(work.Missing, before.missing...), after.missing...)
	work.Missing = append(work.Missing, w.idleMissing...)
	if !quiet {
		work.Missing = append(work.Missing, fmt.Sprintf("the servers were not quiet %v after the load (the statement rate above %.1f× idle, or a cell's queue or relay lane not empty): the window ends there", workQuietMax, workQuietFactor))
	}
	if r, ok := w.idle[counterStatements]; ok {
		work.IdleStatementsPerSec = &r
	}
	if ops <= 0 {
		work.Missing = append(work.Missing, "no fresh operation in the window: nothing to divide by")
		return work
	}
	secs := after.at.Sub(before.at).Seconds()
	d := netCounters(before, after)
	var below []string // figures the idle rate took below zero
	per := func(k string) (float64, bool) {
		v, ok := d[k]
		if !ok {
			return 0, false
		}
		if net := v - w.idle[k]*secs; net < 0 {
			if !strings.HasPrefix(k, counterKind) { // a kind's few statements a second are noise
				below = append(below, k)
			}
			return 0, true
		}
		return (v - w.idle[k]*secs) / float64(ops), true
	}
	ptr := func(k string) *float64 {
		if v, ok := per(k); ok {
			return &v
		}
		return nil
	}
	work.Statements = ptr(counterStatements)
	if v, ok := d[counterStatements]; ok {
		g := max(0, v) / float64(ops)
		work.StatementsGross = &g
	}
	work.DBRoundTrips = ptr(counterTrips)
	work.MemcachedCommands = ptr(counterMemcached)
	for k := range d {
		switch {
		case strings.HasPrefix(k, counterKind):
			if v, _ := per(k); v >= 0.005 {
				if work.ByKind == nil {
					work.ByKind = map[string]float64{}
				}
				work.ByKind[strings.TrimPrefix(k, counterKind)] = v
			}
		case strings.HasPrefix(k, counterCPU):
			v, _ := per(k)
			if work.CPUMicros == nil {
				work.CPUMicros = map[string]float64{}
			}
			work.CPUMicros[strings.TrimPrefix(k, counterCPU)] = v * 1e6
			work.CPUMicros["total"] += v * 1e6
		}
	}
	if len(below) > 0 {
		slices.Sort(below)
		work.Missing = append(work.Missing, fmt.Sprintf("the idle rate, measured before the first run, is above this window's for %s (shown as 0): the cluster was busier then (warming up?); measure again on a settled cluster or with --idle-window 0",
			strings.Join(below, ", ")))
	}
	return work
}

// quiet: the statement rate between two readings is within workQuietFactor
// of the idle rate (with no idle rate measured: always).
func (w *WorkSources) quiet(a, b workSnap) bool {
	if w.idle == nil {
		return true // no idle rate to compare with: the cells' gauges decide
	}
	d := netCounters(a, b)
	v, ok := d[counterStatements]
	if !ok {
		return true // unknown: the cells' gauges decide
	}
	secs := b.at.Sub(a.at).Seconds()
	return secs > 0 && v/secs <= workQuietFactor*w.idle[counterStatements]+1
}

// Text is the work in one line, e.g. "9.21 statements (insert 3.00,
// update 2.00, ...), 5.10 round trips, 0.00 memcached commands, CPU µs
// mariadb 566 cells 460 ... total 1194".
func (w *Work) Text() string {
	if w == nil {
		return "n/a"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s statements", naF(w.Statements, "%.2f"))
	if w.StatementsGross != nil {
		fmt.Fprintf(&b, " (%.2f with the idle rate)", *w.StatementsGross)
	}
	if len(w.ByKind) > 0 {
		kinds := slices.SortedFunc(maps.Keys(w.ByKind), func(x, y string) int {
			if w.ByKind[x] != w.ByKind[y] {
				if w.ByKind[x] > w.ByKind[y] {
					return -1
				}
				return 1
			}
			return strings.Compare(x, y)
		})
		parts := make([]string, len(kinds))
		for i, k := range kinds {
			parts[i] = fmt.Sprintf("%s %.2f", k, w.ByKind[k])
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, ", %s round trips, %s memcached commands", naF(w.DBRoundTrips, "%.2f"), naF(w.MemcachedCommands, "%.2f"))
	if len(w.CPUMicros) > 0 {
		b.WriteString(", CPU µs")
		for _, k := range workCPUOrder {
			if v, ok := w.CPUMicros[k]; ok {
				fmt.Fprintf(&b, " %s %.0f", k, v)
			}
		}
	}
	return b.String()
}

// workCPUOrder is the order the processes are listed in.
var workCPUOrder = []string{"mariadb", "cells", "router", "memcached", "bench", "total"}

// cpuText is one process kind's CPU µs per op, "n/a" when unknown.
func (w *Work) cpuText(kind string) string {
	if w == nil {
		return "n/a"
	}
	if v, ok := w.CPUMicros[kind]; ok {
		return fmt.Sprintf("%.0f", v)
	}
	return "n/a"
}

// statementsPtr and cpuPtr are a figure or nil (unknown, or no Work).
func (w *Work) statementsPtr() *float64 {
	if w == nil {
		return nil
	}
	return w.Statements
}

func (w *Work) cpuPtr(kind string) *float64 {
	if w == nil {
		return nil
	}
	if v, ok := w.CPUMicros[kind]; ok {
		return &v
	}
	return nil
}

// statementsText and the others are one figure for a table, "n/a" when unknown.
func (w *Work) statementsText() string {
	if w == nil {
		return "n/a"
	}
	return naF(w.Statements, "%.2f")
}

func (w *Work) tripsText() string {
	if w == nil {
		return "n/a"
	}
	return naF(w.DBRoundTrips, "%.2f")
}

func (w *Work) memcachedText() string {
	if w == nil {
		return "n/a"
	}
	return naF(w.MemcachedCommands, "%.2f")
}

// writeLine writes the work as a report's line, indented, and what could
// not be read under it; nothing for nil.
func (w *Work) writeLine(ew *errWriter, indent string) {
	if w == nil {
		return
	}
	ew.printf("%swork per %s (%d, idle taken off): %s\n", indent, w.OpKind, w.Ops, w.Text())
	for _, m := range w.Missing {
		ew.printf("%s  n/a: %s\n", indent, m)
	}
}

// WorkVsBaseline is one run's work per operation beside the same run's on
// the baseline cluster (SuiteConfig.Baseline, RewardsConfig.Baseline,
// CouponsConfig.Baseline), each ratio this run's over the baseline's: below
// 1 this build costs less. A figure either side could not read is nil.
type WorkVsBaseline struct {
	Statements         *float64 `json:"statements,omitempty"`
	BaselineStatements *float64 `json:"baseline_statements,omitempty"`
	StatementsRatio    *float64 `json:"statements_ratio,omitempty"`
	// CPU µs per operation over every process (total) and MariaDB's alone.
	CPUMicros             *float64 `json:"cpu_us,omitempty"`
	BaselineCPUMicros     *float64 `json:"baseline_cpu_us,omitempty"`
	CPURatio              *float64 `json:"cpu_ratio,omitempty"`
	MariaDBMicros         *float64 `json:"mariadb_us,omitempty"`
	BaselineMariaDBMicros *float64 `json:"baseline_mariadb_us,omitempty"`
	MariaDBRatio          *float64 `json:"mariadb_ratio,omitempty"`
}

// workVsBaseline pairs w (this cluster's run) with b (the baseline's); nil
// when neither was measured.
func workVsBaseline(w, b *Work) *WorkVsBaseline {
	if w == nil && b == nil {
		return nil
	}
	over := func(x, y *float64) *float64 {
		if x == nil || y == nil || *y <= 0 {
			return nil
		}
		return ptr(*x / *y)
	}
	v := &WorkVsBaseline{Statements: w.statementsPtr(), BaselineStatements: b.statementsPtr(),
		CPUMicros: w.cpuPtr("total"), BaselineCPUMicros: b.cpuPtr("total"),
		MariaDBMicros: w.cpuPtr("mariadb"), BaselineMariaDBMicros: b.cpuPtr("mariadb")}
	v.StatementsRatio = over(v.Statements, v.BaselineStatements)
	v.CPURatio = over(v.CPUMicros, v.BaselineCPUMicros)
	v.MariaDBRatio = over(v.MariaDBMicros, v.BaselineMariaDBMicros)
	return v
}

// cells is the comparison as a table's cells: statements, baseline's,
// ratio, then the same for all-process CPU µs and MariaDB's.
func (v *WorkVsBaseline) cells() []string {
	if v == nil {
		v = &WorkVsBaseline{}
	}
	return []string{naF(v.Statements, "%.2f"), naF(v.BaselineStatements, "%.2f"), naF(v.StatementsRatio, "%.2f"),
		naF(v.CPUMicros, "%.0f"), naF(v.BaselineCPUMicros, "%.0f"), naF(v.CPURatio, "%.2f"),
		naF(v.MariaDBMicros, "%.0f"), naF(v.BaselineMariaDBMicros, "%.0f"), naF(v.MariaDBRatio, "%.2f")}
}

// workVsBaselineHeader heads cells' columns.
var workVsBaselineHeader = []string{"statements/op", "baseline", "ratio", "CPU µs/op (all)", "baseline", "ratio",
	"MariaDB µs/op", "baseline", "ratio"}

// OpsVsBaseline compares one run of the rewards or coupons workload with the
// same run on the baseline cluster: its rate of fresh operations, p99, and
// work per operation.
type OpsVsBaseline struct {
	Run               string          `json:"run"` // the booking mode, or the coupons run's name
	OpsPerSec         float64         `json:"ops_per_sec"`
	BaselineOpsPerSec float64         `json:"baseline_ops_per_sec"`
	Ratio             float64         `json:"ratio"` // this cluster's / the baseline's: above 1 this build is faster
	P99MS             float64         `json:"p99_ms"`
	BaselineP99MS     float64         `json:"baseline_p99_ms"`
	Work              *WorkVsBaseline `json:"work,omitempty"`
}

func newOpsVsBaseline(run string, rate, baseRate, p99, baseP99 float64, w, b *Work) OpsVsBaseline {
	return OpsVsBaseline{Run: run, OpsPerSec: rate, BaselineOpsPerSec: baseRate, Ratio: ratio(rate, baseRate),
		P99MS: p99, BaselineP99MS: baseP99, Work: workVsBaseline(w, b)}
}

// writeLine prints the comparison for a text report, e.g. "async against
// the baseline: issues/s 900 / 450 = 2.00, p99 12.0 / 30.0 ms; per reward
// statements 2.92 / 5.99 = 0.49, CPU µs (all) 800 / 1600 = 0.50, MariaDB µs
// 300 / 700 = 0.43".
func (v OpsVsBaseline) writeLine(ew *errWriter, indent, rate, op string) {
	ew.printf("%s%s against the baseline: %s %.0f / %.0f = %s", indent, v.Run, rate, v.OpsPerSec, v.BaselineOpsPerSec,
		naF(ratioPtr(v.OpsPerSec, v.BaselineOpsPerSec), "%.2f"))
	if v.P99MS > 0 || v.BaselineP99MS > 0 { // an external load's latency is its own
		ew.printf(", p99 %.1f / %.1f ms", v.P99MS, v.BaselineP99MS)
	}
	if w := v.Work; w != nil {
		c := w.cells()
		ew.printf("; per %s statements %s / %s = %s, CPU µs (all) %s / %s = %s, MariaDB µs %s / %s = %s", op,
			c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8])
	}
	ew.printf("\n")
}

// pairWithBaseline pairs each of runs on this cluster with the run of the
// same name on the baseline (of(r) gives a run's cluster, "" this one, and
// its name) and compares them (vs).
func pairWithBaseline[R any](runs []R, of func(R) (cluster, name string), vs func(mine, base R) OpsVsBaseline) []OpsVsBaseline {
	var out []OpsVsBaseline
	for _, r := range runs {
		c, name := of(r)
		if c != "" {
			continue
		}
		for _, b := range runs {
			if bc, bn := of(b); bc != "" && bn == name {
				out = append(out, vs(r, b))
			}
		}
	}
	return out
}

// appendOwnWork appends a run's work to the floor's list when the run is of
// this cluster (cluster ""): the bare open ran on this cluster's server.
func appendOwnWork(works []namedWork, cluster, name string, w *Work) []namedWork {
	if cluster != "" {
		return works
	}
	return append(works, namedWork{name, w})
}
