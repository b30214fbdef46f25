// Package client is a Go client of redcell's public API (docs/api.md) as an
// app backend calls it: through the router, with the app's API key, over
// net/http. It covers the reward wallet (issue, wallet, flow, rewards,
// withdraw, tokens, issued so far) and, for tests and tools, deposits,
// accounts and identity bindings.
//
// Every call takes a ctx and returns either the decoded answer or an error:
// *Error for an error answer of the API (its code, as the envelope
// {"error":{code,message,retryable}} says), or a transport error (no answer:
// refused, reset, timed out, ctx ended), wrapped with the method and path.
// Retryable tells the two kinds of "try again" apart from a final refusal.
//
// The client does not retry by itself: the caller decides, with Retryable,
// and waits Backoff before it sends again: the answer's Retry-After (rate
// limits, load shedding, a degraded route) or an exponential backoff, with
// jitter, so that clients refused together do not all come back together.
// Every write of the API is idempotent by a key the caller sends (a reward by
// its order number {act_id}_{scene}_{rain}_{award_type}_{stage}, a withdrawal
// or deposit by its order_no), so sending the same request again after a
// lost answer is safe and answers the first result with repeat set.
//
// Forced booking: ForceBook books a person's pending rewards now (POST
// /v1/accounts/{act_id}/book); a withdrawal does the same first
// (WithdrawResponse.BookedNow counts them); otherwise the booker books them
// behind, at its rate.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"redcell/api"
	"redcell/model"
)

// Client calls one router. Create it with New; it is safe for concurrent use
// and keeps its connections alive between calls (net/http's pool), so make
// one per router and share it.
type Client struct {
	base   string // the router's base URL, no trailing '/'
	apiKey string
	hc     *http.Client
}

// Option changes one setting of New.
type Option func(*options)

type options struct {
	hc                  *http.Client
	timeout             time.Duration
	maxIdleConnsPerHost int
}

// Defaults of New, with reasons.
const (
	// DefaultTimeout bounds one call end to end: the router gives each request
	// 3 s (router.request_timeout), so 10 s leaves room for a slow answer to
	// arrive instead of a second request racing it.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxIdleConnsPerHost is the connections kept open to the router:
	// the concurrency of a busy tool (redcell rewards reissue runs 8 by
	// default, at most 256), so that none dials per call.
	DefaultMaxIdleConnsPerHost = 64
	// dialTimeout bounds connecting to the router: loopback or a LAN.
	dialTimeout = 5 * time.Second
	// idleConnTimeout closes a pooled connection unused this long, below the
	// router's own idle timeout, so the client never writes to one the
	// router is closing.
	idleConnTimeout = 30 * time.Second
	// answerBytesMax bounds an answer's body read: the largest answer (a
	// page of 100 flow items, 100 token results) is well under 64 KiB.
	answerBytesMax = 1 << 20
)

// WithTimeout bounds each call end to end (> 0; default DefaultTimeout).
// A ctx deadline that comes earlier ends the call earlier.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithMaxIdleConnsPerHost sets how many connections are kept open to the
// router between calls (>= 1; default DefaultMaxIdleConnsPerHost). Ignored
// with WithHTTPClient.
func WithMaxIdleConnsPerHost(n int) Option { return func(o *options) { o.maxIdleConnsPerHost = n } }

// WithHTTPClient sends through hc instead of a client of New's own (its
// transport, TLS and proxy settings are then the caller's). WithTimeout
// still applies, per call.
func WithHTTPClient(hc *http.Client) Option { return func(o *options) { o.hc = hc } }

