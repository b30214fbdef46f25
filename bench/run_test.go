package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// fakeRouter serves the router's HTTP API from memory with correct semantics:
// idempotent deposits and sends by order_no, one claim per (packet, act_id)
// with repeats, fixed shares (the last takes the remainder) and credits
// delivered creditDelay after the claim, like the cells' relay. Faults:
// every expireEvery-th packet is expired, and every dropEvery-th new claim is
// applied but answered with OVERLOADED, as if the answer were lost.
type fakeRouter struct {
	expireEvery int // 0 = never
	dropEvery   int // 0 = never
	creditDelay time.Duration
	delay       time.Duration // added to every API request, outside the lock
	shedSends   string        // sends whose order_no contains it are always shed (DB_UNAVAILABLE), never applied
	cells       []CellInfo    // what /healthz lists; empty: one cell owning every shard

	noStress atomic.Int64 // requests that lacked api.HeaderStress: "1"
	stress   atomic.Int64 // requests that had it
	noops    atomic.Int64 // no-op requests answered

	mu       sync.Mutex // guards every field below
	balances map[string]int64
	deposits map[string]model.Deposit // by order_no
	sends    map[string]api.SendResponse
	packets  map[string]*fakePacket
	pending  []fakeCredit // claims not yet credited
	nPackets int
	nClaims  int

	// What the fake did, for the test to compare with the report.
	depositedCents int64
	sentCents      int64
	paidCents      int64 // sum of all claims
	opens          int   // open requests
	expiredAnswers int   // EXPIRED answers to opens
	soldOutAnswers int   // SOLD_OUT answers to opens
	dropped        int   // claims answered with OVERLOADED
}

type fakePacket struct {
	id, sender      string
	amount, count   int64
	remainingAmount int64
	remainingCount  int64
	expired         bool
	claims          map[string]api.OpenResponse // by act_id
	seqs            int64
}

type fakeCredit struct {
	act    string
	amount int64
	due    time.Time
}

func newFakeRouter() *fakeRouter {
	return &fakeRouter{
		balances: map[string]int64{},
		deposits: map[string]model.Deposit{},
		sends:    map[string]api.SendResponse{},
		packets:  map[string]*fakePacket{},
	}
}

// serve starts the fake on 127.0.0.1 and returns its base URL.
func (f *fakeRouter) serve(t *testing.T) string {
	t.Helper()
	return serveHandler(t, f.handle)
}

// serveHandler serves h on 127.0.0.1 until the test ends and returns its base URL.
func serveHandler(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	return "http://" + testenv.Serve(t, &fasthttp.Server{Handler: h})
}

// creditDueLocked applies every pending credit whose time has come; f.mu must be held.
func (f *fakeRouter) creditDueLocked(now time.Time) {
	kept := f.pending[:0]
	for _, c := range f.pending {
		if now.Before(c.due) {
			kept = append(kept, c)
			continue
		}
		f.balances[c.act] += c.amount
	}
	f.pending = kept
}

func (f *fakeRouter) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Request.Header.Peek(api.HeaderStress)) != "1" {
		f.noStress.Add(1)
	} else {
		f.stress.Add(1)
	}
	switch p := string(ctx.Path()); {
	case p == "/healthz":
		cells := f.cells
		if len(cells) == 0 {
			cells = []CellInfo{{Name: "fake", Addr: string(ctx.Host()), Shards: "0-999"}}
		}
		reply(ctx, routerHealth{Status: "ok", Cells: cells})
		return
	case strings.HasPrefix(p, api.NoopPath):
		f.noops.Add(1)
		reply(ctx, api.NoopResponse{Cell: f.owner(sharding.ShardOfAct(strings.TrimPrefix(p, api.NoopPath)))})
		return
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creditDueLocked(time.Now())
	path := strings.Split(strings.Trim(string(ctx.Path()), "/"), "/")
	post := string(ctx.Method()) == fasthttp.MethodPost
	switch {
	case len(path) == 3 && path[1] == "accounts" && !post:
		if _, ok := f.balances[path[2]]; !ok {
			fail(ctx, model.ErrNotFound)
			return
		}
		reply(ctx, model.Account{ActID: path[2], Balance: model.Cents(f.balances[path[2]])})
	case len(path) == 4 && path[1] == "accounts" && path[3] == "deposit" && post:
		var req api.DepositRequest
		if decode(ctx, &req) {
			f.depositLocked(ctx, path[2], req)
		}
	case len(path) == 2 && path[1] == "packets" && post:
		var req api.SendRequest
		if decode(ctx, &req) {
			f.sendLocked(ctx, req)
		}
	case len(path) == 4 && path[1] == "packets" && post:
		var req api.ActRequest
		if !decode(ctx, &req) {
			return
		}
		p, ok := f.packets[path[2]]
		switch {
		case !ok:
			fail(ctx, model.ErrNotFound)
		case path[3] == "grab":
			f.grabLocked(ctx, p)
		case path[3] == "open":
			f.openLocked(ctx, p, req.ActID)
		default:
			fail(ctx, model.ErrNotFound)
		}
	default:
		fail(ctx, model.ErrNotFound)
	}
}

