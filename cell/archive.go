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
	spaces [2]*space
	owns   func(model.ShardID) bool
	// enter registers a step writing database db as work a move's freeze
	// waits for, if the cell serves db (ok false: skip it); nil: no check.
	enter     func(db int) (leave func(), ok bool)
	retention time.Duration // Config.Retention; 0: off
	interval  time.Duration // Config.ArchiveInterval
	clock     clock.Clock
	log       *slog.Logger

	packets, claims, cents *prometheus.CounterVec // by space
	unsettled, at          *prometheus.GaugeVec   // by space
	failures               *prometheus.CounterVec // by space

	exportAfter time.Duration // Config.ExportAfter; 0: off
	exportDir   string        // Config.ExportDir
	claimWindow time.Duration // a day + Config.PacketExpiry + 72h: storage.ExportPass.ClaimWindow

	exported       *prometheus.CounterVec // by space, kind
	exportFiles    *prometheus.CounterVec // by space
	exportFailures *prometheus.CounterVec // by space
	exportHeld     *prometheus.GaugeVec   // by space
}

func newArchiver(spaces [2]*space, owns func(model.ShardID) bool, cfg Config, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *archiver {
	a := &archiver{spaces: spaces, owns: owns, retention: cfg.Retention(), interval: cfg.ArchiveInterval, clock: clk, log: log,
		exportAfter: cfg.ExportAfter(), exportDir: cfg.ExportDir, claimWindow: 24*time.Hour + cfg.PacketExpiry + 72*time.Hour,
		exported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_exported_rows_total",
			Help: "Rows the retention export wrote to files and deleted, by kind (packets, claims, flows, rewards, coupons)."}, []string{"space", "kind"}),
		exportFiles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_export_files_total",
			Help: "Export files written and recorded (each with its .sha256)."}, []string{"space"}),
		exportFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redcell_cell_export_failures_total",
			Help: "Export passes that ended with an error (what they exported stays exported; the next pass goes on)."}, []string{"space"}),
		exportHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "redcell_cell_export_held_databases",
			Help: "Databases whose claims and credits the last export pass kept: reconciliation has not checked them yet."}, []string{"space"}),
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
	reg.MustRegister(a.packets, a.claims, a.cents, a.unsettled, a.at, a.failures, a.exported, a.exportFiles, a.exportFailures, a.exportHeld)
	for _, sp := range spaces {
		if st, ok := sp.store.(interface{ CreditsBelowHorizon() int64 }); ok {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_cell_credits_below_horizon_total",
				Help: "Credits not booked because their claims are dated before their wallet database's export horizon: " +
					"repeats of exported credits, or credits delivered after the export (never booked: the audit reports them).",
				ConstLabels: prometheus.Labels{"space": sp.name}}, func() float64 { return float64(st.CreditsBelowHorizon()) }))
		}
	}
	for _, sp := range spaces { // every series from the start, at 0
		a.packets.WithLabelValues(sp.name)
		a.claims.WithLabelValues(sp.name)
		a.cents.WithLabelValues(sp.name)
		a.unsettled.WithLabelValues(sp.name)
		a.failures.WithLabelValues(sp.name)
		for _, k := range exportKinds {
			a.exported.WithLabelValues(sp.name, k)
		}
		a.exportFiles.WithLabelValues(sp.name)
		a.exportFailures.WithLabelValues(sp.name)
		a.exportHeld.WithLabelValues(sp.name)
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
	a.pass(ctx)
	clock.Every(ctx, a.clock, a.interval, func(int) { a.pass(ctx) })
}

// pass archives each space, then, when the export is on and the archive
// pass went well, exports it.
func (a *archiver) pass(ctx context.Context) {
	for _, sp := range a.spaces {
		if _, err := a.once(ctx, sp); err == nil && a.exportAfter > 0 {
			_, _ = a.export(ctx, sp) // logged and counted
		}
	}
}

// once runs one pass over sp: packets created before now - retention.
func (a *archiver) once(ctx context.Context, sp *space) (storage.ArchiveResult, error) {
	start := a.clock.Now()
	before := start.Add(-a.retention)
	res, err := storage.ArchiveWith(ctx, sp.store, storage.ArchivePass{Owns: a.owns, Enter: a.enter, BeforeMS: before.UnixMilli()})
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

// exportKinds are the kinds of rows storage.ExportResult counts.
var exportKinds = []string{"packets", "claims", "flows", "rewards", "coupons"}

// export runs one retention export over sp (storage.ExportPass): rows older
// than exportAfter go to files under exportDir and leave their tables.
func (a *archiver) export(ctx context.Context, sp *space) (storage.ExportResult, error) {
	start := a.clock.Now()
	before := start.Add(-a.exportAfter)
	res, err := storage.Export(ctx, sp.store, storage.ExportPass{Owns: a.owns, Enter: a.enter, BeforeMS: before.UnixMilli(), Dir: a.exportDir,
		ClaimWindow: a.claimWindow})
	if errors.Is(err, storage.ErrNoArchive) {
		return res, nil
	}
	for _, k := range exportKinds {
		a.exported.WithLabelValues(sp.name, k).Add(float64(res.Rows[k]))
	}
	a.exportFiles.WithLabelValues(sp.name).Add(float64(res.Files))
	if err != nil {
		a.exportFailures.WithLabelValues(sp.name).Inc()
		a.log.Warn("export: pass failed; the next one goes on", "space", sp.name, "files", res.Files, "err", err)
		return res, err
	}
	a.exportHeld.WithLabelValues(sp.name).Set(float64(res.Held))
	if res.Files > 0 || res.Orphans > 0 {
		a.log.Info("export: rows past the retention written to files and deleted", "space", sp.name, "files", res.Files,
			"packets", res.Rows["packets"], "claims", res.Rows["claims"], "flows", res.Rows["flows"], "rewards", res.Rows["rewards"],
			"coupons", res.Rows["coupons"], "cents", res.Cents, "orphan_files_removed", res.Orphans, "created_before", before.UTC().Format(time.RFC3339),
			"dir", a.exportDir, "took", a.clock.Now().Sub(start).Round(time.Millisecond))
	}
	return res, nil
}
