package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchSearchFlags: --search-only and --sustain-at build the suite's
// search and sustain run; the cells' metrics come from their admin ports in
// the config; contradictions are refused before anything runs.
func TestBenchSearchFlags(t *testing.T) {
	cfg := benchConfig(t, "cluster_secret: file-secret-0123456789\nrouter:\n  listen: \"127.0.0.1:8160\"\ncells:\n"+
		"  - name: cell-1\n    admin_listen: \"127.0.0.1:9206\"\n"+
		"  - name: cell-2\n    admin_listen: \"127.0.0.1:9207\"\n"+
		"  - name: cell-3\n")

	f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "festival", "--compare", "naive,batched",
		"--search-only", "--search-time", "2m", "--search-p99", "40ms", "--sustain-at", "batched", "--sustain-fraction", "0.6"})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := f.suiteConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Search == nil || !sc.SearchOnly || sc.Search.Budget != 2*time.Minute || sc.Search.P99Bound != 40*time.Millisecond ||
		sc.Search.Confirm != 12*time.Second {
		t.Errorf("search %+v, only %v", sc.Search, sc.SearchOnly)
	}
	// The confirmation follows a longer step unless it is given; 0 turns it off.
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"--search-step", "10s"}, 30 * time.Second},
		{[]string{"--search-step", "1m"}, 2 * time.Minute},
		{[]string{"--search-step", "10s", "--search-confirm", "15s"}, 15 * time.Second},
		{[]string{"--search-confirm", "0"}, 0},
	} {
		f, err := parseBenchFlags(append([]string{"--config", cfg, "--workload", "festival", "--search"}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		if sc, err := f.suiteConfig(); err != nil || sc.Search.Confirm != c.want {
			t.Errorf("%v: confirmation %v (%v), want %v", c.args, sc.Search.Confirm, err, c.want)
		}
	}
	if sc.Sustain == nil || sc.Sustain.Strategy != "batched" || sc.Sustain.Fraction != 0.6 || sc.Sustain.LagBound != time.Second {
		t.Errorf("sustain %+v", sc.Sustain)
	}
	if len(sc.Cells) != 2 || sc.Cells[0].URL != "http://127.0.0.1:9206/metrics" || sc.Cells[1].Cell != "cell-2" {
		t.Errorf("cells %+v, want the two with an admin port", sc.Cells)
	}

	if f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "festival"}); err != nil {
		t.Fatal(err)
	} else if sc, err := f.suiteConfig(); err != nil || sc.Search != nil || len(sc.Cells) != 2 {
		t.Errorf("without --search: search %+v, cells %d, %v", sc.Search, len(sc.Cells), err)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "festival", "--sustain-at", "batched"}, "--sustain-at names a strategy of --compare"},
		{[]string{"--workload", "festival", "--compare", "naive,batched", "--sustain-at", "grouped"}, "not among the strategies"},
		{[]string{"--search"}, "open-loop"},
		{[]string{"--workload", "cold", "--search", "--search-step", "10ms"}, "search step"},
		{[]string{"--workload", "cold", "--search", "--search-step", "10s", "--search-confirm", "5s"}, "search confirmation"},
	}
	for _, b := range bad {
		f, err := parseBenchFlags(append([]string{"--config", cfg}, b.args...))
		if err == nil {
			_, err = f.suiteConfig()
		}
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%v: %v, want an error saying %q", b.args, err, b.want)
		}
	}
}

// TestBenchCouponsFlags: --rate gives the coupons workload one open-loop
// run at that rate (no ceiling); flags of the packet workloads are refused.
func TestBenchCouponsFlags(t *testing.T) {
	cfg := benchConfig(t, "cluster_secret: file-secret-0123456789\nrouter:\n  listen: \"127.0.0.1:8160\"\nadmin_token: tok-0123456789abcdef\ncells:\n"+
		"  - name: cell-1\n    admin_listen: \"127.0.0.1:9206\"\n")
	f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "coupons", "--rate", "300", "--merge-backlog", "0"})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := f.couponsConfig()
	if err != nil || cc.Rate != 300 || cc.MergeBacklog != 0 || cc.SustainFraction != 0.7 {
		t.Fatalf("coupons config %+v, %v; want rate 300, no merge comparison", cc, err)
	}
	if f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "coupons"}); err != nil {
		t.Fatal(err)
	} else if cc, err := f.couponsConfig(); err != nil || cc.Rate != 0 || cc.MergeBacklog != 3000 {
		t.Fatalf("default coupons config %+v, %v; want the ceiling first (rate 0) and the merge comparison", cc, err)
	}
	// --baseline names a second cluster, with its metrics (the issue latency)
	// and its meter; --real is taken.
	old := benchConfig(t, "cluster_secret: old-secret-0123456789\nrouter:\n  listen: \"127.0.0.1:8161\"\ncells:\n"+
		"  - name: cell-1\n    admin_listen: \"127.0.0.1:9207\"\n")
	if f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "coupons", "--baseline", old, "--baseline-name", "before", "--real"}); err != nil {
		t.Fatal(err)
	} else if cc, err := f.couponsConfig(); err != nil || !cc.Real || cc.Baseline == nil || cc.Baseline.Name != "before" ||
		cc.Baseline.RouterURL != "http://127.0.0.1:8161" || cc.Baseline.ClusterSecret != "old-secret-0123456789" ||
		len(cc.Baseline.Cells) != 1 || cc.Baseline.Cells[0].URL != "http://127.0.0.1:9207/metrics" || cc.Baseline.Work == nil {
		t.Fatalf("coupons config with a baseline %+v, %v", cc, err)
	}
	if f, err := parseBenchFlags([]string{"--config", cfg, "--workload", "rewards", "--baseline", old}); err != nil {
		t.Fatal(err)
	} else if rc, err := f.rewardsConfig(); err != nil || rc.Baseline == nil || rc.Baseline.Name != "baseline" || rc.Baseline.Work == nil {
		t.Fatalf("rewards config with a baseline %+v, %v", rc, err)
	}
	for _, args := range [][]string{{"--rate", "-1"}, {"--packets", "5"}} {
		f, err := parseBenchFlags(append([]string{"--config", cfg, "--workload", "coupons"}, args...))
		if err == nil {
			_, err = f.couponsConfig()
		}
		if err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// benchConfig writes yaml as a config file, with an API key file beside it,
// in a test's own directory, the environment's key and secret cleared, and
// answers the config's path.
func benchConfig(t *testing.T, yaml string) string {
	t.Helper()
	t.Setenv("REDCELL_API_KEY", "")
	t.Setenv("REDCELL_CLUSTER_SECRET", "")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "redcell.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "api-key"), []byte("rck_test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}
