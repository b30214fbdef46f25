// Package httpmetrics provides Requests: a Prometheus latency histogram of HTTP
// answers by route and error code, cheap enough for the hot path of the router
// and the cells.
package httpmetrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
)

// LatencyBuckets are the histogram buckets, in seconds: 0.5 ms (a no-op on
// loopback) to 5 s (past every request deadline).
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Requests is one histogram vector with the labels route and code. The label
// values are fixed when it is made: the given routes, and for code every error
// code of cell/api plus api.CodeOK and api.CodeOther. A (route, code) series
// appears on its first observation and is cached, so Observe allocates nothing.
// Safe for concurrent use.
type Requests struct {
	vec    *prometheus.HistogramVec
	routes []string
	codes  []string       // label values, index = code index
	index  map[string]int // code -> index into codes
	other  int            // index of api.CodeOther
	cache  []atomic.Pointer[observer]
}

type observer struct{ prometheus.Observer }

// New registers a histogram called name with reg and returns it. routes are
// the route label values; callers pass indexes into it to Observe.
func New(reg prometheus.Registerer, name, help string, routes []string) *Requests {
	codes := append([]string{api.CodeOK, api.CodeOther}, api.Codes()...)
	r := &Requests{
		vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: LatencyBuckets},
			[]string{"route", "code"}),
		routes: routes, codes: codes, index: make(map[string]int, len(codes)), other: 1,
		cache: make([]atomic.Pointer[observer], len(routes)*len(codes)),
	}
	for i, c := range codes {
		r.index[c] = i
	}
	reg.MustRegister(r.vec)
	return r
}

// ObserveCode records one answer of route (an index into the routes given to
// New) that took d: status 200 counts as api.CodeOK; any other status is
// labelled with code, the answer's api.HeaderCode (api.ResponseCode), or
// api.CodeOther when code is nil or not an error code of the table. It does not
// allocate once the (route, code) series exists.
func (r *Requests) ObserveCode(route int, status int, code []byte, d time.Duration) {
	i := 0 // api.CodeOK
	if status != 200 {
		i = r.other
		if j, ok := r.index[string(code)]; ok && j != 0 { // no allocation: the compiler looks up []byte keys in place
			i = j
		}
	}
	slot := &r.cache[route*len(r.codes)+i]
	o := slot.Load()
	if o == nil {
		o = &observer{r.vec.WithLabelValues(r.routes[route], r.codes[i])}
		slot.Store(o) // a racing Store holds the same series: WithLabelValues is idempotent
	}
	o.Observe(d.Seconds())
}
