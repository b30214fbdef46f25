package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"redcell/internal/httpmetrics"
	"redcell/model"
)

// Rejection kinds of redcell_rate_limited_total.
const (
	limitRoute = iota // the route's token bucket (RATE_LIMITED)
	limitUser         // the act_id's token bucket (USER_RATE_LIMITED)
	limitKinds
)

var limitKindNames = [limitKinds]string{"route", "user"}

// limitCodes are the error codes of the refusals, by kind.
var limitCodes = [limitKinds]string{model.ErrRateLimited.Code, model.ErrUserRateLimited.Code}

// metrics are the router's Prometheus series; every label value is made here,
// so the request path only indexes arrays.
type metrics struct {
	requests *httpmetrics.Requests
	limited  [limitKinds][routeCount]prometheus.Counter
	serve    fasthttp.RequestHandler // GET /metrics
}

func newMetrics(reg *prometheus.Registry, users *userLimits) *metrics {
	names := routeNames[:]
	m := &metrics{requests: httpmetrics.New(reg, "redcell_router_request_duration_seconds",
		"Time from a request's arrival at the router to its answer, by route and answer code (OK or the error code); _count is the request count.", names)}
	limited := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_rate_limited_total",
		Help: "Requests refused by a rate limit, by kind (route, user at the router; cell at a cell) and route."}, []string{"kind", "route"})
	for k := range limitKinds {
		for r := routeOther + 1; r < routeCount; r++ {
			m.limited[k][r] = limited.WithLabelValues(limitKindNames[k], routeNames[r])
		}
	}
	reg.MustRegister(limited, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_router_user_limiters",
		Help: "act_ids with a per-user rate limiter in memory (bounded by user_rate_limit.max_users)."},
		func() float64 { return float64(users.size()) }))
	m.serve = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return m
}
