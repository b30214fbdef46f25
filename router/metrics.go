package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"redcell/api/httpmetrics"
	"redcell/internal/climit"
	"redcell/model"
	"redcell/router/rules"
)

// b2f is 1 for true, 0 for false (a gauge of a state).
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Rejection kinds of redcell_rate_limited_total.
const (
	limitRoute = iota // the route's token bucket (RATE_LIMITED)
	limitUser         // the act_id's token bucket (USER_RATE_LIMITED)
	limitKinds
	// limitDegraded indexes the prepared DEGRADED answers (Router.refusals),
	// after the kinds of redcell_rate_limited_total.
	limitDegraded = limitKinds
)

// verdictNames label redcell_router_rules_refused_total, by rules.Verdict.
var verdictNames = [...]string{rules.Pass: "", rules.Degraded: "degraded", rules.Blocked: "blocked", rules.Limited: "limited"}

var limitKindNames = [limitKinds]string{"route", "user"}

// limitCodes are the error codes of the refusals, by kind.
var limitCodes = [limitKinds]string{model.ErrRateLimited.Code, model.ErrUserRateLimited.Code}

// metrics are the router's Prometheus series; every label value is made here,
// so the request path only indexes arrays.
type metrics struct {
	requests *httpmetrics.Requests
	limited  [limitKinds][routeCount]prometheus.Counter
	ruled    [len(verdictNames)][routeCount]prometheus.Counter // by rules.Verdict (not Pass)
	serve    fasthttp.RequestHandler                           // GET /metrics
}

func newMetrics(reg *prometheus.Registry, users *userLimits, shared *climit.Buckets, fallingBack func() bool) *metrics {
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
	ruled := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_router_rules_refused_total",
		Help: "Requests the rules file refused, by verdict (degraded: the route's degrade switch; blocked, limited: an anti-abuse rule) and route."},
		[]string{"verdict", "route"})
	for v := rules.Degraded; int(v) < len(verdictNames); v++ {
		for r := routeOther + 1; r < routeCount; r++ {
			m.ruled[v][r] = ruled.WithLabelValues(verdictNames[v], routeNames[r])
		}
	}
	// The cluster-wide per-user limit's fallback (0 without Shared).
	sharedStat := func(f func(climit.BucketsStats) int64) func() float64 {
		return func() float64 {
			if shared == nil {
				return 0
			}
			return float64(f(shared.Stats()))
		}
	}
	reg.MustRegister(ruled,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_router_shared_limits_fallback",
			Help: "1 while the cluster-wide limits are on their local fallback of limit/N (memcached failed within the last second), else 0."},
			func() float64 { return b2f(fallingBack()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_router_shared_limit_failures_total",
			Help: "memcached calls of the cluster-wide per-user limit that failed (each puts the router on its fallback for a second)."},
			sharedStat(func(s climit.BucketsStats) int64 { return s.Failures })))
	reg.MustRegister(limited, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_router_user_limiters",
		Help: "act_ids with a per-user rate limiter in memory (bounded by user_rate_limit.max_users)."},
		func() float64 { return float64(users.size()) }))
	m.serve = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return m
}
