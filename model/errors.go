package model

import (
	"errors"
	"fmt"
)

// Error is a domain error with a stable code. Codes are part of the HTTP API
// (the "code" field of an error body) and never change meaning; api maps
// each code to an HTTP status in one table.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Sentinel errors. Check them with errors.Is; the function that returns each says so.
var (
	// ErrInvalidArgument: a request field is malformed or out of range.
	ErrInvalidArgument = &Error{"INVALID_ARGUMENT", "invalid argument"}
	// ErrNotFound: the red packet or account does not exist.
	ErrNotFound = &Error{"NOT_FOUND", "not found"}
	// ErrSoldOut: the red packet has no share left.
	ErrSoldOut = &Error{"SOLD_OUT", "red packet has no share left"}
	// ErrExpired: the red packet passed its expiry; its remainder goes back to the sender.
	ErrExpired = &Error{"EXPIRED", "red packet has expired"}
	// ErrInsufficientBalance: the sender's balance is below the packet amount.
	ErrInsufficientBalance = &Error{"INSUFFICIENT_BALANCE", "balance is below the amount"}
	// ErrOrderConflict: the order_no was used before with a different request body.
	ErrOrderConflict = &Error{"ORDER_CONFLICT", "order_no already used with a different request"}
	// ErrIdentityConflict: the app account is already bound, to another phone
	// or without one; a binding never changes an actID money may hang on.
	ErrIdentityConflict = &Error{"IDENTITY_CONFLICT", "the app account is bound otherwise"}
	// ErrIdentityDisabled: identity binding needs the cluster's identity_key,
	// and this cluster has none.
	ErrIdentityDisabled = &Error{"IDENTITY_DISABLED", "identity binding needs identity_key in the cluster config"}
	// ErrCouponsDisabled: the cell has no coupon batches file (cell.Config.Coupons).
	ErrCouponsDisabled = &Error{"COUPONS_DISABLED", "coupons need a coupon batches file in the cell config"}
	// ErrBudgetExhausted: the reward scene's budget or stock is spent down to
	// its reserve; issuing stops there and never passes the budget.
	ErrBudgetExhausted = &Error{"BUDGET_EXHAUSTED", "the scene's budget or stock is spent"}
	// ErrSceneRateLimited: the reward scene's own rate limit (activities file) refused the issue.
	ErrSceneRateLimited = &Error{"SCENE_RATE_LIMITED", "the scene issues at its rate limit, retry later"}
	// ErrNoActiveStage: the parent activity has no child whose window holds the request's time.
	ErrNoActiveStage = &Error{"NO_ACTIVE_STAGE", "the activity has no stage open at this time"}
	// ErrWithdrawNotReleased: withdrawal is not released to this act_id yet (gray release).
	ErrWithdrawNotReleased = &Error{"WITHDRAW_NOT_RELEASED", "withdrawal is not released to this account yet"}
	// ErrTokenRefused: a reward token was forged, altered, expired, signed by a
	// retired key or sent for another person; the answer lists each token's reason.
	ErrTokenRefused = &Error{"TOKEN_REFUSED", "a reward token was refused"}
	// ErrDegraded: a degrade switch has this feature off; the rest still answers.
	ErrDegraded = &Error{"DEGRADED", "this feature is switched off for now, retry later"}
	// ErrWrongCell: the shard is not owned by the cell that received the request.
	ErrWrongCell = &Error{"WRONG_CELL", "shard is not owned by this cell"}
	// ErrMoving: the shard's database is being moved to another cell and its
	// writes are paused for the last few transactions (the freeze, about a
	// second); the router retries it with a short backoff, and a client may too.
	ErrMoving = &Error{"MOVING", "the shard's database is moving to another cell, retry"}
	// ErrCellUnavailable: no live cell owns the shard (router only).
	ErrCellUnavailable = &Error{"CELL_UNAVAILABLE", "no live cell owns this shard"}
	// ErrOverloaded: a bounded queue is full or a request waited too long; retry later.
	ErrOverloaded = &Error{"OVERLOADED", "overloaded, retry later"}
	// ErrTimeout: the request deadline passed before the work finished.
	ErrTimeout = &Error{"TIMEOUT", "deadline exceeded"}
	// ErrBodyTooLarge: the request body is above the size limit.
	ErrBodyTooLarge = &Error{"BODY_TOO_LARGE", "request body too large"}
	// ErrMethodNotAllowed: the path exists but not for this method.
	ErrMethodNotAllowed = &Error{"METHOD_NOT_ALLOWED", "method not allowed"}
	// ErrShuttingDown: the server is draining and takes no new work.
	ErrShuttingDown = &Error{"SHUTTING_DOWN", "server is shutting down"}
	// ErrUnauthenticated: a signature, API key or token is missing, wrong or too old.
	ErrUnauthenticated = &Error{"UNAUTHENTICATED", "missing or invalid credentials"}
	// ErrPermissionDenied: the caller is authenticated but may not do this: its
	// API key lacks the route's scope, or it marked a request as stress traffic
	// without the cluster's signature.
	ErrPermissionDenied = &Error{"PERMISSION_DENIED", "the caller may not do this"}
	// ErrBlocked: a rule of the router's anti-abuse table (router.rules_file)
	// refuses this caller's address, act_id or headers; retrying does not help.
	ErrBlocked = &Error{"BLOCKED", "refused by an anti-abuse rule"}
	// ErrUnsupportedMediaType: a request body sent as anything but
	// application/json (a charset parameter of utf-8 is allowed).
	ErrUnsupportedMediaType = &Error{"UNSUPPORTED_MEDIA_TYPE", "request bodies must be sent as application/json"}
	// ErrRateLimited: the router's limit for this route is used up; retry after a
	// second (router.Config.RateLimits).
	ErrRateLimited = &Error{"RATE_LIMITED", "request rate of this route is above its limit, retry later"}
	// ErrUserRateLimited: this act_id sent more requests than its per-user limit
	// allows; retry after a second (router.Config.UserRate).
	ErrUserRateLimited = &Error{"USER_RATE_LIMITED", "this act_id sends requests too often, retry later"}
	// ErrCellRateLimited: the cell's own request-rate limit is used up; retry
	// after a second (cell.Config.RateLimitPerSec).
	ErrCellRateLimited = &Error{"CELL_RATE_LIMITED", "the cell is above its request rate, retry later"}
	// ErrDBUnavailable: the cell's database cannot be reached, or its circuit
	// breaker is open after repeated connection failures or timeouts; retry later.
	ErrDBUnavailable = &Error{"DB_UNAVAILABLE", "database unavailable, retry later"}
	// ErrInternal: anything else; details are logged, not returned.
	ErrInternal = &Error{"INTERNAL", "internal error"}
)

// detailed is a sentinel with a request-specific message.
type detailed struct {
	base *Error
	msg  string
}

func (d *detailed) Error() string { return d.base.Code + ": " + d.msg }
func (d *detailed) Unwrap() error { return d.base }

// Errorf returns an error that matches base under errors.Is and carries a message.
func Errorf(base *Error, format string, args ...any) error {
	return &detailed{base: base, msg: fmt.Sprintf(format, args...)}
}

// Invalidf is Errorf(ErrInvalidArgument, ...).
func Invalidf(format string, args ...any) error { return Errorf(ErrInvalidArgument, format, args...) }

// CodeOf returns the stable code of err and the message to show a client.
// Errors without a code are INTERNAL and their text is not exposed.
func CodeOf(err error) (code, message string) {
	var d *detailed
	if errors.As(err, &d) {
		return d.base.Code, d.msg
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code, e.Message
	}
	return ErrInternal.Code, ErrInternal.Message
}
