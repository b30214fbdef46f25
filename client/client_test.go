package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"redcell/api"
	"redcell/client"
	"redcell/model"
)

// These tests pin the client's side of the wire against httptest servers:
// what it sends and how it decodes every kind of answer. What the real
// router and cells answer is tested in cmd/redcell (TestRewardClient), on a
// cluster of real processes.

const key = "rck_000000000000_test"

// serve starts a server that hands each request to h and returns a client
// of it.
func serve(t *testing.T, h http.HandlerFunc, opts ...client.Option) *client.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestIssueRewardSendsTheRequest(t *testing.T) {
	want := api.RewardRequest{ParentActivityID: "demo-festival", SceneID: "rain", RainID: "r1", ActID: "alice",
		AwardType: "cash", Amount: 123, BookNow: true}
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/rewards" {
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+key {
			t.Errorf("Authorization %q", got)
		}
		if got := r.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("Content-Type %q", got)
		}
		var got api.RewardRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil || got != want {
			t.Errorf("body %+v (%v), want %+v", got, err, want)
		}
		writeJSON(w, 200, api.RewardResponse{OrderNo: "alice_rain_r1_cash_official", Amount: 123, Status: "booked", Repeat: true, CreatedMS: 7})
	})
	got, err := c.IssueReward(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if got.OrderNo != "alice_rain_r1_cash_official" || got.Amount != 123 || got.Status != "booked" || !got.Repeat || got.CreatedMS != 7 {
		t.Fatalf("answer %+v", got)
	}
}

func TestErrorEnvelope(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		body      string
		header    string // api.HeaderCode
		want      client.Error
		sentinel  error
		retryable bool
	}{
		{name: "final", status: 400, body: `{"error":{"code":"INVALID_ARGUMENT","message":"amount 999 is outside scene rain's rule 1..888"}}`,
			want: client.Error{Status: 400, Code: "INVALID_ARGUMENT", Message: "amount 999 is outside scene rain's rule 1..888"}, sentinel: model.ErrInvalidArgument},
		{name: "retryable", status: 503, body: `{"error":{"code":"OVERLOADED","message":"busy","retryable":true}}`,
			want: client.Error{Status: 503, Code: "OVERLOADED", Message: "busy", Retryable: true}, sentinel: model.ErrOverloaded, retryable: true},
		{name: "not found", status: 404, body: `{"error":{"code":"NOT_FOUND","message":"unknown scene nope"}}`,
			want: client.Error{Status: 404, Code: "NOT_FOUND", Message: "unknown scene nope"}, sentinel: model.ErrNotFound},
		{name: "proxy page", status: 502, body: "<html>bad gateway</html>",
			want: client.Error{Status: 502, Message: "<html>bad gateway</html>", Retryable: true}, retryable: true},
		{name: "code header only", status: 429, body: "slow down", header: "RATE_LIMITED",
			want: client.Error{Status: 429, Code: "RATE_LIMITED", Message: "slow down", Retryable: true}, sentinel: model.ErrRateLimited, retryable: true},
		{name: "unknown code", status: 418, body: `{"error":{"code":"TEAPOT","message":"short and stout"}}`,
			want: client.Error{Status: 418, Code: "TEAPOT", Message: "short and stout"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.header != "" {
					w.Header().Set(api.HeaderCode, tc.header)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			})
			_, err := c.Wallet(context.Background(), "alice", "")
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want *client.Error", err, err)
			}
			if *e != tc.want {
				t.Fatalf("error %+v, want %+v", *e, tc.want)
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Fatalf("errors.Is(%v, %v) is false", err, tc.sentinel)
			}
			if errors.Is(err, model.ErrSoldOut) {
				t.Fatalf("%v matches the sentinel of another code", err)
			}
			if client.Retryable(err) != tc.retryable {
				t.Fatalf("Retryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
		})
	}
}

