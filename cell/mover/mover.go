// Package mover moves a database (db_XX with its shadow_db_XX) from one cell
// to another while the cluster serves, with MariaDB's own machinery:
//
//  1. copy: mariadb-dump --single-transaction --master-data of the source's
//     schemas (a consistent snapshot and its binlog position), loaded into
//     the target's server;
//  2. catch up: a replication channel on the target ("move_db_XX"), filtered to
//     those schemas, from that position until it trails the source by nothing;
//  3. freeze: the source cell answers 503 MOVING for the database's shards and
//     drains its work in flight (POST /admin/moves op freeze); the target
//     applies the source's last position;
//  4. verify: row counts and CHECKSUM TABLE of every table on both servers
//     (storage.DBDigest) must match;
//  5. hand over: the reconciliation positions follow, the target cell adopts
//     the database under a new map version and the source releases it; both
//     announce through memberlist and routers follow within a gossip round.
//
// Cells whose MariaDB has a semi-synchronous standby move too. The channel
// replicates asynchronously (the target's rpl_semi_sync_slave_enabled is off
// while it runs), so the source's commits are acknowledged by the source's
// standby alone. What the channel applies goes into the target's binlog
// (log_slave_updates) and, semi-synchronously, to the target's standby.
// Each server needs a GTID domain of its own (--gtid-domain-id; make run
// gives each its server id): the target's binlog holds the source's
// transactions under the source's GTIDs, and in one domain their sequence
// numbers would go back and forth. A standby applies two domains' work in
// parallel, in no set order, so wherever a database's writes pass from one
// domain to the other the mover waits until the target's standby has
// applied all the target's binlog: after the dump's load (the target's
// domain) before the channel starts (the source's); inside the freeze,
// after the tail the channel applied and before the adoption, from which
// on the target's own writes follow (this wait is also what makes a
// failover right after the move lose nothing); and before a partial copy
// is dropped. Before the freeze the channel pauses, the standby catches up
// and its copy's digest must match the target's. Inside the freeze the
// mover also asks again which of the source's servers serves: a source
// that failed over to its standby during the move fails it (the copy came
// from the old primary). The source's standby drops its copy with the
// source (the DROP goes through its binlog).
//
// Any failure before the adoption thaws the source and removes the target's
// partial copy: the source serves on as before. The freeze (step 3 to the
// adoption) is what clients see: requests for the database's shards get
// MOVING, which the router retries with a short backoff.
package mover

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/storage"
)

// Cell is one cell as a move needs it: its admin port and its database.
type Cell struct {
	Name      string
	AdminAddr string // host:port of the cell's admin port
	DSN       string // its MariaDB, as in the cluster config (no database name)
	// StandbyDSN is the cell's semi-synchronous standby ("" none). A move
	// works on whichever of the two serves (storage.Serving: the standby
	// once a failover promoted it). Into a cell with a standby, the standby
	// takes the copy through the target's binlog and is checked before the
	// freeze (see Move).
	StandbyDSN string
}

// Mover runs moves. Token is the cells' admin token.
type Mover struct {
	Token string
	Log   *slog.Logger
	// CatchUpMax bounds the copy's catching up before the freeze (default 10
	// minutes); FreezeMax bounds the freeze (default 10 s): a move that
	// cannot finish within it thaws the source and fails.
	CatchUpMax, FreezeMax time.Duration
	// Dump and Client are the MariaDB programs (default mariadb-dump and
	// mariadb from PATH).
	Dump, Client string
	HTTP         *http.Client // nil: a client with a 15 s timeout
	// Clock is where a move reads time (nil: the system clock): its
	// Result's durations, the bounds of its waits on the servers and the
	// pauses between its looks. Its requests' and its freeze's deadlines
	// are contexts', on the system clock.
	Clock clock.Clock
}

