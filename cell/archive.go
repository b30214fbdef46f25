package cell

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// archiveFirst is how long after start the first archive pass runs (then
// every ArchiveInterval): a cell restarted more often than the interval
// still archives.
const archiveFirst = time.Minute

// archiver moves each space's settled packets older than the retention, with
// their claims, out of their day tables into the shards' archive tables, so
// a day's t_packet_Y_DD and t_claim_Y_DD are empty before day DD comes round
// again next month (Config.Retention).
type archiver struct {
	spaces    [2]*space
	owns      func(model.ShardID) bool
	retention time.Duration // Config.Retention; 0: off
	interval  time.Duration // Config.ArchiveInterval
	clock     clock.Clock
	log       *slog.Logger

	packets, claims, cents *prometheus.CounterVec // by space
	unsettled, at          *prometheus.GaugeVec   // by space
	failures               *prometheus.CounterVec // by space
}

func newArchiver(spaces [2]*space, owns func(model.ShardID) bool, retention, interval time.Duration, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *archiver {
	a := &archiver{spaces: spaces, owns: owns, retention: retention, interval: interval, clock: clk, log: log,
		packets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_archived_packets_total",
			Help: "Settled packets moved from their day tables to the archive tables (older than the retention)."}, []string{"space"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_archived_claims_total",
			Help: "Claims moved to the archive tables with their packets."}, []string{"space"}),
		cents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_archived_cents_total",
			Help: "Amounts (cents) of the packets moved to the archive tables."}, []string{"space"}),
		unsettled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_cell_archive_unsettled_packets",
			Help: "Packets older than the retention still open at the last archive pass: their day is not emptied (0 on a healthy cell)."}, []string{"space"}),
		at: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_cell_archive_last_run_timestamp_seconds",
			Help: "When the last archive pass of the space ended without error, Unix seconds."}, []string{"space"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_archive_failures_total",
			Help: "Archive passes that ended with an error (what they moved stays moved; the next pass goes on)."}, []string{"space"}),
	}
	reg.MustRegister(a.packets, a.claims, a.cents, a.unsettled, a.at, a.failures)
	for _, sp := range spaces { // every series from the start, at 0
		a.packets.WithLabelValues(sp.name)
		a.claims.WithLabelValues(sp.name)
		a.cents.WithLabelValues(sp.name)
		a.unsettled.WithLabelValues(sp.name)
		a.failures.WithLabelValues(sp.name)
	}
	return a
}

// run archives both spaces every interval until ctx ends (nothing when the
// retention is 0).
func (a *archiver) run(ctx context.Context) {
	if a.retention <= 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-a.clock.After(min(archiveFirst, a.interval)):
	}
	pass := func(int) {
		for _, sp := range a.spaces {
			a.once(ctx, sp)
		}
	}
	pass(0)
	clock.Every(ctx, a.clock, a.interval, pass)
}

// once runs one pass over sp: packets created before now - retention.
func (a *archiver) once(ctx context.Context, sp *space) (storage.ArchiveResult, error) {
	start := a.clock.Now()
	before := start.Add(-a.retention)
	res, err := storage.Archive(ctx, sp.store, a.owns, before.UnixMilli()) // storage.ArchivePass
	if errors.Is(err, storage.ErrNoArchive) {
		return res, nil
	}
	a.packets.WithLabelValues(sp.name).Add(float64(res.Packets))
	a.claims.WithLabelValues(sp.name).Add(float64(res.Claims))
	a.cents.WithLabelValues(sp.name).Add(float64(res.Cents))
	if err != nil {
		a.failures.WithLabelValues(sp.name).Inc()
		a.log.Warn("archive: pass failed; the next one goes on", "space", sp.name, "moved", res.Packets, "err", err)
		return res, err
	}
	a.unsettled.WithLabelValues(sp.name).Set(float64(res.Unsettled))
	a.at.WithLabelValues(sp.name).Set(float64(a.clock.Now().Unix()))
	if res.Packets > 0 || res.Unsettled > 0 {
		a.log.Info("archive: settled packets moved out of their day tables", "space", sp.name, "packets", res.Packets,
			"claims", res.Claims, "cents", res.Cents, "created_before", before.UTC().Format(time.RFC3339),
			"unsettled", res.Unsettled, "tables", res.Tables, "took", a.clock.Now().Sub(start).Round(time.Millisecond))
	}
	if res.Unsettled > 0 {
		a.log.Warn("archive: packets older than the retention are still open (not refunded): their day tables are not empty",
			"space", sp.name, "packets", res.Unsettled)
	}
	return res, nil
}
