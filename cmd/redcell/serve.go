package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/internal/retry"
	"redcell/model"
	"redcell/router"
	"redcell/router/apikey"
	"redcell/sharding"
	"redcell/sharding/membership"
	"redcell/storage"
)

// The store is bound to the cell's interfaces here, where the wiring happens:
// MariaDB and memcached each behind a circuit breaker.
var _ storage.Store = (*storage.MySQL)(nil)
var _ admission.Memcache = (*memcache.Client)(nil)
var _ admission.Memcache = (*guard.Memcache)(nil)
var _ cell.Slots = (*admission.Slots)(nil)
var _ cell.GrabCache = (*admission.Cache)(nil)
var _ cell.Peers = (*membership.Node)(nil)
var _ router.Keys = (*apikey.File)(nil)

// newRegistry is the process's Prometheus registry (never the global default):
// the Go runtime and process collectors, plus what the components register.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// procFlags are the flags every serving process (redcell cell, redcell
// router) takes: its config file, log level and profiling address.
type procFlags struct {
	fs                 *flag.FlagSet
	path, level, pprof *string
}

// newProcFlags makes the flag set of process kind, its profiling address
// example in the -pprof help.
func newProcFlags(kind, pprofExample string) procFlags {
	fs := flag.NewFlagSet(kind, flag.ContinueOnError)
	return procFlags{fs: fs,
		path:  fs.String("config", "deploy/local/redcell.yaml", "cluster config file"),
		level: fs.String("log-level", "info", "debug|info|warn|error"),
		pprof: fs.String("pprof", "", "serve Go profiles (net/http/pprof) on this loopback address, e.g. "+pprofExample),
	}
}

// start is what a serving process does first: parse args, make its
// logger, serve its profiles when asked and load its config.
func (p procFlags) start(args []string) (fileConfig, *slog.Logger, error) {
	if err := p.fs.Parse(args); err != nil {
		return fileConfig{}, nil, err
	}
	log := newLogger(*p.level)
	if err := servePprof(*p.pprof, log); err != nil {
		return fileConfig{}, nil, err
	}
	fc, err := loadConfig(*p.path)
	return fc, log, err
}

// runCell: flags → config → validate → listen → the lease → database →
// breakers and metrics → memcached → join the cluster → serve; on a signal:
// leave the cluster (routers stop sending), drain, close in reverse order.
func runCell(ctx context.Context, args []string) error {
	pf := newProcFlags("cell", "127.0.0.1:6061")
	name := pf.fs.String("name", "cell-1", "this cell's name in the config's cells list")
	proc := pf.fs.String("proc", "a", "this process's slot among the cell's processes (a, b, ...): one serves, the others wait for its lease")
	listen := pf.fs.String("listen", "", "the cell's HTTP address for this process (default: the config's listen); a second process on one machine needs its own")
	gossipFlag := pf.fs.String("gossip", "", "this process's gossip address (default: the config's)")
	adminListen := pf.fs.String("admin-listen", "", "this process's admin address (default: the config's admin_listen)")
	fc, log, err := pf.start(args)
	if err != nil {
		return err
	}
	cfg, gossip, err := fc.cellConfig(*name)
	if err != nil {
		return err
	}
	cfg.Listen = cmp.Or(*listen, cfg.Listen)
	gossip = cmp.Or(*gossipFlag, gossip)
	cfg.AdminListen = cmp.Or(*adminListen, cfg.AdminListen)
	// What the cell announces, checked before it waits for its database.
	httpAddr, gossipAddr, err := fc.cellAdvertise(cfg.Name, cfg.Listen, gossip)
	if err != nil {
		return err
	}
	// Bind the HTTP port before announcing it, so routers never learn an
	// address that refuses connections; requests wait in the backlog until
	// Serve. Bound before the lease too: a process that takes over has its
	// port already.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("cell %s: listen %s: %w", cfg.Name, cfg.Listen, err)
	}
	defer ln.Close()
	p := &cellProc{cfg: cfg, log: log}
	defer p.close()
	if err := p.open(ctx, *proc); err != nil {
		if ctx.Err() != nil && !p.leased { // stopped while it waited for the lease: a clean stop
			log.Info("stopped while waiting for the cell's lease")
			return nil
		}
		return err
	}
	srv, node, err := p.wire(fc, gossip, gossipAddr, httpAddr)
	if err != nil {
		return err
	}
	return p.serve(ctx, srv, node, ln)
}