// Result is what one move did and how long each part took.
type Result struct {
	DB      int           `json:"db"`
	From    string        `json:"from"`
	To      string        `json:"to"`
	Version int64         `json:"version"`
	Tables  int           `json:"tables"` // tables with rows, both schemas
	Rows    int64         `json:"rows"`
	Copy    time.Duration `json:"copy_ns"`     // dump and load
	CatchUp time.Duration `json:"catch_up_ns"` // replication until caught up (and the reconciliation positions' copy), before the freeze
	Freeze  time.Duration `json:"freeze_ns"`   // from the freeze to the adoption: writes paused
	Prep    time.Duration `json:"prep_ns"`     // the source saving the freeze's mark, before writes paused
	Drain   time.Duration `json:"drain_ns"`    // the part of the freeze the source drained its work in flight
	Verify  time.Duration `json:"verify_ns"`   // digests on both servers, inside the freeze
	// Applied is the part of the freeze the target took to apply the
	// source's binlog up to its position after the drain (the first
	// attempt's).
	Applied time.Duration `json:"applied_ns"`
	// Unlink is the channel's removal and the source's seal (at once);
	// HandOver the adoption.
	Unlink   time.Duration `json:"unlink_ns"`
	HandOver time.Duration `json:"hand_over_ns"`
	Attempts int           `json:"verify_attempts"`
	// StandbyCheck is the target's standby catching up and its digest
	// checked, before the freeze (0: the target has no standby);
	// StandbyTail the part of the freeze it took to apply the tail the
	// freeze applied on the target.
	StandbyCheck time.Duration `json:"standby_check_ns,omitempty"`
	StandbyTail  time.Duration `json:"standby_tail_ns,omitempty"`
}

// clk is the mover's clock.
func (m *Mover) clk() clock.Clock { return clock.Or(m.Clock) }

// now is the mover's clock's time.
func (m *Mover) now() time.Time { return m.clk().Now() }

// since is how long ago t was on the mover's clock.
func (m *Mover) since(t time.Time) time.Duration { return m.now().Sub(t) }

func (m *Mover) defaults() {
	if m.CatchUpMax <= 0 {
		m.CatchUpMax = 10 * time.Minute
	}
	if m.FreezeMax <= 0 {
		m.FreezeMax = 10 * time.Second
	}
	if m.Dump == "" {
		m.Dump = "mariadb-dump"
	}
	if m.Client == "" {
		m.Client = "mariadb"
	}
	if m.HTTP == nil {
		m.HTTP = &http.Client{Timeout: 15 * time.Second}
	}
	if m.Log == nil {
		m.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// State reads a cell's ownership (GET /admin/moves).
func (m *Mover) State(ctx context.Context, c Cell) (api.MovesState, error) {
	m.defaults()
	var st api.MovesState
	err := m.admin(ctx, c, http.MethodGet, nil, &st)
	return st, err
}

// afterAdoptFailed settles a move whose adoption did not answer 200: when the
// target owns the database, the source releases it; when it surely does not,
// the source thaws and the target's copy goes; when the target cannot be
// asked, both are left as they are (the source stays frozen and sealed) and
// the error says so.
func (m *Mover) afterAdoptFailed(ctx context.Context, db int, from, to Cell, version int64, digest storage.Digest, cause error) error {
	st, err := m.State(ctx, to)
	switch {
	case err != nil:
		return fmt.Errorf("mover: db_%02d: the adoption by %s may or may not have happened (%v), and %s cannot be asked (%v): "+
			"%s keeps it frozen; check GET /admin/moves on %s, then release it on %s or thaw it there", db, to.Name, cause, to.Name, err, from.Name, to.Name, from.Name)
	case contains(st.DBs, db):
		if rerr := m.step(ctx, from, api.MoveStep{Op: "release", DB: db, Version: version, Digest: digest.Sum()}); rerr != nil {
			m.Log.Warn("move: adopted, but the source did not take the release; it releases once its map shows the new owner", "db", db, "err", rerr)
		}
		return nil // adopted: the move is done
	}
	if terr := m.step(ctx, from, api.MoveStep{Op: "thaw", DB: db}); terr != nil {
		m.Log.Error("move failed and the source could not be thawed: thaw it by hand (POST /admin/moves)", "db", db, "err", terr)
	}
	dst, derr := openDB(to.DSN)
	if derr == nil {
		var sb *sql.DB
		if to.StandbyDSN != "" {
			sb, _ = openDB(to.StandbyDSN)
		}
		m.cleanTarget(ctx, dst, sb, db)
		dst.Close()
		if sb != nil {
			sb.Close()
		}
	}
	return fmt.Errorf("mover: db_%02d: %s did not adopt it: %w (the source serves it as before)", db, to.Name, cause)
}

// lockServer takes the move lock of a server (GET_LOCK on a connection of
// its own, held until unlock): one move at a time per server.
func lockServer(ctx context.Context, db *sql.DB) (unlock func(), err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('redcell_move', 0)").Scan(&got); err != nil {
		conn.Close()
		return nil, err
	}
	if got.Int64 != 1 {
		conn.Close()
		return nil, errors.New("another move runs on this server (the lock redcell_move is taken)")
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), "DO RELEASE_LOCK('redcell_move')")
		conn.Close()
	}, nil
}

