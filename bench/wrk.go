package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"redcell/api"
)

// The client check: the bench's no-op loop against wrk (a C load generator
// that is not the bottleneck on this path) sending the same requests to the
// same route, one after the other, in one invocation. If the bench reaches a
// good fraction of wrk's rate, its own CPU does not bound what it measures.
const (
	// clientCheckActs is the act_id pool of the check's requests. They are
	// ordinary (unmarked) requests, so the router's per-act_id limit applies
	// (20/s, burst 40 by default): 8192 act_ids keep each under it up to
	// ~160,000 requests/s.
	clientCheckActs = 8192
	// clientCheckRounds: bench, wrk, bench, wrk — alternating, so a change
	// in the machine's other load falls on both.
	clientCheckRounds = 2
	// wrkMark prefixes the line the wrk script prints its summary on.
	wrkMark = "REDCELL_WRK "
)

// ClientCheck is the bench client against wrk on one route.
type ClientCheck struct {
	// Request says what both clients sent.
	Request     string `json:"request"`
	Cell        string `json:"cell"`
	Connections int    `json:"connections"`
	WrkThreads  int    `json:"wrk_threads"`
	Wrk         string `json:"wrk"` // the binary run
	// Bench and Wrk are the rounds, in the order they ran (alternating).
	Bench   []NoopResult `json:"bench"`
	WrkRuns []NoopResult `json:"wrk_runs"`
	// BenchPerSec and WrkPerSec are the means over the rounds; BenchOverWrk
	// is their ratio, the check's result (the target is >= 0.8).
	BenchPerSec  float64 `json:"bench_per_sec"`
	WrkPerSec    float64 `json:"wrk_per_sec"`
	BenchOverWrk float64 `json:"bench_over_wrk"`
	// SignedOverWrk is the bench's usual no-op (stress mark and signature,
	// NoopRouter) over wrk's: what it measures, with the router's check of
	// the signature included.
	SignedOverWrk float64 `json:"signed_over_wrk,omitempty"`
	Skipped       string  `json:"skipped,omitempty"` // why nothing was measured
	Error         string  `json:"error,omitempty"`
}

// ClientCheckMin is the client check's target: the bench's no-op rate at
// least this fraction of wrk's.
const ClientCheckMin = 0.8

// checkClient runs the client check through the router on act_ids of cell.
func checkClient(ctx context.Context, lc LimitsConfig, rc *client, cell CellInfo) *ClientCheck {
	threads := min(wrkThreads, lc.Concurrency)
	cc := &ClientCheck{Cell: cell.Name, Connections: lc.Concurrency, WrkThreads: threads, Wrk: lc.Wrk,
		Request: fmt.Sprintf("POST %s{act_id}, Authorization: Bearer <key>, no body, no stress mark; act_ids of %s cycled", api.NoopPath, cell.Name)}
	acts, err := actsOwnedByN(lc.RunID+"-c", cell, clientCheckActs)
	if err != nil {
		cc.Error = err.Error()
		return cc
	}
	script, err := writeWrkScript(rc.apiKey, acts)
	if err != nil {
		cc.Error = err.Error()
		return cc
	}
	defer os.Remove(script)
	for range clientCheckRounds {
		b := noop(ctx, rc, lc, "router (plain)", cell.Name, acts, false)
		cc.Bench = append(cc.Bench, b)
		w, err := runWrk(ctx, lc.Wrk, script, rc.base, threads, lc.Concurrency, lc.HTTPDuration)
		if err != nil {
			cc.Error = err.Error()
			return cc
		}
		w.Cell = cell.Name
		cc.WrkRuns = append(cc.WrkRuns, w)
		if ctx.Err() != nil {
			return cc
		}
	}
	for i := range cc.Bench {
		cc.BenchPerSec += cc.Bench[i].PerSec / float64(len(cc.Bench))
		cc.WrkPerSec += cc.WrkRuns[i].PerSec / float64(len(cc.WrkRuns))
	}
	cc.BenchOverWrk = ratio(cc.BenchPerSec, cc.WrkPerSec)
	return cc
}

// wrkThreads: wrk's threads, one per core of the machine this was tuned on
// (2); more threads than cores only add switches.
const wrkThreads = 2

