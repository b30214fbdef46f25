package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
)

// loadConfig is a short run of workload w against the fake.
func loadConfig(url string, f *fakeRouter, w string) Config {
	cfg := DefaultWorkloadConfig(w)
	cfg.RouterURL = url
	cfg.Openers = 8
	cfg.Senders = 2
	cfg.Duration = 600 * time.Millisecond
	cfg.RunID = "t2"
	cfg.Audit = f.audit
	cfg.ClusterSecret = testSecret // used by direct runs only
	if w == WorkloadFestival || w == WorkloadCold {
		cfg.Users = 5000
	}
	return cfg
}

// checkMoney compares the report with the fake's books: every claim the fake
// made is in the report, and the report passed.
func checkMoney(t *testing.T, f *fakeRouter, rep Report) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if rep.ClaimedCents != f.paidCents || rep.Open.OK != int64(f.nClaims) {
		t.Errorf("claimed %d cents in %d opens, fake paid %d in %d claims", rep.ClaimedCents, rep.Open.OK, f.paidCents, f.nClaims)
	}
	if rep.SentCents != f.sentCents || rep.DepositedCents != f.depositedCents {
		t.Errorf("sent %d deposited %d, fake %d %d", rep.SentCents, rep.DepositedCents, f.sentCents, f.depositedCents)
	}
	if !rep.OK() {
		t.Errorf("report not OK: %v", rep.Problems())
	}
	if n := f.noStress.Load(); n != 0 {
		t.Errorf("%d requests lacked the stress header", n)
	}
	if rep.Audit == nil || rep.Audit.Difference != 0 || !rep.BalancesChecked || rep.BalanceSample == 0 || rep.BalanceMismatches != 0 {
		t.Errorf("audit %+v, balances checked %v over %d, %d mismatches", rep.Audit, rep.BalancesChecked, rep.BalanceSample, rep.BalanceMismatches)
	}
	logReportIfFailed(t, rep)
}

func TestHotClosedLoop(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	f.creditDelay = 50 * time.Millisecond
	cfg := loadConfig(f.serve(t), f, WorkloadHot)
	var progress bytes.Buffer
	cfg.Progress = &progress
	oldProgress := progressInterval
	progressInterval = 100 * time.Millisecond
	t.Cleanup(func() { progressInterval = oldProgress })

	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkMoney(t, f, rep)
	if rep.Send.OK != 1 || rep.Deposit.OK != 1 || rep.HotPacketID == "" || rep.SoldOutAtMS != 0 {
		t.Errorf("hot: %d sends, %d deposits, packet %q, sold out at %d", rep.Send.OK, rep.Deposit.OK, rep.HotPacketID, rep.SoldOutAtMS)
	}
	f.mu.Lock()
	p := f.packets[rep.HotPacketID]
	claims := len(p.claims)
	for act := range p.claims {
		if !strings.HasPrefix(act, "t2-h") {
			t.Errorf("claimant %q is not a fresh hot account", act)
		}
	}
	f.mu.Unlock()
	if int64(claims) != rep.Open.OK {
		t.Errorf("%d distinct claimants for %d opens: every open must be a fresh account", claims, rep.Open.OK)
	}
	if rep.BalanceSample != min(claims, balanceSampleMax) {
		t.Errorf("balance sample %d, want %d", rep.BalanceSample, min(claims, balanceSampleMax))
	}
	var sum int64
	for _, b := range rep.Timeline {
		sum += b.OK
	}
	if sum != rep.Open.OK || len(rep.Timeline) == 0 {
		t.Errorf("timeline has %d opens in %d buckets, report %d", sum, len(rep.Timeline), rep.Open.OK)
	}
	if !strings.Contains(progress.String(), "[hot] [") || !strings.Contains(progress.String(), "opens/s") {
		t.Errorf("progress = %q", progress.String())
	}
}

// A hot packet that sells out ends the load early; every share is claimed.
func TestHotSoldOutEndsLoad(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	cfg := loadConfig(f.serve(t), f, WorkloadHot)
	cfg.Duration = 10 * time.Second
	cfg.PacketAmount, cfg.PacketCount = 300, 100
	start := time.Now()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Run took %v: the sold-out packet did not end the load", took)
	}
	checkMoney(t, f, rep)
	if rep.SoldOutAtMS == 0 || rep.ClaimedCents != 300 || rep.Open.OK != 100 {
		t.Errorf("sold out at %d ms, claimed %d cents in %d opens", rep.SoldOutAtMS, rep.ClaimedCents, rep.Open.OK)
	}
}

