package cell

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"redcell/api"
	"redcell/api/httpmetrics"
	"redcell/cell/degrade"
	"redcell/cell/groupcommit"
	"redcell/cell/keyqueue"
	"redcell/cell/relay"
	"redcell/internal/clock"
	"redcell/model"
)

// routeLabels are the route label values of the cell's request metrics: the
// main port's routes of api.Match, indexed by api.RouteID.
var routeLabels = api.Labels(api.RouteMetrics)

// shedReason says why an open was dropped before its transaction.
type shedReason int

const (
	shedQueueFull shedReason = iota // the packet's FIFO (or the set of FIFOs) is full
	shedQueueWait                   // waited longer than QueueWaitMax
	shedDeadline                    // the request's deadline passed in the queue
	shedNoSlot                      // no memcached transaction slot within the transaction timeout
	shedShutdown                    // the queue is closed: the cell is draining
	shedCreditLag                   // the relay is behind with this cell.s credits (creditShed)
	shedReasons
)

var shedReasonNames = [shedReasons]string{"queue_full", "queue_wait", "deadline", "no_slot", "shutting_down", "credit_lag"}

// metrics are the cell's Prometheus series. Label values are all made in
// newMetrics; the hot path indexes arrays and calls atomic adds.
type metrics struct {
	requests  *httpmetrics.Requests
	limited   [api.RouteMetrics]prometheus.Counter // kind="cell", by api.RouteID
	shed      [shedReasons]prometheus.Counter
	queued    prometheus.Gauge // opens waiting in all FIFOs
	queueWait prometheus.Histogram
	batchSize prometheus.Histogram
	serve     fasthttp.RequestHandler // GET /metrics on the admin port

	// moves (cell/moves)
	moveSteps                          *prometheus.CounterVec // by op
	moveDrain                          prometheus.Histogram
	moveCopiesDropped, moveCopyChanged prometheus.Counter
	movePasses                         prometheus.Counter

	group groupMetrics
}

// groupMetrics describe the group commits (every write; opens under strategy grouped), by space
// (index as space.index()).
type groupMetrics struct {
	commits, failures [2]prometheus.Counter
	requests, ops     [2]prometheus.Observer
	wait, hold, took  [2]prometheus.Observer
}

// newGroupMetrics makes and registers the group-commit series; queued reads
// the requests waiting in the commit lanes.
func newGroupMetrics(reg *prometheus.Registry, queued func() int) groupMetrics {
	var g groupMetrics
	space := []string{"space"}
	commits := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_group_commits_total",
		Help: "Group commits that committed, by space: the transactions of every write, and of opens under strategy grouped."}, space)
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_group_commit_errors_total",
		Help: "Group commits that failed, by space: every request of the group got the error."}, space)
	sizes := prometheus.ExponentialBuckets(1, 2, 13) // 1 .. 4096 = GroupMax's bound
	requests := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_cell_group_requests",
		Help:    "Requests per committed group, by space (an open counts each request of its packet's batch, a credit batch each credit); _sum/_count is the mean group size.",
		Buckets: sizes}, space)
	ops := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_cell_group_ops",
		Help:    "Ops per committed group, by space (a packet's batch of opens, a send, a deposit or a credit batch is one op).",
		Buckets: sizes}, space)
	secs := []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5}
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_cell_group_wait_seconds",
		Help:    "Time the oldest op of a group waited in its commit lane before the group's commit began (behind the lane's previous commit, plus the hold), by space.",
		Buckets: secs}, space)
	hold := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_cell_group_hold_seconds",
		Help:    "Time a busy lane held a group open for more ops (the adaptive wait, at most group_wait; 0 on an idle lane), by space.",
		Buckets: append([]float64{0}, secs...)}, space)
	took := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_cell_group_commit_seconds",
		Help:    "Time one group's transaction took (CommitGroup), by space.",
		Buckets: secs}, space)
	for i, name := range [2]string{"real", "shadow"} {
		g.commits[i], g.failures[i] = commits.WithLabelValues(name), failures.WithLabelValues(name)
		g.requests[i], g.ops[i] = requests.WithLabelValues(name), ops.WithLabelValues(name)
		g.wait[i], g.hold[i], g.took[i] = wait.WithLabelValues(name), hold.WithLabelValues(name), took.WithLabelValues(name)
	}
	reg.MustRegister(commits, failures, requests, ops, wait, hold, took,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_group_queued",
			Help: "Requests waiting in the commit lanes for their group, both spaces together."}, func() float64 { return float64(queued()) }))
	return g
}

