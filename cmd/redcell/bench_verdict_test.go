package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"redcell/bench"
	"redcell/model"
)

// verdictRun is a roundrobin run of one strategy that balanced its money,
// run as deploy/local/bench.sh runs it (--allow-shed).
func verdictRun(strategy string, openErrors map[string]int64) bench.Report {
	return bench.Report{RunID: "r-" + strategy, Label: strategy, Strategy: strategy, Workload: bench.WorkloadRoundRobin,
		AllowShed: true, ElapsedMS: 10_000, OpensPerSec: 81,
		Deposit: bench.OpStats{Count: 16, OK: 16}, Send: bench.OpStats{Count: 2000, OK: 2000},
		Open:           bench.OpStats{Count: 903, OK: 810, Errors: openErrors},
		DepositedCents: 40_000_000, SentCents: 40_000_000, ClaimedCents: 16_200,
		Audit: &model.AuditReport{Deposits: 40_000_000, Balances: 16_200, OpenRemaining: 39_983_800}}
}

// TestBenchVerdict: make bench's exit. A suite whose runs shed by design
// exits 0 and its summary counts the shedding; money that does not balance
// exits non-zero whatever else happened.
func TestBenchVerdict(t *testing.T) {
	shed := bench.Suite{Workload: bench.WorkloadRoundRobin, Runs: []bench.Report{
		verdictRun("naive", nil),
		verdictRun("batched", map[string]int64{model.ErrTimeout.Code: 69, model.ErrOverloaded.Code: 23, "CLIENT_TIMEOUT": 1}),
	}}
	if err := benchVerdict(shed); err != nil {
		t.Errorf("a suite that only shed: %v", err)
	}
	var out bytes.Buffer
	if err := shed.WriteSummary(&out); err != nil {
		t.Fatal(err)
	}
	if want := "- batched: open CLIENT_TIMEOUT=1, open OVERLOADED=23, open TIMEOUT=69"; !strings.Contains(out.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, out.String())
	}

	money := shed
	money.Runs = []bench.Report{shed.Runs[0], shed.Runs[1]}
	a := *money.Runs[1].Audit
	a.Difference = -4038
	money.Runs[1].Audit = &a
	err := benchVerdict(money)
	if err == nil || !strings.Contains(err.Error(), "bench FAILED: batched: audit: money differs by -4038 cents") {
		t.Errorf("audit difference: %v", err)
	}
}

// TestBenchScriptAllowsShed: every step of make bench (deploy/local/bench.sh)
// runs with --allow-shed, so that what the cluster sheds by design is counted
// and reported, and only money or a run not made fails the suite.
func TestBenchScriptAllowsShed(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "local", "bench.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(string(b), "\\\n", " ") // one line per command
	steps := regexp.MustCompile(`(?m)^step (\S+) (.*)$`).FindAllStringSubmatch(script, -1)
	if len(steps) < 6 {
		t.Fatalf("found %d steps in bench.sh, want the 6 of make bench", len(steps))
	}
	for _, s := range steps {
		if !strings.Contains(s[2], "--allow-shed") {
			t.Errorf("step %s runs without --allow-shed: %s", s[1], s[2])
		}
	}
}