// cellProc is one cell process as runCell starts it: its config, the
// lease it holds, its store, and what to give back when it stops.
type cellProc struct {
	cfg       cell.Config
	log       *slog.Logger
	store     *storage.MySQL
	failover  *storage.Failover // nil: no standby
	leased    bool              // the lease is taken
	leaseCtx  context.Context   // ends when the lease is lost
	leaseLost context.CancelCauseFunc
	reg       *prometheus.Registry
	closers   []func() // run last to first by close
}

// close gives back what the process took, last to first.
func (p *cellProc) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// open waits for the cell's lease (only its holder serves, and its
// connections are fenced by the lease's generation, storage.Lease), then
// opens the store on the server that serves then, keeps the lease, waits
// for the database and reads the ownership moves saved.
func (p *cellProc) open(ctx context.Context, proc string) error {
	cfg, log := p.cfg, p.log
	lease, err := waitLease(ctx, cfg, proc, cfg.LeaseTTL, log)
	if err != nil {
		return err
	}
	p.leased = true
	if cfg.StandbyDSN != "" {
		p.store, p.failover, err = storage.OpenFailover(cfg.DSN, cfg.StandbyDSN, cfg.MaxConns, log.With("component", "failover"))
	} else {
		p.store, err = storage.Open(cfg.DSN, cfg.MaxConns)
	}
	if err != nil {
		return err
	}
	store := p.store
	p.closers = append(p.closers, func() { store.Close() })
	store.SetLease(lease)
	if p.failover != nil {
		p.failover.SetLease(lease)
	}
	p.leaseCtx, p.leaseLost = context.WithCancelCause(context.Background())
	go keepLease(p.leaseCtx, store, lease, p.leaseLost, log)
	// Released at the end while still held (close runs these last to
	// first: the release, then the keeper's stop).
	p.closers = append(p.closers, func() { p.leaseLost(nil) }, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if context.Cause(p.leaseCtx) == nil {
			p.leaseLost(nil)
			if err := store.ReleaseLease(rctx, lease); err != nil {
				log.Warn("lease: not released (another process takes it once it expires)", "err", err)
			}
		}
	})
	if err := waitPing(ctx, store, 30*time.Second); err != nil {
		return fmt.Errorf("cell %s: database %s: %w", cfg.Name, redactDSN(cfg.DSN), err)
	}
	if err := savedOwnership(ctx, store, &p.cfg, log); err != nil {
		return fmt.Errorf("cell %s: %w", cfg.Name, err)
	}
	return nil
}

// wire builds the cell on the open store: its metrics, the failover watch,
// the breakers in front of MariaDB and memcached, its membership node and
// the cell.Server.
func (p *cellProc) wire(fc fileConfig, gossip, gossipAddr, httpAddr string) (*cell.Server, *membership.Node, error) {
	cfg, log, store := p.cfg, p.log, p.store
	p.reg = newRegistry()
	reg := p.reg
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_cell_db_round_trips_total",
		Help: "Round trips the cell's connections made to its database server (a statement or statement list, BEGIN, COMMIT, ROLLBACK, a ping), real and shadow spaces together; the bench divides it by operations."},
		func() float64 { return float64(store.RoundTrips()) }))
	if p.failover != nil {
		cfg.Failover = switchBack{p.failover}
		watchCtx, stopWatch := context.WithCancel(context.Background())
		p.closers = append(p.closers, stopWatch)
		go p.failover.Watch(watchCtx, cfg.FailoverAfter, time.Second)
		registerFailoverMetrics(reg, p.failover)
	}
	breakers := map[string]*guard.Breaker{}
	// Stress traffic gets its own breaker (db_shadow): a bench that
	// overloads the shadow tables must never open the breaker in front of
	// real money.
	for _, name := range []string{"db", "memcached", "db_shadow"} {
		b, err := guard.NewBreaker(name, cfg.Breaker, reg, log)
		if err != nil {
			return nil, nil, err
		}
		breakers[name] = b
	}
	shadowStore := store.Shadow() // its own pool: it keeps which tables exist
	store.SetBreaker(breakers["db"])
	shadowStore.SetBreaker(breakers["db_shadow"])
	stores := cell.Stores{Real: store, Shadow: shadowStore, RealCoupons: store, ShadowCoupons: shadowStore, ShadowDrop: shadowStore, Moves: store}
	mc := guard.NewMemcache(admission.NewClient(cfg.Memcached), breakers["memcached"])
	cfg.IssuedMemcache, cfg.SceneMemcache, cfg.CouponMemcache = mc, mc, mc
	node, err := membership.Join(membership.Config{
		Name: cfg.Name, Bind: gossip, Advertise: gossipAddr, Seeds: fc.GossipSeeds, Log: log.With("component", "membership"),
		Meta: membership.Meta{Role: membership.RoleCell, Addr: httpAddr, Shards: cfg.Shards.String(), Version: cfg.MapVersion},
	})
	if err != nil {
		return nil, nil, err
	}
	var srv *cell.Server
	// The audits, the archive and the table lists read the databases the
	// cell holds, not the copies a move leaves or makes on its server.
	store.SetDBFilter(func(db int) bool { return srv != nil && srv.Holds(db) })
	srv, err = cell.New(cfg, stores, admission.NewSlots(mc, cfg.TxPerPacket, log), admission.NewCache(mc, log), node, reg, log)
	if err != nil {
		node.Shutdown()
		return nil, nil, err
	}
	return srv, node, nil
}

