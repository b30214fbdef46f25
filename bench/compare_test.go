package bench

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeStrategies records the strategy switches a suite makes.
type fakeStrategies struct {
	mu      sync.Mutex // guards current, calls
	current string
	calls   []string // "get", or the strategy set
	failOn  string   // SetStrategy fails for this one
}

func (s *fakeStrategies) get(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "get")
	return s.current, nil
}

func (s *fakeStrategies) set(_ context.Context, st string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, st)
	if st == s.failOn {
		return errors.New("admin port refused")
	}
	s.current = st
	return nil
}

func TestSuiteComparesStrategiesAndRestores(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	run := loadConfig(f.serve(t), f, WorkloadHot)
	run.Duration = 300 * time.Millisecond
	st := &fakeStrategies{current: "batched"}
	s, err := RunSuite(context.Background(), SuiteConfig{Run: run, Strategies: []string{"naive", "serial", "batched"},
		SetStrategy: st.set, GetStrategy: st.get})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(st.calls, ","); got != "get,naive,serial,batched,batched" {
		t.Errorf("strategy calls %s, want get first, each strategy, then the restore", got)
	}
	if len(s.Runs) != 3 || len(s.Comparison) != 3 || s.StrategyBefore != "batched" {
		t.Fatalf("%d runs, %d comparison rows, before %q", len(s.Runs), len(s.Comparison), s.StrategyBefore)
	}
	ids := map[string]bool{}
	for i, want := range []string{"naive", "serial", "batched"} {
		r, c := s.Runs[i], s.Comparison[i]
		if r.Strategy != want || r.Label != want || c.Strategy != want || c.OpensPerSec != r.OpensPerSec || c.P99MS != r.Open.LatencyMS.P99 {
			t.Errorf("run %d: strategy %q label %q, row %+v", i, r.Strategy, r.Label, c)
		}
		if want := r.OpensPerSec / s.Runs[0].OpensPerSec; math.Abs(c.Ratio-want) > 1e-9 {
			t.Errorf("%s ratio %v, want %v", c.Strategy, c.Ratio, want)
		}
		ids[r.RunID] = true
	}
	if s.Comparison[0].Ratio != 1 || len(ids) != 3 {
		t.Errorf("first ratio %v; run IDs %v must differ", s.Comparison[0].Ratio, ids)
	}
	if !s.OK() {
		t.Errorf("suite not OK: %v", s.Problems())
	}
}

// A failed switch skips that strategy, fails the suite, and still restores.
func TestSuiteSwitchFailure(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	run := loadConfig(f.serve(t), f, WorkloadHot)
	run.Duration = 200 * time.Millisecond
	st := &fakeStrategies{current: "serial", failOn: "naive"}
	s, err := RunSuite(context.Background(), SuiteConfig{Run: run, Strategies: []string{"naive", "batched"},
		SetStrategy: st.set, GetStrategy: st.get})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Runs) != 1 || s.Runs[0].Strategy != "batched" || s.OK() || st.current != "serial" {
		t.Fatalf("runs %d, problems %v, strategy left %q", len(s.Runs), s.Problems(), st.current)
	}
}

// Canceling the suite still puts the strategy back.
func TestSuiteRestoresAfterCancel(t *testing.T) {
	f := newFakeRouter()
	run := loadConfig(f.serve(t), f, WorkloadHot)
	run.Duration = time.Minute
	st := &fakeStrategies{current: "batched"}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s, err := RunSuite(ctx, SuiteConfig{Run: run, Strategies: []string{"naive", "serial"}, SetStrategy: st.set, GetStrategy: st.get})
	if !errors.Is(err, context.DeadlineExceeded) || len(s.Runs) != 1 || st.current != "batched" {
		t.Fatalf("err %v, %d runs, strategy left %q", err, len(s.Runs), st.current)
	}
}

