// Package recon is a cell's reconciliation: near-real-time proof that claims
// turn into credits.
//
// A claim is its own outbox row: nothing marks it delivered. Every
// ReconInterval, for each space and each owned database, the cell reads the
// claims created in the window [checked up to, now - ReconSettle), each with
// its claimant's shard and the cell its credit was sent to (Claim.ActShard,
// Claim.Dest), and checks every one against the credits booked for it in its
// claimant's wallet: claimants of this cell in its own flow tables
// (storage.CreditsOfQuery), others by a signed POST /internal/recon to the cell that
// owns them, 5,000 claims a call (the local lookups and each other cell's
// calls side by side). It finds:
//
//  1. a credit of another account or amount than its claim: credit_mismatch;
//  2. a claim not credited where its claimant is served, but found in the
//     copy of the claimant's database kept by the cell its credit was sent to
//     (Claim.Dest, when another than the one asked): credit_elsewhere (the
//     database was handed over without that row);
//  3. any other claim not credited at that age is lag, never a difference:
//     it is counted (redcell_recon_lagging_claims_total), logged, and
//     re-driven through the relay (Config.Redrive), which delivers it again;
//     the receiving database refuses a second credit by claim ID.
//
// Where each database's windows have been checked up to is saved in the
// space's own store after the credits of every round are checked
// (Books.SaveReconPositions, never moving back), and a restarted cell resumes
// from there: a window is checked again after a crash, never skipped.
// Databases never saved start when the cell starts; claims made before are
// covered by the hourly audit of the cell's own books and by `redcell audit`.
// A claim whose claimant's cell cannot be asked is counted as unverified
// and handed to the relay all the same (Config.Redrive). A claim re-driven
// is not checked again: the relay holds it until a delivery is
// acknowledged, and saves its position below it before Redrive returns, so
// that a crash after this pass's save reads it back (the relay's own
// position save can fail: then only the audits see it, counted in flight).
//
// A pass reads in rounds of at most windowRows claims per database and
// rowsPerRound in all, and goes on with another round while a database is
// behind, for up to ReconInterval, and while one is still behind the next
// pass follows after a second: a backlog (after a restart, or a burst above
// what one round a pass keeps up with) is worked off at nearly full duty with
// the memory of one round. redcell_recon_lag_seconds says how far the
// checked position trails now (redcell_recon_checked_until_timestamp_seconds).
//
// A Reconciler is built from what it reads: each space's books (Books), a
// client for other cells (Client), the shard map (Peers), a clock, a logger
// and a metrics registry, and it hands lagging claims to Config.Redrive; it
// knows nothing of the cell's server.
package recon

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Books is the part of a cell's store reconciliation reads and writes: the
// reconciliation queries and op of package storage.
type Books interface {
	storage.Reader  // storage.ReconWindowQuery, storage.CreditsOfQuery, storage.ReconPositionsQuery
	storage.Grouper // storage.AdvanceReconPositions
}

// Client asks another cell which claims it has credited (POST
// /internal/recon, signed, marked as stress traffic for the shadow space). The
// call ends when ctx does and sends ctx's deadline to the receiver.
type Client interface {
	Recon(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error)
	// ReconCopy asks the same of the cell's own copy of the claimants'
	// databases, served now or handed over (api.ReconRequest.Copy).
	ReconCopy(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error)
}

// Peers tells which cell owns a shard (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// Space is one money space to reconcile: real money or the shadow tables.
type Space struct {
	Name   string // "real" or "shadow": the label of its metrics and logs
	Books  Books
	Client Client // calls to other cells for this space
}

// Config is what a Reconciler is built from. Every field is required but
// Redrive (nil: lagging claims are not re-driven) and Clock (nil: the system
// clock).
type Config struct {
	Cell         string                   // this cell's name, as claim rows record it (Claim.Dest)
	DBs          func() []int             // the databases this cell serves now (whole: every shard of each), read each round
	Owns         func(model.ShardID) bool // whether the cell serves a shard now
	Peers        Peers
	Interval     time.Duration // how often a pass runs (ReconInterval)
	Settle       time.Duration // how old a claim must be to be checked (ReconSettle)
	PacketExpiry time.Duration // a packet's life: which day tables hold a window's claims
	RelayOff     func() bool   // the relay degrade switch, named in the lag warning
	// Redrive hands the relay the claims of space ("real" or "shadow", as
	// Space.Name) found not credited at ReconSettle's age, each as the
	// credit it owes (model.CreditOf: claimant's shard, CreatedMS, Dest), to
	// be delivered again. It is called from the pass, once per round with
	// lagging claims, and must not block on delivery. nil: lagging claims
	// are counted and logged only.
	Redrive func(space string, cs []model.Credit)
	Clock   clock.Clock
	Log     *slog.Logger
	Reg     prometheus.Registerer
}

