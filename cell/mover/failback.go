package mover

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/api"
	"redcell/storage"
)

// Rebuilt is what RebuildStandby did and how long each part took.
type Rebuilt struct {
	Cell    string        `json:"cell"`
	Seeded  bool          `json:"seeded"` // false: it replicated from the promoted server already
	Seed    time.Duration `json:"seed_ns"`
	CatchUp time.Duration `json:"catch_up_ns"`
	// Verified is the databases whose digests matched on both servers, each
	// compared inside a freeze of that database (its writes paused for
	// VerifyMax at most).
	Verified  int           `json:"verified"`
	Verify    time.Duration `json:"verify_ns"`
	VerifyMax time.Duration `json:"verify_max_ns"`
	Rows      int64         `json:"rows"`
}

// systemSchemas are the server's own schemas, never seeded nor dropped.
var systemSchemas = []string{"mysql", "information_schema", "performance_schema", "sys"}

// RebuildStandby rebuilds a cell's old primary (c.DSN), after a failover
// promoted its standby (c.StandbyDSN, which it serves from now), as the
// promoted server's semi-synchronous standby: the old primary's replication
// stops, its schemas go (what it held past the standby, commits no client
// was answered for, is discarded with them), its binlog restarts with its
// old GTID state (so that its sequence numbers never repeat one it used),
// it is seeded from a consistent dump of the promoted server (mariadb-dump
// --single-transaction --gtid; not logged), and it replicates from the
// position of the dump by GTID, semi-synchronously. Then it catches up, the
// promoted server must acknowledge semi-synchronously with a replica
// connected, and every database the cell owns is verified: frozen on the
// cell (its writes paused, POST /admin/moves), the old primary caught up,
// the digests of both servers compared, thawed. A server that replicates
// from the promoted one already is not seeded again, only verified.
// Errors: the cell serves from its primary (nothing to rebuild), the old
// primary does not answer, a step's; a digest that differs is an error and
// leaves the replica as it is for a person to look at.
func (m *Mover) RebuildStandby(ctx context.Context, c Cell) (res Rebuilt, err error) {
	m.defaults()
	res.Cell = c.Name
	if c.StandbyDSN == "" {
		return res, fmt.Errorf("mover: %s has no standby_dsn: nothing to fail back", c.Name)
	}
	serving, _, err := storage.Serving(ctx, c.DSN, c.StandbyDSN)
	if err != nil {
		return res, fmt.Errorf("mover: which of %s's servers serves: %w", c.Name, err)
	}
	if serving != c.StandbyDSN {
		return res, fmt.Errorf("mover: %s serves from its primary: nothing to fail back", c.Name)
	}
	srv, err := openDB(c.StandbyDSN)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	old, err := openDB(c.DSN)
	if err != nil {
		return res, err
	}
	defer old.Close()
	if err := old.PingContext(ctx); err != nil {
		return res, fmt.Errorf("mover: %s's old primary does not answer (start its server first): %w", c.Name, err)
	}
	scfg, err := mysql.ParseDSN(c.StandbyDSN)
	if err != nil {
		return res, err
	}
	host, port, err := splitHostPort(scfg.Addr)
	if err != nil {
		return res, err
	}
	st, err := slaveStatus(ctx, old, "")
	replicates := err == nil && st["Master_Host"] == host && st["Master_Port"] == fmt.Sprint(port) &&
		st["Slave_IO_Running"] == "Yes" && st["Slave_SQL_Running"] == "Yes"
	if !replicates {
		t := m.now()
		if err := m.seed(ctx, c, old, srv, host, port, scfg); err != nil {
			return res, err
		}
		res.Seeded, res.Seed = true, m.since(t)
	}
	t := m.now()
	if err := m.syncStandby(ctx, srv, old, m.CatchUpMax); err != nil {
		return res, fmt.Errorf("mover: %s's old primary catching up: %w", c.Name, err)
	}
	res.CatchUp = m.since(t)
	// The promoted server acknowledges semi-synchronously again (a
	// promotion turned it off: it had no standby).
	if _, err := srv.ExecContext(ctx, "SET GLOBAL rpl_semi_sync_master_enabled = 1"); err != nil {
		return res, fmt.Errorf("mover: %s's promoted server: %w", c.Name, err)
	}
	if err := m.semiSyncOn(ctx, srv, 30*time.Second); err != nil {
		return res, fmt.Errorf("mover: %s's promoted server: %w", c.Name, err)
	}
	st2, err := m.State(ctx, c)
	if err != nil {
		return res, err
	}
	t = m.now()
	for _, db := range st2.DBs {
		d, rows, err := m.verifyCopy(ctx, c, db, srv, old)
		if err != nil {
			return res, err
		}
		res.Verified++
		res.Rows += rows
		res.VerifyMax = max(res.VerifyMax, d)
	}
	res.Verify = m.since(t)
	return res, nil
}

