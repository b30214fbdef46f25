package bench

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
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

// client sends the API's JSON requests through one shared fasthttp.Client, to
// the router or, when cells is set, straight to the cell owning each request's
// key. Every request carries api.HeaderStress: "1", so the cells write bench
// traffic to their shadow tables. It is safe for concurrent use.
type client struct {
	hc    *fasthttp.Client
	base  string     // RouterURL without a trailing '/'
	cells *cellTable // nil: everything goes to base
	// signer, when set, signs every request with the cluster secret: a cell
	// refuses unsigned calls, and the router takes the stress-traffic mark
	// only on a signed request.
	signer *api.Signer
	// apiKey, when set, is sent as "Authorization: Bearer" (the router
	// requires it; cells ignore it, so a direct client sends none).
	apiKey string
}

// newClient sizes the connection pool to conns, the number of goroutines that
// send requests at once, so no request waits for a connection. apiKey (may
// be empty) authenticates the bench to the router; secret (may be empty)
// signs every request.
func newClient(routerURL string, conns int, apiKey, secret string) *client {
	var signer *api.Signer
	if secret != "" {
		signer = api.NewSigner(secret)
	}
	return &client{
		signer: signer,
		apiKey: apiKey,
		hc: &fasthttp.Client{
			Name:                "redcell-bench",
			MaxConnsPerHost:     conns,
			MaxConnWaitTimeout:  requestTimeout, // wait instead of failing with ErrNoFreeConns
			ReadTimeout:         requestTimeout,
			WriteTimeout:        requestTimeout,
			MaxIdleConnDuration: 30 * time.Second,
		},
		base: strings.TrimRight(routerURL, "/"),
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
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(base + path)
	req.Header.Set(api.HeaderStress, "1")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			panic("bench: marshal request: " + err.Error()) // our own types always marshal
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	// The deadline is the request's own: a request sent late still gets its
	// full timeout, and the lateness shows in its latency.
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(sent.Add(requestTimeout).UnixMilli(), 10))
	if c.signer != nil {
		c.signer.SignRequest(req, sent) // last: it covers the target, the stress flag and the body
	}
	err := c.hc.DoTimeout(req, resp, requestTimeout)
	r := result{latency: time.Since(start)}
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		r.code, r.message, r.retryable = codeClientTimeout, err.Error(), true
	case err != nil:
		r.code, r.message, r.retryable = codeTransport, err.Error(), true
	case resp.StatusCode() >= 200 && resp.StatusCode() < 300:
		if out != nil {
			if err := json.Unmarshal(resp.Body(), out); err != nil {
				r.code, r.message = codeBadResponse, err.Error()
			}
		}
	default:
		var eb api.ErrorBody
		if json.Unmarshal(resp.Body(), &eb) != nil || eb.Error.Code == "" {
			// Not our error body (a proxy, a panic page): name it by its status.
			r.code, r.message = "HTTP_"+strconv.Itoa(resp.StatusCode()), string(resp.Body())
			r.retryable = resp.StatusCode() >= 500
		} else {
			r.code, r.message, r.retryable = eb.Error.Code, eb.Error.Message, eb.Error.Retryable
		}
	}
	return r
}
