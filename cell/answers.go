package cell

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/incident"
	"redcell/model"
)

// answers writes the cell's answers: JSON bodies, and error answers through
// api.WriteError, which puts the code in api.HeaderCode for the metrics.
// Every answer names the cell (api.HeaderCell).
type answers struct {
	cell    string
	log     *slog.Logger
	failing *incident.Tracker // requests answered 5xx other than shedding and DB_UNAVAILABLE
}

// json answers status with v as its JSON body.
func (a answers) json(rc *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		a.err(rc, fmt.Errorf("cell: encode answer: %w", err))
		return
	}
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(api.HeaderCell, a.cell)
	rc.SetBody(b)
}

// JSON is json, for the parts that answer their own routes
// (budgets.Answers).
func (a answers) JSON(rc *fasthttp.RequestCtx, status int, v any) { a.json(rc, status, v) }

// Error is err, for the parts that answer their own routes
// (budgets.Answers).
func (a answers) Error(rc *fasthttp.RequestCtx, err error) { a.err(rc, err) }

// err answers err. A 5xx other than shedding and DB_UNAVAILABLE is a request
// failure (a.failing); serveRoute tells it of every other answer.
func (a answers) err(rc *fasthttp.RequestCtx, err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		err = model.ErrTimeout
	}
	switch {
	case errors.Is(err, model.ErrIdentityDisabled), errors.Is(err, model.ErrDegraded):
		// A feature the cluster's config leaves off (501), not a failure of
		// the cell: no incident, no log line per request.
	case errors.Is(err, model.ErrOverloaded), errors.Is(err, model.ErrTimeout), errors.Is(err, model.ErrShuttingDown),
		errors.Is(err, model.ErrDBUnavailable):
		// Load shedding is the system working as designed; it is counted, and a
		// log line per shed request would itself add load when it matters most.
		// DB_UNAVAILABLE too: the breaker logs its state changes and counts the
		// failures (redcell_breaker_*), so an outage is not one line per request.
		a.log.Debug("request shed", "path", string(rc.Path()), "err", err)
	default:
		if code, _ := model.CodeOf(err); api.Status(code) >= 500 {
			a.failing.Fail(err, "path", string(rc.Path()))
		}
	}
	api.WriteError(rc, err)
	rc.Response.Header.Set(api.HeaderCell, a.cell)
}
