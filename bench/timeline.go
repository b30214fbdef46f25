package bench

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Bucket is one second of a run, by completion time: requests that ended in
// [T, T+1) seconds after the load started.
type Bucket struct {
	T      int     `json:"t"`      // seconds since the load started
	MS     int64   `json:"ms"`     // width of the bucket: 1000, less for the last one
	OK     int64   `json:"ok"`     // successful answers
	Errors int64   `json:"errors"` // failed answers and open-loop drops
	P99MS  float64 `json:"p99_ms"` // p99 latency of the answers (ok and failed), ms
}

// bucketsMax bounds a timeline: an hour (durationMax) plus the settle phase,
// with room to spare. Later records land in the last bucket.
const bucketsMax = 4000

// timeline counts outcomes per one-second bucket and keeps the p99 of each.
// Only the current bucket has a histogram: a bucket is final once time moves
// past it, so memory stays small whatever the duration. A record that arrives
// after its second has passed (a goroutine preempted at the boundary) counts in
// the current bucket. It is safe for concurrent use.
type timeline struct {
	mu      sync.Mutex // guards every field below
	start   time.Time
	buckets []Bucket                // buckets[len-1] is the current one
	hist    *hdrhistogram.Histogram // latencies (µs) of the current bucket
}

func newTimeline(start time.Time) *timeline {
	// Two significant digits are plenty for a per-second p99 on a chart and keep
	// the histogram near 20 KB.
	return &timeline{start: start, buckets: []Bucket{{T: 0, MS: 1000}}, hist: hdrhistogram.New(latencyMinUS, latencyMaxUS, 2)}
}

// advanceLocked makes the bucket of now current and returns it; tl.mu must be held.
func (tl *timeline) advanceLocked(now time.Time) *Bucket {
	idx := min(int(now.Sub(tl.start)/time.Second), bucketsMax-1)
	for cur := len(tl.buckets) - 1; cur < idx; cur++ {
		tl.closeLocked()
		tl.buckets = append(tl.buckets, Bucket{T: cur + 1, MS: 1000})
	}
	return &tl.buckets[len(tl.buckets)-1]
}

// closeLocked sets the current bucket's p99 and empties the histogram; tl.mu must be held.
func (tl *timeline) closeLocked() {
	if tl.hist.TotalCount() > 0 {
		tl.buckets[len(tl.buckets)-1].P99MS = usToMS(tl.hist.ValueAtQuantile(99))
	}
	tl.hist.Reset()
}

// record adds one answer that took us microseconds (already clamped into the
// histogram's range) and ended at now.
func (tl *timeline) record(now time.Time, us int64, ok bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	b := tl.advanceLocked(now)
	if ok {
		b.OK++
	} else {
		b.Errors++
	}
	_ = tl.hist.RecordValue(us) // cannot fail: the caller clamped us
}

// recordDropped adds one request that was never sent.
func (tl *timeline) recordDropped(now time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.advanceLocked(now).Errors++
}

// finish closes the buckets up to end and returns them all. The last bucket
// covers less than a second (its MS says how much) unless end falls on one.
func (tl *timeline) finish(end time.Time) []Bucket {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	last := tl.advanceLocked(end)
	if ms := end.Sub(tl.start).Milliseconds() - int64(last.T)*1000; ms >= 0 && ms < 1000 {
		last.MS = max(ms, 1)
	}
	tl.closeLocked()
	return append([]Bucket(nil), tl.buckets...)
}

// Rate returns the bucket's successful answers per second.
func (b Bucket) Rate() float64 {
	if b.MS <= 0 {
		return 0
	}
	return float64(b.OK) * 1000 / float64(b.MS)
}