func TestPathsAndQueries(t *testing.T) {
	var got []string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		switch {
		case strings.HasSuffix(r.URL.Path, "/rewards") && r.URL.Query().Get("parent_activity_id") == "won":
			writeJSON(w, 200, api.RewardsResponse{ActID: "a", Rewards: []api.RewardItem{{OrderNo: "x"}}})
		default:
			writeJSON(w, 200, map[string]any{})
		}
	})
	ctx := context.Background()
	_, _ = c.Wallet(ctx, "a/b", "")
	_, _ = c.Wallet(ctx, "alice", "gray")
	_, _ = c.Flow(ctx, "alice", "official", "123-x", 5)
	_, _ = c.Rewards(ctx, "alice", "demo-festival", client.RewardsPage{Stage: "test", Cursor: "c", Limit: 100})
	won, err := c.Won(ctx, "alice", "won")
	if err != nil || !won {
		t.Fatalf("Won = %v, %v; want true", won, err)
	}
	lost, err := c.Won(ctx, "alice", "lost")
	if err != nil || lost {
		t.Fatalf("Won = %v, %v; want false", lost, err)
	}
	_, _ = c.Withdraw(ctx, "alice", api.WithdrawRequest{Amount: 1, OrderNo: "w1"})
	_, _ = c.Issued(ctx, "demo-festival")
	_, _ = c.Deposit(ctx, "alice", api.DepositRequest{Amount: 1, OrderNo: "d1"})
	_, _ = c.Account(ctx, "alice")
	_, _ = c.BindIdentity(ctx, "chat", "u1", nil)
	want := []string{
		"GET /v1/accounts/a%2Fb/wallet?",
		"GET /v1/accounts/alice/wallet?stage=gray",
		"GET /v1/accounts/alice/flow?cursor=123-x&limit=5&stage=official",
		"GET /v1/accounts/alice/rewards?cursor=c&limit=100&parent_activity_id=demo-festival&stage=test",
		"GET /v1/accounts/alice/rewards?limit=1&parent_activity_id=won",
		"GET /v1/accounts/alice/rewards?limit=1&parent_activity_id=lost",
		"POST /v1/accounts/alice/withdraw?",
		"GET /v1/activities/demo-festival/issued?",
		"POST /v1/accounts/alice/deposit?",
		"GET /v1/accounts/alice?",
		"PUT /v1/identities/chat/u1?",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSubmitTokensRefusedReturnsResultsAndError(t *testing.T) {
	answer := api.TokensResponse{Error: &api.ErrorDetail{Code: "TOKEN_REFUSED", Message: "1 of 2 tokens refused; see results"}, ActID: "alice",
		Results: []api.TokenResult{{Index: 0, OrderNo: "o1", Result: "known"}, {Index: 1, Result: "refused", Code: "TOKEN_BAD_SIGNATURE", Message: "bad"}}}
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		var req api.TokensRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Tokens) != 2 {
			t.Errorf("body %+v %v", req, err)
		}
		w.Header().Set(api.HeaderCode, "TOKEN_REFUSED")
		writeJSON(w, 422, answer)
	})
	got, err := c.SubmitTokens(context.Background(), "alice", []string{"t1", "t2"})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 422 || e.Code != "TOKEN_REFUSED" || !errors.Is(err, model.ErrTokenRefused) {
		t.Fatalf("error %v, want 422 TOKEN_REFUSED", err)
	}
	if len(got.Results) != 2 || got.Results[0].Result != "known" || got.Results[1].Code != "TOKEN_BAD_SIGNATURE" || got.ActID != "alice" {
		t.Fatalf("results %+v", got)
	}
}

