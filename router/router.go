// Package router is redcell's stateless edge. It validates the key of each
// request (an actID or a packet ID), hashes it to a shard, and forwards the
// request unchanged to the cell that owns the shard, as the membership view says.
// It holds no state: killing and restarting it loses nothing.
package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"redcell/api"
	"redcell/internal/climit"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/router/apikey"
	"redcell/router/rules"
	"redcell/sharding"
)

// Config is the router's configuration. Start from DefaultConfig.
type Config struct {
	// Cells runs changes of the cluster's cells for POST /admin/cells (the
	// steps of redcell cells); nil: the route answers NOT_FOUND.
	Cells CellOps

	Listen          string        // public HTTP address
	RequestTimeout  time.Duration // deadline of each request, forwarded to the cell
	MaxBodyBytes    int           // request bodies above this are refused
	MaxConnsPerCell int           // connections kept to each cell

	// ClusterSecret keys the HMAC the router signs every forwarded request
	// with (api.Signer); cells refuse unsigned calls. The same secret as the
	// cells', at least 16 bytes: without it nothing forwarded would be served.
	// A client request marked as stress traffic (api.HeaderStress) must carry
	// a signature by it too (the bench signs its requests), or it is refused.
	ClusterSecret string

	// AdminListen is the router's admin address: GET /metrics (Prometheus, no
	// token) and the API keys (/admin/keys, AdminToken). Empty: no admin port.
	AdminListen string
	// AdminToken is the bearer token of the admin routes; empty refuses them
	// all (403 ADMIN_DISABLED). At least 16 bytes when set.
	AdminToken string
	// TLSCert and TLSKey are PEM files: when both are set, the public port and
	// the admin port serve HTTPS only, so API keys never cross a network in
	// clear. Both empty: plain HTTP (on loopback, as make run does).
	TLSCert, TLSKey string

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

	// Shared, when set, makes RateLimits and UserRate hold for all routers
	// together, through memcached (see Shared); nil: each router counts
	// alone, so N routers let N times the limits through.
	Shared *Shared

	// RulesFile is the degrade switches and anti-abuse rules (router/rules),
	// read at start, on POST /admin/rules/reload and when it changes; "":
	// none. A file that does not exist yet is an empty table; one read before
	// that is gone keeps the rules in force.
	RulesFile string
	// ClientIPHeader names a header set by a trusted proxy in front of the
	// routers (e.g. X-Forwarded-For) whose last address is the client's, for
	// the rules' ips; "": the connection's address.
	ClientIPHeader string
}

// Shared is what the cluster-wide limits need: memcached and the number of
// routers.
//
// A route's limit is then a window counter per second in memcached
// (internal/climit.Limiter: PerSec for the whole cluster, each router taking
// chunks of a twentieth), after the router's own bucket of PerSec and Burst.
// A person's is a token bucket in memcached (internal/climit.Buckets: GCRA
// by compare-and-swap, PerSec and Burst for the whole cluster), after the
// router's own bucket, which keeps refusing a flood cheap. When memcached
// fails, each router falls back to a share of limit/N for a second at a time
// (N from Routers).
type Shared struct {
	Memcache SharedMemcache
	// Routers counts the live routers (the membership); nil or < 1: 1.
	Routers func() int
	// Prefix starts the limits' memcached keys (default "rc:rl:").
	Prefix string
	// Clock is the shared limits' clock (nil: the system's); tests set one.
	Clock clock.Clock
}