// New returns a client of the router at baseURL ("http://127.0.0.1:8080";
// http or https, no query) that sends apiKey (the app's key, "rck_..."). It
// returns an error for a base URL that is not one, an empty key, or an
// option out of its range.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("client: base URL %q must be http(s)://host[:port][/path]", baseURL)
	}
	if strings.TrimSpace(apiKey) == "" {
		return nil, errors.New("client: an API key is required (the router refuses calls without one)")
	}
	o := options{timeout: DefaultTimeout, maxIdleConnsPerHost: DefaultMaxIdleConnsPerHost}
	for _, opt := range opts {
		opt(&o)
	}
	if o.timeout <= 0 || o.maxIdleConnsPerHost < 1 {
		return nil, fmt.Errorf("client: timeout must be > 0 and max idle connections >= 1 (got %v, %d)", o.timeout, o.maxIdleConnsPerHost)
	}
	hc := o.hc
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          o.maxIdleConnsPerHost,
			MaxIdleConnsPerHost:   o.maxIdleConnsPerHost,
			IdleConnTimeout:       idleConnTimeout,
			TLSHandshakeTimeout:   dialTimeout,
			ExpectContinueTimeout: time.Second,
		}}
	}
	// A copy: the timeout is this client's, whatever hc's own is.
	own := *hc
	own.Timeout = o.timeout
	return &Client{base: strings.TrimRight(baseURL, "/"), apiKey: strings.TrimSpace(apiKey), hc: &own}, nil
}

// CloseIdleConnections closes the pooled connections that are idle; the
// client stays usable.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Error is an error answer of the API: its HTTP status and the code, message
// and retryable flag of its envelope. Branch on Code (model's codes, e.g.
// "NOT_FOUND"), never on Message. errors.Is matches it with the model
// sentinel of its code (model.ErrNotFound for "NOT_FOUND").
//
// An answer whose body is no envelope (a proxy's error page) has Code "" and
// the start of the body as Message; it is Retryable when its status is 5xx.
type Error struct {
	Status    int
	Code      string
	Message   string
	Retryable bool
	// RetryAfter is the answer's Retry-After (whole seconds), 0 without one.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("client: HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("client: %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap returns the model sentinel of the code (nil for a code the API
// table does not have).
func (e *Error) Unwrap() error {
	if s := api.Sentinel(e.Code); s != nil {
		return s
	}
	return nil
}

// ErrBadAnswer: a 2xx answer whose body did not decode as the route's answer.
var ErrBadAnswer = errors.New("client: the answer's body does not decode")

// Retryable reports whether the same call may succeed if sent again later:
// an *Error marked retryable (OVERLOADED, the RATE_LIMITED codes, TIMEOUT,
// ...), or no answer at all (a transport failure or the client's timeout)
// unless the caller's ctx was cancelled. The calls of this package are
// idempotent (see the package doc), so a retry is safe.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrBadAnswer) {
		return false
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return true // no answer came
}

// send is call for a route whose 2xx answer is one T: it answers the
// decoded T and call's error.
func send[T any](ctx context.Context, c *Client, method, path string, in any) (T, error) {
	var out T
	err := c.call(ctx, method, path, in, &out, false)
	return out, err
}

// call sends method path (with query, already escaped) with in as its JSON
// body (nil: none) and decodes a 2xx answer into out (nil: not read). A
// non-2xx answer is an *Error; when keep is set its body is decoded into
// out too (the tokens route answers 422 with the results).
func (c *Client) call(ctx context.Context, method, path string, in, out any, keep bool) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: %s %s: encode the body: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, answerBytesMax+1))
	if err != nil {
		return fmt.Errorf("client: %s %s: read the answer: %w", method, path, err)
	}
	if len(b) > answerBytesMax {
		return fmt.Errorf("client: %s %s: the answer is above %d bytes: %w", method, path, answerBytesMax, ErrBadAnswer)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := answerError(resp, b)
		if keep && out != nil && e.Code != "" {
			if err := json.Unmarshal(b, out); err != nil {
				return errors.Join(e, fmt.Errorf("client: %s %s: %w: %v", method, path, ErrBadAnswer, err))
			}
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("client: %s %s: %w: %v", method, path, ErrBadAnswer, err)
	}
	return nil
}

// The exponential backoff of Backoff without a Retry-After: backoffBase for
// the first retry, doubling up to backoffMax.
const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 5 * time.Second
)

