// Package api is the wire contract shared by the router, the cells and the bench:
// request and response bodies (JSON, amounts in integer cents), the headers the
// hops pass on, and the one table that maps error codes to HTTP statuses.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/model"
)

// Headers passed between hops.
const (
	// HeaderDeadline carries the request deadline as Unix ms; every hop forwards
	// what is left of it.
	HeaderDeadline = "X-Redcell-Deadline-Ms"
	// HeaderCell names the cell that answered (set by cells).
	HeaderCell = "X-Redcell-Cell"
	// HeaderApp carries the calling app, as its API key names it, from the
	// router to the cell on the coupon routes (a coupon's serial_no is
	// unique per app); the router drops any a client sent.
	HeaderApp = "X-Redcell-App"
	// HeaderStress marks stress-test traffic ("1"). The router forwards it; cells
	// write such requests to shadow tables (databases shadow_db_XX), so a bench
	// can run against a live cluster without touching real users' money.
	HeaderStress = "X-Redcell-Stress"
	// HeaderPartial ("1") on POST /internal/credits says the sender reads
	// CreditsResponse.Deferred, so the receiver may answer 200 with part of the
	// batch applied. A sender without it (one built before deferral existed)
	// gets 503 OVERLOADED instead of a partial 200, so it never marks delivered
	// a credit that was not applied.
	HeaderPartial = "X-Redcell-Partial"
)

// NoopPath is the prefix of POST /v1/noop/{act_id}: routed like an account
// request, answered by the owning cell at once without touching storage. It
// measures the HTTP ceiling of the path bench → router → cell.
const NoopPath = "/v1/noop/"

// NoopResponse answers a no-op request.
type NoopResponse struct {
	Cell string `json:"cell"`
}

// StrategySetting is the body of GET and PUT /admin/strategy on a cell's admin
// port (Authorization: Bearer <admin token>): how the cell runs opens.
type StrategySetting struct {
	Strategy    string `json:"strategy"`      // naive | serial | batched | grouped
	BatchMax    int    `json:"batch_max"`     // opens per transaction (batched, grouped: per packet), 1..4096
	BatchWaitMS int    `json:"batch_wait_ms"` // wait for a batch to fill (batched, grouped), 0..1000 ms
	GroupMax    int    `json:"group_max"`     // requests per group commit (grouped), 1..4096
	GroupWaitMS int    `json:"group_wait_ms"` // bound of a busy lane's wait for its group to fill (grouped), 0..1000 ms
}

// DegradeSetting is the body of GET and PUT /admin/degrade on a cell's admin
// port: each switch is "on" (the feature works) or "off" (degraded). A PUT
// changes the switches it names and keeps the others.
type DegradeSetting struct {
	// ClaimsList off: packet detail answers without its claims (claims_degraded).
	ClaimsList string `json:"claims_list,omitempty"`
	// GrabCache off: grab reads the packet from the database, never memcached.
	GrabCache string `json:"grab_cache,omitempty"`
	// Relay off: claims wait uncredited (each claim is its own outbox row); nothing is credited to other wallets.
	Relay string `json:"relay,omitempty"`
	// WalletFlow off: the wallet's flow listing answers 503 DEGRADED; the balance still answers.
	WalletFlow string `json:"wallet_flow,omitempty"`
	// Booking off: issued rewards wait pending; a withdrawal still books the person's own first.
	Booking string `json:"booking,omitempty"`
	// CouponIssue off: coupon requests are accepted and wait in their rows; those already queued are still decided.
	CouponIssue string `json:"coupon_issue,omitempty"`
	// TokenRestore off: POST /v1/accounts/{act_id}/tokens restores no reward: a valid token the cell does not hold is refused (TOKEN_RESTORE_OFF).
	TokenRestore string `json:"token_restore,omitempty"`
}

// AuditResponse answers POST /admin/audit: the cell's own books, per space
// ("real", "shadow"); ok is true when every audited space holds.
type AuditResponse struct {
	OK     bool                       `json:"ok"`
	Spaces map[string]model.CellAudit `json:"spaces"`
}