func (m *Mover) step(ctx context.Context, c Cell, s api.MoveStep) error {
	return m.admin(ctx, c, http.MethodPost, s, nil)
}

// Failover switches a cell back to its primary (POST /admin/failover
// {"op":"switchback"}), waiting up to 2 minutes for its answer.
func (m *Mover) Failover(ctx context.Context, c Cell, out *api.FailoverAnswer) error {
	m.defaults()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	hc := *m.HTTP
	hc.Timeout = 2 * time.Minute
	return m.call(ctx, &hc, c, http.MethodPost, "/admin/failover", api.FailoverStep{Op: "switchback"}, out)
}

// preflight checks what the move needs: the source owns db and writes a row
// binlog, the servers have different server ids, the target does not own
// db; and it removes a copy an earlier, failed move left on the target.
func (m *Mover) preflight(ctx context.Context, db int, from, to Cell, src, dst *sql.DB) error {
	fs, err := m.State(ctx, from)
	if err != nil {
		return err
	}
	if !contains(fs.DBs, db) {
		return fmt.Errorf("mover: %s does not own db_%02d (it owns %s)", from.Name, db, fs.Shards)
	}
	if contains(fs.Frozen, db) {
		return fmt.Errorf("mover: db_%02d is frozen on %s: another move is running", db, from.Name)
	}
	ts, err := m.State(ctx, to)
	if err != nil {
		return err
	}
	if contains(ts.DBs, db) {
		return fmt.Errorf("mover: %s owns db_%02d already", to.Name, db)
	}
	for _, mo := range ts.MovedOut {
		if mo.DB == db { // the target's old copy, from when it handed db over: forgotten, then replaced
			if err := m.step(ctx, to, api.MoveStep{Op: "forget", DB: db}); err != nil {
				return err
			}
		}
	}
	var logBin int
	var format string
	var srcID, dstID int64
	if err := src.QueryRowContext(ctx, "SELECT @@log_bin, @@binlog_format, @@server_id").Scan(&logBin, &format, &srcID); err != nil {
		return fmt.Errorf("mover: %s's database: %w", from.Name, err)
	}
	if logBin != 1 || format != "ROW" {
		return fmt.Errorf("mover: %s's database must write a ROW binlog (log_bin=%d, binlog_format=%s): start it with --log-bin --binlog-format=ROW and a server_id of its own (make run does)", from.Name, logBin, format)
	}
	if err := dst.QueryRowContext(ctx, "SELECT @@server_id").Scan(&dstID); err != nil {
		return fmt.Errorf("mover: %s's database: %w", to.Name, err)
	}
	if srcID == dstID {
		return fmt.Errorf("mover: %s's and %s's databases have one server_id (%d): replication needs one each", from.Name, to.Name, srcID)
	}
	if to.StandbyDSN != "" {
		var srcDom, dstDom int64
		if err := src.QueryRowContext(ctx, "SELECT @@gtid_domain_id").Scan(&srcDom); err != nil {
			return fmt.Errorf("mover: %s's database: %w", from.Name, err)
		}
		if err := dst.QueryRowContext(ctx, "SELECT @@gtid_domain_id").Scan(&dstDom); err != nil {
			return fmt.Errorf("mover: %s's database: %w", to.Name, err)
		}
		if srcDom == dstDom {
			return fmt.Errorf("mover: %s's and %s's databases write GTID domain %d both: %s's standby replicates by GTID, and the source's transactions in its binlog would break the domain's order; "+
				"give each server a domain of its own (--gtid-domain-id, as make run does)", from.Name, to.Name, srcDom, to.Name)
		}
	}
	var sb *sql.DB
	if to.StandbyDSN != "" {
		var err error
		if sb, err = openDB(to.StandbyDSN); err != nil {
			return err
		}
		defer sb.Close()
	}
	m.cleanTarget(ctx, dst, sb, db)
	return nil
}

