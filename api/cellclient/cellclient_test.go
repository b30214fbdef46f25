package cellclient

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
)

const secret = "0123456789abcdef-test"

// serve runs h on a loopback port until the test ends and returns its address.
func serve(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	return testenv.Serve(t, &fasthttp.Server{Handler: h})
}

func newClient(signer *api.Signer, clk clock.Clock, timeout time.Duration) *Client {
	return New(&fasthttp.Client{Name: "cellclient-test"}, signer, clk, timeout)
}

// seen is what a test server saw of the last request.
type seen struct {
	mu       sync.Mutex
	method   string
	path     string
	deadline int64
	stress   bool
	partial  string
	bearer   string
	verified bool
	// unstressed: the signature verified with the stress flag removed (it must not)
	unstressed   bool
	copyVerified bool
	body         string
}

func (s *seen) get() seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seen{method: s.method, path: s.path, deadline: s.deadline, stress: s.stress, partial: s.partial,
		bearer: s.bearer, verified: s.verified, unstressed: s.unstressed, copyVerified: s.copyVerified, body: s.body}
}

// recorder answers 200 {"applied": 3} and records the request, checking its
// signature with signer at now.
func recorder(s *seen, signer *api.Signer, now func() time.Time) fasthttp.RequestHandler {
	return func(rc *fasthttp.RequestCtx) {
		s.mu.Lock()
		s.method, s.path = string(rc.Method()), string(rc.RequestURI())
		s.deadline, _ = strconv.ParseInt(string(rc.Request.Header.Peek(api.HeaderDeadline)), 10, 64)
		s.stress = api.IsStress(&rc.Request.Header)
		s.partial = string(rc.Request.Header.Peek(api.HeaderPartial))
		s.bearer = string(rc.Request.Header.Peek(fasthttp.HeaderAuthorization))
		s.body = string(rc.PostBody())
		s.verified = signer.VerifyRequest(&rc.Request, now())
		var copyReq fasthttp.Request
		rc.Request.CopyTo(&copyReq)
		s.copyVerified = signer.VerifyRequest(&copyReq, now()) // the copy is a fair test of the next line
		copyReq.Header.Del(api.HeaderStress)
		s.unstressed = signer.VerifyRequest(&copyReq, now())
		s.mu.Unlock()
		rc.SetContentType("application/json")
		rc.SetBodyString(`{"applied":3,"deferred":["c1"]}`)
	}
}

