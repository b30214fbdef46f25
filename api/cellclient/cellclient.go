// Package cellclient is the one client for calls to a cell (and, for the
// bench, to the router, which answers in the same terms): it bounds each call
// by its ctx's deadline and sends that deadline on (api.HeaderDeadline), marks
// stress traffic (api.HeaderStress), signs with the cluster secret
// (api.Signer), and turns every outcome that is not a 2xx answer into an
// *Error that matches the model sentinel of its code under errors.Is.
//
// The router forwards its client's own request object without a copy; it uses
// Stamp and Transport, the pieces Client is made of, rather than Client.
package cellclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/model"
)

// Client sends calls to cells. Create it with New. Safe for concurrent use.
type Client struct {
	hc      *fasthttp.Client
	signer  *api.Signer
	clock   clock.Clock
	timeout time.Duration
}

// New returns a client that sends through hc (its connection pools: size and
// timeouts are the caller's), signs with signer (nil: calls go unsigned, and a
// cell refuses them; the bench talks to a router without a secret), reads time
// from clk (nil: the system clock), and waits timeout at most for any call
// (> 0): a call ends earlier at its ctx's deadline.
func New(hc *fasthttp.Client, signer *api.Signer, clk clock.Clock, timeout time.Duration) *Client {
	if hc == nil || timeout <= 0 {
		panic("cellclient: New needs a fasthttp.Client and a timeout > 0")
	}
	return &Client{hc: hc, signer: signer, clock: clock.Or(clk), timeout: timeout}
}

// Call is one request.
type Call struct {
	Method string // "" is POST
	// Addr is where the call goes: "host:port" (plain HTTP, as between the
	// hops) or a base URL ("http://host:port", "https://host:port").
	Addr   string
	Path   string // request target: path and query, e.g. api.CreditsPath
	Stress bool   // stress traffic: HeaderStress "1", so the cell uses its shadow tables; the signature covers it
	// Partial sets api.HeaderPartial: the caller of POST /internal/credits reads
	// CreditsResponse.Deferred, so the cell may apply part of the batch.
	Partial bool
	Bearer  string    // when set, "Authorization: Bearer <Bearer>" (the router's API key; cells ignore it)
	Start   time.Time // when set, the time the call is signed at and its deadline counts from (the bench's schedule)
	Body    any       // marshalled to JSON as the body; nil: no body
	Out     any       // a 2xx answer's JSON body is decoded into it; nil: the body is not read
}

// Error is the outcome of a call that did not end in a 2xx answer with a
// body Out could take. errors.Is matches it against the model sentinel of its
// code (model.ErrSoldOut for an answer "SOLD_OUT"; model.ErrTimeout and
// model.ErrCellUnavailable for a call that got no answer, see Transport) and
// against Err.
type Error struct {
	Addr   string
	Status int // the answer's HTTP status; 0 when no answer came
	// Code and Message are the answer's error envelope; Code is "" when no
	// answer came, or when its body was no envelope (a proxy's page: then
	// Message is the body).
	Code, Message string
	Retryable     bool  // the same call may succeed later
	Err           error // why no answer came (transport, ctx), or why a 2xx body did not decode; nil for an error answer
	base          *model.Error
}

func (e *Error) Error() string {
	switch {
	case e.Status == 0:
		return fmt.Sprintf("cellclient: %s: %v", e.Addr, e.Err)
	case e.Err != nil:
		return fmt.Sprintf("cellclient: %s answered %d with a body that does not decode: %v", e.Addr, e.Status, e.Err)
	case e.Code == "":
		return fmt.Sprintf("cellclient: %s answered %d: %s", e.Addr, e.Status, e.Message)
	}
	return fmt.Sprintf("cellclient: %s answered %d %s: %s", e.Addr, e.Status, e.Code, e.Message)
}

