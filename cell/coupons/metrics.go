package coupons

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/cell/couponbatch"
	"redcell/cell/couponq"
	"redcell/model"
)

// metrics are the coupon drop's series, by space: requests accepted,
// issued by batch, refused by reason and batch, the accepted→issued
// latency, the wait in each layer's queue, the queue depths, the merge
// sizes, the units written off by lost answers and the layer limiters'
// fallbacks to rate/N.
type metrics struct {
	accepted *prometheus.CounterVec   // space
	issued   *prometheus.CounterVec   // space, batch
	refused  *prometheus.CounterVec   // space, reason
	latency  *prometheus.HistogramVec // space: accepted → issued, seconds
	wait     *prometheus.HistogramVec // space, layer
	merge    *prometheus.HistogramVec // space: requests per deduction
	open     *prometheus.CounterVec   // space, batch: units left open by a lost answer
}

// newMetrics makes the drop's series and registers them with reg; the
// queue depths and the limiters' fallbacks read d's engines and limiters,
// 0 until New has built them.
func newMetrics(reg prometheus.Registerer, d *Drop) *metrics {
	m := &metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_coupon_accepted_total",
			Help: "Coupon requests stored (accepted), repeats of a serial not counted."}, []string{"space"}),
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_coupon_issued_total",
			Help: "Coupons issued, by batch."}, []string{"space", "batch"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_coupon_refused_total",
			Help: "Coupon requests refused, by reason (PER_PERSON_LIMIT, GROUP_HELD, RISK, SOLD_OUT, BATCH_CLOSED) and batch."}, []string{"space", "reason", "batch"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_coupon_issue_latency_seconds",
			Help:    "From a coupon request's accept to its coupon's issue (the seed's target: 99% within 0.5 s).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"space"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_coupon_queue_wait_seconds",
			Help:    "How long a coupon request waited in a layer's local queue (1: decision, 2: stock).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"space", "layer"}),
		merge: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_coupon_merge_requests",
			Help: "Requests of one batch taken by one stock deduction.", Buckets: prometheus.ExponentialBuckets(1, 2, 11)}, []string{"space"}),
		open: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_coupon_written_off_units_total",
			Help: "Stock units written off: left with a deduction whose issue lost its COMMIT's answer, no coupon known to carry them, until the batch's home settles the deduction by its coupons."}, []string{"space", "batch"}),
	}
	depth := prometheus.NewGaugeFunc
	reg.MustRegister(m.accepted, m.issued, m.refused, m.latency, m.wait, m.merge, m.open)
	for i, name := range []string{"real", "shadow"} {
		for layer := range 2 {
			reg.MustRegister(depth(prometheus.GaugeOpts{Name: "redcell_coupon_queue_depth", Help: "Coupon requests waiting in a layer's local queue.",
				ConstLabels: prometheus.Labels{"space": name, "layer": layerLabel(layer + 1)}}, func() float64 {
				if d.engines[i] == nil {
					return 0
				}
				l1, l2 := d.engines[i].Depths()
				return float64([]int{l1, l2}[layer])
			}))
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_coupon_limiter_fallbacks_total",
				Help:        "Times a coupon layer's cluster-wide limiter found memcached failing and took rate/N locally.",
				ConstLabels: prometheus.Labels{"space": name, "layer": layerLabel(layer + 1)}}, func() float64 {
				if d.limits[i][layer] == nil {
					return 0
				}
				return float64(d.limits[i][layer].Stats().FellBack)
			}))
		}
	}
	if cat := d.holder.Catalog(); cat != nil {
		m.seed(cat)
	}
	return m
}

// couponReasons are the reasons a request is refused with, each a series of
// redcell_coupon_refused_total per batch from the batch's load on.
var couponReasons = []model.CouponReason{model.ReasonLimit, model.ReasonGroup, model.ReasonRisk, model.ReasonSoldOut, model.ReasonBatchClosed}

// seed makes the per-batch series of cat's batches at 0, so that the first
// refusal or write-off of a batch is an increase (a series born at 1 is none
// to rate() and increase(), and its alert would never fire).
func (m *metrics) seed(cat *couponbatch.Catalog) {
	for _, space := range []string{"real", "shadow"} {
		for _, b := range cat.Batches() {
			m.issued.WithLabelValues(space, b.ID)
			m.open.WithLabelValues(space, b.ID)
			for _, r := range couponReasons {
				m.refused.WithLabelValues(space, string(r), b.ID)
			}
		}
	}
}

func layerLabel(n int) string { return string(rune('0' + n)) }

// observer is couponq.Observer for one space.
func (m *metrics) observer(space string) couponq.Observer {
	return couponObserver{m: m, space: space, accepted: m.accepted.WithLabelValues(space), latency: m.latency.WithLabelValues(space),
		merge: m.merge.WithLabelValues(space), wait: [2]prometheus.Observer{m.wait.WithLabelValues(space, "1"), m.wait.WithLabelValues(space, "2")}}
}

type couponObserver struct {
	m        *metrics
	space    string
	accepted prometheus.Counter
	latency  prometheus.Observer
	merge    prometheus.Observer
	wait     [2]prometheus.Observer
}

func (o couponObserver) Accepted() { o.accepted.Inc() }

func (o couponObserver) Final(r model.CouponRequest, issued bool, reason model.CouponReason, now time.Time) {
	if !issued {
		o.m.refused.WithLabelValues(o.space, string(reason), r.Batch).Inc()
		return
	}
	o.m.issued.WithLabelValues(o.space, r.Batch).Inc()
	if r.AcceptedMS > 0 {
		o.latency.Observe(now.Sub(time.UnixMilli(r.AcceptedMS)).Seconds())
	}
}

func (o couponObserver) Waited(layer int, d time.Duration) {
	if layer == 1 || layer == 2 {
		o.wait[layer-1].Observe(d.Seconds())
	}
}

func (o couponObserver) Merged(_ string, n int) { o.merge.Observe(float64(n)) }

func (o couponObserver) LeftOpen(batch string, units int64) {
	o.m.open.WithLabelValues(o.space, batch).Add(float64(units))
}
