package incident

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// lines returns the log lines written so far, one message and level each.
func lines(buf *bytes.Buffer) []string {
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
		tr := New(log, "outbox scan", 10*time.Second)
		tr.OK() // nothing failing: nothing logged
		if got := lines(&buf); len(got) != 0 {
			t.Fatalf("OK without a failure logged %q", got)
		}
		down := errors.New("connection refused")
		// 50 failures a second for 25 s: one start line and two summaries.
		for i := 0; i < 25*50; i++ {
			tr.Fail(down, "db", i%50)
			time.Sleep(20 * time.Millisecond)
		}
		got := lines(&buf)
		if len(got) != 3 {
			t.Fatalf("25 s of failures logged %d lines, want 3 (start + 2 summaries):\n%s", len(got), buf.String())
		}
		if !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], `msg="outbox scan failing"`) || !strings.Contains(got[0], `err="connection refused"`) {
			t.Errorf("start line = %q", got[0])
		}
		// The first summary covers the failures of the 10 s after the start line.
		if !strings.Contains(got[1], `msg="outbox scan still failing"`) || !strings.Contains(got[1], "failures=500 ") || !strings.Contains(got[1], "failures_total=501") {
			t.Errorf("summary line = %q", got[1])
		}
		if !tr.Failing() {
			t.Error("Failing() = false during the failure")
		}
		tr.OK()
		tr.OK()
		got = lines(&buf)
		if len(got) != 4 || !strings.Contains(got[3], "level=INFO") || !strings.Contains(got[3], `msg="outbox scan recovered"`) ||
			!strings.Contains(got[3], "failures_total=1250") || !strings.Contains(got[3], "lasted=25s") {
			t.Fatalf("after recovery:\n%s", buf.String())
		}
		// A new failure after the recovery is a new start.
		tr.Fail(down)
		if got = lines(&buf); len(got) != 5 || !strings.Contains(got[4], `msg="outbox scan failing"`) {
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
