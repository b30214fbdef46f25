package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/api"
	"redcell/bench"
	"redcell/cell/mover"
)

// The growing drills of docs/operations.md: cell_add adds a third cell to a
// cluster of two under the drill load and moves databases to it (redcell
// cells add: replication copy, freeze, verify, hand-over); cell_remove
// drains that cell back onto the other two and stops it. They share one
// cluster of their own (binlogs on, cell-3 configured with no shards), made
// by whichever runs first. The short run (make test) moves 3 databases each
// way; REDCELL_DRILL=full moves a third of them (33) under a longer load.

type growCluster struct {
	c *cluster
	d *drillDeps
	// dbKilled: when the drill killed a cell's MariaDB on purpose (zero:
	// never); from then on DB_UNAVAILABLE (until its standby serves) is an
	// answer it expects, before then not.
	dbKilled time.Time
}

// grow starts the growing drills' cluster once per TestDrill run.
type grow struct {
	once sync.Once
	g    *growCluster
}

func (gr *grow) get(t *testing.T, parent *testing.T) *growCluster {
	gr.once.Do(func() {
		d := startDrillDeps(parent)
		p := freePorts(parent, 1)
		d.sh(parent, fmt.Sprintf("stop_mariadb %[1]s/db1; stop_mariadb %[1]s/db2; REDCELL_BINLOG_ID=1 start_mariadb %[1]s/db1 %[2]d fast & a=$!; "+
			"REDCELL_BINLOG_ID=2 start_mariadb %[1]s/db2 %[3]d fast & b=$!; REDCELL_BINLOG_ID=3 start_mariadb %[1]s/db3 %[4]d fast & c=$!; wait $a; wait $b; wait $c",
			d.dir, d.dbPort[0], d.dbPort[1], p[0]))
		parent.Cleanup(func() { d.sh(parent, fmt.Sprintf("stop_mariadb %s/db3", d.dir)) })
		c := startClusterSpec(parent, clusterSpec{dsn: [2]string{d.dsn(0), d.dsn(1)}, third: fmt.Sprintf("root@tcp(127.0.0.1:%d)/", p[0]),
			mc: fmt.Sprintf("127.0.0.1:%d", d.mcPort), cell: drillCell + "  move_grace: 3s\n"})
		c.waitSchema(parent)
		gr.g = &growCluster{c: c, d: d}
	})
	if gr.g == nil {
		t.Fatal("the growing drills' cluster did not start")
	}
	return gr.g
}

