package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/internal/retry"
)

// couponsRunner runs the coupons workload's runs against one cluster
// (this one, or the baseline named cluster).
type couponsRunner struct {
	c       *client
	hc      *http.Client
	cfg     CouponsConfig
	cluster string // the baseline's name; "" this cluster
}

// run is the ceiling (rate 0: closed-loop) or the sustain run (open-loop
// at rate), then the wait for what it accepted to be issued. hotOnly
// sends every request to the first hot batch.
func (cr *couponsRunner) run(ctx context.Context, name, runID string, rate int, hotOnly bool) CouponsRun {
	cfg := cr.cfg
	out := CouponsRun{Name: name, RunID: runID, Mode: modeClosed, Rate: rate, Concurrency: cfg.Concurrency}
	if rate > 0 {
		out.Mode = modeOpen
	}
	var work0 workSnap
	if cfg.Work != nil {
		work0 = cfg.Work.begin(ctx)
	}
	before := scrapeCells(ctx, cr.hc, cfg.Metrics)
	l := cr.newLoad(runID, hotOnly)
	start := time.Now()
	load, cancel := context.WithTimeout(ctx, cfg.Duration)
	stop := startProgress(cfg.Progress, WorkloadCoupons+"/"+name, start, cfg.Duration, func() progressSnapshot {
		return progressSnapshot{noun: "accepts", opens: l.rec.okCount(), errors: l.rec.errorCount()}
	})
	if rate > 0 {
		out.Due, out.Started = l.openLoop(ctx, load, rate)
	} else {
		l.closedLoop(ctx, load, -1)
	}
	cancel()
	stop()
	elapsed := time.Since(start)
	out.ElapsedMS = elapsed.Milliseconds()
	out.Accept = l.rec.stats()
	accepted := l.accepted.Load()
	out.AcceptsPerSec = float64(accepted) / elapsed.Seconds()
	cr.drain(ctx, &out, before, start, accepted)
	if cfg.Work != nil && ctx.Err() == nil {
		out.Work = cfg.Work.end(ctx, work0, accepted, "coupon request")
	}
	return out
}