func (f *fakeRouter) depositLocked(ctx *fasthttp.RequestCtx, act string, req api.DepositRequest) {
	if d, ok := f.deposits[req.OrderNo]; ok {
		d.Repeat = true
		reply(ctx, d)
		return
	}
	f.balances[act] += req.Amount
	f.depositedCents += req.Amount
	d := model.Deposit{ActID: act, OrderNo: req.OrderNo, Amount: model.Cents(req.Amount), Balance: model.Cents(f.balances[act])}
	f.deposits[req.OrderNo] = d
	reply(ctx, d)
}

func (f *fakeRouter) sendLocked(ctx *fasthttp.RequestCtx, req api.SendRequest) {
	if f.shedSends != "" && strings.Contains(req.OrderNo, f.shedSends) {
		fail(ctx, model.ErrDBUnavailable)
		return
	}
	if s, ok := f.sends[req.OrderNo]; ok {
		s.Repeat = true
		reply(ctx, s)
		return
	}
	if f.balances[req.Sender] < req.Amount {
		fail(ctx, model.ErrInsufficientBalance)
		return
	}
	f.balances[req.Sender] -= req.Amount
	f.sentCents += req.Amount
	f.nPackets++
	id := string(model.NewPacketID(sharding.ShardOfAct(req.Sender), time.Now())) // in the sender's shard, as the cells do
	f.packets[id] = &fakePacket{
		id: id, sender: req.Sender, amount: req.Amount, count: req.Count,
		remainingAmount: req.Amount, remainingCount: req.Count,
		expired: f.expireEvery > 0 && f.nPackets%f.expireEvery == 0,
		claims:  map[string]api.OpenResponse{},
	}
	s := api.SendResponse{PacketID: id, Sender: req.Sender, Amount: req.Amount, Count: req.Count, Kind: req.Kind}
	f.sends[req.OrderNo] = s
	reply(ctx, s)
}

func (f *fakeRouter) grabLocked(ctx *fasthttp.RequestCtx, p *fakePacket) {
	g := api.GrabResponse{PacketID: p.id, Remaining: p.remainingCount, Source: "db", Status: "open", Available: true}
	switch {
	case p.expired:
		g.Status, g.Available = "expired", false
	case p.remainingCount == 0:
		g.Status, g.Available = "sold_out", false
	}
	reply(ctx, g)
}

func (f *fakeRouter) openLocked(ctx *fasthttp.RequestCtx, p *fakePacket, act string) {
	f.opens++
	if o, ok := p.claims[act]; ok {
		o.Repeat = true
		reply(ctx, o)
		return
	}
	if p.expired {
		f.expiredAnswers++
		fail(ctx, model.ErrExpired)
		return
	}
	if p.remainingCount == 0 {
		f.soldOutAnswers++
		fail(ctx, model.ErrSoldOut)
		return
	}
	share := p.amount / p.count
	if p.remainingCount == 1 {
		share = p.remainingAmount
	}
	p.remainingAmount -= share
	p.remainingCount--
	p.seqs++
	o := api.OpenResponse{ClaimID: model.ClaimID(model.PacketID(p.id), p.seqs), PacketID: p.id, ActID: act, Amount: share, Seq: p.seqs}
	p.claims[act] = o
	f.paidCents += share
	f.pending = append(f.pending, fakeCredit{act: act, amount: share, due: time.Now().Add(f.creditDelay)})
	f.nClaims++
	if f.dropEvery > 0 && f.nClaims%f.dropEvery == 0 {
		f.dropped++
		fail(ctx, model.ErrOverloaded) // the claim stands; only the answer is lost
		return
	}
	reply(ctx, o)
}

// owner names the cell /healthz says owns shard s.
func (f *fakeRouter) owner(s model.ShardID) string {
	for _, c := range f.cells {
		if r, err := sharding.ParseRanges(c.Shards); err == nil && r.Contains(s) {
			return c.Name
		}
	}
	return "fake"
}

