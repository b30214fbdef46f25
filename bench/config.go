// Package bench is a smoke load generator: it drives a running redcell cluster
// through its router over HTTP (deposit, send, grab, open), measures latency per
// operation, and checks afterwards that no money was lost or invented.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"redcell/model"
)

// Limits on the workload. Each keeps one run small enough that a smoke bench
// never turns into a denial of service by typo.
const (
	sendersMax  = 1000
	openersMax  = 10_000
	durationMax = time.Hour
	// runIDLenMax keeps "<runid>-snd-<i>-<n>" inside model.MaxIDLen (64): 24 for
	// the run ID, 5 for "-snd-", 4 for i, 1 for '-' and up to 30 for n.
	runIDLenMax = 24
)

// Config describes one bench run. Build it with DefaultConfig and change what
// you need; Run calls Validate.
type Config struct {
	// AllowShed accepts OVERLOADED and TIMEOUT answers as load shedding (they are
	// still counted and shown) instead of failing the run; money checks still apply.
	AllowShed bool
	// RouterURL is the base URL of the router, e.g. "http://127.0.0.1:8080".
	RouterURL string
	// Senders is the number of accounts that send packets, 1..1000. Each runs in
	// its own goroutine and gets one deposit large enough for the whole run.
	Senders int
	// Openers is the number of opener goroutines, 1..10000, each with its own act_id.
	Openers int
	// Duration bounds how long senders and openers run, in (0, 1h]. Requests in
	// flight when it ends finish (each has its own timeout); the audit runs after.
	Duration time.Duration
	// PacketAmount is the total of each packet in cents; at least PacketCount so
	// that every share gets a cent.
	PacketAmount int64
	// PacketCount is the number of shares per packet, >= 1.
	PacketCount int64
	// RunID prefixes every act_id and order number of the run so runs never share
	// accounts: 1..24 characters of [A-Za-z0-9-]. Empty means one derived from the
	// start time of Run (reusing a RunID replays its order numbers, which the
	// cluster answers as repeats).
	RunID string
	// Audit, when set, runs after the load; Run polls it until no credit is in
	// flight (about 15 s at most) and keeps the last report. It must be safe to
	// call more than once.
	Audit func(ctx context.Context) (model.AuditReport, error)
	// Progress, when set, gets a one-line progress indicator rewritten (with
	// '\r') about once a second, and a final newline. Written from one goroutine.
	Progress io.Writer
}

// DefaultConfig is a short smoke run against a local router.
func DefaultConfig() Config {
	return Config{
		RouterURL: "http://127.0.0.1:8080", // the router's default listen address
		Senders:   4,                       // a few senders spread packets over a few shards
		Openers:   32,                      // enough concurrent opens to contend on every packet
		Duration:  10 * time.Second,        // long enough for stable p99s, short enough for CI
		// 10.00 CNY in 10 shares: every share is at least 1 cent with room for the
		// random split to vary.
		PacketAmount: 1000,
		PacketCount:  10,
	}
}

// Validate checks every field and how they relate to each other.
func (c Config) Validate() error {
	u, err := url.Parse(c.RouterURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bench: RouterURL %q must be an http(s) URL with a host", c.RouterURL)
	}
	if c.Senders < 1 || c.Senders > sendersMax {
		return fmt.Errorf("bench: Senders must be 1..%d, got %d", sendersMax, c.Senders)
	}
	if c.Openers < 1 || c.Openers > openersMax {
		return fmt.Errorf("bench: Openers must be 1..%d, got %d", openersMax, c.Openers)
	}
	if c.Duration <= 0 || c.Duration > durationMax {
		return fmt.Errorf("bench: Duration must be in (0, %v], got %v", durationMax, c.Duration)
	}
	limits := model.DefaultLimits()
	if c.PacketCount < 1 || c.PacketCount > limits.MaxCount {
		return fmt.Errorf("bench: PacketCount must be 1..%d, got %d", limits.MaxCount, c.PacketCount)
	}
	// A share is at least one cent, so the total must cover every share.
	if c.PacketAmount < c.PacketCount || c.PacketAmount > int64(limits.MaxAmount) {
		return fmt.Errorf("bench: PacketAmount must be %d..%d cents (>= PacketCount), got %d",
			c.PacketCount, limits.MaxAmount, c.PacketAmount)
	}
	if c.RunID != "" {
		if err := validateRunID(c.RunID); err != nil {
			return err
		}
	}
	return nil
}

func validateRunID(s string) error {
	if len(s) > runIDLenMax {
		return fmt.Errorf("bench: RunID must be at most %d characters, got %d", runIDLenMax, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return errors.New("bench: RunID may hold only letters, digits and '-'")
		}
	}
	return nil
}

// newRunID derives a run ID from t: "b" and the Unix milliseconds in base 36,
// e.g. "bmiks2x0q" (10 characters until the year 5188).
func newRunID(t time.Time) string {
	return "b" + strconv.FormatInt(t.UnixMilli(), 36)
}

// depositCents is what each sender deposits: enough for 100000 packets, capped
// at the largest packet a cell accepts by default (100000.00 CNY), the amount
// most likely to pass a cell's own deposit limit. A sender that spends it all
// stops on INSUFFICIENT_BALANCE, which the report treats as expected.
func (c Config) depositCents() int64 {
	const packets = 100_000
	limit := int64(model.DefaultLimits().MaxAmount)
	if c.PacketAmount > limit/packets {
		return limit
	}
	return c.PacketAmount * packets
}