// Backoff returns how long to wait before sending a call that failed with
// err again, for the attempt'th retry (1 for the first): the answer's
// Retry-After when it has one, else 100 ms doubling per attempt up to 5 s;
// either with up to half of it again added at random, so that the clients a
// shed load refused together come back spread out. It is 0 for an err that
// is not Retryable: do not send it again.
func Backoff(err error, attempt int) time.Duration {
	if !Retryable(err) {
		return 0
	}
	var d time.Duration
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		d = e.RetryAfter // the server's word, above backoffMax too
	} else {
		d = min(backoffBase<<min(max(attempt-1, 0), 10), backoffMax)
	}
	return d + rand.N(d/2+1)
}

// messageMax bounds the Message of an answer that had no envelope.
const messageMax = 256

// answerError decodes an error answer's envelope; a body that is none takes
// the code of api.HeaderCode when the answer has it.
func answerError(resp *http.Response, b []byte) *Error {
	e := &Error{Status: resp.StatusCode}
	if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
		e.RetryAfter = time.Duration(min(s, 3600)) * time.Second
	}
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message, e.Retryable = eb.Error.Code, eb.Error.Message, eb.Error.Retryable
		return e
	}
	e.Code = resp.Header.Get(api.HeaderCode)
	msg := strings.TrimSpace(string(b))
	if len(msg) > messageMax {
		msg = msg[:messageMax]
	}
	e.Message = msg
	if e.Code != "" {
		e.Retryable = api.Retryable(e.Code)
	} else {
		e.Retryable = resp.StatusCode >= 500
	}
	return e
}

// seg escapes one path segment: an ID the caller passes goes into the path
// as one segment whatever it holds (the server refuses a bad one with
// INVALID_ARGUMENT).
func seg(s string) string { return url.PathEscape(s) }

