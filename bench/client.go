package bench

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/model"
)

// Codes the bench records for failures seen on the client side, next to the
// server's codes (model.Err*.Code). None is expected in a healthy run.
const (
	codeClientTimeout = "CLIENT_TIMEOUT" // no answer within requestTimeout
	codeTransport     = "TRANSPORT"      // connect, write or read failed
	codeBadResponse   = "BAD_RESPONSE"   // undecodable body, or one that breaks the contract
	// codeDropped counts opens (and sends) of an open-loop run that were due while
	// the in-flight bound was reached: they were never sent. Like a shed answer it
	// says the target rate was not sustained.
	codeDropped = "CLIENT_DROPPED"
	// codeNoCell: in direct mode, no cell owned the request's shard when the bench
	// read the router's view.
	codeNoCell = "DIRECT_NO_CELL"
)

// requestTimeout bounds each request, end to end. The router gets what is left
// of it in api.HeaderDeadline.
const requestTimeout = 5 * time.Second

// client sends the API's JSON requests through one shared cellclient.Client
// (the router answers in the cells' terms), to the router or, when cells is
// set, straight to the cell owning each request's key. Every request carries
// api.HeaderStress: "1", so the cells write bench traffic to their shadow
// tables, unless real is set (Config.Real). It is safe for concurrent use.
type client struct {
	hc *fasthttp.Client   // cc's connection pools
	cc *cellclient.Client // deadline, stress mark, signature, error decoding
	// signer is cc's (nil without a secret), for the no-op loop, which
	// stamps its own requests (noopLoad).
	signer *api.Signer
	base   string     // RouterURL without a trailing '/'
	cells  *cellTable // nil: everything goes to base
	// apiKey, when set, is sent as "Authorization: Bearer" (the router
	// requires it; cells ignore it, so a direct client sends none).
	apiKey string
	// real: no stress mark (Config.Real); set before the first call.
	real bool
}

// newClient sizes the connection pool to conns, the number of goroutines that
// send requests at once, so no request waits for a connection. apiKey (may
// be empty) authenticates the bench to the router; secret (may be empty)
// signs every request: a cell refuses unsigned calls, and the router takes
// the stress-traffic mark only on a signed request.
func newClient(routerURL string, conns int, apiKey, secret string) *client {
	var signer *api.Signer
	if secret != "" {
		signer = api.NewSigner(secret)
	}
	hc := &fasthttp.Client{
		Name:                "redcell-bench",
		MaxConnsPerHost:     conns,
		MaxConnWaitTimeout:  requestTimeout, // wait instead of failing with ErrNoFreeConns
		ReadTimeout:         requestTimeout,
		WriteTimeout:        requestTimeout,
		MaxIdleConnDuration: 30 * time.Second,
	}
	return &client{
		hc:     hc,
		cc:     cellclient.New(hc, signer, nil, requestTimeout),
		signer: signer,
		apiKey: apiKey,
		base:   strings.TrimRight(routerURL, "/"),
	}
}

// result is the outcome of one request.
type result struct {
	code      string // "" on a 2xx answer, else the error code
	message   string
	retryable bool // the same request may succeed later
	latency   time.Duration
}

// call sends method path with in as its JSON body (nil for none) and decodes a
// 2xx answer into out; its latency starts now. See callFrom.
func (c *client) call(method, path string, in, out any) result {
	return c.callFrom(time.Time{}, method, path, in, out)
}

// callFrom is call with the latency measured from start (zero: now). An
// open-loop run passes the time the request was scheduled, so time spent
// waiting to be sent counts. Errors are reported in the result, never returned:
// a bench records failures, it does not stop on them.
func (c *client) callFrom(start time.Time, method, path string, in, out any) result {
	sent := time.Now()
	if start.IsZero() || start.After(sent) {
		start = sent
	}
	base := c.base
	if c.cells != nil {
		var ok bool
		if base, ok = c.cells.baseFor(method, path, in); !ok {
			return result{code: codeNoCell, message: "no cell owns the shard of " + path, latency: time.Since(start)}
		}
	}
	// The deadline is the request's own (Start: sent): a request sent late
	// still gets its full timeout, and the lateness shows in its latency.
	// Background: no goroutine per call; the deadline bounds it.
	err := c.cc.Send(context.Background(), cellclient.Call{Method: method, Addr: base, Path: path, Stress: !c.real,
		Bearer: c.apiKey, Start: sent, Body: in, Out: out})
	r := result{latency: time.Since(start)}
	if err == nil {
		return r
	}
	var ce *cellclient.Error
	if !errors.As(err, &ce) { // Send returns nothing else
		r.code, r.message, r.retryable = codeTransport, err.Error(), true
		return r
	}
	switch {
	case ce.Status == 0 && errors.Is(err, model.ErrTimeout):
		r.code, r.message, r.retryable = codeClientTimeout, ce.Err.Error(), true
	case ce.Status == 0:
		r.code, r.message, r.retryable = codeTransport, ce.Err.Error(), true
	case ce.Status >= 200 && ce.Status < 300: // the answer did not decode into out
		r.code, r.message = codeBadResponse, ce.Err.Error()
	case ce.Code == "":
		// Not our error body (a proxy, a panic page): name it by its status.
		r.code, r.message, r.retryable = "HTTP_"+strconv.Itoa(ce.Status), ce.Message, ce.Retryable
	default:
		r.code, r.message, r.retryable = ce.Code, ce.Message, ce.Retryable
	}
	return r
}

// realNote is what a report's title adds for a real run.
func realNote(real bool) string {
	if real {
		return " (real traffic: real tables, per-person limits)"
	}
	return ""
}
