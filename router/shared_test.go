package router

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// sharedRouters starts n routers in front of one fake cell, sharing their
// limits through mc (nil: each counts alone), on clk.
func sharedRouters(t *testing.T, n int, mc SharedMemcache, prefix string, clk *clock.Manual, tune func(*Config)) []string {
	t.Helper()
	var hits atomic.Int64
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: fakeCell(t, 200, `{}`, &hits), Shards: all}})
	routes.m.Store(m)
	var urls []string
	for range n {
		urls = append(urls, startRouterWith(t, routes, func(c *Config) {
			if mc != nil {
				c.Shared = &Shared{Memcache: mc, Routers: func() int { return n }, Prefix: prefix, Clock: clk}
			}
			if tune != nil {
				tune(c)
			}
		}, clk.Now))
	}
	return urls
}

// One person at 3x the per-person limit, spread across two routers for 10 s:
// with shared limits the routers together accept the limit x time + burst;
// each on its own (the baseline, measured in the same run) about twice that.
// Refusals ask the client to wait (Retry-After). A route's shared limit
// gives the whole cluster its rate per second.
func TestSharedLimitsAcrossRouters(t *testing.T) {
	mc := memcache.New(testenv.Memcached(t))
	const perSec, burst, secs = 20, 40, 10
	run := func(urls []string, clk *clock.Manual, user string) (ok int, retryAfters map[string]int) {
		retryAfters = map[string]int{}
		for i := range 3 * perSec * secs {
			a := send(t, "GET", urls[i%2]+"/v1/accounts/"+user, "", false)
			switch {
			case a.status == 200:
				ok++
			case a.status == 429 && a.code == "USER_RATE_LIMITED":
				retryAfters[a.retryAfter]++
			default:
				t.Fatalf("request %d: %+v", i, a)
			}
			clk.Advance(time.Second / (3 * perSec))
		}
		return ok, retryAfters
	}
	tune := func(c *Config) { c.UserRate = Rate{PerSec: perSec, Burst: burst} }
	clk := clock.NewManual(time.Now())
	shared := sharedRouters(t, 2, mc, "rc:test:rl:"+testenv.Prefix()+":", clk, tune)
	sharedOK, waits := run(shared, clk, "alice")
	lclk := clock.NewManual(time.Now())
	alone := sharedRouters(t, 2, nil, "", lclk, tune)
	aloneOK, _ := run(alone, lclk, "alice")
	bound := perSec*secs + burst
	if sharedOK > bound || sharedOK < bound-3 {
		t.Fatalf("shared limits accepted %d, want at most and close to %d (limit x %d s + burst)", sharedOK, bound, secs)
	}
	if aloneOK < 2*bound-6 {
		t.Fatalf("routers counting alone accepted %d: the baseline should be about twice %d", aloneOK, bound)
	}
	if len(waits) == 0 || waits["1"] == 0 {
		t.Fatalf("refusals' Retry-After: %v, want 1 s (a token every 50 ms)", waits)
	}
	t.Logf("3x the per-person limit over 2 routers for %d s: shared %d accepted (bound %d), alone %d (%.2fx)",
		secs, sharedOK, bound, aloneOK, float64(aloneOK)/float64(sharedOK))
	m := scrape(t, shared[0])
	wantMetric(t, m, "redcell_router_shared_limits_fallback", 0)
	wantMetric(t, m, "redcell_router_shared_limit_failures_total", 0)

	// The open route at 30/s for the cluster: one second of opens by
	// distinct people across both routers gets exactly 30 through.
	rclk := clock.NewManual(time.Unix(time.Now().Unix()+100, 0))
	routed := sharedRouters(t, 2, mc, "rc:test:rl:"+testenv.Prefix()+":", rclk, func(c *Config) {
		c.RateLimits["open"] = Rate{PerSec: 30, Burst: 100}
	})
	got := 0
	for i := range 80 {
		a := send(t, "POST", routed[i%2]+"/v1/packets/"+pktID+"/open", fmt.Sprintf(`{"act_id":"p%d"}`, i), false)
		if a.status == 200 {
			got++
		} else if a.code != "RATE_LIMITED" || a.retryAfter != "1" {
			t.Fatalf("open %d: %+v", i, a)
		}
	}
	if got != 30 {
		t.Fatalf("one second of 80 opens across 2 routers: %d accepted, want the cluster's 30", got)
	}
}

// With memcached unreachable a router falls back to its share (limit/N) and
// says so in its metrics.
func TestSharedLimitsFallBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	mc := memcache.New(dead)
	mc.Timeout = 100 * time.Millisecond
	clk := clock.NewManual(time.Now())
	urls := sharedRouters(t, 2, mc, "rc:test:rl:", clk, func(c *Config) { c.UserRate = Rate{PerSec: 20, Burst: 40} })
	ok := 0
	for range 60 {
		if a := send(t, "GET", urls[0]+"/v1/accounts/bob", "", false); a.status == 200 {
			ok++
		} else if a.code != "USER_RATE_LIMITED" {
			t.Fatalf("on the fallback: %+v", a)
		}
	}
	if ok != 20 { // burst 40 / 2 routers
		t.Fatalf("on the fallback one router let %d through at one instant, want its share 20", ok)
	}
	m := scrape(t, urls[0])
	wantMetric(t, m, "redcell_router_shared_limits_fallback", 1)
	if v := metricValue(t, m, "redcell_router_shared_limit_failures_total"); v < 1 {
		t.Fatalf("failures %v, want >= 1", v)
	}
}

// metricValue reads one series of an exposition (a failure without it).
func metricValue(t *testing.T, exposition, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && name == series {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no series %s", series)
	return 0
}
