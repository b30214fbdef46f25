package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// An external load: a command the bench does not write (wrk with a Lua
// script, say) drives a cluster while the bench's meter counts what the
// servers did (Work). The command learns where to send from its
// environment and says how many fresh operations it made on a line
// "REDCELL_FRESH <n>" of its output; the work per operation is over those.
// It is how the figures are taken: an outside client on few
// connections, the meter the same as the bench's own runs.

// FreshMark starts the line an external command prints its count of fresh
// operations on: "REDCELL_FRESH 1234". The last such line counts.
const FreshMark = "REDCELL_FRESH "

// externalOutputMax bounds the output kept of one run of the command (its
// last lines), for the report.
const externalOutputMax = 4096

// ExternalTarget is a cluster an external command runs against.
type ExternalTarget struct {
	Name      string // "" this cluster; the baseline's name
	RouterURL string
	APIKey    string
	Work      *WorkSources // required: the meter
}

// ExternalConfig is one invocation: Command on every target, Rounds times,
// interleaved (round 1 in the targets' order, round 2 the other way, ...).
type ExternalConfig struct {
	// Command runs under sh -c with REDCELL_ROUTER_URL, REDCELL_API_KEY,
	// REDCELL_CLUSTER (the target's name, "main" for this cluster) and
	// REDCELL_ROUND (1, 2, ...) set. It must print FreshMark and its count.
	Command string
	// Op names what the command's fresh operations are ("open").
	Op       string
	Targets  []ExternalTarget // the first is this cluster
	Rounds   int              // 1..10
	Timeout  time.Duration    // each run of the command; 0: 10 min
	Output   io.Writer        // the command's output is copied here (nil: dropped)
	Progress io.Writer
}

// ExternalRun is one run of the command on one target.
type ExternalRun struct {
	Cluster   string  `json:"cluster,omitempty"` // "" this cluster
	Round     int     `json:"round"`
	Fresh     int64   `json:"fresh"` // the command's count
	ElapsedMS int64   `json:"elapsed_ms"`
	PerSec    float64 `json:"per_sec"` // Fresh over the command's run
	Work      *Work   `json:"work,omitempty"`
	Error     string  `json:"error,omitempty"`
	Tail      string  `json:"output_tail,omitempty"` // its last lines
}

// ExternalReport is what RunExternal measured.
type ExternalReport struct {
	StartedAt time.Time     `json:"started_at"`
	Command   string        `json:"command"`
	Op        string        `json:"op"`
	Runs      []ExternalRun `json:"runs"`
	// VsBaseline pairs each round's run on this cluster with the same
	// round's on the baseline (the second target).
	VsBaseline []OpsVsBaseline `json:"vs_baseline,omitempty"`
}

// Validate checks the config.
func (c ExternalConfig) Validate() error {
	switch {
	case strings.TrimSpace(c.Command) == "":
		return errors.New("bench: external: no command")
	case c.Op == "":
		return errors.New("bench: external: name the operation the command counts")
	case len(c.Targets) < 1 || len(c.Targets) > 2:
		return errors.New("bench: external: one cluster, or one and its baseline")
	case c.Rounds < 1 || c.Rounds > 10:
		return fmt.Errorf("bench: external: rounds must be 1..10, got %d", c.Rounds)
	case c.Timeout < 0:
		return errors.New("bench: external: a negative timeout")
	}
	for i, t := range c.Targets {
		if t.RouterURL == "" || t.Work == nil {
			return errors.New("bench: external: every cluster needs its router URL and its meter")
		}
		// The command tells the clusters apart by REDCELL_CLUSTER.
		if i > 0 && (t.Name == "" || t.Name == clusterName("") || len(t.Name) > runIDLenMax) {
			return fmt.Errorf("bench: external: the baseline needs a name of 1..%d characters other than %q", runIDLenMax, clusterName(""))
		}
	}
	return nil
}

// RunExternal runs cfg: the command on each target per round, metering each
// run from its start until the servers are quiet again. A run whose command
// failed or printed no count is kept with its Error; the report's OK says.
func RunExternal(ctx context.Context, cfg ExternalConfig) (ExternalReport, error) {
	if err := cfg.Validate(); err != nil {
		return ExternalReport{}, err
	}
	rep := ExternalReport{StartedAt: time.Now(), Command: cfg.Command, Op: cfg.Op}
	for round := 1; round <= cfg.Rounds && ctx.Err() == nil; round++ {
		order := append([]ExternalTarget(nil), cfg.Targets...)
		if round%2 == 0 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, t := range order {
			if ctx.Err() != nil {
				break
			}
			logf(cfg.Progress, "external %s, round %d on %s: %s", cfg.Op, round, clusterName(t.Name), cfg.Command)
			rep.Runs = append(rep.Runs, runExternal(ctx, cfg, t, round))
		}
	}
	rep.VsBaseline = pairWithBaseline(rep.Runs, func(r ExternalRun) (string, string) { return r.Cluster, fmt.Sprintf("round %d", r.Round) },
		func(r, b ExternalRun) OpsVsBaseline {
			return newOpsVsBaseline(fmt.Sprintf("round %d", r.Round), r.PerSec, b.PerSec, 0, 0, r.Work, b.Work)
		})
	return rep, ctx.Err()
}