// Open-loop: arrivals keep their schedule while the cluster is slow; the
// in-flight bound drops what does not fit, and latency counts from the
// scheduled start.
func TestHotOpenLoopDropsAtTheBound(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	f.delay = 40 * time.Millisecond // 4 in flight serve at most 100 opens/s
	cfg := loadConfig(f.serve(t), f, WorkloadHot)
	cfg.Rate, cfg.MaxInFlight, cfg.Duration = 400, 4, time.Second
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	dropped := rep.Open.Errors[codeDropped]
	if rep.Mode != modeOpen || rep.Rate != 400 || rep.MaxInFlight != 4 {
		t.Errorf("mode %q rate %d in flight %d", rep.Mode, rep.Rate, rep.MaxInFlight)
	}
	if dropped < 150 {
		t.Errorf("%d opens dropped; at 400/s with capacity ~100/s most should be", dropped)
	}
	if arrivals := rep.Open.Count; arrivals < 300 || arrivals > 450 {
		t.Errorf("%d arrivals in 1 s at 400/s: the schedule did not hold", arrivals)
	}
	// What fell due was either started or dropped (one arrival either way
	// at the edge of the load).
	if d := rep.Started + dropped - rep.Due; rep.Due < 300 || rep.Due > 450 || d < -1 || d > 1 {
		t.Errorf("due %d, started %d, dropped %d", rep.Due, rep.Started, dropped)
	}
	if rep.Open.OK == 0 || rep.Open.LatencyMS.P50 < 40 {
		t.Errorf("%d opens, p50 %.1f ms: latency must include the fake's 40 ms", rep.Open.OK, rep.Open.LatencyMS.P50)
	}
	if rep.OK() || !strings.Contains(strings.Join(rep.Problems(), "\n"), "unexpected "+codeDropped) {
		t.Errorf("drops without AllowShed must fail the run: %v", rep.Problems())
	}
	var timelineErrors int64
	for _, b := range rep.Timeline {
		timelineErrors += b.Errors
	}
	if timelineErrors != dropped {
		t.Errorf("timeline counts %d failures, %d drops", timelineErrors, dropped)
	}
}

// Open-loop latency counts from the schedule: a request started late shows
// its wait.
func TestOpenLoopLatencyFromSchedule(t *testing.T) {
	f := newFakeRouter()
	c := newClient(f.serve(t), 1, "", "")
	res := c.callFrom(time.Now().Add(-200*time.Millisecond), http.MethodGet, "/v1/accounts/x", nil, nil)
	if res.latency < 200*time.Millisecond {
		t.Fatalf("latency %v does not include the 200 ms since the schedule", res.latency)
	}
}