// cleanTarget removes the channel and the partial copy of a move that did
// not finish. The target does not own db (checked before), so its copy is
// nobody's. With the target's standby (sb, nil: none), the DROP waits until
// the standby applied what the channel wrote (in the source's domain, which
// the DROP, in the target's, could overtake there).
func (m *Mover) cleanTarget(ctx context.Context, dst, sb *sql.DB, db int) {
	ch := channel(db)
	_, _ = dst.ExecContext(ctx, "STOP SLAVE '"+ch+"'")
	_, _ = dst.ExecContext(ctx, "RESET SLAVE '"+ch+"' ALL")
	if sb != nil {
		if err := m.syncStandby(ctx, dst, sb, 30*time.Second); err != nil {
			m.Log.Warn("move: the target's standby did not catch up before the partial copy's removal", "db", db, "err", err)
		}
	}
	for _, s := range storage.MoveSchemas(db) {
		if _, err := dst.ExecContext(ctx, "DROP DATABASE IF EXISTS "+s); err != nil {
			m.Log.Warn("move: removing a partial copy", "schema", s, "err", err)
		}
	}
}

var changeMaster = regexp.MustCompile(`CHANGE MASTER TO MASTER_LOG_FILE='([^']+)', MASTER_LOG_POS=(\d+)`)

// dumpPosition reads the binlog position a dump was taken at from its
// head (the CHANGE MASTER line --master-data=2 writes). Errors: none found
// (the source's binlog is off), or reading the file.
func dumpPosition(dump *os.File, db int) (file string, pos int64, err error) {
	if _, err := dump.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}
	sc := bufio.NewScanner(dump)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for i := 0; i < 100 && sc.Scan(); i++ {
		if mm := changeMaster.FindStringSubmatch(sc.Text()); mm != nil {
			pos, _ = strconv.ParseInt(mm[2], 10, 64)
			return mm[1], pos, nil
		}
	}
	return "", 0, fmt.Errorf("mover: the dump of db_%02d has no binlog position (is the source's binlog on?)", db)
}

