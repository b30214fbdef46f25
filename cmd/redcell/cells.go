package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"redcell/api"
	"redcell/bench"
	"redcell/cell/mover"
	"redcell/internal/atomicfile"
	"redcell/model"
	"redcell/sharding"
)

// runCells: redcell cells status|add|remove|move|failback. Each works
// through the cells' admin ports and databases as the config names them
// (cell/mover).
func runCells(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("cells: give status, add, remove, move or failback (redcell cells add -h)")
	}
	op := args[0]
	fs := flag.NewFlagSet("cells "+op, flag.ContinueOnError)
	config := fs.String("config", "deploy/local/redcell.yaml", "cluster config: every cell with its dsn and admin_listen, and the admin_token")
	name := fs.String("name", "", "add: the new cell (in the config, running, owning nothing); remove: the cell to drain")
	db := fs.Int("db", -1, "move: the database (0..99) to move")
	to := fs.String("to", "", "move: the cell that takes it")
	state := fs.String("state", "", "the file that records a run's moves, so that a run stopped midway goes on where it was (default: beside the config)")
	freezeMax := fs.Duration("freeze-max", 10*time.Second, "the longest a database's writes may pause; a move that needs longer is undone")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	limit := fs.Int("limit", 0, "add, remove: move at most this many databases in this run (0: all); the next run goes on from there")
	cellName := fs.String("cell", "", "failback: the cell whose old primary is rebuilt as the standby of the promoted one")
	switchBack := fs.Bool("switch", false, "failback: once rebuilt and verified, switch the cell back to its primary (POST /admin/failover)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return err
	}
	fc, err := loadConfig(*config)
	if err != nil {
		return err
	}
	ex := newMoveExec(fc, *freezeMax)
	if op == "status" {
		return ex.status(ctx, os.Stdout)
	}
	if op == "failback" {
		return ex.failback(ctx, *cellName, *switchBack, *jsonOut)
	}
	moves, path, err := ex.prepare(ctx, api.CellsRequest{Op: op, Name: *name, DB: *db, To: *to}, *state, *config)
	if err != nil {
		return err
	}
	if err := ex.run(ctx, moves, path, *jsonOut, *limit); err != nil {
		return err
	}
	if st, err := ex.mv.State(ctx, ex.cells[*name]); err == nil && op == "remove" && len(st.DBs) == 0 {
		fmt.Printf("%s owns no database now: stop it (SIGTERM) and take it out of the config\n", *name)
	}
	return nil
}

// prepare plans the moves of a change (add, remove, move), or takes those of
// an earlier run of it that did not finish from its state file, and returns
// them with the state file's path.
func (ex *moveExec) prepare(ctx context.Context, req api.CellsRequest, state, config string) ([]bench.Move, string, error) {
	switch req.Op {
	case "move":
		if req.DB < 0 || req.DB >= model.DBCount || req.To == "" {
			return nil, "", errors.New("cells move: give the database (0..99) and the cell to move it to")
		}
		live, err := ex.live(ctx)
		if err != nil {
			return nil, "", err
		}
		from := ""
		for _, c := range live {
			if slices.Contains(c.dbs, req.DB) {
				from = c.name
			}
		}
		if from == "" {
			return nil, "", fmt.Errorf("cells move: no cell owns db_%02d", req.DB)
		}
		return []bench.Move{{DB: req.DB, From: from, To: req.To}}, statePath(state, config, "move"), nil
	case "add", "remove":
		if req.Name == "" {
			return nil, "", fmt.Errorf("cells %s: give the cell's name", req.Op)
		}
		path := statePath(state, config, req.Op+"-"+req.Name)
		moves, err := resumeMoves(path, req.Op, req.Name)
		if err != nil {
			return nil, "", err
		}
		if moves == nil {
			live, err := ex.live(ctx)
			if err != nil {
				return nil, "", err
			}
			if req.Op == "add" {
				moves, err = planAdd(live, req.Name)
			} else {
				moves, err = planRemove(live, req.Name)
			}
			if err != nil {
				return nil, "", err
			}
		}
		if err := saveMoves(path, movesFile{Op: req.Op, Cell: req.Name, Moves: moves}); err != nil {
			return nil, "", err
		}
		return moves, path, nil
	}
	return nil, "", fmt.Errorf("cells: unknown command %q (status, add, remove, move)", req.Op)
}