func TestSuiteRouterVsDirect(t *testing.T) {
	shortSettle(t)
	f, url, _, routed := twoCells(t)
	run := loadConfig(url, f, WorkloadHot)
	run.Duration = 300 * time.Millisecond
	s, err := RunSuite(context.Background(), SuiteConfig{Run: run, CompareDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Runs) != 2 || s.Runs[0].Direct || !s.Runs[1].Direct || s.Runs[0].Label != "router" || s.Runs[1].Label != "direct" {
		t.Fatalf("runs: %+v", s.Runs)
	}
	if len(s.RouterVsDirect) != 1 {
		t.Fatalf("router vs direct rows: %+v", s.RouterVsDirect)
	}
	d := s.RouterVsDirect[0]
	if d.RouterOpensPerSec != s.Runs[0].OpensPerSec || d.DirectOpensPerSec != s.Runs[1].OpensPerSec ||
		math.Abs(d.Ratio-d.RouterOpensPerSec/d.DirectOpensPerSec) > 1e-9 {
		t.Errorf("row %+v", d)
	}
	if routed.Load() == 0 {
		t.Error("the router run sent nothing through the router")
	}
	if !s.OK() {
		t.Errorf("suite not OK: %v", s.Problems())
	}
}

func TestSuiteValidate(t *testing.T) {
	run := DefaultConfig()
	st := &fakeStrategies{}
	lim := DefaultLimitsConfig(run.RouterURL)
	tests := []struct {
		name string
		sc   SuiteConfig
		want string
	}{
		{"plain", SuiteConfig{Run: run}, ""},
		{"compare without funcs", SuiteConfig{Run: run, Strategies: []string{"naive"}}, "SetStrategy"},
		{"duplicate strategy", SuiteConfig{Run: run, Strategies: []string{"naive", "naive"}, SetStrategy: st.set, GetStrategy: st.get}, "distinct"},
		{"too many", SuiteConfig{Run: run, Strategies: strings.Split("a,b,c,d,e,f,g,h,i", ","), SetStrategy: st.set, GetStrategy: st.get}, "at most"},
		{"no load no limits", SuiteConfig{Run: run, SkipLoad: true}, "limits"},
		{"limits only", SuiteConfig{SkipLoad: true, Limits: &lim}, ""},
		{"bad run", SuiteConfig{Run: Config{}}, "RouterURL"},
	}
	for _, tt := range tests {
		err := tt.sc.Validate()
		if (tt.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestSuiteRunID(t *testing.T) {
	if got := suiteRunID("", 3); got != "" {
		t.Errorf("empty base: %q", got)
	}
	long := strings.Repeat("a", runIDLenMax)
	for n := range 10 {
		if got := suiteRunID(long, n); len(got) > runIDLenMax || validateRunID(got) != nil || !strings.HasSuffix(got, "-"+string(rune('0'+n))) {
			t.Errorf("suiteRunID(long, %d) = %q", n, got)
		}
	}
}

// A baseline cluster runs every strategy too, interleaved (A B, then B A),
// each cluster is switched and restored on its own, and the rows pair the
// clusters' runs of one strategy.
func TestSuiteAgainstBaseline(t *testing.T) {
	shortSettle(t)
	main, old := newFakeRouter(), newFakeRouter()
	run := loadConfig(main.serve(t), main, WorkloadHot)
	run.Duration = 200 * time.Millisecond
	oldURL := old.serve(t)
	mainSt, oldSt := &fakeStrategies{current: "batched"}, &fakeStrategies{current: "serial"}
	s, err := RunSuite(context.Background(), SuiteConfig{Run: run, Strategies: []string{"naive", "batched"},
		SetStrategy: mainSt.set, GetStrategy: mainSt.get,
		Baseline: &Cluster{Name: "old", RouterURL: oldURL, ClusterSecret: run.ClusterSecret, APIKey: run.APIKey,
			SetStrategy: oldSt.set, GetStrategy: oldSt.get}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(mainSt.calls, ","); got != "get,naive,batched,batched" {
		t.Errorf("main strategy calls %s", got)
	}
	if got := strings.Join(oldSt.calls, ","); got != "get,naive,batched,serial" {
		t.Errorf("baseline strategy calls %s, want its own restore to serial", got)
	}
	var order []string
	for _, r := range s.Runs {
		order = append(order, r.Label)
	}
	if got := strings.Join(order, ","); got != "naive,old/naive,old/batched,batched" {
		t.Fatalf("runs %s, want the clusters interleaved A B, B A", got)
	}
	if s.Runs[1].Cluster != "old" || s.Runs[0].Cluster != "" || s.Runs[1].RouterURL != oldURL {
		t.Errorf("run clusters %q %q, baseline run's router %s", s.Runs[0].Cluster, s.Runs[1].Cluster, s.Runs[1].RouterURL)
	}
	if len(s.Comparison) != 2 || len(s.BaselineComparison) != 2 || len(s.VsBaseline) != 2 {
		t.Fatalf("rows: %d main, %d baseline, %d paired", len(s.Comparison), len(s.BaselineComparison), len(s.VsBaseline))
	}
	for _, b := range s.VsBaseline {
		var mainRate, oldRate float64
		for _, r := range s.Runs {
			if r.Strategy == b.Strategy && r.Cluster == "" {
				mainRate = r.OpensPerSec
			}
			if r.Strategy == b.Strategy && r.Cluster == "old" {
				oldRate = r.OpensPerSec
			}
		}
		if b.OpensPerSec != mainRate || b.BaselineOpensPerSec != oldRate || math.Abs(b.Ratio-mainRate/oldRate) > 1e-9 || oldRate == 0 {
			t.Errorf("row %+v, want main %v baseline %v", b, mainRate, oldRate)
		}
	}
	if !s.OK() {
		t.Errorf("suite not OK: %v", s.Problems())
	}
	var sum strings.Builder
	if err := s.WriteSummary(&sum); err != nil || !strings.Contains(sum.String(), "Against the baseline cluster") {
		t.Errorf("summary lacks the baseline table (err %v):\n%s", err, sum.String())
	}
}