// copy dumps db's schemas from the source (one consistent snapshot, with its
// binlog position) into the target's server. Schemas the source does not
// have yet are not copied: the channel brings them when they are made.
func (m *Mover) copy(ctx context.Context, db int, from, to Cell, src *sql.DB) (file string, pos int64, err error) {
	var have []string
	for _, s := range storage.MoveSchemas(db) {
		var n int
		if err := src.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", s).Scan(&n); err != nil {
			return "", 0, err
		}
		if n > 0 {
			have = append(have, s)
		}
	}
	if len(have) == 0 {
		err := src.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &pos, new(any), new(any))
		return file, pos, err
	}
	sa, err := mysqlArgs(from.DSN)
	if err != nil {
		return "", 0, err
	}
	da, err := mysqlArgs(to.DSN)
	if err != nil {
		return "", 0, err
	}
	tmp, err := os.CreateTemp("", fmt.Sprintf("redcell-move-db_%02d-*.sql", db))
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	var stderr bytes.Buffer
	for attempt := 1; ; attempt++ {
		if err := tmp.Truncate(0); err != nil {
			return "", 0, err
		}
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return "", 0, err
		}
		dump := exec.CommandContext(ctx, m.Dump, append(append(slices.Clone(sa.args), "--single-transaction", "--master-data=2", "--skip-lock-tables", "--databases"), have...)...)
		dump.Env, dump.Stdout = append(os.Environ(), sa.env...), tmp
		stderr.Reset()
		dump.Stderr = &stderr
		err := dump.Run()
		if err == nil {
			break
		}
		// A table made after the dump's snapshot began (a day table, or a
		// shadow table stress traffic makes on first use) fails the dump
		// (1412): a new snapshot sees it.
		if attempt < 5 && strings.Contains(stderr.String(), "1412") && ctx.Err() == nil {
			m.Log.Info("move: a table was made during the dump; dumping again", "db", db, "attempt", attempt)
			continue
		}
		return "", 0, fmt.Errorf("mover: %s of %s: %w: %s", m.Dump, strings.Join(have, ", "), err, strings.TrimSpace(stderr.String()))
	}
	if file, pos, err = dumpPosition(tmp, db); err != nil {
		return "", 0, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}
	load := exec.CommandContext(ctx, m.Client, da.args...)
	load.Env, load.Stdin = append(os.Environ(), da.env...), tmp
	stderr.Reset()
	load.Stderr = &stderr
	if err := load.Run(); err != nil {
		return "", 0, fmt.Errorf("mover: loading db_%02d into %s: %w: %s", db, to.Name, err, strings.TrimSpace(stderr.String()))
	}
	return file, pos, nil
}

// copyReconPositions gives the target the source's reconciliation position
// of db, in both money spaces, so its reconciliation goes on from there.
func copyReconPositions(ctx context.Context, db int, srcDSN, dstDSN string) error {
	src, err := storage.Open(srcDSN, 2)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := storage.Open(dstDSN, 2)
	if err != nil {
		return err
	}
	defer dst.Close()
	for _, pair := range [][2]*storage.MySQL{{src, dst}, {src.Shadow(), dst.Shadow()}} {
		pos, err := storage.ReconPositions(ctx, pair[0])
		if err != nil {
			return err
		}
		if ms, ok := pos[db]; ok {
			if err := storage.SaveReconPositions(ctx, pair[1], map[int]int64{db: ms}); err != nil {
				return err
			}
		}
	}
	return nil
}

// admin calls a cell's /admin/moves and decodes a 200 answer into out.
func (m *Mover) admin(ctx context.Context, c Cell, method string, in, out any) error {
	return m.call(ctx, m.HTTP, c, method, "/admin/moves", in, out)
}

// call calls path on a cell's admin port and decodes a 200 answer into out.
func (m *Mover) call(ctx context.Context, hc *http.Client, c Cell, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.AdminAddr+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+m.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("mover: %s admin: %w", c.Name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("mover: %s %s %s: %d %s", c.Name, method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mover: dsn: %w", err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	// The move's lock holds one connection; the digests read up to
	// storage's digestWorkers tables at once on the others, kept open so
	// the freeze does not wait for new ones.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	return db, nil
}

type clientArgs struct{ args, env []string }

// mysqlArgs are the command-line options (and MYSQL_PWD) of the MariaDB
// programs for a DSN.
func mysqlArgs(dsn string) (clientArgs, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return clientArgs{}, err
	}
	a := clientArgs{args: []string{"--no-defaults", "-u" + cfg.User}}
	if cfg.Net == "unix" {
		a.args = append(a.args, "--socket="+cfg.Addr)
	} else {
		host, port, err := splitHostPort(cfg.Addr)
		if err != nil {
			return a, err
		}
		a.args = append(a.args, "-h"+host, "-P"+strconv.Itoa(port), "--protocol=TCP")
	}
	if cfg.Passwd != "" {
		a.env = append(a.env, "MYSQL_PWD="+cfg.Passwd)
	}
	return a, nil
}

func splitHostPort(addr string) (string, int, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return addr, 3306, nil
	}
	p, err := strconv.Atoi(addr[i+1:])
	return addr[:i], p, err
}

func quote(s string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'" }

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
