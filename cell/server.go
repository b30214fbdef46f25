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
	"redcell/api/cellclient"
	"redcell/cell/admin"
	"redcell/cell/admission"
	"redcell/cell/audit"
	"redcell/cell/budgets"
	"redcell/cell/couponq"
	"redcell/cell/coupons"
	"redcell/cell/degrade"
	"redcell/cell/groupcommit"
	"redcell/cell/keyqueue"
	"redcell/cell/moves"
	"redcell/cell/recon"
	"redcell/cell/relay"
	"redcell/cell/rewards"
	"redcell/cell/wallet"
	"redcell/internal/clock"
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
	name   string // "real" or "shadow": metric labels and logs
	store  storage.Store
	relay  *relay.Relay
	closed closedSet
	behind behindReading // the relay's last Behind, for creditShed
}

// cacheKey is the grab-cache key of a packet in this space.
func (sp *space) cacheKey(id model.PacketID) string {
	if sp.stress {
		return "s:" + string(id)
	}
	return string(id)
}

// index is 0 for the real space, 1 for the shadow one.
func (sp *space) index() int {
	if sp.stress {
		return 1
	}
	return 0
}

// spaces are the cell's two: [0] real money, [1] stress traffic.
type spaces [2]*space

// of picks the space of a request: the shadow one for stress traffic.
func (sps spaces) of(rc *fasthttp.RequestCtx) *space {
	if api.IsStress(&rc.Request.Header) {
		return sps[1]
	}
	return sps[0]
}

// redrive hands claims reconciliation found uncredited past their settle
// time to the relay of the space named space (recon.Config.Redrive).
func (sps spaces) redrive(space string, cs []model.Credit) {
	for _, sp := range sps {
		if sp.name == space {
			sp.relay.Redrive(cs)
		}
	}
}

// Stores are the cell's two namespaces over its database.
type Stores struct {
	Real   storage.Store // users' money
	Shadow storage.Store // stress-test traffic; must not share tables with Real
	// RealCoupons and ShadowCoupons are the coupon requests and coupons of
	// each space, over the same databases; both are required when
	// Config.Coupons names a batches file.
	RealCoupons, ShadowCoupons couponq.Store
	// ShadowDrop drops the shadow databases: the store behind Shadow
	// (storage.MySQL); nil: the shadow space is never dropped (shadow.go).
	ShadowDrop ShadowDropper
	// Moves keeps the cell's ownership and its moved-out databases
	// (storage.MySQL); nil: the cell refuses the steps of a move.
	Moves MoveStore
}

// creditDester is a store that names, in each new claim row, the cell its
// credit goes to (storage.MySQL and memstore.Store: SetCreditDest).
type creditDester interface {
	SetCreditDest(dest func(model.ShardID) string)
}

// creditDest names the cell a credit to a claimant of shard sh goes to now:
// this cell when it owns sh, else the shard map's owner ("" when none). New
// claim rows record it (model.Credit.Dest).
func (s *Server) creditDest(sh model.ShardID) string {
	if s.own.owns(sh) {
		return s.cfg.Name
	}
	if s.peers == nil {
		return ""
	}
	if c, ok := s.peers.Map().Owner(sh); ok {
		return c.Name
	}
	return ""
}

// Server is one running cell: it routes and admits requests and runs the
// open path itself; its other jobs are parts built from narrow interfaces:
// the writer and its group committer (cell/groupcommit), a relay per space
// (cell/relay), the route bodies of accounts, packets and credits,
// reconciliation (cell/recon), the audit of its own books (cell/audit), the
// budgets' leases (cell/budgets), the rewards (cell/rewards), the wallet's
// routes and withdrawals (cell/wallet), the coupon drop (cell/coupons), the
// admin port (cell/admin), the expiry of packets and the schema warm-up; Serve
// starts those that run. None of them holds the Server. Create it with New,
// run it with Serve.
type Server struct {
	// What the parts are built from.
	cfg      Config
	clock    clock.Clock
	log      *slog.Logger
	spaces   spaces // [0] real money, [1] stress traffic
	own      *ownership
	peers    Peers
	answers  answers           // writes answers and error answers
	inc      *incidents        // repeated failures, logged when they start and end
	switches *degrade.Switches // features switched off (a guard, read by the parts and the relay)
	// budgets spends the leases of the scenes that control their stock and
	// of the coupon batches, and homes their budgets (cell/budgets).
	budgets *budgets.Keeper

	gate    gate     // the HTTP server and the checks every request passes
	opens   openPath // the open path's state (open.go)
	writer  *writer  // every write of money, through the commit lanes (group.go)
	metrics *metrics
	parts   parts // the route bodies and the background passes
}