// clusterName is how the command's environment names a target.
func clusterName(name string) string {
	if name == "" {
		return "main"
	}
	return name
}

func runExternal(ctx context.Context, cfg ExternalConfig, t ExternalTarget, round int) ExternalRun {
	out := ExternalRun{Cluster: t.Name, Round: round}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	w0 := t.Work.begin(ctx)
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, "sh", "-c", cfg.Command)
	// The command and whatever it starts are a process group of their
	// own: the timeout (or the bench's end) kills all of them, not only the
	// shell, and the output's pipe is let go of a few seconds after.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "REDCELL_ROUTER_URL="+t.RouterURL, "REDCELL_API_KEY="+t.APIKey,
		"REDCELL_CLUSTER="+clusterName(t.Name), "REDCELL_ROUND="+strconv.Itoa(round))
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var (
		wg    sync.WaitGroup
		fresh = int64(-1)
		tail  []string
	)
	wg.Go(func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1<<20) // a longer line ends the scan; the rest is drained below
		for sc.Scan() {
			line := sc.Text()
			if cfg.Output != nil {
				fmt.Fprintln(cfg.Output, line)
			}
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), FreshMark); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64); err == nil && n >= 0 {
					fresh = n
				}
			}
			tail = append(tail, line)
			for size(tail) > externalOutputMax && len(tail) > 1 {
				tail = tail[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	})
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything it left running in the background
	}
	pw.Close()
	wg.Wait()
	out.ElapsedMS, out.Tail = elapsed.Milliseconds(), strings.Join(tail, "\n")
	switch {
	case err != nil:
		out.Error = fmt.Sprintf("the command failed: %v", err)
	case fresh < 0:
		out.Error = "the command printed no " + strings.TrimSpace(FreshMark) + " line"
	}
	if fresh > 0 {
		out.Fresh = fresh
		out.PerSec = float64(fresh) / elapsed.Seconds()
	}
	if ctx.Err() == nil {
		out.Work = t.Work.end(ctx, w0, out.Fresh, cfg.Op)
	}
	return out
}

// size is the bytes of lines, newlines included.
func size(lines []string) int {
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	return n
}

// Problems lists the runs that failed or made no fresh operation.
func (r ExternalReport) Problems() []string {
	var ps []string
	for _, x := range r.Runs {
		name := fmt.Sprintf("%s round %d", clusterName(x.Cluster), x.Round)
		switch {
		case x.Error != "":
			ps = append(ps, name+": "+x.Error)
		case x.Fresh == 0:
			ps = append(ps, name+": no fresh "+r.Op)
		}
	}
	return ps
}

// OK reports whether every run made fresh operations and exited cleanly.
func (r ExternalReport) OK() bool { return len(r.Problems()) == 0 }

// WriteText prints the report: per run the fresh operations, their rate
// and the work per operation, then each round against the baseline.
func (r ExternalReport) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("redcell bench: external load, %s per fresh %s\n  command: %s\n", "work", r.Op, r.Command)
	for _, x := range r.Runs {
		ew.printf("  %s round %d: %d fresh in %v (%.0f/s)\n", clusterName(x.Cluster), x.Round, x.Fresh,
			time.Duration(x.ElapsedMS)*time.Millisecond, x.PerSec)
		if x.Error != "" {
			ew.printf("        %s\n", x.Error)
		}
		x.Work.writeLine(ew, "        ")
	}
	for _, v := range r.VsBaseline {
		v.writeLine(ew, "  ", r.Op+"s/s", r.Op)
	}
	ew.verdict(r.Problems())
	return ew.err
}

// WriteSVG draws the runs as bars (writeRunsSVG).
func (r ExternalReport) WriteSVG(w io.Writer) error {
	var runs []barRun
	for _, x := range r.Runs {
		runs = append(runs, barRun{fmt.Sprintf("%s %d", clusterName(x.Cluster), x.Round), x.PerSec, 0, x.Work})
	}
	return writeRunsSVG(w, "redcell bench: external load ("+verdict(r.OK())+")", "fresh "+r.Op+"s/s", r.Op, runs)
}