// writeWrkScript writes a wrk Lua script that sends the check's request over
// acts (each thread starting elsewhere in the list) and prints its summary as
// one JSON line after wrkMark. It returns the file's path.
func writeWrkScript(apiKey string, acts []string) (string, error) {
	var b strings.Builder
	b.WriteString("local acts = {\n")
	for _, a := range acts {
		b.WriteString(strconv.Quote(a))
		b.WriteString(",\n")
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "local headers = {[\"Authorization\"] = %s, [\"Content-Length\"] = \"0\"}\n", strconv.Quote("Bearer "+apiKey))
	b.WriteString(`local threads = 0
function setup(thread)
  thread:set("first", threads * 4099)
  threads = threads + 1
end
function init(args)
  i = first or 0
end
function request()
  i = i + 1
  return wrk.format("POST", "` + api.NoopPath + `" .. acts[(i % #acts) + 1], headers)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('` + wrkMark + `{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max))
end
`)
	f, err := os.CreateTemp("", "redcell-wrk-*.lua")
	if err != nil {
		return "", fmt.Errorf("bench: wrk script: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("bench: wrk script: %w", err)
	}
	return f.Name(), f.Close()
}

// wrkSummary is the line the script prints.
type wrkSummary struct {
	Requests   int64 `json:"requests"`
	DurationUS int64 `json:"duration_us"`
	Connect    int64 `json:"connect"`
	Read       int64 `json:"read"`
	Write      int64 `json:"write"`
	Status     int64 `json:"status"` // answers that were not 2xx or 3xx
	Timeout    int64 `json:"timeout"`
	P50US      int64 `json:"p50_us"`
	P90US      int64 `json:"p90_us"`
	P99US      int64 `json:"p99_us"`
	P999US     int64 `json:"p999_us"`
	MaxUS      int64 `json:"max_us"`
}

// runWrk runs wrk with script against base for d and returns its rate as a
// NoopResult (path "wrk"). Errors: wrk did not run or printed no summary.
func runWrk(ctx context.Context, bin, script, base string, threads, conns int, d time.Duration) (NoopResult, error) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	cmd := exec.CommandContext(ctx, bin, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", strconv.Itoa(secs)+"s", "--timeout", strconv.Itoa(int(requestTimeout/time.Second))+"s", "-s", script, base)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return NoopResult{}, fmt.Errorf("bench: %s: %w: %s", bin, err, strings.TrimSpace(stderr.String()))
	}
	var s wrkSummary
	found := false
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), wrkMark); ok {
			if err := json.Unmarshal([]byte(line), &s); err != nil {
				return NoopResult{}, fmt.Errorf("bench: wrk summary %q: %w", line, err)
			}
			found = true
		}
	}
	if !found || s.DurationUS <= 0 {
		return NoopResult{}, errors.New("bench: wrk printed no summary: " + strings.TrimSpace(out.String()+" "+stderr.String()))
	}
	r := NoopResult{Path: "wrk", URL: base, Concurrency: conns, ElapsedMS: s.DurationUS / 1000,
		Count: s.Requests + s.Connect + s.Read + s.Write + s.Timeout, OK: s.Requests - s.Status,
		LatencyMS: LatencyMS{P50: usToMS(s.P50US), P90: usToMS(s.P90US), P99: usToMS(s.P99US), P999: usToMS(s.P999US), Max: usToMS(s.MaxUS)}}
	r.PerSec = float64(r.OK) / (float64(s.DurationUS) / 1e6)
	for code, n := range map[string]int64{"HTTP_NOT_2XX": s.Status, "WRK_CONNECT": s.Connect, "WRK_READ": s.Read,
		"WRK_WRITE": s.Write, "WRK_TIMEOUT": s.Timeout} {
		if n > 0 {
			if r.Errors == nil {
				r.Errors = map[string]int64{}
			}
			r.Errors[code] = n
		}
	}
	return r, nil
}

// FindWrk resolves the --wrk flag: "" is off, "auto" is wrk on PATH (skipped,
// with the reason, when it is not installed), anything else a path.
func FindWrk(flag string) (bin, skipped string) {
	switch flag {
	case "":
		return "", ""
	case "auto":
		p, err := exec.LookPath("wrk")
		if err != nil {
			return "", "wrk is not installed (apt-get install wrk; make run's installer adds it when it can)"
		}
		return p, ""
	}
	return flag, ""
}
