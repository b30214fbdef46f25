package storage

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"

	"redcell/model"
)

// Breaker is a circuit breaker in front of a store's connections
// (cell/guard.Breaker is the one cells use; SetBreaker puts it there). The
// store asks it before each round trip to the server and tells it how the
// round trip went, so every call of the store, whatever its method, fails
// fast together while the server is down.
type Breaker interface {
	// Allow asks whether one round trip may go to the server. A non-nil
	// err refuses it. Otherwise the round trip runs at once and done must
	// be called once, as soon as it has ended, with its error; done answers
	// whether the breaker counted that error as an infrastructure failure.
	// The breaker times the round trip itself (from Allow to done, on its
	// clock), for the rules that look at how long it took.
	Allow() (done func(err error) (failure bool), err error)
}

// ErrDBOpen is what a store's round trips answer while its breaker refuses
// them (SetBreaker). It matches model.ErrDBUnavailable under errors.Is: a
// retryable 503.
var ErrDBOpen = model.Errorf(model.ErrDBUnavailable, "the database circuit breaker is open after repeated failures; retry later")

// Guarded runs one round trip f behind b (nil: f alone) by the rules of a
// store with a breaker: refused, f does not run and the answer is ErrDBOpen;
// an error b counts as an infrastructure failure (a refused or broken
// connection, a slow call's deadline, ...) is answered as
// model.ErrDBUnavailable wrapping it, except a deadline, which stays
// context.DeadlineExceeded (a 504 TIMEOUT, not a 503); any other error (the
// server answered: a duplicate key, a deadlock) comes back unchanged.
func Guarded(b Breaker, f func() error) error {
	if b == nil {
		return f()
	}
	done, err := b.Allow()
	if err != nil {
		return ErrDBOpen
	}
	reported := false
	defer func() {
		if !reported { // f panicked: count it, or a half-open breaker would wait for this probe forever
			done(errPanicked)
		}
	}()
	err = f()
	failure := done(err)
	reported = true
	if err == nil || !failure || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, model.ErrDBUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", model.ErrDBUnavailable, err)
}

// errPanicked is what a breaker is told of a round trip that panicked: an
// infrastructure failure (it wraps driver.ErrBadConn, which every judge
// counts), so a panicking probe never closes the breaker.
var errPanicked = fmt.Errorf("storage: a round trip panicked: %w", driver.ErrBadConn)

// gate is where a pool's connections find their breaker: one per pool (a
// store and its Shadow have a pool each, so stress traffic never opens the
// breaker in front of real money).
type gate struct{ b atomic.Pointer[breakerRef] }

type breakerRef struct{ Breaker }

func (g *gate) breaker() Breaker {
	if r := g.b.Load(); r != nil {
		return r.Breaker
	}
	return nil
}

// gateConnector dials through a switchConnector, behind the pool's gate.
type gateConnector struct {
	sw   *switchConnector
	gate *gate
}

func (c *gateConnector) Connect(ctx context.Context) (conn driver.Conn, err error) {
	err = Guarded(c.gate.breaker(), func() (err error) { conn, err = c.sw.connect(ctx, c.gate); return err })
	return conn, err
}

func (c *gateConnector) Driver() driver.Driver { return c.sw.Driver() }

// SetBreaker puts b in front of the store's connections (nil: none): every
// round trip of this store then goes through Guarded with b. COMMIT and
// ROLLBACK (a transaction's, or a lone COMMIT or ROLLBACK statement) are
// never refused (a transaction begun runs to its end), nor counted; nor are
// the rows of a result set read after its query answered. A read that
// settles a COMMIT without an answer is a round trip like any other: while
// the breaker is open it is refused, and the write answers ErrCommitUnknown
// (a retry with its order number settles it). A store and its Shadow have a breaker each. Call it before the
// store is used.
func (m *MySQL) SetBreaker(b Breaker) {
	if b == nil {
		m.gate.b.Store(nil)
		return
	}
	m.gate.b.Store(&breakerRef{b})
}
