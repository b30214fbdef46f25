package rewards

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/cell/rewardtoken"
	"redcell/model"
)

// The codes a token is refused with (POST /v1/accounts/{act_id}/tokens),
// each a series of redcell_reward_tokens_refused_total from the start: the
// checks' own (TOKEN_WRONG_*, TOKEN_MISMATCH), Verify's (rewardtoken), the
// budget's and the token_restore switch's.
const (
	tokenWrongAccount = "TOKEN_WRONG_ACCOUNT"
	tokenWrongSpace   = "TOKEN_WRONG_SPACE"
	tokenMismatch     = "TOKEN_MISMATCH"
	tokenRestoreOff   = "TOKEN_RESTORE_OFF"
)

var tokenRefusalCodes = []string{
	rewardtoken.ErrMalformed.Reason, rewardtoken.ErrUnknownKey.Reason, rewardtoken.ErrBadSignature.Reason,
	rewardtoken.ErrRetiredKey.Reason, rewardtoken.ErrExpired.Reason,
	tokenWrongAccount, tokenWrongSpace, tokenMismatch, model.ErrBudgetExhausted.Code, tokenRestoreOff,
}

// metrics are the reward wallet's series, by space: rewards issued, booked
// by the booker and how long they waited, rewards pending at the last
// reconciliation pass, reward tokens refused (by code) and restored, and
// each open scene's budget left (read at each scrape).
type metrics struct {
	issued   *prometheus.CounterVec   // space
	booked   *prometheus.CounterVec   // space
	ticks    *prometheus.CounterVec   // space: the booker's ticks, booking or not
	lag      *prometheus.HistogramVec // space: issue → booked by the booker, seconds
	pending  *prometheus.GaugeVec     // space
	refused  *prometheus.CounterVec   // space, code
	restored *prometheus.CounterVec   // space
}

func newMetrics(reg prometheus.Registerer, i *Issuer) *metrics {
	m := &metrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_issued_total",
			Help: "Rewards issued (stored pending, repeats not counted), restored ones included."}, []string{"space"}),
		booked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_booked_total",
			Help: "Rewards the booker booked into wallets (forced bookings of a withdrawal or book_now not counted)."}, []string{"space"}),
		ticks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_booker_ticks_total",
			Help: "Ticks of each space's booker (every booking_interval), booking or not (switched off, nothing to book): it runs."}, []string{"space"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "redcell_reward_booking_lag_seconds",
			Help:    "From a reward's issue to its booking by the booker.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}}, []string{"space"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_reward_pending",
			Help: "Rewards issued and not booked yet in the cell's databases, at the last reward reconciliation pass (every minute)."}, []string{"space"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_tokens_refused_total",
			Help: "Reward tokens refused by POST /v1/accounts/{act_id}/tokens, by code (TOKEN_BAD_SIGNATURE, TOKEN_MISMATCH, TOKEN_RESTORE_OFF, ...)."}, []string{"space", "code"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_reward_tokens_restored_total",
			Help: "Rewards stored again from a valid token the cell did not hold."}, []string{"space"}),
	}
	for _, sp := range []string{"real", "shadow"} {
		m.issued.WithLabelValues(sp)
		m.booked.WithLabelValues(sp)
		m.ticks.WithLabelValues(sp)
		m.lag.WithLabelValues(sp)
		m.restored.WithLabelValues(sp)
		for _, code := range tokenRefusalCodes {
			m.refused.WithLabelValues(sp, code)
		}
	}
	reg.MustRegister(m.issued, m.booked, m.ticks, m.lag, m.pending, m.refused, m.restored, budgetLeft{i: i,
		desc: prometheus.NewDesc("redcell_reward_budget_left",
			"What each scene of an open stage may still issue (its budget in cents for cash, its stock in pieces otherwise, less what the cluster issued as of the last flush of the issued counters), by space, parent activity, child, scene and award type.",
			[]string{"space", "parent", "child", "scene", "award_type"}, nil)})
	return m
}

// tokenRefused counts one refused token of space (its name).
func (m *metrics) tokenRefused(space, code string) {
	if code == "" {
		code = rewardtoken.ErrMalformed.Reason // Verify's errors all have a reason
	}
	m.refused.WithLabelValues(space, code).Inc()
}

// bookedNow counts n rewards booked at now by the booker of space (its
// name), of the taken rs (each observed in the lag: one booked meanwhile
// by its owner's withdrawal was booked about as late).
func (m *metrics) bookedNow(space string, rs []model.Reward, n int, now time.Time) {
	m.booked.WithLabelValues(space).Add(float64(n))
	lag := m.lag.WithLabelValues(space)
	for _, r := range rs {
		if r.CreatedMS > 0 {
			lag.Observe(now.Sub(time.UnixMilli(r.CreatedMS)).Seconds())
		}
	}
}

// budgetLeft is redcell_reward_budget_left: for each scene of each parent's
// stage open now, its budget (or stock) less the issued counter's reading.
// It reads in-process state only: no database or memcached per scrape.
type budgetLeft struct {
	i    *Issuer
	desc *prometheus.Desc
}

func (b budgetLeft) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b budgetLeft) Collect(ch chan<- prometheus.Metric) {
	t := b.i.acts.Tree()
	if t == nil {
		return
	}
	now := b.i.clock.Now()
	for _, p := range t.Parents() {
		c := t.ChildAt(p.ID, now)
		if c == nil {
			continue
		}
		for _, rw := range c.Rewards {
			for _, sc := range rw.Scenes {
				key := model.BudgetKey(p.ID, c.ID, sc.ID)
				for n, sp := range b.i.cfg.Spaces {
					left := sc.Total() - b.i.Issued(n, key)
					ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, float64(left), sp.Name, p.ID, c.ID, sc.ID, sc.AwardType)
				}
			}
		}
	}
}
