package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// fakeClock is the rate limiters' clock in these tests: it moves only when told.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// pktID is a well-formed packet ID of shard 417.
const pktID = "20261129417a3f9c0e1b2d4c5e0"

// answer is one request's outcome: status, error code and Retry-After.
type answer struct {
	status     int
	code       string
	retryable  bool
	retryAfter string
}

func send(t *testing.T, method, url, body string, stress bool) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if stress {
		req.Header.Set(api.HeaderStress, "1")
		signNetHTTP(t, req, body)
	}
	resp, b := testenv.Do(t, nil, req)
	var e api.ErrorBody
	_ = json.Unmarshal(b, &e)
	return answer{resp.StatusCode, e.Error.Code, e.Error.Retryable, resp.Header.Get("Retry-After")}
}

// oneCellRouter starts a fake cell owning every shard and a router in front of it.
func oneCellRouter(t *testing.T, hits *atomic.Int64, tune func(*Config), clock *fakeClock) string {
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: fakeCell(t, 200, `{}`, hits), Shards: all}})
	routes.m.Store(m)
	return startRouterWith(t, routes, tune, clock.Now)
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	admin, ok := adminURLs.Load(url)
	if !ok {
		t.Fatalf("no admin port known for %s", url)
	}
	st, b := testenv.Get(t, admin.(string)+"/metrics")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, b)
	}
	return string(b)
}

// wantMetric fails unless the exposition has the line "series value".
func wantMetric(t *testing.T, exposition, series string, value float64) {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && name == series {
			if v != fmt.Sprint(value) {
				t.Errorf("%s = %s, want %v", series, v, value)
			}
			return
		}
	}
	t.Errorf("no series %s in /metrics", series)
}

// TestRouteLimit: the open route's bucket (10/s, burst 5) lets the burst
// through, refuses the next open with 429 RATE_LIMITED (retryable, Retry-After)
// without reaching the cell, refills at exactly 10/s, binds stress traffic
// too, and leaves the other routes alone.
func TestRouteLimit(t *testing.T) {
	var hits atomic.Int64
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	url := oneCellRouter(t, &hits, func(c *Config) { c.RateLimits["open"] = Rate{PerSec: 10, Burst: 5} }, clock)
	open := func(i int, stress bool) answer {
		return send(t, "POST", url+"/v1/packets/"+pktID+"/open", fmt.Sprintf(`{"act_id":"u%d"}`, i), stress)
	}
	for i := range 5 {
		if a := open(i, false); a.status != 200 {
			t.Fatalf("open %d of the burst: %+v", i, a)
		}
	}
	a := open(5, false)
	if a.status != 429 || a.code != "RATE_LIMITED" || !a.retryable || a.retryAfter != "1" {
		t.Fatalf("open past the burst: %+v, want 429 RATE_LIMITED retryable with Retry-After: 1", a)
	}
	if a := open(6, true); a.status != 429 || a.code != "RATE_LIMITED" {
		t.Fatalf("stress traffic past the burst: %+v, want RATE_LIMITED too", a)
	}
	if a := send(t, "GET", url+"/v1/accounts/bob", "", false); a.status != 200 {
		t.Fatalf("another route while open is limited: %+v", a)
	}
	if hits.Load() != 6 {
		t.Fatalf("the cell saw %d requests, want 6 (5 opens and the account)", hits.Load())
	}
	// 100 ms buys one token at 10/s: one open passes, the next does not.
	clock.Add(100 * time.Millisecond)
	if a := open(7, false); a.status != 200 {
		t.Fatalf("open after 100 ms: %+v", a)
	}
	if a := open(8, false); a.status != 429 {
		t.Fatalf("second open after 100 ms: %+v", a)
	}
	// Traffic at the configured rate passes in full.
	for i := range 50 {
		clock.Add(100 * time.Millisecond)
		if a := open(100+i, false); a.status != 200 {
			t.Fatalf("open %d at 10/s: %+v", i, a)
		}
	}
	m := scrape(t, url)
	wantMetric(t, m, `redcell_rate_limited_total{kind="route",route="open"}`, 3)
	wantMetric(t, m, `redcell_rate_limited_total{kind="user",route="open"}`, 0)
	wantMetric(t, m, `redcell_router_request_duration_seconds_count{code="RATE_LIMITED",route="open"}`, 3)
	wantMetric(t, m, `redcell_router_request_duration_seconds_count{code="OK",route="open"}`, 56)
}

