package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.yaml.in/yaml/v3"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/router/apikey"
	"redcell/sharding"
)

type fixedRoutes struct{ m atomic.Pointer[sharding.Map] }

func (f *fixedRoutes) Map() *sharding.Map { return f.m.Load() }

// testSecret is the cluster secret of the routers and fake cells here.
const testSecret = "router-test-secret-0123456789"

// fakeCell answers every request with status and body, and counts requests.
// It checks each request's signature as a cell does. An error body's code
// goes in api.HeaderCode too, as api.WriteError puts it.
func fakeCell(t *testing.T, status int, body string, hits *atomic.Int64) string {
	return fakeCellHeader(t, status, body, true, hits)
}

// fakeCellHeader is fakeCell, without api.HeaderCode when withCode is false.
func fakeCellHeader(t *testing.T, status int, body string, withCode bool, hits *atomic.Int64) string {
	signer := api.NewSigner(testSecret)
	return serveCell(t, func(rc *fasthttp.RequestCtx) {
		hits.Add(1)
		if len(rc.Request.Header.Peek(api.HeaderDeadline)) == 0 {
			t.Error("router forwarded no deadline")
		}
		if !signer.VerifyRequest(&rc.Request, time.Now()) {
			t.Errorf("router forwarded %s %s without a valid signature", rc.Method(), rc.RequestURI())
		}
		rc.SetStatusCode(status)
		rc.SetBodyString(body)
		if code := api.ErrorCode([]byte(body)); withCode && status != 200 && code != nil {
			rc.Response.Header.SetBytesV(api.HeaderCode, code)
		}
	})
}

// serveCell serves h on a loopback port until the test ends.
func serveCell(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	return testenv.Serve(t, &fasthttp.Server{Handler: h})
}

func startRouter(t *testing.T, routes Routes) string {
	return startRouterWith(t, routes, nil, nil)
}

// The API keys every test router accepts: testKey grants every scope,
// readerKey only read. Their entries are written into each router's key file.
var (
	testKey, testEntry     = mustGenerate("test-app", apikey.Scopes())
	readerKey, readerEntry = mustGenerate("reader-app", []apikey.Scope{apikey.ScopeRead})
)

func mustGenerate(app string, scopes []apikey.Scope) (string, apikey.Key) {
	key, k, err := apikey.Generate(app, scopes, time.Now())
	if err != nil {
		panic(err)
	}
	return key, k
}

// writeKeyFile writes a key file holding entries, as an operator would.
func writeKeyFile(t testing.TB, entries ...apikey.Key) string {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"keys": entries})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "api-keys.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// adminURLs maps the public URL of each test router to its admin port's URL.
var adminURLs sync.Map

// testAdminToken is the admin token of the test routers.
const testAdminToken = "router-admin-token-0123456789"

// startRouterWith starts a router whose config tune may change, with the rate
// limiters' clock now (nil: time.Now), and with an admin port; its key file
// holds testKey and readerKey.
func startRouterWith(t *testing.T, routes Routes, tune func(*Config), now func() time.Time) string {
	url, _ := startRouterKeys(t, routes, tune, now)
	return url
}

// startRouterKeys is startRouterWith that also returns the router's key file.
func startRouterKeys(t *testing.T, routes Routes, tune func(*Config), now func() time.Time) (string, *apikey.File) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.ClusterSecret = "127.0.0.1:0", testSecret
	cfg.AdminListen, cfg.AdminToken = "127.0.0.1:0", testAdminToken
	if tune != nil {
		tune(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keys, err := apikey.Open(writeKeyFile(t, testEntry, readerEntry), log)
	if err != nil {
		t.Fatal(err)
	}
	return launchRouter(t, cfg, routes, keys, log, now, 0), keys
}

// launchRouter serves a router of cfg until the test ends and returns its
// public URL (its admin URL goes into adminURLs). A watch interval > 0 reads
// the key file again that often, as redcell router does every second.
func launchRouter(t *testing.T, cfg Config, routes Routes, keys *apikey.File, log *slog.Logger, now func() time.Time, watch time.Duration) string {
	t.Helper()
	r, err := New(cfg, routes, keys, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	if now != nil {
		r.now = now
	}
	ln, err := r.Listen()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := r.ListenAdmin()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.Serve(ctx, ln, admin) }()
	go func() {
		if watch > 0 {
			keys.Watch(ctx, watch)
		}
		done <- nil
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	scheme := "http://"
	if cfg.TLSCert != "" {
		scheme = "https://"
	}
	url := scheme + ln.Addr().String()
	if admin != nil {
		adminURLs.Store(url, scheme+admin.Addr().String())
	}
	return url
}

// get sends GET url with testKey (send) and returns the status and error code.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	a := send(t, http.MethodGet, url, "", false)
	return a.status, a.code
}

func TestForwardAndUnavailable(t *testing.T) {
	var hits atomic.Int64
	all, _ := sharding.ParseRanges("0-499")
	addr := fakeCell(t, 200, `{"ok":true}`, &hits)
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all}})
	routes.m.Store(m)
	url := startRouter(t, routes)
	if st, _ := get(t, url+"/v1/accounts/bob"); st != 200 || hits.Load() != 1 { // bob: shard 27
		t.Fatalf("forward: %d, %d hits", st, hits.Load())
	}
	if st, code := get(t, url+"/v1/accounts/u1"); st != 503 || code != "CELL_UNAVAILABLE" { // u1: shard 663, no cell
		t.Fatalf("shard without a cell: %d %s", st, code)
	}
	dead, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: "127.0.0.1:1", Shards: all}})
	routes.m.Store(dead)
	if st, code := get(t, url+"/v1/accounts/bob"); st != 503 || code != "CELL_UNAVAILABLE" {
		t.Fatalf("unreachable cell: %d %s", st, code)
	}
}

