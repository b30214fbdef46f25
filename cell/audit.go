package cell

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/model"
)

// auditTimeout bounds one audit of one space: it reads every money row.
const auditTimeout = 10 * time.Minute

// auditLoop audits the cell's own books, both spaces, every AuditInterval.
func (s *Server) auditLoop(ctx context.Context) {
	every(ctx, s.cfg.AuditInterval, func(int) {
		_, err := s.Audit(ctx, s.spaces[:]...)
		switch {
		case err == nil:
			s.inc.audit.OK()
		case ctx.Err() == nil:
			s.inc.audit.Fail(err, "next_in", s.cfg.AuditInterval.String())
		}
	})
}

// auditor runs one audit at a time: a second Audit waits for the first; the
// admin route does not wait (it answers OVERLOADED).
type auditor struct {
	mu      sync.Mutex // held while an audit reads
	metrics [2]auditSpaceMetrics
}

type auditSpaceMetrics struct {
	runs               [3]prometheus.Counter // by auditResult
	problems, diff, at prometheus.Gauge
}

// Audit outcomes (label result of redcell_audit_runs_total).
const (
	auditOK = iota
	auditFailed
	auditError
)

func newAuditor(reg prometheus.Registerer) *auditor {
	runs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_audit_runs_total",
		Help: "Audits of the cell's own books, by space and result (ok, failed: a difference or problem, error: could not read)."}, []string{"space", "result"})
	problems := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_problems",
		Help: "Problems the last audit of the cell's own books found (0: clean)."}, []string{"space"})
	diff := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_difference_cents",
		Help: "Deposits + credits + refunds - sends - balances at the last audit of the cell's own books; must be 0."}, []string{"space"})
	at := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_audit_last_run_timestamp_seconds",
		Help: "Unix time the last audit of the cell's own books finished reading."}, []string{"space"})
	reg.MustRegister(runs, problems, diff, at)
	a := &auditor{}
	for i, name := range [2]string{"real", "shadow"} {
		m := &a.metrics[i]
		for r, result := range [3]string{"ok", "failed", "error"} {
			m.runs[r] = runs.WithLabelValues(name, result)
		}
		m.problems, m.diff, m.at = problems.WithLabelValues(name), diff.WithLabelValues(name), at.WithLabelValues(name)
	}
	return a
}

// Audit reads every money row of the given spaces and checks what the cell
// can prove from its own rows alone (model.AuditCell): balances against flows,
// packets against claims, refunds and remainders, claims against the outbox,
// and delivered claims of its own claimants against their credits. A report
// that is not OK is logged at ERROR with its problems; either way the result
// is in the metrics (redcell_audit_*). One audit runs at a time. Errors: the
// store's, when a space could not be read.
func (s *Server) Audit(ctx context.Context, spaces ...*space) (api.AuditResponse, error) {
	s.auditor.mu.Lock()
	defer s.auditor.mu.Unlock()
	return s.audit(ctx, spaces...)
}

// audit is Audit with s.auditor.mu held.
func (s *Server) audit(ctx context.Context, spaces ...*space) (api.AuditResponse, error) {
	out := api.AuditResponse{OK: true, Spaces: map[string]model.CellAudit{}}
	for _, sp := range spaces {
		m := &s.auditor.metrics[0]
		if sp.stress {
			m = &s.auditor.metrics[1]
		}
		actx, cancel := context.WithTimeout(ctx, auditTimeout)
		start := time.Now()
		l, err := sp.store.Ledger(actx, s.cfg.Name)
		cancel()
		if err != nil {
			m.runs[auditError].Inc()
			return out, fmt.Errorf("cell: audit of %s space: %w", spaceName(sp), err)
		}
		a := model.AuditCell(l, s.Owns)
		m.at.Set(float64(time.Now().UnixMilli()) / 1000)
		m.problems.Set(float64(len(a.Problems)))
		m.diff.Set(float64(a.Difference))
		out.Spaces[spaceName(sp)] = a
		attrs := []any{"space", spaceName(sp), "took", time.Since(start).Round(time.Millisecond), "deposits", a.Deposits,
			"credits", a.CreditsIn, "balances", a.Balances, "claims", a.Claims, "claimed", a.Claimed,
			"outbox_pending", a.OutboxPending, "difference", a.Difference}
		if a.OK() {
			m.runs[auditOK].Inc()
			s.log.Info("audit of the cell's books OK", attrs...)
			continue
		}
		m.runs[auditFailed].Inc()
		out.OK = false
		s.log.Error("audit of the cell's books FAILED", append(attrs, "problems", len(a.Problems), "differences", a.Differences)...)
		for _, p := range a.Problems[:min(len(a.Problems), 20)] {
			s.log.Error("audit problem", "space", spaceName(sp), "problem", p)
		}
	}
	return out, nil
}
