package cell

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/audit"
	"redcell/cell/relay"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// The shadow cleanup: stress traffic leaves rows in the shadow databases
// (shadow_db_XX) and copies in memcached that nothing ever removes. A cell
// drops its shadow space on POST /admin/shadow/cleanup (redcell bench
// --cleanup calls it on every cell), and by itself once it has served no
// stress traffic for Config.ShadowRetention. Dropping puts the space back in
// the state of a cell that never served stress traffic, which every path
// already handles: the store makes tables on first use.
//
// What runs beside a drop, and why none of it leaves a difference in the
// audit of the shadow space afterwards:
//   - the drop waits until the cell has served no stress traffic for
//     ReconSettle + ReconInterval and a little more (p.quiet): the other
//     cells' reconciliation asks this cell for the credits of their claims
//     until then, and would find the dropped ones missing;
//   - stress requests (public and cell to cell) are refused with 503
//     OVERLOADED while the space is closed, and the drop waits for those in
//     flight: no open, send or credit writes during it;
//   - the shadow relay is switched off while closed: its lanes let go of
//     every credit they hold, and the drop waits until they hold none,
//     before and after it; after the drop the relay forgets every credit it
//     held and every position (relay.Reset), so a credit of a dropped claim
//     is never applied to the new tables;
//   - the audit is held (audit.Auditor.Hold) before the space closes: no
//     audit reads a space half dropped, and a long audit does not keep the
//     space closed;
//   - the shadow budget leases go back to their homes first (the pool takes
//     new ones after); the expiry, booking and coupon loops that took rows
//     before the drop find them gone after it and write nothing (their
//     transactions lock the rows first). The coupon engine's held leases
//     (couponq, at most 10 s old) are closed once idle for 250 ms, which a
//     closed space normally is; one still held at the reopen may serve a
//     merge whose coupons name a lease the new stock row never granted
//     (coupons are not in the cell's audit; redcell audit --shadow reads
//     them);
//   - after the drop the store has forgotten the tables it made, the
//     closed-packet set is empty and the grab cache reads a new generation
//     of shadow keys, so nothing describes a dropped packet.

// ShadowDropper drops the shadow databases of a cell's MariaDB server:
// storage.MySQL.DropShadow of the store behind Stores.Shadow (the same
// value, so that its record of the tables it made is the one forgotten).
type ShadowDropper interface {
	// DropShadow drops the shadow databases of db indexes dbs that exist and
	// answers them and the tables they held; none left, it drops nothing.
	DropShadow(ctx context.Context, dbs []int) (dropped []string, tables int, err error)
}

var _ ShadowDropper = (*storage.MySQL)(nil)

// auditHolder is what the cleanup needs of the audit: no audit while it
// drops (audit.Auditor.Hold).
type auditHolder interface {
	Hold(ctx context.Context) (release func(), err error)
}

var _ auditHolder = (*audit.Auditor)(nil)

// The cleanup's bounds. Past one, the cleanup gives up, drops nothing and
// answers OVERLOADED (retryable): a cell under stress traffic it cannot
// drain is told so rather than held closed.
const (
	// shadowCheckEvery is how often the age rule is checked: a drop by age
	// comes at most this long after the retention has passed.
	shadowCheckEvery = 10 * time.Minute
	// shadowCleanupMax bounds a whole cleanup, the drop of up to 100
	// databases included.
	shadowCleanupMax = 5 * time.Minute
	// shadowRequestsWait: every request ends by its deadline, at most
	// internalTimeout; a little more for the answer to be written.
	shadowRequestsWait = internalTimeout + 5*time.Second
	// shadowRelayWait: a lane lets go of its credits at its next step, after
	// an attempt in flight (at most 5 s) or a backoff pause (at most 5 s).
	shadowRelayWait = 15 * time.Second
	// shadowAuditWait: an audit of a small shadow space takes seconds; one
	// of a large real space may take minutes, and the cleanup is asked again.
	shadowAuditWait = time.Minute
	// shadowSeenEvery: the time of the last stress request is written at
	// most this often, so a bench's requests share the value read-mostly.
	shadowSeenEvery = time.Second
	// shadowPoll is how often the cleanup looks again at what it waits for.
	shadowPoll = 10 * time.Millisecond
)

// Reasons of a cleanup (label reason of the metrics, reason of the answer).
const (
	shadowReasonAdmin = "admin"
	shadowReasonAge   = "age"
)

// errShadowClosed answers a stress request while the space is dropped.
var errShadowClosed = model.Errorf(model.ErrOverloaded, "this cell is dropping its shadow tables (a shadow cleanup); retry in a few seconds")

