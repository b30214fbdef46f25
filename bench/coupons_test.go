package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
)

// fakeCoupons is a cluster's coupon route and its one cell's metrics: every
// new request is accepted (202) and counted issued at once, 30 ms after its
// acceptance by the cell's histogram.
type fakeCoupons struct {
	accepted atomic.Int64
	noStress atomic.Int64
}

func (f *fakeCoupons) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Request.Header.Peek(api.HeaderStress)) != "1" {
		f.noStress.Add(1)
	}
	if string(ctx.Path()) != api.CouponIssuePath {
		fail(ctx, model.ErrNotFound)
		return
	}
	var req api.CouponIssueRequest
	if !decode(ctx, &req) {
		return
	}
	f.accepted.Add(1)
	no := false
	ctx.SetStatusCode(fasthttp.StatusAccepted)
	reply(ctx, api.CouponRequestState{SerialNo: req.SerialNo, ActID: req.ActID, BatchID: req.BatchID, State: "accepted", Repeat: &no})
}

func (f *fakeCoupons) metrics(ctx *fasthttp.RequestCtx) {
	n := f.accepted.Load()
	fmt.Fprintf(ctx, "# TYPE %[1]s histogram\n%[1]s_bucket{le=\"0.05\"} %[2]d\n%[1]s_bucket{le=\"0.5\"} %[2]d\n%[1]s_bucket{le=\"+Inf\"} %[2]d\n%[1]s_sum %[3]g\n%[1]s_count %[2]d\n",
		couponIssueSeries, n, 0.03*float64(n))
}

func couponsConfig(t *testing.T, f *fakeCoupons) CouponsConfig {
	cfg := DefaultCouponsConfig()
	cfg.RouterURL, cfg.ClusterSecret, cfg.APIKey = serveHandler(t, f.handle), "bench-test-secret-0123", "k"
	cfg.Metrics = []MetricsTarget{{Cell: "cell-1", URL: serveHandler(t, f.metrics) + "/metrics"}}
	cfg.Concurrency, cfg.Duration, cfg.MergeBacklog, cfg.DrainWait = 4, 300*time.Millisecond, 0, 5*time.Second
	return cfg
}

// TestCouponsBaselineAndReal: with a baseline cluster the ceiling runs here
// first, the sustain run there first at this cluster's rate, each cluster's
// requests go to its own router and are read from its own cells, and the
// suite pairs the runs; --real sends no request with the stress mark.
func TestCouponsBaselineAndReal(t *testing.T) {
	mainF, oldF := &fakeCoupons{}, &fakeCoupons{}
	cfg := couponsConfig(t, mainF)
	old := couponsConfig(t, oldF)
	cfg.Baseline = &Cluster{Name: "old", RouterURL: old.RouterURL, ClusterSecret: cfg.ClusterSecret, APIKey: "k", Cells: old.Metrics}
	cfg.Real, cfg.SustainFraction = true, 0.5
	s, err := RunCoupons(context.Background(), cfg)
	if err != nil || !s.OK() || !s.Real {
		t.Fatalf("suite: %v %v %+v", err, s.Problems(), s)
	}
	var order []string
	var mainN, oldN int64
	for _, r := range s.Runs {
		order = append(order, r.label())
		if r.Cluster == "old" {
			oldN += r.Accept.OK
		} else {
			mainN += r.Accept.OK
		}
		if r.Issued != r.Accept.OK {
			t.Errorf("%s: %d issued of %d accepted: each run reads its own cluster's cells", r.label(), r.Issued, r.Accept.OK)
		}
	}
	if got := strings.Join(order, ","); got != "ceiling,old/ceiling,old/sustain,sustain" {
		t.Fatalf("runs %s", got)
	}
	if s.Runs[2].Rate != s.Runs[3].Rate || s.Runs[3].Rate != max(int(s.Sustained*0.5), 1) {
		t.Errorf("sustain rates %d (baseline) and %d, want both half of this cluster's %.0f/s", s.Runs[2].Rate, s.Runs[3].Rate, s.Sustained)
	}
	if mainN == 0 || oldN == 0 || mainF.accepted.Load() != mainN || oldF.accepted.Load() != oldN {
		t.Fatalf("accepts: main %d (its router %d), baseline %d (its router %d)", mainN, mainF.accepted.Load(), oldN, oldF.accepted.Load())
	}
	if n := mainF.noStress.Load() + oldF.noStress.Load(); n != mainN+oldN {
		t.Errorf("%d requests without the stress mark of %d: a real run sends none with it", n, mainN+oldN)
	}
	if len(s.VsBaseline) != 2 || s.VsBaseline[0].Run != "ceiling" || s.VsBaseline[0].OpsPerSec != s.Runs[0].AcceptsPerSec ||
		s.VsBaseline[0].BaselineOpsPerSec != s.Runs[1].AcceptsPerSec || s.VsBaseline[1].BaselineP99MS != s.Runs[2].Accept.LatencyMS.P99 {
		t.Fatalf("pairs %+v", s.VsBaseline)
	}
	if n := strings.Count(strings.Join(s.Targets(), "\n"), "sustain at"); n != 2 {
		t.Errorf("targets %q: want the two of this cluster's sustain run only", s.Targets())
	}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil || !strings.Contains(b.String(), "old/sustain run") ||
		!strings.Contains(b.String(), "ceiling against the baseline: accepts/s") || !strings.Contains(b.String(), "(real traffic") {
		t.Fatalf("text report:\n%s", b.String())
	}
}
