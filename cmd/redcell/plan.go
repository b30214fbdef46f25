package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"redcell/api"
	"redcell/bench"
	"redcell/model"
)

// runPlan prints how many cells a target open rate needs:
//
//	redcell plan --target-opens-per-sec N [--per-cell-opens-per-sec R | --from report.json] [--headroom 0.7] [--config F]
//	redcell plan --cells N --config F [--rate-window D] [--json] [--apply [--limit K] [--state FILE]]
//
// cells = ceil(N / (R × headroom)), databases per cell = 100 / cells (whole
// databases of ten shards: the unit a cell owns), each cell's ranges, and the
// assumptions behind them. R is given, or read from a bench report: the best
// per-cell rate among its passing runs (bench.PerCellRateFrom). With
// --config it also reads the live shard map from the config's router
// (GET /healthz) and prints which databases move from which cell to which
// for that many cells, or for --cells (bench.PlanMoves: by database counts;
// with --rate-window, bench.PlanMovesByRate: by each database's rate of
// money operations, read from every cell's redcell_cell_db_ops_total at the
// start and the end of the window); --apply runs those
// moves one database at a time, as redcell cells does (cell/mover), with a
// progress line each and a state file a stopped run resumes from.
func runPlan(ctx context.Context, args []string) error {
	f, err := parsePlanFlags(args)
	if err != nil {
		return err
	}
	n := f.cells
	if f.target > 0 {
		if n, err = f.capacityPlan(); err != nil {
			return err
		}
	}
	if f.config == "" {
		return nil
	}
	fc, mp, err := f.planMoves(ctx, n)
	if err != nil {
		return err
	}
	if !f.apply {
		return nil
	}
	return f.applyMoves(ctx, fc, mp, n)
}

// planFlags are the command line of redcell plan (see runPlan).
type planFlags struct {
	target, perCell float64
	from            string
	headroom        float64
	config          string
	cells           int
	apply           bool
	state           string
	limit           int
	rateWindow      time.Duration
	jsonOut         bool
}

// parsePlanFlags reads the command line of redcell plan and refuses the
// combinations it cannot plan.
func parsePlanFlags(args []string) (*planFlags, error) {
	f := &planFlags{}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.Float64Var(&f.target, "target-opens-per-sec", 0, "opens per second the cluster must sustain")
	fs.Float64Var(&f.perCell, "per-cell-opens-per-sec", 0, "opens per second one cell sustains, as measured")
	fs.StringVar(&f.from, "from", "", "read the per-cell rate from a bench report.json (or a --json report)")
	fs.Float64Var(&f.headroom, "headroom", bench.DefaultHeadroom, "fraction of the measured rate to plan each cell at, (0, 1]")
	fs.StringVar(&f.config, "config", "", "cluster config: read the live shard map from its router and print the databases to move")
	fs.IntVar(&f.cells, "cells", 0, "plan the moves for this many cells (with --config; default: the count the target needs)")
	fs.BoolVar(&f.apply, "apply", false, "run the planned moves, one database at a time (redcell cells): every cell of the plan must be in the config and running")
	fs.StringVar(&f.state, "state", "", "with --apply: the file that records the moves done, so that a stopped run goes on (default: cells-plan.json beside the config)")
	fs.IntVar(&f.limit, "limit", 0, "with --apply: move at most this many databases now (0: all)")
	fs.DurationVar(&f.rateWindow, "rate-window", 0, "with --config: plan the moves by each database's measured rate of money operations over this window (the cells' redcell_cell_db_ops_total read at its start and end), not by database counts")
	fs.BoolVar(&f.jsonOut, "json", false, "with --config: print the plan of moves as JSON (after the text)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errUsage
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("plan: unexpected arguments %q", fs.Args())
	}
	if f.target <= 0 && f.cells <= 0 {
		return nil, errors.New("plan: give --target-opens-per-sec (the capacity plan), or --cells with --config (the moves)")
	}
	if f.cells > 0 && f.config == "" {
		return nil, errors.New("plan: --cells plans moves: it needs --config (the live shard map)")
	}
	if f.target > 0 && (f.perCell > 0) == (f.from != "") {
		return nil, errors.New("plan: give exactly one of --per-cell-opens-per-sec and --from")
	}
	return f, nil
}

// capacityPlan prints the capacity plan for --target-opens-per-sec and
// returns the cells to plan the moves for: --cells, else the count the
// target needs.
func (f *planFlags) capacityPlan() (int, error) {
	rate, source := f.perCell, "given with --per-cell-opens-per-sec"
	if f.from != "" {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return 0, fmt.Errorf("plan: %w", err)
		}
		if rate, source, err = bench.PerCellRateFrom(b); err != nil {
			return 0, fmt.Errorf("plan: %s: %w", f.from, err)
		}
		source = f.from + ", " + source
	}
	p, err := bench.NewPlan(f.target, rate, f.headroom, source)
	if err != nil {
		return 0, fmt.Errorf("plan: %w", err)
	}
	if err := p.WriteText(os.Stdout); err != nil {
		return 0, err
	}
	if f.cells == 0 {
		return p.Cells, nil
	}
	return f.cells, nil
}

