package cell

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"redcell/api"
	"redcell/cell/admission"
	"redcell/cell/keyqueue"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Slots caps concurrent transactions per key (memcached CAS, admission.Slots).
type Slots interface {
	Acquire(ctx context.Context, key string) (release func(), err error)
	// Stats returns the CAS conflicts retried and the calls served by the
	// in-process fallback since the start, for the metrics.
	Stats() (casConflicts, fallbacks int64)
	// FallingBack reports whether memcached was unreachable at the last call.
	FallingBack() bool
}

// GrabCache is the cheap copy of each packet's remaining count.
type GrabCache interface {
	Get(key string) (admission.Remaining, bool)
	// Set writes the newest state (after a commit); Fill writes a state read
	// after a miss only if nothing newer is there.
	Set(key string, r admission.Remaining, ttl time.Duration)
	Fill(key string, r admission.Remaining, ttl time.Duration)
	// FallingBack reports whether the cache serves in-process copies now
	// (memcached unreachable) and how many calls those served since the start.
	FallingBack() (active bool, served int64)
}

// Peers tells where other cells are (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// space is one money namespace of the cell: real money, or the shadow tables
// that stress-test traffic (api.HeaderStress) reads and writes. Each has its own
// store, relay, closed-packet set and grab-cache keys.
type space struct {
	stress bool
	store  storage.Store
	relay  *relay
	closed closedSet
}

// cacheKey is the grab-cache key of a packet in this space.
func (sp *space) cacheKey(id model.PacketID) string {
	if sp.stress {
		return "s:" + string(id)
	}
	return string(id)
}

// Stores are the cell's two namespaces over its database.
type Stores struct {
	Real   storage.Store // users' money
	Shadow storage.Store // stress-test traffic; must not share tables with Real
}

// Server is one running cell. Create it with New, run it with Serve.
type Server struct {
	cfg    Config
	spaces [2]*space // [0] real money, [1] stress traffic
	slots  Slots
	cache  GrabCache
	peers  Peers
	log    *slog.Logger
	now    func() time.Time

	owned [model.ShardCount]bool
	queue *keyqueue.Queue[queueKey, *openJob]
	rngs  sync.Pool // *rand.Rand, one per worker at a time
	http  *fasthttp.Server

	strategy    atomic.Pointer[api.StrategySetting] // how opens run; SetStrategy changes it
	admin       *fasthttp.Server                    // nil without cfg.AdminListen
	noopBody    []byte                              // the no-op route's fixed answer
	draining    atomic.Bool
	schemaReady atomic.Bool
	stats       stats
	limiter     *rate.Limiter                   // the cell's own request rate (Config.RateLimitPerSec)
	bg          atomic.Pointer[context.Context] // background work's context, canceled when Serve drains (bgContext)
	signer      *api.Signer                     // signs relayed credits, checks every signed call (Config.ClusterSecret)
	refusal     []byte                          // the CELL_RATE_LIMITED answer, made once
	metrics     *metrics

	degraded     [switchCount]atomic.Bool // features switched off (SetDegrade)
	reconMetrics *reconMetrics
	auditor      *auditor
	inc          *incidents // repeated failures, logged when they start and end
}

// stats are the cell's counters (exported through /healthz).
type stats struct {
	opens, openBatches, shed, refunds, refundCents atomic.Int64
	relayed, relayDropped, relayErrors             atomic.Int64
	relayDeferred, relayMarkSkipped                atomic.Int64
}