// gate is what a request passes on its way in, before its route's handler
// (handle, serveRoute), and the server it comes through. The degrade
// switches are a guard too, held by the Server: the parts are built with
// them.
type gate struct {
	http     *fasthttp.Server
	signer   *api.Signer   // checks every signed call (Config.ClusterSecret)
	limiter  *rate.Limiter // the cell's own request rate (Config.RateLimitPerSec)
	refusal  []byte        // the CELL_RATE_LIMITED answer, made once
	noopBody []byte        // the no-op route's and /livez's fixed answer
	draining atomic.Bool   // set by Serve once it stops taking requests
}

// openPath is the state of the open path (open.go): the per-packet FIFOs,
// how opens run, the transaction slots, the split's random sources, the
// grab cache and the open path's counters.
type openPath struct {
	queue    *keyqueue.Queue[queueKey, *openJob]
	strategy *openStrategy // how opens run; the admin port switches it
	slots    Slots
	cache    *grabCache // nil without a GrabCache
	rngs     sync.Pool  // *rand.Rand, one per worker at a time
	stats    stats
}

// parts are the cell's jobs but routing, admission and the open path, each
// a type of its own built in New from what it uses; none holds the Server.
// serveRoute hands requests to the route bodies; Serve starts the passes
// and the admin port. (The budget keeper is one too, held by the Server.)
type parts struct {
	accounts *accounts       // account, deposit, identity (accounts.go)
	packets  *packets        // send, grab, detail (packets.go)
	credits  *creditRoutes   // /internal/credits, /internal/recon (creditroutes.go)
	coupons  *coupons.Drop   // the coupon drop and its routes (cell/coupons); nil without Config.Coupons
	rewards  *rewards.Issuer // issues and books the rewards, their tokens and reconciliation (cell/rewards)
	wallet   *wallet.Teller  // the wallet's routes and withdrawals (cell/wallet)

	expiry  *expirer
	archive *archiver
	warmer  *warmer
	recon   *recon.Reconciler
	auditor *audit.Auditor
	shadow  *shadowCleaner // drops the shadow space, holds stress traffic off meanwhile (shadow.go)
	moves   *moves.Steps   // the cell's steps of database moves (cell/moves)
	admin   *admin.Server  // the admin port
}

// stats are the open path's counters (exported through /healthz and /metrics).
type stats struct {
	opens, openBatches, shed atomic.Int64
	creditedInOpen           atomic.Int64 // claims credited in their opens' own transactions
	opensInFlight            atomic.Int64 // opens taken and not answered yet (the relay's load probe)
	// dbOps counts the money operations committed in each database, both
	// spaces (redcell_cell_db_ops_total): the load redcell plan balances.
	dbOps [model.DBCount]atomic.Int64
}

// relayYieldOpens: with this many opens in flight the cell is loaded, and the
// relay yields to them (relay.Config.Busy). Half the bench's 64 connections:
// a lone client, or a few, never makes credits wait; a cell whose opens queue
// up behind its database does.
const relayYieldOpens = 32

// loaded is the relay's load probe: whether relayYieldOpens or more opens
// are in flight.
func (st *stats) loaded() bool { return st.opensInFlight.Load() >= relayYieldOpens }

