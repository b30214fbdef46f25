package bench

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
)

// TestClientResults: the bench client signs and marks what it sends, and
// records every kind of outcome under the code the reports expect.
func TestClientResults(t *testing.T) {
	const secret = "bench-test-secret-0123456789"
	signer := api.NewSigner(secret)
	var unsigned, unstressed, badDeadline atomic.Int64
	base := serveHandler(t, func(rc *fasthttp.RequestCtx) {
		if !signer.VerifyRequest(&rc.Request, time.Now()) {
			unsigned.Add(1)
		}
		if !api.IsStress(&rc.Request.Header) || string(rc.Request.Header.Peek("Authorization")) != "Bearer key-1" {
			unstressed.Add(1)
		}
		ms, _ := strconv.ParseInt(string(rc.Request.Header.Peek(api.HeaderDeadline)), 10, 64)
		if d := time.Until(time.UnixMilli(ms)); d < requestTimeout-2*time.Second || d > requestTimeout {
			badDeadline.Add(1)
		}
		switch string(rc.Path()) {
		case "/v1/accounts/ok":
			rc.SetBodyString(`{"act_id":"ok","balance":120}`)
		case "/v1/accounts/garbled":
			rc.SetBodyString(`{"balance":`)
		case "/v1/accounts/sold":
			api.WriteError(rc, model.Errorf(model.ErrSoldOut, "none left"))
		case "/v1/accounts/busy":
			api.WriteError(rc, model.ErrOverloaded)
		default:
			rc.SetStatusCode(502)
			rc.SetBodyString("proxy says no")
		}
	})
	c := newClient(base, 2, "key-1", secret)
	var acct model.Account
	cases := []struct {
		path      string
		code      string
		retryable bool
	}{
		{"/v1/accounts/ok", "", false},
		{"/v1/accounts/garbled", codeBadResponse, false},
		{"/v1/accounts/sold", "SOLD_OUT", false},
		{"/v1/accounts/busy", "OVERLOADED", true},
		{"/v1/accounts/proxy", "HTTP_502", true},
	}
	for _, tc := range cases {
		res := c.call(http.MethodGet, tc.path, nil, &acct)
		if res.code != tc.code || res.retryable != tc.retryable || res.latency <= 0 {
			t.Errorf("%s: %+v, want code %q retryable %v", tc.path, res, tc.code, tc.retryable)
		}
	}
	if acct.Balance != 120 {
		t.Errorf("balance decoded as %d", acct.Balance)
	}
	if res := c.call(http.MethodGet, "/v1/accounts/sold", nil, nil); res.message != "none left" {
		t.Errorf("message %q", res.message)
	}
	if unsigned.Load() != 0 || unstressed.Load() != 0 || badDeadline.Load() != 0 {
		t.Errorf("%d unsigned, %d without the stress mark or key, %d with a wrong deadline", unsigned.Load(), unstressed.Load(), badDeadline.Load())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	if res := newClient(closed, 1, "", "").call(http.MethodGet, "/v1/accounts/x", nil, nil); res.code != codeTransport || !res.retryable {
		t.Errorf("closed port: %+v", res)
	}
}

// TestRequesterRetries: a retryable failure is tried again up to attemptsMax
// times in all, each attempt recorded; a final failure is not retried.
func TestRequesterRetries(t *testing.T) {
	var busyHits, soldHits atomic.Int64
	base := serveHandler(t, func(rc *fasthttp.RequestCtx) {
		switch string(rc.Path()) {
		case api.DepositPath("busy"):
			if busyHits.Add(1) < attemptsMax {
				api.WriteError(rc, model.ErrOverloaded)
				return
			}
			rc.SetBodyString(`{}`)
		default:
			soldHits.Add(1)
			api.WriteError(rc, model.ErrSoldOut)
		}
	})
	q := newRequester(newClient(base, 1, "", ""), time.Now())
	start := time.Now()
	res := q.do(context.Background(), time.Time{}, opDeposit, http.MethodPost, api.DepositPath("busy"), api.DepositRequest{}, nil, nil)
	if res.code != "" || busyHits.Load() != attemptsMax {
		t.Errorf("busy twice then ok: %+v after %d attempts", res, busyHits.Load())
	}
	if took := time.Since(start); took < retryBackoff+2*retryBackoff {
		t.Errorf("3 attempts in %v: the backoff (%v, then %v) was not waited", took, retryBackoff, 2*retryBackoff)
	}
	rec := q.rec[opDeposit]
	if rec.count != attemptsMax || rec.ok != 1 || rec.errors["OVERLOADED"] != attemptsMax-1 {
		t.Errorf("recorded %d attempts, %d ok, errors %v", rec.count, rec.ok, rec.errors)
	}
	res = q.do(context.Background(), time.Time{}, opSend, http.MethodPost, api.SendPath, api.SendRequest{}, nil, nil)
	if res.code != "SOLD_OUT" || soldHits.Load() != 1 {
		t.Errorf("final failure: %+v after %d attempts", res, soldHits.Load())
	}
	// A ctx that ends stops the retries: one attempt, no wait.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	busyHits.Store(0)
	res = q.do(ctx, time.Time{}, opDeposit, http.MethodPost, api.DepositPath("busy"), api.DepositRequest{}, nil, nil)
	if res.code != "OVERLOADED" || busyHits.Load() != 1 {
		t.Errorf("ended ctx: %+v after %d attempts", res, busyHits.Load())
	}
}
