package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"redcell/model"
)

// passing is a report of a clean run.
func passing() Report {
	return Report{
		RunID: "r1", RouterURL: "http://127.0.0.1:8080", Senders: 2, Openers: 3,
		DurationMS: 1000, PacketAmount: 1000, PacketCount: 10, ElapsedMS: 1000,
		OpensPerSec: 20, SendsPerSec: 10,
		Deposit: OpStats{Count: 2, OK: 2},
		Send:    OpStats{Count: 12, OK: 10, Errors: map[string]int64{"INSUFFICIENT_BALANCE": 2}},
		Grab:    OpStats{Count: 5, OK: 4, Errors: map[string]int64{"EXPIRED": 1}},
		Open: OpStats{Count: 30, OK: 20, Errors: map[string]int64{"SOLD_OUT": 7, "EXPIRED": 3},
			LatencyMS: LatencyMS{P50: 1.5, P90: 2, P99: 4.25, Max: 9}},
		DepositedCents: 200_000, SentCents: 10_000, ClaimedCents: 2000,
		BalancesChecked: true, OpenerBalancesCents: 2000,
		Audit: &model.AuditReport{Deposits: 200_000, Balances: 200_000},
	}
}

func TestReportOK(t *testing.T) {
	if r := passing(); !r.OK() {
		t.Fatalf("a clean run is not OK: %v", r.Problems())
	}
	tests := []struct {
		name   string
		modify func(*Report)
		want   string // substring of a problem
	}{
		{"overloaded open", func(r *Report) { r.Open.Errors["OVERLOADED"] = 1 }, "open: 1 unexpected OVERLOADED"},
		{"timeout on grab", func(r *Report) { r.Grab.Errors["TIMEOUT"] = 2 }, "grab: 2 unexpected TIMEOUT"},
		{"insufficient balance on open", func(r *Report) { r.Open.Errors["INSUFFICIENT_BALANCE"] = 1 }, "open: 1 unexpected INSUFFICIENT_BALANCE"},
		{"deposit failed", func(r *Report) { r.Deposit.Errors = map[string]int64{"CELL_UNAVAILABLE": 1} }, "deposit: 1 unexpected CELL_UNAVAILABLE"},
		{"client timeout", func(r *Report) { r.Send.Errors[codeClientTimeout] = 1 }, "send: 1 unexpected CLIENT_TIMEOUT"},
		{"nothing sent", func(r *Report) { r.Send.OK = 0 }, "no packet was sent"},
		{"nothing opened", func(r *Report) { r.Open.OK = 0 }, "no packet was opened"},
		{"claimed more than sent", func(r *Report) { r.ClaimedCents = r.SentCents + 1 }, "more than the"},
		{"balance mismatch", func(r *Report) { r.BalanceMismatches = 1 }, "balances differ"},
		{"balance unreadable", func(r *Report) { r.BalanceError = "TRANSPORT" }, "balances: TRANSPORT"},
		{"audit error", func(r *Report) { r.AuditError = "db down" }, "audit: db down"},
		{"money differs", func(r *Report) { r.Audit.Difference = -5 }, "money differs by -5 cents"},
		{"audit problem", func(r *Report) { r.Audit.Problems = []string{"c1: packet sums off"} }, "audit: c1: packet sums off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := passing()
			tt.modify(&r)
			if r.OK() {
				t.Fatal("OK() = true, want false")
			}
			ps := strings.Join(r.Problems(), "\n")
			if !strings.Contains(ps, tt.want) {
				t.Fatalf("problems %q do not mention %q", ps, tt.want)
			}
		})
	}
}

func TestReportOKWithoutAudit(t *testing.T) {
	r := passing()
	r.Audit = nil
	if !r.OK() {
		t.Fatalf("a clean run without an audit is not OK: %v", r.Problems())
	}
}

func TestReportWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := passing().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"run r1 against http://127.0.0.1:8080",
		"2 senders, 3 openers, 1s",
		"20.0 opens/s",
		"open errors: EXPIRED=3 SOLD_OUT=7",
		"4.25",
		"claimed 2000",
		"deposits 200000 + rewards 0 - withdrawals 0 = balances 200000 + open 0 + in flight 0",
		"difference 0",
		"\nOK\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}

	r := passing()
	r.Open.Errors["OVERLOADED"] = 4
	b.Reset()
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "FAIL\n  - open: 4 unexpected OVERLOADED") {
		t.Errorf("failing report does not list its problem:\n%s", b.String())
	}
}

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("disk full")
}

