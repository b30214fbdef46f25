package httpmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestObserve: answers land under their code (the answer's api.HeaderCode);
// a missing or unknown code, or "OK" on an error status, is OTHER; the hot
// path does not allocate once a series exists.
func TestObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(reg, "t_seconds", "test", []string{"a", "b"})
	r.ObserveCode(0, 200, nil, time.Millisecond)
	r.ObserveCode(0, 200, []byte("SOLD_OUT"), time.Millisecond) // a 200 is OK whatever it carries
	r.ObserveCode(1, 409, []byte("SOLD_OUT"), 2*time.Millisecond)
	r.ObserveCode(1, 500, nil, time.Millisecond)
	r.ObserveCode(1, 418, []byte("TEAPOT"), time.Millisecond)
	r.ObserveCode(1, 503, []byte("OK"), time.Millisecond)
	want := map[string]int{`code="OK",route="a"`: 2, `code="SOLD_OUT",route="b"`: 1, `code="OTHER",route="b"`: 3}
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
	code := []byte("SOLD_OUT")
	if allocs := testing.AllocsPerRun(1000, func() { r.ObserveCode(1, 409, code, time.Millisecond) }); allocs != 0 {
		t.Errorf("ObserveCode allocates %v times per call", allocs)
	}
}