// observeGroup records one group (groupcommit.Config.Observe).
func (m *metrics) observeGroup(g groupcommit.Group) {
	i := g.Lane.Space
	if g.Err != nil {
		m.group.failures[i].Inc()
		return
	}
	m.group.commits[i].Inc()
	m.group.requests[i].Observe(float64(g.Requests))
	m.group.ops[i].Observe(float64(g.Ops))
	m.group.wait[i].Observe(g.Queued.Seconds())
	m.group.hold[i].Observe(g.Held.Seconds())
	m.group.took[i].Observe(g.Took.Seconds())
}

// metricSources are the parts of the cell its metrics read at each scrape.
type metricSources struct {
	queue     *keyqueue.Queue[queueKey, *openJob]
	stats     *stats
	spaces    [2]*space
	expiry    *expirer
	slots     Slots
	cache     GrabCache // nil: none
	switches  *degrade.Switches
	dbs       func() []int // the databases the cell serves now
	clock     clock.Clock
	inc       *incidents
	creditLag *prometheus.HistogramVec // newCreditLag: the relays observe it, newMetrics registers it
	groups    *groupcommit.Committer
}

// relayTotal sums one relay counter over both spaces.
func relayTotal(spaces [2]*space, f func(*relay.Stats) int64) int64 {
	return f(&spaces[0].relay.Stats) + f(&spaces[1].relay.Stats)
}

func newMetrics(reg *prometheus.Registry, s metricSources) *metrics {
	m := &metrics{
		requests: httpmetrics.New(reg, "redcell_cell_request_duration_seconds",
			"Time a cell took to answer a request, by route and answer code (OK or the error code); _count is the request count.", routeLabels),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "redcell_cell_open_queue_depth",
			Help: "Opens waiting in the per-packet FIFOs, all packets together."}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "redcell_cell_open_queue_wait_seconds",
			Help:    "Time an open waited in its packet's FIFO before a worker took it.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "redcell_cell_open_batch_size",
			Help:    "Opens committed by one open transaction (serial and naive: 1).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13)}), // 1 .. 4096 = BatchMax's bound
	}
	m.registerMoves(reg)
	limited := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_rate_limited_total",
		Help: "Requests refused by a rate limit, by kind (route, user at the router; cell at a cell) and route."}, []string{"kind", "route"})
	for r := range m.limited {
		m.limited[r] = limited.WithLabelValues("cell", routeLabels[r])
	}
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_shed_total",
		Help: "Opens dropped before their transaction, by reason."}, []string{"reason"})
	for r := range shedReasons {
		m.shed[r] = shed.WithLabelValues(shedReasonNames[r])
	}
	counter := func(name, help string, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	relayCounter := func(name, help string, f func(*relay.Stats) int64) prometheus.Collector {
		return counter(name, help, func() int64 { return relayTotal(s.spaces, f) })
	}
	reg.MustRegister(limited, shed, m.queued, m.queueWait, m.batchSize, s.creditLag,
		relayCounter("redcell_cell_relay_yields_total", "Times a relay lane began to hold back a batch because the cell was loaded with opens (at most relay.YieldMax each).", func(r *relay.Stats) int64 { return r.Yields.Load() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_open_queue_packets",
			Help: "Packets with a live FIFO worker."}, func() float64 { return float64(s.queue.Keys()) }),
		counter("redcell_cell_opens_total", "Claims made by opens (repeats not counted).", s.stats.opens.Load),
		counter("redcell_cell_credits_in_open_total", "Claims credited in their open's own transaction (a claimant of this cell): never held by the relay.", s.stats.creditedInOpen.Load),
		counter("redcell_cell_open_batches_total", "Open transactions committed by the FIFO workers.", s.stats.openBatches.Load),
		relayCounter("redcell_cell_relay_delivered_total", "Credits whose delivery the relay saw acknowledged (applied now or before).", func(r *relay.Stats) int64 { return r.Relayed.Load() }),
		relayCounter("redcell_cell_relay_errors_total", "Relay failures: claim reads, position reads and saves, and deliveries that failed, claims with no live owner.", func(r *relay.Stats) int64 { return r.Errors.Load() }),
		relayCounter("redcell_cell_relay_handoff_dropped_total", "Fresh claims no relay lane took at once (full, backing off, no owner; the relay holds them and offers them again).", func(r *relay.Stats) int64 { return r.Dropped.Load() }),
		relayCounter("redcell_cell_relay_deferred_total", "Credits the receiving store deferred because a wallet row they need was locked (each deferral counted; retried).", func(r *relay.Stats) int64 { return r.Deferred.Load() }),
		scansOf(s.spaces[0]), scansOf(s.spaces[1]),
		relayCounter("redcell_cell_relay_applied_elsewhere_total", "Credits not delivered because the cell they were sent to has them applied in its copy of the claimant's database, which another cell serves now (each logged at ERROR: the money sits in a copy no cell serves; never booked a second time).", func(r *relay.Stats) int64 { return r.Elsewhere.Load() }),
		relayCounter("redcell_cell_relay_held_total", "Credits held back, per attempt, because the cell they were sent to could not be asked whether it applied them before they go to another cell (the question failed, or it holds the claim with another account or amount).", func(r *relay.Stats) int64 { return r.Held.Load() }),
		relayCounter("redcell_cell_relay_unasked_total", "Credits delivered to another cell than the one they were sent to without asking it, because that cell is not in the shard map (removed after its databases moved with their rows, or down).", func(r *relay.Stats) int64 { return r.Unasked.Load() }),
		relayCounter("redcell_cell_relay_claim_reads_total", "Pages of claims the relay read from its store past a database's position (after a start, a database gained, a commit whose outcome was unknown, too much held).", func(r *relay.Stats) int64 { return r.Reads.Load() }),
		relayCounter("redcell_cell_relay_position_saves_total", "Saves of the relay's positions (one write for every database whose claims came or went, every relay.PositionEvery).", func(r *relay.Stats) int64 { return r.Saves.Load() }),
		dbOpsCollector{ops: &s.stats.dbOps, desc: prometheus.NewDesc("redcell_cell_db_ops_total",
			"Money operations committed in each database (both spaces; a database listed once it had one): the per-database load redcell plan --rate-window balances.", []string{"db"}, nil)},
		laneCollector{spaces: s.spaces,
			credits: prometheus.NewDesc("redcell_cell_relay_lane_credits", "Credits a relay lane holds (queued, in flight or waiting to be tried again), by space, destination cell and kind (local: this cell's own wallets; remote).", []string{"space", "dest", "kind"}, nil),
			backoff: prometheus.NewDesc("redcell_cell_relay_lane_backoff_seconds", "A relay lane's pause after failed deliveries (0: the last one succeeded), by space, destination cell and kind.", []string{"space", "dest", "kind"}, nil),
		},
		counter("redcell_cell_refunds_total", "Expired packets refunded.", s.expiry.refunds.Load),
		counter("redcell_cell_refunded_cents_total", "Cents refunded to senders of expired packets.", s.expiry.refundCents.Load),
		counter("redcell_memcached_cas_conflicts_total", "Transaction-slot CAS conflicts retried.", func() int64 { c, _ := s.slots.Stats(); return c }),
		counter("redcell_memcached_fallbacks_total", "Transaction-slot calls served in-process because memcached failed or its breaker is open.", func() int64 { _, f := s.slots.Stats(); return f }),
		counter("redcell_grab_cache_fallbacks_total", "Grab-cache calls served by the in-process copies because memcached failed or its breaker is open.", func() int64 {
			if s.cache == nil {
				return 0
			}
			_, n := s.cache.FallingBack()
			return n
		}),
		newFallbackGauges(s.slots, s.cache),
		s.switches.Collector(),
		heldOf(s.spaces[0]), heldOf(s.spaces[1]),
	)
	m.group = newGroupMetrics(reg, s.groups.Queued)
	m.serve = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return m
}

