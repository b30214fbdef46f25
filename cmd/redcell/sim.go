package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"redcell/sim"
)

// runSim runs the deterministic cluster simulation (package sim) for one or
// more seeds and exits non-zero on the first violation, printing its seed,
// the command that replays it, and its trace.
func runSim(_ context.Context, args []string) error { return simulate(args, os.Stdout) }

func simulate(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	seed := fs.Uint64("seed", 0, "first seed to run (0: fresh random seeds)")
	seeds := fs.Int("seeds", 1, "how many seeds to run: seed, seed+1, ... (or fresh ones)")
	steps := fs.Int("steps", 100_000, "workload operations per seed")
	auditEvery := fs.Int("audit-every", 0, "steps between full audits (0: the default)")
	grouped := fs.Bool("grouped", false, "run the cells as strategy grouped: ops of one database committed together (CommitGroup)")
	plant := fs.String("plant", "", `plant a bug to see the simulation find it: "credit-twice"`)
	shrinkRuns := fs.Int("shrink", 12, "on a violation, runs spent looking for fewer steps that fail the same way (0: none)")
	verbose := fs.Bool("v", false, "print what happened in each run, by kind")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}
	if *seeds < 1 {
		return errors.New("sim: --seeds must be >= 1")
	}
	list := make([]uint64, *seeds)
	for i := range list {
		if *seed != 0 {
			list[i] = *seed + uint64(i)
		} else {
			list[i] = freshSeed()
		}
	}
	fmt.Fprintf(out, "sim: %d seed(s) %v, %d steps each\n", len(list), list, *steps)
	for _, s := range list {
		cfg := sim.DefaultConfig(s, *steps)
		if *auditEvery > 0 {
			cfg.AuditEvery = *auditEvery
		}
		cfg.Grouped = *grouped
		switch *plant {
		case "":
		case "credit-twice":
			cfg.Plant = sim.PlantCreditTwice
		default:
			return fmt.Errorf("sim: unknown --plant %q", *plant)
		}
		start := time.Now() // reporting only: the run itself never reads the wall clock
		r := sim.Run(cfg)
		wall := time.Since(start)
		fmt.Fprintf(out, "seed %d: %d steps, %d ops, %d events, %s simulated, %s wall (%.0f ops/s), hash %s: %s\n",
			s, r.Steps, r.Ops, r.Events, r.SimTime, wall.Round(time.Millisecond), float64(r.Ops)/wall.Seconds(), r.Hash, verdict(r))
		if *verbose {
			printCounts(out, r.Counts)
		}
		if r.Violation != nil {
			explain(out, cfg, r.Violation, *shrinkRuns, *plant)
			return fmt.Errorf("sim: seed %d failed: %s", s, r.Violation.Check)
		}
	}
	return nil
}

func verdict(r sim.Result) string {
	if r.Violation == nil {
		return "OK"
	}
	return "FAILED"
}

// explain prints a violation, a shorter run that fails the same way if one
// is found, and the events of the shortest run that name its keys.
func explain(out io.Writer, cfg sim.Config, v *sim.Violation, shrinkRuns int, plant string) {
	fmt.Fprintf(out, "\n%v\n", v)
	flags := ""
	if plant != "" {
		flags += " --plant " + plant
	}
	fmt.Fprintf(out, "replay: redcell sim --seed %d --steps %d%s\n", v.Seed, v.Steps, flags)
	if shrinkRuns > 0 {
		short, sv := sim.Shrink(cfg, v, shrinkRuns)
		if short.Steps < cfg.Steps {
			fmt.Fprintf(out, "shortest run found failing the same check: redcell sim --seed %d --steps %d%s\n  %v\n", v.Seed, short.Steps, flags, sv)
			cfg, v = short, sv
		}
	}
	trace, again := sim.Explain(cfg, v)
	same := "the replay failed the same way"
	if !sim.Same(v, again) {
		same = fmt.Sprintf("the replay did NOT fail the same way (%v): the simulation is not deterministic", again)
	}
	fmt.Fprintf(out, "trace: %d events naming %s (%s):\n", len(trace), strings.Join(v.Keys, ", "), same)
	for _, l := range trace {
		fmt.Fprintf(out, "  %s\n", l)
	}
}

func printCounts(out io.Writer, counts map[string]int64) {
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(out, "  %-36s %d\n", k, counts[k])
	}
}

// freshSeed is a random seed that is never 0 (0 asks for fresh seeds).
func freshSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])>>1 | 1
}
