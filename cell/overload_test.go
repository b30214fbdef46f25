package cell_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/internal/testenv"
	"redcell/sharding"
	"redcell/storage"
)

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape GETs url+"/metrics" with no Authorization header.
func scrape(t *testing.T, url string) string {
	t.Helper()
	st, b := testenv.Get(t, url+"/metrics")
	if st != 200 {
		t.Fatalf("/metrics without a token: %d %s", st, b)
	}
	return string(b)
}

// metricValue returns the value of one series ("name{labels}") of an exposition.
func metricValue(t *testing.T, exposition, series string) string {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && name == series {
			return v
		}
	}
	t.Errorf("no series %s in /metrics", series)
	return ""
}

func wantMetric(t *testing.T, exposition, series, value string) {
	t.Helper()
	if got := metricValue(t, exposition, series); got != value {
		t.Errorf("%s = %s, want %s", series, got, value)
	}
}

// TestCellMetrics: the admin port serves /metrics without the token (the admin
// routes still need it), with request counts by route and code and the open
// path's queue, batch and claim counters after a few requests.
func TestCellMetrics(t *testing.T) {
	admin := freeAddr(t)
	c := oneCell(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = admin, "metrics-test-token" })
	waitFor(t, 5*time.Second, func() bool { _, err := http.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 1000)
	id := c.send(t, sender, 1000, 2, "snd-1")
	for i, u := range []string{"a", "b", "c"} { // one after another: two claims, then SOLD_OUT
		want := map[bool]int{true: 200, false: 409}[i < 2]
		if st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: pre + u}, nil); st != want {
			t.Fatalf("open %d: %d %s", i, st, code)
		}
	}
	if st, _ := callRaw(t, nil, "POST", c.url+"/v1/packets/"+id+"/open", []byte(`{"act_id":`), nil); st != 400 {
		t.Fatalf("bad body: %d", st)
	}
	if st, _ := call(t, "DELETE", c.url+"/v1/accounts/"+sender, nil, nil); st != 404 {
		t.Fatalf("DELETE: %d", st)
	}
	if st, _ := call(t, "GET", c.adminURL+"/admin/strategy", nil, nil); st != 401 {
		t.Fatalf("/admin/strategy without the token: %d, want 401", st)
	}

	m := scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="OK",route="deposit"}`, "1")
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="OK",route="send"}`, "1")
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="OK",route="open"}`, "2")
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="SOLD_OUT",route="open"}`, "1")
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="INVALID_ARGUMENT",route="open"}`, "1")
	wantMetric(t, m, `redcell_cell_request_duration_seconds_count{code="NOT_FOUND",route="other"}`, "1")
	wantMetric(t, m, `redcell_cell_opens_total`, "2")
	wantMetric(t, m, `redcell_cell_open_batch_size_count`, "2") // the SOLD_OUT open ran no transaction
	wantMetric(t, m, `redcell_cell_open_batch_size_sum`, "2")
	wantMetric(t, m, `redcell_cell_open_queue_wait_seconds_count`, "3")
	wantMetric(t, m, `redcell_cell_open_queue_depth`, "0")
	wantMetric(t, m, `redcell_cell_shed_total{reason="queue_wait"}`, "0")
	wantMetric(t, m, `redcell_rate_limited_total{kind="cell",route="open"}`, "0")
	wantMetric(t, m, `redcell_breaker_state{breaker="db"}`, "0")
	wantMetric(t, m, `redcell_breaker_state{breaker="memcached"}`, "0")
	metricValue(t, m, `redcell_cell_credits_pending{space="real"}`)
	metricValue(t, m, `redcell_memcached_fallbacks_total`)
	// Per database: the deposit, the send and the two opens' transactions
	// in the sender's (the packet's) database, and at most the two credits
	// elsewhere (a relay's; none when booked in the opens).
	senderDB := sharding.ShardOfAct(sender).DB()
	if n := metricValue(t, m, fmt.Sprintf(`redcell_cell_db_ops_total{db="%02d"}`, senderDB)); n != "4" && n != "5" && n != "6" {
		t.Errorf("redcell_cell_db_ops_total of the sender's db_%02d: %s, want 4 (and up to 2 credits)", senderDB, n)
	}
	var all int
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "redcell_cell_db_ops_total{") {
			n, _ := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
			all += n
		}
	}
	if all < 4 || all > 6 {
		t.Errorf("redcell_cell_db_ops_total over all databases: %d, want 4 to 6", all)
	}
	// Both claims credited, each either in its open (a claimant whose
	// wallet tables the cell had made) or by the relay (with, at most, the
	// claims of earlier cells past this one's saved positions, read again at
	// its start and acknowledged as repeats), counted, and let go.
	waitFor(t, 30*time.Second, func() bool {
		return c.balance(t, pre+"a")+c.balance(t, pre+"b") == 1000 &&
			metric(t, c, `redcell_cell_relay_delivered_total`)+metric(t, c, `redcell_cell_credits_in_open_total`) >= 2 &&
			metric(t, c, `redcell_cell_credits_pending{space="real"}`) == 0
	}, "both claims credited and counted")
}

// TestCellRateLimit: past its burst the cell answers 429 CELL_RATE_LIMITED
// (retryable) without touching the store; /healthz is not limited.
func TestCellRateLimit(t *testing.T) {
	admin := freeAddr(t)
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.RateLimitPerSec, cfg.RateBurst = 1, 3
		cfg.AdminListen = admin
	})
	acct := c.url + "/v1/accounts/" + testenv.Prefix()
	for i := range 3 {
		if st, code := call(t, "GET", acct, nil, nil); st != 200 {
			t.Fatalf("request %d of the burst: %d %s", i, st, code)
		}
	}
	req := newRequest(nil, "GET", acct, nil)
	signer.SignRequest(req, time.Now())
	resp, err := roundTrip(t, req)
	if err != nil {
		t.Fatal(err)
	}
	b, retryAfter := resp.Body(), string(resp.Header.Peek("Retry-After"))
	if resp.StatusCode() != 429 || string(api.ErrorCode(b)) != "CELL_RATE_LIMITED" || !strings.Contains(string(b), `"retryable":true`) || retryAfter != "1" {
		t.Fatalf("past the burst: %d %s (Retry-After %q)", resp.StatusCode(), b, retryAfter)
	}
	if st, _ := call(t, "GET", c.url+"/healthz", nil, nil); st != 200 {
		t.Fatalf("/healthz while limited: %d", st)
	}
	wantMetric(t, scrape(t, "http://"+admin), `redcell_rate_limited_total{kind="cell",route="account"}`, "1")
}

// TestDBBreakerThroughHTTP: a cell whose database refuses connections answers
// 503 DB_UNAVAILABLE; after five such failures its breaker (in front of the
// store's connections, as cmd/redcell sets it) answers alone, fast, without
// dialing the server, and /healthz says db_unreachable at once. Needs no
// database: that is the point.
func TestDBBreakerThroughHTTP(t *testing.T) {
	dead, err := storage.Open("root@tcp("+freeAddr(t)+")/", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	cfg := cell.DefaultConfig()
	all, _ := sharding.ParseRanges("0-999")
	cfg.Name, cfg.Listen, cfg.DSN, cfg.Shards, cfg.ClusterSecret = "dead", "127.0.0.1:0", "unused", all, testSecret
	cfg.AdminListen, cfg.Memcached = freeAddr(t), []string{freeAddr(t)}
	cfg.WarmSchema, cfg.RelayInterval, cfg.ExpiryInterval = false, time.Hour, time.Hour // only requests touch the store
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	b, err := guard.NewBreaker("db", guard.DefaultConfig(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	dead.SetBreaker(b)
	dead.Shadow().SetBreaker(b)
	stores := cell.Stores{Real: dead, Shadow: dead.Shadow()}
	mc := admission.NewClient(cfg.Memcached)
	peers := &staticPeers{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: cfg.Name, Addr: "127.0.0.1:1", Shards: all}})
	peers.m.Store(m)
	srv, err := cell.New(cfg, stores, admission.NewSlots(mc, 1, log), admission.NewCache(mc, log), peers, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + ln.Addr().String()

	for i := range 5 {
		if st, code := call(t, "GET", url+"/v1/accounts/bob", nil, nil); st != 503 || code != "DB_UNAVAILABLE" {
			t.Fatalf("request %d to a cell with a dead database: %d %s", i, st, code)
		}
	}
	// Each request, and the cell's background loops, dialed and were
	// refused: the breaker is open now (five failures in a row).
	exp := scrape(t, "http://"+cfg.AdminListen)
	wantMetric(t, exp, `redcell_breaker_state{breaker="db"}`, "2")
	rejected := func(exp string) int {
		n, err := strconv.Atoi(metricValue(t, exp, `redcell_breaker_rejected_total{breaker="db"}`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := rejected(exp)
	start := time.Now()
	for range 20 {
		if st, code := call(t, "GET", url+"/v1/accounts/bob", nil, nil); st != 503 || code != "DB_UNAVAILABLE" {
			t.Fatalf("with the breaker open: %d %s", st, code)
		}
	}
	if st, body := testenv.Get(t, url+"/healthz"); st != 503 || !strings.Contains(string(body), `"status":"db_unreachable"`) {
		t.Fatalf("/healthz: %d %s", st, body)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("20 refusals and a health check took %s: the breaker should answer at once", time.Since(start))
	}
	// The 20 requests and the health check's ping were refused by the
	// breaker, without dialing.
	exp = scrape(t, "http://"+cfg.AdminListen)
	if n := rejected(exp) - before; n < 21 {
		t.Fatalf("the breaker refused %d round trips for 20 requests and a health check, want at least 21", n)
	}
	if n := dead.RoundTrips(); n != 0 {
		t.Fatalf("%d round trips reached a server that refuses connections", n)
	}
	wantMetric(t, exp, `redcell_breaker_state{breaker="db"}`, "2")
	wantMetric(t, exp, `redcell_cell_request_duration_seconds_count{code="DB_UNAVAILABLE",route="account"}`, "25")
}