// registerFailoverMetrics registers the standby's gauges and counters.
func registerFailoverMetrics(reg *prometheus.Registry, failover *storage.Failover) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_db_on_standby",
			Help: "1 once the cell's standby database was promoted and serves (a failover), else 0."},
			func() float64 { return b2f(failover.OnStandby()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_cell_db_promotions_total",
			Help: "Standby databases this process promoted."}, func() float64 { return float64(failover.Promotions.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_db_standby_replicating",
			Help: "1 while the standby replicates with semi-synchronous acknowledgement (checked every 10 s while the primary answers), 0 when it does not (it is then not promoted), -1 before the first check or once the standby serves (there is none)."},
			func() float64 { return float64(failover.Replicating()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_cell_db_primary_down_seconds",
			Help: "How long the primary database has not answered the failover watch (0 while it answers or once the standby serves)."},
			func() float64 {
				if t := failover.PrimaryDownSince(); !t.IsZero() {
					return time.Since(t).Seconds()
				}
				return 0
			}))
}

// serve serves the cell on ln until ctx ends (a signal) or the lease is
// lost: then it leaves the cluster (routers stop sending) and drains.
// Errors: the server's, and the lease's loss when that stopped it.
func (p *cellProc) serve(ctx context.Context, srv *cell.Server, node *membership.Node, ln net.Listener) error {
	log := p.log
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx, ln) }()
	select {
	case <-ctx.Done():
	case <-p.leaseCtx.Done():
		log.Error("lease lost: another process of this cell serves it; leaving the cluster and stopping", "err", context.Cause(p.leaseCtx))
	case err := <-done:
		node.Shutdown()
		return err
	}
	log.Info("shutting down: leaving the cluster, then draining")
	if err := node.Leave(3 * time.Second); err != nil {
		log.Warn("leave", "err", err)
	}
	stopServe()
	err := <-done
	if cause := context.Cause(p.leaseCtx); cause != nil && ctx.Err() == nil {
		return errors.Join(fmt.Errorf("cell %s: %w", p.cfg.Name, cause), err)
	}
	return err
}

// waitPing pings the database every 500 ms (each ping bounded by 2 s) until
// it answers, limit passes or ctx ends; it returns the last ping's error.
func waitPing(ctx context.Context, store *storage.MySQL, limit time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	err := retry.Do(wctx, retry.Policy{Attempts: int(limit/(500*time.Millisecond)) + 1, Backoff: 500 * time.Millisecond, Max: 500 * time.Millisecond},
		func(int) error {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			last = store.Ping(pctx)
			return last
		})
	if err == nil {
		return nil
	}
	return last
}

// redactDSN drops the password from a DSN for logs.
func redactDSN(dsn string) string {
	at := -1
	for i := len(dsn) - 1; i >= 0; i-- {
		if dsn[i] == '@' {
			at = i
			break
		}
	}
	if at < 0 {
		return dsn
	}
	user := dsn[:at]
	for i := 0; i < len(user); i++ {
		if user[i] == ':' {
			return user[:i] + ":***" + dsn[at:]
		}
	}
	return dsn
}