// moveExec runs moves with the config's cells.
type moveExec struct {
	out   io.Writer // progress lines (os.Stdout for the command)
	fc    fileConfig
	mv    *mover.Mover
	cells map[string]mover.Cell
	names []string
}

func newMoveExec(fc fileConfig, freezeMax time.Duration) *moveExec {
	ex := &moveExec{out: os.Stdout, fc: fc, cells: map[string]mover.Cell{},
		mv: &mover.Mover{Token: fc.AdminToken, FreezeMax: freezeMax, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
	for _, c := range fc.Cells {
		ex.cells[c.Name] = mover.Cell{Name: c.Name, AdminAddr: c.AdminListen, DSN: c.DSN, StandbyDSN: c.StandbyDSN}
		ex.names = append(ex.names, c.Name)
	}
	sort.Strings(ex.names)
	return ex
}

type liveCell struct {
	name    string
	dbs     []int
	version int64
}

// live reads every configured cell's ownership from its admin port.
func (ex *moveExec) live(ctx context.Context) ([]liveCell, error) {
	var out []liveCell
	for _, n := range ex.names {
		st, err := ex.mv.State(ctx, ex.cells[n])
		if err != nil {
			return nil, err
		}
		if len(st.Frozen) > 0 {
			return nil, fmt.Errorf("%s has frozen databases %v: a move is running (or stopped within its freeze; it ends by itself within a minute)", n, st.Frozen)
		}
		out = append(out, liveCell{name: n, dbs: st.DBs, version: st.Version})
	}
	owner := map[int]string{}
	for _, c := range out {
		for _, db := range c.dbs {
			if o, dup := owner[db]; dup {
				return nil, fmt.Errorf("db_%02d is owned by both %s and %s: a move did not finish its hand-over; see GET /admin/moves on both before any other move", db, o, c.name)
			}
			owner[db] = c.name
		}
	}
	return out, nil
}

func (ex *moveExec) status(ctx context.Context, w io.Writer) error {
	fmt.Fprintf(w, "%-10s %-8s %-5s %-24s %s\n", "cell", "version", "dbs", "shards", "moved out (copy kept until)")
	for _, n := range ex.names {
		st, err := ex.mv.State(ctx, ex.cells[n])
		if err != nil {
			fmt.Fprintf(w, "%-10s unreachable: %v\n", n, err)
			continue
		}
		var mo []string
		for _, m := range st.MovedOut {
			mo = append(mo, fmt.Sprintf("db_%02d (%s)", m.DB, time.UnixMilli(m.DropAtMS).Format(time.TimeOnly)))
		}
		shards := st.Shards
		if len(st.Frozen) > 0 {
			shards += fmt.Sprintf(" frozen %v", st.Frozen)
		}
		fmt.Fprintf(w, "%-10s %-8d %-5d %-24s %s\n", n, st.Version, len(st.DBs), shards, strings.Join(mo, ", "))
	}
	return nil
}

// planAdd moves databases onto the new cell until every cell holds its share
// (bench.PlanMoves over the live cells, the new one included).
func planAdd(live []liveCell, name string) ([]bench.Move, error) {
	var lc []bench.LiveCell
	found := false
	for _, c := range live {
		r, err := rangesString(c.dbs)
		if err != nil {
			return nil, err
		}
		if c.name == name {
			found = true
			if len(c.dbs) > 0 {
				return nil, fmt.Errorf("cells add: %s owns %s already", name, r)
			}
		}
		lc = append(lc, bench.LiveCell{Name: c.name, Shards: r})
	}
	if !found {
		return nil, fmt.Errorf("cells add: %s is not in the config: add its entry (shards: \"\") and start it first", name)
	}
	mp, err := bench.PlanMoves(lc, len(lc))
	if err != nil {
		return nil, err
	}
	return mp.Moves, nil
}

// planRemove spreads the cell's databases over the others, each to the
// cell holding the fewest at that point (ties: by name).
func planRemove(live []liveCell, name string) ([]bench.Move, error) {
	count := map[string]int{}
	var from []int
	var others []string
	for _, c := range live {
		if c.name == name {
			from = c.dbs
			continue
		}
		count[c.name] = len(c.dbs)
		others = append(others, c.name)
	}
	if len(others) == 0 {
		return nil, fmt.Errorf("cells remove: %s is the only cell", name)
	}
	if from == nil {
		if _, ok := count[name]; !ok && !slices.ContainsFunc(live, func(c liveCell) bool { return c.name == name }) {
			return nil, fmt.Errorf("cells remove: %s is not in the config", name)
		}
	}
	var moves []bench.Move
	for _, db := range from {
		best := others[0]
		for _, o := range others[1:] {
			if count[o] < count[best] {
				best = o
			}
		}
		count[best]++
		moves = append(moves, bench.Move{DB: db, From: name, To: best})
	}
	return moves, nil
}

// movesFile is a run's state: its moves, each marked done once handed over.
type movesFile struct {
	Op    string       `json:"op"`
	Cell  string       `json:"cell"`
	Moves []bench.Move `json:"moves"`
	Done  []int        `json:"done"` // databases handed over
}

func statePath(given, config, what string) string {
	if given != "" {
		return given
	}
	return filepath.Join(filepath.Dir(config), "cells-"+what+".json")
}

// resumeMoves returns the moves of an earlier run of the same op on the same
// cell that did not finish, or nil.
func resumeMoves(path, op, cell string) ([]bench.Move, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f movesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("cells: state file %s: %w", path, err)
	}
	if f.Op != op || f.Cell != cell || len(f.Done) == len(f.Moves) {
		return nil, nil
	}
	fmt.Printf("resuming the run recorded in %s: %d of %d moves done\n", path, len(f.Done), len(f.Moves))
	return f.Moves, nil
}

// saveMoves records a run's progress in path: whole or not at all, and
// durable (atomicfile.Write), so a crash never leaves a state file the
// resume cannot read.
func saveMoves(path string, f movesFile) error {
	b, _ := json.MarshalIndent(f, "", "  ")
	return atomicfile.Write(path, b, 0o600)
}

// moveReport is what a run prints with --json.
type moveReport struct {
	Moves      []mover.Result `json:"moves"`
	FreezeP50  time.Duration  `json:"freeze_p50_ns"`
	FreezeP99  time.Duration  `json:"freeze_p99_ns"`
	FreezeMax  time.Duration  `json:"freeze_max_ns"`
	TookTotal  time.Duration  `json:"took_ns"`
	MovedTotal int            `json:"moved"`
}

// run executes moves one database at a time, skipping those already handed
// over (a resumed run), with a progress line each; the state file records
// each one done.
func (ex *moveExec) run(ctx context.Context, moves []bench.Move, path string, jsonOut bool, limit int) error {
	for _, m := range moves {
		for _, n := range []string{m.From, m.To} {
			if _, ok := ex.cells[n]; !ok {
				return fmt.Errorf("cells: %s is not in the config", n)
			}
		}
	}
	var f movesFile
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &f)
	}
	f.Moves = moves
	began := time.Now()
	var rep moveReport
	for i, m := range moves {
		live, err := ex.live(ctx)
		if err != nil {
			return err
		}
		var version int64
		owner := ""
		for _, c := range live {
			version = max(version, c.version)
			if slices.Contains(c.dbs, m.DB) {
				owner = c.name
			}
		}
		bar := progressBar(i, len(moves))
		if owner == m.To {
			fmt.Fprintf(ex.out, "%s [%d/%d] db_%02d is on %s already\n", bar, i+1, len(moves), m.DB, m.To)
			if !slices.Contains(f.Done, m.DB) {
				f.Done = append(f.Done, m.DB)
			}
			continue
		}
		if limit > 0 && len(rep.Moves) == limit {
			fmt.Fprintf(ex.out, "%s stopped after %d moves (--limit); run the same command again to go on\n", bar, limit)
			break
		}
		if owner != m.From {
			return fmt.Errorf("cells: db_%02d is owned by %q, not %s as planned: plan again (remove %s)", m.DB, owner, m.From, path)
		}
		fmt.Fprintf(ex.out, "%s [%d/%d] db_%02d %s → %s ...", bar, i+1, len(moves), m.DB, m.From, m.To)
		res, err := ex.mv.Move(ctx, m.DB, ex.cells[m.From], ex.cells[m.To], version+1)
		if err != nil {
			fmt.Fprintln(ex.out, " failed")
			return fmt.Errorf("cells: db_%02d: %w (run the same command again to go on)", m.DB, err)
		}
		fmt.Fprintf(ex.out, " %d rows, copy %s, catch-up %s, writes paused %s (drain %s, verify %s)\n", res.Rows, res.Copy.Round(time.Millisecond),
			res.CatchUp.Round(time.Millisecond), res.Freeze.Round(time.Millisecond), res.Drain.Round(time.Millisecond), res.Verify.Round(time.Millisecond))
		rep.Moves = append(rep.Moves, res)
		f.Done = append(f.Done, m.DB)
		if err := saveMoves(path, f); err != nil {
			return err
		}
	}
	rep.TookTotal, rep.MovedTotal = time.Since(began), len(rep.Moves)
	if len(rep.Moves) > 0 {
		fr := make([]time.Duration, len(rep.Moves))
		for i, r := range rep.Moves {
			fr[i] = r.Freeze
		}
		slices.Sort(fr)
		rep.FreezeP50, rep.FreezeP99, rep.FreezeMax = fr[len(fr)/2], fr[min(len(fr)-1, len(fr)*99/100)], fr[len(fr)-1]
	}
	fmt.Fprintf(ex.out, "%s %d databases moved in %s; writes paused per database: p50 %s, p99 %s, max %s\n", progressBar(len(f.Done), len(moves)),
		rep.MovedTotal, rep.TookTotal.Round(time.Millisecond), rep.FreezeP50.Round(time.Millisecond), rep.FreezeP99.Round(time.Millisecond), rep.FreezeMax.Round(time.Millisecond))
	if jsonOut {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(ex.out, string(b))
	}
	return nil
}