// Reconciler runs reconciliation passes over its spaces (Run).
type Reconciler struct {
	cfg     Config
	clock   clock.Clock
	spaces  []Space
	metrics []*spaceMetrics  // by space, as spaces
	inc     []spaceIncidents // by space
	checked []atomic.Int64   // by space: the oldest position, Unix ms (redcell_recon_lag_seconds)
}

// spaceIncidents are the failures reconciliation logs as incidents, per space.
type spaceIncidents struct {
	window  *incident.Tracker // ReconWindow of a database, or the saved positions
	credits *incident.Tracker // CreditsOf this cell's own claimants
	save    *incident.Tracker // SaveReconPositions
	ask     *incident.Set     // POST /internal/recon to another cell, per address
}

// askCellsMax bounds the per-cell trackers of calls to other cells: far above
// a cluster's cell count.
const askCellsMax = 256

// New builds a reconciler over spaces and registers its metrics with
// cfg.Reg; it does no I/O.
func New(cfg Config, spaces ...Space) *Reconciler {
	r := &Reconciler{cfg: cfg, clock: clock.Or(cfg.Clock), spaces: spaces,
		checked: make([]atomic.Int64, len(spaces))}
	r.metrics = newMetrics(cfg.Reg, spaces)
	for i, sp := range spaces {
		cfg.Reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_recon_lag_seconds",
			Help: "How far reconciliation's checked position trails now, read when scraped: now minus " +
				"redcell_recon_checked_until_timestamp_seconds (at least ReconSettle; 0 before the first pass).",
			ConstLabels: prometheus.Labels{"space": sp.Name}}, func() float64 {
			c := r.checked[i].Load()
			if c == 0 {
				return 0
			}
			return max(0, float64(r.clock.Now().UnixMilli()-c)/1000)
		}))
	}
	every := incident.DefaultEvery
	for _, sp := range spaces {
		l := cfg.Log.With("space", sp.Name)
		r.inc = append(r.inc, spaceIncidents{
			window:  incident.New(l, "reconciliation window read", every),
			credits: incident.New(l, "reconciliation credit read", every),
			save:    incident.New(l, "reconciliation position save", every),
			ask:     incident.NewSet(l, "reconciliation credit check with a cell", "addr", every, askCellsMax),
		})
	}
	return r
}

const (
	// windowRows bounds the claims one window read takes from one
	// database: above the largest open batch (4096 claims share one creation
	// time), small enough to hold in memory.
	windowRows = 20_000
	// rowsPerRound bounds the claims one round of a pass reads in all
	// (about 30 MB of claims and credits held at once).
	rowsPerRound = 200_000
	// chunkMax is how many claims one credit lookup or /internal/recon call
	// asks about (a call may carry 10,000).
	chunkMax = 5000
	// samples is how many claim IDs a log line names per kind of difference.
	samples = 5
)

// pass is what one reconciliation pass found in one space.
type pass struct {
	checked    model.Tally // claims read from the settled windows
	credited   model.Tally // claims credited as claimed
	lagging    int64       // claims not credited at ReconSettle's age (re-driven)
	lagSample  []string    // a few of their claim IDs, for the log
	unverified int64       // claims whose claimant's cell could not be asked
	errors     int         // windows that could not be read (read again next pass)
	diffs      model.Diffs
	behind     bool // a database was still behind when the pass ended
}

