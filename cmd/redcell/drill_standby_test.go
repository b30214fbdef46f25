package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"redcell/cell/mover"
)

// cellAddStandbyDrill grows a cluster set up for production: each of its
// three cells' MariaDB has a semi-synchronous standby (services.sh
// start_standby), cell-3 starts owning nothing, and redcell cells add moves
// databases to it under the drill load. Right after the last hand-over
// cell-3's primary is killed with SIGKILL for good: its standby, which took
// the copies through cell-3's binlog and was checked before each freeze, is
// promoted (failover_after 3 s) and serves the moved databases. The load's
// verify (every answered send, claim and credit there once) and the audit
// over the promoted standby end it; the sources' standbys dropped their
// copies with their primaries.
func cellAddStandbyDrill(t *testing.T, workers int, maxOps int64, full bool) {
	limit := 2
	if full {
		limit = 10
	}
	d := startDrillDeps(t)
	p := freePorts(t, 4) // cell-3's primary, then the three standbys
	d.sh(t, fmt.Sprintf("stop_mariadb %[1]s/db1; stop_mariadb %[1]s/db2; "+
		"REDCELL_REPL_ID=1 start_mariadb %[1]s/db1 %[2]d fast & a=$!; REDCELL_REPL_ID=2 start_mariadb %[1]s/db2 %[3]d fast & b=$!; "+
		"REDCELL_REPL_ID=3 start_mariadb %[1]s/db3 %[4]d fast & c=$!; wait $a; wait $b; wait $c; "+
		"start_standby %[1]s/sb1 %[5]d %[2]d 11 fast & a=$!; start_standby %[1]s/sb2 %[6]d %[3]d 12 fast & b=$!; "+
		"start_standby %[1]s/sb3 %[7]d %[4]d 13 fast & c=$!; wait $a; wait $b; wait $c",
		d.dir, d.dbPort[0], d.dbPort[1], p[0], p[1], p[2], p[3]))
	t.Cleanup(func() {
		d.sh(t, fmt.Sprintf("stop_mariadb %[1]s/db3 & a=$!; stop_mariadb %[1]s/sb1 & b=$!; stop_mariadb %[1]s/sb2 & c=$!; stop_mariadb %[1]s/sb3; wait $a $b $c", d.dir))
	})
	dsn := func(port int) string { return fmt.Sprintf("root@tcp(127.0.0.1:%d)/", port) }
	primaries := []string{d.dsn(0), d.dsn(1), dsn(p[0])}
	standbys := []string{dsn(p[1]), dsn(p[2]), dsn(p[3])}
	c := startClusterSpec(t, clusterSpec{dsn: [2]string{primaries[0], primaries[1]}, standby: [2]string{standbys[0], standbys[1]},
		third: primaries[2], thirdStandby: standbys[2], mc: fmt.Sprintf("127.0.0.1:%d", d.mcPort),
		cell: drillCell + "  failover_after: 3s\n  move_grace: 3s\n"})
	c.waitSchema(t)
	// The standbys replay the warm-up's CREATE TABLEs one at a time; the
	// drill is about money rows, so it starts once they have caught up.
	for i := range primaries {
		standbyCaughtUp(t, primaries[i], standbys[i])
	}
	g := &growCluster{c: c, d: d}
	var rep moveReport
	var again time.Duration
	var moved []int
	// The load's senders live in the databases the plan moves first (as in
	// cell_add), so the moves happen under opens of their packets.
	g.underLoad(t, "cs", []int{34, 35, 36}, min(workers, 8), maxOps, func(l *drillLoad) {
		time.Sleep(2 * time.Second)
		rep = g.cellsRun(t, "add", "--name", "cell-3", "--limit", fmt.Sprint(limit))
		g.dbKilled = time.Now()
		d.killDB(t, 2) // cell-3's primary, right after the hand-overs
		for _, m := range rep.Moves {
			moved = append(moved, m.DB)
		}
		if len(moved) == 0 {
			t.Errorf("cells add moved nothing")
			return
		}
		again = waitServes(t, c, actIn("probe-cs", moved[0]*10, moved[0]*10+9), 90*time.Second)
		time.Sleep(3 * time.Second) // the load goes on against the promoted standby
	})
	if t.Failed() {
		return
	}
	slices.Sort(moved)
	st := g.state(t, "cell-3")
	if rep.MovedTotal != limit || !slices.Equal(st.DBs, moved) {
		t.Fatalf("cell-3 owns %v after cells add --limit %d (moved %d: %v)", st.DBs, limit, rep.MovedTotal, moved)
	}
	if v := c.metric(t, "cell-3", "redcell_cell_db_on_standby"); v != 1 {
		t.Fatalf("cell-3 serves again after its primary's kill, but redcell_cell_db_on_standby is %v, want 1 (promoted)", v)
	}
	for _, m := range rep.Moves {
		if m.StandbyCheck <= 0 || m.StandbyTail <= 0 {
			t.Errorf("db_%02d moved to cell-3 without its standby checked (%s before the freeze) or caught up in the freeze (%s)", m.DB, m.StandbyCheck, m.StandbyTail)
		}
	}
	g.copiesDropped(t)
	for i, sb := range standbys[:2] {
		standbyCaughtUp(t, primaries[i], sb) // the DROPs applied
		if have := schemasOn(t, sb); slices.ContainsFunc(moved, func(db int) bool { return slices.Contains(have, db) }) {
			t.Errorf("cell-%d's standby still holds moved databases after its primary dropped them: %v", i+1, have)
		}
	}
	if have := schemasOn(t, standbys[2]); !slices.Equal(have, moved) {
		t.Errorf("cell-3's promoted standby holds %v, not exactly the moved databases %v", have, moved)
	}
	if full && rep.FreezeP99 > time.Second {
		t.Errorf("writes paused per database p99 %s, target 1 s", rep.FreezeP99)
	}
	slowest := slices.MaxFunc(rep.Moves, func(a, b mover.Result) int { return int(a.Freeze - b.Freeze) })
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("cell_add_standby: %d databases moved to cell-3 (with a standby) in %s; writes paused p50 %s, p99 %s, max %s; slowest db_%02d: standby checked before the freeze %s, caught up in the freeze %s; "+
		"cell-3's primary killed right after, its standby promoted and serving the moved databases %s after the kill",
		rep.MovedTotal, ms(rep.TookTotal), ms(rep.FreezeP50), ms(rep.FreezeP99), ms(rep.FreezeMax), slowest.DB, ms(slowest.StandbyCheck), ms(slowest.StandbyTail),
		ms(again))
}

