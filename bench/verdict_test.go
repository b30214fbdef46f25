package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"redcell/model"
)

// shedSuite is the suite of issue 27's make bench: roundrobin runs that shed
// (naive 3 send TIMEOUTs; batched 69 TIMEOUT, 23 OVERLOADED and 1
// CLIENT_TIMEOUT opens), run with AllowShed as deploy/local/bench.sh runs
// them, and a festival search that confirmed no rate for batched, whose
// sustain run at 70% of grouped shed 2 opens.
func shedSuite() Suite {
	naive := passing()
	naive.Label, naive.Strategy, naive.Workload, naive.AllowShed = "naive", "naive", WorkloadRoundRobin, true
	naive.Send.Errors = map[string]int64{model.ErrTimeout.Code: 3}
	batched := passing()
	batched.Label, batched.Strategy, batched.Workload, batched.AllowShed = "batched", "batched", WorkloadRoundRobin, true
	batched.Open.Errors = map[string]int64{model.ErrTimeout.Code: 69, model.ErrOverloaded.Code: 23, codeClientTimeout: 1, "SOLD_OUT": 4}
	sustain := passing()
	sustain.Label, sustain.Strategy, sustain.Workload, sustain.AllowShed = "grouped@70%", "grouped", WorkloadFestival, true
	sustain.Open.Errors = map[string]int64{model.ErrTimeout.Code: 2}
	return Suite{Workload: WorkloadRoundRobin, Runs: []Report{naive, batched},
		Search: []SearchResult{
			{Strategy: "naive", SustainedRate: 303, Confirmed: true, Stop: "converged"},
			{Strategy: "batched", SustainedRate: 0, LowestFail: 250, Stop: "nothing passes"},
			{Strategy: "grouped", SustainedRate: 277, Confirmed: true, Stop: "converged"},
		},
		Sustain: &SustainResult{Strategy: "grouped", Fraction: 0.7, SustainedRate: 277, Rate: 194, Run: &sustain,
			Missed: []string{"open: 2 TIMEOUT"}}}
}

// TestSuiteVerdictCountsShedding: runs that shed by design pass, and the
// verdict counts what they shed per run and names the strategy without a
// confirmed rate.
func TestSuiteVerdictCountsShedding(t *testing.T) {
	s := shedSuite()
	if !s.OK() {
		t.Fatalf("a suite that only shed failed: %q", s.Problems())
	}
	wantShed := []string{"naive: send TIMEOUT=3", "batched: open CLIENT_TIMEOUT=1, open OVERLOADED=23, open TIMEOUT=69",
		"grouped@70%: open TIMEOUT=2"}
	if got := s.Shed(); strings.Join(got, "\n") != strings.Join(wantShed, "\n") {
		t.Errorf("shed %q, want %q", got, wantShed)
	}
	if got := s.Unrated(); len(got) != 1 || got[0] != "batched" {
		t.Errorf("unrated %q, want [batched]", got)
	}
	var sum, md, txt bytes.Buffer
	if err := s.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteMarkdown(&md, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Runs[1].WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{sum.String(), md.String()} {
		for _, want := range []string{"**PASS**", "Shed by design (counted, not failures):",
			"- batched: open CLIENT_TIMEOUT=1, open OVERLOADED=23, open TIMEOUT=69", "- naive: send TIMEOUT=3",
			"| batched | no confirmed rate |", "No confirmed rate: batched."} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		}
	}
	if want := "shed by design (counted, not a failure): open CLIENT_TIMEOUT=1, open OVERLOADED=23, open TIMEOUT=69\n"; !strings.Contains(txt.String(), want) ||
		!strings.Contains(txt.String(), "\nOK\n") {
		t.Errorf("text report lacks %q or OK:\n%s", want, txt.String())
	}

	// The database breaker's DB_UNAVAILABLE is shed too, while the run was
	// made; a run that sent nothing (its setup shed) could not be made.
	s.Runs[0].Open.Errors = map[string]int64{model.ErrDBUnavailable.Code: 41}
	if !s.OK() || !strings.Contains(strings.Join(s.Shed(), "\n"), "naive: send TIMEOUT=3, open DB_UNAVAILABLE=41") {
		t.Errorf("DB_UNAVAILABLE: problems %q, shed %q", s.Problems(), s.Shed())
	}
	notMade := s
	notMade.Runs = []Report{s.Runs[0], s.Runs[1]}
	notMade.Runs[1].Send = OpStats{Count: 3800, Errors: map[string]int64{model.ErrDBUnavailable.Code: 3800}}
	notMade.Runs[1].Open = OpStats{}
	if ps := strings.Join(notMade.Problems(), "; "); notMade.OK() || !strings.Contains(ps, "batched: no packet was sent") ||
		!strings.Contains(ps, "batched: no packet was opened") {
		t.Errorf("a run whose setup was shed: problems %q", ps)
	}

	// Without AllowShed the same answers fail the run: a bench run by hand
	// without --allow-shed still asks for none.
	s.Runs[1].AllowShed = false
	if s.OK() || !strings.Contains(strings.Join(s.Problems(), "; "), "batched: open: 69 unexpected TIMEOUT") {
		t.Errorf("shedding without AllowShed: problems %q", s.Problems())
	}
}