func TestReportWriteTextError(t *testing.T) {
	w := &failingWriter{}
	if err := passing().WriteText(w); err == nil || err.Error() != "disk full" {
		t.Fatalf("WriteText = %v, want the writer's error", err)
	}
	if w.n != 1 {
		t.Fatalf("WriteText kept writing after an error: %d writes", w.n)
	}
}

func TestReportJSON(t *testing.T) {
	b, err := json.Marshal(passing())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"run_id", "elapsed_ms", "opens_per_sec", "sends_per_sec", "claimed_cents", "open", "send", "grab", "deposit", "audit"} {
		if _, ok := m[key]; !ok {
			t.Errorf("JSON report lacks %q: %s", key, b)
		}
	}
	open := m["open"].(map[string]any)
	if open["errors"].(map[string]any)["SOLD_OUT"].(float64) != 7 {
		t.Errorf("open.errors.SOLD_OUT wrong: %s", b)
	}
	if open["latency_ms"].(map[string]any)["p99"].(float64) != 4.25 {
		t.Errorf("open.latency_ms.p99 wrong: %s", b)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.ClaimedCents != 2000 || back.Audit == nil {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

func TestOpRecorder(t *testing.T) {
	rec := newOpRecorder()
	for i := 1; i <= 100; i++ {
		rec.record(result{latency: time.Duration(i) * time.Millisecond}, false)
	}
	near := func(got, want float64) bool { return got >= want*0.99 && got <= want*1.01 }
	l := rec.stats().LatencyMS
	if !near(l.P50, 50) || !near(l.P90, 90) || !near(l.P99, 99) || !near(l.Max, 100) {
		t.Fatalf("latency = %+v, want p50≈50 p90≈90 p99≈99 max≈100 ms", l)
	}
	rec.record(result{code: "SOLD_OUT", latency: time.Millisecond}, false)
	rec.record(result{latency: time.Millisecond}, true)
	rec.record(result{latency: time.Hour}, false) // clamped, not dropped
	s := rec.stats()
	if s.Count != 103 || s.OK != 102 || s.Repeats != 1 || s.Errors["SOLD_OUT"] != 1 {
		t.Fatalf("stats = %+v", s)
	}
	if want := float64(latencyMaxUS) / 1000; !near(s.LatencyMS.Max, want) {
		t.Fatalf("max = %v, want the clamp %v", s.LatencyMS.Max, want)
	}
	if got := rec.errorCount(); got != 1 {
		t.Fatalf("errorCount = %d, want 1", got)
	}
	if empty := newOpRecorder().stats(); empty.LatencyMS != (LatencyMS{}) || empty.Errors != nil {
		t.Fatalf("empty stats = %+v", empty)
	}
}

// Accounts short of their claims while the audit balances and counts the
// missing cents in flight wait for a slow relay: reported, not failed. Any
// other mismatch fails.
func TestReportCreditsPending(t *testing.T) {
	pending := func(mismatches, short int, shortCents int64, inFlight model.Cents, audit bool) Report {
		r := passing()
		r.BalanceMismatches, r.BalancesShort, r.BalancesShortCents = mismatches, short, shortCents
		r.Audit.InFlight = inFlight
		r.Audit.Deposits += inFlight // still balanced
		if !audit {
			r.Audit = nil
		}
		return r
	}
	tests := []struct {
		name    string
		r       Report
		pending int
		ok      bool
	}{
		{"covered by in flight", pending(2, 2, 50, 100, true), 2, true},
		{"in flight too small", pending(2, 2, 50, 10, true), 0, false},
		{"one over-credited", pending(2, 1, 5, 100, true), 1, false},
		{"no audit to prove it", pending(2, 2, 50, 0, false), 0, false},
	}
	for _, tt := range tests {
		if got := tt.r.CreditsPending(); got != tt.pending || tt.r.OK() != tt.ok {
			t.Errorf("%s: CreditsPending %d OK %v, want %d %v (%v)", tt.name, got, tt.r.OK(), tt.pending, tt.ok, tt.r.Problems())
		}
	}
	var b bytes.Buffer
	_ = tests[0].r.WriteText(&b)
	if !strings.Contains(b.String(), "2 accounts still wait for 50 cents of credits") {
		t.Errorf("text report does not say credits are pending:\n%s", b.String())
	}
}
