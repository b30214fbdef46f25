package guard_test

import (
	"bytes"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"redcell/api"
	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// errRefused is what dialing a closed port returns.
var errRefused = fmt.Errorf("storage: read account: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})

// fakeDB stands for a database's round trips: each answers whatever next
// says, and calls counts those that reached it.
type fakeDB struct {
	calls atomic.Int64
	next  func(ctx context.Context) error
}

// trip makes one round trip behind b, as a store with b in front of its
// connections does (storage.MySQL.SetBreaker).
func (f *fakeDB) trip(ctx context.Context, b *guard.Breaker) error {
	return storage.Guarded(b, func() error { f.calls.Add(1); return f.next(ctx) })
}

func newBreaker(t *testing.T, reg prometheus.Registerer) *guard.Breaker {
	t.Helper()
	b, err := guard.NewBreaker("db", guard.DefaultConfig(), reg, quiet) // 5 failures, 2 s cooldown, 1 s slow call
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBusinessErrorsNeverTrip: answers that prove the database is up pass
// through unchanged and leave the breaker closed, however many.
func TestBusinessErrorsNeverTrip(t *testing.T) {
	b := newBreaker(t, nil)
	business := []error{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, &mysql.MySQLError{Number: 1213, Message: "Deadlock found"},
		&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}, model.ErrSoldOut, errors.New("storage: some bug")}
	var want error
	f := &fakeDB{next: func(context.Context) error { return want }}
	for i := range 100 {
		want = business[i%len(business)]
		if err := f.trip(context.Background(), b); err != want {
			t.Fatalf("business error %v came back as %v", want, err)
		}
	}
	if b.State() != guard.StateClosed || f.calls.Load() != 100 {
		t.Fatalf("after 100 business errors: state %d, %d round trips reached the server", b.State(), f.calls.Load())
	}
}

// TestBreakerOpensAndRecovers: five infrastructure failures in a row (a success
// in between starts the count again) open the breaker; open, it answers
// DB_UNAVAILABLE (503, retryable) without a round trip; after the
// cooldown one probe goes through while other calls are still refused; the
// probe's success closes it, a failed probe opens it again.
func TestBreakerOpensAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		b := newBreaker(t, reg)
		var fail atomic.Bool
		var gate chan struct{} // when set, the store waits on it
		f := &fakeDB{next: func(context.Context) error {
			if gate != nil {
				<-gate
			}
			if fail.Load() {
				return errRefused
			}
			return nil
		}}
		ctx := context.Background()
		account := func() error { return f.trip(ctx, b) }

		fail.Store(true)
		for range 4 {
			err := account()
			if !errors.Is(err, model.ErrDBUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("a refused connection: %v, want DB_UNAVAILABLE wrapping ECONNREFUSED", err)
			}
		}
		fail.Store(false)
		if err := account(); err != nil {
			t.Fatal(err)
		}
		fail.Store(true)
		for range 4 {
			_ = account()
		}
		if b.State() != guard.StateClosed {
			t.Fatal("4 failures after a success opened the breaker")
		}
		_ = account() // the fifth in a row
		if b.State() != guard.StateOpen {
			t.Fatalf("state %d after 5 failures in a row, want open", b.State())
		}
		calls := f.calls.Load()
		for range 10 {
			err := account()
			if err != storage.ErrDBOpen || !errors.Is(err, model.ErrDBUnavailable) {
				t.Fatalf("open breaker answered %v", err)
			}
			if status, body := api.ErrorJSON(err); status != 503 || string(api.ErrorCode(body)) != "DB_UNAVAILABLE" {
				t.Fatalf("open breaker's answer: %d %s", status, body)
			}
		}
		if f.calls.Load() != calls {
			t.Fatalf("%d round trips reached the server while the breaker was open", f.calls.Load()-calls)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP redcell_breaker_rejected_total Calls a circuit breaker refused without trying (DB_UNAVAILABLE, or memcached's in-process fallback).
# TYPE redcell_breaker_rejected_total counter
redcell_breaker_rejected_total{breaker="db"} 10
# HELP redcell_breaker_state Circuit breaker state: 0 closed, 1 half-open, 2 open.
# TYPE redcell_breaker_state gauge
redcell_breaker_state{breaker="db"} 2
# HELP redcell_breaker_failures_total Infrastructure failures a circuit breaker counted.
# TYPE redcell_breaker_failures_total counter
redcell_breaker_failures_total{breaker="db"} 9
`), "redcell_breaker_rejected_total", "redcell_breaker_state", "redcell_breaker_failures_total"); err != nil {
			t.Fatal(err)
		}

		// Cooldown over: half-open. A failed probe opens it again at once.
		testenv.Advance(2*time.Second + time.Millisecond)
		if b.State() != guard.StateHalfOpen {
			t.Fatalf("state %d after the cooldown, want half-open", b.State())
		}
		if err := account(); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("failed probe: %v", err)
		}
		if b.State() != guard.StateOpen || f.calls.Load() != calls+1 {
			t.Fatalf("after a failed probe: state %d, %d new calls", b.State(), f.calls.Load()-calls)
		}

		// Next cooldown: the probe succeeds slowly; calls meanwhile are refused.
		testenv.Advance(2*time.Second + time.Millisecond)
		fail.Store(false)
		gate = make(chan struct{})
		probe := make(chan error)
		go func() { probe <- account() }()
		synctest.Wait() // the probe is in its round trip, waiting on gate
		if err := account(); err != storage.ErrDBOpen {
			t.Fatalf("a call during the probe: %v, want ErrDBOpen", err)
		}
		close(gate)
		if err := <-probe; err != nil {
			t.Fatalf("probe: %v", err)
		}
		gate = nil
		if b.State() != guard.StateClosed {
			t.Fatalf("state %d after a good probe, want closed", b.State())
		}
		before := f.calls.Load()
		for range 3 {
			if err := account(); err != nil {
				t.Fatal(err)
			}
		}
		if f.calls.Load() != before+3 {
			t.Fatal("round trips after recovery did not reach the server")
		}
	})
}

// TestBreakerLogsAnOutageOnce: a database down for a minute makes the
// breaker open, and then open again after each failed probe (30 cooldowns);
// the log says when it opened, at most once per 10 s that it is still open,
// and when it closed, not every change of state.
func TestBreakerLogsAnOutageOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		b, err := guard.NewBreaker("db", guard.DefaultConfig(), nil, slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var fail atomic.Bool
		fail.Store(true)
		f := &fakeDB{next: func(context.Context) error {
			if fail.Load() {
				return errRefused
			}
			return nil
		}}
		for range 600 { // a round trip every 100 ms for a minute
			_ = f.trip(context.Background(), b)
			testenv.Advance(100 * time.Millisecond)
		}
		fail.Store(false)
		for i := 0; b.State() != guard.StateClosed; i++ {
			if i == 100 { // 10 s: five cooldowns
				t.Fatalf("the breaker did not close 10 s after the database came back: state %d", b.State())
			}
			_ = f.trip(context.Background(), b)
			testenv.Advance(100 * time.Millisecond)
		}
		out := buf.String()
		opened, still, closed := strings.Count(out, `msg="circuit breaker opened"`), strings.Count(out, `msg="circuit breaker still open"`),
			strings.Count(out, `msg="circuit breaker closed"`)
		if opened != 1 || still < 4 || still > 6 || closed != 1 || strings.Count(out, "\n") != opened+still+closed {
			t.Fatalf("a minute's outage logged %d opened, %d still open, %d closed lines:\n%s", opened, still, closed, out)
		}
		if !strings.Contains(out, "breaker=db") || !strings.Contains(out, `err="5 infrastructure failures in a row"`) {
			t.Fatalf("the opening line does not say which breaker or why:\n%s", out)
		}
	})
}

// TestWhichErrorsCount: context errors and the driver's own failures.
func TestWhichErrorsCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cases := []struct {
			name  string
			err   error
			delay time.Duration
			trips bool
		}{
			{"deadline after a slow call", context.DeadlineExceeded, 1500 * time.Millisecond, true},
			{"deadline at once (little time was left)", context.DeadlineExceeded, 10 * time.Millisecond, false},
			{"caller cancelled", fmt.Errorf("storage: x: %w", context.Canceled), 3 * time.Second, false},
			{"bad pooled connection", driver.ErrBadConn, 0, true},
			{"connection broke mid-call", fmt.Errorf("storage: open: %w", mysql.ErrInvalidConn), 0, true},
			{"too many connections", &mysql.MySQLError{Number: 1040, Message: "Too many connections"}, 0, true},
			{"duplicate key", &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, 0, false},
			{"deadlock", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, 0, false},
		}
		for _, c := range cases {
			b := newBreaker(t, nil)
			f := &fakeDB{next: func(context.Context) error { testenv.Advance(c.delay); return c.err }} // the call takes c.delay
			for range 20 {
				err := f.trip(context.Background(), b)
				if !errors.Is(err, c.err) && err != storage.ErrDBOpen {
					t.Fatalf("%s: the error %v was lost: %v", c.name, c.err, err)
				}
				if errors.Is(err, context.DeadlineExceeded) && errors.Is(err, model.ErrDBUnavailable) {
					t.Fatalf("%s: a deadline must stay a TIMEOUT, not DB_UNAVAILABLE", c.name)
				}
			}
			if open := b.State() == guard.StateOpen; open != c.trips {
				t.Errorf("%s: breaker open = %v after 20 calls, want %v", c.name, open, c.trips)
			}
		}
	})
}

// TestSlowCallOnItsClock: the slow-call rule times a round trip on
// Config.Clock: a deadline 1.5 s after the start on that clock counts (five
// open the breaker), one with no time passed on it does not.
func TestSlowCallOnItsClock(t *testing.T) {
	for _, c := range []struct {
		name  string
		delay time.Duration
		trips bool
	}{
		{"1.5 s on the breaker's clock", 1500 * time.Millisecond, true},
		{"no time on the breaker's clock", 0, false},
	} {
		m := clock.NewManual(time.Unix(1_700_000_000, 0))
		cfg := guard.DefaultConfig()
		cfg.Clock = m
		b, err := guard.NewBreaker("db", cfg, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeDB{next: func(context.Context) error { m.Advance(c.delay); return context.DeadlineExceeded }}
		for range 5 {
			_ = f.trip(context.Background(), b)
		}
		if open := b.State() == guard.StateOpen; open != c.trips {
			t.Errorf("%s: breaker open = %v after 5 deadlines, want %v", c.name, open, c.trips)
		}
	}
}

// TestRealDriverTrips: a store on a port nobody listens on, with the
// breaker in front of its connections, fails with the driver's real error
// (as DB_UNAVAILABLE), which counts; five later the breaker answers alone,
// for every method of the store, and the store's Shadow (a breaker of its
// own, still closed) still dials.
func TestRealDriverTrips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // now nothing listens there: connection refused
	dead, err := storage.Open("root@tcp("+addr+")/", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	b, sb := newBreaker(t, nil), newBreaker(t, nil)
	dead.SetBreaker(b)
	dead.Shadow().SetBreaker(sb)
	// Every round trip counts (a call may make several): the breaker opens
	// within five calls, each of which dialed and was refused.
	for i := 0; b.State() != guard.StateOpen; i++ {
		if i == 5 {
			t.Fatal("five calls to a dead server left the breaker closed")
		}
		_, err := storage.Account(context.Background(), dead, 1, "a")
		// The call whose round trips opened the breaker may end refused.
		if !errors.Is(err, model.ErrDBUnavailable) || i == 0 && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("call %d to a dead server: %v, want the driver's error as DB_UNAVAILABLE", i, err)
		}
	}
	start := time.Now()
	if _, err := storage.Account(context.Background(), dead, 1, "a"); !errors.Is(err, storage.ErrDBOpen) {
		t.Fatalf("sixth call: %v, want ErrDBOpen", err)
	}
	if err := dead.Ping(context.Background()); !errors.Is(err, storage.ErrDBOpen) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("ping while open: %v after %s", err, time.Since(start))
	}
	if err := dead.EnsureDays(context.Background(), []model.ShardID{1}, []int{1}, 1, nil); !errors.Is(err, storage.ErrDBOpen) {
		t.Fatalf("warm-up while open: %v", err)
	}
	if _, _, err := storage.ClaimsAfter(context.Background(), dead, 0, 0, model.ClaimPos{}, time.Now().UnixMilli(), 10); !errors.Is(err, storage.ErrDBOpen) {
		t.Fatalf("relay's claims read while open: %v", err)
	}
	if _, err := storage.Account(context.Background(), dead.Shadow(), 1, "a"); !errors.Is(err, syscall.ECONNREFUSED) || sb.State() != guard.StateClosed {
		t.Fatalf("the shadow store behind its own breaker: %v, state %d", err, sb.State())
	}
}

// fakeMemcache answers every call with err and counts the calls.
type fakeMemcache struct {
	calls atomic.Int64
	err   atomic.Pointer[error]
}

func (f *fakeMemcache) result() error { f.calls.Add(1); return *f.err.Load() }
func (f *fakeMemcache) Get(string) (*memcache.Item, error) {
	if err := f.result(); err != nil {
		return nil, err
	}
	return &memcache.Item{Value: []byte("0:0")}, nil
}
func (f *fakeMemcache) Add(*memcache.Item) error            { return f.result() }
func (f *fakeMemcache) Set(*memcache.Item) error            { return f.result() }
func (f *fakeMemcache) CompareAndSwap(*memcache.Item) error { return f.result() }
func (f *fakeMemcache) Close() error                        { return nil }
func (f *fakeMemcache) Increment(string, uint64) (uint64, error) {
	return 0, f.result()
}

// TestMemcacheBreaker: misses and CAS conflicts never trip it; a memcached that
// times out does, after which the transaction slots use their in-process
// fallback without waiting on memcached at all.
func TestMemcacheBreaker(t *testing.T) {
	b, err := guard.NewBreaker("memcached", guard.DefaultConfig(), nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMemcache{}
	mc := guard.NewMemcache(f, b)
	for _, e := range []error{memcache.ErrCacheMiss, memcache.ErrCASConflict, memcache.ErrNotStored} {
		f.err.Store(&e)
		for range 10 {
			if _, err := mc.Get("k"); err != e {
				t.Fatalf("Get: %v, want %v", err, e)
			}
		}
	}
	if b.State() != guard.StateClosed {
		t.Fatal("memcached's ordinary answers opened the breaker")
	}
	timeout := error(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ETIMEDOUT})
	f.err.Store(&timeout)
	slots := admission.NewSlots(mc, 1, quiet)
	for i := range 5 { // each Acquire: one failed Get, then the in-process fallback (whose release skips memcached)
		release, err := slots.Acquire(context.Background(), fmt.Sprintf("p%d", i))
		if err != nil {
			t.Fatalf("Acquire with memcached failing: %v", err)
		}
		release()
	}
	if b.State() != guard.StateOpen {
		t.Fatalf("state %d after memcached failed 5 acquires, want open", b.State())
	}
	calls := f.calls.Load()
	for i := range 100 {
		release, err := slots.Acquire(context.Background(), fmt.Sprintf("q%d", i))
		if err != nil {
			t.Fatalf("Acquire with the breaker open: %v", err)
		}
		release()
	}
	if f.calls.Load() != calls {
		t.Fatalf("%d memcached calls while its breaker was open", f.calls.Load()-calls)
	}
	if _, fallbacks := slots.Stats(); fallbacks != 105 {
		t.Fatalf("%d fallbacks counted, want 105", fallbacks)
	}
}

// BenchmarkRoundTripGuard is what the breaker adds to each round trip of a
// store (storage.Guarded with a closed guard.Breaker), against the round
// trip alone: run both to compare (the round trip here does nothing; a
// real one to MariaDB takes tens of µs or more).
func BenchmarkRoundTripGuard(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		for range b.N {
			if err := storage.Guarded(nil, func() error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("breaker", func(b *testing.B) {
		br, err := guard.NewBreaker("db", guard.DefaultConfig(), nil, quiet)
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			if err := storage.Guarded(br, func() error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
