// Package router is redcell's stateless edge. It validates the key of each
// request (an actID or a packet ID), hashes it to a shard, and forwards the
// request unchanged to the cell that owns the shard, as the membership view says.
// It holds no state: killing and restarting it loses nothing.
package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"redcell/cell/api"
	"redcell/model"
	"redcell/sharding"
)

// Config is the router's configuration. Start from DefaultConfig.
type Config struct {
	Listen          string        // public HTTP address
	RequestTimeout  time.Duration // deadline of each request, forwarded to the cell
	MaxBodyBytes    int           // request bodies above this are refused
	MaxConnsPerCell int           // connections kept to each cell

	// ClusterSecret keys the HMAC the router signs every forwarded request
	// with (api.Signer); cells refuse unsigned calls. The same secret as the
	// cells', at least 16 bytes: without it nothing forwarded would be served.
	ClusterSecret string

	// RateLimits is the token bucket of each route (keys: RouteNames), shared
	// by all clients, stress traffic included; beyond it the router answers
	// 429 RATE_LIMITED without forwarding. Every route must have one.
	RateLimits map[string]Rate
	// UserRate is the token bucket of each act_id: the act_id in the path
	// (account, deposit, noop), the sender of a send, the act_id of a grab or
	// open body; detail has none. Beyond it: 429 USER_RATE_LIMITED. Stress
	// traffic (api.HeaderStress) is exempt: the bench reuses act_ids at machine
	// speed, and it only reaches shadow tables; the route limits still bind it.
	UserRate Rate
	// UserLimitersMax bounds the act_ids whose buckets are kept; the ones idle
	// longest are forgotten first (see userLimits). >= 1024.
	UserLimitersMax int
}

// DefaultConfig returns the defaults, with reasons.
func DefaultConfig() Config {
	limits := map[string]Rate{}
	for _, n := range RouteNames() {
		// Far above what a 2-core machine serves (the bench must measure the
		// stack, not this limit); set it near a measured ceiling in production.
		limits[n] = Rate{PerSec: 50_000, Burst: 10_000}
	}
	return Config{
		Listen:          "127.0.0.1:8080",
		RequestTimeout:  3 * time.Second, // an app's user gives up after a few seconds
		MaxBodyBytes:    64 << 10,        // the largest valid body is well under 1 KiB
		MaxConnsPerCell: 1024,
		RateLimits:      limits,
		// A person taps a few times a second at most; 20/s with a burst of 40
		// leaves room for an app's retries and parallel screens, not for a script.
		UserRate:        Rate{PerSec: 20, Burst: 40},
		UserLimitersMax: 100_000, // ~150 bytes each: 15 MB at most
	}
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Listen == "" || c.RequestTimeout <= 0 || c.MaxBodyBytes < 1024 || c.MaxConnsPerCell < 1 {
		return fmt.Errorf("router: Listen, RequestTimeout > 0, MaxBodyBytes >= 1024 and MaxConnsPerCell >= 1 are required: %+v", c)
	}
	if len(c.ClusterSecret) < 16 {
		return errors.New("router: ClusterSecret (cluster_secret) must be at least 16 bytes: cells refuse requests not signed with it")
	}
	if err := validateRateLimits(c.RateLimits); err != nil {
		return err
	}
	if !c.UserRate.valid() || c.UserLimitersMax < 1024 {
		return fmt.Errorf("router: UserRate needs PerSec >= 1 and Burst >= 1 (got %+v), UserLimitersMax >= 1024 (got %d)", c.UserRate, c.UserLimitersMax)
	}
	return nil
}

// Routes is where the router learns the shard map (sharding/membership.Node).
type Routes interface {
	Map() *sharding.Map
}

// Router forwards requests to cells. Create it with New.
type Router struct {
	cfg     Config
	routes  Routes
	log     *slog.Logger
	http    *fasthttp.Server
	now     func() time.Time // the rate limiters' clock; time.Now outside tests
	limits  [routeCount]*rate.Limiter
	users   *userLimits
	metrics *metrics
	signer  *api.Signer // signs every forwarded request (Config.ClusterSecret)
	// refusals are the prepared answers of the rate limits, by kind and route:
	// refusing must stay cheap when a flood is what is being refused.
	refusals [limitKinds][routeCount][]byte

	mu      sync.Mutex // guards clients
	clients map[string]*fasthttp.HostClient
}