// New wires a cell. It does no I/O but reading Config.Activities (an invalid
// file is its error). The cell's metrics are registered with reg,
// which GET /metrics on the admin port serves; reg belongs to this cell (one per
// process, never prometheus.DefaultRegisterer, so tests can run many cells).
// Time is read from cfg.Clock (nil: the system clock).
func New(cfg Config, stores Stores, slots Slots, cache GrabCache, peers Peers, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if stores.Real == nil || stores.Shadow == nil {
		return nil, errors.New("cell: both a real and a shadow store are required")
	}
	clk := clock.Or(cfg.Clock)
	log = log.With("cell", cfg.Name)
	acts, ring, err := loadRewards(cfg, clk, log)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, clock: clk, peers: peers, log: log}
	s.opens.slots = slots
	s.spaces[0] = &space{name: "real", store: stores.Real}
	s.spaces[1] = &space{stress: true, name: "shadow", store: stores.Shadow}
	if cache != nil {
		s.opens.cache = &grabCache{c: cache, clock: clk}
	}
	s.inc = newIncidents(log)
	s.answers = answers{cell: cfg.Name, log: log, failing: s.inc.request}
	s.own = newOwnership(cfg.Name, cfg.Shards, cfg.MapVersion)
	s.own.clock = clk
	if err := s.initOpenPath(); err != nil {
		return nil, err
	}
	s.switches = degrade.New(cfg.Degrade, log)
	s.gate.signer = api.NewSigner(cfg.ClusterSecret)
	calls := cellclient.New(&fasthttp.Client{Name: "redcell-cell", ReadTimeout: internalTimeout, WriteTimeout: internalTimeout, MaxConnsPerHost: 64,
		MaxConnWaitTimeout: internalTimeout / 2},
		s.gate.signer, clk, internalTimeout)
	// The stores as built (storage.MySQL, memstore.Store) or, wrapped, the
	// one behind Moves, whose Shadow store shares the setting.
	for _, st := range []any{stores.Real, stores.Shadow, stores.Moves} {
		if d, ok := st.(creditDester); ok {
			d.SetCreditDest(s.creditDest)
		}
	}
	s.budgets = newBudgets(s, calls, acts.Tree)
	s.parts.rewards = newRewards(s, acts, ring, reg)
	s.parts.wallet = newWallet(s, acts.Tree)
	relayOff := func() bool { return s.switches.Off(degrade.Relay) }
	creditLag := newCreditLag()
	for _, sp := range s.spaces {
		sp.relay = relay.New(relay.Config{Cell: cfg.Name, Space: sp.name, Interval: cfg.RelayInterval, DBs: s.own.dbs,
			Owns: s.Owns, Enter: s.own.enterDBs, Off: s.spaceRelayOff(sp, relayOff), Store: relayStore{Store: sp.store, w: s.writer, sp: sp}, Client: cellCalls{c: calls, stress: sp.stress}, Peers: peers,
			Clock: clk, Log: log, Busy: s.opens.stats.loaded, CreditLag: creditLagOf(creditLag, sp.name)})
	}
	s.gate.noopBody, _ = json.Marshal(api.NoopResponse{Cell: cfg.Name})
	s.gate.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimitPerSec), cfg.RateBurst)
	_, s.gate.refusal = api.ErrorJSON(model.Errorf(model.ErrCellRateLimited, "cell %s is above its limit of %d requests/s; retry later", cfg.Name, cfg.RateLimitPerSec))
	s.initPasses(stores, calls, relayOff, reg)
	if cfg.Coupons != "" {
		if stores.RealCoupons == nil || stores.ShadowCoupons == nil {
			return nil, errors.New("cell: Coupons names a batches file, but no coupon stores were given")
		}
		cp, err := newCoupons(s, [2]couponq.Store{stores.RealCoupons, stores.ShadowCoupons}, calls, reg)
		if err != nil {
			return nil, fmt.Errorf("cell: %w", err)
		}
		s.parts.coupons = cp
	}
	s.metrics = newMetrics(reg, metricSources{queue: s.opens.queue, stats: &s.opens.stats, spaces: s.spaces, expiry: s.parts.expiry, slots: slots,
		cache: cache, switches: s.switches, dbs: s.own.dbs, clock: clk, inc: s.inc, creditLag: creditLag, groups: s.writer.groups})
	s.initServing(stores, acts, reg)
	return s, nil
}

// Owns reports whether this cell owns shard sh.
func (s *Server) Owns(sh model.ShardID) bool { return s.own.owns(sh) }

// Listen binds the HTTP address (so callers know it is taken before announcing).
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cell: listen %s: %w", s.cfg.Listen, err)
	}
	return ln, nil
}