// ReconRequest is the body of POST /internal/recon (cell to cell): claims the
// sender made, each as the credit it owes, to be checked against the credits
// booked in the receiver's wallets. At most 10,000 per call.
type ReconRequest struct {
	Credits []model.Credit `json:"credits"`
	// Copy asks the receiver to answer from its own copy of each claimant's
	// database whether or not it serves that database now: one it serves, or
	// one it handed over and still keeps. Credits of a database it holds no
	// copy of are Missing. The relay asks so before it delivers a credit to
	// any cell but the one the credit was sent to (model.Credit.Dest).
	Copy bool `json:"copy,omitempty"`
}

// ReconResponse says how many of a ReconRequest's claims are credited as
// claimed, and which are not (claim IDs).
type ReconResponse struct {
	Matched      int64    `json:"matched"`
	MatchedCents int64    `json:"matched_cents"`
	Missing      []string `json:"missing"`    // no credit for the claim
	Mismatched   []string `json:"mismatched"` // a credit of another account or amount
}

// DepositRequest is the body of POST /v1/accounts/{act_id}/deposit.
type DepositRequest struct {
	Amount  int64  `json:"amount"`   // cents, > 0
	OrderNo string `json:"order_no"` // idempotency key, [A-Za-z0-9_-]{1,64}
}

// SendRequest is the body of POST /v1/packets.
type SendRequest struct {
	Sender   string `json:"sender"`
	Amount   int64  `json:"amount"` // cents
	Count    int64  `json:"count"`
	Kind     string `json:"kind"` // "random" (default) or "fixed"
	Greeting string `json:"greeting"`
	OrderNo  string `json:"order_no"`
}

// SendResponse answers POST /v1/packets.
type SendResponse struct {
	PacketID  string `json:"packet_id"`
	Sender    string `json:"sender"`
	Amount    int64  `json:"amount"`
	Count     int64  `json:"count"`
	Kind      string `json:"kind"`
	ExpiresAt string `json:"expires_at"` // RFC 3339, UTC
	ExpiresMS int64  `json:"expires_at_ms"`
	Repeat    bool   `json:"repeat"` // true when this order_no was seen before
}

// ActRequest is the body of grab and open: who is asking.
type ActRequest struct {
	ActID string `json:"act_id"`
}

// GrabResponse answers POST /v1/packets/{id}/grab: whether a share may still be
// there. It is a cheap hint, never a reservation.
type GrabResponse struct {
	PacketID  string `json:"packet_id"`
	Available bool   `json:"available"`
	Remaining int64  `json:"remaining"` // shares left, as last seen
	Status    string `json:"status"`    // open | sold_out | expired | refunded
	Source    string `json:"source"`    // "cache" (memcached), "local" (in-process copy, memcached down) or "db"
}

// OpenResponse answers POST /v1/packets/{id}/open with the caller's claim.
type OpenResponse struct {
	ClaimID  string `json:"claim_id"`
	PacketID string `json:"packet_id"`
	ActID    string `json:"act_id"`
	Amount   int64  `json:"amount"` // cents
	Seq      int64  `json:"seq"`    // the claim's place in the packet, 1..count
	Repeat   bool   `json:"repeat"` // true when this user had opened this packet before
}

// PacketResponse answers GET /v1/packets/{id}.
type PacketResponse struct {
	PacketID        string        `json:"packet_id"`
	Sender          string        `json:"sender"`
	Kind            string        `json:"kind"`
	Greeting        string        `json:"greeting"`
	Amount          int64         `json:"amount"`
	Count           int64         `json:"count"`
	RemainingAmount int64         `json:"remaining_amount"`
	RemainingCount  int64         `json:"remaining_count"`
	RefundAmount    int64         `json:"refund_amount"`
	Status          string        `json:"status"` // open | sold_out | expired | refunded
	CreatedMS       int64         `json:"created_at_ms"`
	ExpiresMS       int64         `json:"expires_at_ms"`
	ExpiresAt       string        `json:"expires_at"` // RFC 3339, UTC
	Claims          []model.Claim `json:"claims"`
	NextAfter       int64         `json:"next_after,omitempty"` // pass as ?after= for the next page; 0 = last page
	// ClaimsDegraded is set when the claims list is switched off (degraded):
	// claims is then empty whatever the packet holds.
	ClaimsDegraded bool `json:"claims_degraded,omitempty"`
}

