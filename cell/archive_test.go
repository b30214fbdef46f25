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
}

func (c *cutStore) CommitGroup(_ context.Context, ops []storage.Op) error {
	if len(ops) != 1 {
		return fmt.Errorf("cutStore runs one archive pass at a time, not %d ops", len(ops))
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
		func(model.ShardID) bool { return true }, 7*24*time.Hour, time.Hour, clk, log, reg)
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
		a.owns, 7*24*time.Hour, time.Hour, clk, log, prometheus.NewRegistry())
	if _, err := plain.once(context.Background(), plain.spaces[0]); err != nil {
		t.Fatalf("a store without day tables: %v", err)
	}
	check(plain.failures.WithLabelValues("real"), 0)

	off := newArchiver(a.spaces, a.owns, 0, time.Hour, clk, a.log, prometheus.NewRegistry())
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