// TestSuiteVerdictFailsOnMoney: whatever was shed, money that does not
// balance fails the suite, in a run and in its sustain run.
func TestSuiteVerdictFailsOnMoney(t *testing.T) {
	s := shedSuite()
	s.Runs[1].Audit = &model.AuditReport{Deposits: 200_000, Balances: 199_995, Difference: -5}
	if s.OK() || !strings.Contains(strings.Join(s.Problems(), "; "), "batched: audit: money differs by -5 cents") {
		t.Errorf("audit difference: problems %q", s.Problems())
	}
	s = shedSuite()
	s.Sustain.Run.OverClaimedPackets = 1
	if s.OK() || !strings.Contains(strings.Join(s.Problems(), "; "), "grouped@70%: 1 claims went beyond") {
		t.Errorf("over-claim in the sustain run: problems %q", s.Problems())
	}
}

// TestSustainWithoutConfirmedRate: a sustain strategy whose search confirmed
// no rate is reported as such, not failed; the audit runs instead, and money
// it finds wrong fails the suite.
func TestSustainWithoutConfirmedRate(t *testing.T) {
	for _, diff := range []model.Cents{0, 7} {
		audits := 0
		search := DefaultSearchConfig()
		sustain := DefaultSustainConfig("batched")
		sc := SuiteConfig{Run: Config{Workload: WorkloadFestival, AllowShed: true,
			Audit: func(context.Context) (model.AuditReport, error) {
				audits++
				return model.AuditReport{Deposits: 100, Balances: 100 + diff, Difference: diff}, nil
			}},
			Search: &search, Sustain: &sustain}
		s := Suite{Workload: WorkloadFestival, Search: []SearchResult{{Strategy: "naive", SustainedRate: 300, Confirmed: true},
			{Strategy: "batched", Stop: "converged; not confirmed"}}}
		if err := s.runSustain(context.Background(), sc); err != nil {
			t.Fatal(err)
		}
		su := s.Sustain
		if !su.NoRate || su.Run != nil || su.Error != "" || su.Audit == nil || audits < 2 { // quiesce's audit, then the check's
			t.Fatalf("diff %d: sustain %+v after %d audits", diff, su, audits)
		}
		var md bytes.Buffer
		if err := s.WriteMarkdown(&md, ""); err != nil {
			t.Fatal(err)
		}
		if diff == 0 {
			if !s.OK() || !strings.Contains(md.String(), "Not run: batched has no confirmed rate (a measurement, not a failure). The audit after the search: clean.") {
				t.Errorf("no rate, clean audit: problems %q\n%s", s.Problems(), md.String())
			}
			continue
		}
		if s.OK() || !strings.Contains(strings.Join(s.Problems(), "; "), "audit after the search: money differs by 7 cents") ||
			!strings.Contains(md.String(), "The audit after the search: money differs by 7 cents.") {
			t.Errorf("no rate, audit off by 7: problems %q\n%s", s.Problems(), md.String())
		}
	}
}