// TestUserLimit: each act_id has its own bucket (2/s, burst 3) across routes;
// one user's refusals neither touch another user nor spend the route's tokens;
// stress traffic is exempt; detail (no act_id) is never user-limited.
func TestUserLimit(t *testing.T) {
	var hits atomic.Int64
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	url := oneCellRouter(t, &hits, func(c *Config) {
		c.UserRate = Rate{PerSec: 2, Burst: 3}
		c.RateLimits["open"] = Rate{PerSec: 1, Burst: 5}
	}, clock)
	openAs := func(user string, stress bool) answer {
		return send(t, "POST", url+"/v1/packets/"+pktID+"/open", `{"act_id":"`+user+`"}`, stress)
	}
	for i := range 10 {
		a := openAs("alice", false)
		if i < 3 && a.status != 200 || i >= 3 && (a.status != 429 || a.code != "USER_RATE_LIMITED" || !a.retryable) {
			t.Fatalf("alice's open %d: %+v", i, a)
		}
	}
	if a := send(t, "GET", url+"/v1/accounts/alice", "", false); a.code != "USER_RATE_LIMITED" {
		t.Fatalf("alice on another route: %+v, want USER_RATE_LIMITED (the limit is per user)", a)
	}
	if a := openAs("alice", true); a.status != 200 {
		t.Fatalf("alice's stress-marked open: %+v, want 200 (stress traffic has no per-user limit)", a)
	}
	// Alice's refusals spent none of the route's 5 tokens: 5 - 3 - 1 (stress) = 1 is left for bob.
	if a := openAs("bob", false); a.status != 200 {
		t.Fatalf("bob: %+v", a)
	}
	if a := openAs("carol", false); a.code != "RATE_LIMITED" {
		t.Fatalf("carol after the route's burst: %+v, want RATE_LIMITED", a)
	}
	for range 5 {
		if a := send(t, "GET", url+"/v1/packets/"+pktID, "", false); a.status != 200 {
			t.Fatalf("detail: %+v", a)
		}
	}
	if a := send(t, "POST", url+"/v1/packets", `{"sender":"bob","amount":1,"count":1,"order_no":"o"}`, false); a.status != 200 {
		t.Fatalf("bob's first send: %+v", a)
	}
	// Half a second refills one of alice's tokens (2/s).
	clock.Add(500 * time.Millisecond)
	if a := send(t, "GET", url+"/v1/accounts/alice", "", false); a.status != 200 {
		t.Fatalf("alice after 500 ms: %+v", a)
	}
	if a := send(t, "GET", url+"/v1/accounts/alice", "", false); a.code != "USER_RATE_LIMITED" {
		t.Fatalf("alice's second request after 500 ms: %+v", a)
	}
	m := scrape(t, url)
	wantMetric(t, m, `redcell_rate_limited_total{kind="user",route="open"}`, 7)
	wantMetric(t, m, `redcell_rate_limited_total{kind="user",route="account"}`, 2)
	wantMetric(t, m, `redcell_rate_limited_total{kind="route",route="open"}`, 1)
	wantMetric(t, m, `redcell_router_user_limiters`, 3) // alice, bob, carol (refused by the route after her bucket was made)
}

