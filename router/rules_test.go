package router

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// rulesRouter starts a fake cell and a router reading the rules file it
// returns the path of, written with content first.
func rulesRouter(t *testing.T, content string, hits *atomic.Int64, tune func(*Config)) (url, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: fakeCell(t, 200, `{}`, hits), Shards: all}})
	routes.m.Store(m)
	url = startRouterWith(t, routes, func(c *Config) {
		c.RulesFile = path
		if tune != nil {
			tune(c)
		}
	}, nil)
	return url, path
}

// sendH is send with extra headers.
func sendH(t *testing.T, method, url, body string, hdr map[string]string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, b := testenv.Do(t, nil, req)
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	a.code = string(api.ErrorCode(b))
	a.retryable = strings.Contains(string(b), `"retryable":true`)
	return a
}

// adminRules calls GET /admin/rules or POST /admin/rules/reload.
func adminRules(t *testing.T, url, method, path string) (int, string) {
	t.Helper()
	admin, _ := adminURLs.Load(url)
	req, _ := http.NewRequest(method, admin.(string)+path, nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, b := testenv.Do(t, nil, req)
	return resp.StatusCode, string(b)
}

// The degrade switch drops its share of a route (0 closes it) with 503
// DEGRADED and Retry-After; anti-abuse rules block by header, act_id and
// address (the proxy's header when configured) and limit by address; none
// of the refused requests reaches the cell. The file is reloaded on the
// admin port (a bad one refused, the rules in force kept) and when it changes.
func TestRulesDegradeAndAbuse(t *testing.T) {
	var hits atomic.Int64
	url, path := rulesRouter(t, `
admit:
  open: 0
  send: 50
retry_after: 7
rules:
  - name: evil-bot
    header: User-Agent
    pattern: "(?i)evilbot"
    action: block
  - name: mallory
    act_ids: [mallory]
    action: block
  - name: bad-net
    ips: ["203.0.113.0/24"]
    action: block
  - name: detail-per-ip
    routes: [detail]
    action: limit
    limit: {per_sec: 1, burst: 2}
`, &hits, func(c *Config) { c.ClientIPHeader = "X-Forwarded-For" })
	open := func(user string, hdr map[string]string) answer {
		return sendH(t, "POST", url+"/v1/packets/"+pktID+"/open", `{"act_id":"`+user+`"}`, hdr)
	}
	// open: 0 closes the route.
	for i := range 5 {
		if a := open(fmt.Sprintf("u%d", i), nil); a.status != 503 || a.code != "DEGRADED" || a.retryAfter != "7" || !a.retryable {
			t.Fatalf("open with admit 0: %+v, want 503 DEGRADED, Retry-After 7, retryable", a)
		}
	}
	// send: 50 lets about half through (400 tries: 200 ± 40 is over 4 sd).
	passed := 0
	for i := range 400 {
		a := sendH(t, "POST", url+"/v1/packets", fmt.Sprintf(`{"sender":"s%d","amount":100,"count":1,"order_no":"o%d"}`, i, i), nil)
		switch {
		case a.status == 200:
			passed++
		case a.code != "DEGRADED":
			t.Fatalf("send: %+v", a)
		}
	}
	if passed < 160 || passed > 240 {
		t.Fatalf("send with admit 50: %d of 400 passed, want about 200", passed)
	}
	before := hits.Load()
	// Block rules: header, act_id in the body, address by X-Forwarded-For's last entry.
	if a := sendH(t, "GET", url+"/v1/accounts/bob", "", map[string]string{"User-Agent": "EvilBot/2"}); a.status != 403 || a.code != "BLOCKED" || a.retryable || a.retryAfter != "" {
		t.Fatalf("evil bot: %+v, want 403 BLOCKED, not retryable, no Retry-After", a)
	}
	if a := sendH(t, "GET", url+"/v1/accounts/mallory", "", nil); a.code != "BLOCKED" {
		t.Fatalf("mallory: %+v", a)
	}
	if a := sendH(t, "GET", url+"/v1/accounts/bob", "", map[string]string{"X-Forwarded-For": "10.0.0.1, 203.0.113.9"}); a.code != "BLOCKED" {
		t.Fatalf("from 203.0.113.9 by the proxy's header: %+v", a)
	}
	if a := sendH(t, "GET", url+"/v1/accounts/bob", "", map[string]string{"X-Forwarded-For": "203.0.113.9, 10.0.0.1"}); a.status != 200 {
		t.Fatalf("a client-written first entry must not decide: %+v", a)
	}
	// Limit rule: detail at 1/s, burst 2, per address.
	for i := range 4 {
		a := sendH(t, "GET", url+"/v1/packets/"+pktID, "", nil)
		if i < 2 && a.status != 200 || i >= 2 && (a.code != "USER_RATE_LIMITED" || a.retryAfter != "1") {
			t.Fatalf("detail %d: %+v", i, a)
		}
	}
	if got := hits.Load() - before; got != 3 { // bob from a good address, two details
		t.Fatalf("the cell saw %d of the refused-or-not requests, want 3 (bob from a good address, two details)", got)
	}
	m := scrape(t, url)
	wantMetric(t, m, `redcell_router_rules_refused_total{route="open",verdict="degraded"}`, 5)
	wantMetric(t, m, `redcell_router_rules_refused_total{route="account",verdict="blocked"}`, 3)
	wantMetric(t, m, `redcell_router_rules_refused_total{route="detail",verdict="limited"}`, 2)
	status, body := adminRules(t, url, "GET", "/admin/rules")
	if status != 200 || !strings.Contains(body, `"name":"evil-bot","action":"block","refused":1`) ||
		!strings.Contains(body, `"admit":{"open":0,"send":50}`) || !strings.Contains(body, `"open":5`) {
		t.Fatalf("GET /admin/rules: %d %s", status, body)
	}

	// A bad file is refused on reload; the rules in force stay.
	if err := os.WriteFile(path, []byte("admit:\n  opne: 10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, body = adminRules(t, url, "POST", "/admin/rules/reload")
	if status != 400 || !strings.Contains(body, "INVALID_ARGUMENT") || !strings.Contains(body, `unknown route \"opne\"`) {
		t.Fatalf("reload of a bad file: %d %s", status, body)
	}
	if a := open("u1", nil); a.code != "DEGRADED" {
		t.Fatalf("after a refused reload: %+v, want the old rules", a)
	}
	// A good file: reloaded on the admin port at once.
	if err := os.WriteFile(path, []byte("admit:\n  open: 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if status, body = adminRules(t, url, "POST", "/admin/rules/reload"); status != 200 || !strings.Contains(body, `"rules":[]`) || !strings.Contains(body, `"last_error":""`) {
		t.Fatalf("reload: %d %s", status, body)
	}
	if a := open("u1", nil); a.status != 200 {
		t.Fatalf("open after the switch went back to 100: %+v", a)
	}
	if a := sendH(t, "GET", url+"/v1/accounts/mallory", "", nil); a.status != 200 {
		t.Fatalf("mallory after the rules were removed: %+v", a)
	}
	// And by the watch (every second), as every router of a cluster.
	if err := os.WriteFile(path, []byte("admit:\n  account: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the watch to load the changed file", func() bool {
		return sendH(t, "GET", url+"/v1/accounts/bob", "", nil).code == "DEGRADED"
	})
}

// A router without a rules file answers its rules routes NOT_FOUND.
func TestRulesNone(t *testing.T) {
	var hits atomic.Int64
	url := oneCellRouter(t, &hits, nil, &fakeClock{t: time.Now()})
	if status, body := adminRules(t, url, "GET", "/admin/rules"); status != 404 || !strings.Contains(body, "rules_file") {
		t.Fatalf("GET /admin/rules without a file: %d %s", status, body)
	}
}

// The rules see the last address of the proxy's header, of its last line
// when it comes in several (a proxy may add a line of its own after the
// client's), without an IPv6 zone; a header that is missing or holds no
// address leaves the connection's.
func TestClientIP(t *testing.T) {
	r := &Router{cfg: Config{ClientIPHeader: "X-Forwarded-For"}}
	conn := &net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 1}
	for _, c := range []struct{ headers, want string }{
		{"", "192.0.2.1"},
		{"X-Forwarded-For: 203.0.113.9\r\n", "203.0.113.9"},
		{"X-Forwarded-For: 10.0.0.1, 203.0.113.9\r\n", "203.0.113.9"},
		{"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 203.0.113.9\r\n", "203.0.113.9"},
		{"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 10.0.0.1, 203.0.113.9\r\n", "203.0.113.9"},
		{"X-Forwarded-For: ::ffff:203.0.113.9\r\n", "203.0.113.9"},
		{"X-Forwarded-For: fe80::1%eth0\r\n", "fe80::1"},
		{"X-Forwarded-For: 203.0.113.9:443\r\n", "192.0.2.1"},
	} {
		var req fasthttp.Request
		raw := "GET /v1/accounts/bob HTTP/1.1\r\nHost: x\r\n" + c.headers + "\r\n"
		if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatal(err)
		}
		var rc fasthttp.RequestCtx
		rc.Init(&req, conn, nil)
		if got := r.clientIP(&rc); got.String() != c.want {
			t.Errorf("%q: %v, want %s", c.headers, got, c.want)
		}
	}
}