// New returns a router. Its metrics are registered with reg, which GET
// /metrics on the public port serves; reg belongs to this router's process.
func New(cfg Config, routes Routes, reg *prometheus.Registry, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, routes: routes, log: log, clients: map[string]*fasthttp.HostClient{}, now: time.Now,
		limits: newRouteLimiters(cfg.RateLimits), users: newUserLimits(cfg.UserRate, cfg.UserLimitersMax),
		signer: api.NewSigner(cfg.ClusterSecret)}
	r.metrics = newMetrics(reg, r.users)
	for id := routeOther + 1; id < routeCount; id++ {
		rl := cfg.RateLimits[routeNames[id]]
		_, r.refusals[limitRoute][id] = api.ErrorJSON(model.Errorf(model.ErrRateLimited,
			"route %s is above its limit of %d requests/s; retry later", routeNames[id], rl.PerSec))
		_, r.refusals[limitUser][id] = api.ErrorJSON(model.Errorf(model.ErrUserRateLimited,
			"this act_id is above %d requests/s; retry later", cfg.UserRate.PerSec))
	}
	r.http = &fasthttp.Server{
		Handler:            r.handle,
		Name:               "redcell-router",
		MaxRequestBodySize: cfg.MaxBodyBytes,
		ReadTimeout:        30 * time.Second,
		WriteTimeout:       30 * time.Second,
		IdleTimeout:        60 * time.Second,
		CloseOnShutdown:    true,
		ErrorHandler:       api.ProtocolError,
		Logger:             api.Logger{Log: log},
	}
	return r, nil
}

// Listen binds the public address.
func (r *Router) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("router: listen %s: %w", r.cfg.Listen, err)
	}
	return ln, nil
}

// Serve answers on ln until ctx ends, then lets in-flight requests finish.
func (r *Router) Serve(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- r.http.Serve(ln) }()
	r.log.Info("router serving", "addr", ln.Addr().String())
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if serr := r.http.ShutdownWithContext(sctx); serr != nil && err == nil {
		err = serr
	}
	return err
}

// target is what the router learns from a request before forwarding it.
type target struct {
	route routeID
	shard model.ShardID
	// user is the act_id the per-user limit counts ("" when the route has
	// none); for grab and open it is in the body, read only when needed.
	user       string
	userInBody bool
}