func TestWrongCellRetriedThenRetryable(t *testing.T) {
	var wrongHits, rightHits atomic.Int64
	all, _ := sharding.ParseRanges("0-999")
	wrong := fakeCell(t, 421, `{"error":{"code":"WRONG_CELL","message":"moved"}}`, &wrongHits)
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "old", Addr: wrong, Shards: all}})
	routes.m.Store(m)
	url := startRouter(t, routes)
	st, code := get(t, url+"/v1/accounts/bob")
	// Tried again with a doubling wait while the deadline (3 s) leaves room:
	// 50+100+200+400+400+400 ms of waits fit, the next would pass it.
	if st != 503 || code != "MOVING" || wrongHits.Load() < 5 || wrongHits.Load() > movedAttempts {
		t.Fatalf("421 every time: %d %s after %d tries", st, code, wrongHits.Load())
	}
	// The map moves on while the router waits: the retry reaches the new owner.
	right := fakeCell(t, 200, `{}`, &rightHits)
	go func() {
		testenv.Until(30*time.Second, func() bool { return wrongHits.Load() >= 8 }) // else the get below fails
		m2, _ := sharding.NewMap([]sharding.Cell{{Name: "new", Addr: right, Shards: all}})
		routes.m.Store(m2)
	}()
	if st, _ := get(t, url+"/v1/accounts/bob"); st != 200 || rightHits.Load() != 1 {
		t.Fatalf("after the map moved: %d, %d hits on the new owner", st, rightHits.Load())
	}
}

// TestMovingRetriedUntilTheNewOwnerServes: a cell in the freeze of a move
// answers 503 MOVING; the router tries again with a doubling wait and reaches
// the new owner once the map names it, while a plain 503 (not MOVING) is
// passed back at once.
func TestMovingRetriedUntilTheNewOwnerServes(t *testing.T) {
	var movingHits, rightHits, busyHits atomic.Int64
	all, _ := sharding.ParseRanges("0-999")
	moving := fakeCell(t, 503, `{"error":{"code":"MOVING","message":"freeze"}}`, &movingHits)
	right := fakeCell(t, 200, `{}`, &rightHits)
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "old", Addr: moving, Shards: all, Version: 1}})
	routes.m.Store(m)
	url := startRouter(t, routes)
	go func() {
		testenv.Until(30*time.Second, func() bool { return movingHits.Load() >= 4 }) // about 350 ms of freeze; else the get below fails
		m2, _ := sharding.NewMap([]sharding.Cell{{Name: "new", Addr: right, Shards: all, Version: 2}})
		routes.m.Store(m2)
	}()
	if st, code := get(t, url+"/v1/accounts/bob"); st != 200 || rightHits.Load() != 1 || movingHits.Load() != 4 {
		t.Fatalf("through a freeze: %d %s, %d MOVING answers, %d on the new owner", st, code, movingHits.Load(), rightHits.Load())
	}
	busy := fakeCell(t, 503, `{"error":{"code":"OVERLOADED","message":"busy"}}`, &busyHits)
	m3, _ := sharding.NewMap([]sharding.Cell{{Name: "busy", Addr: busy, Shards: all}})
	routes.m.Store(m3)
	if st, code := get(t, url+"/v1/accounts/bob"); st != 503 || code != "OVERLOADED" || busyHits.Load() != 1 {
		t.Fatalf("a plain 503: %d %s after %d tries, want OVERLOADED after 1", st, code, busyHits.Load())
	}
	// The cell's answer had no Retry-After: the router adds one, as to its own 503s.
	if a := send(t, "GET", url+"/v1/accounts/bob", "", false); a.status != 503 || a.retryAfter != "1" {
		t.Fatalf("a cell's 503 without Retry-After: %+v, want Retry-After 1 added", a)
	}
}

