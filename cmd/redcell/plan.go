package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"redcell/bench"
)

// runPlan prints how many cells a target open rate needs:
//
//	redcell plan --target-opens-per-sec N [--per-cell-opens-per-sec R | --from report.json] [--headroom 0.7]
//
// cells = ceil(N / (R × headroom)), databases per cell = 100 / cells (whole
// databases of ten shards: the unit a cell owns), each cell's ranges, and the
// assumptions behind them. R is given, or read from a bench report: the best
// per-cell rate among its passing runs (bench.PerCellRateFrom).
func runPlan(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	target := fs.Float64("target-opens-per-sec", 0, "opens per second the cluster must sustain (required)")
	perCell := fs.Float64("per-cell-opens-per-sec", 0, "opens per second one cell sustains, as measured")
	from := fs.String("from", "", "read the per-cell rate from a bench report.json (or a --json report)")
	headroom := fs.Float64("headroom", bench.DefaultHeadroom, "fraction of the measured rate to plan each cell at, (0, 1]")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("plan: unexpected arguments %q", fs.Args())
	}
	if (*perCell > 0) == (*from != "") {
		return errors.New("plan: give exactly one of --per-cell-opens-per-sec and --from")
	}
	rate, source := *perCell, "given with --per-cell-opens-per-sec"
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if rate, source, err = bench.PerCellRateFrom(b); err != nil {
			return fmt.Errorf("plan: %s: %w", *from, err)
		}
		source = *from + ", " + source
	}
	p, err := bench.NewPlan(*target, rate, *headroom, source)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return p.WriteText(os.Stdout)
}
