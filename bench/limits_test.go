package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"redcell/sharding"
)

func shortLimits(url string) LimitsConfig {
	lc := DefaultLimitsConfig(url)
	lc.Concurrency = 8
	lc.HTTPDuration, lc.DBDuration = 300*time.Millisecond, 10*time.Millisecond
	lc.RunID = "lim"
	lc.ClusterSecret = testSecret
	return lc
}

func TestMeasureLimits(t *testing.T) {
	f, url, cells, routed := twoCells(t)
	lc := shortLimits(url)
	var batches []int
	lc.DBLimit = func(_ context.Context, batch int, d time.Duration) (float64, error) {
		if d != lc.DBDuration {
			t.Errorf("DBLimit got %v, want %v", d, lc.DBDuration)
		}
		batches = append(batches, batch)
		return float64(100 * batch), nil
	}
	rep, err := MeasureLimits(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.DB) != 4 || fmt.Sprint(batches) != "[1 16 64 256]" {
		t.Errorf("db limits %+v, batches %v", rep.DB, batches)
	}
	if best, ok := rep.BestDB(); !ok || best.Batch != 256 || best.OpensPerSec != 25600 {
		t.Errorf("best %+v", best)
	}
	r, d := rep.NoopRouter, rep.NoopDirect
	if r == nil || d == nil || r.PerSec <= 0 || d.PerSec <= 0 || r.Cell != "cell-1" || d.Cell != "cell-1" {
		t.Fatalf("no-op results %+v %+v", r, d)
	}
	if len(r.Errors) != 0 || len(d.Errors) != 0 || rep.RouterOverDirect <= 0 || len(rep.Problems()) != 0 {
		t.Errorf("errors %v %v, ratio %v, problems %v", r.Errors, d.Errors, rep.RouterOverDirect, rep.Problems())
	}
	if routed.Load() != r.Count || cells[0].requests.Load() != d.Count || cells[1].requests.Load() != 0 {
		t.Errorf("router got %d (want %d), cell-1 %d (want %d), cell-2 %d (want 0)",
			routed.Load(), r.Count, cells[0].requests.Load(), d.Count, cells[1].requests.Load())
	}
	if f.noops.Load() != r.Count+d.Count || f.noStress.Load() != 0 {
		t.Errorf("fake answered %d no-ops for %d requests; %d without the stress header", f.noops.Load(), r.Count+d.Count, f.noStress.Load())
	}
}

func TestActsOwnedBy(t *testing.T) {
	acts, err := actsOwnedBy("r", CellInfo{Name: "c", Shards: "7"})
	if err != nil || len(acts) != noopActs {
		t.Fatalf("%d acts, %v", len(acts), err)
	}
	for _, a := range acts {
		if sharding.ShardOfAct(a) != 7 {
			t.Fatalf("%s is in shard %d, not 7", a, sharding.ShardOfAct(a))
		}
	}
}

// Without the cluster secret the direct no-op is not measured (every call
// would be refused) and the report says why; the router's still is.
func TestLimitsWithoutSecretSkipDirect(t *testing.T) {
	_, url, cells, _ := twoCells(t)
	lc := shortLimits(url)
	lc.ClusterSecret = ""
	rep, err := MeasureLimits(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	if rep.NoopRouter == nil || rep.NoopDirect != nil || rep.NoopDirectSkipped == "" || cells[0].requests.Load() != 0 {
		t.Fatalf("router %+v, direct %+v, skipped %q, %d direct requests", rep.NoopRouter, rep.NoopDirect, rep.NoopDirectSkipped, cells[0].requests.Load())
	}
	if len(rep.Problems()) != 0 {
		t.Errorf("problems %v", rep.Problems())
	}
}

// A database limit that fails is a problem of the suite, not a crash.
func TestLimitsDBErrorIsAProblem(t *testing.T) {
	_, url, _, _ := twoCells(t)
	lc := shortLimits(url)
	lc.DBBatches = []int{1}
	lc.DBLimit = func(context.Context, int, time.Duration) (float64, error) {
		return 0, errors.New("dbLimit: not built yet")
	}
	s, err := RunSuite(context.Background(), SuiteConfig{SkipLoad: true, Limits: &lc})
	if err != nil {
		t.Fatal(err)
	}
	if s.OK() || !strings.Contains(strings.Join(s.Problems(), "\n"), "db limit at batch 1: dbLimit: not built yet") {
		t.Fatalf("problems %v", s.Problems())
	}
	if s.Workload != "limits" || s.Limits.NoopRouter == nil {
		t.Fatalf("suite %+v", s)
	}
}

// Hot runs and limits in one invocation: the report states the hot-open rate
// as a fraction of each ceiling.
func TestSuiteCeilings(t *testing.T) {
	shortSettle(t)
	f, url, _, _ := twoCells(t)
	run := loadConfig(url, f, WorkloadHot)
	run.Duration = 300 * time.Millisecond
	lc := shortLimits(url)
	lc.DBBatches = []int{1, 64}
	lc.DBLimit = func(_ context.Context, b int, _ time.Duration) (float64, error) { return float64(1000 * b), nil }
	s, err := RunSuite(context.Background(), SuiteConfig{Run: run, Limits: &lc})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Ceilings) != 1 {
		t.Fatalf("ceilings %+v", s.Ceilings)
	}
	c, r := s.Ceilings[0], s.Runs[0]
	if c.DBBatch != 64 || c.DBOpensPerSec != 64000 || c.OfDB != r.OpensPerSec/64000 ||
		c.OfNoopRouter != r.OpensPerSec/s.Limits.NoopRouter.PerSec || c.OfNoopDirect != r.OpensPerSec/s.Limits.NoopDirect.PerSec {
		t.Errorf("ceiling %+v for %.1f opens/s", c, r.OpensPerSec)
	}
	if !s.OK() {
		t.Errorf("suite not OK: %v", s.Problems())
	}
}