// newCreditLag is redcell_credit_lag_seconds{space, kind}: the time from a
// claim's creation (its open's transaction) to the moment the relay learns
// its credit is applied in the claimant's wallet: the local store's answer
// (kind="local") or the owning cell's (kind="remote"). A credit delivered
// twice is observed twice (relay.Config.CreditLag). The bench reads its p99;
// the festival target is 1 s, so the buckets are dense around it.
func newCreditLag() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_credit_lag_seconds",
		Help:    "Time from a claim's creation to its credit being acknowledged as applied in the claimant's wallet, by space and kind (local: this cell's wallets; remote: another cell's), observed by the relay of the cell that made the claim.",
		Buckets: []float64{.005, .01, .025, .05, .1, .2, .3, .5, .75, 1, 1.5, 2.5, 5, 10, 30, 60, 300}},
		[]string{"space", "kind"})
}

// creditLagOf is relay.Config.CreditLag for space: it observes into lag.
func creditLagOf(lag *prometheus.HistogramVec, space string) func(local bool, d time.Duration) {
	local, remote := lag.WithLabelValues(space, "local"), lag.WithLabelValues(space, "remote")
	return func(isLocal bool, d time.Duration) {
		if isLocal {
			local.Observe(d.Seconds())
			return
		}
		remote.Observe(d.Seconds())
	}
}

// scansOf is redcell_cell_relay_scans_total{space}: the Intervals the
// space's relay worked (the tests wait for them to see that a pass ran).
func scansOf(sp *space) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_cell_relay_scans_total",
		Help: "Relay passes finished (every RelayInterval: held credits offered again, claims read where needed, positions saved), by space.", ConstLabels: prometheus.Labels{"space": sp.name}},
		func() float64 { return float64(sp.relay.Stats.Scans.Load()) })
}