// IdentityRequest is the body of PUT /v1/identities/{app}/{app_user_id}: the
// person's phone, optional (absent, null or no body: bind without one). Send
// E.164 ("+8613800138000"); spaces and - . ( ) are ignored. The phone is
// kept only as a keyed hash.
type IdentityRequest struct {
	Phone *string `json:"phone"`
}

// IdentityResponse answers a binding: the person's act_id, which rewards,
// packets and the wallet key on. Repeat is true when the account was bound
// before (its first binding is answered); PhoneBound whether that binding
// has a phone.
type IdentityResponse struct {
	ActID      string `json:"act_id"`
	App        string `json:"app"`
	AppUserID  string `json:"app_user_id"`
	PhoneBound bool   `json:"phone_bound"`
	Repeat     bool   `json:"repeat"`
	CreatedMS  int64  `json:"created_at_ms"`
}

// NewIdentityResponse is the answer for binding b.
func NewIdentityResponse(b model.IdentityBinding, repeat bool) IdentityResponse {
	return IdentityResponse{ActID: b.ActID, App: b.App, AppUserID: b.AppUserID, PhoneBound: b.PhoneHash != "", Repeat: repeat, CreatedMS: b.CreatedMS}
}

// ActivitiesResponse answers GET /admin/activities and POST
// /admin/activities/reload on a cell's admin port: the reward activities the
// cell has loaded (cell/activity), or Loaded false when it has none.
type ActivitiesResponse struct {
	Loaded   bool             `json:"loaded"`
	Path     string           `json:"path,omitempty"`
	Version  string           `json:"version,omitempty"` // the first 12 hex digits of the file's SHA-256
	LoadedMS int64            `json:"loaded_at_ms,omitempty"`
	Parents  []ActivityParent `json:"activities"`
	// Warnings name what the file holds that loads but does nothing (a
	// scene's compensate), each "where: what"; absent when none.
	Warnings []string `json:"warnings,omitempty"`
}

// ActivityParent is one parent activity of an ActivitiesResponse.
type ActivityParent struct {
	ID       string          `json:"id"`
	Name     string          `json:"name,omitempty"`
	Children []ActivityChild `json:"children"`
}

// ActivityChild is one child activity: its stage, its window (RFC 3339, ""
// for open) and its scenes' IDs.
type ActivityChild struct {
	ID     string   `json:"id"`
	Stage  string   `json:"stage"`
	Start  string   `json:"start,omitempty"`
	End    string   `json:"end,omitempty"`
	Scenes []string `json:"scenes"`
}

// CreditsRequest is the body of POST /internal/credits (cell to cell).
type CreditsRequest struct {
	Credits []model.Credit `json:"credits"`
}

// CreditsResponse tells how many credits were new. Deferred lists the claim
// IDs not applied now because a wallet row they need was held by another
// transaction (answered only to senders that set HeaderPartial); the sender
// delivers them again later. The rest had been applied before.
type CreditsResponse struct {
	Applied  int      `json:"applied"`
	Deferred []string `json:"deferred,omitempty"`
}

// ErrorBody is every error answer: {"error": {"code": "...", "message": "..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the code and message of an error answer.
type ErrorDetail struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable,omitempty"`
}

