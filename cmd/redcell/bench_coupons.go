package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"redcell/bench"
)

// The coupons workload (bench.RunCoupons) measures accepts, the
// accepted→issued latency and merged deduction, apart from the suites of
// the packet workloads.

// couponsFlagsRefused are the flags that mean nothing to the coupons
// workload: given, they are refused, not ignored.
var couponsFlagsRefused = []string{"senders", "max-inflight", "packets", "amount", "count", "direct", "compare-direct", "limits",
	"limits-duration", "limits-concurrency", "wrk", "router-pprof", "search", "search-only",
	"search-p99", "search-step", "search-time", "search-confirm", "search-start", "sustain-at", "sustain-duration", "lag-bound",
	"compare", "users", "lag-samples", "reads-duration"}

// couponsConfig builds the coupons workload's config from the flags and
// --config (the cells' admin ports, token and metrics).
func (f *benchFlags) couponsConfig() (bench.CouponsConfig, error) {
	for _, name := range couponsFlagsRefused {
		if f.set[name] {
			return bench.CouponsConfig{}, fmt.Errorf("bench: --%s does not apply to --workload coupons", name)
		}
	}
	if f.configPath == "" {
		return bench.CouponsConfig{}, errors.New("bench: --workload coupons needs --config: it reads the cells' metrics and switches them through their admin ports")
	}
	cfg := bench.DefaultCouponsConfig()
	cfg.RouterURL, cfg.APIKey, cfg.ClusterSecret, cfg.Real = f.router, f.apiKey, f.clusterSecret, f.real
	cfg.Duration, cfg.MergeBacklog, cfg.HotShare = f.duration, f.mergeBacklog, f.hotShare
	cfg.Progress = os.Stderr
	given(f, "openers", &cfg.Concurrency, f.openers)
	given(f, "rate", &cfg.Rate, f.rate)
	given(f, "sustain-fraction", &cfg.SustainFraction, f.sustain.Fraction)
	fc, err := loadConfig(f.configPath)
	if err != nil {
		return cfg, err
	}
	cfg.AdminToken = fc.AdminToken
	for _, c := range fc.Cells {
		if c.AdminListen != "" {
			cfg.AdminURLs = append(cfg.AdminURLs, "http://"+c.AdminListen)
		}
	}
	if cfg.Metrics, err = metricsTargets(f.configPath); err != nil {
		return cfg, err
	}
	if f.work {
		if cfg.Work, err = workSources(f.configPath, f.idleWindow); err != nil {
			return cfg, err
		}
	}
	if cfg.Baseline, err = f.baseline(); err != nil {
		return cfg, err
	}
	if b := cfg.Baseline; b != nil {
		if b.Cells, err = metricsTargets(f.baselinePath); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.Validate()
}

// runCouponsBench runs the coupons workload, prints its report and writes
// report.json and report.md (--out, else var/bench/<time>/) and --json.
func runCouponsBench(ctx context.Context, f *benchFlags, args []string) error {
	cfg, err := f.couponsConfig()
	if err != nil {
		return err
	}
	suite, runErr := bench.RunCoupons(ctx, cfg)
	if runErr != nil && len(suite.Runs) == 0 {
		return runErr
	}
	if runErr == nil {
		suite.Bare = f.runBare(ctx, cfg.Work)
	}
	suite.Config = map[string]any{"args": args, "concurrency": cfg.Concurrency, "duration": cfg.Duration.String(), "hot": cfg.Hot,
		"cold": cfg.Cold, "hot_share": cfg.HotShare, "merge_backlog": cfg.MergeBacklog, "sustain_fraction": cfg.SustainFraction}
	return writeSuiteReport(f, "coupons", suite.StartedAt, suite, runErr)
}
