package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/cell/api"
	"redcell/sharding"
)

type fixedRoutes struct{ m atomic.Pointer[sharding.Map] }

func (f *fixedRoutes) Map() *sharding.Map { return f.m.Load() }

// fakeCell answers every request with status and body, and counts requests.
func fakeCell(t *testing.T, status int, body string, hits *atomic.Int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		hits.Add(1)
		if len(rc.Request.Header.Peek(api.HeaderDeadline)) == 0 {
			t.Error("router forwarded no deadline")
		}
		rc.SetStatusCode(status)
		rc.SetBodyString(body)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return ln.Addr().String()
}

func startRouter(t *testing.T, routes Routes) string {
	return startRouterWith(t, routes, nil, nil)
}

// startRouterWith starts a router whose config tune may change, with the rate
// limiters' clock now (nil: time.Now).
func startRouterWith(t *testing.T, routes Routes, tune func(*Config), now func() time.Time) string {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(cfg, routes, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e api.ErrorBody
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code
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
	if st != 503 || code != "CELL_UNAVAILABLE" || wrongHits.Load() != 2 {
		t.Fatalf("421 twice: %d %s after %d tries", st, code, wrongHits.Load())
	}
	// The map moves on while the router waits: the retry reaches the new owner.
	right := fakeCell(t, 200, `{}`, &rightHits)
	go func() {
		for wrongHits.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		m2, _ := sharding.NewMap([]sharding.Cell{{Name: "new", Addr: right, Shards: all}})
		routes.m.Store(m2)
	}()
	if st, _ := get(t, url+"/v1/accounts/bob"); st != 200 || rightHits.Load() != 1 {
		t.Fatalf("after the map moved: %d, %d hits on the new owner", st, rightHits.Load())
	}
}