// emptyOldPrimary makes the old primary a replica with nothing in it: its
// replication connections reset, its user schemas dropped (not logged), its
// binlog restarted past every number either server used. Errors: the first
// statement that failed.
func (m *Mover) emptyOldPrimary(ctx context.Context, c Cell, old, srv *sql.DB) error {
	// The binlog restarts with, per domain and server, the highest sequence
	// number either server logged: the old primary may have lost the tail
	// of its binlog in its crash (sync_binlog 0) that the promoted server
	// holds, and a number it used must never be used again.
	var oldState, srvState string
	if err := old.QueryRowContext(ctx, "SELECT @@gtid_binlog_state").Scan(&oldState); err != nil {
		return err
	}
	if err := srv.QueryRowContext(ctx, "SELECT @@gtid_binlog_state").Scan(&srvState); err != nil {
		return err
	}
	state, err := mergeGTIDState(oldState, srvState)
	if err != nil {
		return err
	}
	conns, err := storage.ReplicationConnections(ctx, old)
	if err != nil {
		return err
	}
	// A replica from now on: its applier's commits must not wait for
	// acknowledgements of its own (rpl_semi_sync_master_wait_no_slave).
	stmts := []string{"STOP ALL SLAVES", "SET GLOBAL rpl_semi_sync_master_enabled = 0"}
	for _, name := range conns {
		stmts = append(stmts, "RESET SLAVE '"+name+"' ALL")
	}
	schemas, err := userSchemas(ctx, old)
	if err != nil {
		return err
	}
	stmts = append(stmts, "SET SESSION sql_log_bin = 0")
	for _, s := range schemas {
		stmts = append(stmts, "DROP DATABASE IF EXISTS `"+s+"`")
	}
	// One connection: sql_log_bin is the session's.
	conn, err := old.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stmts = append(stmts, "RESET MASTER")
	if state != "" {
		stmts = append(stmts, "SET GLOBAL gtid_binlog_state = "+quote(state))
	}
	stmts = append(stmts, "SET GLOBAL gtid_slave_pos = ''")
	for _, q := range stmts {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mover: %s's old primary: %s: %w", c.Name, q, err)
		}
	}
	m.Log.Info("failback: the old primary emptied; seeding it from the promoted server", "cell", c.Name, "dropped", schemas)
	return nil
}

// seed empties the old primary and loads a consistent dump of the serving
// server into it, then starts replicating from the dump's GTID position.
func (m *Mover) seed(ctx context.Context, c Cell, old, srv *sql.DB, host string, port int, scfg *mysql.Config) error {
	if err := m.emptyOldPrimary(ctx, c, old, srv); err != nil {
		return err
	}
	src, err := seedSchemas(ctx, srv)
	if err != nil {
		return err
	}
	if len(src) > 0 {
		if err := m.dumpInto(ctx, c, srv, src); err != nil {
			return err
		}
	} else {
		var pos string
		if err := srv.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
			return err
		}
		if _, err := old.ExecContext(ctx, "SET GLOBAL gtid_slave_pos = "+quote(pos)); err != nil {
			return err
		}
	}
	for _, q := range []string{
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%d, MASTER_USER=%s, MASTER_PASSWORD=%s, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
			quote(host), port, quote(scfg.User), quote(scfg.Passwd)),
		"SET GLOBAL rpl_semi_sync_slave_enabled = 1",
	} {
		if _, err := old.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mover: %s's old primary: %w", c.Name, err)
		}
	}
	if _, err := old.ExecContext(ctx, "START SLAVE"); err != nil {
		return fmt.Errorf("mover: %s's old primary: %w", c.Name, err)
	}
	return nil
}

