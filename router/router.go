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

	"github.com/valyala/fasthttp"

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
}

// DefaultConfig returns the defaults, with reasons.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		RequestTimeout:  3 * time.Second, // an app's user gives up after a few seconds
		MaxBodyBytes:    64 << 10,        // the largest valid body is well under 1 KiB
		MaxConnsPerCell: 1024,
	}
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Listen == "" || c.RequestTimeout <= 0 || c.MaxBodyBytes < 1024 || c.MaxConnsPerCell < 1 {
		return fmt.Errorf("router: Listen, RequestTimeout > 0, MaxBodyBytes >= 1024 and MaxConnsPerCell >= 1 are required: %+v", c)
	}
	return nil
}

// Routes is where the router learns the shard map (sharding/membership.Node).
type Routes interface {
	Map() *sharding.Map
}

// Router forwards requests to cells. Create it with New.
type Router struct {
	cfg    Config
	routes Routes
	log    *slog.Logger
	http   *fasthttp.Server

	mu      sync.Mutex // guards clients
	clients map[string]*fasthttp.HostClient
}

// New returns a router.
func New(cfg Config, routes Routes, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, routes: routes, log: log, clients: map[string]*fasthttp.HostClient{}}
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

// route finds the shard of a request from its path (and, for a send, the
// sender in its body). Errors: ErrInvalidArgument, ErrNotFound, ErrMethodNotAllowed.
func route(method string, path string, body []byte) (model.ShardID, error) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v1" {
		return 0, model.Errorf(model.ErrNotFound, "no route for %s", path)
	}
	switch {
	case parts[1] == "accounts" && len(parts) == 3:
		return keyOfAct(method, http.MethodGet, parts[2])
	case parts[1] == "accounts" && len(parts) == 4 && parts[3] == "deposit":
		return keyOfAct(method, http.MethodPost, parts[2])
	case parts[1] == "noop" && len(parts) == 3:
		return keyOfAct(method, http.MethodPost, parts[2])
	case parts[1] == "packets" && len(parts) == 2:
		if method != http.MethodPost {
			return 0, model.ErrMethodNotAllowed
		}
		var b struct {
			Sender string `json:"sender"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			return 0, model.Invalidf("malformed JSON body: %v", err)
		}
		if err := model.ValidateActID(b.Sender); err != nil {
			_, msg := model.CodeOf(err)
			return 0, model.Invalidf("sender: %s", msg)
		}
		return sharding.ShardOfAct(b.Sender), nil
	case parts[1] == "packets" && len(parts) == 3:
		return keyOfPacket(method, http.MethodGet, parts[2])
	case parts[1] == "packets" && len(parts) == 4 && (parts[3] == "grab" || parts[3] == "open"):
		return keyOfPacket(method, http.MethodPost, parts[2])
	}
	return 0, model.Errorf(model.ErrNotFound, "no route for %s", path)
}

func keyOfAct(method, want, actID string) (model.ShardID, error) {
	if method != want {
		return 0, model.ErrMethodNotAllowed
	}
	if err := model.ValidateActID(actID); err != nil {
		return 0, err
	}
	return sharding.ShardOfAct(actID), nil
}

func keyOfPacket(method, want, id string) (model.ShardID, error) {
	if method != want {
		return 0, model.ErrMethodNotAllowed
	}
	ref, err := model.ParsePacketID(id)
	if err != nil {
		return 0, err
	}
	return ref.Shard, nil
}

func (r *Router) handle(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	if path == "/healthz" {
		r.healthz(rc)
		return
	}
	shard, err := route(string(rc.Method()), path, rc.PostBody())
	if err != nil {
		r.writeErr(rc, err)
		return
	}
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

// forward sends the request to the cell with the deadline header and copies
// the answer back. A cell that cannot be reached is a 503; a timeout a 504. It
// reports whether the cell answered.
func (r *Router) forward(rc *fasthttp.RequestCtx, cell sharding.Cell, shard model.ShardID, deadline time.Time) bool {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	rc.Request.CopyTo(req)
	req.SetHost(cell.Addr)
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
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
	cells := []map[string]string{}
	for _, c := range m.Cells() {
		cells = append(cells, map[string]string{"name": c.Name, "addr": c.Addr, "shards": c.Shards.String()})
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
