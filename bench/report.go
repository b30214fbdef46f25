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
	RouterURL    string `json:"router_url"`
	Senders      int    `json:"senders"`
	Openers      int    `json:"openers"`
	DurationMS   int64  `json:"duration_ms"`
	PacketAmount int64  `json:"packet_amount_cents"`
	PacketCount  int64  `json:"packet_count"`

	// ElapsedMS is the load phase as measured: from the first request until the
	// last sender and opener returned (the audit is not included).
	ElapsedMS int64 `json:"elapsed_ms"`

	Deposit OpStats `json:"deposit"`
	Send    OpStats `json:"send"`
	Grab    OpStats `json:"grab"`
	Open    OpStats `json:"open"`

	OpensPerSec float64 `json:"opens_per_sec"` // successful opens per second of ElapsedMS
	SendsPerSec float64 `json:"sends_per_sec"` // successful sends per second of ElapsedMS

	DepositedCents int64 `json:"deposited_cents"` // sum of the senders' deposits
	SentCents      int64 `json:"sent_cents"`      // sum of the packets sent
	ClaimedCents   int64 `json:"claimed_cents"`   // sum of the successful opens
	// ResolvedOpens counts opens whose answer was lost (a timeout) that turned
	// out, when asked again after the load, to have committed.
	ResolvedOpens int64 `json:"resolved_opens"`
	// AllowShed: OVERLOADED and TIMEOUT answers were accepted as load shedding.
	AllowShed bool `json:"allow_shed"`

	// BalancesChecked is true when the openers' balances were read after the
	// load; OpenerBalancesCents is their sum and BalanceMismatches counts the
	// openers whose balance differs from what they claimed. Openers only receive,
	// so each balance must equal the opener's claims once credits are delivered.
	// BalanceError is why the last reading failed.
	BalancesChecked     bool   `json:"balances_checked"`
	OpenerBalancesCents int64  `json:"opener_balances_cents"`
	BalanceMismatches   int    `json:"balance_mismatches"`
	BalanceError        string `json:"balance_error,omitempty"`

	// Audit is the last audit report when Config.Audit was set and answered;
	// AuditError is its last error (or why it did not run).
	Audit      *model.AuditReport `json:"audit,omitempty"`
	AuditError string             `json:"audit_error,omitempty"`
}

// OpStats counts the requests of one operation. Count is every HTTP request
// made, retries included; OK are 2xx answers (Repeats of them said repeat=true);
// Errors counts the others by code.
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
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
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
// code (anything but SOLD_OUT and EXPIRED, and INSUFFICIENT_BALANCE on send),
// nothing sent or opened, more claimed than sent, an opener's balance that
// differs from its claims or could not be read, or an audit that failed or
// found money missing.
func (r Report) Problems() []string {
	var ps []string
	for o := op(0); o < opCount; o++ {
		for _, code := range sortedCodes(r.op(o).Errors) {
			shed := code == model.ErrOverloaded.Code || code == model.ErrTimeout.Code || code == codeClientTimeout
			if !expectedCodes[o][code] && !(r.AllowShed && shed) {
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
	if r.BalanceMismatches > 0 {
		ps = append(ps, fmt.Sprintf("%d openers' balances differ from their claims (balances %d, claimed %d cents)",
			r.BalanceMismatches, r.OpenerBalancesCents, r.ClaimedCents))
	}
	if r.BalanceError != "" {
		ps = append(ps, "balances: "+r.BalanceError)
	}
	if r.AuditError != "" {
		ps = append(ps, "audit: "+r.AuditError)
	}
	if a := r.Audit; a != nil {
		if a.Difference != 0 {
			ps = append(ps, fmt.Sprintf("audit: money differs by %d cents", a.Difference))
		}
		for _, p := range a.Problems {
			ps = append(ps, "audit: "+p)
		}
	}
	return ps
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
	ew.printf("redcell bench: run %s against %s\n", r.RunID, r.RouterURL)
	ew.printf("  %d senders, %d openers, %v, packets of %d cents in %d shares\n",
		r.Senders, r.Openers, time.Duration(r.DurationMS)*time.Millisecond, r.PacketAmount, r.PacketCount)
	ew.printf("  elapsed %.2fs, %.1f opens/s, %.1f sends/s\n\n", float64(r.ElapsedMS)/1000, r.OpensPerSec, r.SendsPerSec)

	ew.printf("%-8s %9s %9s %7s %9s %9s %9s %9s\n", "op", "count", "ok", "repeat", "p50 ms", "p90 ms", "p99 ms", "max ms")
	for o := op(0); o < opCount; o++ {
		s := r.op(o)
		l := s.LatencyMS
		ew.printf("%-8s %9d %9d %7d %9.2f %9.2f %9.2f %9.2f\n", o, s.Count, s.OK, s.Repeats, l.P50, l.P90, l.P99, l.Max)
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

	ew.printf("\nmoney (cents): deposited %d, sent %d, claimed %d (%d opens resolved after a lost answer)\n",
		r.DepositedCents, r.SentCents, r.ClaimedCents, r.ResolvedOpens)
	if r.BalancesChecked {
		ew.printf("  opener balances %d, %d mismatches\n", r.OpenerBalancesCents, r.BalanceMismatches)
	} else {
		ew.printf("  opener balances not checked\n")
	}
	if r.BalanceError != "" {
		ew.printf("  balance error: %s\n", r.BalanceError)
	}
	if a := r.Audit; a != nil {
		ew.printf("audit of %d cells: deposits %d = balances %d + open %d + in flight %d (%d credits); difference %d, %d problems\n",
			len(a.Cells), a.Deposits, a.Balances, a.OpenRemaining, a.InFlight, a.InFlightCount, a.Difference, len(a.Problems))
	}
	if r.AuditError != "" {
		ew.printf("audit error: %s\n", r.AuditError)
	}
	if ps := r.Problems(); len(ps) > 0 {
		ew.printf("\nFAIL\n")
		for _, p := range ps {
			ew.printf("  - %s\n", p)
		}
	} else {
		ew.printf("\nOK\n")
	}
	return ew.err
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
