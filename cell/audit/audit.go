// Package audit is a cell's audit of its own books: every money row of each
// space checked in one snapshot as model.AuditCell checks a ledger, hourly and
// on demand (the admin port). The store sums and joins the rows where they are
// and returns only problem rows (storage.Books.CellAudit), so the audit's
// memory does not grow with the rows. An Auditor is built from what it reads:
// each space's books, the cell's name and shard ownership, a clock, a logger
// and a metrics registry; it knows nothing of the cell's server.
package audit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
)

// Ledgers is the part of a cell's store the audit reads (storage.Books).
type Ledgers interface {
	// CellAudit checks every money row in one snapshot, with bounded memory.
	CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error)
}

// Space is one money space to audit: real money or the shadow tables.
type Space struct {
	Name  string // "real" or "shadow": its metrics label and its key in the report
	Books Ledgers
}

// Config is what an Auditor is built from. Every field is required but Clock
// (nil: the system clock).
type Config struct {
	Cell     string                   // the cell's name, as its ledger rows know it
	Owns     func(model.ShardID) bool // whether the cell owns a shard (its claimants' credits are checked)
	Interval time.Duration            // how often Run audits (AuditInterval)
	Clock    clock.Clock
	Log      *slog.Logger
	Reg      prometheus.Registerer
}

// timeout bounds one audit of one space: it reads every money row.
const timeout = 10 * time.Minute

// Auditor audits the cell's books, one audit at a time: Audit waits for one
// that runs, TryAudit does not (it answers OVERLOADED). Safe for concurrent use.
type Auditor struct {
	cfg     Config
	clock   clock.Clock
	spaces  []Space
	metrics []spaceMetrics    // by space, as spaces
	failing *incident.Tracker // the periodic audit could not run

	mu sync.Mutex // held while an audit reads
}

type spaceMetrics struct {
	runs               [3]prometheus.Counter // by result
	problems, diff, at prometheus.Gauge
}

// Audit outcomes (label result of redcell_audit_runs_total).
const (
	resultOK = iota
	resultFailed
	resultError
)

// New builds an auditor over spaces and registers its metrics with cfg.Reg;
// it does no I/O.
func New(cfg Config, spaces ...Space) *Auditor {
	runs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_audit_runs_total",
		Help: "Audits of the cell's own books, by space and result (ok, failed: a difference or problem, error: could not read)."}, []string{"space", "result"})
	problems := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_problems",
		Help: "Problems the last audit of the cell's own books found (0: clean)."}, []string{"space"})
	diff := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_difference_cents",
		Help: "Deposits + rewards + credits + refunds - sends - withdrawals - balances at the last audit of the cell's own books; must be 0."}, []string{"space"})
	at := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_last_run_timestamp_seconds",
		Help: "Unix time the last audit of the cell's own books finished reading."}, []string{"space"})
	cfg.Reg.MustRegister(runs, problems, diff, at)
	a := &Auditor{cfg: cfg, clock: clock.Or(cfg.Clock), spaces: spaces,
		failing: incident.NewLines(cfg.Log, incident.Lines{Start: "audit of the cell's books could not run",
			Still: "audit of the cell's books still cannot run", End: "audit of the cell's books runs again"}, incident.DefaultEvery)}
	for _, sp := range spaces {
		var m spaceMetrics
		for r, result := range [3]string{"ok", "failed", "error"} {
			m.runs[r] = runs.WithLabelValues(sp.Name, result)
		}
		m.problems, m.diff, m.at = problems.WithLabelValues(sp.Name), diff.WithLabelValues(sp.Name), at.WithLabelValues(sp.Name)
		a.metrics = append(a.metrics, m)
	}
	return a
}

// Run audits every space every Interval until ctx ends.
func (a *Auditor) Run(ctx context.Context) {
	clock.Every(ctx, a.clock, a.cfg.Interval, func(int) {
		_, err := a.Audit(ctx, "")
		switch {
		case err == nil:
			a.failing.OK()
		case ctx.Err() == nil:
			a.failing.Fail(err, "next_in", a.cfg.Interval.String())
		}
	})
}

// Audit checks every money row of the space named (every space for "") for
// what the cell can prove from its own rows alone (model.AuditCell):
// balances against flows, packets against claims, refunds and remainders,
// and the claims of its own claimants against their credits (one not
// credited yet is counted pending, not a difference). A report that is not
// OK is logged at ERROR with its problems; either way the result is in the
// metrics (redcell_audit_*). It
// waits while another audit runs. Errors: ErrInvalidArgument for an unknown
// space; the store's, when a space could not be read.
func (a *Auditor) Audit(ctx context.Context, space string) (api.AuditResponse, error) {
	spaces, err := a.pick(space)
	if err != nil {
		return api.AuditResponse{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.auditLocked(ctx, spaces)
}

// TryAudit is Audit unless an audit runs already: then it answers
// ErrOverloaded at once rather than wait (an admin request should not hold
// its connection for minutes behind another).
func (a *Auditor) TryAudit(ctx context.Context, space string) (api.AuditResponse, error) {
	spaces, err := a.pick(space)
	if err != nil {
		return api.AuditResponse{}, err
	}
	if !a.mu.TryLock() {
		return api.AuditResponse{}, model.Errorf(model.ErrOverloaded, "an audit of this cell is running; retry when it is done")
	}
	defer a.mu.Unlock()
	return a.auditLocked(ctx, spaces)
}

// pick returns the indexes of the spaces name selects: all for "".
func (a *Auditor) pick(name string) ([]int, error) {
	var out []int
	for i, sp := range a.spaces {
		if name == "" || sp.Name == name {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		return nil, model.Invalidf("space must be real or shadow, got %q", name)
	}
	return out, nil
}

// auditLocked audits the spaces with indexes idx; a.mu must be held.
func (a *Auditor) auditLocked(ctx context.Context, idx []int) (api.AuditResponse, error) {
	out := api.AuditResponse{OK: true, Spaces: map[string]model.CellAudit{}}
	for _, i := range idx {
		sp, m := a.spaces[i], &a.metrics[i]
		actx, cancel := context.WithTimeout(ctx, timeout)
		start := a.clock.Now()
		rep, err := sp.Books.CellAudit(actx, a.cfg.Cell, a.cfg.Owns)
		cancel()
		if err != nil {
			m.runs[resultError].Inc()
			return out, fmt.Errorf("cell: audit of %s space: %w", sp.Name, err)
		}
		read := a.clock.Now()
		m.at.Set(float64(read.UnixMilli()) / 1000)
		m.problems.Set(float64(len(rep.Problems)))
		m.diff.Set(float64(rep.Difference))
		out.Spaces[sp.Name] = rep
		attrs := []any{"space", sp.Name, "took", read.Sub(start).Round(time.Millisecond), "deposits", rep.Deposits,
			"rewards", rep.Rewards, "withdrawals", rep.Withdrawals, "credits", rep.CreditsIn, "balances", rep.Balances,
			"claims", rep.Claims, "claimed", rep.Claimed, "credits_pending", rep.CreditsPending, "difference", rep.Difference}
		if rep.OK() {
			m.runs[resultOK].Inc()
			a.cfg.Log.Info("audit of the cell's books OK", attrs...)
			continue
		}
		m.runs[resultFailed].Inc()
		out.OK = false
		a.cfg.Log.Error("audit of the cell's books FAILED", append(attrs, "problems", len(rep.Problems), "differences", rep.Differences)...)
		for _, p := range rep.Problems[:min(len(rep.Problems), 20)] {
			a.cfg.Log.Error("audit problem", "space", sp.Name, "problem", p)
		}
	}
	return out, nil
}
