// Package guard puts circuit breakers between a cell and its infrastructure:
// a Breaker sits in front of a database's connections (Allow, for
// storage.MySQL.SetBreaker: every round trip of the store, whatever its
// method, asks it), and Memcache wraps a memcached client (transaction slots
// and grab cache).
//
// A Breaker counts only infrastructure failures: refused or broken
// connections, network timeouts, and calls that ran out of their deadline
// after at least Config.SlowCall. Business answers (model.ErrSoldOut,
// ErrOrderConflict, ErrInsufficientBalance, a cache miss, ...) prove the server
// is up and count as successes; a caller's cancellation counts as nothing.
// After Config.Failures consecutive failures the breaker opens: for
// Config.Cooldown every call is refused at once instead of waiting on a dead
// server (the store answers storage.ErrDBOpen, a model.ErrDBUnavailable;
// memcached calls fail with ErrOpen, so admission falls back to its
// in-process count and the grab cache reads as a miss). Then it is half-open: one probe call goes through, and
// its success closes the breaker, its failure opens it again.
package guard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"redcell/internal/clock"
	"redcell/internal/incident"
)

// Config tunes a Breaker. Start from DefaultConfig. The YAML keys are a
// cell config file's (cell.GuardConfig).
type Config struct {
	// Failures is how many infrastructure failures in a row open the breaker.
	Failures int `yaml:"breaker_failures"`
	// Cooldown is how long an open breaker refuses every call before it lets one
	// probe through.
	Cooldown time.Duration `yaml:"breaker_cooldown"`
	// SlowCall: a call that ended with context.DeadlineExceeded counts as a
	// failure only if it ran at least this long (the server was slow); a call
	// that started with little of its deadline left says nothing about the server.
	SlowCall time.Duration `yaml:"-"`
	// Clock times each call for SlowCall (nil: the system clock). Give it
	// the clock the calls' context deadlines run on: the system clock in a
	// process (a testing/synctest bubble fakes that one too). gobreaker keeps
	// the Cooldown on the system clock whatever this is.
	Clock clock.Clock `yaml:"-"`
}

// DefaultConfig returns the defaults, with reasons.
func DefaultConfig() Config {
	return Config{
		Failures: 5,               // one broken pooled connection is not an outage; five in a row with no success between is
		Cooldown: 2 * time.Second, // short: a restarted server is used again within seconds
		SlowCall: time.Second,     // the slowest healthy open batch commits in well under a second
	}
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Failures < 1 || c.Cooldown <= 0 || c.SlowCall <= 0 {
		return fmt.Errorf("guard: Failures must be >= 1 and Cooldown, SlowCall > 0: %+v", c)
	}
	return nil
}

// State is a breaker's state; its value is what redcell_breaker_state shows.
type State int

// Breaker states.
const (
	StateClosed   State = 0 // calls go through
	StateHalfOpen State = 1 // one probe goes through, the rest are refused
	StateOpen     State = 2 // every call is refused
)

// Breaker is one circuit breaker; Store and Memcache consult it around each
// call. Safe for concurrent use.
type Breaker struct {
	name  string
	cfg   Config
	clock clock.Clock
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]

	rejected atomic.Int64 // calls refused while open or half-open
	failures atomic.Int64 // infrastructure failures counted
}

// The outcomes a Breaker is told about (through gobreaker's done callback).
var (
	errFailure  = errors.New("guard: infrastructure failure")
	errExcluded = errors.New("guard: not counted")
)

// errProbeFailed is what the log says when a half-open breaker opens again.
var errProbeFailed = errors.New("the half-open probe failed")