func TestFestival(t *testing.T) {
	for _, rate := range []int{0, 300} {
		t.Run(fmt.Sprintf("rate=%d", rate), func(t *testing.T) {
			shortSettle(t)
			f := newFakeRouter()
			cfg := loadConfig(f.serve(t), f, WorkloadFestival)
			cfg.Rate = rate
			cfg.MaxInFlight = 64
			cfg.AllowShed = rate > 0 // a shared CI machine may drop a few
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkMoney(t, f, rep)
			if rep.Send.OK < 2 || rep.OverClaimedPackets != 0 {
				t.Errorf("%d packets sent, %d over-claimed", rep.Send.OK, rep.OverClaimedPackets)
			}
			// Every open sent is counted once more, in the hot or the cold class
			// (open-loop drops were never sent).
			if rep.OpenHot == nil || rep.OpenCold == nil || rep.OpenHot.Count+rep.OpenCold.Count != rep.Open.Count-rep.Open.Errors[codeDropped] ||
				rep.OpenHot.OK+rep.OpenCold.OK != rep.Open.OK {
				t.Errorf("hot %+v + cold %+v do not add up to all opens %d (%d ok)", rep.OpenHot, rep.OpenCold, rep.Open.Count, rep.Open.OK)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for id, p := range f.packets {
				if p.amount != p.count*festivalShareCents || p.count < festivalCount(festivalGroupMin) {
					t.Errorf("packet %s: %d cents in %d shares", id, p.amount, p.count)
				}
			}
		})
	}
}

// Cold packets are opened by exactly as many users as they have shares: no
// one finds one sold out.
func TestCold(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	cfg := loadConfig(f.serve(t), f, WorkloadCold)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkMoney(t, f, rep)
	if rep.Open.Errors[model.ErrSoldOut.Code] != 0 || rep.Send.OK < 2 || rep.Open.OK < 2 {
		t.Errorf("cold: %d sends, %d opens, %d sold out", rep.Send.OK, rep.Open.OK, rep.Open.Errors[model.ErrSoldOut.Code])
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, p := range f.packets {
		if len(p.claims) > int(p.count) || p.count != cfg.PacketCount {
			t.Errorf("packet %s: %d claims of %d shares", id, len(p.claims), p.count)
		}
	}
}

// A real run (Config.Real) sends no request marked as stress traffic, and is
// otherwise the same run: its money balances, its report says so; it is
// refused in direct mode.
func TestRealRunIsNotStress(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	cfg := loadConfig(f.serve(t), f, WorkloadRoundRobin)
	cfg.Packets, cfg.Real = 20, true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if f.stress.Load() != 0 || f.noStress.Load() < rep.Open.OK+rep.Send.OK {
		t.Errorf("%d requests marked as stress, %d not, for %d opens and %d sends", f.stress.Load(), f.noStress.Load(), rep.Open.OK, rep.Send.OK)
	}
	f.mu.Lock()
	paid, claims := f.paidCents, f.nClaims
	f.mu.Unlock()
	if !rep.Real || !rep.OK() || rep.Open.OK < 2 || rep.Open.OK != int64(claims) || rep.ClaimedCents != paid {
		t.Errorf("real run: real %v ok %v (%v), %d opens claiming %d cents, the fake made %d claims of %d", rep.Real, rep.OK(), rep.Problems(),
			rep.Open.OK, rep.ClaimedCents, claims, paid)
	}
	var b bytes.Buffer
	_ = rep.WriteText(&b)
	if !strings.Contains(b.String(), "real traffic") {
		t.Errorf("the text report does not say the run was real:\n%s", b.String())
	}
	cfg.Direct = true
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "not with Direct") {
		t.Errorf("a real direct run: %v", err)
	}
}

// fakeCell serves one cell's shards of a shared fakeRouter and refuses the
// others with 421 WRONG_CELL, as a real cell does. Its routing check is written
// apart from the bench's so that the test checks the bench.
type fakeCell struct {
	f        *fakeRouter
	name     string
	shards   sharding.Ranges
	requests atomic.Int64
}

// testSecret is the cluster secret of the fake cells.
const testSecret = "bench-test-secret-0123456789"

// cellSigner checks requests as a cell does.
var cellSigner = api.NewSigner(testSecret)

func (c *fakeCell) handle(ctx *fasthttp.RequestCtx) {
	c.requests.Add(1)
	if !cellSigner.VerifyRequest(&ctx.Request, time.Now()) {
		fail(ctx, model.Errorf(model.ErrUnauthenticated, "unsigned call to %s", c.name))
		return
	}
	parts := strings.Split(strings.Trim(string(ctx.Path()), "/"), "/")
	var shard model.ShardID
	switch {
	case len(parts) >= 3 && (parts[1] == "accounts" || parts[1] == "noop"):
		shard = sharding.ShardOfAct(parts[2])
	case len(parts) == 2 && parts[1] == "packets":
		var req api.SendRequest
		_ = json.Unmarshal(ctx.PostBody(), &req)
		shard = sharding.ShardOfAct(req.Sender)
	case len(parts) >= 3 && parts[1] == "packets":
		ref, err := model.ParsePacketID(parts[2])
		if err != nil {
			fail(ctx, err)
			return
		}
		shard = ref.Shard
	}
	if !c.shards.Contains(shard) {
		fail(ctx, model.Errorf(model.ErrWrongCell, "shard %d is not %s's", shard, c.name))
		return
	}
	c.f.handle(ctx)
}

// twoCells serves a fake router that only answers /healthz (and counts the
// rest) and two fake cells sharing one set of books.
func twoCells(t *testing.T) (f *fakeRouter, routerURL string, cells []*fakeCell, routed *atomic.Int64) {
	f = newFakeRouter()
	cells = []*fakeCell{{f: f, name: "cell-1", shards: sharding.Ranges{{From: 0, To: 499}}},
		{f: f, name: "cell-2", shards: sharding.Ranges{{From: 500, To: 999}}}}
	for _, c := range cells {
		addr := strings.TrimPrefix(serveHandler(t, c.handle), "http://")
		f.cells = append(f.cells, CellInfo{Name: c.name, Addr: addr, Shards: c.shards.String()})
	}
	routed = &atomic.Int64{}
	routerURL = serveHandler(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/healthz" {
			routed.Add(1)
		}
		f.handle(ctx)
	})
	return f, routerURL, cells, routed
}

