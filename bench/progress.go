package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progressWidth is the number of cells of the progress bar.
const progressWidth = 20

// progressSnapshot is what the progress line shows besides the time.
type progressSnapshot struct {
	noun   string // what opens counts; "" means "opens"
	opens  int64  // successful opens (or nouns) so far
	errors int64  // failed requests so far, every op
	extra  string // workload-specific, e.g. "sends 12"
}

// startProgress rewrites one line on w every progressInterval until the
// returned stop is called, which ends the line:
//
//	[hot] [#######.............]   4s/10s  opens 12345  3086 opens/s  errors 3
//
// The rate is over the last interval. w nil: no progress, stop does nothing.
func startProgress(w io.Writer, label string, start time.Time, total time.Duration, snap func() progressSnapshot) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		lastOpens, lastAt := int64(0), start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				s := snap()
				rate := 0.0
				if dt := now.Sub(lastAt).Seconds(); dt > 0 {
					rate = float64(s.opens-lastOpens) / dt
				}
				lastOpens, lastAt = s.opens, now
				fmt.Fprint(w, progressLine(label, now.Sub(start), total, s, rate))
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		fmt.Fprintln(w)
	}
}

// progressLine renders one progress line, starting with '\r'.
func progressLine(label string, elapsed, total time.Duration, s progressSnapshot, rate float64) string {
	filled := progressWidth
	if total > 0 && elapsed < total {
		filled = int(int64(progressWidth) * int64(elapsed) / int64(total))
	}
	var b strings.Builder
	b.WriteString("\r")
	if label != "" {
		fmt.Fprintf(&b, "[%s] ", label)
	}
	noun := s.noun
	if noun == "" {
		noun = "opens"
	}
	fmt.Fprintf(&b, "[%s%s] %3.0fs/%.0fs  %s %d  %.0f %s/s  errors %d",
		strings.Repeat("#", filled), strings.Repeat(".", progressWidth-filled),
		elapsed.Seconds(), total.Seconds(), noun, s.opens, rate, noun, s.errors)
	if s.extra != "" {
		b.WriteString("  " + s.extra)
	}
	b.WriteString("   ")
	return b.String()
}
