package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"redcell/bench"
)

// externalFlagsRefused are the flags of the bench's own load, which an
// external command does not take: given, they are refused, not ignored.
var externalFlagsRefused = []string{"workload", "compare", "real", "duration", "rate", "openers", "senders", "direct", "compare-direct",
	"limits", "search", "search-only", "sustain-at", "cleanup", "packets", "amount", "count"}

// runExternalBench meters an outside load command (--external) on this
// cluster and, with --baseline, on the baseline too (bench.RunExternal), and
// writes its report like the other workloads' (writeSuiteReport).
func runExternalBench(ctx context.Context, f *benchFlags, args []string) error {
	if f.configPath == "" || !f.work {
		return errors.New("bench: --external meters the servers of --config: give --config (and leave --work on)")
	}
	for _, name := range externalFlagsRefused {
		if f.set[name] {
			return fmt.Errorf("bench: --%s is the bench's own load: it does not apply to --external", name)
		}
	}
	w, err := workSources(f.configPath, f.idleWindow)
	if err != nil {
		return err
	}
	cfg := bench.ExternalConfig{Command: f.external, Op: f.externalOp, Rounds: f.externalRounds, Timeout: f.externalTimeout,
		Output: os.Stderr, Progress: os.Stderr,
		Targets: []bench.ExternalTarget{{RouterURL: f.router, APIKey: f.apiKey, Work: w}}}
	b, err := f.baseline()
	if err != nil {
		return err
	}
	if b != nil {
		cfg.Targets = append(cfg.Targets, bench.ExternalTarget{Name: b.Name, RouterURL: b.RouterURL, APIKey: b.APIKey, Work: b.Work})
	}
	rep, runErr := bench.RunExternal(ctx, cfg)
	if runErr != nil && len(rep.Runs) == 0 {
		return runErr
	}
	return writeSuiteReport(f, "external", rep.StartedAt, rep, runErr)
}
