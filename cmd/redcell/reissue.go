package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/client"
	"redcell/internal/retry"
)

// redcell rewards reissue: issue again, through the router, the rewards a
// CSV file lists (after an incident, say, or for a scene whose calls were
// lost). A line's reward has the order number the server builds from its
// act_id, scene, rain, award type and the stage open at the request time,
// so a line issued before answers its first reward (repeated) and changes
// nothing: running the same file twice is harmless.

const reissueUsage = `usage: redcell rewards reissue --router URL (--api-key KEY | --api-key-file F) --activity PARENT --stage STAGE --file F.csv [--concurrency 8]

  Issues each line of the CSV file as a reward of the parent activity PARENT
  (POST /v1/rewards, the API key needs the scope reward). Lines are
      act_id,scene_id,rain_id,amount[,award_type]
  award_type defaults to cash; amount is cents for cash, pieces for a coupon
  kind. A first line "act_id,scene_id,rain_id,amount[,award_type]" is a
  header. The whole file is read and checked first: a malformed line stops
  the run before anything is sent.

  Idempotent per line: the server's order number
  {act_id}_{scene}_{rain}_{award_type}_{stage} makes a line issued before
  answer its first reward ("repeated"). --stage (test, gray or official)
  names the stage the lines belong to: every line is sent with it, and the
  server refuses a line when another stage is open (NO_ACTIVE_STAGE), so a
  gray rehearsal's rewards never become official money.
  A line whose order number was issued with another amount is refused
  (ORDER_CONFLICT).

  Retryable answers and lost answers are tried again (4 attempts in all).
  Prints a progress line on stderr and a summary on stdout: applied,
  repeated, refused (by code), failed (no answer, or still retryable after
  the attempts), with the line numbers of the first 20 refused and failed
  lines. Exit status 1 when any line was refused or failed.`

// Limits of one reissue run.
const (
	reissueLinesMax       = 1_000_000 // a file of more lines is refused: split it
	reissueConcurrencyMax = 256       // the router's per-route limit, not this, should bound a run
	reissueAttempts       = 4         // tries of one line when the answer is retryable or lost
	reissueBackoff        = 250 * time.Millisecond
	reissueBackoffMax     = 2 * time.Second // a USER_RATE_LIMITED person refills within a second
	reissueListedMax      = 20              // line numbers printed per kind
	reissueProgressEvery  = 200 * time.Millisecond
)

// reissueLine is one line of the file.
type reissueLine struct {
	no  int // line number in the file, from 1
	req api.RewardRequest
}

// reissueSummary is what became of the lines. Refused and failed map a code
// to the numbers of its lines (failed: TRANSPORT for no answer).
type reissueSummary struct {
	lines             int
	applied, repeated int
	refused, failed   map[string][]int
	notSent           int // lines left when the run was interrupted
}

func (s reissueSummary) refusedCount() int { return countLines(s.refused) }
func (s reissueSummary) failedCount() int  { return countLines(s.failed) }

func countLines(m map[string][]int) (n int) {
	for _, l := range m {
		n += len(l)
	}
	return n
}

// runReissue is redcell rewards reissue.
func runReissue(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rewards reissue", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), reissueUsage) }
	router := fs.String("router", "http://127.0.0.1:8080", "base URL of the router")
	key := fs.String("api-key", "", "the calling app's API key (scope reward)")
	keyFile := fs.String("api-key-file", "", "a file holding the API key (make run writes var/api-key)")
	parent := fs.String("activity", "", "the parent activity of every line, e.g. demo-festival")
	stage := fs.String("stage", "", "the stage every line belongs to: test, gray or official (refused when another is open)")
	file := fs.String("file", "", "the CSV file")
	conc := fs.Int("concurrency", 8, "lines in flight at once, 1..256")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("rewards reissue: unexpected arguments %q", fs.Args())
	}
	apiKey, err := reissueKey(*key, *keyFile)
	if err != nil {
		return err
	}
	switch {
	case *parent == "":
		return errors.New("rewards reissue: give --activity PARENT")
	case *file == "":
		return errors.New("rewards reissue: give --file F.csv")
	case *stage != "test" && *stage != "gray" && *stage != "official":
		return errors.New("rewards reissue: give --stage test, gray or official (the stage the lines were meant for)")
	case *conc < 1 || *conc > reissueConcurrencyMax:
		return fmt.Errorf("rewards reissue: --concurrency must be 1..%d", reissueConcurrencyMax)
	}
	lines, err := readReissueFile(*file, *parent)
	if err != nil {
		return err
	}
	for i := range lines {
		lines[i].req.Stage = *stage
	}
	c, err := client.New(*router, apiKey, client.WithMaxIdleConnsPerHost(*conc))
	if err != nil {
		return fmt.Errorf("rewards reissue: %w", err)
	}
	defer c.CloseIdleConnections()
	sum := reissue(ctx, c, lines, *conc, os.Stderr)
	writeReissueSummary(os.Stdout, *file, *parent, sum)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("rewards reissue: interrupted with %d lines not sent: %w", sum.notSent, ctx.Err())
	case sum.refusedCount()+sum.failedCount() > 0:
		return fmt.Errorf("rewards reissue: of %d lines, refused %d, failed %d", sum.lines, sum.refusedCount(), sum.failedCount())
	}
	return nil
}