// shadowParts are what a shadowCleaner is built from; it holds no Server.
type shadowParts struct {
	cell      string
	drop      ShadowDropper // nil: nothing to drop (no MariaDB shadow store): cleanups answer NOT_FOUND, no drop by age
	dbs       func() []int  // the databases the cell owns now
	retention time.Duration // Config.ShadowRetention; 0: no drop by age
	every     time.Duration // how often the age rule is checked (shadowCheckEvery)
	quiet     time.Duration // how long after the last stress traffic a drop may begin (shadowQuiet)
	relayHeld func() int    // credits the shadow relay's lanes hold
	audits    auditHolder
	// settle runs once stress requests have stopped, before the drop: the
	// shadow budget leases go back to their homes. Its error is logged.
	settle func(ctx context.Context) error
	// forget runs after the drop: the in-process state that described the
	// dropped rows goes (closed packets, grab-cache copies).
	forget func()
	clock  clock.Clock
	log    *slog.Logger
}

// shadowCleaner drops the shadow space and holds stress traffic off while
// it does (enter, leave). Safe for concurrent use; one cleanup at a time.
type shadowCleaner struct {
	p shadowParts

	closed   atomic.Bool  // a cleanup holds the space: stress requests are refused, the shadow relay is off
	inflight atomic.Int64 // stress requests admitted and not done
	lastMS   atomic.Int64 // Unix ms of the last stress traffic (enter with traffic); the start until the first
	dropped  atomic.Bool  // dropped since the last stress traffic: the age rule has nothing to drop
	mu       sync.Mutex   // held by the cleanup that runs
	// waited counts the looks of a cleanup's waits that found what they
	// wait for not yet done (waitUntil): a cleanup that looked again and
	// goes on waiting has not dropped.
	waited atomic.Int64

	cleanups, failures *prometheus.CounterVec // by reason
}

// newShadowCleaner builds the cleaner and registers its metrics with reg.
// The start counts as the last stress traffic, so a restart never drops at
// once; it does no I/O.
func newShadowCleaner(p shadowParts, reg prometheus.Registerer) *shadowCleaner {
	p.clock = clock.Or(p.clock)
	c := &shadowCleaner{p: p,
		cleanups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_shadow_cleanups_total",
			Help: "Shadow space cleanups done (the stress traffic's shadow databases dropped), by reason: admin (POST /admin/shadow/cleanup), age (no stress traffic for shadow_retention)."},
			[]string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_shadow_cleanup_failures_total",
			Help: "Shadow space cleanups that failed or gave up (stress requests, the shadow relay or an audit did not end in time, or the database failed), by reason."},
			[]string{"reason"}),
	}
	c.lastMS.Store(c.p.clock.Now().UnixMilli())
	last := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_shadow_last_stress_timestamp_seconds",
		Help: "When the cell last served stress traffic (a public request or a relayed credit with X-Redcell-Stress), Unix seconds; its start until then. shadow_retention after it the shadow space is dropped."},
		func() float64 { return float64(c.lastMS.Load()) / 1000 })
	closed := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_shadow_closed",
		Help: "1 while a shadow cleanup holds the shadow space (stress requests answered 503 OVERLOADED, the shadow relay off), else 0."},
		func() float64 { return b2f(c.closed.Load()) })
	reg.MustRegister(c.cleanups, c.failures, last, closed)
	for _, r := range []string{shadowReasonAdmin, shadowReasonAge} { // every series from the start, at 0
		c.cleanups.WithLabelValues(r)
		c.failures.WithLabelValues(r)
	}
	return c
}

// enter admits a stress request, or answers errShadowClosed while a cleanup
// holds the space. traffic says whether it counts as stress traffic for the
// age rule. An admitted request calls leave when it is done.
func (c *shadowCleaner) enter(traffic bool) error {
	// Counted first, then the flag read; the cleanup sets the flag first,
	// then reads the count: one of the two sees the other.
	c.inflight.Add(1)
	if c.closed.Load() {
		c.inflight.Add(-1)
		return errShadowClosed
	}
	if traffic {
		now := c.p.clock.Now().UnixMilli()
		if now-c.lastMS.Load() >= shadowSeenEvery.Milliseconds() {
			c.lastMS.Store(now)
		}
		if c.dropped.Load() {
			c.dropped.Store(false)
		}
	}
	return nil
}

// leave ends a request enter admitted.
func (c *shadowCleaner) leave() { c.inflight.Add(-1) }

// isClosed reports whether a cleanup holds the space now.
func (c *shadowCleaner) isClosed() bool { return c.closed.Load() }

