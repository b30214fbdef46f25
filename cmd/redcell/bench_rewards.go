package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"redcell/bench"
)

// The rewards workload (bench.RunRewards) measures issues and booking lags,
// not opens and credits, so it runs apart from the suites of the packet
// workloads. Its --compare names booking modes, not open strategies.

// rewardsFlagsRefused are the flags of the packet workloads that mean
// nothing to the rewards workload: given, they are refused, not ignored.
var rewardsFlagsRefused = []string{"senders", "max-inflight", "packets", "amount", "count", "direct", "compare-direct", "limits",
	"limits-duration", "limits-concurrency", "wrk", "router-pprof", "search", "search-only",
	"search-p99", "search-step", "search-time", "search-confirm", "search-start", "sustain-at", "sustain-fraction",
	"sustain-duration", "lag-bound"}

// rewardsConfig builds the rewards workload's config from the flags.
func (f *benchFlags) rewardsConfig() (bench.RewardsConfig, error) {
	for _, name := range rewardsFlagsRefused {
		if f.set[name] {
			return bench.RewardsConfig{}, fmt.Errorf("bench: --%s does not apply to --workload rewards", name)
		}
	}
	cfg := bench.DefaultRewardsConfig()
	cfg.RouterURL, cfg.APIKey, cfg.ClusterSecret, cfg.Real = f.router, f.apiKey, f.clusterSecret, f.real
	cfg.Rate, cfg.Duration, cfg.AllowShed = f.rate, f.duration, f.allowShed
	cfg.LagSamples, cfg.ReadsDuration = f.lagSamples, f.readsDuration
	cfg.Progress = os.Stderr
	given(f, "openers", &cfg.Concurrency, f.openers)
	given(f, "users", &cfg.Users, f.users)
	if f.compare != "" {
		cfg.Modes = nil
		for _, m := range strings.Split(f.compare, ",") {
			if m = strings.TrimSpace(m); m != "" {
				cfg.Modes = append(cfg.Modes, m)
			}
		}
	}
	if f.configPath != "" && f.work {
		w, err := workSources(f.configPath, f.idleWindow)
		if err != nil {
			return cfg, err
		}
		cfg.Work = w
	}
	b, err := f.baseline()
	if err != nil {
		return cfg, err
	}
	cfg.Baseline = b
	return cfg, cfg.Validate()
}

// runRewardsBench runs the rewards workload, prints its report and writes
// report.json and report.md (--out, else var/bench/<time>/) and --json.
func runRewardsBench(ctx context.Context, f *benchFlags, args []string) error {
	cfg, err := f.rewardsConfig()
	if err != nil {
		return err
	}
	suite, runErr := bench.RunRewards(ctx, cfg)
	if runErr != nil && len(suite.Runs) == 0 {
		return runErr
	}
	if runErr == nil {
		suite.Bare = f.runBare(ctx, cfg.Work)
	}
	suite.Config = map[string]any{"args": args, "modes": cfg.Modes, "concurrency": cfg.Concurrency, "rate": cfg.Rate,
		"duration": cfg.Duration.String(), "users": cfg.Users}
	return writeSuiteReport(f, "rewards", suite.StartedAt, suite, runErr)
}

// benchReport is what a workload's suite gives writeSuiteReport.
type benchReport interface {
	WriteText(w io.Writer) error
	WriteSVG(w io.Writer) error
	OK() bool
	Problems() []string
}

// writeSuiteReport prints a workload's suite and writes its files:
// --json, and report.json and report.md in --out (else
// var/bench/<started>/). It returns runErr (stopped early) or the suite's
// problems as the command's error.
func writeSuiteReport(f *benchFlags, workload string, started time.Time, suite benchReport, runErr error) error {
	var text bytes.Buffer
	if err := suite.WriteText(&text); err != nil {
		return err
	}
	fmt.Print(text.String())
	if f.jsonPath != "" {
		if err := writeJSONFile(f.jsonPath, suite); err != nil {
			return err
		}
	}
	dir := f.outDir
	if dir == "" {
		dir = filepath.Join("var", "bench", started.Format("20060102-150405"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := writeJSONFile(filepath.Join(dir, bench.ReportJSONFile), suite); err != nil {
		return err
	}
	md := "# redcell bench: " + workload + "\n\n![chart](" + bench.ChartFile + ")\n\n```\n" + text.String() + "```\n"
	if err := os.WriteFile(filepath.Join(dir, bench.ReportMarkdownFile), []byte(md), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var svg bytes.Buffer
	if err := suite.WriteSVG(&svg); err != nil {
		return fmt.Errorf("bench: render %s: %w", bench.ChartFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, bench.ChartFile), svg.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s, %s and %s in %s\n", bench.ReportMarkdownFile, bench.ReportJSONFile, bench.ChartFile, dir)
	if runErr != nil {
		return fmt.Errorf("bench: stopped early: %w", runErr)
	}
	if !suite.OK() {
		return fmt.Errorf("bench FAILED: %s", strings.Join(suite.Problems(), "; "))
	}
	return nil
}
