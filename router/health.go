package router

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/sharding"
)

// ProbeConfig sets the router's health probes of the cells.
type ProbeConfig struct {
	// Interval is how often each cell of the map is probed (GET /livez);
	// 0 turns the probes off (the map is gossip's alone).
	Interval time.Duration
	// Timeout bounds one probe.
	Timeout time.Duration
	// Failures in a row drop a cell from the router's map; Recoveries in a
	// row put it back.
	Failures, Recoveries int
}

// DefaultProbeConfig probes every second with a 500 ms timeout: a cell that
// does not answer three in a row is out of the map about 3 s after it
// stopped answering, and back 2 s after it answers again.
func DefaultProbeConfig() ProbeConfig {
	return ProbeConfig{Interval: time.Second, Timeout: 500 * time.Millisecond, Failures: 3, Recoveries: 2}
}

// Validate checks the bounds: Interval 0 (off) or 10ms..1m, Timeout
// within Interval, Failures and Recoveries 1..100.
func (c ProbeConfig) Validate() error {
	switch {
	case c.Interval == 0:
		return nil
	case c.Interval < 10*time.Millisecond || c.Interval > time.Minute:
		return fmt.Errorf("router: probe interval must be 0 (off) or 10ms..1m, got %s", c.Interval)
	case c.Timeout <= 0 || c.Timeout > c.Interval:
		return fmt.Errorf("router: probe timeout must be > 0 and at most the interval (%s), got %s", c.Interval, c.Timeout)
	case c.Failures < 1 || c.Failures > 100 || c.Recoveries < 1 || c.Recoveries > 100:
		return fmt.Errorf("router: probe failures and recoveries must be 1..100, got %d and %d", c.Failures, c.Recoveries)
	}
	return nil
}

// Prober is the router's Routes: gossip's map without the cells that fail
// their health probes, as a gateway probes its upstreams. A cell whose
// process is alive but does not answer (stopped, hung, its host cut off)
// stays in gossip's map until memberlist declares it dead, seconds to about
// 20 s later; meanwhile every request for its shards would wait for the
// request timeout. Out of the Prober's map, its shards are answered 503
// CELL_UNAVAILABLE at once. A probe succeeds when the cell answers at all:
// a cell whose database is down answers (DB_UNAVAILABLE) and stays in the
// map. Safe for concurrent use.
type Prober struct {
	inner Routes
	cfg   ProbeConfig
	log   *slog.Logger
	hc    *fasthttp.Client

	mu    sync.Mutex             // guards state
	state map[string]*probeState // by probeKey: one process at one address
	gen   atomic.Int64           // bumped when a cell leaves or rejoins the map
	cache atomic.Pointer[probedMap]

	healthy *prometheus.GaugeVec
	drops   prometheus.Counter
}

type probeState struct {
	name       string
	fails, oks int // in a row
	down       bool
	since      time.Time // when down began
}

type probedMap struct {
	src *sharding.Map
	gen int64
	m   *sharding.Map
}

// NewProber wraps inner (gossip's map) with probes; Run probes. reg may be
// nil.
func NewProber(inner Routes, cfg ProbeConfig, reg prometheus.Registerer, log *slog.Logger) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Prober{inner: inner, cfg: cfg, log: log, state: map[string]*probeState{},
		hc: &fasthttp.Client{Name: "redcell-router-probe", MaxConnsPerHost: 2},
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_router_cell_healthy",
			Help: "1 while the cell answers the router's health probes, 0 while it is out of the router's map for failing them."}, []string{"cell"}),
		drops: prometheus.NewCounter(prometheus.CounterOpts{Name: "redcell_router_cell_probe_drops_total",
			Help: "Times a cell was dropped from the router's map for failing its health probes."}),
	}
	if reg != nil {
		reg.MustRegister(p.healthy, p.drops)
	}
	return p, nil
}

// Map is gossip's map without the cells out for failed probes. It is built
// again only when either changes.
func (p *Prober) Map() *sharding.Map {
	src := p.inner.Map()
	gen := p.gen.Load()
	if c := p.cache.Load(); c != nil && c.src == src && c.gen == gen {
		return c.m
	}
	m := src
	if down := p.downKeys(); len(down) > 0 && src != nil {
		var cells []sharding.Cell
		for _, c := range src.Cells() {
			if !down[probeKey(c)] {
				cells = append(cells, c)
			}
		}
		m, _ = sharding.NewMap(cells)
		m.Version = src.Version
	}
	p.cache.Store(&probedMap{src: src, gen: gen, m: m})
	return m
}

