package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"redcell/bench"
	"redcell/model"
)

// runBench drives load through the router, prints the text report to stdout
// and, with --json FILE, writes the JSON report there too. It returns an error
// when the run fails (see bench.Report.OK), so the exit status tells CI.
func runBench(ctx context.Context, args []string) error {
	def := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	router := fs.String("router", def.RouterURL, "base URL of the router")
	senders := fs.Int("senders", def.Senders, "accounts that send packets")
	openers := fs.Int("openers", def.Openers, "concurrent openers, each its own account")
	duration := fs.Duration("duration", def.Duration, "how long senders and openers run")
	amount := fs.Int64("amount", def.PacketAmount, "cents per packet")
	count := fs.Int64("count", def.PacketCount, "shares per packet")
	configPath := fs.String("config", "", "cluster config file; when set, audit money conservation after the load")
	jsonPath := fs.String("json", "", "also write the report as JSON to this file")
	allowShed := fs.Bool("allow-shed", false, "accept OVERLOADED/TIMEOUT answers as load shedding instead of failing the run")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage // the flag set printed its usage; nothing more to say
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}

	cfg := def
	cfg.RouterURL, cfg.Senders, cfg.Openers, cfg.Duration = *router, *senders, *openers, *duration
	cfg.PacketAmount, cfg.PacketCount, cfg.AllowShed = *amount, *count, *allowShed
	cfg.Progress = os.Stderr
	if path := *configPath; path != "" {
		cfg.Audit = func(ctx context.Context) (model.AuditReport, error) { return auditCluster(ctx, path) }
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	rep, runErr := bench.Run(ctx, cfg)
	if runErr != nil && rep.RunID == "" {
		return runErr // nothing ran
	}
	if err := rep.WriteText(os.Stdout); err != nil {
		return fmt.Errorf("bench: write report: %w", err)
	}
	if *jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("bench: encode report: %w", err)
		}
		if err := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if runErr != nil {
		return fmt.Errorf("bench: stopped early: %w", runErr)
	}
	if !rep.OK() {
		return fmt.Errorf("bench FAILED: %s", strings.Join(rep.Problems(), "; "))
	}
	return nil
}
