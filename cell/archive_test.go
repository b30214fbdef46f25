package cell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
	"redcell/storage/memstore"
)

// cutStore is a space's store that records the cut each archive pass asks
// for and answers res (err after the first call when failAfter).
type cutStore struct {
	storage.Store
	cuts      []int64
	res       storage.ArchiveResult
	failAfter bool
	exports   []storage.ExportPass // the export passes asked for
	exported  storage.ExportResult // what each answers
}

func (c *cutStore) CommitGroup(_ context.Context, ops []storage.Op) error {
	if len(ops) != 1 {
		return fmt.Errorf("cutStore runs one archive pass at a time, not %d ops", len(ops))
	}
	if x, ok := ops[0].(*storage.ExportPass); ok {
		c.exports = append(c.exports, *x)
		x.Result = c.exported
		return nil
	}
	a, ok := ops[0].(*storage.ArchivePass)
	if !ok {
		return fmt.Errorf("cutStore runs archive passes only, not %T", ops[0])
	}
	c.cuts = append(c.cuts, a.BeforeMS)
	if c.failAfter && len(c.cuts) > 1 {
		a.Result = storage.ArchiveResult{Packets: 1}
		return errors.New("database went away")
	}
	a.Result = c.res
	return nil
}

// TestArchiverCutAndMetrics: a pass asks each space's store for the
// packets created before now - retention, counts what moved per space,
// keeps the unsettled count and the time of the last good pass, and
// counts a failed pass without touching them; retention 0 runs nothing.
func TestArchiverCutAndMetrics(t *testing.T) {
	now := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewManual(now)
	real := &cutStore{res: storage.ArchiveResult{Packets: 40, Claims: 90, Cents: 12_345, Unsettled: 2}, failAfter: true}
	shadow := &cutStore{}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := newArchiver([2]*space{{name: "real", store: real}, {name: "shadow", stress: true, store: shadow}},
		func(model.ShardID) bool { return true }, Config{RetentionConfig: RetentionConfig{RetentionDays: days(7), ArchiveInterval: time.Hour}}, clk, log, reg)
	for _, sp := range a.spaces {
		if _, err := a.once(context.Background(), sp); err != nil {
			t.Fatal(err)
		}
	}
	want := now.Add(-7 * 24 * time.Hour).UnixMilli()
	if len(real.cuts) != 1 || real.cuts[0] != want || len(shadow.cuts) != 1 || shadow.cuts[0] != want {
		t.Fatalf("cuts %v %v, want [%d] each", real.cuts, shadow.cuts, want)
	}
	check := func(c prometheus.Collector, want float64) {
		t.Helper()
		if got := testutil.ToFloat64(c); got != want {
			t.Errorf("%v: %v, want %v", c, got, want)
		}
	}
	check(a.packets.WithLabelValues("real"), 40)
	check(a.claims.WithLabelValues("real"), 90)
	check(a.cents.WithLabelValues("real"), 12_345)
	check(a.unsettled.WithLabelValues("real"), 2)
	check(a.at.WithLabelValues("real"), float64(now.Unix()))
	check(a.packets.WithLabelValues("shadow"), 0)
	clk.Advance(time.Hour)
	if _, err := a.once(context.Background(), a.spaces[0]); err == nil {
		t.Fatal("a failing pass answered no error")
	}
	check(a.failures.WithLabelValues("real"), 1)
	check(a.packets.WithLabelValues("real"), 41) // what it moved before the error stays counted
	check(a.unsettled.WithLabelValues("real"), 2)
	check(a.at.WithLabelValues("real"), float64(now.Unix()))

	// A store without day tables (storage.ErrNoArchive): skipped, no failure counted.
	mem := memstore.New(clk)
	plain := newArchiver([2]*space{{name: "real", store: mem}, {name: "shadow", store: mem}},
		a.owns, Config{RetentionConfig: RetentionConfig{RetentionDays: days(7), ArchiveInterval: time.Hour}}, clk, log, prometheus.NewRegistry())
	if _, err := plain.once(context.Background(), plain.spaces[0]); err != nil {
		t.Fatalf("a store without day tables: %v", err)
	}
	check(plain.failures.WithLabelValues("real"), 0)

	off := newArchiver(a.spaces, a.owns, Config{RetentionConfig: RetentionConfig{RetentionDays: days(0), ArchiveInterval: time.Hour}}, clk, a.log, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { off.run(ctx); close(done) }()
	select {
	case <-done: // retention 0: run returns at once
	case <-time.After(5 * time.Second):
		cancel()
		t.Fatal("run with retention 0 did not return")
	}
	cancel()
}

// TestArchiverExports: with export_days set, each pass exports a space
// after archiving it, asking for rows older than now - ExportAfter into
// ExportDir, and counts what it exported by kind; a space whose archive
// pass failed is not exported in that pass; with ExportAfter 0 nothing is.
func TestArchiverExports(t *testing.T) {
	now := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewManual(now)
	real := &cutStore{exported: storage.ExportResult{Files: 3, Rows: map[string]int64{"flows": 7, "packets": 2, "claims": 5}, Held: 1}}
	broken := &cutStore{failAfter: true}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{RetentionConfig: RetentionConfig{RetentionDays: days(7), ArchiveInterval: time.Hour, ExportDays: 30, ExportDir: "/var/lib/redcell/export"}}
	a := newArchiver([2]*space{{name: "real", store: real}, {name: "shadow", stress: true, store: broken}},
		func(model.ShardID) bool { return true }, cfg, clk, log, prometheus.NewRegistry())
	a.pass(context.Background())
	a.pass(context.Background()) // the shadow space's archive pass fails this time
	want := now.Add(-30 * 24 * time.Hour).UnixMilli()
	if len(real.exports) != 2 || real.exports[0].BeforeMS != want || real.exports[0].Dir != cfg.ExportDir {
		t.Fatalf("real space's exports %+v; want 2 before %d into %s", real.exports, want, cfg.ExportDir)
	}
	if len(broken.exports) != 1 {
		t.Fatalf("the shadow space was exported %d times; want once (its second archive pass failed)", len(broken.exports))
	}
	for kind, n := range map[string]float64{"flows": 14, "packets": 4, "claims": 10, "rewards": 0} {
		if got := testutil.ToFloat64(a.exported.WithLabelValues("real", kind)); got != n {
			t.Errorf("exported %s: %v, want %v", kind, got, n)
		}
	}
	if got := testutil.ToFloat64(a.exportFiles.WithLabelValues("real")); got != 6 {
		t.Errorf("files %v, want 6", got)
	}
	if got := testutil.ToFloat64(a.exportHeld.WithLabelValues("real")); got != 1 {
		t.Errorf("held %v, want 1", got)
	}
	off := &cutStore{}
	plain := newArchiver([2]*space{{name: "real", store: off}, {name: "shadow", store: off}}, a.owns,
		Config{RetentionConfig: RetentionConfig{RetentionDays: days(7), ArchiveInterval: time.Hour}}, clk, log, prometheus.NewRegistry())
	plain.pass(context.Background())
	if len(off.cuts) != 2 || len(off.exports) != 0 {
		t.Fatalf("export off: %d archive passes, %d exports; want 2, 0", len(off.cuts), len(off.exports))
	}
}

// days is a RetentionDays of n.
func days(n int) *int { return &n }