// SharedMemcache is what the cluster-wide limits call on memcached
// (gomemcache's *memcache.Client).
type SharedMemcache interface {
	climit.Memcache
	climit.CASMemcache
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
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return errors.New("router: AdminToken (admin_token) must be at least 16 bytes when set")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("router: TLSCert and TLSKey (tls_cert, tls_key) go together: set both for HTTPS, neither for plain HTTP")
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

// CellOps runs one change of the cluster's cells at a time in the background
// (cmd/redcell: the mover of redcell cells).
type CellOps interface {
	// Start begins a change. Errors: ErrInvalidArgument (a bad request, or
	// one the live cells refuse: a cell not in the config, a database nobody
	// owns), ErrOverloaded (a change is running).
	Start(req api.CellsRequest) (api.CellsJob, error)
	// Job is the last change started and how far it got.
	Job() api.CellsJob
}

// Keys is where the router checks the calling apps' API keys and, on its
// admin port, lists, adds and revokes them (router/apikey.File).
type Keys interface {
	// Check authenticates key for scope; errors: model.ErrUnauthenticated (401),
	// model.ErrPermissionDenied (403).
	Check(key []byte, scope apikey.Scope) (app string, err error)
	List() ([]apikey.Key, error)
	Add(app string, scopes []apikey.Scope, now time.Time) (key string, k apikey.Key, err error)
	Revoke(id string, now time.Time) (apikey.Key, error)
}

// Router forwards requests to cells. Create it with New.
type Router struct {
	cfg    Config
	routes Routes
	keys   Keys
	log    *slog.Logger
	http   *fasthttp.Server
	admin  *fasthttp.Server // the admin port's server (Config.AdminListen)
	now    func() time.Time // the rate limiters' clock; time.Now outside tests
	limits [routeCount]*rate.Limiter
	users  *userLimits
	// shared are the cluster-wide limits (Config.Shared): per route, and per
	// act_id; nil without Shared.
	sharedRoutes [routeCount]*climit.Limiter
	sharedUsers  *climit.Buckets
	rules        *rules.Source // nil without Config.RulesFile
	routersN     atomic.Int64  // Shared.Routers, asked at routersAt (Unix ns)
	routersAt    atomic.Int64
	metrics      *metrics
	signer       *api.Signer // signs every forwarded request (Config.ClusterSecret)
	// refusals are the prepared answers of the rate limits, by kind and route:
	// refusing must stay cheap when a flood is what is being refused.
	refusals [limitKinds + 1][routeCount][]byte // + limitDegraded

	mu      sync.Mutex             // guards clients
	clients map[string]*cellClient // by cell address
}

// New returns a router that authenticates callers with keys. Its metrics are
// registered with reg, which GET /metrics on the admin port serves; reg
// belongs to this router's process.
func New(cfg Config, routes Routes, keys Keys, reg *prometheus.Registry, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if keys == nil {
		return nil, errors.New("router: an API key file is required (router.api_keys)")
	}
	r := &Router{cfg: cfg, routes: routes, keys: keys, log: log, clients: map[string]*cellClient{}, now: time.Now,
		limits: newRouteLimiters(cfg.RateLimits), users: newUserLimits(cfg.UserRate, cfg.UserLimitersMax),
		signer: api.NewSigner(cfg.ClusterSecret)}
	if err := r.newShared(); err != nil {
		return nil, err
	}
	if cfg.RulesFile != "" {
		src, err := rules.Open(cfg.RulesFile, ruleRoutes, r.newRuleBucket, log.With("component", "rules"))
		if err != nil {
			return nil, err
		}
		r.rules = src
	}
	r.metrics = newMetrics(reg, r.users, r.sharedUsers, r.sharedFallingBack)
	for id := routeOther + 1; id < routeCount; id++ {
		rl := cfg.RateLimits[routeNames[id]]
		_, r.refusals[limitRoute][id] = api.ErrorJSON(model.Errorf(model.ErrRateLimited,
			"route %s is above its limit of %d requests/s; retry later", routeNames[id], rl.PerSec))
		_, r.refusals[limitUser][id] = api.ErrorJSON(model.Errorf(model.ErrUserRateLimited,
			"this act_id is above %d requests/s; retry later", cfg.UserRate.PerSec))
		_, r.refusals[limitDegraded][id] = api.ErrorJSON(model.Errorf(model.ErrDegraded,
			"route %s lets only part of its requests through for now (degrade switch); retry later", routeNames[id]))
	}
	r.http = api.NewServer("redcell-router", r.handle, cfg.MaxBodyBytes, log)
	// A multipart body is refused for its media type (415), not parsed.
	r.http.DisablePreParseMultipartForm = true
	r.admin = api.NewServer("redcell-router-admin", r.handleAdmin, 16<<10, log)
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

// ListenAdmin binds the admin address; it returns nil, nil when there is none.
func (r *Router) ListenAdmin() (net.Listener, error) {
	if r.cfg.AdminListen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", r.cfg.AdminListen)
	if err != nil {
		return nil, fmt.Errorf("router: listen %s (admin): %w", r.cfg.AdminListen, err)
	}
	return ln, nil
}

// Serve answers on ln (and on admin, the admin port, unless it is nil) until
// ctx ends, then lets in-flight requests finish. With TLS configured both
// serve HTTPS.
func (r *Router) Serve(ctx context.Context, ln, admin net.Listener) error {
	errc := make(chan error, 2)
	go func() { errc <- r.serve(r.http, ln) }()
	r.log.Info("router serving", "addr", ln.Addr().String(), "tls", r.cfg.TLSCert != "")
	if admin != nil {
		go func() { errc <- r.serve(r.admin, admin) }()
		r.log.Info("router admin port", "addr", admin.Addr().String(), "token_set", r.cfg.AdminToken != "")
	}
	if r.rules != nil {
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go r.rules.Watch(wctx, time.Second) // every router reads the same file
	}
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
	if admin != nil {
		_ = r.admin.ShutdownWithContext(sctx)
	}
	return err
}

func (r *Router) serve(srv *fasthttp.Server, ln net.Listener) error {
	if r.cfg.TLSCert != "" {
		return srv.ServeTLS(ln, r.cfg.TLSCert, r.cfg.TLSKey)
	}
	return srv.Serve(ln)
}

// admit applies the rules table (degrade switch, anti-abuse rules), the
// per-user limit, then the route's. It writes the refusal and returns false
// when one says no. The user's bucket goes before the route's, so that one
// user's flood spends its own tokens, not the route's that everyone shares;
// with Config.Shared each is this router's bucket first (a flood is refused
// without a memcached call), then the cluster's.
func (r *Router) admit(rc *fasthttp.RequestCtx, t target) bool {
	now := r.now()
	stress := api.IsStress(&rc.Request.Header)
	var tab *rules.Table
	if r.rules != nil {
		if tab = r.rules.Table(); tab.Idle() {
			tab = nil
		}
	}
	user := t.user
	if t.route.UserInBody && (!stress || tab != nil) {
		user = bodyActID(rc.PostBody())
	}
	if tab != nil && !r.checkRules(rc, tab, t, user) {
		return false
	}
	if !stress && user != "" {
		if !r.users.allow(user, now) {
			r.refuse(rc, limitUser, t.route.ID, 1)
			return false
		}
		// user is a valid act_id (api.Locate, bodyActID): a memcached key.
		if r.sharedUsers != nil {
			if ok, wait := r.sharedUsers.Allow(user); !ok {
				r.refuse(rc, limitUser, t.route.ID, retryAfterSecs(wait))
				return false
			}
		}
	}
	if !r.limits[t.route.ID].AllowN(now, 1) {
		r.refuse(rc, limitRoute, t.route.ID, 1)
		return false
	}
	if l := r.sharedRoutes[t.route.ID]; l != nil && !l.Allow() {
		r.refuse(rc, limitRoute, t.route.ID, 1)
		return false
	}
	return true
}

// refuse answers 429 with the prepared refusal of kind and route, asking the
// client to wait retryAfter seconds.
func (r *Router) refuse(rc *fasthttp.RequestCtx, kind int, id api.RouteID, retryAfter int) {
	r.metrics.limited[kind][id].Inc()
	api.WriteErrorBody(rc, http.StatusTooManyRequests, limitCodes[kind], r.refusals[kind][id])
	if retryAfter > 1 {
		rc.Response.Header.Set(api.HeaderRetryAfter, strconv.Itoa(retryAfter))
	}
}

// checkRules runs the request through tab (router/rules) and answers the
// refusals: 503 DEGRADED (the route's degrade switch), 403 BLOCKED, 429
// USER_RATE_LIMITED (a limit rule), each with Retry-After but the block.
func (r *Router) checkRules(rc *fasthttp.RequestCtx, tab *rules.Table, t target, user string) bool {
	q := rules.Request{Route: int(t.route.ID), IP: r.clientIP(rc), ActID: user,
		Header: func(name string) []byte { return rc.Request.Header.Peek(name) }}
	v, rule, wait := tab.Check(&q)
	switch v {
	case rules.Degraded:
		r.metrics.ruled[v][t.route.ID].Inc()
		api.WriteErrorBody(rc, http.StatusServiceUnavailable, model.ErrDegraded.Code, r.refusals[limitDegraded][t.route.ID])
	case rules.Blocked:
		r.metrics.ruled[v][t.route.ID].Inc()
		api.WriteError(rc, model.Errorf(model.ErrBlocked, "refused by the anti-abuse rule %q", rule))
		return false
	case rules.Limited:
		r.metrics.ruled[v][t.route.ID].Inc()
		api.WriteError(rc, model.Errorf(model.ErrUserRateLimited, "above the limit of the anti-abuse rule %q; retry later", rule))
	default:
		return true
	}
	rc.Response.Header.Set(api.HeaderRetryAfter, strconv.Itoa(wait))
	return false
}

// clientIP is the client's address for the rules: the last address of
// Config.ClientIPHeader (the one the trusted proxy saw) when set and valid,
// else the connection's. The last address is that of the header's last line:
// a proxy may add its own line after the client's (HAProxy's forwardfor
// does), and the first line is then the client's to write. An IPv6 zone is
// dropped: it is the client's to write too, and a zone matches no prefix.
func (r *Router) clientIP(rc *fasthttp.RequestCtx) netip.Addr {
	if h := r.cfg.ClientIPHeader; h != "" {
		var v []byte
		if all := rc.Request.Header.PeekAll(h); len(all) > 0 {
			v = all[len(all)-1]
		}
		if i := bytes.LastIndexByte(v, ','); i >= 0 {
			v = v[i+1:]
		}
		if a, err := netip.ParseAddr(string(bytes.TrimSpace(v))); err == nil {
			return a.Unmap().WithZone("")
		}
	}
	a, _ := netip.AddrFromSlice(rc.RemoteIP())
	return a.Unmap()
}

func (r *Router) handle(rc *fasthttp.RequestCtx) {
	if string(rc.Path()) == api.HealthPath { // open to all: load balancers and probes hold no key
		r.healthz(rc)
		return
	}
	// One reading of the clock for the request's checks, deadline and
	// signature (each reading is a measurable share of a hop this cheap).
	start := time.Now()
	t, err := r.accept(rc, start)
	switch {
	case err != nil:
		r.writeErr(rc, err)
		if errors.Is(err, model.ErrUnauthenticated) {
			rc.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="redcell"`) // RFC 6750
		}
	case r.admit(rc, t):
		r.forwardWithRetry(rc, t.shard, start)
	}
	// The code of an error answer is in its header, the router's own or the
	// cell's, which forward copied back with the rest of the answer.
	r.metrics.requests.ObserveCode(int(t.route.ID), rc.Response.StatusCode(), api.ResponseCode(&rc.Response.Header), time.Since(start))
}

// accept runs the router's checks of a public request, in this order, and
// returns the first refusal: the route (404 NOT_FOUND, 405
// METHOD_NOT_ALLOWED), the caller's API key and the route's scope (401
// UNAUTHENTICATED, 403 PERMISSION_DENIED), the body's media type (415
// UNSUPPORTED_MEDIA_TYPE), a stress-traffic mark without the cluster's
// signature (403 PERMISSION_DENIED), and the request's key — act_id, packet
// ID or sender — (400 INVALID_ARGUMENT). A caller without a valid key learns
// nothing past the route table, and nothing refused here reaches a cell.
func (r *Router) accept(rc *fasthttp.RequestCtx, now time.Time) (target, error) {
	var segs [pathSegmentsMax]string
	parts, ok := pathSegments(rc.URI().PathOriginal(), &segs)
	if !ok {
		return target{}, model.Errorf(model.ErrNotFound, "no route for %s", rc.URI().PathOriginal())
	}
	t, err := routeOf(string(rc.Method()), parts)
	if err != nil {
		return t, err
	}
	key := bearer(&rc.Request.Header)
	if key == nil {
		return t, apikey.ErrNoKey
	}
	app, err := r.keys.Check(key, scopeOf(t.route))
	if err != nil {
		return t, err
	}
	if t.route.Key == api.KeyActQuery {
		t.key = string(rc.QueryArgs().Peek("act_id"))
	}
	if len(rc.PostBody()) > 0 && !api.MediaTypeJSON(rc.Request.Header.ContentType()) {
		return t, errMediaType
	}
	if api.IsStress(&rc.Request.Header) && !r.signer.VerifyRequest(&rc.Request, now) {
		return t, errStressUnsigned
	}
	// The coupon routes tell the cell the calling app (a serial_no is
	// unique per app); a client cannot choose it. Set after the stress
	// mark's check, which is of the request as the client signed it; the
	// signature the cell checks covers it (api.Covered).
	// HeaderPartial is a peer's word on /internal/credits, never a client's:
	// the router's signature must not lend it authority.
	rc.Request.Header.Del(api.HeaderApp)
	rc.Request.Header.Del(api.HeaderPartial)
	switch t.route.ID {
	case api.RouteCouponIssue, api.RouteCouponState:
		rc.Request.Header.Set(api.HeaderApp, app)
	}
	return t, t.locate(rc.PostBody())
}

var (
	errMediaType = model.Errorf(model.ErrUnsupportedMediaType,
		"send request bodies as JSON with Content-Type: application/json (charset=utf-8 allowed)")
	errStressUnsigned = model.Errorf(model.ErrPermissionDenied,
		"%s marks stress-test traffic and is taken only on requests signed with the cluster secret (%s, %s), as redcell bench signs them",
		api.HeaderStress, api.HeaderTimestamp, api.HeaderSignature)
)

// bearer returns the token of an "Authorization: Bearer <token>" header (the
// scheme in any case), or nil.
func bearer(h *fasthttp.RequestHeader) []byte {
	v := h.Peek(fasthttp.HeaderAuthorization)
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(string(v[:len(scheme)]), scheme) {
		return nil
	}
	return v[len(scheme):]
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
	out := map[string]any{"status": status, "cells": cells, "uncovered_shards": m.Uncovered(), "map_version": m.Version}
	if p, ok := r.routes.(interface{ DownCells() []string }); ok {
		out["cells_out"] = p.DownCells() // out of the map for failed health probes
	}
	b, _ := json.Marshal(out)
	rc.SetStatusCode(code)
	rc.SetContentType("application/json")
	rc.SetBody(b)
}

func (r *Router) writeErr(rc *fasthttp.RequestCtx, err error) { api.WriteError(rc, err) }