// dumpInto loads a consistent dump of schemas from the serving server
// (c.StandbyDSN) into the old primary (c.DSN), without logging it there; the
// dump sets the old primary's gtid_slave_pos to its snapshot's position.
//
// A schema made on the serving server between the listing of schemas and
// the dump's snapshot (a cell makes shadow_redcell_meta on its first stress
// traffic, say) would be missing from the dump while its changes are
// behind the dump's GTID position: the replica would then stop on a row
// event for a table it lacks. So after each dump the schemas are listed
// again, and a new one makes the dump run again with it, up to 5 times.
func (m *Mover) dumpInto(ctx context.Context, c Cell, srv *sql.DB, schemas []string) error {
	sa, err := mysqlArgs(c.StandbyDSN)
	if err != nil {
		return err
	}
	da, err := mysqlArgs(c.DSN)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp("", "redcell-failback-*.sql")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	var stderr bytes.Buffer
	for attempt := 1; ; attempt++ {
		if err := tmp.Truncate(0); err != nil {
			return err
		}
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.WriteString(tmp, "SET SESSION sql_log_bin = 0;\n"); err != nil {
			return err
		}
		stderr.Reset()
		dump := exec.CommandContext(ctx, m.Dump, append(append(slices.Clone(sa.args), "--single-transaction", "--gtid", "--master-data=1", "--databases"), schemas...)...)
		dump.Env, dump.Stdout, dump.Stderr = append(os.Environ(), sa.env...), tmp, &stderr
		err := dump.Run()
		if err == nil {
			now, err := seedSchemas(ctx, srv)
			if err != nil {
				return err
			}
			added := slices.DeleteFunc(slices.Clone(now), func(s string) bool { return slices.Contains(schemas, s) })
			if len(added) == 0 {
				break
			}
			if attempt >= 5 {
				return fmt.Errorf("mover: %s of %s's promoted server: schemas %v were made during each of 5 dumps", m.Dump, c.Name, added)
			}
			m.Log.Info("failback: schemas made during the dump; dumping again with them", "cell", c.Name, "schemas", added, "attempt", attempt)
			schemas = now
			continue
		}
		// A table made or altered after the snapshot began (a day table,
		// the cell's own metadata) fails the dump (1412), as in a move's
		// copy: a new snapshot sees it.
		if attempt < 5 && strings.Contains(stderr.String(), "1412") && ctx.Err() == nil {
			m.Log.Info("failback: a table changed during the dump; dumping again", "cell", c.Name, "attempt", attempt)
			continue
		}
		return fmt.Errorf("mover: %s of %s's promoted server: %w: %s", m.Dump, c.Name, err, strings.TrimSpace(stderr.String()))
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	load := exec.CommandContext(ctx, m.Client, da.args...)
	load.Env, load.Stdin = append(os.Environ(), da.env...), tmp
	stderr.Reset()
	load.Stderr = &stderr
	if err := load.Run(); err != nil {
		return fmt.Errorf("mover: seeding %s's old primary: %w: %s", c.Name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// verifyCopy freezes db on the cell, lets the replica catch up with the
// serving server, compares both digests and thaws db: how long it was
// frozen, and the rows compared.
func (m *Mover) verifyCopy(ctx context.Context, c Cell, db int, srv, replica *sql.DB) (frozen time.Duration, rows int64, err error) {
	t := m.now()
	if err := m.step(ctx, c, api.MoveStep{Op: "freeze", DB: db, TTLMS: (3 * m.FreezeMax).Milliseconds()}); err != nil {
		return 0, 0, err
	}
	defer func() {
		if terr := m.step(context.WithoutCancel(ctx), c, api.MoveStep{Op: "thaw", DB: db}); terr != nil {
			err = errors.Join(err, terr)
		}
		frozen = m.since(t)
	}()
	fctx, cancel := context.WithTimeout(ctx, m.FreezeMax)
	defer cancel()
	if err := m.syncStandby(fctx, srv, replica, m.FreezeMax); err != nil {
		return 0, 0, fmt.Errorf("mover: db_%02d: the old primary catching up: %w", db, err)
	}
	var a, b storage.Digest
	var aerr, berr error
	done := make(chan struct{})
	go func() { a, aerr = storage.DBDigest(fctx, srv, db); close(done) }()
	b, berr = storage.DBDigest(fctx, replica, db)
	<-done
	if err := errors.Join(aerr, berr); err != nil {
		return 0, 0, fmt.Errorf("mover: db_%02d digests: %w", db, err)
	}
	if a.Sum() != b.Sum() {
		return 0, 0, fmt.Errorf("mover: db_%02d differs between %s's promoted server and its rebuilt standby: %s", db, c.Name, strings.Join(a.Diff(b), "; "))
	}
	for _, t := range a {
		rows += t.Rows
	}
	return 0, rows, nil
}

// semiSyncOn waits, up to max on the mover's clock, until the server behind
// db acknowledges commits semi-synchronously with a replica connected,
// looking every 200 ms.
func (m *Mover) semiSyncOn(ctx context.Context, db *sql.DB, max time.Duration) error {
	deadline := m.now().Add(max)
	for {
		var name, status, clients string
		err := db.QueryRowContext(ctx, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'").Scan(&name, &status)
		if err == nil {
			err = db.QueryRowContext(ctx, "SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'").Scan(&name, &clients)
		}
		if err == nil && status == "ON" && clients != "0" && clients != "" {
			return nil
		}
		if m.now().After(deadline) {
			return errors.Join(err, fmt.Errorf("semi-synchronous replication %q with %q replicas after %s", status, clients, max))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.clk().After(200 * time.Millisecond):
		}
	}
}

// userSchemas lists a server's schemas but its own.
// seedSchemas lists the schemas a fail-back's seed dumps from the serving
// server: its user schemas but redcell_failover (the promotion mark, which
// the rebuilt standby must not carry).
func seedSchemas(ctx context.Context, srv *sql.DB) ([]string, error) {
	src, err := userSchemas(ctx, srv)
	return slices.DeleteFunc(src, func(s string) bool { return s == "redcell_failover" }), err
}

func userSchemas(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT schema_name FROM information_schema.schemata ORDER BY schema_name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		if !slices.Contains(systemSchemas, s) {
			out = append(out, s)
		}
	}
	return out, rows.Err()
}

// mergeGTIDState merges two gtid_binlog_state values ("D-S-N,..."): for each
// domain and server id, the highest sequence number of either.
func mergeGTIDState(a, b string) (string, error) {
	type key struct{ domain, server uint64 }
	highest := map[key]uint64{}
	var order []key
	for _, list := range []string{a, b} {
		for _, g := range strings.Split(list, ",") {
			g = strings.TrimSpace(g)
			if g == "" {
				continue
			}
			var k key
			var n uint64
			if _, err := fmt.Sscanf(g, "%d-%d-%d", &k.domain, &k.server, &n); err != nil {
				return "", fmt.Errorf("mover: GTID %q: %w", g, err)
			}
			if _, ok := highest[k]; !ok {
				order = append(order, k)
			}
			highest[k] = max(highest[k], n)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, fmt.Sprintf("%d-%d-%d", k.domain, k.server, highest[k]))
	}
	return strings.Join(out, ","), nil
}