// Serve runs the cell on ln until ctx ends, then shuts down gracefully: stop
// taking requests and let in-flight ones finish, drain the open queues and the
// commit lanes, deliver what the relay holds. Background work (schema
// warm-up, relay, expiry, reconciliation, the hourly audit) runs while it
// serves.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	p := &s.parts
	p.moves.LoadMarks(ctx) // databases frozen by a move when the cell stopped stay frozen from the first request
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	background := []func(context.Context){p.moves.Run, s.spaces[0].relay.Run, s.spaces[1].relay.Run, p.expiry.run, p.archive.run, p.recon.Run, p.auditor.Run,
		p.rewards.Run, s.budgets.Run,
		s.budgets.Recover} // Recover: the budgets this cell homes, as New's file sets them; then an earlier run's leases
	if s.cfg.WarmSchema {
		background = append(background, p.warmer.run)
	}
	if p.coupons != nil {
		background = append(background, p.coupons.Run)
	}
	background = append(background, p.shadow.run)
	for _, run := range background {
		wg.Add(1)
		go func() { defer wg.Done(); run(bg) }()
	}

	errc := make(chan error, 1)
	go func() { errc <- s.gate.http.Serve(ln) }()
	s.log.Info("cell serving", "addr", ln.Addr().String(), "shards", s.cfg.Shards.String(), "strategy", s.opens.strategy.Strategy().Strategy)
	stopAdmin, aerr := p.admin.Serve(bg)
	if aerr != nil {
		s.log.Error("admin port", "err", aerr)
	}
	defer stopAdmin()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	s.gate.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if serr := s.gate.http.ShutdownWithContext(sctx); serr != nil && err == nil {
		err = serr
	}
	s.opens.queue.Close()
	s.opens.queue.Wait()
	// The committer stops last: the packet workers submit their last batches
	// to it, and the background loops (the relay's local lane, expiry,
	// bookers, coupon engines) write through it until they end.
	stopBG()
	wg.Wait()
	s.writer.groups.Stop()
	s.log.Info("cell stopped", "opens", s.opens.stats.opens.Load(), "relayed", s.spaces[0].relay.Stats.Relayed.Load())
	return err
}

// internalTimeout bounds a cell-to-cell call (/internal/...) whose caller sent
// no shorter deadline, at both ends: the cell client waits no longer for any
// call, and a cell serves none longer. The relay's attempts (5 s) and
// reconciliation's calls (10 s) send their own deadlines.
const internalTimeout = 10 * time.Second

// deadline rebuilds the request's context from the deadline header the router
// sends; without it the cell's RequestTimeout applies.
func (s *Server) deadline(rc *fasthttp.RequestCtx) (context.Context, context.CancelFunc) {
	limit := s.cfg.RequestTimeout
	if bytes.HasPrefix(rc.Path(), []byte("/internal/")) {
		limit = internalTimeout // a reconciliation call may take longer than a client request
	}
	d := s.clock.Now().Add(limit)
	if v := rc.Request.Header.Peek(api.HeaderDeadline); len(v) > 0 {
		if ms, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			if hd := time.UnixMilli(ms); hd.Before(d) {
				d = hd
			}
		}
	}
	return context.WithDeadline(context.Background(), d)
}

// initOpenPath makes the open path: the per-packet FIFOs, the writer and its
// group committer, the open strategy and the split's random sources. The
// writer copies s.spaces and s.own: both must be set before. Errors: the
// strategy's settings.
func (s *Server) initOpenPath() error {
	o := &s.opens
	o.queue = keyqueue.New(keyqueue.Config{
		Depth: s.cfg.QueueDepth, MaxKeys: 200_000, BatchMax: 1, IdleStop: 2 * time.Second, Clock: s.clock,
	}, s.openBatch)
	w := &writer{spaces: s.spaces, own: s.own, stats: &o.stats, lanes: s.cfg.CommitLanes, afterOpen: s.afterOpen}
	w.groups = groupcommit.New(groupcommit.Config{Max: s.cfg.GroupMax, Wait: s.cfg.GroupWait, QueueMax: laneQueueMax,
		CommitTimeout: txTimeout, Commit: w.commitGroup, Observe: func(g groupcommit.Group) { s.metrics.observeGroup(g) }, Clock: s.clock})
	o.strategy = &openStrategy{queue: o.queue, groups: w.groups, log: s.log}
	w.strategy = o.strategy
	s.writer = w
	if err := o.strategy.SetStrategy(api.StrategySetting{Strategy: s.cfg.OpenStrategy, BatchMax: s.cfg.BatchMax, BatchWaitMS: int(s.cfg.BatchWait / time.Millisecond),
		GroupMax: s.cfg.GroupMax, GroupWaitMS: int(s.cfg.GroupWait / time.Millisecond)}); err != nil {
		return err
	}
	o.rngs.New = func() any {
		var seed [16]byte
		_, _ = rand.Read(seed[:])
		return mrand.New(mrand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))
	}
	return nil
}