// planMoves reads the live shard map of --config, plans the moves for n
// cells (by database counts, or with --rate-window by measured rates) and
// prints them, as JSON too with --json.
func (f *planFlags) planMoves(ctx context.Context, n int) (fileConfig, bench.MovePlan, error) {
	var mp bench.MovePlan
	live, err := liveMap(ctx, f.config)
	if err != nil {
		return fileConfig{}, mp, fmt.Errorf("plan: %w", err)
	}
	fc, err := loadConfig(f.config)
	if err != nil {
		return fileConfig{}, mp, err
	}
	if f.rateWindow > 0 {
		rates, rerr := measureDBRates(ctx, fc, f.rateWindow)
		if rerr != nil {
			return fc, mp, fmt.Errorf("plan: %w", rerr)
		}
		writeRates(os.Stdout, rates, f.rateWindow)
		mp, err = bench.PlanMovesByRate(live, n, rates)
	} else {
		mp, err = bench.PlanMoves(live, n)
	}
	if err != nil {
		return fc, mp, fmt.Errorf("plan: %w", err)
	}
	how := "by database counts"
	if mp.ByRate {
		how = fmt.Sprintf("by measured rates, within %.0f %% of the mean", 100*bench.RateTolerance)
	}
	fmt.Printf("\nmoves for %d cells, from the live map of %s (%s):\n", n, f.config, how)
	if err := mp.WriteText(os.Stdout); err != nil {
		return fc, mp, err
	}
	if f.jsonOut {
		b, err := json.MarshalIndent(mp, "", "  ")
		if err != nil {
			return fc, mp, err
		}
		fmt.Printf("%s\n", b)
	}
	return fc, mp, nil
}

// applyMoves runs the planned moves for n cells (--apply), resuming from
// the state file of an earlier stopped run when there is one.
func (f *planFlags) applyMoves(ctx context.Context, fc fileConfig, mp bench.MovePlan, n int) error {
	path := statePath(f.state, f.config, "plan")
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
	return newMoveExec(fc, 10*time.Second).run(ctx, moves, path, false, f.limit)
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

// measureDBRates reads redcell_cell_db_ops_total from every configured cell's
// admin port (GET /metrics) at the start and the end of window, and returns
// each database's operations a second over it (summed over the cells: a
// database moved in the window counts on both). A counter that went back (a
// cell restarted) counts from zero. Errors: a cell whose metrics cannot be
// read.
func measureDBRates(ctx context.Context, fc fileConfig, window time.Duration) (map[int]float64, error) {
	read := func() (map[int]float64, error) {
		out := map[int]float64{}
		for _, c := range fc.Cells {
			if c.AdminListen == "" {
				return nil, fmt.Errorf("cell %s has no admin_listen: its rates cannot be read", c.Name)
			}
			counts, err := dbOpsOf(ctx, "http://"+c.AdminListen+"/metrics")
			if err != nil {
				return nil, fmt.Errorf("cell %s: %w", c.Name, err)
			}
			for db, n := range counts {
				out[db] += n
			}
		}
		return out, nil
	}
	before, err := read()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(window):
	}
	after, err := read()
	if err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	rates := map[int]float64{}
	for db, n := range after {
		d := n - before[db]
		if d < 0 {
			d = n
		}
		rates[db] = d / secs
	}
	return rates, nil
}

// dbOpsOf reads the redcell_cell_db_ops_total series of one cell's metrics.
func dbOpsOf(ctx context.Context, url string) (map[int]float64, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	out := map[int]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const prefix = `redcell_cell_db_ops_total{db="`
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		dbText, rest, ok := strings.Cut(line[len(prefix):], `"} `)
		db, derr := strconv.Atoi(dbText)
		v, verr := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if !ok || derr != nil || verr != nil || db < 0 || db >= model.DBCount {
			return nil, fmt.Errorf("%s: bad series %q", url, line)
		}
		out[db] = v
	}
	return out, sc.Err()
}

// writeRates prints the measured rates: the total and the hottest databases.
func writeRates(w io.Writer, rates map[int]float64, window time.Duration) {
	var total float64
	dbs := make([]int, 0, len(rates))
	for db, r := range rates {
		total += r
		if r > 0 {
			dbs = append(dbs, db)
		}
	}
	slices.SortFunc(dbs, func(a, b int) int { return cmp.Compare(rates[b], rates[a]) })
	fmt.Fprintf(w, "\nmeasured over %s: %.1f money operations a second in %d databases", window, total, len(dbs))
	if len(dbs) > 0 {
		fmt.Fprintf(w, "; hottest:")
		for _, db := range dbs[:min(5, len(dbs))] {
			fmt.Fprintf(w, " db_%02d %.1f/s", db, rates[db])
		}
	}
	fmt.Fprintln(w)
}
