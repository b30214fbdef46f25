// Package bench is redcell's load generator: it drives a running cluster
// through its router (or straight to the cells) over HTTP with one of four
// workloads (smoke, hot, festival, cold), closed-loop or open-loop at a target
// rate, measures latency per operation in HDR histograms, and checks afterwards
// that no money was lost or invented. Suites compare the cells' open
// strategies, router against direct, and the ceilings of the stack (limits.go).
// Every request is stress traffic (api.HeaderStress), kept in shadow tables.
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
	// rateMax bounds open-loop arrivals: far above what one loopback machine
	// serves, low enough that a typo cannot ask for billions.
	rateMax = 1_000_000
	// inFlightMax bounds the requests an open-loop run keeps in flight.
	inFlightMax = 100_000
	// usersMax bounds the account pool of festival and cold runs.
	usersMax = 10_000_000
)

// Config describes one bench run. Build it with DefaultConfig and change what
// you need; Run calls Validate.
type Config struct {
	// Seed seeds the workload's random draws (group sizes, who opens, when); 0
	// means one from the clock. Runs with the same seed and config draw the same
	// workload: RunSuite gives every run of a comparison one seed.
	Seed uint64
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
	// Packets is how many packets a roundrobin run opens in turn, 1..packetsRRMax
	// (other workloads: 0).
	Packets int
	// RunID prefixes every act_id and order number of the run so runs never share
	// accounts: 1..24 characters of [A-Za-z0-9-]. Empty means one derived from the
	// start time of Run (reusing a RunID replays its order numbers, which the
	// cluster answers as repeats).
	RunID string
	// Audit, when set, runs after the load; Run polls it until no credit is in
	// flight (about 15 s at most) and keeps the last report. It must be safe to
	// call more than once.
	Audit func(ctx context.Context) (model.AuditReport, error)
	// Work, when set, measures what the load cost per fresh open (a workload's
	// load phase; not smoke): Report.Work. One WorkSources per cluster, shared
	// by its runs (it measures the idle rate once).
	Work *WorkSources
	// Progress, when set, gets a one-line progress bar rewritten (with '\r')
	// about once a second, and a final newline. Written from one goroutine.
	Progress io.Writer

	// Workload is what the load looks like: WorkloadSmoke (also ""), WorkloadHot,
	// WorkloadFestival or WorkloadCold. See workload.go; DefaultWorkloadConfig
	// gives each its defaults.
	Workload string
	// Rate, when > 0, runs open-loop at Rate opens per second: each open starts
	// at its scheduled time whether or not earlier ones finished, and its latency
	// counts from that time. Festival and cold schedule sends so that opens
	// arrive at about Rate per second. 0 runs closed-loop: Openers workers, each
	// starting its next request when the last one ended. Smoke is closed-loop
	// only. At most rateMax.
	Rate int
	// MaxInFlight bounds the opens (and, separately, the sends) in flight in
	// open-loop mode; an open due while the bound is reached is not sent and is
	// counted as CLIENT_DROPPED. 0 means Openers.
	MaxInFlight int
	// Users is the pool of accounts that open packets in festival and cold runs;
	// a group's members are distinct users, so it must hold the largest group.
	Users int
	// Direct sends every request straight to the cell that owns its key (as the
	// router's /healthz lists them) instead of through the router.
	Direct bool
	// Real sends real traffic instead of stress traffic (no api.HeaderStress):
	// real money in the cells' real tables, under the router's per-person
	// limit (user_rate_limit, through memcached with shared_limits), the
	// path a production request takes. For a test cluster only: its rows stay
	// (the bench's accounts, run ID first). Not with Direct (the limit is the
	// router's).
	Real bool
	// ClusterSecret signs every request, as a router signs what it forwards:
	// cells refuse unsigned calls (Direct), and the router takes a request
	// marked as stress traffic, as all bench traffic is, only when it is
	// signed. Required by Direct; without it the router refuses every request
	// (403 PERMISSION_DENIED).
	ClusterSecret string
	// APIKey is the calling app's key the router requires (sent as
	// Authorization: Bearer; not to cells in Direct mode).
	APIKey string
	// RouterPprof is the router's pprof address (host:port): when set, Run
	// profiles the router's CPU during the run (Report.RouterProfile). Not in
	// direct mode, which bypasses the router.
	RouterPprof string
	// Label names the run in the progress line and the reports, e.g. the
	// strategy under test. Optional.
	Label string
	// SettleTimeout, when > 0, bounds the wait for credits after the load of a
	// hot, festival or cold run instead of the default (about 15 s): the rate
	// search's short steps wait less and leave the money to the final audit.
	SettleTimeout time.Duration
}