// New wires a cell. It does no I/O. The cell's metrics are registered with reg,
// which GET /metrics on the admin port serves; reg belongs to this cell (one per
// process, never prometheus.DefaultRegisterer, so tests can run many cells).
func New(cfg Config, stores Stores, slots Slots, cache GrabCache, peers Peers, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if stores.Real == nil || stores.Shadow == nil {
		return nil, errors.New("cell: both a real and a shadow store are required")
	}
	s := &Server{cfg: cfg, slots: slots, cache: cache, peers: peers, log: log.With("cell", cfg.Name), now: time.Now}
	s.inc = newIncidents(s.log)
	for _, sh := range cfg.Shards.Shards() {
		s.owned[sh] = true
	}
	s.queue = keyqueue.New(keyqueue.Config{
		Depth: cfg.QueueDepth, MaxKeys: 200_000, BatchMax: 1, IdleStop: 2 * time.Second,
	}, s.openBatch)
	if err := s.SetStrategy(api.StrategySetting{Strategy: cfg.OpenStrategy, BatchMax: cfg.BatchMax, BatchWaitMS: int(cfg.BatchWait / time.Millisecond)}); err != nil {
		return nil, err
	}
	s.rngs.New = func() any {
		var seed [16]byte
		_, _ = rand.Read(seed[:])
		return mrand.New(mrand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))
	}
	s.spaces[0] = &space{store: stores.Real}
	s.spaces[1] = &space{stress: true, store: stores.Shadow}
	for _, sp := range s.spaces {
		sp.relay = newRelay(s, sp)
	}
	s.noopBody, _ = json.Marshal(api.NoopResponse{Cell: cfg.Name})
	s.signer = api.NewSigner(cfg.ClusterSecret)
	s.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimitPerSec), cfg.RateBurst)
	_, s.refusal = api.ErrorJSON(model.Errorf(model.ErrCellRateLimited, "cell %s is above its limit of %d requests/s; retry later", cfg.Name, cfg.RateLimitPerSec))
	s.setDegradeConfig(cfg.Degrade)
	s.metrics = newMetrics(s, reg)
	s.reconMetrics = newReconMetrics(reg)
	s.auditor = newAuditor(reg)
	s.http = &fasthttp.Server{
		Handler:            s.handle,
		Name:               "redcell-cell",
		MaxRequestBodySize: 1 << 20,
		ReadTimeout:        30 * time.Second,
		WriteTimeout:       30 * time.Second,
		IdleTimeout:        60 * time.Second,
		CloseOnShutdown:    true,
		ErrorHandler:       api.ProtocolError,
		Logger:             api.Logger{Log: s.log},
	}
	return s, nil
}

// Owns reports whether this cell owns shard sh.
func (s *Server) Owns(sh model.ShardID) bool { return sh.Valid() && s.owned[sh] }

// Listen binds the HTTP address (so callers know it is taken before announcing).
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cell: listen %s: %w", s.cfg.Listen, err)
	}
	return ln, nil
}

// Serve runs the cell on ln until ctx ends, then shuts down gracefully: stop
// taking requests and let in-flight ones finish, drain the open queues, deliver
// what the relay holds. Background work (schema warm-up, relay, expiry,
// reconciliation, the hourly audit) runs while it serves.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	bg, stopBG := context.WithCancel(context.Background())
	s.bg.Store(&bg)
	var wg sync.WaitGroup
	wg.Add(6)
	go func() {
		defer wg.Done()
		if s.cfg.WarmSchema {
			s.warmSchema(bg)
		}
	}()
	go func() { defer wg.Done(); s.spaces[0].relay.run(bg) }()
	go func() { defer wg.Done(); s.spaces[1].relay.run(bg) }()
	go func() { defer wg.Done(); s.expiryLoop(bg) }()
	go func() { defer wg.Done(); s.reconLoop(bg) }()
	go func() { defer wg.Done(); s.auditLoop(bg) }()

	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(ln) }()
	s.log.Info("cell serving", "addr", ln.Addr().String(), "shards", s.cfg.Shards.String(), "strategy", s.Strategy().Strategy)
	stopAdmin, aerr := s.serveAdmin()
	if aerr != nil {
		s.log.Error("admin port", "err", aerr)
	}
	defer stopAdmin()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	s.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if serr := s.http.ShutdownWithContext(sctx); serr != nil && err == nil {
		err = serr
	}
	s.queue.Close()
	s.queue.Wait()
	stopBG()
	wg.Wait()
	s.log.Info("cell stopped", "opens", s.stats.opens.Load(), "relayed", s.stats.relayed.Load())
	return err
}

// every calls fn(pass) every d until ctx ends; pass counts the calls from 0.
// The cell's periodic background work (expiry, reconciliation, audit) runs on it.
func every(ctx context.Context, d time.Duration, fn func(pass int)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for pass := 0; ; pass++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(pass)
		}
	}
}

