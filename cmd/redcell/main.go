// Command redcell runs every part of a redcell cluster:
//
//	redcell cell   --config FILE --name NAME   one cell (SET)
//	redcell router --config FILE               the stateless router
//	redcell audit  --config FILE [--json]      prove money conservation across cells
//	redcell bench  [flags]                     drive load through the router
//	redcell plan   --target-opens-per-sec N    cells needed for a target load
//	redcell cells  status|add|remove|move      grow and shrink the cluster: move databases between cells
//	redcell apikey add|list|revoke             the API keys of the calling apps
//	redcell sim    --seed N --steps M           deterministic simulation of a cluster
//	redcell rewards keygen|rotate|reissue       reward token keys; re-issue rewards from a CSV
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: redcell <command> [flags]

commands:
  cell     run one cell:              redcell cell --config FILE --name cell-1
  router   run the router:            redcell router --config FILE
  audit    check money conservation:  redcell audit --config FILE
  bench    drive load via the router: redcell bench --router http://127.0.0.1:8080 --config FILE
  plan     cells for a target load:   redcell plan --target-opens-per-sec 100000 --from report.json
  cells    move databases:            redcell cells add --config FILE --name cell-3 | remove | move | status | failback --cell cell-2 [--switch]
  apikey   the callers' API keys:     redcell apikey add --keys FILE --app NAME --scopes all
  sim      simulate a cluster:        redcell sim --seed 1 --steps 100000 [--seeds 3]
  rewards  reward keys and reissue:   redcell rewards keygen --out FILE | rotate | reissue
  healthcheck  a container's probe:   redcell healthcheck http://127.0.0.1:8080/healthz

Run 'redcell <command> -h' for the flags of a command.`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "redcell:", err)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "cell":
		return runCell(ctx, args[1:])
	case "router":
		return runRouter(ctx, args[1:])
	case "audit":
		return runAudit(ctx, args[1:])
	case "bench":
		return runBench(ctx, args[1:])
	case "plan":
		return runPlan(ctx, args[1:])
	case "cells":
		return runCells(ctx, args[1:])
	case "apikey":
		return runAPIKey(args[1:])
	case "sim":
		return runSim(ctx, args[1:])
	case "rewards":
		return runRewards(ctx, args[1:])
	case "healthcheck":
		return runHealthcheck(ctx, args[1:])
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	}
	fmt.Fprintln(os.Stderr, usage)
	return errUsage
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
