package httpmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestObserve: answers land under the code of their error body; bodies that
// are not error bodies, or unknown codes, are OTHER; the hot path does not
// allocate once a series exists.
func TestObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(reg, "t_seconds", "test", []string{"a", "b"})
	r.Observe(0, 200, []byte(`{"ok":true}`), time.Millisecond)
	r.Observe(0, 200, nil, time.Millisecond)
	r.Observe(1, 409, []byte(`{"error":{"code":"SOLD_OUT","message":"m"}}`), 2*time.Millisecond)
	r.Observe(1, 500, []byte(`plain text`), time.Millisecond)
	r.Observe(1, 418, []byte(`{"error":{"code":"TEAPOT","message":"m"}}`), time.Millisecond)
	want := map[string]int{`code="OK",route="a"`: 2, `code="SOLD_OUT",route="b"`: 1, `code="OTHER",route="b"`: 2}
	if n := testutil.CollectAndCount(r.vec); n != len(want) {
		t.Fatalf("%d series, want %d", n, len(want))
	}
	mfs, _ := reg.Gather()
	for _, m := range mfs[0].GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
		}
		key := strings.Join(labels, ",")
		if got := int(m.GetHistogram().GetSampleCount()); got != want[key] {
			t.Errorf("%s: %d answers, want %d", key, got, want[key])
		}
	}
	body := []byte(`{"error":{"code":"SOLD_OUT","message":"m"}}`)
	if allocs := testing.AllocsPerRun(1000, func() { r.Observe(1, 409, body, time.Millisecond) }); allocs != 0 {
		t.Errorf("Observe allocates %v times per call", allocs)
	}
}