// TestUserLimitsBounded: the per-user map never holds more than its bound,
// while a user who keeps sending keeps its (empty) bucket; a user idle for long
// enough is forgotten and starts afresh.
func TestUserLimitsBounded(t *testing.T) {
	const bound = 1024
	u := newUserLimits(Rate{PerSec: 1, Burst: 1}, bound)
	now := time.Unix(1_800_000_000, 0)
	if !u.allow("hot", now) || u.allow("hot", now) {
		t.Fatal("hot: the burst of 1 should pass once")
	}
	for i := range 200_000 {
		u.allow(fmt.Sprintf("user-%d", i), now)
		if i%7 == 0 && u.allow("hot", now) {
			t.Fatalf("hot got a token after %d other users: its bucket was evicted while in use", i)
		}
		if i%1000 == 0 {
			if n := u.size(); n > bound {
				t.Fatalf("%d limiters after %d users, bound %d", n, i, bound)
			}
		}
	}
	if n := u.size(); n > bound || n < bound/4 {
		t.Fatalf("%d limiters, want between %d and %d", n, bound/4, bound)
	}
	for i := range 200_000 {
		u.allow(fmt.Sprintf("other-%d", i), now)
	}
	if !u.allow("hot", now) {
		t.Fatal("hot, idle through 200,000 other users, should have been forgotten and start with a fresh burst")
	}
}

// TestMetricsCountAnswers: the router's /metrics has the request counts by
// route and code, the code taken from the cell's api.HeaderCode (a cell's
// error answer without it counts as OTHER, whatever its body says); the
// router's own refusals carry the header too.
func TestMetricsCountAnswers(t *testing.T) {
	var okHits, soldHits, bareHits atomic.Int64
	low, _ := sharding.ParseRanges("0-499")
	mid, _ := sharding.ParseRanges("500-799")
	high, _ := sharding.ParseRanges("800-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{
		{Name: "a", Addr: fakeCell(t, 200, `{}`, &okHits), Shards: low},
		{Name: "b", Addr: fakeCell(t, 409, `{"error":{"code":"SOLD_OUT","message":"x"}}`, &soldHits), Shards: mid},
		{Name: "c", Addr: fakeCellHeader(t, 409, `{"error":{"code":"SOLD_OUT","message":"x"}}`, false, &bareHits), Shards: high},
	})
	routes.m.Store(m)
	url := startRouter(t, routes)
	for range 3 {
		get(t, url+"/v1/accounts/bob") // shard 27: cell a
	}
	get(t, url+"/v1/accounts/u1")       // shard 663: cell b, 409 SOLD_OUT
	get(t, url+"/v1/accounts/u2")       // shard 851: cell c, 409 without the header
	get(t, url+"/v1/accounts/bad%20id") // INVALID_ARGUMENT, never forwarded
	get(t, url+"/v2/nothing")           // NOT_FOUND, route other
	if okHits.Load() != 3 || soldHits.Load() != 1 || bareHits.Load() != 1 {
		t.Fatalf("cells saw %d, %d, %d requests, want 3, 1, 1", okHits.Load(), soldHits.Load(), bareHits.Load())
	}
	// The clients see the code header: the router's own, and the cell's passed on.
	for path, want := range map[string]string{"/v2/nothing": "NOT_FOUND", "/v1/accounts/bad%20id": "INVALID_ARGUMENT",
		"/v1/accounts/u1": "SOLD_OUT", "/v1/accounts/u2": "", "/v1/accounts/bob": ""} {
		req, _ := http.NewRequest(http.MethodGet, url+path, nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get(api.HeaderCode); got != want {
			t.Errorf("%s: %s %q, want %q", path, api.HeaderCode, got, want)
		}
	}
	out := scrape(t, url)
	wantMetric(t, out, `redcell_router_request_duration_seconds_count{code="OK",route="account"}`, 3+1)
	wantMetric(t, out, `redcell_router_request_duration_seconds_count{code="SOLD_OUT",route="account"}`, 1+1)
	wantMetric(t, out, `redcell_router_request_duration_seconds_count{code="OTHER",route="account"}`, 1+1)
	wantMetric(t, out, `redcell_router_request_duration_seconds_count{code="INVALID_ARGUMENT",route="account"}`, 1+1)
	wantMetric(t, out, `redcell_router_request_duration_seconds_count{code="NOT_FOUND",route="other"}`, 1+1)
	wantMetric(t, out, `redcell_rate_limited_total{kind="route",route="account"}`, 0)
	if strings.Contains(out, `code="OK",route="open"`) {
		t.Error("a series for a (route, code) never answered should not exist yet")
	}
}