// Direct mode sends each request to the cell owning its key, never through
// the router, for the smoke and the hot workloads alike.
func TestDirectGoesToTheOwningCell(t *testing.T) {
	for _, w := range []string{WorkloadSmoke, WorkloadHot, WorkloadCold} {
		t.Run(w, func(t *testing.T) {
			shortSettle(t)
			f, url, cells, routed := twoCells(t)
			cfg := loadConfig(url, f, w)
			cfg.Senders = 4
			if w == WorkloadSmoke {
				cfg = fakeConfig(url, f)
				cfg.Senders = 4
			}
			cfg.Direct = true
			rep, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Open.Errors[model.ErrWrongCell.Code] != 0 || rep.Send.Errors[model.ErrWrongCell.Code] != 0 {
				t.Errorf("direct requests reached the wrong cell: %v %v", rep.Open.Errors, rep.Send.Errors)
			}
			if n := routed.Load(); n != 0 {
				t.Errorf("%d requests went through the router", n)
			}
			if cells[0].requests.Load() == 0 || cells[1].requests.Load() == 0 || !rep.Direct || rep.Cells != 2 {
				t.Errorf("cells got %d and %d requests; direct %v, %d cells", cells[0].requests.Load(), cells[1].requests.Load(), rep.Direct, rep.Cells)
			}
			if !rep.OK() {
				t.Errorf("report not OK: %v", rep.Problems())
			}
		})
	}
}

// Direct mode needs the cluster secret: cells refuse unsigned calls.
func TestDirectNeedsTheSecret(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Direct = true
	if err := cfg.Validate(); !errors.Is(err, errDirectUnsigned) {
		t.Errorf("direct without a secret: %v", err)
	}
	cfg.Direct, cfg.ClusterSecret = false, ""
	if err := (SuiteConfig{Run: cfg, CompareDirect: true}).Validate(); !errors.Is(err, errDirectUnsigned) {
		t.Errorf("compare-direct without a secret: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("through the router without a secret: %v", err)
	}
}

// Direct mode refuses to start when the router sees shards without a cell.
func TestDirectNeedsEveryShard(t *testing.T) {
	f := newFakeRouter()
	url := f.serve(t)
	f.cells = []CellInfo{{Name: "half", Addr: strings.TrimPrefix(url, "http://"), Shards: "0-499"}}
	cfg := loadConfig(url, f, WorkloadHot)
	cfg.Direct = true
	ts := serveHandler(t, func(ctx *fasthttp.RequestCtx) {
		reply(ctx, routerHealth{Status: "degraded", Cells: f.cells, Uncovered: 500})
	})
	cfg.RouterURL = ts
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "500 shards") {
		t.Fatalf("Run = %v, want an error about uncovered shards", err)
	}
}

// A sender that spends its deposit deposits again, once per time it runs dry,
// and the run goes on: INSUFFICIENT_BALANCE is expected, not a failure.
func TestSenderDepositsAgain(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	cfg := loadConfig(f.serve(t), f, WorkloadCold)
	cfg.Senders = 1
	cfg.PacketAmount, cfg.PacketCount = 5_000_000, 2 // two packets per deposit of 10,000,000
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkMoney(t, f, rep)
	if rep.Deposit.OK < 2 || rep.Send.OK < 3 {
		t.Fatalf("%d deposits, %d sends: the sender did not deposit again", rep.Deposit.OK, rep.Send.OK)
	}
	// Each deposit pays two packets; at most one send per dry spell finds the
	// balance spent before the next deposit lands (one sender, one at a time).
	if want := 2 * rep.DepositedCents / 10_000_000; rep.Send.OK > want {
		t.Errorf("%d packets sent on %d cents", rep.Send.OK, rep.DepositedCents)
	}
}