// drain waits until the cells issued accepted coupons since before (or
// DrainWait passes) and reads the issue latency of the run.
func (cr *couponsRunner) drain(ctx context.Context, out *CouponsRun, before []cellScrape, from time.Time, accepted int64) {
	deadline := time.Now().Add(cr.cfg.DrainWait)
	var d histSnap
	for {
		after := scrapeCells(ctx, cr.hc, cr.cfg.Metrics)
		var ok bool
		var why string
		d, ok, why = histDelta(before, after, couponIssueSeries)
		if !ok {
			out.Note = why
		}
		if ok && int64(d.count) >= accepted || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	out.DrainMS = time.Since(from).Milliseconds()
	out.Issued = int64(d.count)
	if out.DrainMS > 0 {
		out.IssuedPerSec = float64(out.Issued) / (float64(out.DrainMS) / 1000)
	}
	if d.count > 0 {
		q := func(p float64) float64 { v, _, _ := d.quantile(p); return v * 1000 }
		out.IssueLatency = LatencyMS{P50: q(0.5), P99: q(0.99), P999: q(0.999)}
		for i, up := range d.uppers {
			if up == couponTargetS {
				out.WithinTarget = float64(d.buckets[i]) / float64(d.count)
			}
		}
	}
}

// mergeComparison runs the merged side (the cells' merge bound as set)
// and the single side (bound 1), each: hold the layers (coupon_issue off),
// accept MergeBacklog requests of the first hot batch, release, time the
// issue. Both sides run without prefetch (a grant and a return at the
// batch's home per deduction), so the ratio is the merge's alone. It puts
// the bound, the prefetch and the switch back whatever happens.
func (cr *couponsRunner) mergeComparison(ctx context.Context, runID string) ([]CouponsRun, error) {
	// Each cell's merge bound and coupon_issue switch as they are, put back
	// cell by cell at the end (an operator's hold stays a hold).
	type prior struct {
		mergeMax, prefetch int
		couponIssue        string
	}
	priors := make([]prior, len(cr.cfg.AdminURLs))
	for i, base := range cr.cfg.AdminURLs {
		var cb api.CouponBatchesResponse
		var dg api.DegradeSetting
		if err := cr.adminAt(base, http.MethodGet, "/admin/coupons", nil, &cb); err != nil {
			return nil, err
		}
		if err := cr.adminAt(base, http.MethodGet, "/admin/degrade", nil, &dg); err != nil {
			return nil, err
		}
		priors[i] = prior{cb.MergeMax, cb.Prefetch, dg.CouponIssue}
	}
	merged := max(priors[0].mergeMax, 2)
	restore := func() {
		for i, base := range cr.cfg.AdminURLs {
			_ = cr.adminAt(base, http.MethodPut, "/admin/coupons", api.CouponSetting{MergeMax: priors[i].mergeMax, Prefetch: &priors[i].prefetch}, nil)
			_ = cr.adminAt(base, http.MethodPut, "/admin/degrade", api.DegradeSetting{CouponIssue: priors[i].couponIssue}, nil)
		}
	}
	defer restore()
	var runs []CouponsRun
	for i, bound := range []int{merged, 1} {
		if i > 0 && !sleepCtx(ctx, rewardsPause) {
			break
		}
		name := "merged"
		if bound == 1 {
			name = "single"
		}
		none := 0
		if err := cr.admin(http.MethodPut, "/admin/coupons", api.CouponSetting{MergeMax: bound, Prefetch: &none}, nil); err != nil {
			return runs, err
		}
		if err := cr.admin(http.MethodPut, "/admin/degrade", api.DegradeSetting{CouponIssue: "off"}, nil); err != nil {
			return runs, err
		}
		out := CouponsRun{Name: name, RunID: suiteRunID(runID, 2+i), Mode: modeClosed, Concurrency: cr.cfg.Concurrency, MergeMax: bound}
		before := scrapeCells(ctx, cr.hc, cr.cfg.Metrics)
		l := cr.newLoad(out.RunID, true)
		start := time.Now()
		load, cancel := context.WithTimeout(ctx, couponDrainMax)
		l.closedLoop(ctx, load, int64(cr.cfg.MergeBacklog))
		cancel()
		out.ElapsedMS = time.Since(start).Milliseconds()
		out.Accept = l.rec.stats()
		out.AcceptsPerSec = float64(l.accepted.Load()) / time.Since(start).Seconds()
		released := time.Now()
		if err := cr.admin(http.MethodPut, "/admin/degrade", api.DegradeSetting{CouponIssue: "on"}, nil); err != nil {
			return runs, err
		}
		cr.drain(ctx, &out, before, released, l.accepted.Load())
		runs = append(runs, out)
	}
	return runs, nil
}

// admin calls every cell's admin port with the same body.
func (cr *couponsRunner) admin(method, path string, in, out any) error {
	for _, base := range cr.cfg.AdminURLs {
		if err := cr.adminAt(base, method, path, in, out); err != nil {
			return err
		}
	}
	return nil
}

// adminAt calls one cell's admin port (in is the JSON body, out decodes
// the answer).
func (cr *couponsRunner) adminAt(base, method, path string, in, out any) error {
	{
		var body io.Reader
		if in != nil {
			b, _ := json.Marshal(in)
			body = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, base+path, body)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cr.cfg.AdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := cr.hc.Do(req)
		if err != nil {
			return fmt.Errorf("bench: coupons: %s %s%s: %w", method, base, path, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("bench: coupons: %s %s%s: %s %s", method, base, path, resp.Status, strings.TrimSpace(string(b)))
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				return fmt.Errorf("bench: coupons: %s %s%s: %w", method, base, path, err)
			}
		}
	}
	return nil
}

// couponLoad is one run's requests.
type couponLoad struct {
	c        *client
	cfg      CouponsConfig
	runID    string
	hotOnly  bool
	rec      *opRecorder
	next     atomic.Int64
	accepted atomic.Int64 // new requests accepted (not repeats)
}

func (cr *couponsRunner) newLoad(runID string, hotOnly bool) *couponLoad {
	return &couponLoad{c: cr.c, cfg: cr.cfg, runID: runID, hotOnly: hotOnly, rec: newOpRecorder()}
}

// closedLoop: Concurrency workers until load ends or n requests (n < 0:
// no bound but issuesMax) were sent.
func (l *couponLoad) closedLoop(ctx, load context.Context, n int64) {
	if n < 0 {
		n = issuesMax
	}
	closedLoopN(load, l.cfg.Concurrency, n, &l.next, func(k int64) { l.issue(ctx, time.Time{}, k) })
}

// openLoop starts request k at its scheduled time at rate per second.
func (l *couponLoad) openLoop(ctx, load context.Context, rate int) (due, started int64) {
	return openLoopN(load, l.cfg.Concurrency, rate, issuesMax, func(at time.Time, k int64) { l.issue(ctx, at, k) }, l.rec.recordDropped)
}

// batch is request k's batch, drawn from the seed.
func (l *couponLoad) batch(k int64) string {
	if l.hotOnly {
		return l.cfg.Hot[0]
	}
	r := rand.New(rand.NewPCG(l.cfg.Seed, uint64(k)))
	if len(l.cfg.Hot) > 0 && r.Float64() < l.cfg.HotShare {
		return l.cfg.Hot[r.IntN(len(l.cfg.Hot))]
	}
	return l.cfg.Cold[r.IntN(len(l.cfg.Cold))]
}

// issue sends request k (a fresh person), retrying a retryable failure:
// the serial makes a retry a repeat at worst.
func (l *couponLoad) issue(ctx context.Context, due time.Time, k int64) {
	id := l.runID + "-c" + strconv.FormatInt(k, 10)
	req := api.CouponIssueRequest{ActID: id, BatchID: l.batch(k), SerialNo: id}
	var out api.CouponRequestState
	var res result
	start := due
	_ = retry.Do(ctx, retry.Policy{Attempts: attemptsMax, Backoff: retryBackoff, Retryable: isRetryable}, func(attempt int) error {
		out = api.CouponRequestState{}
		res = l.c.callFrom(start, http.MethodPost, api.CouponIssuePath, req, &out)
		start = time.Time{}
		if res.code == "" && (out.SerialNo != req.SerialNo || out.ActID != req.ActID || out.BatchID != req.BatchID ||
			!slices.Contains([]string{"accepted", "deciding", "issued", "refused"}, out.State)) {
			res.code, res.message = codeBadResponse, fmt.Sprintf("coupon answer %+v does not match the request %+v", out, req)
		}
		repeat := res.code == "" && attempt > 0
		l.rec.record(res, repeat)
		if res.code != "" {
			return failed{res}
		}
		if !repeat {
			l.accepted.Add(1)
		}
		return nil
	})
}
