package incident

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
)

// syncBuffer is a buffer a held recovery's timer may write to while the test reads it.
type syncBuffer = testenv.Buffer

// lines returns the log lines written so far, one message and level each.
func lines(buf interface{ String() string }) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestTrackerLogsStartSummaryAndEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		tr := New(log, "relay claims read", 10*time.Second)
		tr.OK() // nothing failing: nothing logged
		if got := lines(&buf); len(got) != 0 {
			t.Fatalf("OK without a failure logged %q", got)
		}
		down := errors.New("connection refused")
		// 50 failures a second for 25 s: one start line and two summaries.
		for i := 0; i < 25*50; i++ {
			tr.Fail(down, "db", i%50)
			testenv.Advance(20 * time.Millisecond)
		}
		got := lines(&buf)
		if len(got) != 3 {
			t.Fatalf("25 s of failures logged %d lines, want 3 (start + 2 summaries):\n%s", len(got), buf.String())
		}
		if !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], `msg="relay claims read failing"`) || !strings.Contains(got[0], `err="connection refused"`) {
			t.Errorf("start line = %q", got[0])
		}
		// The first summary covers the failures of the 10 s after the start line.
		if !strings.Contains(got[1], `msg="relay claims read still failing"`) || !strings.Contains(got[1], "failures=500 ") || !strings.Contains(got[1], "failures_total=501") {
			t.Errorf("summary line = %q", got[1])
		}
		if !tr.Failing() {
			t.Error("Failing() = false during the failure")
		}
		tr.OK()
		tr.OK()
		got = lines(&buf)
		if len(got) != 4 || !strings.Contains(got[3], "level=INFO") || !strings.Contains(got[3], `msg="relay claims read recovered"`) ||
			!strings.Contains(got[3], "failures_total=1250") || !strings.Contains(got[3], "lasted=25s") {
			t.Fatalf("after recovery:\n%s", buf.String())
		}
		// A new failure after the recovery is a new start.
		tr.Fail(down)
		if got = lines(&buf); len(got) != 5 || !strings.Contains(got[4], `msg="relay claims read failing"`) {
			t.Fatalf("second failure:\n%s", buf.String())
		}
	})
}

func TestSetKeepsOneTrackerPerKeyBounded(t *testing.T) {
	var buf bytes.Buffer
	s := NewSet(slog.New(slog.NewTextHandler(&buf, nil)), "relay to cell", "addr", time.Minute, 2)
	a, b := s.Of("10.0.0.1:9101"), s.Of("10.0.0.2:9101")
	if a == b || s.Of("10.0.0.1:9101") != a {
		t.Fatal("each key must keep its own tracker")
	}
	if c, d := s.Of("10.0.0.3:9101"), s.Of("10.0.0.4:9101"); c != d || c == a || c == b {
		t.Fatal("keys past the bound must share the overflow tracker")
	}
	a.Fail(errors.New("refused"))
	a.Fail(errors.New("refused"))
	b.Fail(errors.New("timeout"))
	got := lines(&buf)
	if len(got) != 2 || !strings.Contains(got[0], "addr=10.0.0.1:9101") || !strings.Contains(got[1], "addr=10.0.0.2:9101") {
		t.Fatalf("per-key start lines:\n%s", buf.String())
	}
}

// TestTrackerFlapping: a failure that comes and goes every 10 ms for 25 s
// (say one database of many failing, or one request in two) logs its start
// and first recovery, then at most one line per interval, not two per flap;
// its last recovery is logged once the interval has passed, so the log ends
// saying it is over. A failure after a quiet interval starts anew.
func TestTrackerFlapping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf syncBuffer
		tr := NewLines(slog.New(slog.NewTextHandler(&buf, nil)), Lines{Start: "db down", Still: "db still down", End: "db back"}, 10*time.Second)
		down := errors.New("refused")
		for range 25 * 50 {
			tr.Fail(down)
			testenv.Advance(10 * time.Millisecond)
			tr.OK()
			testenv.Advance(10 * time.Millisecond)
		}
		got := lines(&buf)
		if len(got) < 2 || len(got) > 4 || !strings.Contains(got[0], `msg="db down"`) || !strings.Contains(got[1], `msg="db back"`) {
			t.Fatalf("25 s of flapping logged %d lines, want the start, a recovery and at most one line per 10 s:\n%s", len(got), buf.String())
		}
		testenv.Advance(10 * time.Second)
		got = lines(&buf)
		last := got[len(got)-1]
		if len(got) > 5 || !strings.Contains(last, `msg="db back"`) || !strings.Contains(last, "failures_total=1250") || !strings.Contains(last, "recoveries=") {
			t.Fatalf("after the flapping stopped (%d lines), the last should be the recovery of all 1250 failures:\n%s", len(got), buf.String())
		}
		t.Logf("25 s of flapping:\n%s", buf.String())
		n := len(got)
		testenv.Advance(10 * time.Second)
		tr.Fail(down)
		if got = lines(&buf); len(got) != n+1 || !strings.Contains(got[n], `msg="db down"`) {
			t.Fatalf("a failure after a quiet interval:\n%s", buf.String())
		}
	})
}

// TestTrackerErrorLevel: Lines.Error writes the start and the summaries at
// ERROR; the recovery stays INFO.
func TestTrackerErrorLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		tr := NewLines(slog.New(slog.NewTextHandler(&buf, nil)), Lines{Start: "open batch failed", Still: "open batches still failing",
			End: "open batches commit again", Error: true}, time.Second)
		tr.Fail(errors.New("bug"))
		testenv.Advance(time.Second)
		tr.Fail(errors.New("bug"))
		tr.OK()
		got := lines(&buf)
		if len(got) != 3 || !strings.Contains(got[0], `level=ERROR msg="open batch failed"`) ||
			!strings.Contains(got[1], `level=ERROR msg="open batches still failing"`) || !strings.Contains(got[2], `level=INFO msg="open batches commit again"`) {
			t.Fatalf("lines:\n%s", buf.String())
		}
	})
}
