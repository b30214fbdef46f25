package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// externalMeter is a cluster whose servers run perOp statements for each
// byte the command appended to file.
func externalMeter(file string, perOp float64) *WorkSources {
	return &WorkSources{IdleWindow: 50 * time.Millisecond, Counters: func(context.Context) (map[string]float64, []string) {
		fi, err := os.Stat(file)
		n := 0.0
		if err == nil {
			n = float64(fi.Size())
		}
		return map[string]float64{"statements": perOp * n, "com_insert": n, "cpu_mariadb": 100e-6 * perOp * n}, nil
	}}
}

// TestRunExternal: the command runs on each cluster with its router and key
// in the environment, interleaved over two rounds; each run's work is over
// the fresh operations the command printed, and the pairs compare the
// clusters; a failing command and one that prints no count are problems.
func TestRunExternal(t *testing.T) {
	dir := t.TempDir()
	cmd := `printf xxxxx >> "` + dir + `/$REDCELL_CLUSTER"; echo "$REDCELL_CLUSTER $REDCELL_ROUND $REDCELL_ROUTER_URL $REDCELL_API_KEY" >> "` + dir + `/log"; echo REDCELL_FRESH 5`
	cfg := ExternalConfig{Command: cmd, Op: "open", Rounds: 2, Targets: []ExternalTarget{
		{RouterURL: "http://main:1", APIKey: "km", Work: externalMeter(filepath.Join(dir, "main"), 7)},
		{Name: "old", RouterURL: "http://old:2", APIKey: "ko", Work: externalMeter(filepath.Join(dir, "old"), 14)},
	}}
	rep, err := RunExternal(context.Background(), cfg)
	if err != nil || !rep.OK() {
		t.Fatalf("report %+v, %v, problems %v", rep, err, rep.Problems())
	}
	log, _ := os.ReadFile(filepath.Join(dir, "log"))
	want := "main 1 http://main:1 km\nold 1 http://old:2 ko\nold 2 http://old:2 ko\nmain 2 http://main:1 km\n"
	if string(log) != want {
		t.Fatalf("runs:\n%s\nwant:\n%s", log, want)
	}
	for _, r := range rep.Runs {
		wantSt := 7.0
		if r.Cluster == "old" {
			wantSt = 14
		}
		if r.Fresh != 5 || r.Work == nil || r.Work.Statements == nil || math.Abs(*r.Work.Statements-wantSt) > 0.01 || r.PerSec <= 0 {
			t.Errorf("run %+v (work %+v): want 5 fresh at %v statements each", r, r.Work, wantSt)
		}
	}
	if len(rep.VsBaseline) != 2 || rep.VsBaseline[1].Run != "round 2" || math.Abs(*rep.VsBaseline[1].Work.StatementsRatio-0.5) > 0.01 {
		t.Fatalf("pairs %+v", rep.VsBaseline)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "round 1 against the baseline: opens/s") ||
		!strings.Contains(b.String(), "statements 7.00 / 14.00 = 0.50") || !strings.HasSuffix(b.String(), "  OK\n") {
		t.Fatalf("text:\n%s", b.String())
	}

	cfg.Targets, cfg.Rounds = cfg.Targets[:1], 1
	for _, c := range []struct{ cmd, want string }{{"echo REDCELL_FRESH 3; exit 2", "the command failed"}, {"echo done", "no REDCELL_FRESH line"}} {
		cfg.Command = c.cmd
		rep, err := RunExternal(context.Background(), cfg)
		if err != nil || rep.OK() || !strings.Contains(strings.Join(rep.Problems(), ";"), c.want) {
			t.Errorf("%q: problems %v (%v), want %q", c.cmd, rep.Problems(), err, c.want)
		}
	}
	if err := (ExternalConfig{Command: "true", Op: "open", Rounds: 1}).Validate(); err == nil {
		t.Error("no cluster: accepted")
	}
	// A command past its timeout is stopped with what it started (here a
	// sleep in a subshell, which holds the output pipe), at once.
	cfg.Command, cfg.Timeout = `(sleep 60; echo REDCELL_FRESH 1); echo REDCELL_FRESH 2`, 300*time.Millisecond
	start := time.Now()
	rep, err = RunExternal(context.Background(), cfg)
	if took := time.Since(start); err != nil || took > 20*time.Second || rep.OK() || rep.Runs[0].ElapsedMS > 20000 {
		t.Errorf("a command past its timeout: %v after %v, problems %v", err, took, rep.Problems())
	}
	two := cfg
	two.Targets = []ExternalTarget{cfg.Targets[0], {Name: "main", RouterURL: "http://x", Work: cfg.Targets[0].Work}}
	if err := two.Validate(); err == nil {
		t.Error("a baseline named main: accepted")
	}
}