// DefaultWorkloadConfig returns DefaultConfig with the defaults of workload w
// (which Validate checks).
func DefaultWorkloadConfig(w string) Config {
	c := DefaultConfig()
	c.Workload = w
	switch w {
	case WorkloadHot:
		// A red-packet rain: one packet as large as a cell allows (every share is
		// one cent) and enough openers that the per-packet queue is never empty.
		c.Senders, c.Openers = 1, 256
		c.PacketAmount, c.PacketCount = int64(model.DefaultLimits().MaxAmount), model.DefaultLimits().MaxCount
	case WorkloadFestival:
		// Many groups at once: enough senders that sends never pace the opens,
		// and a pool several times the largest group so groups overlap a little.
		c.Senders, c.Openers, c.Users = 32, 256, 100_000
	case WorkloadRoundRobin:
		// 2,000 packets of 10,000 shares (200 CNY each), opened round robin by
		// 64 connections: the cold-packet measurement of group commit. 16
		// senders' deposits (10,000,000 cents each) cover the 40,000,000.
		c.Senders, c.Openers, c.Packets = 16, 64, 2000
		c.PacketAmount, c.PacketCount = 20_000, 10_000
	case WorkloadCold:
		// Many small packets, two shares of one CNY each: no contention.
		c.Senders, c.Openers, c.Users = 16, 128, 100_000
		c.PacketAmount, c.PacketCount = 200, 2
	}
	return c
}

// inFlight is the open-loop in-flight bound.
func (c Config) inFlight() int {
	if c.MaxInFlight > 0 {
		return c.MaxInFlight
	}
	return c.Openers
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
	if err := c.validateRouter(); err != nil {
		return err
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
	if c.Real && c.Direct {
		return errors.New("bench: Real goes through the router (its per-person limit is what it measures): not with Direct")
	}
	if c.RunID != "" {
		if err := validateRunID(c.RunID); err != nil {
			return err
		}
	}
	return c.validateWorkload()
}

// validateWorkload checks the fields of the newer workloads and modes.
func (c Config) validateWorkload() error {
	if c.Direct && c.ClusterSecret == "" {
		return errDirectUnsigned
	}
	if c.Rate < 0 || c.Rate > rateMax {
		return fmt.Errorf("bench: Rate must be 0..%d opens/s, got %d", rateMax, c.Rate)
	}
	if c.MaxInFlight < 0 || c.MaxInFlight > inFlightMax {
		return fmt.Errorf("bench: MaxInFlight must be 0..%d, got %d", inFlightMax, c.MaxInFlight)
	}
	switch c.Workload {
	case "", WorkloadSmoke:
		if c.Rate > 0 {
			// Smoke openers are accounts that each open a packet once and whose
			// balances are checked one by one: they run closed-loop by design.
			return errors.New("bench: smoke is closed-loop; use Rate with the hot, festival or cold workload")
		}
	case WorkloadHot:
	case WorkloadFestival:
		if c.Users < festivalGroupMax || c.Users > usersMax {
			return fmt.Errorf("bench: festival needs Users %d..%d (a group of up to %d members are distinct users), got %d",
				festivalGroupMax, usersMax, festivalGroupMax, c.Users)
		}
	case WorkloadRoundRobin:
		if c.Packets < 1 || c.Packets > packetsRRMax {
			return fmt.Errorf("bench: roundrobin needs Packets 1..%d, got %d", packetsRRMax, c.Packets)
		}
		if c.Senders < 1 || int64(c.Packets)*c.PacketAmount > int64(c.Senders)*c.depositCents() {
			return fmt.Errorf("bench: roundrobin: %d packets of %d cents need more than %d senders' deposits of %d", c.Packets, c.PacketAmount, c.Senders, c.depositCents())
		}
	case WorkloadCold:
		if c.PacketCount > coldCountMax {
			return fmt.Errorf("bench: cold packets have at most %d shares (few openers each), got %d", coldCountMax, c.PacketCount)
		}
		if int64(c.Users) < c.PacketCount || c.Users > usersMax {
			return fmt.Errorf("bench: cold needs Users %d..%d, got %d", c.PacketCount, usersMax, c.Users)
		}
	default:
		return fmt.Errorf("bench: unknown Workload %q (smoke, hot, festival, cold, roundrobin)", c.Workload)
	}
	return nil
}

// errDirectUnsigned: a direct run without the secret would be refused by
// every cell.
var errDirectUnsigned = errors.New("bench: sending straight to the cells needs the cluster secret (cluster_secret of --config, or REDCELL_CLUSTER_SECRET): cells refuse unsigned calls")

func (c Config) validateRouter() error {
	u, err := url.Parse(c.RouterURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bench: RouterURL %q must be an http(s) URL with a host", c.RouterURL)
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