// heldOf is redcell_cell_credits_pending{space} and
// redcell_cell_credits_pending_oldest_seconds{space}: what the space's
// relay holds, read from its memory when scraped.
func heldOf(sp *space) prometheus.Collector {
	return heldCollector{sp: sp,
		pending: prometheus.NewDesc("redcell_cell_credits_pending", "Claims not yet known credited in their claimant's wallet: those the relay holds, by space (real, shadow). Claims it has not read back yet after a start are not counted until it has.", nil, prometheus.Labels{"space": sp.name}),
		oldest:  prometheus.NewDesc("redcell_cell_credits_pending_oldest_seconds", "Age of the oldest claim the relay holds not yet known credited (0: none), by space.", nil, prometheus.Labels{"space": sp.name}),
	}
}

type heldCollector struct {
	sp              *space
	pending, oldest *prometheus.Desc
}

func (c heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pending; ch <- c.oldest }

func (c heldCollector) Collect(ch chan<- prometheus.Metric) {
	n, oldestMS := c.sp.relay.Held()
	age := 0.0
	if oldestMS > 0 {
		age = max(float64(c.sp.relay.Now().UnixMilli()-oldestMS)/1000, 0)
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
}

// newFallbackGauges: redcell_memcached_fallback{use} is 1 while that user of
// memcached (slots, grab_cache) falls back to in-process, 0 when it uses memcached.
func newFallbackGauges(slots Slots, cache GrabCache) prometheus.Collector {
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_memcached_fallback",
		Help: "1 while a user of memcached (use: slots, grab_cache) falls back to in-process because memcached is unreachable."}, []string{"use"})
	return funcCollector{v, func() {
		v.WithLabelValues("slots").Set(b2f(slots.FallingBack()))
		active := false
		if cache != nil {
			active, _ = cache.FallingBack()
		}
		v.WithLabelValues("grab_cache").Set(b2f(active))
	}}
}

// funcCollector refreshes a vector's values right before each scrape.
type funcCollector struct {
	*prometheus.GaugeVec
	refresh func()
}

func (f funcCollector) Collect(ch chan<- prometheus.Metric) { f.refresh(); f.GaugeVec.Collect(ch) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// dbOpsCollector reports redcell_cell_db_ops_total for the databases that
// had an operation (at most model.DBCount series).
type dbOpsCollector struct {
	ops  *[model.DBCount]atomic.Int64
	desc *prometheus.Desc
}

func (c dbOpsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c dbOpsCollector) Collect(ch chan<- prometheus.Metric) {
	for db := range c.ops {
		if n := c.ops[db].Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), fmt.Sprintf("%02d", db))
		}
	}
}

// laneCollector reports the relay lanes of both spaces when scraped: at most
// lanesMax+1 per space, so the label values stay bounded.
type laneCollector struct {
	spaces           [2]*space
	credits, backoff *prometheus.Desc
}

func (c laneCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.credits; ch <- c.backoff }

func (c laneCollector) Collect(ch chan<- prometheus.Metric) {
	for _, sp := range c.spaces {
		for _, l := range sp.relay.Lanes() {
			kind := "remote"
			if l.Local {
				kind = "local"
			}
			ch <- prometheus.MustNewConstMetric(c.credits, prometheus.GaugeValue, float64(l.Held), sp.name, l.Dest, kind)
			ch <- prometheus.MustNewConstMetric(c.backoff, prometheus.GaugeValue, l.Backoff.Seconds(), sp.name, l.Dest, kind)
		}
	}
}

// registerMoves makes and registers the moves' series (cell/moves).
func (m *metrics) registerMoves(reg prometheus.Registerer) {
	m.moveSteps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_move_steps_total",
		Help: "Steps of database moves this cell took (POST /admin/moves), by op: freeze, thaw, release, adopt."}, []string{"op"})
	m.moveDrain = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "redcell_cell_move_drain_seconds",
		Help:    "Time a move's freeze waited for the work in flight on the database before it answered.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}})
	m.moveCopiesDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "redcell_cell_move_copies_dropped_total",
		Help: "Copies of databases handed over to another cell dropped after move_grace, unchanged since the handover."})
	m.moveCopyChanged = prometheus.NewCounter(prometheus.CounterOpts{Name: "redcell_cell_move_copy_changed_total",
		Help: "Times a copy of a database handed over was found changed since the handover (kept, logged at ERROR): should stay 0."})
	m.movePasses = prometheus.NewCounter(prometheus.CounterOpts{Name: "redcell_cell_move_passes_total",
		Help: "Passes of the cell's moves loop (every second): freezes past their time ended, copies due for a drop dropped."})
	reg.MustRegister(m.moveSteps, m.moveDrain, m.moveCopiesDropped, m.moveCopyChanged, m.movePasses)
}
