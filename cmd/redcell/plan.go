package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"redcell/api"
	"redcell/bench"
)

// runPlan prints how many cells a target open rate needs:
//
//	redcell plan --target-opens-per-sec N [--per-cell-opens-per-sec R | --from report.json] [--headroom 0.7] [--config F]
//	redcell plan --cells N --config F [--apply [--limit K] [--state FILE]]
//
// cells = ceil(N / (R × headroom)), databases per cell = 100 / cells (whole
// databases of ten shards: the unit a cell owns), each cell's ranges, and the
// assumptions behind them. R is given, or read from a bench report: the best
// per-cell rate among its passing runs (bench.PerCellRateFrom). With
// --config it also reads the live shard map from the config's router
// (GET /healthz) and prints which databases move from which cell to which
// for that many cells, or for --cells (bench.PlanMoves); --apply runs those
// moves one database at a time, as redcell cells does (cell/mover), with a
// progress line each and a state file a stopped run resumes from.
func runPlan(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	target := fs.Float64("target-opens-per-sec", 0, "opens per second the cluster must sustain")
	perCell := fs.Float64("per-cell-opens-per-sec", 0, "opens per second one cell sustains, as measured")
	from := fs.String("from", "", "read the per-cell rate from a bench report.json (or a --json report)")
	headroom := fs.Float64("headroom", bench.DefaultHeadroom, "fraction of the measured rate to plan each cell at, (0, 1]")
	config := fs.String("config", "", "cluster config: read the live shard map from its router and print the databases to move")
	cells := fs.Int("cells", 0, "plan the moves for this many cells (with --config; default: the count the target needs)")
	apply := fs.Bool("apply", false, "run the planned moves, one database at a time (redcell cells): every cell of the plan must be in the config and running")
	state := fs.String("state", "", "with --apply: the file that records the moves done, so that a stopped run goes on (default: cells-plan.json beside the config)")
	limit := fs.Int("limit", 0, "with --apply: move at most this many databases now (0: all)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("plan: unexpected arguments %q", fs.Args())
	}
	if *target <= 0 && *cells <= 0 {
		return errors.New("plan: give --target-opens-per-sec (the capacity plan), or --cells with --config (the moves)")
	}
	if *cells > 0 && *config == "" {
		return errors.New("plan: --cells plans moves: it needs --config (the live shard map)")
	}
	n := *cells
	if *target > 0 {
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
		if err := p.WriteText(os.Stdout); err != nil {
			return err
		}
		if n == 0 {
			n = p.Cells
		}
	}
	if *config == "" {
		return nil
	}
	live, err := liveMap(ctx, *config)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	mp, err := bench.PlanMoves(live, n)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	fmt.Printf("\nmoves for %d cells, from the live map of %s:\n", n, *config)
	if err := mp.WriteText(os.Stdout); err != nil || !*apply {
		return err
	}
	fc, err := loadConfig(*config)
	if err != nil {
		return err
	}
	path := statePath(*state, *config, "plan")
	moves := mp.Moves
	if resumed, err := resumeMoves(path, "plan", fmt.Sprint(n)); err != nil {
		return err
	} else if resumed != nil {
		moves = resumed
	}
	if err := saveMoves(path, movesFile{Op: "plan", Cell: fmt.Sprint(n), Moves: moves}); err != nil {
		return err
	}
	fmt.Printf("\napplying %d moves (state in %s):\n", len(moves), path)
	return newMoveExec(fc, 10*time.Second).run(ctx, moves, path, false, *limit)
}

// liveMap reads the cells and their shard ranges from the router of the
// config (GET /healthz, which needs no key).
func liveMap(ctx context.Context, path string) ([]bench.LiveCell, error) {
	fc, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	rc, err := fc.routerConfig()
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if rc.TLSCert != "" {
		scheme = "https"
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, scheme+"://"+rc.Listen+api.HealthPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the live map from the router at %s: %w", rc.Listen, err)
	}
	defer resp.Body.Close()
	var h struct {
		Cells []bench.LiveCell `json:"cells"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the router's /healthz at %s: status %d, %v", rc.Listen, resp.StatusCode, err)
	}
	return h.Cells, nil
}