// status is the one table from error code to HTTP status.
var status = map[string]int{
	model.ErrInvalidArgument.Code:      http.StatusBadRequest,
	model.ErrNotFound.Code:             http.StatusNotFound,
	model.ErrSoldOut.Code:              http.StatusConflict,
	model.ErrExpired.Code:              http.StatusGone,
	model.ErrInsufficientBalance.Code:  http.StatusConflict,
	model.ErrOrderConflict.Code:        http.StatusConflict,
	model.ErrIdentityConflict.Code:     http.StatusConflict,
	model.ErrIdentityDisabled.Code:     http.StatusNotImplemented,
	model.ErrCouponsDisabled.Code:      http.StatusNotImplemented,
	model.ErrBudgetExhausted.Code:      http.StatusConflict,
	model.ErrSceneRateLimited.Code:     http.StatusTooManyRequests,
	model.ErrNoActiveStage.Code:        http.StatusConflict,
	model.ErrWithdrawNotReleased.Code:  http.StatusForbidden,
	model.ErrTokenRefused.Code:         http.StatusUnprocessableEntity,
	model.ErrDegraded.Code:             http.StatusServiceUnavailable,
	model.ErrWrongCell.Code:            http.StatusMisdirectedRequest,
	model.ErrCellUnavailable.Code:      http.StatusServiceUnavailable,
	model.ErrMoving.Code:               http.StatusServiceUnavailable,
	model.ErrOverloaded.Code:           http.StatusServiceUnavailable,
	model.ErrTimeout.Code:              http.StatusGatewayTimeout,
	model.ErrBodyTooLarge.Code:         http.StatusRequestEntityTooLarge,
	model.ErrMethodNotAllowed.Code:     http.StatusMethodNotAllowed,
	model.ErrShuttingDown.Code:         http.StatusServiceUnavailable,
	model.ErrUnauthenticated.Code:      http.StatusUnauthorized,
	model.ErrPermissionDenied.Code:     http.StatusForbidden,
	model.ErrBlocked.Code:              http.StatusForbidden,
	model.ErrUnsupportedMediaType.Code: http.StatusUnsupportedMediaType,
	model.ErrRateLimited.Code:          http.StatusTooManyRequests,
	model.ErrUserRateLimited.Code:      http.StatusTooManyRequests,
	model.ErrCellRateLimited.Code:      http.StatusTooManyRequests,
	model.ErrDBUnavailable.Code:        http.StatusServiceUnavailable,
	model.ErrInternal.Code:             http.StatusInternalServerError,
}

// retryable codes: the same request may succeed later.
var retryable = map[string]bool{
	model.ErrCellUnavailable.Code:  true,
	model.ErrOverloaded.Code:       true,
	model.ErrTimeout.Code:          true,
	model.ErrShuttingDown.Code:     true,
	model.ErrMoving.Code:           true,
	model.ErrRateLimited.Code:      true,
	model.ErrUserRateLimited.Code:  true,
	model.ErrCellRateLimited.Code:  true,
	model.ErrSceneRateLimited.Code: true,
	model.ErrDegraded.Code:         true,
	model.ErrDBUnavailable.Code:    true,
	model.ErrInternal.Code:         true,
}

// Status returns the HTTP status for an error code (500 for unknown codes).
func Status(code string) int {
	if s, ok := status[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// ErrorJSON renders err as an error body and returns it with its HTTP status.
func ErrorJSON(err error) (int, []byte) {
	code, msg := model.CodeOf(err)
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Code: code, Message: msg, Retryable: retryable[code]}})
	return Status(code), b
}

// ProtocolError answers a request fasthttp could not read (body above the size
// limit, malformed HTTP) with a JSON error body, so clients never see a bare
// reset or a plain-text page. Set it as fasthttp.Server.ErrorHandler.
//
// For a body above the limit it first reads and discards what the client is
// still sending (drainOversized): fasthttp closes the connection after this
// answer, and closing a socket with unread data makes the kernel send a reset,
// which a client still writing its body gets instead of the 413.
func ProtocolError(rc *fasthttp.RequestCtx, err error) {
	e := model.Invalidf("malformed HTTP request")
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		e = model.Errorf(model.ErrBodyTooLarge, "request body is above the size limit")
		drainOversized(rc.Conn())
	}
	WriteError(rc, e)
}

// Limits of drainOversized: what a refused body may still cost the server. A
// client that sends more, or pauses longer, may get a reset after all.
const (
	drainBytesMax = 32 << 20               // bytes discarded at most
	drainTotalMax = 2 * time.Second        // time spent at most
	drainIdleMax  = 250 * time.Millisecond // the client sent everything when it pauses this long (a loaded client may pause 100 ms)
)

// drainOversized discards what c still receives until the client pauses for
// drainIdleMax, stops, or a limit is reached. The connection is closed right
// after the answer, so its read deadline need not be restored.
func drainOversized(c net.Conn) {
	if c == nil {
		return
	}
	buf := make([]byte, 32<<10)
	end := time.Now().Add(drainTotalMax)
	for n := 0; n < drainBytesMax && time.Now().Before(end); {
		deadline := time.Now().Add(drainIdleMax)
		if deadline.After(end) {
			deadline = end
		}
		if c.SetReadDeadline(deadline) != nil {
			return
		}
		k, err := c.Read(buf)
		n += k
		if err != nil {
			return
		}
	}
}

