package bench

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/cell/api"
)

// Codes the bench records for failures seen on the client side, next to the
// server's codes (model.Err*.Code). None is expected in a healthy run.
const (
	codeClientTimeout = "CLIENT_TIMEOUT" // no answer within requestTimeout
	codeTransport     = "TRANSPORT"      // connect, write or read failed
	codeBadResponse   = "BAD_RESPONSE"   // undecodable body, or one that breaks the contract
)

// requestTimeout bounds each request, end to end. The router gets what is left
// of it in api.HeaderDeadline.
const requestTimeout = 5 * time.Second

// client sends the API's JSON requests to the router through one shared
// fasthttp.Client. It is safe for concurrent use.
type client struct {
	hc   *fasthttp.Client
	base string // RouterURL without a trailing '/'
}

// newClient sizes the connection pool to conns, the number of goroutines that
// send requests at once, so no request waits for a connection.
func newClient(routerURL string, conns int) *client {
	return &client{
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
// 2xx answer into out. Errors are reported in the result, never returned: a
// bench records failures, it does not stop on them.
func (c *client) call(method, path string, in, out any) result {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(c.base + path)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			panic("bench: marshal request: " + err.Error()) // our own types always marshal
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	start := time.Now()
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(start.Add(requestTimeout).UnixMilli(), 10))
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