// audit is the conservation check over the fake's books, as Config.Audit.
func (f *fakeRouter) audit(context.Context) (model.AuditReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creditDueLocked(time.Now())
	var a model.AuditReport
	a.Cells = []string{"fake"}
	a.Deposits = model.Cents(f.depositedCents)
	for _, b := range f.balances {
		a.Balances += model.Cents(b)
	}
	for _, p := range f.packets {
		a.OpenRemaining += model.Cents(p.remainingAmount)
		a.ClaimsCount += len(p.claims)
	}
	for _, c := range f.pending {
		a.InFlight += model.Cents(c.amount)
		a.InFlightCount++
	}
	a.Packets = int64(len(f.packets))
	a.CreditsCount = a.ClaimsCount - a.InFlightCount
	a.Difference = a.Deposits - (a.Balances + a.OpenRemaining + a.InFlight)
	return a, nil
}

func decode(ctx *fasthttp.RequestCtx, v any) bool {
	if err := json.Unmarshal(ctx.PostBody(), v); err != nil {
		fail(ctx, model.Invalidf("bad JSON: %v", err))
		return false
	}
	return true
}

func reply(ctx *fasthttp.RequestCtx, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func fail(ctx *fasthttp.RequestCtx, err error) {
	status, body := api.ErrorJSON(err)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// shortSettle makes the post-load wait fit a unit test.
func shortSettle(t *testing.T) {
	t.Helper()
	oldTimeout, oldInterval := settleTimeout, settleInterval
	settleTimeout, settleInterval = 3*time.Second, 20*time.Millisecond
	t.Cleanup(func() { settleTimeout, settleInterval = oldTimeout, oldInterval })
}

// logReportIfFailed logs the run's text report when t has failed.
func logReportIfFailed(t *testing.T, rep Report) {
	t.Helper()
	if t.Failed() {
		var b bytes.Buffer
		_ = rep.WriteText(&b)
		t.Log(b.String())
	}
}

func fakeConfig(url string, f *fakeRouter) Config {
	cfg := DefaultConfig()
	cfg.RouterURL = url
	cfg.Senders = 2
	cfg.Openers = 4
	cfg.Duration = 700 * time.Millisecond
	cfg.PacketAmount = 500
	cfg.PacketCount = 3 // fewer shares than openers, so some opens find it sold out
	cfg.RunID = "t1"
	cfg.Audit = f.audit
	cfg.ClusterSecret = testSecret // used by direct runs only
	return cfg
}

func TestRunAgainstFakeRouter(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	f.expireEvery = 4
	f.creditDelay = 150 * time.Millisecond // the bench must wait for the relay
	cfg := fakeConfig(f.serve(t), f)
	var progress bytes.Buffer
	cfg.Progress = &progress
	oldProgress := progressInterval
	progressInterval = 100 * time.Millisecond
	t.Cleanup(func() { progressInterval = oldProgress })

	start := time.Now()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Run took %v for a %v load", took, cfg.Duration)
	}
	f.mu.Lock()
	defer f.mu.Unlock()

	if rep.Deposit.OK != 2 || rep.DepositedCents != f.depositedCents {
		t.Errorf("deposits: report %d ok / %d cents, fake %d cents", rep.Deposit.OK, rep.DepositedCents, f.depositedCents)
	}
	if rep.Send.OK == 0 || rep.SentCents != f.sentCents || rep.Send.OK != int64(f.nPackets) {
		t.Errorf("sends: report %d ok / %d cents, fake %d packets / %d cents", rep.Send.OK, rep.SentCents, f.nPackets, f.sentCents)
	}
	if rep.Open.OK == 0 || rep.Open.OK != int64(f.nClaims) {
		t.Errorf("opens: report %d ok, fake made %d claims", rep.Open.OK, f.nClaims)
	}
	if rep.ClaimedCents != f.paidCents || rep.ClaimedCents == 0 {
		t.Errorf("claimed %d cents, fake paid out %d", rep.ClaimedCents, f.paidCents)
	}
	if rep.Open.Count != int64(f.opens) {
		t.Errorf("open count %d, fake answered %d opens", rep.Open.Count, f.opens)
	}
	if got := rep.Open.Errors[model.ErrExpired.Code]; got == 0 || got != int64(f.expiredAnswers) {
		t.Errorf("EXPIRED opens: report %d, fake %d", got, f.expiredAnswers)
	}
	if got := rep.Open.Errors[model.ErrSoldOut.Code]; got != int64(f.soldOutAnswers) {
		t.Errorf("SOLD_OUT opens: report %d, fake %d", got, f.soldOutAnswers)
	}
	if rep.Grab.OK == 0 {
		t.Error("no grab was made")
	}
	if !rep.BalancesChecked || rep.BalanceMismatches != 0 || rep.OpenerBalancesCents != rep.ClaimedCents {
		t.Errorf("balances: checked %v, %d mismatches, %d cents vs %d claimed",
			rep.BalancesChecked, rep.BalanceMismatches, rep.OpenerBalancesCents, rep.ClaimedCents)
	}
	// The wait ends once this run's claims are credited and the books balance;
	// credits of other traffic may still be in flight.
	if rep.Audit == nil || !rep.Audit.OK() || rep.Audit.Difference != 0 {
		t.Errorf("audit = %+v (error %q), want balanced", rep.Audit, rep.AuditError)
	}
	l := rep.Open.LatencyMS
	if !(l.P50 > 0 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("open latency %+v is not ordered", l)
	}
	if rep.OpensPerSec <= 0 || rep.SendsPerSec <= 0 || rep.ElapsedMS < cfg.Duration.Milliseconds() {
		t.Errorf("rates %.1f opens/s %.1f sends/s over %d ms", rep.OpensPerSec, rep.SendsPerSec, rep.ElapsedMS)
	}
	if !rep.OK() {
		t.Errorf("report not OK: %v", rep.Problems())
	}
	if n := f.noStress.Load(); n != 0 {
		t.Errorf("%d requests lacked the stress header", n)
	}
	if rep.Workload != WorkloadSmoke || rep.Mode != modeClosed || len(rep.Timeline) == 0 || rep.BalanceSample != cfg.Openers {
		t.Errorf("workload %q mode %q, %d buckets, %d balances checked", rep.Workload, rep.Mode, len(rep.Timeline), rep.BalanceSample)
	}
	if !strings.Contains(progress.String(), "opens") || !strings.HasSuffix(progress.String(), "\n") {
		t.Errorf("progress = %q", progress.String())
	}
	for act := range f.balances {
		if !strings.HasPrefix(act, "t1-s") && !strings.HasPrefix(act, "t1-o") {
			t.Errorf("account %q does not carry the run ID", act)
		}
	}
	logReportIfFailed(t, rep)
}

// A lost answer is retried; the repeat tells the claim, so no money goes
// missing from the report, but the OVERLOADED answers still fail the run.
func TestRunRetriesLostAnswers(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	f.dropEvery = 5
	cfg := fakeConfig(f.serve(t), f)
	cfg.Duration = 400 * time.Millisecond

	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped == 0 {
		t.Fatal("the fake dropped no answer; the test proves nothing")
	}
	if got := rep.Open.Errors[model.ErrOverloaded.Code]; got != int64(f.dropped) {
		t.Errorf("OVERLOADED opens: report %d, fake %d", got, f.dropped)
	}
	if rep.Open.Repeats != int64(f.dropped) {
		t.Errorf("repeats %d, want one per dropped answer (%d)", rep.Open.Repeats, f.dropped)
	}
	if rep.ClaimedCents != f.paidCents || rep.BalanceMismatches != 0 {
		t.Errorf("claimed %d cents, fake paid %d; %d balance mismatches", rep.ClaimedCents, f.paidCents, rep.BalanceMismatches)
	}
	if rep.OK() {
		t.Error("report OK despite OVERLOADED answers")
	}
	want := fmt.Sprintf("open: %d unexpected OVERLOADED", f.dropped)
	if ps := strings.Join(rep.Problems(), "\n"); ps != want {
		t.Errorf("problems = %q, want only %q", ps, want)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Openers = 0
	if _, err := Run(context.Background(), cfg); err == nil {
		t.Fatal("Run accepted Openers = 0")
	}
}

// When ctx ends, Run stops early and returns what it has with ctx's error.
func TestRunCanceled(t *testing.T) {
	f := newFakeRouter()
	cfg := fakeConfig(f.serve(t), f)
	cfg.Duration = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, cfg)
	if err != context.DeadlineExceeded {
		t.Fatalf("Run = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Run took %v after ctx ended", took)
	}
	if rep.Open.OK == 0 || rep.Audit != nil || !strings.HasPrefix(rep.AuditError, "not run") {
		t.Fatalf("partial report: %d opens, audit %v %q", rep.Open.OK, rep.Audit, rep.AuditError)
	}
}

// Unreachable router: every deposit fails, Run still returns a report that
// is not OK, within the request timeout.
func TestRunRouterDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg := DefaultConfig()
	cfg.RouterURL = url
	cfg.Senders, cfg.Openers, cfg.Duration = 1, 1, 200*time.Millisecond
	shortSettle(t)
	settleTimeout = 100 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.Deposit.Errors[codeTransport] == 0 || rep.BalanceError == "" {
		t.Fatalf("report = %+v, want failed deposits and an unreadable balance", rep)
	}
}