// TestWrongCellNoRetryPastDeadline: when less than movedLeftMin of the
// request's deadline is left after a 421, the router does not wait for a
// second try: one forward, then a retryable 503 at once.
func TestWrongCellNoRetryPastDeadline(t *testing.T) {
	var wrongHits atomic.Int64
	all, _ := sharding.ParseRanges("0-999")
	wrong := fakeCell(t, 421, `{"error":{"code":"WRONG_CELL","message":"moved"}}`, &wrongHits)
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "old", Addr: wrong, Shards: all}})
	routes.m.Store(m)
	url := startRouterWith(t, routes, func(c *Config) { c.RequestTimeout = movedLeftMin - 50*time.Millisecond }, nil)
	st, code := get(t, url+"/v1/accounts/bob")
	if st != 503 || code != "MOVING" || wrongHits.Load() != 1 {
		t.Fatalf("421 with %v left: %d %s after %d tries, want 503 MOVING after 1", movedLeftMin-50*time.Millisecond, st, code, wrongHits.Load())
	}
}

// TestForwardSigned: what the router forwards arrives signed over exactly what
// the cell reads (the request target with its query, the body, the stress
// flag, the app of the caller's key on the coupon routes), and the cell's check
// accepts it; signature headers a client sent are replaced, and a client's
// HeaderPartial (a peer's word on credits) is dropped. The same call
// with its app changed (a capture replayed under another app's name) is
// refused. A router keyed with another secret is refused.
func TestForwardSigned(t *testing.T) {
	signer := api.NewSigner(testSecret)
	type seen struct {
		target, body, app string
		stress, ok        bool
		otherAppOK        bool // the call verified with its app changed
		partial           bool // the cell was told HeaderPartial
	}
	got := make(chan seen, 1)
	addr := serveCell(t, func(rc *fasthttp.RequestCtx) {
		ok := signer.VerifyRequest(&rc.Request, time.Now())
		var replay fasthttp.Request
		rc.Request.CopyTo(&replay)
		replay.Header.Set(api.HeaderApp, "reader-app")
		got <- seen{string(rc.RequestURI()), string(rc.PostBody()), string(rc.Request.Header.Peek(api.HeaderApp)),
			api.IsStress(&rc.Request.Header), ok, signer.VerifyRequest(&replay, time.Now()),
			len(rc.Request.Header.Peek(api.HeaderPartial)) > 0}
		if !ok {
			rc.SetStatusCode(401)
			rc.SetBodyString(`{"error":{"code":"UNAUTHENTICATED","message":"unsigned"}}`)
		}
	})
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all}})
	routes.m.Store(m)
	url := startRouter(t, routes)
	id := pktID
	for _, c := range []struct {
		method, path, body string
		stress             bool
		app                string // the app the cell should be told
	}{
		{"GET", "/v1/packets/" + id + "?after=2&limit=5", "", false, ""},
		{"POST", "/v1/packets/" + id + "/open", `{"act_id":"bob"}`, true, ""},
		{"POST", "/v1/accounts/bob/deposit", `{"amount":1,"order_no":"d1"}`, false, ""},
		{"GET", "/v1/accounts/bob?x=%2F", "", false, ""}, // the cell gets the target as sent, signed
		{"POST", api.CouponIssuePath, `{"act_id":"bob","batch_id":"b1","serial_no":"s1"}`, false, "test-app"},
		{"POST", api.CouponIssuePath, `{"act_id":"bob","batch_id":"b1","serial_no":"s1"}`, true, "test-app"},
		{"GET", api.CouponStatePath("s1", "bob"), "", false, "test-app"},
	} {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		req.SetRequestURI(url + c.path)
		req.Header.SetMethod(c.method)
		req.Header.Set(api.HeaderTimestamp, "1")      // a client's own try
		req.Header.Set(api.HeaderSignature, "forged") // is replaced
		req.Header.Set(api.HeaderApp, "reader-app")   // is replaced too
		req.Header.Set(api.HeaderPartial, "1")        // a peer's word, dropped
		if c.stress {
			req.Header.Set(api.HeaderStress, "1")
		}
		req.SetBodyString(c.body)
		req.Header.Set("Authorization", "Bearer "+testKey)
		if c.body != "" {
			req.Header.SetContentType("application/json")
		}
		if c.stress { // a client may mark stress traffic only when it signs with the cluster secret
			signer.SignRequest(req, time.Now())
		}
		if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		s := <-got
		if resp.StatusCode() != 200 || !s.ok || s.body != c.body || s.stress != c.stress || s.app != c.app || s.partial {
			t.Errorf("%s %s: status %d, cell saw %+v", c.method, c.path, resp.StatusCode(), s)
		}
		if s.otherAppOK {
			t.Errorf("%s %s: the call verifies with its app changed to another", c.method, c.path)
		}
		if c.method == "GET" && s.target != string(req.URI().RequestURI()) {
			t.Errorf("%s %s: the cell got target %q", c.method, c.path, s.target)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}

	other := startRouterWith(t, routes, func(c *Config) { c.ClusterSecret = "another-secret-0123456789" }, nil)
	if st, code := get(t, other+"/v1/accounts/bob"); st != 401 || code != "UNAUTHENTICATED" || (<-got).ok {
		t.Fatalf("router with another secret: %d %s", st, code)
	}
}