// CleanShadow implements admin.ShadowCleanup.
func (c *shadowCleaner) CleanShadow(ctx context.Context) (api.ShadowCleanupResponse, error) {
	return c.cleanup(ctx, shadowReasonAdmin)
}

// run drops the shadow space whenever the cell has served no stress traffic
// for the retention (checked every p.every), once: the next drop waits for
// new stress traffic and the retention after it. Nothing with no retention
// or nothing to drop. It returns when ctx ends.
func (c *shadowCleaner) run(ctx context.Context) {
	if c.p.drop == nil || c.p.retention <= 0 {
		return
	}
	clock.Every(ctx, c.p.clock, c.p.every, func(int) {
		if c.dropped.Load() || c.p.clock.Now().Sub(time.UnixMilli(c.lastMS.Load())) < c.p.retention {
			return
		}
		_, _ = c.cleanup(ctx, shadowReasonAge) // logged and counted; the next check tries again
	})
}

// cleanup drops the shadow space of the databases the cell owns and answers
// what it dropped. It waits for a cleanup that runs. Errors: ErrNotFound
// (nothing to drop with), ErrOverloaded (what it waits for did not end in
// time; nothing dropped), the database's.
func (c *shadowCleaner) cleanup(ctx context.Context, reason string) (api.ShadowCleanupResponse, error) {
	if c.p.drop == nil {
		return api.ShadowCleanupResponse{}, model.Errorf(model.ErrNotFound, "cell %s has no shadow databases it can drop", c.p.cell)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	start := c.p.clock.Now()
	out := api.ShadowCleanupResponse{Cell: c.p.cell, Databases: []string{}, Reason: reason, IdleMS: start.UnixMilli() - c.lastMS.Load()}
	ctx, cancel := context.WithTimeout(ctx, shadowCleanupMax)
	defer cancel()
	err := c.dropClosed(ctx, &out)
	out.TookMS = c.p.clock.Now().Sub(start).Milliseconds()
	if err != nil {
		c.failures.WithLabelValues(reason).Inc()
		c.p.log.Warn("shadow cleanup failed", "reason", reason, "dropped", len(out.Databases), "err", err)
		return out, err
	}
	c.dropped.Store(true)
	c.cleanups.WithLabelValues(reason).Inc()
	c.p.log.Info("shadow space dropped", "reason", reason, "databases", len(out.Databases), "tables", out.Tables,
		"owned", out.Owned, "idle", time.Duration(out.IdleMS)*time.Millisecond, "took_ms", out.TookMS)
	return out, nil
}

// dropClosed holds the audit, closes the space, waits for what uses it,
// drops it and opens it again; out gets what was dropped.
func (c *shadowCleaner) dropClosed(ctx context.Context, out *api.ShadowCleanupResponse) error {
	if idle := c.p.clock.Now().Sub(time.UnixMilli(c.lastMS.Load())); idle < c.p.quiet {
		c.p.log.Info("shadow cleanup waits for the reconciliation of the last stress traffic", "idle", idle, "quiet", c.p.quiet)
		quiet := func() bool { return c.p.clock.Now().Sub(time.UnixMilli(c.lastMS.Load())) >= c.p.quiet }
		if err := c.waitUntil(ctx, shadowCleanupMax, "the stress traffic", quiet); err != nil {
			return err
		}
	}
	hctx, cancel := context.WithTimeout(ctx, shadowAuditWait)
	release, err := c.p.audits.Hold(hctx)
	cancel()
	if err != nil {
		return err
	}
	defer release()
	c.closed.Store(true)
	defer c.closed.Store(false)
	if err := c.waitUntil(ctx, shadowRequestsWait, "the stress requests in flight", func() bool { return c.inflight.Load() == 0 }); err != nil {
		return err
	}
	if err := c.p.settle(ctx); err != nil {
		c.p.log.Warn("shadow cleanup: budget leases not all given back; their homes settle them", "err", err)
	}
	relayIdle := func() bool { return c.p.relayHeld() == 0 }
	if err := c.waitUntil(ctx, shadowRelayWait, "the shadow relay's deliveries", relayIdle); err != nil {
		return err
	}
	dbs := c.p.dbs()
	out.Owned = len(dbs)
	dropped, tables, err := c.p.drop.DropShadow(ctx, dbs)
	c.p.forget() // after an error too: some databases may be gone
	if dropped != nil {
		out.Databases = dropped
	}
	out.Tables = tables
	if err != nil {
		return err
	}
	// A relay read of claims just before its database went hands them to
	// the lanes at once; while the relay is off they let them go.
	if err := c.waitUntil(ctx, shadowRelayWait, "the shadow relay's lanes", relayIdle); err != nil {
		c.p.log.Warn("shadow cleanup: the relay still holds credits of dropped claims", "err", err)
	}
	return nil
}

// waitUntil polls cond every shadowPoll on the cell's clock until it holds,
// for at most limit or ctx, counting each look that found it false
// (waited). The bound is a context's, on real time like every deadline; on
// a test's manual clock the cleanup looks again only when the test moves
// the clock. Errors: ErrOverloaded naming what did not end.
func (c *shadowCleaner) waitUntil(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for !cond() {
		c.waited.Add(1)
		select {
		case <-ctx.Done():
			return model.Errorf(model.ErrOverloaded, "shadow cleanup: %s did not end within %s; nothing was dropped, retry", what, limit)
		case <-c.p.clock.After(shadowPoll):
		}
	}
	return nil
}

// The cell's side: wiring and the state a cleanup resets.

// newShadow builds the cell's shadow cleaner over drop (Stores.ShadowDrop).
// The owned databases are read at each cleanup.
func (s *Server) newShadow(drop ShadowDropper, reg prometheus.Registerer) *shadowCleaner {
	sp := s.spaces[1]
	return newShadowCleaner(shadowParts{cell: s.cfg.Name, drop: drop, dbs: s.own.dbs, retention: s.cfg.ShadowRetention,
		every: shadowCheckEvery, quiet: shadowQuiet(s.cfg), relayHeld: func() int { return relayHeld(sp.relay) }, audits: s.parts.auditor, settle: s.budgets.Pool(1).ReturnAll,
		forget: func() { sp.closed.reset(); s.opens.cache.forgetShadow(); sp.relay.Reset() }, clock: s.clock, log: s.log}, reg)
}

// shadowQuiet is how long after its last stress traffic a cell may drop its
// shadow space: a claim another cell relayed here is reconciled there by
// ReconSettle + ReconInterval after it (the pass that reads its window),
// plus a pass's own time and the cells' clock skew (ReconInterval again, at
// most 10 s). Defaults: 100 s.
func shadowQuiet(cfg Config) time.Duration {
	return cfg.ReconSettle + cfg.ReconInterval + min(cfg.ReconInterval, 10*time.Second) + shadowSeenEvery
}

// enterSpace admits a request to space sp: a stress request is registered
// with the shadow cleaner, which refuses it while it drops the space (the
// refusal is answered here, and false returned). A public request or a
// relayed credit counts as stress traffic for the age rule; the other cells'
// maintenance calls (reconciliation, budget leases) do not, so idle cells do
// not keep each other's shadow space alive. Each admitted request calls
// leaveSpace when done.
func (s *Server) enterSpace(rc *fasthttp.RequestCtx, rt api.RouteID, sp *space) bool {
	if !sp.stress {
		return true
	}
	if err := s.parts.shadow.enter(api.RouteOf(rt).Public() || rt == api.RouteCredits); err != nil {
		s.answers.err(rc, err)
		return false
	}
	return true
}

// leaveSpace ends a request enterSpace admitted.
func (s *Server) leaveSpace(sp *space) {
	if sp.stress {
		s.parts.shadow.leave()
	}
}

// spaceRelayOff is the relay switch of space sp: the degrade switch, and for
// the shadow space also while a cleanup holds it. It is read by the relay's
// goroutines, which start with Serve, after New has made the cleaner.
func (s *Server) spaceRelayOff(sp *space, off func() bool) func() bool {
	if !sp.stress {
		return off
	}
	return func() bool {
		c := s.parts.shadow
		return off() || c != nil && c.isClosed()
	}
}

// relayHeld counts the credits r's lanes hold.
func relayHeld(r *relay.Relay) int {
	n := 0
	for _, l := range r.Lanes() {
		n += l.Held
	}
	return n
}

// reset empties the set: after a shadow cleanup none of its packets exists.
func (c *closedSet) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}

// key is sp's grab-cache key of packet id. A shadow key carries the
// generation of the shadow space ("s:" before the first cleanup, then "s1:",
// "s2:", ...): forgetShadow leaves every copy of a dropped packet unread,
// and memcached lets them go at their TTL (at most packet_expiry + 1 h). The
// generation is per process, as admission.Cache's keys are anyway.
func (g *grabCache) key(sp *space, id model.PacketID) string {
	if sp.stress {
		if gen := g.shadowGen.Load(); gen > 0 {
			return "s" + strconv.FormatInt(gen, 36) + ":" + string(id)
		}
	}
	return sp.cacheKey(id)
}

// forgetShadow starts a new generation of shadow keys (nil: no cache).
func (g *grabCache) forgetShadow() {
	if g != nil {
		g.shadowGen.Add(1)
	}
}