// reissueKey is the API key of --api-key or --api-key-file (exactly one).
func reissueKey(key, file string) (string, error) {
	switch {
	case key != "" && file != "":
		return "", errors.New("rewards reissue: give --api-key or --api-key-file, not both")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("rewards reissue: API key: %w", err)
		}
		key = string(b)
	}
	if key = strings.TrimSpace(key); key == "" {
		return "", errors.New("rewards reissue: give --api-key KEY or --api-key-file F")
	}
	return key, nil
}

// readReissueFile reads and checks the whole file. Errors: the file cannot
// be read, is empty or too long, or has malformed lines (the first 20 are
// named).
func readReissueFile(path, parent string) ([]reissueLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rewards reissue: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1 // 4 or 5, checked below
	r.TrimLeadingSpace = true
	r.ReuseRecord = true
	var lines []reissueLine
	var bad []string
	for first := true; ; first = false {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		line, _ := r.FieldPos(0)
		if err != nil {
			var pe *csv.ParseError
			if !errors.As(err, &pe) {
				return nil, fmt.Errorf("rewards reissue: %s: %w", path, err)
			}
			bad = append(bad, pe.Error())
			continue
		}
		if first && isReissueHeader(rec) {
			continue
		}
		if len(lines)+len(bad) >= reissueLinesMax {
			return nil, fmt.Errorf("rewards reissue: %s has more than %d lines: split it", path, reissueLinesMax)
		}
		l, err := parseReissueLine(rec, parent)
		if err != nil {
			bad = append(bad, fmt.Sprintf("line %d: %v", line, err))
			continue
		}
		l.no = line
		lines = append(lines, l)
	}
	if len(bad) > 0 {
		shown := bad[:min(len(bad), reissueListedMax)]
		return nil, fmt.Errorf("rewards reissue: %s: %d malformed lines, nothing sent:\n  %s", path, len(bad), strings.Join(shown, "\n  "))
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("rewards reissue: %s has no lines", path)
	}
	return lines, nil
}

var reissueHeader = []string{"act_id", "scene_id", "rain_id", "amount", "award_type"}

func isReissueHeader(rec []string) bool {
	if len(rec) != 4 && len(rec) != 5 {
		return false
	}
	for i, f := range rec {
		if !strings.EqualFold(strings.TrimSpace(f), reissueHeader[i]) {
			return false
		}
	}
	return true
}

// parseReissueLine checks a line's shape; the server checks its values.
func parseReissueLine(rec []string, parent string) (reissueLine, error) {
	if len(rec) != 4 && len(rec) != 5 {
		return reissueLine{}, fmt.Errorf("%d fields, want act_id,scene_id,rain_id,amount[,award_type]", len(rec))
	}
	f := make([]string, 5)
	for i, s := range rec {
		f[i] = strings.TrimSpace(s)
	}
	if f[4] == "" {
		f[4] = "cash"
	}
	for i, name := range reissueHeader[:3] {
		if f[i] == "" {
			return reissueLine{}, fmt.Errorf("%s is empty", name)
		}
	}
	amount, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return reissueLine{}, fmt.Errorf("amount %q is not an integer", f[3])
	}
	return reissueLine{req: api.RewardRequest{ParentActivityID: parent, ActID: f[0], SceneID: f[1], RainID: f[2],
		Amount: amount, AwardType: f[4]}}, nil
}

// reissueTally counts outcomes as workers report them. Safe for
// concurrent use.
type reissueTally struct {
	done, applied, repeated, refused, failed atomic.Int64

	mu  sync.Mutex // guards sum
	sum reissueSummary
}

// reissue sends lines with conc workers and returns what became of them;
// progress (nil: none) gets the progress line. It returns when every line
// was answered, or, once ctx ends, when the lines in flight were.
func reissue(ctx context.Context, c *client.Client, lines []reissueLine, conc int, progress io.Writer) reissueSummary {
	t := &reissueTally{sum: reissueSummary{lines: len(lines), refused: map[string][]int{}, failed: map[string][]int{}}}
	stop := startReissueProgress(progress, len(lines), t)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(conc, len(lines)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(lines) {
					return
				}
				t.add(lines[i].no, reissueOne(ctx, c, lines[i].req))
			}
		})
	}
	wg.Wait()
	stop()
	sum := t.sum
	sum.notSent = len(lines) - int(t.done.Load())
	for _, m := range []map[string][]int{sum.refused, sum.failed} {
		for _, l := range m {
			slices.Sort(l)
		}
	}
	return sum
}