// NewBreaker returns a closed breaker called name ("db", "memcached"). Its
// metrics (state, refusals, failures; label breaker=name) are registered with
// reg unless reg is nil. Its state changes are logged as one incident
// (internal/incident): WARN "circuit breaker opened" when it first opens, at
// most one WARN "circuit breaker still open" per incident.DefaultEvery while
// its probes fail (one each cooldown), INFO "circuit breaker closed" when a
// probe succeeds; every change at DEBUG.
func NewBreaker(name string, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Breaker{name: name, cfg: cfg, clock: clock.Or(cfg.Clock)}
	open := incident.NewLines(log.With("breaker", name), incident.Lines{Start: "circuit breaker opened",
		Still: "circuit breaker still open", End: "circuit breaker closed"}, incident.DefaultEvery)
	tripped := fmt.Errorf("%d infrastructure failures in a row", cfg.Failures)
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  1, // one probe when half-open; its success closes the breaker
		Timeout:      cfg.Cooldown,
		ReadyToTrip:  func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(cfg.Failures) },
		IsSuccessful: func(err error) bool { return err == nil },
		IsExcluded:   func(err error) bool { return err == errExcluded },
		OnStateChange: func(name string, from, to gobreaker.State) {
			log.Debug("circuit breaker changed state", "breaker", name, "from", from.String(), "to", to.String())
			switch {
			case to == gobreaker.StateOpen && from == gobreaker.StateClosed:
				open.Fail(tripped, "cooldown", cfg.Cooldown.String())
			case to == gobreaker.StateOpen:
				open.Fail(errProbeFailed, "cooldown", cfg.Cooldown.String())
			case to == gobreaker.StateClosed:
				open.OK()
			}
		},
	})
	if reg != nil {
		labels := prometheus.Labels{"breaker": name}
		err := errors.Join(
			reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redcell_breaker_state", ConstLabels: labels,
				Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open."}, func() float64 { return float64(b.State()) })),
			reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_breaker_rejected_total", ConstLabels: labels,
				Help: "Calls a circuit breaker refused without trying (DB_UNAVAILABLE, or memcached's in-process fallback)."},
				func() float64 { return float64(b.rejected.Load()) })),
			reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redcell_breaker_failures_total", ConstLabels: labels,
				Help: "Infrastructure failures a circuit breaker counted."}, func() float64 { return float64(b.failures.Load()) })),
		)
		if err != nil {
			return nil, fmt.Errorf("guard: metrics of breaker %s: %w", name, err)
		}
	}
	return b, nil
}

// Name returns the breaker's name.
func (b *Breaker) Name() string { return b.name }

// State returns the breaker's state now (an open breaker whose cooldown has
// passed reads as half-open).
func (b *Breaker) State() State {
	switch b.cb.State() {
	case gobreaker.StateOpen:
		return StateOpen
	case gobreaker.StateHalfOpen:
		return StateHalfOpen
	}
	return StateClosed
}

// do runs f if the breaker lets it and tells the breaker what f's error means
// (judge). refused is true when f did not run.
func (b *Breaker) do(f func() error, judge func(err error) error) (err error, refused bool) {
	report, aerr := b.allow()
	if aerr != nil {
		return aerr, true
	}
	reported := false
	defer func() {
		if !reported { // f panicked: count it, or a half-open breaker would wait for this probe forever
			report(errFailure, nil)
		}
	}()
	err = f()
	reported = true
	report(err, func(err error) bool { return judge(err) == errFailure })
	return err, false
}

// allow asks the breaker for one call, which it times on its clock from now
// on. When the call may go, report must be called once, as soon as it has
// ended, with its error and isFailure, which says whether an error other
// than a context error is an infrastructure failure (nil: err counts as
// one); report answers whether the breaker counted a failure.
func (b *Breaker) allow() (report func(err error, isFailure func(error) bool) bool, err error) {
	done, err := b.cb.Allow()
	if err != nil {
		b.rejected.Add(1)
		return nil, err
	}
	start := b.clock.Now()
	return func(err error, isFailure func(error) bool) bool {
		took := b.clock.Now().Sub(start)
		verdict, ok := b.judgeContext(err, took)
		switch {
		case ok:
		case err == nil:
			verdict = nil
		case isFailure == nil || isFailure(err):
			verdict = errFailure
		}
		if verdict == errFailure {
			b.failures.Add(1)
		}
		done(verdict)
		return verdict == errFailure
	}, nil
}

// Infrastructure reports whether err says the server could not be reached or
// the connection broke: driver.ErrBadConn, sql.ErrConnDone, an unexpected EOF,
// a refused, reset or broken connection, or any net.Error (dial failures,
// network timeouts). It does not judge context errors (context.DeadlineExceeded
// is a net.Error too): the breakers look at those first.
func Infrastructure(err error) bool {
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// judgeContext sorts out the context errors: a cancellation counts as nothing;
// a deadline counts as a failure only after SlowCall. ok is false for other errors.
func (b *Breaker) judgeContext(err error, took time.Duration) (verdict error, ok bool) {
	switch {
	case errors.Is(err, context.Canceled):
		return errExcluded, true
	case errors.Is(err, context.DeadlineExceeded):
		if took >= b.cfg.SlowCall {
			return errFailure, true
		}
		return errExcluded, true
	}
	return nil, false
}
