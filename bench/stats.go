package bench

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// op names an operation the bench measures.
type op int

const (
	opDeposit op = iota
	opSend
	opGrab
	opOpen
	opCount // number of ops; not an op
)

var opNames = [opCount]string{"deposit", "send", "grab", "open"}

func (o op) String() string { return opNames[o] }

// Histogram range: 1 µs to twice the request timeout, 3 significant digits
// (about 100 KB per histogram; there is one per op, shared by all goroutines).
const (
	latencyMinUS  = 1
	latencyMaxUS  = int64(2 * requestTimeout / time.Microsecond)
	latencyDigits = 3
)

// opRecorder counts the requests of one op, their outcomes by code and their
// latencies. It is safe for concurrent use; the lock is held only to update
// counters, never across I/O.
type opRecorder struct {
	mu      sync.Mutex // guards every field below
	count   int64
	ok      int64
	repeats int64 // successful answers with repeat=true
	errors  map[string]int64
	hist    *hdrhistogram.Histogram // latency in µs
	// tl, when set, also gets every outcome in one-second buckets; it has its
	// own lock, taken after mu is released.
	tl *timeline
}

func newOpRecorder() *opRecorder {
	return &opRecorder{
		errors: map[string]int64{},
		hist:   hdrhistogram.New(latencyMinUS, latencyMaxUS, latencyDigits),
	}
}

// record adds one request's outcome. A code of "" is a success.
func (r *opRecorder) record(res result, repeat bool) {
	us := res.latency.Microseconds()
	if us < latencyMinUS {
		us = latencyMinUS
	}
	if us > latencyMaxUS {
		us = latencyMaxUS // clamp: RecordValue rejects values above the range
	}
	r.mu.Lock()
	r.count++
	switch {
	case res.code != "":
		r.errors[res.code]++
	case repeat:
		r.ok++
		r.repeats++
	default:
		r.ok++
	}
	_ = r.hist.RecordValue(us) // cannot fail: us is clamped into the range
	r.mu.Unlock()
	if r.tl != nil {
		r.tl.record(time.Now(), us, res.code == "")
	}
}

// recordDropped counts one request that was never sent because the in-flight
// bound was reached (open-loop mode). It has no latency.
func (r *opRecorder) recordDropped() {
	r.mu.Lock()
	r.count++
	r.errors[codeDropped]++
	r.mu.Unlock()
	if r.tl != nil {
		r.tl.recordDropped(time.Now())
	}
}

// okCount returns the successes so far, for the progress line.
func (r *opRecorder) okCount() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok
}

// errorCount returns the failures so far, for the progress line.
func (r *opRecorder) errorCount() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count - r.ok
}

// stats summarizes the recorder for the report.
func (r *opRecorder) stats() OpStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := OpStats{Count: r.count, OK: r.ok, Repeats: r.repeats}
	if len(r.errors) > 0 {
		s.Errors = make(map[string]int64, len(r.errors))
		for code, n := range r.errors {
			s.Errors[code] = n
		}
	}
	if r.hist.TotalCount() > 0 {
		s.LatencyMS = LatencyMS{
			P50:  usToMS(r.hist.ValueAtQuantile(50)),
			P90:  usToMS(r.hist.ValueAtQuantile(90)),
			P99:  usToMS(r.hist.ValueAtQuantile(99)),
			P999: usToMS(r.hist.ValueAtQuantile(99.9)),
			Max:  usToMS(r.hist.Max()),
		}
	}
	return s
}

func usToMS(us int64) float64 { return float64(us) / 1000 }
