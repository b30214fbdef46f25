package router

import (
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/internal/testenv"
	"redcell/router/apikey"
	"redcell/sharding"
)

// benchRouter is a router (not serving: the benchmark calls its handler)
// forwarding to one loopback cell that answers every request at once, as the
// no-op route does.
func benchRouter(b *testing.B) *Router {
	b.Helper()
	addr := testenv.Serve(b, &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		rc.SetContentType("application/json")
		rc.SetBodyString(`{"cell":"a"}`)
	}})
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all}})
	routes.m.Store(m)

	cfg := DefaultConfig()
	cfg.ClusterSecret = testSecret
	cfg.UserRate = Rate{PerSec: 1_000_000_000, Burst: 1_000_000_000} // the benchmark reuses one act_id
	for n := range cfg.RateLimits {
		cfg.RateLimits[n] = Rate{PerSec: 1_000_000_000, Burst: 1_000_000_000}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := writeKeyFile(b, testEntry)
	keys, err := apikey.Open(path, log)
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(cfg, routes, keys, prometheus.NewRegistry(), log)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// benchHandle runs the router's handler on tmpl b.N times, one request after
// another: parse, checks, limits, signing, the forward over loopback and the
// metrics, without the client's side of the connection.
func benchHandle(b *testing.B, tmpl *fasthttp.Request) {
	r := benchRouter(b)
	var rc fasthttp.RequestCtx
	rc.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		tmpl.CopyTo(&rc.Request)
		rc.Response.Reset()
		r.handle(&rc)
		if rc.Response.StatusCode() != 200 {
			b.Fatalf("answer %d %s", rc.Response.StatusCode(), rc.Response.Body())
		}
	}
}

// BenchmarkHandleNoop: an ordinary API key request to POST /v1/noop/{act_id}.
func BenchmarkHandleNoop(b *testing.B) {
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/noop/bench-user-1")
	req.Header.Set("Authorization", "Bearer "+testKey)
	benchHandle(b, &req)
}

// BenchmarkHandleOpen: an open of a packet, its act_id in the JSON body.
func BenchmarkHandleOpen(b *testing.B) {
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/packets/" + pktID + "/open")
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.SetContentType("application/json")
	req.SetBodyString(`{"act_id":"bench-user-1"}`)
	benchHandle(b, &req)
}