// Run runs a pass every Interval until ctx ends. Each space resumes from the
// positions its store saved (Books.ReconPositions); a database never saved
// starts where Run does. Until the saved positions can be read, a space is not
// reconciled (starting anywhere else could skip a window never checked).
func (r *Reconciler) Run(ctx context.Context) {
	start := r.clock.Now().UnixMilli()
	cursors := make([]map[int]int64, len(r.spaces)) // per space: db -> checked up to (exclusive), Unix ms; nil until resumed
	for i := range r.spaces {
		r.metrics[i].lastSuccess.Set(float64(start) / 1000) // "never yet" would read as a stall since 1970
		r.checked[i].Store(start)
	}
	behind := false
	for n := 0; ; n++ {
		wait := r.cfg.Interval
		if behind {
			wait = min(wait, catchUpPause) // a backlog is worked off pass after pass
		}
		select {
		case <-ctx.Done():
			return
		case <-r.clock.After(wait):
		}
		if ctx.Err() != nil {
			return
		}
		behind = false
		for i := range r.spaces {
			if cursors[i] == nil {
				c, err := r.resume(ctx, i, start)
				if err != nil {
					if ctx.Err() == nil {
						r.metrics[i].errors.Inc()
						r.inc[i].window.Fail(err, "read", "saved positions")
					}
					continue
				}
				cursors[i] = c
			}
			began := r.clock.Now()
			p := r.pass(ctx, i, cursors[i], n)
			behind = behind || p.behind
			if ctx.Err() == nil {
				r.metrics[i].passSeconds.Set(r.clock.Now().Sub(began).Seconds())
				r.report(i, p, cursors[i])
			}
		}
	}
}

// catchUpPause is the wait before the next pass when a pass ended (after
// Interval) with a database still behind: short, so a backlog is worked
// off at nearly full duty, yet a pause in which the database serves others.
const catchUpPause = time.Second

// resume returns the cursors of space i: the saved position of each owned
// database, start for one never saved.
func (r *Reconciler) resume(ctx context.Context, i int, start int64) (map[int]int64, error) {
	saved, err := storage.ReconPositions(ctx, r.spaces[i].Books)
	if err != nil {
		return nil, err
	}
	cursors := map[int]int64{}
	resumed, oldest := 0, start
	for _, db := range r.cfg.DBs() {
		cursors[db] = start
		if ms, ok := saved[db]; ok {
			cursors[db] = ms
			resumed++
			oldest = min(oldest, ms)
		}
	}
	if resumed > 0 {
		r.cfg.Log.Info("reconciliation resumes from its saved positions", "space", r.spaces[i].Name, "databases", resumed,
			"oldest", time.UnixMilli(oldest).UTC().Format(time.RFC3339Nano))
	}
	r.checked[i].Store(minCursor(cursors))
	return cursors, nil
}

// pass checks the windows of every owned database that have settled since
// the last pass, in rounds of at most rowsPerRound claims: after each
// round the credits of its claims are checked and the positions
// reached are saved. Rounds go on while a database is behind, for up to
// Interval, and the next pass then starts after catchUpPause rather than
// Interval: reconciliation keeps pace with any rate its reads keep up with,
// with the memory of one round.
func (r *Reconciler) pass(ctx context.Context, i int, cursors map[int]int64, n int) pass {
	p := pass{diffs: model.Diffs{}}
	to := r.clock.Now().Add(-r.cfg.Settle).UnixMilli()
	began := r.clock.Now()
	for round := 0; ctx.Err() == nil; round++ {
		p.behind = r.round(ctx, i, cursors, n+round, to, &p)
		if !p.behind || r.clock.Now().Sub(began) >= r.cfg.Interval {
			break
		}
	}
	return p
}