// initPasses makes the cell's background passes over its books: expiry
// and refunds, the archive and export, the schema warm-up, reconciliation
// and the cell's own audit.
func (s *Server) initPasses(stores Stores, calls *cellclient.Client, relayOff func() bool, reg *prometheus.Registry) {
	p := &s.parts
	p.expiry = &expirer{spaces: s.spaces, shards: s.own.shards, own: s.own, refund: s.writer.refundGrouped, interval: s.cfg.ExpiryInterval, packetExpiry: s.cfg.PacketExpiry,
		cache: s.opens.cache, clock: s.clock, log: s.log, inc: s.inc}
	p.archive = newArchiver(s.spaces, s.Owns, s.cfg, s.clock, s.log, reg)
	p.archive.enter = s.own.enterServed
	p.warmer = &warmer{store: stores.Real, shards: s.cfg.Shards.Shards(), retry: s.cfg.WarmRetry, clock: s.clock, log: s.log, failing: s.inc.warmUp}
	p.recon = recon.New(recon.Config{Cell: s.cfg.Name, DBs: s.own.dbs, Owns: s.Owns, Peers: s.peers, Interval: s.cfg.ReconInterval,
		Settle: s.cfg.ReconSettle, PacketExpiry: s.cfg.PacketExpiry, RelayOff: relayOff, Redrive: s.spaces.redrive, Clock: s.clock, Log: s.log, Reg: reg},
		recon.Space{Name: s.spaces[0].name, Books: stores.Real, Client: cellCalls{c: calls}},
		recon.Space{Name: s.spaces[1].name, Books: stores.Shadow, Client: cellCalls{c: calls, stress: true}})
	p.auditor = audit.New(audit.Config{Cell: s.cfg.Name, Owns: s.Owns, Interval: s.cfg.AuditInterval, Clock: s.clock, Log: s.log, Reg: reg},
		audit.Space{Name: s.spaces[0].name, Books: stores.Real}, audit.Space{Name: s.spaces[1].name, Books: stores.Shadow})
}

// initServing makes, once the passes and the metrics are there, what serves
// the cell's ports: the steps of database moves, the shadow cleaner, the
// admin port, the route bodies of accounts, packets and credits (the routes
// table picks them) and the HTTP server.
func (s *Server) initServing(stores Stores, acts *rewards.Activities, reg *prometheus.Registry) {
	p, cfg := &s.parts, s.cfg
	p.moves = newMoves(cfg, stores.Moves, movesOwnership{s.own}, s.peers, s.metrics, s.clock, s.log)
	p.shadow = s.newShadow(stores.ShadowDrop, reg)
	var couponAdmin admin.Coupons // nil unless the cell runs coupons: a typed nil would not be
	if p.coupons != nil {
		couponAdmin = p.coupons
	}
	p.admin = admin.New(admin.Config{Listen: cfg.AdminListen, Token: cfg.AdminToken, Cell: cfg.Name, Shards: s.own.rangesString,
		Peers: s.peers, Strategy: s.opens.strategy, Switches: s.switches, Auditor: p.auditor, Activities: acts, Withdrawals: p.wallet, Coupons: couponAdmin, Moves: p.moves, Failover: cfg.Failover, Shadow: p.shadow, Metrics: s.metrics.serve, Log: s.log})
	p.accounts = &accounts{own: s.own, writer: s.writer, answers: s.answers, clock: s.clock,
		identityKey: cfg.IdentityKey, identityRegion: cfg.IdentityDefaultRegion}
	p.packets = &packets{own: s.own, writer: s.writer, cache: s.opens.cache, switches: s.switches, answers: s.answers, clock: s.clock,
		limits: cfg.Limits, expiry: cfg.PacketExpiry}
	p.credits = &creditRoutes{own: s.own, writer: s.writer, moves: p.moves, answers: s.answers}
	s.gate.http = api.NewServer("redcell-cell", s.handle, 1<<20, s.log)
}
