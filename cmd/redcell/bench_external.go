package main

import (
	"context"
	"errors"
	"os"

	"redcell/bench"
)

// runExternalBench meters an outside load command (--external) on this
// cluster and, with --baseline, on the baseline too (bench.RunExternal), and
// writes its report like the other workloads' (writeSuiteReport).
func runExternalBench(ctx context.Context, f *benchFlags, args []string) error {
	if f.configPath == "" || !f.work {
		return errors.New("bench: --external meters the servers of --config: give --config (and leave --work on)")
	}
	if f.cleanup {
		return errors.New("bench: --external sends its own (real) traffic: there is no shadow space to --cleanup")
	}
	w, err := workSources(f.configPath, f.idleWindow)
	if err != nil {
		return err
	}
	cfg := bench.ExternalConfig{Command: f.external, Op: f.externalOp, Rounds: f.externalRounds, Output: os.Stderr, Progress: os.Stderr,
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