// probeKey names one process of a cell: its address and start stamp. A
// cell started again (a later Started, from gossip) is probed afresh, not
// held out for its predecessor's failures.
func probeKey(c sharding.Cell) string { return c.Addr + "#" + strconv.FormatInt(c.Started, 10) }

// DownCells names the cells out of the map for failed probes, for the
// router's /healthz.
func (p *Prober) DownCells() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []string{}
	for _, st := range p.state {
		if st.down {
			out = append(out, st.name)
		}
	}
	slices.Sort(out)
	return out
}

func (p *Prober) downKeys() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out map[string]bool
	for key, st := range p.state {
		if st.down {
			if out == nil {
				out = map[string]bool{}
			}
			out[key] = true
		}
	}
	return out
}

// Run probes every cell of gossip's map once per interval, on a ticker's
// grid (clock.Ticker): a round slowed by a hung cell's probe (up to
// Timeout) does not stretch the period, until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	if p.cfg.Interval == 0 {
		return
	}
	for tk := clock.NewTicker(nil, p.cfg.Interval); tk.Wait(ctx); {
		p.probeAll(ctx)
	}
}

// probeAll probes the cells of gossip's map at once and forgets addresses
// gossip no longer lists.
func (p *Prober) probeAll(ctx context.Context) {
	src := p.inner.Map()
	cells := src.Cells()
	live := make(map[string]bool, len(cells))
	var wg sync.WaitGroup
	for _, c := range cells {
		live[probeKey(c)] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.observe(c, p.probe(c.Addr))
		}()
	}
	wg.Wait()
	p.mu.Lock()
	changed := false
	for key, st := range p.state {
		if !live[key] {
			if st.down {
				changed = true
			}
			delete(p.state, key)
			if !p.named(st.name) {
				p.healthy.DeleteLabelValues(st.name)
			}
		}
	}
	p.mu.Unlock()
	if changed {
		p.gen.Add(1)
	}
}

// named reports whether a process of cell name is still probed; p.mu held.
func (p *Prober) named(name string) bool {
	for _, st := range p.state {
		if st.name == name {
			return true
		}
	}
	return false
}

// probe asks the cell at addr for /livez (answered without reading the
// database, so a cell whose pool is busy under load still answers); any
// HTTP answer is alive.
func (p *Prober) probe(addr string) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + api.LivePath)
	req.Header.SetMethod(fasthttp.MethodGet)
	return p.hc.DoTimeout(req, resp, p.cfg.Timeout)
}

// observe counts one probe of cell c and moves it out of or back into the
// map on Failures failures or Recoveries successes in a row.
func (p *Prober) observe(c sharding.Cell, err error) {
	now := time.Now()
	p.mu.Lock()
	st := p.state[probeKey(c)]
	if st == nil {
		st = &probeState{name: c.Name}
		p.state[probeKey(c)] = st
	}
	st.name = c.Name
	var dropped, back bool
	var downFor time.Duration
	if err != nil {
		st.fails, st.oks = st.fails+1, 0
		if !st.down && st.fails >= p.cfg.Failures {
			st.down, st.since, dropped = true, now, true
		}
	} else {
		st.oks, st.fails = st.oks+1, 0
		if st.down && st.oks >= p.cfg.Recoveries {
			st.down, back, downFor = false, true, now.Sub(st.since)
		}
	}
	if st.down {
		p.healthy.WithLabelValues(c.Name).Set(0)
	} else {
		p.healthy.WithLabelValues(c.Name).Set(1)
	}
	p.mu.Unlock()
	switch {
	case dropped:
		p.gen.Add(1)
		p.drops.Inc()
		p.log.Warn("cell failed its health probes: out of the router's map, its shards answered CELL_UNAVAILABLE until it answers again",
			"cell", c.Name, "addr", c.Addr, "failures", p.cfg.Failures, "err", err)
	case back:
		p.gen.Add(1)
		p.log.Info("cell answers its health probes again: back in the router's map", "cell", c.Name, "addr", c.Addr,
			"out_for", downFor.Round(time.Millisecond))
	}
}
