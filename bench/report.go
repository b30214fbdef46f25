package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"redcell/model"
)

// Report is the outcome of one run. Money is in integer cents; only rates and
// latencies are floats.
type Report struct {
	// The config that ran.
	RunID        string `json:"run_id"`
	Label        string `json:"label,omitempty"`    // e.g. the strategy under test
	Strategy     string `json:"strategy,omitempty"` // the cells' open strategy, when the bench set it
	Cluster      string `json:"cluster,omitempty"`  // the baseline cluster's name (SuiteConfig.Baseline); empty: the main cluster
	Workload     string `json:"workload"`
	Mode         string `json:"mode"`         // "closed" or "open" (open-loop at Rate)
	Rate         int    `json:"rate_per_sec"` // open-loop target, opens/s; 0 closed-loop
	MaxInFlight  int    `json:"max_in_flight,omitempty"`
	Direct       bool   `json:"direct"`         // sent to the cells, not through the router
	Real         bool   `json:"real,omitempty"` // real traffic (Config.Real), not stress
	Cells        int    `json:"cells"`          // cells the router listed at the start; 0 unknown
	RouterURL    string `json:"router_url"`
	Senders      int    `json:"senders"`
	Openers      int    `json:"openers"`
	Users        int    `json:"users,omitempty"` // festival, cold: the pool of openers
	DurationMS   int64  `json:"duration_ms"`
	PacketAmount int64  `json:"packet_amount_cents"`
	PacketCount  int64  `json:"packet_count"`
	Packets      int    `json:"packets,omitempty"` // roundrobin: the packets opened in turn

	// ElapsedMS is the load phase as measured; rates are over it. Smoke: from
	// the first request (its deposits) until the last sender and opener
	// returned. The others: after SetupMS of deposits (and, hot, the send of the
	// packet) until the last open returned. The audit is never included.
	ElapsedMS int64 `json:"elapsed_ms"`
	SetupMS   int64 `json:"setup_ms,omitempty"`
	// Timeline is the opens of the load phase in one-second buckets by
	// completion time: successes, failures (drops included) and p99.
	Timeline []Bucket `json:"timeline,omitempty"`

	// HotPacketID is the packet of a hot run; SoldOutAtMS, when not 0, is when
	// (into the load phase) it sold out, which ended the load early.
	HotPacketID string `json:"hot_packet_id,omitempty"`
	SoldOutAtMS int64  `json:"sold_out_at_ms,omitempty"`
	// Due, open-loop, is how many arrivals of the schedule fell due during
	// the load: opens (hot) or sends (festival, cold); Started how many of
	// them the client started, on time or late, neither retries nor drops
	// counted. Started < Due: the client was behind when the load ended.
	Due     int64 `json:"due,omitempty"`
	Started int64 `json:"started,omitempty"`
	// OpensPending are festival and cold opens not yet due when the load ended:
	// never sent, not counted anywhere else.
	OpensPending int64 `json:"opens_pending,omitempty"`
	// UnresolvedOpens are opens whose outcome stayed unknown because more than
	// uncertainMax were: claims may be missing from ClaimedCents (not from the
	// audit).
	UnresolvedOpens int64 `json:"unresolved_opens,omitempty"`
	// RouterProfile is the router's CPU during the run (Config.RouterPprof).
	RouterProfile *CPUProfile `json:"router_profile,omitempty"`
	// OverClaimedPackets counts packets whose answered claims went above their
	// amount or share count: the cluster gave away money it did not have.
	OverClaimedPackets int64 `json:"over_claimed_packets,omitempty"`

	Deposit OpStats `json:"deposit"`
	Send    OpStats `json:"send"`
	Grab    OpStats `json:"grab"`
	Open    OpStats `json:"open"`
	// OpenHot and OpenCold split festival opens by packet: packets of groups of
	// 200 or more members, and the rest (nil for other workloads).
	OpenHot  *OpStats `json:"open_hot_packets,omitempty"`
	OpenCold *OpStats `json:"open_cold_packets,omitempty"`

	OpensPerSec float64 `json:"opens_per_sec"` // successful opens per second of ElapsedMS
	SendsPerSec float64 `json:"sends_per_sec"` // successful sends per second of ElapsedMS

	DepositedCents int64 `json:"deposited_cents"` // sum of the senders' deposits
	SentCents      int64 `json:"sent_cents"`      // sum of the packets sent
	ClaimedCents   int64 `json:"claimed_cents"`   // sum of the successful opens
	// ResolvedOpens counts opens whose answer was lost (a timeout) that turned
	// out, when asked again after the load, to have committed.
	ResolvedOpens int64 `json:"resolved_opens"`
	// AllowShed: load-shedding answers (runShedCode: OVERLOADED, TIMEOUT, the
	// RATE_LIMITED codes, MOVING, DB_UNAVAILABLE, client timeouts and drops)
	// were accepted, counted in Shed.
	AllowShed bool `json:"allow_shed"`

	// BalancesChecked is true when the claimants' balances were read after the
	// load: BalanceSample accounts (smoke: every opener; the others: a sample of
	// at most balanceSampleMax). OpenerBalancesCents is their sum and
	// BalanceMismatches counts those whose balance differs from what they
	// claimed. Claimants only receive, so each balance must equal the account's
	// claims once credits are delivered. BalanceError is why the last reading
	// failed.
	BalancesChecked     bool   `json:"balances_checked"`
	BalanceSample       int    `json:"balance_sample"`
	OpenerBalancesCents int64  `json:"opener_balances_cents"`
	BalanceMismatches   int    `json:"balance_mismatches"`
	BalanceError        string `json:"balance_error,omitempty"`
	// BalancesShort of the mismatches are accounts whose balance is below their
	// claims, by BalancesShortCents in all: credits still on their way when the
	// wait ended. They fail the run unless the audit balanced and counts at
	// least that much in flight (see CreditsPending).
	BalancesShort      int   `json:"balances_short,omitempty"`
	BalancesShortCents int64 `json:"balances_short_cents,omitempty"`

	// Audit is the last audit report when Config.Audit was set and answered;
	// AuditError is its last error (or why it did not run).
	Audit      *model.AuditReport `json:"audit,omitempty"`
	AuditError string             `json:"audit_error,omitempty"`

	// CellMetrics is what the cells' own metrics say about the run: commits,
	// batch size, credit lag (see CellMetrics); nil when the suite had no
	// cells to scrape.
	CellMetrics *CellMetrics `json:"cell_metrics,omitempty"`

	// Work is what the run cost per fresh operation: statements, round
	// trips, memcached commands, CPU by process (see Work); nil when the
	// run had no Config.Work.
	Work *Work `json:"work,omitempty"`
}

