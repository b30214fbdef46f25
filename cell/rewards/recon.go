package rewards

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/internal/clock"
	"redcell/storage"
)

// Reward reconciliation: every minute each space checks the rewards its
// databases booked into wallets since the last check against the reward
// flows booked for them (storage.RewardReconQuery: per database, by
// booked time, through the reward table's k_booked index), and every hour
// it checks them all again from the start, then also counting the reward
// flows (a scan of the flow tables) to catch a flow without its reward. It
// also reports the rewards left unbooked for longer than rewardStale (the
// booker is stopped, or cannot book). Problems are logged with samples and
// counted in redcell_reward_recon_problems; the audit (redcell audit) checks
// the same rows across cells with their budgets.

const (
	rewardReconEvery = time.Minute
	rewardReconFull  = time.Hour
	rewardReconLag   = 5 * time.Second // a window ends this long before now: bookings in flight finish first
	rewardStale      = 5 * time.Minute
)

// reconMetrics are the reconciliation's series, by space.
type reconMetrics struct {
	problems *prometheus.GaugeVec // problems found by the last pass
	stale    *prometheus.GaugeVec // rewards unbooked for more than rewardStale at the last pass
	passes   *prometheus.CounterVec
}

func newReconMetrics(reg prometheus.Registerer) *reconMetrics {
	m := &reconMetrics{
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_reward_recon_problems",
			Help: "Problems the last reward reconciliation pass found: booked rewards without their flow, or windows whose rewards and flows differ."}, []string{"space"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_reward_pending_stale",
			Help: "Rewards issued more than 5 minutes ago and not booked yet, at the last reward reconciliation pass."}, []string{"space"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_recon_passes_total",
			Help: "Reward reconciliation passes, by space and kind (window: the last minute; full: from the start)."}, []string{"space", "kind"}),
	}
	reg.MustRegister(m.problems, m.stale, m.passes)
	return m
}

// reconciler returns the loop reconciling space's rewards until ctx ends.
func (i *Issuer) reconciler(space int) func(ctx context.Context) {
	return func(ctx context.Context) {
		tick := clock.NewTicker(i.clock, rewardReconEvery)
		var pos int64 // checked up to (booked time, Unix ms)
		lastFull := time.Time{}
		for tick.Wait(ctx) {
			now := i.clock.Now()
			to := now.Add(-rewardReconLag).UnixMilli()
			from, kind := pos, "window"
			if now.Sub(lastFull) >= rewardReconFull {
				from, kind, lastFull = 0, "full", now
			}
			if i.reconcile(ctx, space, from, to, kind) {
				pos = to
			}
		}
	}
}

// reconcile checks [from, to) in every database of the cell; ok is false
// when a database could not be read (the window is checked again).
func (i *Issuer) reconcile(ctx context.Context, space int, from, to int64, kind string) (ok bool) {
	ok = true
	sp := i.cfg.Spaces[space]
	problems, stale, pending := 0, int64(0), int64(0)
	staleMS := i.clock.Now().Add(-rewardStale).UnixMilli()
	for _, db := range i.cfg.Own.DBs() {
		r, err := storage.RewardRecon(ctx, sp.Store, db, from, to, staleMS, kind == "full")
		if err != nil {
			if ctx.Err() == nil {
				i.reads[space].Fail(err, "db", db)
			}
			ok = false
			continue
		}
		stale += r.StalePending
		pending += r.Pending
		for _, p := range r.Problems() {
			problems++
			i.cfg.Log.Warn("reward recon: problem", "space", sp.Name, "kind", kind, "problem", p)
		}
	}
	if ok {
		i.reads[space].OK()
	}
	i.recon.problems.WithLabelValues(sp.Name).Set(float64(problems))
	i.recon.stale.WithLabelValues(sp.Name).Set(float64(stale))
	if ok { // a database not read would make the sum low
		i.metrics.pending.WithLabelValues(sp.Name).Set(float64(pending))
	}
	i.recon.passes.WithLabelValues(sp.Name, kind).Inc()
	if stale > 0 {
		i.cfg.Log.Warn("reward recon: rewards unbooked for more than 5 minutes", "space", sp.Name, "rewards", stale)
	}
	return ok
}
