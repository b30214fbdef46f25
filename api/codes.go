package api

import (
	"bytes"
	"net/http"
	"sort"

	"github.com/valyala/fasthttp"

	"redcell/model"
)

// CodeOK labels a successful answer in metrics; it is never sent as an error code.
const CodeOK = "OK"

// CodeOther labels, in metrics, an answer whose error code is not in the table
// (or that carries no error body): metric label values stay a fixed set.
const CodeOther = "OTHER"

// Codes returns every error code of the status table, sorted. Metrics use it to
// fix their label values in advance.
func Codes() []string {
	out := make([]string, 0, len(status))
	for c := range status {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// errorPrefix starts every error body ErrorJSON renders: encoding/json writes
// the fields in struct order.
var errorPrefix = []byte(`{"error":{"code":"`)

// ErrorCode returns the code of an error body made by ErrorJSON, or nil when body
// is not one. It does not allocate: it returns a slice of body.
func ErrorCode(body []byte) []byte {
	if !bytes.HasPrefix(body, errorPrefix) {
		return nil
	}
	rest := body[len(errorPrefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil
	}
	return rest[:end]
}

// HeaderCode carries the error code of every error answer (the "code" of its
// envelope), so that metrics and hops read it without parsing the body.
// WriteError sets it; a non-200 answer without it counts as CodeOther.
const HeaderCode = "X-Redcell-Code"

// WriteError answers rc with err: the status of its code (Status), the JSON
// envelope of ErrorJSON and HeaderCode. Errors without a code are INTERNAL
// (model.CodeOf). It is the one way an error answer is written.
func WriteError(rc *fasthttp.RequestCtx, err error) {
	code, _ := model.CodeOf(err)
	_, body := ErrorJSON(err)
	WriteErrorBody(rc, Status(code), code, body)
}

// WriteErrorStatus is WriteError with status instead of the code's own: for
// admin answers whose code is outside the table (ADMIN_DISABLED).
func WriteErrorStatus(rc *fasthttp.RequestCtx, status int, err error) {
	code, _ := model.CodeOf(err)
	_, body := ErrorJSON(err)
	WriteErrorBody(rc, status, code, body)
}

// WriteErrorBody writes an envelope rendered in advance (ErrorJSON of an error
// with code), with status: refusals answered in floods are prepared once.
//
// A 429 or 503 answer (a rate limit, load shedding, a degrade switch, a
// shard moving) carries Retry-After: 1 (seconds) unless the caller sets its
// own after this: clients back off instead of retrying at once.
func WriteErrorBody(rc *fasthttp.RequestCtx, status int, code string, body []byte) {
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(HeaderCode, code)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		rc.Response.Header.Set(HeaderRetryAfter, "1")
	}
	rc.SetBody(body)
}

// HeaderRetryAfter is RFC 9110's Retry-After, in whole seconds here.
const HeaderRetryAfter = "Retry-After"

// ResponseCode returns an answer's HeaderCode, or nil when it has none. It
// does not allocate: the slice is the header's and valid until resp changes.
func ResponseCode(h *fasthttp.ResponseHeader) []byte {
	return h.Peek(HeaderCode)
}

// sentinels maps each code of the table to its model sentinel.
var sentinels = func() map[string]*model.Error {
	m := map[string]*model.Error{}
	for _, e := range []*model.Error{model.ErrInvalidArgument, model.ErrNotFound, model.ErrSoldOut, model.ErrExpired,
		model.ErrInsufficientBalance, model.ErrOrderConflict, model.ErrIdentityConflict, model.ErrIdentityDisabled, model.ErrCouponsDisabled,
		model.ErrBudgetExhausted, model.ErrSceneRateLimited, model.ErrNoActiveStage, model.ErrWithdrawNotReleased,
		model.ErrTokenRefused, model.ErrDegraded, model.ErrWrongCell, model.ErrMoving, model.ErrCellUnavailable,
		model.ErrOverloaded, model.ErrTimeout, model.ErrBodyTooLarge, model.ErrMethodNotAllowed, model.ErrShuttingDown,
		model.ErrUnauthenticated, model.ErrPermissionDenied, model.ErrBlocked, model.ErrUnsupportedMediaType, model.ErrRateLimited,
		model.ErrUserRateLimited, model.ErrCellRateLimited, model.ErrDBUnavailable, model.ErrInternal} {
		m[e.Code] = e
	}
	if len(m) != len(status) {
		panic("api: every code of the status table needs its sentinel")
	}
	for c := range status {
		if m[c] == nil {
			panic("api: no sentinel for code " + c)
		}
	}
	return m
}()

// Sentinel returns the model sentinel of an error code (model.ErrSoldOut for
// "SOLD_OUT"), or nil for a code outside the table.
func Sentinel(code string) *model.Error { return sentinels[code] }

// Retryable reports whether an answer with this code may succeed if the same
// request is sent again later (the envelope's "retryable").
func Retryable(code string) bool { return retryable[code] }