func TestNoAnswer(t *testing.T) {
	release := make(chan struct{})
	slow := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}, client.WithTimeout(50*time.Millisecond))
	t.Cleanup(func() { close(release) }) // after serve's: runs before the server's Close waits for the handler
	_, err := slow.Account(context.Background(), "alice")
	var e *client.Error
	if err == nil || errors.As(err, &e) || !client.Retryable(err) {
		t.Fatalf("a call the client timed out: %v (want a retryable transport error)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := slow.Account(ctx, "alice"); err == nil || client.Retryable(err) {
		t.Fatalf("a call whose ctx was cancelled: %v (want a final error)", err)
	}
	bad := serve(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "not json") })
	if _, err := bad.Account(context.Background(), "alice"); !errors.Is(err, client.ErrBadAnswer) || client.Retryable(err) {
		t.Fatalf("a 200 that does not decode: %v (want ErrBadAnswer, final)", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	refused, _ := client.New("http://"+addr, key)
	if _, err := refused.Account(context.Background(), "alice"); err == nil || !client.Retryable(err) {
		t.Fatalf("a refused connection: %v (want a retryable transport error)", err)
	}
}

func TestKeepsConnectionsAlive(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, model.Account{ActID: "alice", Balance: 5})
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL+"/", key)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		a, err := c.Account(context.Background(), "alice")
		if err != nil || a.Balance != 5 {
			t.Fatalf("account %+v %v", a, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("20 calls one after another opened %d connections, want 1", n)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		base, key string
		opts      []client.Option
	}{
		{"127.0.0.1:8080", key, nil},
		{"ftp://h", key, nil},
		{"http://", key, nil},
		{"http://h?x=1", key, nil},
		{"http://h", " ", nil},
		{"http://h", key, []client.Option{client.WithTimeout(0)}},
		{"http://h", key, []client.Option{client.WithMaxIdleConnsPerHost(0)}},
	} {
		if _, err := client.New(tc.base, tc.key, tc.opts...); err == nil {
			t.Errorf("New(%q, %q) took it", tc.base, tc.key)
		}
	}
	if _, err := client.New("https://router.example:8443/base", key); err != nil {
		t.Errorf("a base URL with a path: %v", err)
	}
}

// Backoff waits the answer's Retry-After, or an exponential backoff capped
// at 5 s, each with up to half again of jitter; nothing for a final refusal.
func TestBackoff(t *testing.T) {
	status, retryAfter := 429, "3"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		code := map[int]string{429: "USER_RATE_LIMITED", 503: "OVERLOADED", 404: "NOT_FOUND"}[status]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":%q,"message":"m","retryable":%v}}`, code, status != 404)
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "rck_0123456789ab_"+strings.Repeat("x", 32))
	if err != nil {
		t.Fatal(err)
	}
	call := func() error { _, err := c.Wallet(context.Background(), "bob", ""); return err }
	between := func(d, lo, hi time.Duration) {
		t.Helper()
		if d < lo || d > hi {
			t.Fatalf("backoff %v, want within [%v, %v]", d, lo, hi)
		}
	}
	err = call()
	var e *client.Error
	if !errors.As(err, &e) || e.RetryAfter != 3*time.Second {
		t.Fatalf("429 with Retry-After 3: %#v", err)
	}
	spread := map[time.Duration]bool{}
	for range 20 {
		d := client.Backoff(err, 1)
		between(d, 3*time.Second, 4500*time.Millisecond)
		spread[d] = true
	}
	if len(spread) < 10 {
		t.Fatalf("20 backoffs gave %d distinct waits: no jitter", len(spread))
	}
	status, retryAfter = 503, ""
	err = call()
	between(client.Backoff(err, 1), 100*time.Millisecond, 150*time.Millisecond)
	between(client.Backoff(err, 3), 400*time.Millisecond, 600*time.Millisecond)
	between(client.Backoff(err, 40), 5*time.Second, 7500*time.Millisecond)
	status = 404
	if d := client.Backoff(call(), 1); d != 0 {
		t.Fatalf("NOT_FOUND: backoff %v, want 0 (do not retry)", d)
	}
	if d := client.Backoff(context.Canceled, 1); d != 0 {
		t.Fatalf("cancelled: %v", d)
	}
}