// round reads, for each owned database of space i behind to, the window from
// its cursor, advances the cursor past what it read, checks the credits of
// its claims and saves the positions reached. Round k starts at the
// k-th database, so that when the round's row budget runs out it is not
// always the same databases that wait: a database is left for the next round
// rather than read with less than a whole window's budget. It reports
// whether a database is still behind to.
func (r *Reconciler) round(ctx context.Context, i int, cursors map[int]int64, k int, to int64, p *pass) (behind bool) {
	sp := r.spaces[i]
	budget := rowsPerRound
	var claims []model.Credit
	moved := map[int]int64{}
	dbs := r.cfg.DBs()
	for _, db := range dbs {
		if _, ok := cursors[db]; !ok {
			// A database that moved here: a move copies its saved position
			// from the old owner before handing it over; without one it
			// starts where the others are.
			cursors[db] = minCursor(cursors)
			if saved, err := storage.ReconPositions(ctx, sp.Books); err == nil {
				if ms, ok := saved[db]; ok {
					cursors[db] = ms
				}
			}
		}
	}
	track := r.inc[i].window
	errs := 0
	for j := range dbs {
		db := dbs[(j+k)%len(dbs)]
		from := cursors[db]
		if from >= to || ctx.Err() != nil {
			continue
		}
		if budget < windowRows {
			behind = true
			continue
		}
		w, err := storage.ReconWindow(ctx, sp.Books, db, dbShards(db), reconDays(from, to, r.cfg.PacketExpiry), from, to, windowRows)
		if err != nil {
			errs++
			if ctx.Err() == nil {
				track.Fail(err, "db", db) // the window is read again at the next pass
			}
			continue
		}
		cursors[db] = w.ToMS
		moved[db] = w.ToMS
		behind = behind || w.ToMS < to
		budget -= len(w.Claims)
		for _, id := range slices.Sorted(maps.Keys(w.Claims)) {
			c := w.Claims[id]
			p.checked.Add(c.Amount)
			claims = append(claims, model.CreditOf(c))
		}
	}
	p.errors += errs
	if errs == 0 && ctx.Err() == nil {
		track.OK() // once per round: one database failing while others answer stays one incident
	}
	r.checkCredits(ctx, i, claims, p)
	if len(moved) > 0 && ctx.Err() == nil {
		// Saved only now that the round's credits were checked: after a
		// restart its windows are checked again rather than skipped.
		if err := storage.SaveReconPositions(ctx, sp.Books, moved); err != nil {
			if ctx.Err() == nil {
				r.inc[i].save.Fail(err, "databases", len(moved))
			}
		} else {
			r.inc[i].save.OK()
		}
	}
	r.checked[i].Store(minCursor(cursors))
	return behind && ctx.Err() == nil
}

// minCursor is the oldest position of cursors: every claim created before it
// has been checked.
func minCursor(cursors map[int]int64) int64 {
	until := int64(0)
	for _, c := range cursors {
		if until == 0 || c < until {
			until = c
		}
	}
	return until
}

// report logs what a pass found and counts it in the metrics: each kind
// of difference at ERROR with its count and sample claim IDs, lagging
// (re-driven) and unverified claims at WARN.
func (r *Reconciler) report(i int, p pass, cursors map[int]int64) {
	m := r.metrics[i]
	m.checkedClaims.Add(float64(p.checked.Count))
	m.checkedCents.Add(float64(p.checked.Cents))
	m.creditedClaims.Add(float64(p.credited.Count))
	m.lagging.Add(float64(p.lagging))
	m.unverified.Add(float64(p.unverified))
	m.errors.Add(float64(p.errors))
	m.differences.Set(float64(p.diffs.Count()))
	for i, k := range model.DiffKinds {
		m.diffs[i].Add(float64(len(p.diffs[k])))
	}
	m.checkedUntil.Set(float64(minCursor(cursors)) / 1000)
	if p.errors == 0 {
		m.lastSuccess.Set(float64(r.clock.Now().UnixMilli()) / 1000)
	}
	space, log := r.spaces[i].Name, r.cfg.Log
	for _, k := range model.DiffKinds {
		if n := len(p.diffs[k]); n > 0 {
			log.Error("reconciliation found a difference", "space", space, "kind", k, "claims", n,
				"sample", p.diffs.Sample(k, samples), "checked_claims", p.checked.Count, "checked_cents", p.checked.Cents,
				"credited_claims", p.credited.Count, "credited_cents", p.credited.Cents)
		}
	}
	if p.lagging > 0 {
		relay := "on"
		if r.cfg.RelayOff() {
			relay = "off"
		}
		log.Warn("reconciliation: claims not credited after the settle time, re-driven through the relay", "space", space,
			"claims", p.lagging, "sample", p.lagSample, "settle", r.cfg.Settle, "relay_switch", relay, "redriven", r.cfg.Redrive != nil)
	}
	if p.unverified > 0 {
		log.Warn("reconciliation: claims whose credits could not be checked", "space", space, "claims", p.unverified)
	}
	if p.diffs.Count() == 0 && p.checked.Count > 0 {
		log.Debug("reconciliation clean", "space", space, "checked_claims", p.checked.Count, "checked_cents", p.checked.Cents,
			"credited_claims", p.credited.Count)
	}
}