// OpStats counts the requests of one operation. Count is every HTTP request
// made, retries included, plus the open-loop requests dropped at the in-flight
// bound (code CLIENT_DROPPED); OK are 2xx answers (Repeats of them said
// repeat=true); Errors counts the others by code. Latency covers the requests
// made: from the scheduled start in open-loop mode, else from the send.
type OpStats struct {
	Count     int64            `json:"count"`
	OK        int64            `json:"ok"`
	Repeats   int64            `json:"repeats"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	LatencyMS LatencyMS        `json:"latency_ms"`
}

// LatencyMS are latency percentiles in milliseconds, from an HDR histogram with
// microsecond resolution.
type LatencyMS struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// expectedCodes are the error codes a healthy run produces: packets run out of
// shares or expire, and a sender may spend its whole deposit. Every other code
// means something is wrong.
var expectedCodes = map[op]map[string]bool{
	opDeposit: {model.ErrSoldOut.Code: true, model.ErrExpired.Code: true},
	opSend:    {model.ErrSoldOut.Code: true, model.ErrExpired.Code: true, model.ErrInsufficientBalance.Code: true},
	opGrab:    {model.ErrSoldOut.Code: true, model.ErrExpired.Code: true},
	opOpen:    {model.ErrSoldOut.Code: true, model.ErrExpired.Code: true},
}

func (r Report) op(o op) OpStats {
	switch o {
	case opDeposit:
		return r.Deposit
	case opSend:
		return r.Send
	case opGrab:
		return r.Grab
	default:
		return r.Open
	}
}

// OK reports whether the run passed: see Problems.
func (r Report) OK() bool { return len(r.Problems()) == 0 }

// Problems lists why the run failed, empty when it passed: an unexpected error
// code (anything but SOLD_OUT and EXPIRED, and INSUFFICIENT_BALANCE on send;
// the shedding answers of runShedCode only with AllowShed, which counts them
// in Shed instead),
// nothing sent or opened, more claimed than sent, a packet claimed beyond its
// amount or count, a claimant's balance that differs from its claims or could
// not be read, or an audit that failed or found money missing. A run with any
// money difference fails whatever its speed.
func (r Report) Problems() []string {
	var ps []string
	for o := op(0); o < opCount; o++ {
		for _, code := range sortedCodes(r.op(o).Errors) {
			if !expectedCodes[o][code] && !(r.AllowShed && runShedCode(code)) {
				ps = append(ps, fmt.Sprintf("%s: %d unexpected %s", o, r.op(o).Errors[code], code))
			}
		}
	}
	if r.Send.OK == 0 {
		ps = append(ps, "no packet was sent")
	}
	if r.Open.OK == 0 {
		ps = append(ps, "no packet was opened")
	}
	if r.ClaimedCents > r.SentCents {
		ps = append(ps, fmt.Sprintf("claimed %d cents, more than the %d sent", r.ClaimedCents, r.SentCents))
	}
	if r.OverClaimedPackets > 0 {
		ps = append(ps, fmt.Sprintf("%d claims went beyond their packet's amount or share count", r.OverClaimedPackets))
	}
	if n := r.BalanceMismatches - r.CreditsPending(); n > 0 {
		ps = append(ps, fmt.Sprintf("%d openers' balances differ from their claims (balances %d, claimed %d cents)",
			n, r.OpenerBalancesCents, r.ClaimedCents))
	}
	if r.BalanceError != "" {
		ps = append(ps, "balances: "+r.BalanceError)
	}
	return append(ps, auditProblems("audit", r.Audit, r.AuditError)...)
}

// auditProblems says what is wrong in an audit, each line starting with
// prefix: its error (auditErr, when it could not run), a money difference
// (cents), each problem it found. Empty: nil audit and no error, or clean.
func auditProblems(prefix string, a *model.AuditReport, auditErr string) []string {
	var ps []string
	if auditErr != "" {
		ps = append(ps, prefix+": "+auditErr)
	}
	if a != nil {
		if a.Difference != 0 {
			ps = append(ps, fmt.Sprintf("%s: money differs by %d cents", prefix, a.Difference))
		}
		for _, p := range a.Problems {
			ps = append(ps, prefix+": "+p)
		}
	}
	return ps
}

// runShedCode: an answer by which the cluster (or the client) sheds load by
// design, which a run with AllowShed counts and reports instead of failing.
// DB_UNAVAILABLE is the cell's database breaker open after queries that
// timed out (a saturated machine: the cell sheds for the cooldown, retryable):
// no money moves on it, and a database that is really down answers nothing
// else, which fails the run as one that could not be made ("no packet was
// sent/opened").
func runShedCode(code string) bool {
	return code == model.ErrOverloaded.Code || code == model.ErrTimeout.Code ||
		code == model.ErrRateLimited.Code || code == model.ErrCellRateLimited.Code ||
		code == model.ErrUserRateLimited.Code || code == codeClientTimeout || code == codeDropped ||
		code == model.ErrMoving.Code || // a freeze longer than the router's retries: refused, retryable
		code == model.ErrDBUnavailable.Code
}

// Shed lists the run's shedding answers (see runShedCode) by op and code,
// as "open TIMEOUT=69", in op order; empty when none.
func (r Report) Shed() []string {
	var out []string
	for o := op(0); o < opCount; o++ {
		for _, code := range sortedCodes(r.op(o).Errors) {
			if runShedCode(code) {
				out = append(out, fmt.Sprintf("%s %s=%d", o, code, r.op(o).Errors[code]))
			}
		}
	}
	return out
}

// CreditsPending is how many checked accounts were short of their claims only
// because their credits had not arrived yet: the audit balanced and counts at
// least the missing cents as claimed but not yet credited (in flight). Those
// accounts are reported, not failed: no money is missing, the relay is slow.
// 0 when that is not proven.
func (r Report) CreditsPending() int {
	if a := r.Audit; a != nil && a.OK() && r.BalancesShort > 0 && int64(a.InFlight) >= r.BalancesShortCents {
		return r.BalancesShort
	}
	return 0
}

// describe says in one line what ran: workload, mode, path, strategy.
func (r Report) describe() string {
	w := r.Workload
	if w == "" {
		w = WorkloadSmoke
	}
	parts := []string{"workload " + w}
	if r.Mode == modeOpen {
		parts = append(parts, fmt.Sprintf("open-loop at %d opens/s (at most %d in flight)", r.Rate, r.MaxInFlight))
	} else {
		parts = append(parts, "closed-loop")
	}
	if r.Direct {
		parts = append(parts, "direct to the cells")
	} else {
		parts = append(parts, "through the router")
	}
	if r.Real {
		parts = append(parts, "real traffic (real tables, per-person limits)")
	}
	if r.Cells > 0 {
		parts = append(parts, fmt.Sprintf("%d cells", r.Cells))
	}
	if r.Strategy != "" {
		parts = append(parts, "strategy "+r.Strategy)
	}
	return strings.Join(parts, ", ")
}

// packets says what the run's packets were like.
func (r Report) packets() string {
	switch r.Workload {
	case WorkloadHot:
		return fmt.Sprintf("one packet of %d cents in %d shares, each open by a fresh account", r.PacketAmount, r.PacketCount)
	case WorkloadFestival:
		return fmt.Sprintf("groups of %d-%d of %d users (power law), shares for three members in four, %d cents a share on average",
			festivalGroupMin, festivalGroupMax, r.Users, festivalShareCents)
	case WorkloadCold:
		return fmt.Sprintf("packets of %d cents in %d shares, each opened by %d of %d users", r.PacketAmount, r.PacketCount, r.PacketCount, r.Users)
	case WorkloadRoundRobin:
		return fmt.Sprintf("%d packets of %d cents in %d shares, sent before the load, opened round robin, each open by a fresh account", r.Packets, r.PacketAmount, r.PacketCount)
	}
	return fmt.Sprintf("packets of %d cents in %d shares", r.PacketAmount, r.PacketCount)
}

// Name is how suites and charts call the run: its label, else its workload.
func (r Report) Name() string {
	if r.Label != "" {
		return r.Label
	}
	if r.Workload == "" {
		return WorkloadSmoke
	}
	return r.Workload
}

func sortedCodes(m map[string]int64) []string {
	codes := make([]string, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	return codes
}

// WriteText writes the report as a human-readable table. It returns the first
// write error.
func (r Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeHeader(ew)
	r.writeOpTable(ew)
	r.writeMoney(ew)
	r.writeVerdict(ew)
	return ew.err
}

// writeHeader writes what the run was and its rates: the workload, the
// load's shape, the cells' metrics, the work and the router's CPU.
func (r Report) writeHeader(ew *errWriter) {
	ew.printf("redcell bench: run %s against %s\n", r.RunID, r.RouterURL)
	ew.printf("  %s\n", r.describe())
	ew.printf("  %d senders, %d openers, %v, %s\n",
		r.Senders, r.Openers, time.Duration(r.DurationMS)*time.Millisecond, r.packets())
	ew.printf("  elapsed %.2fs, %.1f opens/s, %.1f sends/s\n", float64(r.ElapsedMS)/1000, r.OpensPerSec, r.SendsPerSec)
	if r.SoldOutAtMS > 0 {
		ew.printf("  the hot packet sold out %.2fs into the load, which ended it\n", float64(r.SoldOutAtMS)/1000)
	}
	if cm := r.CellMetrics; cm != nil {
		ew.printf("  cells' metrics (%d cells): %s commits/s, mean batch %s, credit-lag p99 (ms) %s\n",
			cm.Cells, cm.commitsText(), cm.batchText(), cm.lagText())
		ew.printf("  claims/s by cell: %s\n", cm.byCellText())
		for _, m := range cm.Missing {
			ew.printf("    n/a: %s\n", m)
		}
	}
	r.Work.writeLine(ew, "  ")
	if p := r.RouterProfile; p != nil && p.Error == "" {
		ew.printf("  router: %.1f µs of CPU per request, %.2f cores busy (profiled %.0f s)\n", p.CPUMicrosPerRequest, p.CoresBusy, p.Seconds)
	}
	if r.OpensPending > 0 || r.UnresolvedOpens > 0 {
		ew.printf("  %d opens not yet due at the end, %d of unknown outcome not asked again\n", r.OpensPending, r.UnresolvedOpens)
	}
}

// writeOpTable writes the latency table, a row per operation (and the hot
// and cold opens), then each operation's errors by code.
func (r Report) writeOpTable(ew *errWriter) {
	ew.printf("\n%-8s %9s %9s %7s %9s %9s %9s %9s %9s\n", "op", "count", "ok", "repeat", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms")
	for o := op(0); o < opCount; o++ {
		s := r.op(o)
		l := s.LatencyMS
		ew.printf("%-8s %9d %9d %7d %9.2f %9.2f %9.2f %9.2f %9.2f\n", o, s.Count, s.OK, s.Repeats, l.P50, l.P90, l.P99, l.P999, l.Max)
	}
	for _, c := range []struct {
		name string
		s    *OpStats
	}{{"  hot", r.OpenHot}, {"  cold", r.OpenCold}} {
		if c.s != nil {
			l := c.s.LatencyMS
			ew.printf("%-8s %9d %9d %7d %9.2f %9.2f %9.2f %9.2f %9.2f   (opens of %s packets)\n", c.name, c.s.Count, c.s.OK, c.s.Repeats,
				l.P50, l.P90, l.P99, l.P999, l.Max, strings.TrimSpace(c.name))
		}
	}
	for o := op(0); o < opCount; o++ {
		errs := r.op(o).Errors
		if len(errs) == 0 {
			continue
		}
		var parts []string
		for _, code := range sortedCodes(errs) {
			parts = append(parts, fmt.Sprintf("%s=%d", code, errs[code]))
		}
		ew.printf("  %s errors: %s\n", o, strings.Join(parts, " "))
	}
	if shed := r.Shed(); len(shed) > 0 && r.AllowShed {
		ew.printf("  shed by design (counted, not a failure): %s\n", strings.Join(shed, ", "))
	}
}

// writeMoney writes the money the run moved, the openers' balances and the
// audit of the cells.
func (r Report) writeMoney(ew *errWriter) {
	ew.printf("\nmoney (cents): deposited %d, sent %d, claimed %d (%d opens resolved after a lost answer)\n",
		r.DepositedCents, r.SentCents, r.ClaimedCents, r.ResolvedOpens)
	if r.BalancesChecked {
		ew.printf("  opener balances %d over %d accounts, %d mismatches\n", r.OpenerBalancesCents, r.BalanceSample, r.BalanceMismatches)
		if n := r.CreditsPending(); n > 0 {
			ew.printf("  %d accounts still wait for %d cents of credits, counted in flight by the audit (slow relay, not lost money)\n",
				n, r.BalancesShortCents)
		}
	} else {
		ew.printf("  opener balances not checked\n")
	}
	if r.BalanceError != "" {
		ew.printf("  balance error: %s\n", r.BalanceError)
	}
	if a := r.Audit; a != nil {
		ew.printf("audit of %d cells: deposits %d + rewards %d - withdrawals %d = balances %d + open %d + in flight %d (%d credits); difference %d, %d problems\n",
			len(a.Cells), a.Deposits, a.Rewards, a.Withdrawals, a.Balances, a.OpenRemaining, a.InFlight, a.InFlightCount, a.Difference, len(a.Problems))
	}
	if r.AuditError != "" {
		ew.printf("audit error: %s\n", r.AuditError)
	}
}

// writeVerdict writes OK, or FAIL and the run's problems.
func (r Report) writeVerdict(ew *errWriter) {
	if ps := r.Problems(); len(ps) > 0 {
		ew.printf("\nFAIL\n")
		for _, p := range ps {
			ew.printf("  - %s\n", p)
		}
	} else {
		ew.printf("\nOK\n")
	}
}

// errWriter keeps the first write error and skips every write after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(e, format, args...)
}

// verdict ends a text report: "  FAILED: " and the problems, or "  OK".
func (e *errWriter) verdict(problems []string) {
	if len(problems) > 0 {
		e.printf("  FAILED: %s\n", strings.Join(problems, "; "))
	} else {
		e.printf("  OK\n")
	}
}

// loopText says how a run of the coupons or rewards suite sent its load:
// closed-loop with its workers, or open-loop at its rate.
func loopText(mode string, rate, concurrency int, started, due int64) string {
	if mode == modeOpen {
		return fmt.Sprintf("open-loop at %d/s, %d in flight at most, %d of %d due started", rate, concurrency, started, due)
	}
	return fmt.Sprintf("closed-loop, %d workers", concurrency)
}

// requestsPerSec is every request of the run (all ops, failures too: each
// reached the router) per second of the load phase; 0 when unknown.
func (r Report) requestsPerSec() float64 {
	if r.ElapsedMS <= 0 {
		return 0
	}
	var n int64
	for o := op(0); o < opCount; o++ {
		n += r.op(o).Count
	}
	return float64(n) / (float64(r.ElapsedMS) / 1000)
}