// route finds the route and shard of a request from its path (and, for a
// send, the sender in its body). The route is set even with an error when the
// path names one. Errors: ErrInvalidArgument, ErrNotFound, ErrMethodNotAllowed.
func route(method string, path string, body []byte) (target, error) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v1" {
		return target{}, model.Errorf(model.ErrNotFound, "no route for %s", path)
	}
	switch {
	case parts[1] == "accounts" && len(parts) == 3:
		return keyOfAct(routeAccount, method, http.MethodGet, parts[2])
	case parts[1] == "accounts" && len(parts) == 4 && parts[3] == "deposit":
		return keyOfAct(routeDeposit, method, http.MethodPost, parts[2])
	case parts[1] == "noop" && len(parts) == 3:
		return keyOfAct(routeNoop, method, http.MethodPost, parts[2])
	case parts[1] == "packets" && len(parts) == 2:
		t := target{route: routeSend}
		if method != http.MethodPost {
			return t, model.ErrMethodNotAllowed
		}
		var b struct {
			Sender string `json:"sender"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			return t, model.Invalidf("malformed JSON body: %v", err)
		}
		if err := model.ValidateActID(b.Sender); err != nil {
			_, msg := model.CodeOf(err)
			return t, model.Invalidf("sender: %s", msg)
		}
		t.shard, t.user = sharding.ShardOfAct(b.Sender), b.Sender
		return t, nil
	case parts[1] == "packets" && len(parts) == 3:
		return keyOfPacket(routeDetail, method, http.MethodGet, parts[2])
	case parts[1] == "packets" && len(parts) == 4 && parts[3] == "grab":
		return keyOfPacket(routeGrab, method, http.MethodPost, parts[2])
	case parts[1] == "packets" && len(parts) == 4 && parts[3] == "open":
		return keyOfPacket(routeOpen, method, http.MethodPost, parts[2])
	}
	return target{}, model.Errorf(model.ErrNotFound, "no route for %s", path)
}

func keyOfAct(id routeID, method, want, actID string) (target, error) {
	t := target{route: id}
	if method != want {
		return t, model.ErrMethodNotAllowed
	}
	if err := model.ValidateActID(actID); err != nil {
		return t, err
	}
	t.shard, t.user = sharding.ShardOfAct(actID), actID
	return t, nil
}

func keyOfPacket(id routeID, method, want, packetID string) (target, error) {
	t := target{route: id, userInBody: id == routeGrab || id == routeOpen}
	if method != want {
		return t, model.ErrMethodNotAllowed
	}
	ref, err := model.ParsePacketID(packetID)
	if err != nil {
		return t, err
	}
	t.shard = ref.Shard
	return t, nil
}

// bodyActID returns the act_id of a grab or open body, or "" when the body is
// not valid (the cell refuses it then, without touching its store).
func bodyActID(body []byte) string {
	if id, ok := api.ScanActID(body); ok {
		return id
	}
	var b api.ActRequest
	if json.Unmarshal(body, &b) != nil {
		return ""
	}
	return b.ActID
}

// admit applies the per-user limit, then the route's. It writes the refusal
// and returns false when one says no. The user's bucket goes first, so that
// one user's flood spends its own tokens, not the route's that everyone shares.
func (r *Router) admit(rc *fasthttp.RequestCtx, t target) bool {
	now := r.now()
	if !api.IsStress(&rc.Request.Header) {
		user := t.user
		if t.userInBody {
			user = bodyActID(rc.PostBody())
		}
		if user != "" && !r.users.allow(user, now) {
			r.refuse(rc, limitUser, t.route)
			return false
		}
	}
	if !r.limits[t.route].AllowN(now, 1) {
		r.refuse(rc, limitRoute, t.route)
		return false
	}
	return true
}

func (r *Router) refuse(rc *fasthttp.RequestCtx, kind int, id routeID) {
	r.metrics.limited[kind][id].Inc()
	rc.SetStatusCode(http.StatusTooManyRequests)
	rc.SetContentType("application/json")
	rc.Response.Header.Set("Retry-After", "1")
	rc.SetBody(r.refusals[kind][id])
}

func (r *Router) handle(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	switch path {
	case "/healthz":
		r.healthz(rc)
		return
	case "/metrics":
		r.metrics.serve(rc)
		return
	}
	start := time.Now()
	t, err := route(string(rc.Method()), path, rc.PostBody())
	switch {
	case err != nil:
		r.writeErr(rc, err)
	case r.admit(rc, t):
		r.forwardWithRetry(rc, t.shard)
	}
	r.metrics.requests.Observe(int(t.route), rc.Response.StatusCode(), rc.Response.Body(), time.Since(start))
}

// forwardWithRetry forwards to the shard's owner, once more after a 421.
func (r *Router) forwardWithRetry(rc *fasthttp.RequestCtx, shard model.ShardID) {
	deadline := time.Now().Add(r.cfg.RequestTimeout)
	for attempt := 0; ; attempt++ {
		cell, ok := r.routes.Map().Owner(shard)
		if !ok {
			r.writeErr(rc, model.Errorf(model.ErrCellUnavailable, "no live cell owns shard %d", shard))
			return
		}
		if !r.forward(rc, cell, shard, deadline) || rc.Response.StatusCode() != fasthttp.StatusMisdirectedRequest {
			return
		}
		// The cell says it does not own the shard: the map is changing. Wait for
		// the membership view to move on and try once more; then give the client
		// a retryable answer rather than a final one.
		if attempt == 1 || time.Until(deadline) < 200*time.Millisecond {
			r.writeErr(rc, model.Errorf(model.ErrCellUnavailable, "shard %d is moving between cells; retry", shard))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forward sends the request to the cell with the deadline header, signed, and
// copies the answer back. A cell that cannot be reached is a 503; a timeout a
// 504. It reports whether the cell answered.
func (r *Router) forward(rc *fasthttp.RequestCtx, cell sharding.Cell, shard model.ShardID, deadline time.Time) bool {
	// The client request is the server's own request object: fasthttp lets a
	// Request be sent as is, and forwarding without a copy keeps the router's
	// cost per request low (it is a hop on every call).
	req := &rc.Request
	req.SetHost(cell.Addr)
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	// Last, once the request is what the cell will read: the signature covers
	// the method, the request target (path and query, as the request line will
	// carry them), the stress flag and the body, and replaces any signature
	// headers the client sent. Pooled: it allocates nothing.
	r.signer.SignRequest(req, time.Now())
	resp := &rc.Response
	err := r.client(cell.Addr).DoDeadline(req, resp, deadline)
	switch {
	case err == nil:
		return true
	case errors.Is(err, fasthttp.ErrTimeout):
		r.writeErr(rc, model.Errorf(model.ErrTimeout, "cell %s did not answer in time", cell.Name))
	default:
		r.log.Warn("cell unreachable", "cell", cell.Name, "addr", cell.Addr, "shard", shard, "err", err)
		r.writeErr(rc, model.Errorf(model.ErrCellUnavailable, "cell %s owning shard %d is unreachable", cell.Name, shard))
	}
	return false
}

func (r *Router) client(addr string) *fasthttp.HostClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.clients[addr]
	if !ok {
		c = &fasthttp.HostClient{
			Addr: addr, Name: "redcell-router", MaxConns: r.cfg.MaxConnsPerCell,
			ReadTimeout: r.cfg.RequestTimeout + time.Second, WriteTimeout: r.cfg.RequestTimeout + time.Second,
			MaxIdleConnDuration: 30 * time.Second, MaxConnWaitTimeout: r.cfg.RequestTimeout,
		}
		r.clients[addr] = c
	}
	return c
}

func (r *Router) healthz(rc *fasthttp.RequestCtx) {
	m := r.routes.Map()
	cells := []map[string]any{}
	for _, c := range m.Cells() {
		cells = append(cells, map[string]any{"name": c.Name, "addr": c.Addr, "shards": c.Shards.String(), "started_ms": c.Started})
	}
	status, code := "ok", http.StatusOK
	if m.Uncovered() > 0 {
		status = "degraded" // some shards have no live cell; the rest are served
	}
	b, _ := json.Marshal(map[string]any{"status": status, "cells": cells, "uncovered_shards": m.Uncovered(), "map_version": m.Version})
	rc.SetStatusCode(code)
	rc.SetContentType("application/json")
	rc.SetBody(b)
}

func (r *Router) writeErr(rc *fasthttp.RequestCtx, err error) {
	status, body := api.ErrorJSON(err)
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(body)
}