// TestSustainRunAllowsShedAsTheSuite: the sustain run sheds as the suite's
// runs do (bench.sh's --allow-shed), instead of always failing on it.
func TestSustainRunAllowsShedAsTheSuite(t *testing.T) {
	search := DefaultSearchConfig()
	sustain := DefaultSustainConfig("grouped")
	sustain.Duration = 30 * time.Second
	for _, allow := range []bool{true, false} {
		sc := SuiteConfig{Run: DefaultWorkloadConfig(WorkloadFestival), Search: &search, Sustain: &sustain}
		sc.Run.AllowShed = allow
		run := sustainRunConfig(sc, 194)
		if run.AllowShed != allow || run.Rate != 194 || run.Duration != 30*time.Second || run.Label != "grouped@70%" {
			t.Errorf("allow %v: sustain run AllowShed %v, rate %d, duration %v, label %q", allow, run.AllowShed, run.Rate, run.Duration, run.Label)
		}
	}
}

// TestLimitsVerdictCountsShedding: the no-op measurements of the hot step
// (make bench runs it with --allow-shed) count their shedding answers; other
// answers, and a measurement that got no answer at all, still fail.
func TestLimitsVerdictCountsShedding(t *testing.T) {
	l := LimitsReport{AllowShed: true,
		NoopRouter: &NoopResult{Path: "router", Count: 1000, OK: 990, Errors: map[string]int64{model.ErrTimeout.Code: 7, codeClientTimeout: 3}},
		Client:     &ClientCheck{WrkRuns: []NoopResult{{Path: "wrk", Count: 500, OK: 498, Errors: map[string]int64{"WRK_TIMEOUT": 2}}}}}
	s := Suite{Workload: WorkloadHot, Limits: &l}
	if !s.OK() {
		t.Fatalf("no-op shedding failed the suite: %q", s.Problems())
	}
	want := []string{"no-op router: CLIENT_TIMEOUT=3, TIMEOUT=7", "no-op wrk: WRK_TIMEOUT=2"}
	if got := s.Shed(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("shed %q, want %q", got, want)
	}
	l.NoopRouter.Errors["INTERNAL"] = 1
	if s.OK() || !strings.Contains(strings.Join(s.Problems(), "; "), "no-op router: 10 of 1000 requests failed map[INTERNAL:1]") {
		t.Errorf("an INTERNAL answer: problems %q", s.Problems())
	}
	delete(l.NoopRouter.Errors, "INTERNAL")
	l.NoopRouter.OK = 0
	if s.OK() {
		t.Errorf("a no-op that got no answer passed")
	}
	l.NoopRouter.OK, l.AllowShed = 990, false
	if s.OK() || s.Shed() != nil {
		t.Errorf("without AllowShed: problems %q, shed %q", s.Problems(), s.Shed())
	}
}

// TestRoundRobinOpensThePacketsSent: a roundrobin run whose setup had sends
// shed opens the packets that were sent, and its report counts the shed
// sends, instead of not being made at all (make bench, issue 27).
func TestRoundRobinOpensThePacketsSent(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	f.shedSends = "-snd-0-" // the first sender's sends: half the packets
	cfg := loadConfig(f.serve(t), f, WorkloadRoundRobin)
	cfg.Packets, cfg.AllowShed = 40, true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Packets != 20 || rep.Send.OK != 20 || rep.Send.Errors[model.ErrDBUnavailable.Code] < 20 || rep.Open.OK == 0 {
		t.Fatalf("packets %d, sends %+v, opens ok %d", rep.Packets, rep.Send, rep.Open.OK)
	}
	if !rep.OK() {
		t.Errorf("a run with shed sends failed: %q", rep.Problems())
	}
	checkMoney(t, f, rep)
}