// Logger adapts slog to fasthttp's Logger: fasthttp's connection-level messages
// (a client that sent an oversized body, a reset) are logged at debug level.
type Logger struct{ Log *slog.Logger }

// Printf implements fasthttp.Logger.
func (l Logger) Printf(format string, args ...any) {
	l.Log.Debug("http", "msg", fmt.Sprintf(format, args...))
}

// NewServer is a fasthttp.Server named name serving handle, with the
// settings the cell's public port and the router's two ports share: a body
// above bodyBytesMax is refused (413, ProtocolError's JSON answer); a client
// has 30 s to send its request and to read the answer, and an idle
// keep-alive connection is closed after 60 s; Shutdown closes the open
// connections rather than wait for clients to go; fasthttp's connection
// messages go to log at debug level (Logger).
func NewServer(name string, handle fasthttp.RequestHandler, bodyBytesMax int, log *slog.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            handle,
		Name:               name,
		MaxRequestBodySize: bodyBytesMax,
		ReadTimeout:        30 * time.Second,
		WriteTimeout:       30 * time.Second,
		IdleTimeout:        60 * time.Second,
		CloseOnShutdown:    true,
		ErrorHandler:       ProtocolError,
		Logger:             Logger{Log: log},
	}
}

// ShardMapResponse answers GET /admin/shards on a cell's admin port.
type ShardMapResponse struct {
	Cell      string         `json:"cell"`             // this cell
	Shards    string         `json:"shards"`           // the shard ranges it owns, e.g. "0-499"
	Version   int64          `json:"map_version"`      // version of the map it sees
	Uncovered int            `json:"uncovered_shards"` // shards no live cell owns, as it sees them
	Cells     []ShardMapCell `json:"cells"`            // every live cell it knows of
}

// ShardMapCell is one live cell of the shard map.
type ShardMapCell struct {
	Name   string `json:"name"`
	Addr   string `json:"addr"`
	Shards string `json:"shards"`
	// StartedMS is when the process serving the cell joined the cluster,
	// Unix ms: of two processes announcing one cell, the map uses the later.
	StartedMS int64 `json:"started_ms"`
}

// PathSegments splits a request path as it came on the request line, still
// percent-encoded (fasthttp's URI().PathOriginal()), into its segments, each
// decoded on its own: an escaped slash stays inside its segment, so
// "/v1/accounts/a%2Fb" is ["v1" "accounts" "a/b"], which the act_id check then
// refuses (400), rather than a path of four segments that no route has (404).
// Leading and trailing slashes are ignored. ok is false for a malformed escape
// and for a dot segment ("." or ".."), which no route has.
func PathSegments(raw []byte) (segs []string, ok bool) {
	s := strings.Trim(string(raw), "/")
	if s == "" {
		return nil, true
	}
	segs = strings.Split(s, "/")
	for i, seg := range segs {
		if strings.IndexByte(seg, '%') >= 0 {
			d, err := url.PathUnescape(seg)
			if err != nil {
				return nil, false
			}
			segs[i] = d
		}
		if segs[i] == "." || segs[i] == ".." {
			return nil, false
		}
	}
	return segs, true
}

// MediaTypeJSON reports whether a request's Content-Type is JSON as the API
// takes it: application/json, with no parameter or only charset=utf-8 (any
// case, quoted or not). JSON is UTF-8 (RFC 8259), so no other charset is.
func MediaTypeJSON(contentType []byte) bool {
	mt, params, _ := strings.Cut(string(contentType), ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		return false
	}
	params = strings.TrimSpace(params)
	if params == "" {
		return true
	}
	name, value, ok := strings.Cut(params, "=")
	value = strings.Trim(strings.TrimSpace(value), `"`)
	return ok && strings.EqualFold(strings.TrimSpace(name), "charset") && strings.EqualFold(value, "utf-8")
}