// TestSendSignsAndStamps: a call carries the method, path, body, stress mark,
// partial flag and bearer it was given, the deadline of its ctx in ms, and a
// signature that verifies and covers the stress mark; the answer decodes.
func TestSendSignsAndStamps(t *testing.T) {
	signer := api.NewSigner(secret)
	clk := clock.NewManual(time.Now().Truncate(time.Millisecond))
	var s seen
	addr := serve(t, recorder(&s, signer, clk.Now))
	c := newClient(signer, clk, time.Hour)

	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(10*time.Second))
	defer cancel()
	var out api.CreditsResponse
	err := c.Send(ctx, Call{Addr: addr, Path: api.CreditsPath, Stress: true, Partial: true, Bearer: "k1",
		Body: api.CreditsRequest{Credits: []model.Credit{{ClaimID: "c1", ActID: "bob", Amount: 5}}}, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if out.Applied != 3 || len(out.Deferred) != 1 || out.Deferred[0] != "c1" {
		t.Errorf("answer decoded as %+v", out)
	}
	got := s.get()
	if got.method != "POST" || got.path != api.CreditsPath || !strings.Contains(got.body, `"claim_id":"c1"`) {
		t.Errorf("request %s %s %s", got.method, got.path, got.body)
	}
	if !got.verified {
		t.Error("the signature does not verify")
	}
	if !got.stress || got.unstressed || !got.copyVerified {
		t.Errorf("stress mark %v; signature still verifies without it: %v (with it: %v)", got.stress, got.unstressed, got.copyVerified)
	}
	if got.partial != "1" || got.bearer != "Bearer k1" {
		t.Errorf("partial %q, authorization %q", got.partial, got.bearer)
	}
	// ctx's deadline is earlier than the client's hour: it is the one sent.
	if want, _ := ctx.Deadline(); got.deadline != want.UnixMilli() {
		t.Errorf("deadline header %d, want ctx's %d", got.deadline, want.UnixMilli())
	}

	// Without a ctx deadline, the client's timeout counts from the clock.
	c2 := newClient(signer, clk, 7*time.Second)
	if err := c2.PostJSON(context.Background(), addr, api.ReconPath, false, api.ReconRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	got = s.get()
	if want := clk.Now().Add(7 * time.Second).UnixMilli(); got.deadline != want {
		t.Errorf("deadline header %d, want clock + timeout %d", got.deadline, want)
	}
	if got.stress || !got.verified || got.partial != "" || got.bearer != "" || got.path != api.ReconPath {
		t.Errorf("unstressed call: stress %v verified %v partial %q bearer %q path %s", got.stress, got.verified, got.partial, got.bearer, got.path)
	}

	// Signed by another secret, the call does not verify: the check above means something.
	c3 := newClient(api.NewSigner("another-secret-0123456"), clk, time.Second)
	if err := c3.PostJSON(context.Background(), addr, api.ReconPath, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if s.get().verified {
		t.Error("a call signed with another secret verified")
	}
}

// TestDeadlineHonoured: a server that never answers; the call returns at its
// ctx's deadline with a TIMEOUT, not at the client's much longer timeout.
func TestDeadlineHonoured(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 4)
	addr := serve(t, func(rc *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
	})
	t.Cleanup(func() { close(release) })
	c := newClient(api.NewSigner(secret), nil, time.Hour)
	for _, withCancel := range []bool{false, true} {
		const limit = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		start := time.Now()
		var err error
		if withCancel {
			err = c.Send(ctx, Call{Addr: addr, Path: "/x"})
		} else {
			// Do: the caller's request objects, no goroutine.
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI("http://" + addr + "/x")
			err = c.Do(ctx, time.Time{}, req, resp)
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
		took := time.Since(start)
		cancel()
		<-arrived
		if !errors.Is(err, model.ErrTimeout) {
			t.Errorf("Send/Do=%v: err %v, want TIMEOUT", withCancel, err)
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Status != 0 || !ce.Retryable {
			t.Errorf("err %#v: want an *Error without a status, retryable", err)
		}
		if took < limit-10*time.Millisecond || took > limit+2*time.Second {
			t.Errorf("returned after %v, want about %v", took, limit)
		}
	}
}

// TestCancelDuringCall: a ctx cancelled while the server holds the call ends
// Send at once, with context.Canceled and no model code.
func TestCancelDuringCall(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	addr := serve(t, func(rc *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
	})
	t.Cleanup(func() { close(release) })
	c := newClient(nil, nil, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Send(ctx, Call{Addr: addr, Path: "/x"}) }()
	<-arrived // the call is in flight: now cancelling is what must end it
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || errors.Is(err, model.ErrTimeout) || errors.Is(err, model.ErrCellUnavailable) {
		t.Errorf("err %v, want context.Canceled only", err)
	}
	// A ctx already done is never sent.
	before := len(arrived)
	if err := c.Send(ctx, Call{Addr: addr, Path: "/y"}); !errors.Is(err, context.Canceled) {
		t.Errorf("done ctx: err %v", err)
	}
	ctxDead, cancelDead := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelDead()
	if err := c.Send(ctxDead, Call{Addr: addr, Path: "/y"}); !errors.Is(err, model.ErrTimeout) {
		t.Errorf("past deadline: err %v, want TIMEOUT", err)
	}
	if len(arrived) != before {
		t.Error("a call with a done ctx reached the server")
	}
}

// TestErrorCodesDecoded: every code of the table, written by api.WriteError,
// comes back as an *Error with its status, code, message and retryable flag,
// matching its sentinel and no other.
func TestErrorCodesDecoded(t *testing.T) {
	addr := serve(t, func(rc *fasthttp.RequestCtx) {
		code := strings.TrimPrefix(string(rc.Path()), "/")
		api.WriteError(rc, model.Errorf(api.Sentinel(code), "because %s", code))
	})
	c := newClient(api.NewSigner(secret), nil, 5*time.Second)
	codes := api.Codes()
	if len(codes) < 20 {
		t.Fatalf("%d codes", len(codes))
	}
	for _, code := range codes {
		err := c.PostJSON(context.Background(), addr, "/"+code, false, nil, nil)
		var ce *Error
		if !errors.As(err, &ce) {
			t.Fatalf("%s: err %v", code, err)
		}
		if ce.Status != api.Status(code) || ce.Code != code || ce.Message != "because "+code || ce.Retryable != api.Retryable(code) {
			t.Errorf("%s: %+v", code, ce)
		}
		for _, other := range codes {
			if got := errors.Is(err, api.Sentinel(other)); got != (other == code) {
				t.Errorf("%s: errors.Is(err, %s) = %v", code, other, got)
			}
		}
		if got, _ := model.CodeOf(err); got != code {
			t.Errorf("%s: model.CodeOf = %s", code, got)
		}
	}
}

// TestAnswersWithoutEnvelope: a body that is not an envelope keeps its status
// (and the header's code when there is one); a 2xx body that does not decode
// into Out is an error with the status and the decode error.
func TestAnswersWithoutEnvelope(t *testing.T) {
	addr := serve(t, func(rc *fasthttp.RequestCtx) {
		switch string(rc.Path()) {
		case "/proxy":
			rc.SetStatusCode(502)
			rc.SetBodyString("bad gateway")
		case "/header":
			rc.SetStatusCode(503)
			rc.Response.Header.Set(api.HeaderCode, model.ErrOverloaded.Code)
			rc.SetBodyString("busy")
		case "/teapot":
			rc.SetStatusCode(418)
			rc.SetBodyString("short and stout")
		default:
			rc.SetBodyString("not json")
		}
	})
	c := newClient(nil, nil, 5*time.Second)
	var ce *Error
	err := c.Send(context.Background(), Call{Method: "GET", Addr: "http://" + addr, Path: "/proxy"})
	if !errors.As(err, &ce) || ce.Status != 502 || ce.Code != "" || ce.Message != "bad gateway" || !ce.Retryable {
		t.Errorf("proxy page: %#v", err)
	}
	if errors.Is(err, model.ErrCellUnavailable) || errors.Is(err, model.ErrInternal) {
		t.Errorf("proxy page matches a sentinel: %v", err)
	}
	err = c.Send(context.Background(), Call{Method: "GET", Addr: addr, Path: "/header"})
	if !errors.As(err, &ce) || ce.Status != 503 || ce.Code != "OVERLOADED" || !errors.Is(err, model.ErrOverloaded) || !ce.Retryable {
		t.Errorf("code in header only: %#v", err)
	}
	err = c.Send(context.Background(), Call{Method: "GET", Addr: addr, Path: "/teapot"})
	if !errors.As(err, &ce) || ce.Status != 418 || ce.Retryable {
		t.Errorf("4xx page: %#v", err)
	}
	var out api.CreditsResponse
	err = c.Send(context.Background(), Call{Addr: addr, Path: "/ok", Out: &out})
	if !errors.As(err, &ce) || ce.Status != 200 || ce.Err == nil || ce.Message != "not json" {
		t.Errorf("undecodable 200: %#v", err)
	}
	if err := c.Send(context.Background(), Call{Addr: addr, Path: "/ok"}); err != nil {
		t.Errorf("200 without Out: %v", err)
	}
}

// TestTransportErrors: a port nobody listens on is CELL_UNAVAILABLE,
// retryable, with the dial error inside.
func TestTransportErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(nil, nil, 5*time.Second)
	err = c.PostJSON(context.Background(), addr, "/x", false, nil, nil)
	var ce *Error
	if !errors.Is(err, model.ErrCellUnavailable) || errors.Is(err, model.ErrTimeout) || !errors.As(err, &ce) ||
		ce.Err == nil || ce.Status != 0 || !ce.Retryable || ce.Addr != addr {
		t.Errorf("closed port: %#v", err)
	}
	if Transport(fasthttp.ErrTimeout) != model.ErrTimeout || Transport(context.DeadlineExceeded) != model.ErrTimeout ||
		Transport(fasthttp.ErrNoFreeConns) != model.ErrCellUnavailable || Transport(errors.New("reset")) != model.ErrCellUnavailable {
		t.Error("Transport maps wrongly")
	}
}

// TestStampAllocatesNothing: the router stamps every request it forwards.
func TestStampAllocatesNothing(t *testing.T) {
	signer := api.NewSigner(secret)
	var req fasthttp.Request
	req.SetRequestURI("http://127.0.0.1:1/v1/accounts/bob")
	req.Header.SetMethod("GET")
	now := time.Now()
	Stamp(&req, signer, now.Add(time.Second), now)
	if got := string(req.Header.Peek(api.HeaderDeadline)); got != strconv.FormatInt(now.Add(time.Second).UnixMilli(), 10) {
		t.Errorf("deadline header %q", got)
	}
	ts := string(req.Header.Peek(api.HeaderTimestamp))
	if want := api.Sign([]byte(secret), "GET", "/v1/accounts/bob", api.Covered{}, now.UnixMilli(), nil); ts != strconv.FormatInt(now.UnixMilli(), 10) ||
		string(req.Header.Peek(api.HeaderSignature)) != want {
		t.Errorf("stamped at %s with signature %s, want %s", ts, req.Header.Peek(api.HeaderSignature), want)
	}
	if !raceEnabled {
		if n := testing.AllocsPerRun(100, func() { Stamp(&req, signer, now.Add(time.Second), now) }); n != 0 {
			t.Errorf("Stamp allocates %v times", n)
		}
	}
}

// BenchmarkSend: one signed call with a JSON body and answer over loopback,
// as the bench sends them.
func BenchmarkSend(b *testing.B) {
	addr := testenv.Serve(b, &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) { rc.SetBodyString(`{"act_id":"bob"}`) }})
	c := newClient(api.NewSigner(secret), nil, 5*time.Second)
	in := api.ActRequest{ActID: "bob"}
	b.ReportAllocs()
	for b.Loop() {
		var out api.ActRequest
		if err := c.Send(context.Background(), Call{Addr: addr, Path: "/v1/packets/x/open", Stress: true, Body: in, Out: &out}); err != nil {
			b.Fatal(err)
		}
	}
}
