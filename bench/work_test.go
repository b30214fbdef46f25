package bench

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A window's figures are the counters' growth, less the meter's own reads
// and the idle rate over the window, per fresh op: here a cluster that runs
// 50 statements a second idle and whose load added 10 statements per op
// (4 inserts), 2 memcached commands and 300 µs of MariaDB CPU.
func TestWorkPerOp(t *testing.T) {
	start := time.Now()
	var load, reads atomic.Int64 // the load's ops so far; the meter's reads
	w := &WorkSources{IdleWindow: 100 * time.Millisecond, Counters: func(context.Context) (map[string]float64, []string) {
		secs := time.Since(start).Seconds()
		own := float64(reads.Add(1))
		ops := float64(load.Load())
		return map[string]float64{
			"statements":         50*secs + 10*ops + own,
			"own_statements":     own,
			"com_show_status":    own,
			"com_insert":         4 * ops,
			"memcached_commands": 2 * ops,
			"cpu_mariadb":        0.001*secs + 300e-6*ops,
		}, nil
	}}
	ctx := context.Background()
	before := w.begin(ctx)
	load.Store(200)
	work := w.end(ctx, before, 200, "open")
	if len(work.Missing) > 0 || !work.Quiet {
		t.Fatalf("missing %v, quiet %v", work.Missing, work.Quiet)
	}
	near := func(name string, got *float64, want, tol float64) {
		t.Helper()
		if got == nil || math.Abs(*got-want) > tol {
			t.Errorf("%s = %v, want %.3f ± %.3f", name, got, want, tol)
		}
	}
	near("statements per op", work.Statements, 10, 0.1)
	if work.StatementsGross == nil || *work.StatementsGross <= *work.Statements {
		t.Errorf("gross statements %v, want above the net %v (the idle rate ran over the window)", work.StatementsGross, *work.Statements)
	}
	near("idle statements/s", work.IdleStatementsPerSec, 50, 5)
	near("memcached commands per op", work.MemcachedCommands, 2, 1e-9)
	ins, mdb := work.ByKind["insert"], work.CPUMicros["mariadb"]
	near("inserts per op", &ins, 4, 1e-9)
	near("MariaDB µs per op", &mdb, 300, 1)
	if v, ok := work.ByKind["show_status"]; ok {
		t.Errorf("the meter's own reads counted: show_status %.3f per op", v)
	}
	if work.DBRoundTrips != nil {
		t.Errorf("round trips %v with no cell to read them from", *work.DBRoundTrips)
	}
	if work.WindowMS < 0 || work.Ops != 200 {
		t.Errorf("window %d ms, %d ops", work.WindowMS, work.Ops)
	}
	// Zero fresh ops: nothing to divide by, said so.
	if z := w.end(ctx, w.begin(ctx), 0, "open"); z.Statements != nil || len(z.Missing) == 0 {
		t.Errorf("zero ops: statements %v, missing %v", z.Statements, z.Missing)
	}
}

// TestWorkVsBaseline: the ratios are this cluster's figures over the
// baseline's, a side that could not be read leaves its ratio out, and the
// summary's baseline section carries the work table.
func TestWorkVsBaseline(t *testing.T) {
	main := &Work{Statements: ptr(4.5), CPUMicros: map[string]float64{"total": 600, "mariadb": 250}}
	old := &Work{Statements: ptr(9.0), CPUMicros: map[string]float64{"total": 1200, "mariadb": 1000}}
	v := workVsBaseline(main, old)
	if v.StatementsRatio == nil || *v.StatementsRatio != 0.5 || *v.CPURatio != 0.5 || *v.MariaDBRatio != 0.25 {
		t.Fatalf("ratios %+v", v)
	}
	if got := workVsBaseline(main, nil); got.StatementsRatio != nil || got.CPURatio != nil || *got.Statements != 4.5 {
		t.Errorf("baseline unread: %+v, want no ratios and this side's figures", got)
	}
	if workVsBaseline(nil, nil) != nil {
		t.Error("neither side measured: want nil")
	}
	s := Suite{Workload: WorkloadCold, VsBaseline: []BaselineRow{{Strategy: "grouped", OpensPerSec: 900, BaselineOpensPerSec: 450, Ratio: 2, Work: v}}}
	var sum strings.Builder
	if err := s.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	want := "| grouped | 4.50 | 9.00 | 0.50 | 600 | 1200 | 0.50 | 250 | 1000 | 0.25 |"
	if !strings.Contains(sum.String(), "Work per open on both clusters") || !strings.Contains(sum.String(), want) {
		t.Errorf("summary lacks the work row %q:\n%s", want, sum.String())
	}
}