// cellsRun runs redcell cells with args and the cluster's config, and
// decodes its --json report (the last JSON object it prints).
func (g *growCluster) cellsRun(t *testing.T, args ...string) moveReport {
	t.Helper()
	out, err := exec.Command(g.c.bin, append(append([]string{"cells"}, args...), "--config", g.c.config, "--json")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redcell cells %v: %v\n%s", args, err, out)
	}
	t.Logf("redcell cells %s:\n%s", strings.Join(args, " "), lastLines(string(out), 8))
	var rep moveReport
	if i := strings.LastIndex(string(out), "\n{"); i >= 0 {
		if err := json.NewDecoder(bytes.NewReader(out[i+1:])).Decode(&rep); err != nil {
			t.Fatalf("redcell cells %v: report: %v", args, err)
		}
	}
	return rep
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// state is a cell's ownership from its admin port.
func (g *growCluster) state(t *testing.T, cell string) api.MovesState {
	t.Helper()
	var st api.MovesState
	if err := json.Unmarshal([]byte(g.c.adminBody(t, cell, "GET", "/admin/moves", "")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// opensPerSec is the cluster's rate of claims made (redcell_cell_opens_total)
// over d, by cell.
func (g *growCluster) opensPerSec(t *testing.T, d time.Duration) map[string]float64 {
	cells := g.c.cells(false)
	before := map[string]float64{}
	for _, c := range cells {
		before[c] = g.c.metric(t, c, "redcell_cell_opens_total")
	}
	time.Sleep(d)
	out := map[string]float64{}
	for _, c := range cells {
		out[c] = (g.c.metric(t, c, "redcell_cell_opens_total") - before[c]) / d.Seconds()
	}
	return out
}

// underLoad runs the drill load while fn runs, and verifies it after. Half
// its senders have their wallets, and so their packets, in the databases
// dbs (those the drill moves), so that the moves happen under opens of
// their packets.
func (g *growCluster) underLoad(t *testing.T, name string, dbs []int, workers int, maxOps int64, fn func(l *drillLoad)) {
	prefix := name + randHex()
	l := newDrillLoad(t, g.c, prefix, 6, 300)
	for i := range 6 {
		db := dbs[i%len(dbs)]
		s := actIn(fmt.Sprintf("%s-m%d", prefix, i), db*10, db*10+9)
		body := map[string]any{"amount": l.deposit, "order_no": "dep-" + s}
		if a := l.settle(t, "POST", "/v1/accounts/"+s+"/deposit", body, nil); !a.ok() {
			t.Fatalf("deposit for %s: %+v", s, a)
		}
		l.senders = append(l.senders, s)
	}
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.runUntil(workers, stop, 10*time.Minute, maxOps) }()
	fn(l)
	close(stop)
	<-done
	if t.Failed() {
		return
	}
	codes := l.codes(time.Time{}, time.Now().Add(time.Hour))
	if !g.dbKilled.IsZero() {
		// Opens are recorded by their start: those begun in the 2 s before
		// the kill may be answered after it.
		if n := l.codes(time.Time{}, g.dbKilled.Add(-2*time.Second))["DB_UNAVAILABLE"]; n > 0 {
			t.Errorf("%s: %d opens begun more than 2 s before the database was killed answered DB_UNAVAILABLE", name, n)
		}
	}
	for code := range codes {
		if code != "OK" && code != "SOLD_OUT" && code != "EXPIRED" && !(answer{code: code}).retryLater() && !(!g.dbKilled.IsZero() && code == "DB_UNAVAILABLE") {
			t.Errorf("%s: clients saw %s (%d opens), not a retryable answer: %v", name, code, codes[code], codes)
		}
	}
	t.Logf("%s: %s; opens by answer: %v", name, l.verify(t), codes)
}

// copiesDropped waits until no cell keeps a copy of a database it handed
// over (move_grace 3 s), and checks none changed after its hand-over.
func (g *growCluster) copiesDropped(t *testing.T) {
	deadline := time.Now().Add(60 * time.Second)
	for _, cell := range g.c.cells(false) {
		for len(g.state(t, cell).MovedOut) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still keeps copies of databases it handed over: %+v", cell, g.state(t, cell).MovedOut)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if v := g.c.metric(t, cell, "redcell_cell_move_copy_changed_total"); v != 0 {
			t.Errorf("%s: %v copies of databases handed over changed after the hand-over (a write after the freeze)", cell, v)
		}
	}
}

// schemasOn lists the db_XX schemas on a cell's server.
func schemasOn(t *testing.T, dsn string) []int {
	db := openDB(t, dsn)
	rows, err := db.Query("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'db\\_%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var s string
		var n int
		_ = rows.Scan(&s)
		if _, err := fmt.Sscanf(s, "db_%d", &n); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func cellAddDrill(t *testing.T, g *growCluster, workers int, maxOps int64, full bool) {
	limit := 3
	if full {
		limit = 0
	}
	var rep moveReport
	var benchBefore, benchDuring, benchAfter bench.Report
	// The drill's load at its short size beside the festival bench (full):
	// both on this machine's two cores would otherwise saturate it.
	g.underLoad(t, "ca", []int{34, 35, 36}, min(workers, 8), maxOps, func(l *drillLoad) { // the first the plan moves
		time.Sleep(2 * time.Second)
		if full { // the festival workload (stress traffic) before the move, for its rate
			benchBefore = g.festival(t, "before", 10*time.Second)
		}
		before := g.opensPerSec(t, 3*time.Second)
		args := []string{"add", "--name", "cell-3"}
		if limit > 0 {
			args = append(args, "--limit", fmt.Sprint(limit))
		}
		var during chan bench.Report
		if full { // and through the move: the bench ends after it, and audits its own money
			during = make(chan bench.Report, 1)
			go func() { during <- g.festival(t, "during", 150*time.Second) }() // about the length of 33 moves here
			time.Sleep(5 * time.Second)
		}
		rep = g.cellsRun(t, args...)
		slowest := slices.Clone(rep.Moves)
		slices.SortFunc(slowest, func(a, b mover.Result) int { return int(b.Freeze - a.Freeze) })
		for _, m := range slowest[:min(3, len(slowest))] {
			ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
			t.Logf("cell_add: db_%02d %s → %s: %d rows, copy %s, catch-up %s, mark saved %s, writes paused %s (drain %s, binlog applied %s, verify %s in %d attempts, channel removed and sealed %s, adoption %s)",
				m.DB, m.From, m.To, m.Rows, ms(m.Copy), ms(m.CatchUp), ms(m.Prep), ms(m.Freeze), ms(m.Drain),
				ms(m.Applied), ms(m.Verify), m.Attempts, ms(m.Unlink), ms(m.HandOver))
		}
		after := g.opensPerSec(t, 3*time.Second)
		if full {
			benchDuring = <-during
			benchAfter = g.festival(t, "after", 10*time.Second)
		}
		t.Logf("cell_add: claims/s before %.0f %v, after %.0f %v", sum(before), before, sum(after), after)
		if after["cell-3"] == 0 {
			t.Errorf("cell-3 made no claims after it took %d databases: %v", rep.MovedTotal, after)
		}
	})
	if t.Failed() {
		return
	}
	st := g.state(t, "cell-3")
	want := 33
	if limit > 0 {
		want = limit
	}
	if len(st.DBs) != want || rep.MovedTotal != want {
		t.Fatalf("cell-3 owns %v after cells add (moved %d), want %d databases", st.DBs, rep.MovedTotal, want)
	}
	g.copiesDropped(t)
	for _, db := range st.DBs {
		if slices.Contains(schemasOn(t, g.c.spec.dsn[0]), db) || slices.Contains(schemasOn(t, g.c.spec.dsn[1]), db) {
			t.Errorf("db_%02d moved to cell-3, but its old owner's server still holds it after move_grace", db)
		}
	}
	// cell-1 started again reads what it owns from its database, not from
	// the config file (which still says 0-499).
	g.c.stop(t, "cell-1")
	g.c.restart(t, "cell-1")
	g.c.waitReady(t, 0)
	var released int64 // the version of cell-1's last release
	for _, m := range rep.Moves {
		if m.From == "cell-1" {
			released = max(released, m.Version)
		}
	}
	if s1 := g.state(t, "cell-1"); slices.ContainsFunc(st.DBs, func(db int) bool { return slices.Contains(s1.DBs, db) }) || s1.Version != released {
		t.Fatalf("cell-1 after a restart owns %s (v%d); cell-3 owns %v", s1.Shards, s1.Version, st.DBs)
	}
	if full && rep.FreezeP99 > time.Second {
		t.Errorf("writes paused per database p99 %s, target 1 s", rep.FreezeP99)
	}
	if full {
		byCell := func(r bench.Report) map[string]float64 {
			if r.CellMetrics == nil {
				return nil
			}
			return r.CellMetrics.ClaimsPerSecByCell
		}
		t.Logf("cell_add: festival bench (stress traffic, through the router): before the move %.1f opens/s %v; during it (%s) %.1f opens/s %v, open errors %v; after it %.1f opens/s %v (after/before %.2f)",
			benchBefore.OpensPerSec, byCell(benchBefore), time.Duration(benchDuring.ElapsedMS)*time.Millisecond, benchDuring.OpensPerSec, byCell(benchDuring),
			benchDuring.Open.Errors, benchAfter.OpensPerSec, byCell(benchAfter), benchAfter.OpensPerSec/max(benchBefore.OpensPerSec, 1))
		if byCell(benchAfter)["cell-3"] <= 0 {
			t.Errorf("the festival bench after the move shows no claims on cell-3: %v", byCell(benchAfter))
		}
	}
	t.Logf("cell_add: %d databases moved to cell-3 in %s; writes paused per database p50 %s, p99 %s, max %s (target p99 <= 1 s)",
		rep.MovedTotal, rep.TookTotal.Round(time.Millisecond), rep.FreezeP50.Round(time.Millisecond), rep.FreezeP99.Round(time.Millisecond), rep.FreezeMax.Round(time.Millisecond))
}

func cellRemoveDrill(t *testing.T, g *growCluster, workers int, maxOps int64) {
	if len(g.state(t, "cell-3").DBs) == 0 { // run alone: give it some first
		g.cellsRun(t, "add", "--name", "cell-3", "--limit", "2")
	}
	// Through the router's admin port this time (POST /admin/cells), as an
	// operator's tooling would.
	var job api.CellsJob
	g.underLoad(t, "cr", g.state(t, "cell-3").DBs, workers, maxOps, func(l *drillLoad) {
		time.Sleep(2 * time.Second)
		job = g.routerCells(t, `{"op":"remove","name":"cell-3"}`)
	})
	if t.Failed() {
		return
	}
	if st := g.state(t, "cell-3"); len(st.DBs) != 0 {
		t.Fatalf("cell-3 still owns %v after cells remove", st.DBs)
	}
	g.copiesDropped(t)
	g.c.stop(t, "cell-3")
	g.c.waitReady(t, 0)
	if rep := g.c.audit(t); !rep.OK() {
		t.Fatalf("audit after cell-3 stopped: %+v", rep)
	}
	t.Logf("cell_remove: cell-3 drained through POST /admin/cells in %s; cell-3 stopped; the map is whole and the audit clean; the job's last lines:\n%s",
		time.Duration(job.EndedMS-job.StartedMS)*time.Millisecond, strings.Join(job.Lines[max(0, len(job.Lines)-4):], "\n"))
}

// routerCells starts a change of the cells on the router's admin port and
// waits (up to 5 minutes) for it to end; it must end done.
func (g *growCluster) routerCells(t *testing.T, body string) api.CellsJob {
	t.Helper()
	call := func(method, b string) api.CellsJob {
		req, _ := http.NewRequest(method, g.c.routerAdmin+"/admin/cells", strings.NewReader(b))
		req.Header.Set("Authorization", "Bearer e2e-admin-token-0123")
		if b != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var job api.CellsJob
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(raw, &job) != nil {
			t.Fatalf("%s /admin/cells: %d %s", method, resp.StatusCode, raw)
		}
		return job
	}
	if job := call("POST", body); job.State != "running" {
		t.Fatalf("POST /admin/cells: %+v", job)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		job := call("GET", "")
		switch {
		case job.State == "done":
			return job
		case job.State != "running" || time.Now().After(deadline):
			t.Fatalf("the change ended %s: %s\n%s", job.State, job.Error, strings.Join(job.Lines, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// festival runs redcell bench's festival workload (stress traffic, through
// the router) for d, or until the load the drill runs beside it ends the
// test, and returns its report. The bench audits the shadow money it moved.
func (g *growCluster) festival(t *testing.T, name string, d time.Duration) bench.Report {
	t.Helper()
	dir := t.TempDir()
	// Open loop (--rate 200): a steady load under this machine's ceiling,
	// beside the drill's own load; closed loop, the two saturate its two
	// cores and every freeze waits behind the queues. No shadow tables
	// made first: the bench runs while databases move, and its own
	// traffic makes what it needs through the cells.
	cmd := exec.Command(g.c.bin, "bench", "--config", g.c.config, "--bare=false", "--workload", "festival", "--users", "2000", "--rate", "200",
		"--prepare-shadow=false", "--work=false", "--duration", d.String(), "--out", filepath.Join(dir, "out"), "--json", filepath.Join(dir, "run.json"), "--allow-shed")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("festival bench %s: %v\n%s", name, err, lastLines(string(b), 30))
		return bench.Report{}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		t.Errorf("festival bench %s: %v", name, err)
		return bench.Report{}
	}
	// A single run's report, or a suite of one run.
	var suite struct {
		Runs []bench.Report `json:"runs"`
	}
	if err := json.Unmarshal(raw, &suite); err == nil && len(suite.Runs) > 0 {
		return suite.Runs[0]
	}
	var r bench.Report
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Errorf("festival bench %s: report: %v", name, err)
	}
	return r
}

// planApplyDrill: redcell plan --cells 2 --apply, on the growing cluster
// after cell_add gave cell-3 some databases, plans them back to cell-1 and
// cell-2 (50 databases each). The
// first run stops after one moved database (--limit 1, the documented stop);
// the second resumes from the state file: it names the recorded run, skips
// the database already moved and moves the rest. Then every database is
// where the plan says (cell-3 owns none, cell-1 and cell-2 50 each), each
// was handed over once (runs' lines and the cells' adoptions) and the audit
// is clean.
func planApplyDrill(t *testing.T, g *growCluster) {
	had := g.state(t, "cell-3").DBs
	if len(had) == 0 {
		g.cellsRun(t, "add", "--name", "cell-3", "--limit", "2")
		had = g.state(t, "cell-3").DBs
	}
	had = slices.Sorted(slices.Values(had))
	adopted := func() float64 {
		return g.c.metric(t, "cell-1", `redcell_cell_move_steps_total{op="adopt"}`) + g.c.metric(t, "cell-2", `redcell_cell_move_steps_total{op="adopt"}`)
	}
	adoptedBefore := adopted()
	state := filepath.Join(t.TempDir(), "plan-state.json")
	moved := regexp.MustCompile(`db_(\d+) (\S+) → (\S+) \.\.\. \d+ rows`)
	firstTo := ""
	run := func(args ...string) (out string, dbs []int) {
		t.Helper()
		b, err := exec.Command(g.c.bin, append([]string{"plan", "--cells", "2", "--config", g.c.config, "--apply", "--state", state}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redcell plan --apply %v: %v\n%s", args, err, b)
		}
		t.Logf("redcell plan --cells 2 --apply %s:\n%s", strings.Join(args, " "), lastLines(string(b), 6))
		for _, m := range moved.FindAllStringSubmatch(string(b), -1) {
			db, _ := strconv.Atoi(m[1])
			if m[2] != "cell-3" || m[3] != "cell-1" && m[3] != "cell-2" {
				t.Errorf("plan moved db_%02d %s → %s, want from cell-3 to cell-1 or cell-2", db, m[2], m[3])
			}
			if firstTo == "" {
				firstTo = m[3]
			}
			dbs = append(dbs, db)
		}
		return string(b), dbs
	}
	_, first := run("--limit", "1")
	if len(first) != 1 {
		t.Fatalf("the first run moved %v, want one database (--limit 1)", first)
	}
	var f movesFile
	if b, err := os.ReadFile(state); err != nil || json.Unmarshal(b, &f) != nil || len(f.Moves) != len(had) || !slices.Equal(f.Done, first) {
		t.Fatalf("state file after the stopped run: %+v %v; want %d moves, done %v", f, err, len(had), first)
	}
	out, rest := run()
	if !strings.Contains(out, fmt.Sprintf("resuming the run recorded in %s: 1 of %d moves done", state, len(had))) ||
		!strings.Contains(out, fmt.Sprintf("db_%02d is on %s already", first[0], firstTo)) {
		t.Errorf("the second run did not resume the recorded one:\n%s", out)
	}
	all := append(slices.Clone(first), rest...)
	slices.Sort(all)
	if !slices.Equal(all, had) || slices.Contains(rest, first[0]) {
		t.Fatalf("moved %v then %v; want each of cell-3's %v once", first, rest, had)
	}
	if n := adopted() - adoptedBefore; n != float64(len(had)) {
		t.Errorf("cell-1 and cell-2 adopted %v databases over both runs, want %d (each once)", n, len(had))
	}
	for cell, want := range map[string]int{"cell-1": 50, "cell-2": 50, "cell-3": 0} {
		if st := g.state(t, cell); len(st.DBs) != want {
			t.Errorf("%s owns %d databases (%s) after the plan, want %d", cell, len(st.DBs), st.Shards, want)
		}
	}
	g.copiesDropped(t)
	if rep := g.c.audit(t); !rep.OK() {
		t.Fatalf("audit after the plan: %+v", rep)
	}
	t.Logf("plan_apply: %v moved back from cell-3 in two runs (stopped after %v, resumed from %s); audit clean", had, first, state)
}