// bgContext is the context of the cell's background work, canceled when Serve
// has drained the public port: long admin work (an audit) stops with it.
func (s *Server) bgContext() context.Context {
	if p := s.bg.Load(); p != nil {
		return *p
	}
	return context.Background()
}

// warmSchema creates the shard tables and today's and tomorrow's day tables
// before they are needed, then again each hour so tomorrow's always exist. A
// pass that fails (the database down, or its breaker open) is tried again
// after WarmRetry.
func (s *Server) warmSchema(ctx context.Context) {
	shards := s.cfg.Shards.Shards()
	for {
		start := s.now()
		days := []int{start.UTC().Day(), start.UTC().Add(24 * time.Hour).Day()}
		last := time.Now()
		err := s.spaces[0].store.EnsureDays(ctx, shards, days, 4, func(done, total int) {
			if time.Since(last) > 5*time.Second || done == total {
				last = time.Now()
				s.log.Info("creating day tables", "done", done, "shards", total, "days", days)
			}
		})
		next := time.Hour
		if err != nil && ctx.Err() == nil {
			s.inc.warmUp.Fail(err, "retry_in", s.cfg.WarmRetry.String())
			next = s.cfg.WarmRetry
		} else if err == nil {
			s.inc.warmUp.OK()
			s.schemaReady.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// spaceOf picks the namespace of a request: shadow tables for stress traffic.
func (s *Server) spaceOf(rc *fasthttp.RequestCtx) *space {
	if api.IsStress(&rc.Request.Header) {
		return s.spaces[1]
	}
	return s.spaces[0]
}

// internalTimeout bounds a cell-to-cell call (/internal/...) whose caller sent
// no shorter deadline: the relay sends its own (relayAttemptTimeout),
// reconciliation uses this one.
const internalTimeout = 10 * time.Second

// deadline rebuilds the request's context from the deadline header the router
// sends; without it the cell's RequestTimeout applies.
func (s *Server) deadline(rc *fasthttp.RequestCtx) (context.Context, context.CancelFunc) {
	limit := s.cfg.RequestTimeout
	if bytes.HasPrefix(rc.Path(), []byte("/internal/")) {
		limit = internalTimeout // a reconciliation call may take longer than a client request
	}
	d := s.now().Add(limit)
	if v := rc.Request.Header.Peek(api.HeaderDeadline); len(v) > 0 {
		if ms, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			if hd := time.UnixMilli(ms); hd.Before(d) {
				d = hd
			}
		}
	}
	return context.WithDeadline(context.Background(), d)
}

func (s *Server) writeJSON(rc *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.writeErr(rc, fmt.Errorf("cell: encode answer: %w", err))
		return
	}
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(api.HeaderCell, s.cfg.Name)
	rc.SetBody(b)
}

// writeErr answers err. A 5xx other than shedding and DB_UNAVAILABLE is a
// request failure (s.inc.request); serveRoute tells it of every other answer.
func (s *Server) writeErr(rc *fasthttp.RequestCtx, err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		err = model.ErrTimeout
	}
	status, body := api.ErrorJSON(err)
	switch {
	case errors.Is(err, model.ErrOverloaded), errors.Is(err, model.ErrTimeout), errors.Is(err, model.ErrShuttingDown),
		errors.Is(err, model.ErrDBUnavailable):
		// Load shedding is the system working as designed; it is counted, and a
		// log line per shed request would itself add load when it matters most.
		// DB_UNAVAILABLE too: the breaker logs its state changes and counts the
		// failures (redcell_breaker_*), so an outage is not one line per request.
		s.log.Debug("request shed", "path", string(rc.Path()), "err", err)
	case status >= 500:
		s.inc.request.Fail(err, "path", string(rc.Path()))
	}
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(api.HeaderCell, s.cfg.Name)
	code, _ := model.CodeOf(err)
	rc.Response.Header.Set(api.HeaderCode, code) // the router's metrics read it (api.WriteError sets it too)
	rc.SetBody(body)
}