// reissueOutcome is what became of one line: kind is applied, repeated,
// refused or failed; code names a refusal or failure.
type reissueOutcome struct{ kind, code string }

// reissueOne issues one line, trying again after a retryable or lost
// answer (reissueAttempts in all, backing off, while ctx allows).
func reissueOne(ctx context.Context, c *client.Client, req api.RewardRequest) reissueOutcome {
	var got api.RewardResponse
	err := retry.Do(ctx, retry.Policy{Attempts: reissueAttempts, Backoff: reissueBackoff, Max: reissueBackoffMax, Retryable: client.Retryable},
		func(int) error {
			var err error
			got, err = c.IssueReward(ctx, req)
			return err
		})
	var e *client.Error
	switch {
	case err == nil && got.Repeat:
		return reissueOutcome{kind: "repeated"}
	case err == nil:
		return reissueOutcome{kind: "applied"}
	case errors.As(err, &e) && !e.Retryable:
		return reissueOutcome{kind: "refused", code: errorCode(e)}
	case errors.As(err, &e):
		return reissueOutcome{kind: "failed", code: errorCode(e)}
	case ctx.Err() != nil:
		return reissueOutcome{kind: "failed", code: "INTERRUPTED"}
	}
	return reissueOutcome{kind: "failed", code: "TRANSPORT"}
}

func errorCode(e *client.Error) string {
	if e.Code != "" {
		return e.Code
	}
	return "HTTP_" + strconv.Itoa(e.Status)
}

func (t *reissueTally) add(line int, o reissueOutcome) {
	t.mu.Lock()
	switch o.kind {
	case "applied":
		t.sum.applied++
		t.applied.Add(1)
	case "repeated":
		t.sum.repeated++
		t.repeated.Add(1)
	case "refused":
		t.sum.refused[o.code] = append(t.sum.refused[o.code], line)
		t.refused.Add(1)
	default:
		t.sum.failed[o.code] = append(t.sum.failed[o.code], line)
		t.failed.Add(1)
	}
	t.mu.Unlock()
	t.done.Add(1)
}

// startReissueProgress rewrites one plain-text line on w (with '\r') at
// most every reissueProgressEvery, and only when a line was answered since;
// stop writes the last state and a newline. w nil: nothing.
func startReissueProgress(w io.Writer, total int, t *reissueTally) (stop func()) {
	if w == nil {
		return func() {}
	}
	line := func() string {
		done := t.done.Load()
		filled := int(int64(progressCells) * done / int64(total))
		return fmt.Sprintf("\rreissue [%s%s] %d/%d lines  applied %d  repeated %d  refused %d  failed %d ",
			strings.Repeat("#", filled), strings.Repeat(".", progressCells-filled), done, total,
			t.applied.Load(), t.repeated.Load(), t.refused.Load(), t.failed.Load())
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(reissueProgressEvery)
		defer tick.Stop()
		last := int64(-1)
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				if d := t.done.Load(); d != last {
					last = d
					fmt.Fprint(w, line())
				}
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		fmt.Fprintln(w, line())
	}
}

// progressCells is the width of the progress bar.
const progressCells = 20

// writeReissueSummary prints the summary: one line of counts, then one per
// refusal and failure code, then the first line numbers of each kind.
func writeReissueSummary(w io.Writer, file, parent string, s reissueSummary) {
	fmt.Fprintf(w, "reissue %s (%s): %d lines: applied %d, repeated %d, refused %d, failed %d",
		file, parent, s.lines, s.applied, s.repeated, s.refusedCount(), s.failedCount())
	if s.notSent > 0 {
		fmt.Fprintf(w, ", not sent %d", s.notSent)
	}
	fmt.Fprintln(w)
	for _, kind := range []struct {
		name string
		m    map[string][]int
	}{{"refused", s.refused}, {"failed", s.failed}} {
		var all []int
		for _, code := range slices.Sorted(maps.Keys(kind.m)) {
			fmt.Fprintf(w, "  %s %s: %d\n", kind.name, code, len(kind.m[code]))
			all = append(all, kind.m[code]...)
		}
		if len(all) == 0 {
			continue
		}
		slices.Sort(all)
		shown := make([]string, 0, reissueListedMax)
		for _, n := range all[:min(len(all), reissueListedMax)] {
			shown = append(shown, strconv.Itoa(n))
		}
		fmt.Fprintf(w, "  %s lines (first %d of %d): %s\n", kind.name, len(shown), len(all), strings.Join(shown, ", "))
	}
}
