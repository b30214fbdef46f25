package membership

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogWriterBoundsRepeats: memberlist complaining once a second about a
// peer that cannot be reached (a failed ping, a failed push/pull, any address)
// is forwarded once per kind per logEvery, the next line saying how many were
// dropped; its debug and info chatter is never forwarded, and other kinds of
// line are not held back by a repeating one.
func TestLogWriterBoundsRepeats(t *testing.T) {
	var buf bytes.Buffer
	w := newLogWriter(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Date(2026, 5, 9, 12, 0, 0, 0, time.UTC)
	w.now = func() time.Time { return now }
	write := func(format string, args ...any) {
		fmt.Fprintf(w, "2026/05/09 12:00:00 "+format+"\n", args...)
	}
	for i := range 30 { // 30 s of a dead peer
		write("[ERR] memberlist: Failed fallback TCP ping: dial tcp 127.0.0.1:%d: connect: connection refused", 7948+i%2)
		write("[ERR] memberlist: Push/Pull with cell-%d failed: dial tcp 127.0.0.1:7948: connect: connection refused", 1+i%2)
		write("[WARN] memberlist: Was able to connect to cell-2 over TCP but UDP probes failed, network may be misconfigured")
		write("[DEBUG] memberlist: Stream connection from=127.0.0.1:%d", 40000+i)
		write("[INFO] memberlist: Suspect cell-2 has failed, no acks received")
		now = now.Add(time.Second)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	count := map[string]int{}
	for _, l := range lines {
		switch {
		case strings.Contains(l, "Failed fallback TCP ping"):
			count["ping"]++
		case strings.Contains(l, "Push/Pull"):
			count["pushpull"]++
		case strings.Contains(l, "UDP probes failed"):
			count["udp"]++
		default:
			t.Errorf("forwarded: %s", l)
		}
	}
	for kind, n := range count {
		if n != 3 { // at 0 s, 10 s and 20 s
			t.Errorf("%s forwarded %d times in 30 s, want 3:\n%s", kind, n, buf.String())
		}
	}
	if !strings.Contains(lines[0], "level=ERROR") || strings.Contains(lines[0], "repeated=") ||
		!strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "repeated=9") {
		t.Errorf("levels or repeat counts:\n%s", buf.String())
	}
	if len(w.kinds) != 3 {
		t.Errorf("%d kinds remembered, want 3: %v", len(w.kinds), w.kinds)
	}
}