// standbyCaughtUp waits until the standby has applied everything the primary's
// binlog holds now.
func standbyCaughtUp(t *testing.T, primary, standby string) {
	t.Helper()
	var pos string
	if err := openDB(t, primary).QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var waited sql.NullInt64
	if err := openDB(t, standby).QueryRow("SELECT MASTER_GTID_WAIT(?, 300)", pos).Scan(&waited); err != nil || waited.Int64 != 0 {
		t.Fatalf("the standby %s did not catch up with %s: %v %v", standby, pos, waited, err)
	}
}

// failbackDrill runs failover then fail-back under the drill load, on a
// cluster of its own whose cells have standbys: cell-2's primary is killed
// with SIGKILL, its standby promoted and serving; the old primary's server
// starts again (crash recovery: it holds its old past, perhaps with commits
// no client was answered for); redcell cells failback --switch rebuilds it
// as the standby's semi-synchronous replica (emptied, seeded from a dump,
// every database verified inside a freeze of its own) and switches the cell
// back to it. Then cell-2 serves from its primary, the old standby
// replicates from it, and the load's verify (every answered operation there
// once) and the audit end it.
func failbackDrill(t *testing.T, loadFor time.Duration, workers int, maxOps int64) {
	c, d, standby := startStandbyCluster(t)
	cell2Act := actIn("probe-b", 500, 999)
	l := newDrillLoad(t, c, "fb"+randHex(), 12, 300)
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.runUntil(workers, stop, 20*loadFor, maxOps) }()
	time.Sleep(loadFor / 3)
	d.killDB(t, 1)
	failedOver := waitServes(t, c, cell2Act, 90*time.Second)
	time.Sleep(loadFor / 3)
	d.sh(t, fmt.Sprintf("REDCELL_REPL_ID=2 start_mariadb %s/db2 %d fast", d.dir, d.dbPort[1])) // the old primary, back
	start := time.Now()
	out, err := exec.Command(c.bin, "cells", "failback", "--cell", "cell-2", "--switch", "--config", c.config, "--json").CombinedOutput()
	took := time.Since(start)
	if err != nil {
		close(stop)
		<-done
		t.Fatalf("redcell cells failback: %v\n%s", err, out)
	}
	t.Logf("redcell cells failback --cell cell-2 --switch (%s):\n%s", took.Round(time.Millisecond), lastLines(string(out), 30))
	var rep failbackReport
	if i := strings.Index(string(out), "\n{"); i < 0 || json.Unmarshal(out[i+1:], &rep) != nil {
		close(stop)
		<-done
		t.Fatalf("no JSON report in:\n%s", out)
	}
	waitServes(t, c, cell2Act, 30*time.Second)
	time.Sleep(loadFor / 3) // the load goes on against the primary
	close(stop)
	<-done
	if t.Failed() {
		return
	}
	if !rep.Rebuilt.Seeded || rep.Rebuilt.Verified != 50 || rep.Switch == nil || rep.Switch.Serving != "primary" || rep.Switch.StandbyError != "" {
		t.Fatalf("failback report: %+v switch %+v; want seeded, 50 databases verified, serving from the primary with its standby", rep.Rebuilt, rep.Switch)
	}
	if v := c.metric(t, "cell-2", "redcell_cell_db_on_standby"); v != 0 {
		t.Fatalf("cell-2 switched back, but redcell_cell_db_on_standby is %v, want 0", v)
	}
	st := slaveStatusOf(t, standby[1])
	if st["Master_Port"] != strconv.Itoa(d.dbPort[1]) || st["Slave_IO_Running"] != "Yes" || st["Slave_SQL_Running"] != "Yes" {
		t.Fatalf("cell-2's old standby after the switch back: master port %s (want %d), threads %s/%s, %s", st["Master_Port"], d.dbPort[1],
			st["Slave_IO_Running"], st["Slave_SQL_Running"], st["Last_Error"])
	}
	// Nothing committed on the old standby after the switch: its own GTID
	// domain (12) ends where the primary applied it in the pause.
	var state string
	if err := openDB(t, standby[1]).QueryRow("SELECT @@gtid_binlog_state").Scan(&state); err != nil {
		t.Fatal(err)
	}
	if want := domainSeq(rep.Switch.GTID, 12); want == 0 || domainSeq(state, 12) != want {
		t.Fatalf("the old standby's binlog state %s after the switch at %s: its own domain 12 moved on", state, rep.Switch.GTID)
	}
	// The watch runs again: the standby is found replicating semi-synchronously.
	deadline := time.Now().Add(60 * time.Second)
	for c.metric(t, "cell-2", "redcell_cell_db_standby_replicating") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("redcell_cell_db_standby_replicating of cell-2 is %v 60 s after the switch back", c.metric(t, "cell-2", "redcell_cell_db_standby_replicating"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	r := rep.Rebuilt
	t.Logf("db_failback: cell-2 failed over (served again %s after its primary's kill); the old primary rebuilt as its standby: seeded in %s, caught up in %s, %d databases (%d rows) verified in %s, each frozen at most %s; switched back: caught up %d ms, calls paused %d ms; %s; opens by answer: %v",
		ms(failedOver), ms(r.Seed), ms(r.CatchUp), r.Verified, r.Rows, ms(r.Verify), ms(r.VerifyMax), rep.Switch.CaughtUpMS, rep.Switch.PausedMS,
		l.verify(t), l.codes(time.Time{}, time.Now().Add(time.Hour)))
}

// slaveStatusOf reads SHOW SLAVE STATUS of the server behind dsn.
func slaveStatusOf(t *testing.T, dsn string) map[string]string {
	t.Helper()
	rows, err := openDB(t, dsn).Query("SHOW SLAVE STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	out := map[string]string{}
	if !rows.Next() {
		return out
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	for i, col := range cols {
		out[col] = vals[i].String
	}
	return out
}

// domainSeq is the highest sequence number of GTID domain d in a GTID list
// ("D-S-N,...").
func domainSeq(list string, d uint64) uint64 {
	var top uint64
	for _, g := range strings.Split(list, ",") {
		var dom, srv, n uint64
		if _, err := fmt.Sscanf(strings.TrimSpace(g), "%d-%d-%d", &dom, &srv, &n); err == nil && dom == d {
			top = max(top, n)
		}
	}
	return top
}