// runRouter: flags → config → join the cluster as a router → serve → shut down.
func runRouter(ctx context.Context, args []string) error {
	pf := newProcFlags("router", "127.0.0.1:6060")
	fc, log, err := pf.start(args)
	if err != nil {
		return err
	}
	cfg, err := fc.routerConfig()
	if err != nil {
		return err
	}
	gossip := fc.Router.Gossip
	if gossip == "" {
		gossip = "127.0.0.1:7946"
	}
	keyPath, err := fc.apiKeysPath()
	if err != nil {
		return err
	}
	keys, err := apikey.Open(keyPath, log.With("component", "apikey"))
	if err != nil {
		return err
	}
	gossipAddr, err := advertised(gossip, fc.Router.AdvertiseHost, "router gossip")
	if err != nil {
		return err
	}
	node, err := membership.Join(membership.Config{
		Name: "router-" + gossipAddr, Bind: gossip, Advertise: gossipAddr, Seeds: fc.GossipSeeds, Log: log.With("component", "membership"),
		Meta: membership.Meta{Role: membership.RoleRouter},
	})
	if err != nil {
		return err
	}
	defer node.Leave(2 * time.Second)
	pcfg, err := fc.probeConfig()
	if err != nil {
		return err
	}
	reg := newRegistry()
	routes, err := router.NewProber(node, pcfg, reg, log.With("component", "probe"))
	if err != nil {
		return err
	}
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	go routes.Run(probeCtx)
	cfg.Cells = newCellJobs(ctx, fc, *pf.path, log.With("component", "cells"))
	shared, err := fc.sharedLimits()
	if err != nil {
		return err
	}
	if shared {
		mc := memcache.New(fc.Memcached...)
		mc.Timeout = 100 * time.Millisecond // a limit check must not hold a request up for long
		mc.MaxIdleConns = 256
		cfg.Shared = &router.Shared{Memcache: mc, Routers: node.Routers}
	}
	rt, err := router.New(cfg, routes, keys, reg, log)
	if err != nil {
		return err
	}
	ln, err := rt.Listen()
	if err != nil {
		return err
	}
	admin, err := rt.ListenAdmin()
	if err != nil {
		ln.Close()
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go keys.Watch(watchCtx, time.Second) // other routers and redcell apikey change the file too
	return rt.Serve(ctx, ln, admin)
}

// servePprof serves net/http/pprof on addr (loopback only) when addr is set.
func servePprof(addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !(host == "127.0.0.1" || host == "localhost" || host == "::1") {
		return fmt.Errorf("--pprof must be a loopback address, got %q", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	go func() { _ = http.Serve(ln, nil) }() // DefaultServeMux holds the pprof handlers
	log.Info("pprof serving", "addr", ln.Addr().String())
	return nil
}

// b2f is 1 for true, 0 for false (a gauge of a state).
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// savedOwnership replaces the config's shard ranges and map version with
// those the cell saved in its database after a move (storage.MySQL.Ownership):
// after a move the config file no longer says what the cell owns, and a
// database handed over must never be claimed again from it. A cell that
// never took part in a move has none saved and keeps the config's. (To start
// over from the file, delete the cell's row of redcell_meta.t_ownership.)
func savedOwnership(ctx context.Context, store *storage.MySQL, cfg *cell.Config, log *slog.Logger) error {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ranges, version, found, err := store.Ownership(octx, cfg.Name)
	if err != nil {
		return err
	}
	if !found {
		return nil
	}
	r := sharding.Ranges{}
	if ranges != "" {
		if r, err = sharding.ParseRanges(ranges); err != nil {
			return fmt.Errorf("saved ownership: %w", err)
		}
	}
	if r.String() != cfg.Shards.String() || version != cfg.MapVersion {
		log.Info("shards as saved by the last move, not as the config file says", "shards", r.String(), "version", version,
			"config_shards", cfg.Shards.String(), "config_version", cfg.MapVersion)
	}
	cfg.Shards, cfg.MapVersion = r, version
	return nil
}

// switchBack is the cell's POST /admin/failover (admin.Failover) over its
// storage.Failover.
type switchBack struct{ f *storage.Failover }

func (b switchBack) SwitchBack(ctx context.Context) (api.FailoverAnswer, error) {
	res, err := b.f.SwitchBack(ctx)
	ans := api.FailoverAnswer{Serving: "standby", CaughtUpMS: res.CaughtUp.Milliseconds(), PausedMS: res.Paused.Milliseconds(), GTID: res.GTID}
	if !b.f.OnStandby() {
		ans.Serving = "primary"
	}
	switch {
	case err == nil:
		return ans, nil
	case errors.Is(err, storage.ErrNotFailedOver), errors.Is(err, storage.ErrStandbyUnknown):
		return api.FailoverAnswer{}, model.Invalidf("%v", err)
	case ans.Serving == "primary": // switched; the old standby is not its replica
		ans.StandbyError = err.Error()
		return ans, nil
	default:
		return api.FailoverAnswer{}, model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
}