// reconDays lists the days of month whose claim tables can hold claims
// created in [fromMS, toMS): a claim sits in its packet's creation day, and
// opens of a packet older than packetExpiry + 48 h make no claim (open.go).
func reconDays(fromMS, toMS int64, packetExpiry time.Duration) []int {
	start := time.UnixMilli(fromMS).UTC().Add(-packetExpiry - 48*time.Hour)
	end := time.UnixMilli(toMS).UTC()
	seen := map[int]bool{}
	var days []int
	for d := time.Date(start.Year(), start.Month(), start.Day(), 0, 0, 0, 0, time.UTC); !d.After(end) && len(days) < 31; d = d.AddDate(0, 0, 1) {
		if !seen[d.Day()] {
			seen[d.Day()] = true
			days = append(days, d.Day())
		}
	}
	return days
}

// spaceMetrics are reconciliation's series of one space (label space).
type spaceMetrics struct {
	diffs                                                                    [len(model.DiffKinds)]prometheus.Counter
	differences, lastSuccess, checkedUntil, passSeconds                      prometheus.Gauge
	checkedClaims, checkedCents, creditedClaims, lagging, unverified, errors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, spaces []Space) []*spaceMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"space"}, labels...))
		reg.MustRegister(v)
		return v
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"space"})
		reg.MustRegister(v)
		return v
	}
	diffs := counter("redcell_recon_differences_total", "Differences reconciliation found, by space and kind (credit_missing, credit_mismatch, credit_orphan, credit_elsewhere).", "kind")
	differences := gauge("redcell_recon_differences", "Differences found by the last reconciliation pass (0: clean).")
	lastSuccess := gauge("redcell_recon_last_success_timestamp_seconds", "Unix time of the last reconciliation pass that read every window it meant to.")
	checkedUntil := gauge("redcell_recon_checked_until_timestamp_seconds", "Claims created before this Unix time have been reconciled (the oldest window end over the databases).")
	checkedClaims := counter("redcell_recon_checked_claims_total", "Claims of settled windows reconciliation checked against their credits.")
	checkedCents := counter("redcell_recon_checked_cents_total", "Cents of the claims of settled windows reconciliation checked against their credits.")
	credited := counter("redcell_recon_credited_claims_total", "Claims reconciliation found credited as claimed.")
	lagging := counter("redcell_recon_lagging_claims_total", "Claims not credited yet when reconciliation checked them (lag, not a difference), re-driven through the relay.")
	unverified := counter("redcell_recon_unverified_claims_total", "Claims whose credits reconciliation could not check (claimant's cell unknown or unreachable).")
	errs := counter("redcell_recon_errors_total", "Reconciliation windows that could not be read (read again at the next pass).")
	passSeconds := gauge("redcell_recon_pass_seconds", "How long the last reconciliation pass took.")
	var out []*spaceMetrics
	for _, sp := range spaces {
		name := sp.Name
		m := &spaceMetrics{
			differences: differences.WithLabelValues(name), lastSuccess: lastSuccess.WithLabelValues(name),
			checkedUntil: checkedUntil.WithLabelValues(name), checkedClaims: checkedClaims.WithLabelValues(name),
			checkedCents: checkedCents.WithLabelValues(name), creditedClaims: credited.WithLabelValues(name),
			lagging: lagging.WithLabelValues(name), unverified: unverified.WithLabelValues(name), errors: errs.WithLabelValues(name),
			passSeconds: passSeconds.WithLabelValues(name),
		}
		for k, kind := range model.DiffKinds {
			m.diffs[k] = diffs.WithLabelValues(name, kind)
		}
		out = append(out, m)
	}
	return out
}

// dbShards lists the shards of database db.
func dbShards(db int) []model.ShardID {
	out := make([]model.ShardID, model.ShardsPerDB)
	for i := range out {
		out[i] = model.ShardID(db*model.ShardsPerDB + i)
	}
	return out
}