func progressBar(done, total int) string {
	const width = 20
	n := 0
	if total > 0 {
		n = done * width / total
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func rangesString(dbs []int) (string, error) {
	r, err := sharding.RangesOfDBs(dbs)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// failbackReport is what redcell cells failback --json prints.
type failbackReport struct {
	Rebuilt mover.Rebuilt       `json:"rebuilt"`
	Switch  *api.FailoverAnswer `json:"switch,omitempty"`
}

// failback rebuilds the old primary of a cell that failed over as the
// standby of the server it serves from (mover.RebuildStandby), verified
// database by database, and with switchBack makes the cell serve from it
// again (POST /admin/failover on the cell's admin port).
func (ex *moveExec) failback(ctx context.Context, name string, switchBack, jsonOut bool) error {
	c, ok := ex.cells[name]
	if !ok {
		return fmt.Errorf("cells failback: give --cell, one of %v", ex.names)
	}
	fmt.Fprintf(ex.out, "rebuilding %s's old primary as the standby of its promoted server ...\n", name)
	rep := failbackReport{}
	var err error
	if rep.Rebuilt, err = ex.mv.RebuildStandby(ctx, c); err != nil {
		return err
	}
	r := rep.Rebuilt
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	how := "seeded in " + ms(r.Seed).String()
	if !r.Seeded {
		how = "it replicated from the promoted server already"
	}
	fmt.Fprintf(ex.out, "%s's old primary is the semi-synchronous standby of its promoted server (%s, caught up in %s); %d databases verified (%d rows) in %s, each frozen at most %s\n",
		name, how, ms(r.CatchUp), r.Verified, r.Rows, ms(r.Verify), ms(r.VerifyMax))
	if switchBack {
		var ans api.FailoverAnswer
		if err := ex.mv.Failover(ctx, c, &ans); err != nil {
			return err
		}
		rep.Switch = &ans
		fmt.Fprintf(ex.out, "%s serves from its primary again: caught up in %d ms, database calls paused %d ms (up to %s)\n", name, ans.CaughtUpMS, ans.PausedMS, ans.GTID)
		if ans.StandbyError != "" {
			fmt.Fprintf(ex.out, "warning: the old standby is not the primary's replica: %s (the cell has no standby until it is; docs/operations.md)\n", ans.StandbyError)
		}
	} else {
		fmt.Fprintf(ex.out, "to serve from the primary again: redcell cells failback --cell %s --switch\n", name)
	}
	if jsonOut {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(ex.out, "%s\n", b)
	}
	return nil
}