// query renders the non-empty pairs of kv (name, value, name, value...).
func query(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// IssueReward issues one reward (POST /v1/rewards): the server picks the
// stage by the request time, checks the amount against the scene's rule
// (cents for cash, pieces for a coupon kind) and answers the reward with its
// signed token, status pending (booked behind) or, with req.BookNow, booked.
// The same request again answers the first reward with Repeat set. Errors:
// *Error with INVALID_ARGUMENT (an amount outside the rule, a bad ID, an
// award_type the scene does not issue), NOT_FOUND (unknown activity or
// scene), NO_ACTIVE_STAGE, BUDGET_EXHAUSTED, SCENE_RATE_LIMITED (retryable),
// ORDER_CONFLICT (the order number issued with another amount), and the
// router's codes; or a transport error.
func (c *Client) IssueReward(ctx context.Context, req api.RewardRequest) (api.RewardResponse, error) {
	return send[api.RewardResponse](ctx, c, http.MethodPost, api.RewardsPath, req)
}

// Wallet reads a person's wallet page (GET /v1/accounts/{act_id}/wallet):
// stage "" shows the stage open now (of the first activity), else test,
// gray or official; every stage is in Stages. Amounts are cents.
func (c *Client) Wallet(ctx context.Context, actID, stage string) (api.WalletResponse, error) {
	return send[api.WalletResponse](ctx, c, http.MethodGet, api.AccountSubPath(seg(actID), "wallet")+query("stage", stage), nil)
}

// Balance is Wallet's Balance, cents: for the official stage the wallet's
// balance (rewards booked, deposits, packets), for another its booked cash
// rewards. Pending rewards are not in it.
func (c *Client) Balance(ctx context.Context, actID, stage string) (int64, error) {
	w, err := c.Wallet(ctx, actID, stage)
	return w.Balance, err
}

// CumulativeIncome is Wallet's CumulativeIncome, cents: every cash reward of
// the stage, booked or pending.
func (c *Client) CumulativeIncome(ctx context.Context, actID, stage string) (int64, error) {
	w, err := c.Wallet(ctx, actID, stage)
	return w.CumulativeIncome, err
}

// Flow reads one page of a person's flow listing (GET
// /v1/accounts/{act_id}/flow), newest first: the stage's rewards and, for
// the official stage, the wallet's other flows. cursor "" starts at the
// newest; pass the answer's NextCursor for the next page (empty when the
// page was the last). limit 0 is the server's default (20), else 1..100.
// Errors: *Error DEGRADED (retryable) while the listing is switched off.
func (c *Client) Flow(ctx context.Context, actID, stage, cursor string, limit int) (api.FlowResponse, error) {
	return send[api.FlowResponse](ctx, c, http.MethodGet, api.AccountSubPath(seg(actID), "flow")+query("stage", stage, "cursor", cursor, "limit", limitArg(limit)), nil)
}

// RewardsPage narrows and pages Rewards; the zero value is the first page
// of every stage at the server's default size.
type RewardsPage struct {
	Stage  string // "" every stage
	Cursor string // "" the newest; else the NextCursor of the page before
	Limit  int    // 0 the server's default (20), else 1..100
}

// Rewards reads a person's rewards (GET /v1/accounts/{act_id}/rewards),
// newest first, of the parent activity parent ("" every activity).
func (c *Client) Rewards(ctx context.Context, actID, parent string, page RewardsPage) (api.RewardsResponse, error) {
	q := query("parent_activity_id", parent, "stage", page.Stage, "cursor", page.Cursor, "limit", limitArg(page.Limit))
	return send[api.RewardsResponse](ctx, c, http.MethodGet, api.AccountSubPath(seg(actID), "rewards")+q, nil)
}

// Won reports whether the person won anything in the parent activity
// parentActivityID: whether it holds at least one reward of it, of any
// stage, pending or booked.
func (c *Client) Won(ctx context.Context, actID, parentActivityID string) (bool, error) {
	if parentActivityID == "" {
		return false, errors.New("client: Won needs the parent activity")
	}
	r, err := c.Rewards(ctx, actID, parentActivityID, RewardsPage{Limit: 1})
	return len(r.Rewards) > 0, err
}

// Withdraw takes req.Amount cents out of the person's official wallet (POST
// /v1/accounts/{act_id}/withdraw), after booking the person's pending
// rewards (BookedNow counts them): the one way to force booking. The same
// order_no again answers the first withdrawal with Repeat set. Errors:
// *Error INSUFFICIENT_BALANCE, WITHDRAW_NOT_RELEASED (the gray release does
// not cover the person yet), ORDER_CONFLICT, INVALID_ARGUMENT.
func (c *Client) Withdraw(ctx context.Context, actID string, req api.WithdrawRequest) (api.WithdrawResponse, error) {
	return send[api.WithdrawResponse](ctx, c, http.MethodPost, api.AccountSubPath(seg(actID), "withdraw"), req)
}

// ForceBook books every pending reward of the person now, ahead of the
// booker (POST /v1/accounts/{act_id}/book), and answers how many and the
// wallet's balance after; a withdrawal does the same first.
func (c *Client) ForceBook(ctx context.Context, actID string) (api.BookResponse, error) {
	return send[api.BookResponse](ctx, c, http.MethodPost, api.AccountSubPath(seg(actID), "book"), nil)
}

// SubmitTokens hands the server the app's copies of the person's reward
// tokens (POST /v1/accounts/{act_id}/tokens; 1..api.MaxTokens): each is
// "known", "restored" (the cell had lost it: stored and booked now) or
// "refused" with a code (TOKEN_BAD_SIGNATURE, TOKEN_EXPIRED, ...). When any
// is refused the server answers 422: SubmitTokens then returns the decoded
// results and an *Error with Code TOKEN_REFUSED, both.
func (c *Client) SubmitTokens(ctx context.Context, actID string, tokens []string) (api.TokensResponse, error) {
	var out api.TokensResponse
	err := c.call(ctx, http.MethodPost, api.AccountSubPath(seg(actID), "tokens"), api.TokensRequest{Tokens: tokens}, &out, true)
	return out, err
}

// Issued reads what the parent activity's current stage has issued so far
// (GET /v1/activities/{parent}/issued), per scene, at most StalenessMS old.
func (c *Client) Issued(ctx context.Context, parent string) (api.IssuedResponse, error) {
	return send[api.IssuedResponse](ctx, c, http.MethodGet, api.IssuedPath(seg(parent)), nil)
}

// Deposit puts req.Amount cents into the person's wallet (POST
// /v1/accounts/{act_id}/deposit); the same order_no again answers the first
// deposit with Repeat set.
func (c *Client) Deposit(ctx context.Context, actID string, req api.DepositRequest) (model.Deposit, error) {
	return send[model.Deposit](ctx, c, http.MethodPost, api.DepositPath(seg(actID)), req)
}

// Account reads a person's account (GET /v1/accounts/{act_id}): its shard
// and official balance in cents; an account never touched has balance 0.
func (c *Client) Account(ctx context.Context, actID string) (model.Account, error) {
	return send[model.Account](ctx, c, http.MethodGet, api.AccountPath(seg(actID)), nil)
}

// BindIdentity binds the app's user appUserID of app to the person's act_id
// (PUT /v1/identities/{app}/{app_user_id}), with phone (E.164) or without
// (nil). Errors: *Error IDENTITY_CONFLICT, IDENTITY_DISABLED.
func (c *Client) BindIdentity(ctx context.Context, app, appUserID string, phone *string) (api.IdentityResponse, error) {
	return send[api.IdentityResponse](ctx, c, http.MethodPut, api.IdentityPath(seg(app), seg(appUserID)), api.IdentityRequest{Phone: phone})
}

func limitArg(n int) string {
	if n <= 0 {
		return ""
	}
	return strconv.Itoa(n)
}

// IssueCoupon asks for a coupon (POST /v1/coupons/issue). The request is
// stored and answered at once with state "accepted" (202), issued behind;
// with req.Green it is decided in the call and answered with its final
// state, "issued" or "refused" with a reason. A repeat of a serial answers
// the stored request. Errors: *Error with Code INVALID_ARGUMENT, NOT_FOUND
// (no such batch), ORDER_CONFLICT (the serial was used for another person
// or batch), COUPONS_DISABLED, and the retryable ones.
func (c *Client) IssueCoupon(ctx context.Context, req api.CouponIssueRequest) (api.CouponRequestState, error) {
	return send[api.CouponRequestState](ctx, c, http.MethodPost, api.CouponIssuePath, req)
}

// CouponRequest reads a coupon request's state (GET
// /v1/coupons/issue/{serial_no}?act_id=): accepted, deciding, issued or
// refused. Errors: *Error with Code NOT_FOUND (no request of this app with
// the serial for actID), INVALID_ARGUMENT.
func (c *Client) CouponRequest(ctx context.Context, serial, actID string) (api.CouponRequestState, error) {
	return send[api.CouponRequestState](ctx, c, http.MethodGet, api.CouponIssuePath+"/"+seg(serial)+"?act_id="+url.QueryEscape(actID), nil)
}

// Coupons lists the coupons actID holds, newest first (GET
// /v1/accounts/{act_id}/coupons).
func (c *Client) Coupons(ctx context.Context, actID string) (api.CouponsResponse, error) {
	return send[api.CouponsResponse](ctx, c, http.MethodGet, api.AccountSubPath(seg(actID), "coupons"), nil)
}

// CouponsPage is a page of Coupons: after cursor ("" the newest; else the
// NextCursor of the page before), at most limit (0: the server's default,
// 100; else 1..100).
func (c *Client) CouponsPage(ctx context.Context, actID, cursor string, limit int) (api.CouponsResponse, error) {
	return send[api.CouponsResponse](ctx, c, http.MethodGet, api.AccountSubPath(seg(actID), "coupons")+query("cursor", cursor, "limit", limitArg(limit)), nil)
}