// TestConfigNeedsClusterSecret: a router without the cluster secret does not
// start; every request it forwarded would be refused.
func TestConfigNeedsClusterSecret(t *testing.T) {
	for _, secret := range []string{"", "short-secret"} {
		c := DefaultConfig()
		c.ClusterSecret = secret
		if err := c.Validate(); err == nil {
			t.Errorf("cluster secret %q accepted", secret)
		}
	}
	c := DefaultConfig()
	c.ClusterSecret = testSecret
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableCellLogsOnce: while a cell cannot be reached, the router
// answers every request for its shards 503 CELL_UNAVAILABLE but logs the
// outage once when it starts (a summary at most every 10 s), and once when
// the cell answers again — not one line per request.
func TestUnreachableCellLogsOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all}})
	routes.m.Store(m)
	url := startRouterLogged(t, routes, writeKeyFile(t, testEntry), log)
	for i := range 200 { // many users: the per-user limit must not answer first
		if st, code := get(t, url+"/v1/accounts/u"+strconv.Itoa(i)); st != 503 || code != "CELL_UNAVAILABLE" {
			t.Fatalf("dead cell: %d %s", st, code)
		}
	}
	var hits atomic.Int64
	serveCellOn(t, addr, &hits)
	if st, _ := get(t, url+"/v1/accounts/bob"); st != 200 {
		t.Fatalf("cell back: %d", st)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if n := strings.Count(out, "forwarding to cell failing"); n != 1 || strings.Count(out, "level=WARN") != 1 {
		t.Errorf("200 refused requests logged %d start lines (want 1):\n%s", n, out)
	}
	if !strings.Contains(out, "forwarding to cell recovered") || !strings.Contains(out, "failures_total=200") {
		t.Errorf("no recovery line with the count:\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// serveCellOn serves a fake cell (200 {}) on addr until the test ends.
func serveCellOn(t *testing.T, addr string, hits *atomic.Int64) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) { hits.Add(1); rc.SetBodyString(`{}`) }}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
}

// TestRestartedCellGetsFreshConnections: a cell started again on the same
// address (a new process, a new Started in the map) gets its requests on
// new connections. The old process closed the pooled ones when it stopped;
// a POST sent on one of them fails, and fasthttp resends only idempotent
// requests: before, the router answered those 503 CELL_UNAVAILABLE (seen
// in a drill: 12 opens, right after a cell's restart, once a burst needed
// more connections than the new process had been given).
func TestRestartedCellGetsFreshConnections(t *testing.T) {
	all, _ := sharding.ParseRanges("0-999")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var hits atomic.Int64
	serve := func(rc *fasthttp.RequestCtx) {
		hits.Add(1)
		rc.SetStatusCode(200)
		rc.SetBodyString(`{}`)
	}
	overlapping := func(rc *fasthttp.RequestCtx) { // the 8 calls overlap: one connection each
		hits.Add(1)
		testenv.Until(10*time.Second, func() bool { return hits.Load() >= 8 })
		rc.SetStatusCode(200)
		rc.SetBodyString(`{}`)
	}
	first := &fasthttp.Server{Handler: overlapping}
	go first.Serve(ln)
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all, Started: 1}})
	routes.m.Store(m)
	url := startRouter(t, routes)
	deposit := func(i int) answer {
		return send(t, "POST", url+"/v1/accounts/bob/deposit", fmt.Sprintf(`{"amount":1,"order_no":"d%d"}`, i), false)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if a := deposit(i); a.status != 200 {
				t.Errorf("before the restart: %+v", a)
			}
		})
	}
	wg.Wait()
	// The process stops (its connections closed) and a new one serves the
	// same address; the map names the new process.
	if err := first.Shutdown(); err != nil {
		t.Fatal(err)
	}
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	second := &fasthttp.Server{Handler: serve}
	go second.Serve(ln2)
	t.Cleanup(func() { second.Shutdown() })
	m2, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all, Started: 2}})
	routes.m.Store(m2)
	before := hits.Load()
	for i := range 8 {
		if a := deposit(100 + i); a.status != 200 {
			t.Fatalf("deposit %d after the restart: %+v (the old process's connection?)", i, a)
		}
	}
	if n := hits.Load() - before; n != 8 {
		t.Fatalf("the new process served %d of 8", n)
	}
}