// Unwrap returns the sentinel of the code and Err, those that are set.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 2)
	if e.base != nil {
		out = append(out, e.base)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// Send sends call and decodes a 2xx answer into call.Out. It returns by the
// earliest of ctx's deadline, call.Start (or now) + the client's timeout, and
// ctx's cancellation. Errors: *Error (see there), nothing else.
func (c *Client) Send(ctx context.Context, call Call) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	if call.Method == "" {
		call.Method = fasthttp.MethodPost
	}
	req.Header.SetMethod(call.Method)
	if strings.Contains(call.Addr, "://") {
		req.SetRequestURI(call.Addr + call.Path)
	} else {
		req.SetRequestURI("http://" + call.Addr + call.Path)
	}
	if call.Stress {
		req.Header.Set(api.HeaderStress, "1")
	}
	if call.Partial {
		req.Header.Set(api.HeaderPartial, "1")
	}
	if call.Bearer != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+call.Bearer)
	}
	if call.Body != nil {
		b, err := json.Marshal(call.Body)
		if err != nil {
			release(req, resp)
			return &Error{Addr: call.Addr, Err: fmt.Errorf("marshal the body: %w", err)}
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	if ctx.Done() == nil { // never cancelled: the deadline alone bounds the call, no goroutine needed
		defer release(req, resp)
		return c.finish(call, resp, c.do(ctx, call.Start, req, resp))
	}
	return c.sendCancellable(ctx, call, req, resp)
}

// sendCancellable is Send for a ctx that may be cancelled: fasthttp cannot
// stop a call in flight, so the call runs in a goroutine that Send stops
// waiting for when ctx is done.
func (c *Client) sendCancellable(ctx context.Context, call Call, req *fasthttp.Request, resp *fasthttp.Response) error {
	done := make(chan error, 1)
	go func() { done <- c.do(ctx, call.Start, req, resp) }()
	select {
	case err := <-done:
		defer release(req, resp)
		return c.finish(call, resp, err)
	case <-ctx.Done():
		// The call goes on until its deadline; the goroutine owns req and resp now.
		go func() { <-done; release(req, resp) }()
		return transportError(call.Addr, ctx.Err())
	}
}

func release(req *fasthttp.Request, resp *fasthttp.Response) {
	fasthttp.ReleaseRequest(req)
	fasthttp.ReleaseResponse(resp)
}

// finish turns the outcome of do into Send's answer.
func (c *Client) finish(call Call, resp *fasthttp.Response, err error) error {
	if err != nil {
		return err
	}
	if call.Out == nil {
		return nil
	}
	if err := json.Unmarshal(resp.Body(), call.Out); err != nil {
		return &Error{Addr: call.Addr, Status: resp.StatusCode(), Err: err, Message: string(resp.Body())}
	}
	return nil
}

// PostJSON posts body as JSON to addr's path and decodes the 2xx answer into
// out (nil: not read). See Send.
func (c *Client) PostJSON(ctx context.Context, addr, path string, stress bool, body, out any) error {
	return c.Send(ctx, Call{Addr: addr, Path: path, Stress: stress, Body: body, Out: out})
}

// Do sends req (method, URI, headers and body final, but for the deadline and
// the signature, which it sets) and reads the answer into resp; both stay the
// caller's. It returns nil on a 2xx answer, an *Error otherwise: for an error
// answer with its envelope decoded, for no answer as Transport maps it. It
// waits until the earliest of ctx's deadline and start (zero: now) + the
// client's timeout; a cancellation of ctx is seen before the call only (Send
// sees it during the call too).
func (c *Client) Do(ctx context.Context, start time.Time, req *fasthttp.Request, resp *fasthttp.Response) error {
	return c.do(ctx, start, req, resp)
}

func (c *Client) do(ctx context.Context, start time.Time, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := ctx.Err(); err != nil {
		return transportError(string(req.Host()), err)
	}
	now := c.clock.Now()
	if start.IsZero() || start.After(now) {
		start = now
	}
	deadline := start.Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	Stamp(req, c.signer, deadline, start)
	if err := c.hc.DoDeadline(req, resp, deadline); err != nil {
		return transportError(string(req.Host()), err)
	}
	if st := resp.StatusCode(); st >= 200 && st < 300 {
		return nil
	}
	return AnswerError(string(req.Host()), resp)
}

// Stamp sets a call's deadline header (api.HeaderDeadline, Unix ms) and then,
// when signer is set, signs it at now (api.Signer.SignRequest): call it once
// the method, target, stress flag and body are final. It does not allocate.
func Stamp(req *fasthttp.Request, signer *api.Signer, deadline, now time.Time) {
	var buf [20]byte
	req.Header.SetBytesV(api.HeaderDeadline, strconv.AppendInt(buf[:0], deadline.UnixMilli(), 10))
	if signer != nil {
		signer.SignRequest(req, now) // last: it covers the target, the stress flag and the body
	}
}

// Transport returns the sentinel of a call that got no answer: model.ErrTimeout
// when its deadline passed (fasthttp.ErrTimeout, context.DeadlineExceeded),
// model.ErrCellUnavailable for anything else (refused, reset, no free
// connection). The router answers its client with these codes.
func Transport(err error) *model.Error {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return model.ErrTimeout
	}
	return model.ErrCellUnavailable
}

func transportError(addr string, err error) *Error {
	base := Transport(err)
	if errors.Is(err, context.Canceled) {
		base = nil // the caller gave up: not the cell's doing
	}
	return &Error{Addr: addr, Err: err, Retryable: true, base: base}
}

// AnswerError decodes a non-2xx answer: its envelope's code, message and
// retryable flag, the code's sentinel. An answer whose body is no envelope
// takes its code from api.HeaderCode if it has one; otherwise its Code is ""
// and it is retryable when its status is 5xx.
func AnswerError(addr string, resp *fasthttp.Response) *Error {
	e := &Error{Addr: addr, Status: resp.StatusCode()}
	var eb api.ErrorBody
	if json.Unmarshal(resp.Body(), &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message, e.Retryable = eb.Error.Code, eb.Error.Message, eb.Error.Retryable
	} else {
		e.Code, e.Message = string(api.ResponseCode(&resp.Header)), string(resp.Body())
		e.Retryable = e.Code != "" && api.Retryable(e.Code) || e.Code == "" && e.Status >= 500
	}
	e.base = api.Sentinel(e.Code)
	return e
}
