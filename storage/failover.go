package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/incident"
	"redcell/model"
)

// Failover is a cell's database with a standby: a MariaDB replica of the
// primary, fed by semi-synchronous replication (the standby acknowledges a
// transaction's binlog events before the primary answers its COMMIT, so an
// acknowledged commit is on the standby too; see deploy/local/services.sh
// start_standby). The store's pool dials whichever server serves; Watch
// promotes the standby when the primary has not answered for a while, and
// the pool dials the standby from then on. It never switches back: the old
// primary, if it returns, holds a past the standby has gone beyond: it is
// rebuilt as the new standby (redcell cells failback, cell/mover
// RebuildStandby), and SwitchBack then makes it serve again.
//
// Promotion leaves a mark on the standby (redcell_failover.t_promoted), so
// a later process, the audit and the bench know to use it; a standby that
// is neither a replica of this primary nor marked is refused, never taken
// for the cell's database.
type Failover struct {
	primary, standby string // DSNs with the driver's parameters
	primaryAddr      string // host:port
	sw               *switchConnector
	db               *sql.DB // the store's pool
	maxConns         int
	promoted         atomic.Bool
	log              *slog.Logger

	// Promotions counts standbys promoted by this process.
	Promotions  atomic.Int64
	primaryDown atomic.Int64 // Unix ms; 0 while the primary answers
	// switching serializes SwitchBack; watchCtx, watchAfter and
	// watchEvery are Watch's arguments, for the watch SwitchBack starts
	// again.
	switching  sync.Mutex
	lease      atomic.Pointer[Lease] // the process's lease, checked on the standby before a promotion or a switch back
	watchMu    sync.Mutex
	watchCtx   context.Context
	watchAfter time.Duration
	watchEvery time.Duration
	// replicating: at the last check while the primary answered, the
	// standby's replication threads ran and the primary's semi-synchronous
	// replication was on (1), or not (0); -1 before the first check.
	replicating atomic.Int32
}

// standbyWait is how long OpenFailover waits for a standby that does not
// answer: without it the cell cannot tell which server is its database.
var standbyWait = 30 * time.Second

// healthEvery is how often Watch checks the standby's replication while
// the primary answers, in pings.
const healthEvery = 10

// switchConnector dials the server that serves now, and stamps each
// connection with the generation it was dialed in: a switch (or a
// promotion beginning) starts a new generation, and connections of an
// older one are refused by the pool (IsValid, ResetSession) and fail every
// call, so no statement of this cell reaches the old primary after it.
// It also counts the round trips its connections make (trips): a store
// opened without a standby dials through one that never switches.
type switchConnector struct {
	mu      sync.Mutex
	cur     driver.Connector
	gen     atomic.Int64
	refusal error // while a promotion runs: no new connection
	trips   atomic.Int64
	// fence, when set (Lease.register, SetLease), runs on each new
	// connection before its first use; an error refuses it.
	fence func(context.Context, driver.Conn) error
}

// connect dials a connection of the current generation, behind g.
func (c *switchConnector) connect(ctx context.Context, g *gate) (driver.Conn, error) {
	c.mu.Lock()
	cur, refusal, gen, fence := c.cur, c.refusal, c.gen.Load(), c.fence
	c.mu.Unlock()
	if refusal != nil {
		return nil, refusal
	}
	conn, err := cur.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if fence != nil {
		c.trips.Add(1)
		if err := fence(ctx, conn); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return &genConn{Conn: conn, gen: gen, sw: c, gate: g}, nil
}

func (c *switchConnector) Driver() driver.Driver { return mysql.MySQLDriver{} }

// set sends new connections to to, in a new generation.
func (c *switchConnector) set(to driver.Connector) {
	c.mu.Lock()
	c.cur, c.refusal = to, nil
	c.gen.Add(1)
	c.mu.Unlock()
}

// refuse makes every connection stale and refuses new ones with err until
// set or resume.
func (c *switchConnector) refuse(err error) {
	c.mu.Lock()
	c.refusal = err
	c.gen.Add(1)
	c.mu.Unlock()
}

// resume dials the current server again (a promotion abandoned).
func (c *switchConnector) resume() {
	c.mu.Lock()
	c.refusal = nil
	c.mu.Unlock()
}

// genConn is a connection of one generation of a switchConnector. Its
// round trips but COMMIT and ROLLBACK go through its pool's gate (Guarded);
// one the breaker refuses is not counted in trips (it never left).
type genConn struct {
	driver.Conn
	gen  int64
	sw   *switchConnector
	gate *gate
}

func (c *genConn) stale() bool { return c.gen != c.sw.gen.Load() }

func (c *genConn) IsValid() bool {
	if c.stale() {
		return false
	}
	v, ok := c.Conn.(driver.Validator)
	return !ok || v.IsValid()
}

func (c *genConn) ResetSession(ctx context.Context) error {
	if c.stale() {
		return driver.ErrBadConn
	}
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *genConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.stale() {
		return nil, errStale
	}
	var tx driver.Tx
	err := Guarded(c.gate.breaker(), func() (err error) {
		// The driver sets a non-default isolation level with a statement
		// of its own before START TRANSACTION.
		if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) {
			c.sw.trips.Add(1)
		}
		c.sw.trips.Add(1)
		tx, err = c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &genTx{Tx: tx, c: c}, nil
}

func (c *genConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.stale() {
		return nil, errStale
	}
	var st driver.Stmt
	err := Guarded(c.gate.breaker(), func() (err error) {
		c.sw.trips.Add(1)
		st, err = c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
		return err
	})
	return st, err
}

func (c *genConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.stale() {
		return nil, errStale
	}
	exec := func() (res driver.Result, err error) {
		c.sw.trips.Add(1)
		return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	}
	if endsTx(query) {
		// A transaction begun as a statement (a snapshot's START
		// TRANSACTION) ends as one: never refused, as genTx's are not.
		return exec()
	}
	var res driver.Result
	err := Guarded(c.gate.breaker(), func() (err error) { res, err = exec(); return err })
	return res, err
}

// endsTx reports whether query is a lone COMMIT or ROLLBACK.
func endsTx(query string) bool {
	q := strings.TrimSpace(query)
	return strings.EqualFold(q, "ROLLBACK") || strings.EqualFold(q, "COMMIT")
}

func (c *genConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.stale() {
		return nil, errStale
	}
	var rows driver.Rows
	err := Guarded(c.gate.breaker(), func() (err error) {
		c.sw.trips.Add(1)
		rows, err = c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
		return err
	})
	return rows, err
}

func (c *genConn) Ping(ctx context.Context) error {
	if c.stale() {
		return driver.ErrBadConn
	}
	return Guarded(c.gate.breaker(), func() error { c.sw.trips.Add(1); return c.Conn.(driver.Pinger).Ping(ctx) })
}

func (c *genConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// genTx is a transaction of a genConn: begun before a switch, it is rolled
// back rather than committed (on the old primary) after it.
type genTx struct {
	driver.Tx
	c *genConn
}

func (t *genTx) Commit() error {
	t.c.sw.trips.Add(1)
	if t.c.stale() {
		_ = t.Tx.Rollback()
		return model.Errorf(model.ErrDBUnavailable, "the cell's database server was switched during this transaction; not committed")
	}
	return t.Tx.Commit()
}

func (t *genTx) Rollback() error {
	t.c.sw.trips.Add(1)
	return t.Tx.Rollback()
}

func connectorOf(dsn string) (driver.Connector, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("storage: bad DSN: %w", err)
	}
	return mysql.NewConnector(cfg)
}

// ErrStandbyUnknown: the standby is neither a replica of the primary nor
// marked as promoted by Promote (a fresh server, one seeded half-way, one
// pointed at another primary), so it is not taken for the cell's database.
var ErrStandbyUnknown = errors.New("storage: the standby is neither a replica of this primary nor a promoted standby")

// OpenFailover is Open for a primary with a standby (DSNs as Open takes
// them). It serves from the primary while the standby replicates from it,
// and from the standby once that was promoted (its mark, left by Promote),
// so a cell restarted after a failover keeps writing where it wrote last.
// It waits up to standbyWait (30 s) for a standby that does not answer: it
// cannot tell otherwise whether the primary is still the cell's database.
// Errors: a bad DSN, a standby that never answered, ErrStandbyUnknown.
func OpenFailover(primaryDSN, standbyDSN string, maxConns int, log *slog.Logger) (*MySQL, *Failover, error) {
	primary, err := withParams(primaryDSN)
	if err != nil {
		return nil, nil, err
	}
	standby, err := withParams(standbyDSN)
	if err != nil {
		return nil, nil, err
	}
	pcfg, _ := mysql.ParseDSN(primary)
	pc, err := connectorOf(primary)
	if err != nil {
		return nil, nil, err
	}
	f := &Failover{primary: primary, standby: standby, primaryAddr: pcfg.Addr, sw: &switchConnector{cur: pc}, maxConns: maxConns, log: log}
	f.replicating.Store(-1)
	role, err := f.standbyRole()
	for deadline := time.Now().Add(standbyWait); err != nil && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		role, err = f.standbyRole()
	}
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("storage: the standby did not answer for %s, so the cell cannot tell whether it was promoted: %w", standbyWait, err)
	case role == rolePromoted:
		sc, err := connectorOf(standby)
		if err != nil {
			return nil, nil, err
		}
		f.sw.set(sc)
		f.promoted.Store(true)
		log.Warn("the standby was promoted by an earlier process: the cell serves from it; rebuild the old primary as its standby (docs/operations.md)")
	case role == roleUnknown:
		return nil, nil, ErrStandbyUnknown
	}
	m := newMySQL(f.sw, maxConns)
	f.db = m.db
	return m, f, nil
}

type standbyRole int

const (
	roleReplica  standbyRole = iota // replicates from this primary
	rolePromoted                    // marked by Promote
	roleUnknown
)

// standbyRole asks the standby what it is.
func (f *Failover) standbyRole() (standbyRole, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		return roleUnknown, err
	}
	defer db.Close()
	if marked, err := promotedMark(ctx, db); err != nil || marked {
		return rolePromoted, err
	}
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return roleUnknown, err
	}
	if st != nil && net.JoinHostPort(st["Master_Host"], st["Master_Port"]) == f.primaryAddr {
		return roleReplica, nil
	}
	return roleUnknown, nil
}

// promotedMark reports whether Promote marked the server behind db.
func promotedMark(ctx context.Context, db *sql.DB) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM redcell_failover.t_promoted").Scan(&n)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errNoSuchDB) {
		return false, nil
	}
	return n > 0, err
}

// errNoSuchDB: MariaDB's "unknown database".
const errNoSuchDB = 1049

// OnStandby reports whether the standby serves (it was promoted).
func (f *Failover) OnStandby() bool { return f.promoted.Load() }

// PrimaryDownSince is when the primary stopped answering Watch's pings
// (zero while it answers, or once the standby serves).
func (f *Failover) PrimaryDownSince() time.Time {
	if ms := f.primaryDown.Load(); ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}

// Replicating is what Watch last found of the standby while the primary
// answered: 1 its replication ran with semi-synchronous acknowledgement on,
// 0 not (a promotion then could lose acknowledged commits, and Watch does
// not promote), -1 not checked yet, or no standby any more (it serves).
func (f *Failover) Replicating() int { return int(f.replicating.Load()) }

// slaveStatus reads SHOW SLAVE STATUS as column → value (nil: not a replica).
func slaveStatus(ctx context.Context, db *sql.DB) (map[string]string, error) {
	all, err := StatusRows(ctx, db, "SHOW SLAVE STATUS")
	if err != nil || len(all) == 0 {
		return nil, err
	}
	return all[0], nil
}

// StatusRows reads the rows of a SHOW statement (SHOW SLAVE STATUS, say) as
// column → value.
func StatusRows(ctx context.Context, db *sql.DB, query string) ([]map[string]string, error) {
	rows, err := readRows(ctx, db, query)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]string, 0, len(rows))
	for _, r := range rows {
		row := make(map[string]string, len(r.cols))
		for _, c := range r.cols {
			row[c] = r.str(c)
		}
		out = append(out, row)
	}
	return out, nil
}

// ReplicationConnections names the replication connections defined on the
// server behind db (SHOW ALL SLAVES STATUS; the default one as "").
func ReplicationConnections(ctx context.Context, db *sql.DB) ([]string, error) {
	all, err := StatusRows(ctx, db, "SHOW ALL SLAVES STATUS")
	var out []string
	for _, r := range all {
		out = append(out, r["Connection_name"])
	}
	return out, err
}

// SetLease makes promotions and switches back check, on the server they
// would serve from next, that this process's lease is still the cell's: a
// process that hung and lost its lease to another process of the cell
// must not promote its standby when it wakes (storage.Lease).
func (f *Failover) SetLease(l Lease) { f.lease.Store(&l) }

// leaseStillOurs checks the lease row on the server behind db against the
// process's lease: ErrLeaseLost when it names another generation. No row (a
// server the lease never reached) and no lease set pass.
func (f *Failover) leaseStillOurs(ctx context.Context, db *sql.DB) error {
	l := f.lease.Load()
	if l == nil {
		return nil
	}
	var gen int64
	err := db.QueryRowContext(ctx, "SELECT generation FROM redcell_meta.t_lease WHERE cell = ?", l.Cell).Scan(&gen)
	switch {
	case errors.Is(err, sql.ErrNoRows) || isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errNoSuchDB):
		return nil
	case err != nil:
		return err
	case gen != l.Generation:
		return fmt.Errorf("%w (generation %d there, this process holds %d)", ErrLeaseLost, gen, l.Generation)
	}
	return nil
}

// moveChannels lists the move channels (cell/mover, "move_db_XX") defined
// on the server behind db.
func moveChannels(ctx context.Context, db *sql.DB) ([]string, error) {
	all, err := ReplicationConnections(ctx, db)
	return slices.DeleteFunc(all, func(n string) bool { return !strings.HasPrefix(n, "move_") }), err
}

// errPromoting refuses new connections while a promotion runs.
var errPromoting = model.Errorf(model.ErrDBUnavailable, "the cell's standby is being promoted; retry")

// errStale is a call on a connection of an older generation (dialed before
// a promotion or a switch back): driver.ErrBadConn, so database/sql takes
// another connection where it can, and a retryable DB_UNAVAILABLE where it
// cannot (inside a transaction), not a 500.
var errStale = fmt.Errorf("storage: a connection to the cell's former database server: %w: %w", model.ErrDBUnavailable, driver.ErrBadConn)

// Promote makes the standby serve: first no statement of this cell reaches
// the primary any more (its connections are stale), then the standby stops
// taking the primary's binlog, applies everything it received (every
// acknowledged commit, under semi-synchronous replication), is marked as
// promoted, forgets the primary, and the pool dials it. Errors: the
// standby's, ErrStandbyUnknown (a standby that replicates from another
// server, or from none and is not marked); the standby is then not promoted,
// takes the binlog again, and the pool dials the primary again.
func (f *Failover) Promote(ctx context.Context) (err error) {
	if f.promoted.Load() {
		return nil
	}
	f.sw.refuse(errPromoting)
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		f.sw.resume()
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	stopped := false
	defer func() {
		if err == nil {
			return
		}
		if stopped {
			if _, rerr := db.ExecContext(context.WithoutCancel(ctx), "START SLAVE IO_THREAD"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("and taking the binlog again failed: %w", rerr))
			}
		}
		f.sw.resume()
	}()
	if err := f.leaseStillOurs(ctx, db); err != nil {
		return fmt.Errorf("storage: promote: %w", err)
	}
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return fmt.Errorf("storage: promote: read the replica's state: %w", err)
	}
	if st == nil {
		if marked, merr := promotedMark(ctx, db); merr != nil || !marked {
			return errors.Join(merr, ErrStandbyUnknown)
		}
	} else {
		if net.JoinHostPort(st["Master_Host"], st["Master_Port"]) != f.primaryAddr {
			return fmt.Errorf("%w: it replicates from %s:%s", ErrStandbyUnknown, st["Master_Host"], st["Master_Port"])
		}
		f.log.Info("failover: promoting the standby: stopping its replication")
		if _, err := db.ExecContext(ctx, "STOP SLAVE IO_THREAD"); err != nil {
			return fmt.Errorf("storage: promote: stop taking the binlog: %w", err)
		}
		stopped = true
		if st, err = slaveStatus(ctx, db); err != nil || st == nil {
			return errors.Join(err, errors.New("storage: promote: the replica's state went away"))
		}
		f.log.Info("failover: waiting for the standby to apply what it received", "gtid_io_pos", st["Gtid_IO_Pos"])
		var waited sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 60)", st["Gtid_IO_Pos"]).Scan(&waited); err != nil || !waited.Valid || waited.Int64 != 0 {
			last, _ := slaveStatus(ctx, db)
			return errors.Join(err, fmt.Errorf("storage: promote: the standby did not apply what it received (up to %q) within 60 s; its SQL thread: running %q, last error %q",
				st["Gtid_IO_Pos"], last["Slave_SQL_Running"], last["Last_SQL_Error"]))
		}
		if err := markPromoted(ctx, db, f.primaryAddr, st["Gtid_IO_Pos"]); err != nil {
			return fmt.Errorf("storage: promote: mark: %w", err)
		}
		f.log.Info("failover: applied and marked; forgetting the primary")
		if _, err := db.ExecContext(ctx, "STOP SLAVE"); err != nil {
			return fmt.Errorf("storage: promote: %w", err)
		}
		if _, err := db.ExecContext(ctx, "RESET SLAVE ALL"); err != nil {
			return fmt.Errorf("storage: promote: %w", err)
		}
		// No standby of its own yet: with semi-synchronous acknowledgement
		// on, its first commits would wait the whole timeout for a replica
		// there is not (rpl_semi_sync_master_wait_no_slave). Fail-back turns
		// it on again once its new standby replicates (cell/mover).
		if _, err := db.ExecContext(ctx, "SET GLOBAL rpl_semi_sync_master_enabled = 0"); err != nil {
			f.log.Warn("failover: could not turn semi-synchronous acknowledgement off on the promoted standby: its first commits may wait for the timeout", "err", err)
		}
	}
	sc, err := connectorOf(f.standby)
	if err != nil {
		return err
	}
	f.sw.set(sc)
	f.promoted.Store(true)
	f.Promotions.Add(1)
	f.primaryDown.Store(0)
	f.replicating.Store(-1) // no standby any more
	return nil
}

// primaryAlive: an error that came from the server (too many connections,
// access denied, ...) proves the server is up; only errors of the network
// or of time count as the primary being down.
func primaryAlive(err error) bool {
	var me *mysql.MySQLError
	return err == nil || errors.As(err, &me)
}

// Watch pings the primary every interval until ctx ends or the standby
// serves; once the primary has not answered for after, it promotes the
// standby (trying again at each ping while that fails). A primary that
// answers again before after ends the outage: a database restart (the
// db_restart drill, about a second) never promotes. While the primary
// answers it checks, every healthEvery pings, that the standby replicates
// with semi-synchronous acknowledgement on (Replicating); a standby found
// not replicating at the last check before an outage is not promoted
// (it may lack acknowledged commits): the cell waits for its primary, and
// logs why.
func (f *Failover) Watch(ctx context.Context, after, interval time.Duration) {
	f.watchMu.Lock()
	f.watchCtx, f.watchAfter, f.watchEvery = ctx, after, interval
	f.watchMu.Unlock()
	probe, err := sql.Open("mysql", f.primary)
	if err != nil {
		f.log.Error("failover: cannot watch the primary", "err", err)
		return
	}
	defer probe.Close()
	probe.SetMaxOpenConns(1)
	probe.SetConnMaxLifetime(time.Second) // a fresh connection each ping: a dead server is seen at once
	failing := incident.New(f.log, "failover: promoting the standby", incident.DefaultEvery)
	t := time.NewTicker(interval)
	defer t.Stop()
	for n := 0; !f.promoted.Load(); n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, min(interval, 2*time.Second))
		err := probe.PingContext(pctx)
		cancel()
		now := time.Now()
		if primaryAlive(err) {
			if down := f.primaryDown.Swap(0); down > 0 {
				f.log.Info("failover: the primary answers again; no promotion", "down_for", now.Sub(time.UnixMilli(down)).Round(time.Millisecond))
			}
			if n%healthEvery == 0 {
				f.checkReplication(ctx, probe)
			}
			continue
		}
		down := f.primaryDown.Load()
		if down == 0 {
			f.primaryDown.Store(now.UnixMilli())
			f.log.Warn("failover: the primary does not answer; the standby is promoted if it stays down", "after", after, "err", err)
			continue
		}
		if now.Sub(time.UnixMilli(down)) < after {
			continue
		}
		if f.replicating.Load() == 0 {
			failing.Fail(errors.New("the standby was not replicating (or the primary's semi-synchronous replication was off) at the last check: it may lack acknowledged commits"),
				"primary_down_for", now.Sub(time.UnixMilli(down)).Round(time.Second))
			continue
		}
		if err := f.Promote(ctx); err != nil {
			failing.Fail(err)
			continue
		}
		failing.OK()
		f.log.Warn("failover: the standby was promoted and serves; the old primary must be rebuilt as its standby",
			"primary_down_for", time.Since(time.UnixMilli(down)).Round(time.Millisecond))
	}
}

// checkReplication records whether the standby's replication threads run
// and the primary acknowledges semi-synchronously (Replicating).
func (f *Failover) checkReplication(ctx context.Context, primary *sql.DB) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ok := false
	defer func() {
		before := f.replicating.Swap(map[bool]int32{false: 0, true: 1}[ok])
		switch {
		case !ok && before != 0:
			f.log.Warn("failover: the standby does not replicate with semi-synchronous acknowledgement; it will not be promoted while this lasts")
		case ok && before == 0:
			f.log.Info("failover: the standby replicates with semi-synchronous acknowledgement again")
		}
	}()
	var name, status string
	if err := primary.QueryRowContext(cctx, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'").Scan(&name, &status); err != nil || status != "ON" {
		return
	}
	db, err := sql.Open("mysql", f.standby)
	if err != nil {
		return
	}
	defer db.Close()
	st, err := slaveStatus(cctx, db)
	ok = err == nil && st != nil && st["Slave_IO_Running"] == "Yes" && st["Slave_SQL_Running"] == "Yes" &&
		net.JoinHostPort(st["Master_Host"], st["Master_Port"]) == f.primaryAddr
}

// Serving tells which of a cell's two servers is its database now: the
// primary while its standby replicates from it (standby is then the
// standby's DSN), or the standby once a promotion marked it (standby is
// then "": the cell has none until the old primary is rebuilt as one).
// DSNs as Open takes them. Errors: the standby's, ErrStandbyUnknown.
func Serving(ctx context.Context, primaryDSN, standbyDSN string) (serving, standby string, err error) {
	if standbyDSN == "" {
		return primaryDSN, "", nil
	}
	sdsn, err := withParams(standbyDSN)
	if err != nil {
		return "", "", err
	}
	db, err := sql.Open("mysql", sdsn)
	if err != nil {
		return "", "", err
	}
	defer db.Close()
	scfg, _ := mysql.ParseDSN(sdsn)
	marked, err := promotedMark(ctx, db)
	if err != nil {
		return "", "", fmt.Errorf("storage: the standby at %s: %w", scfg.Addr, err)
	}
	if marked {
		return standbyDSN, "", nil
	}
	st, err := slaveStatus(ctx, db)
	if err != nil {
		return "", "", fmt.Errorf("storage: the standby at %s: %w", scfg.Addr, err)
	}
	pcfg, err := mysql.ParseDSN(primaryDSN)
	if err != nil {
		return "", "", fmt.Errorf("storage: bad DSN: %w", err)
	}
	if st == nil || net.JoinHostPort(st["Master_Host"], st["Master_Port"]) != pcfg.Addr {
		return "", "", ErrStandbyUnknown
	}
	return primaryDSN, standbyDSN, nil
}

// errSwitching refuses new connections while SwitchBack pauses the cell.
var errSwitching = model.Errorf(model.ErrDBUnavailable, "the cell's database is switching back to its primary; retry")

// ErrNotFailedOver: SwitchBack on a cell that serves from its primary.
var ErrNotFailedOver = errors.New("storage: the cell serves from its primary: nothing to switch back")

// SwitchBackResult is what a switch back took.
type SwitchBackResult struct {
	CaughtUp time.Duration // the primary applying the standby's binlog, before the pause
	Paused   time.Duration // from refusing connections to dialing the primary
	GTID     string        // the standby's binlog position the primary applied in the pause
}

// SwitchBack makes the primary serve again after a failover, once it was
// rebuilt as the standby's semi-synchronous replica (redcell cells
// failback): it checks that the primary replicates from the standby with
// both threads running and that the standby acknowledges semi-synchronously;
// lets the primary catch up; then, in a pause: no statement of this cell
// reaches the standby any more (its connections are stale, new ones
// refused), FLUSH TABLES WITH READ LOCK on the standby waits for the commits
// under way and holds later ones, the primary applies the standby's binlog
// up to its end (every acknowledged commit, the rule a promotion follows),
// stops replicating, and the pool dials the primary. The standby, its
// promotion mark removed, becomes the primary's semi-synchronous replica from
// the primary's binlog position (the primary logged all it applied), and
// the watch runs again. Errors before the primary stops replicating leave
// everything as it was (the cell serves from the standby again):
// ErrNotFailedOver, ErrStandbyUnknown (the primary is not the standby's
// replica), the servers'. An error after it is the standby's setup as a
// replica; the cell serves from its primary then, without a standby, and
// says so.
func (f *Failover) SwitchBack(ctx context.Context) (res SwitchBackResult, err error) {
	f.switching.Lock()
	defer f.switching.Unlock()
	if !f.promoted.Load() {
		return res, ErrNotFailedOver
	}
	pdb, err := sql.Open("mysql", f.primary)
	if err != nil {
		return res, err
	}
	defer pdb.Close()
	sdb, err := sql.Open("mysql", f.standby)
	if err != nil {
		return res, err
	}
	defer sdb.Close()
	scfg, _ := mysql.ParseDSN(f.standby)
	st, err := slaveStatus(ctx, pdb)
	if err != nil {
		return res, fmt.Errorf("storage: switch back: the primary: %w", err)
	}
	if st == nil || net.JoinHostPort(st["Master_Host"], st["Master_Port"]) != scfg.Addr || st["Slave_IO_Running"] != "Yes" || st["Slave_SQL_Running"] != "Yes" {
		return res, fmt.Errorf("%w: the primary must replicate from the standby at %s with both threads running first (redcell cells failback)", ErrStandbyUnknown, scfg.Addr)
	}
	if err := f.leaseStillOurs(ctx, sdb); err != nil {
		return res, fmt.Errorf("storage: switch back: %w", err)
	}
	if chs, err := moveChannels(ctx, sdb); err != nil || len(chs) > 0 {
		return res, errors.Join(err, fmt.Errorf("storage: switch back: moves into this cell are running (%v): switch back after them", chs))
	}
	var name, status string
	if err := sdb.QueryRowContext(ctx, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'").Scan(&name, &status); err != nil || status != "ON" {
		return res, errors.Join(err, fmt.Errorf("storage: switch back: the standby's semi-synchronous replication is %q, not ON", status))
	}
	t0 := time.Now()
	var pos string
	if err := sdb.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		return res, err
	}
	if err := gtidWait(ctx, pdb, pos, 60*time.Second); err != nil {
		return res, fmt.Errorf("storage: switch back: the primary catching up: %w", err)
	}
	res.CaughtUp = time.Since(t0)

	// The pause, bounded: the cell's calls are refused while it lasts.
	t1 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	wctx := context.WithoutCancel(ctx)
	f.log.Info("failover: switching back to the primary: pausing the cell's database calls")
	f.sw.refuse(errSwitching)
	lock, err := sdb.Conn(pctx)
	if err != nil {
		f.sw.resume()
		return res, err
	}
	defer lock.Close()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_, _ = lock.ExecContext(wctx, "UNLOCK TABLES")
			f.sw.resume()
		}
	}
	// FLUSH TABLES WITH READ LOCK waits for the commits under way, at most
	// lock_wait_timeout, and holds later ones. A statement that passed its
	// connection's staleness check just before the refusal may be among
	// those held: every other client connection is killed, so that nothing
	// held commits on the standby once it is unlocked (a killed
	// transaction rolls back; its client retries, on the primary).
	for _, q := range []string{"SET SESSION lock_wait_timeout = 10", "FLUSH TABLES WITH READ LOCK"} {
		if _, err := lock.ExecContext(pctx, q); err != nil {
			resume()
			return res, fmt.Errorf("storage: switch back: %s: %w", q, err)
		}
	}
	if err := killOthers(pctx, lock); err != nil {
		resume()
		return res, fmt.Errorf("storage: switch back: ending the standby's other connections: %w", err)
	}
	if err := lock.QueryRowContext(pctx, "SELECT @@gtid_binlog_pos").Scan(&res.GTID); err != nil {
		resume()
		return res, err
	}
	if err := gtidWait(pctx, pdb, res.GTID, 30*time.Second); err != nil {
		resume()
		return res, fmt.Errorf("storage: switch back: the primary applying the standby's last commits: %w", err)
	}
	// The promotion mark goes first (not logged: the primary has none): from
	// then on a restarted cell no longer takes the standby for its database.
	_, _ = lock.ExecContext(wctx, "UNLOCK TABLES")
	for _, q := range []string{"SET SESSION sql_log_bin = 0", "DROP DATABASE IF EXISTS redcell_failover", "SET SESSION sql_log_bin = 1"} {
		if _, err := lock.ExecContext(pctx, q); err != nil {
			resume()
			return res, fmt.Errorf("storage: switch back: the standby's promotion mark: %w", err)
		}
	}
	pc, err := connectorOf(f.primary)
	if err == nil {
		for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL"} {
			if _, err = pdb.ExecContext(wctx, q); err != nil {
				err = fmt.Errorf("the primary: %s: %w", q, err)
				break
			}
		}
	}
	if err != nil {
		// Still the standby's: it serves on, marked again.
		_, _ = pdb.ExecContext(wctx, "START SLAVE")
		_, _ = lock.ExecContext(wctx, "SET SESSION sql_log_bin = 0") // the primary replicates from it again: not its mark
		if merr := markPromoted(wctx, lock, f.primaryAddr, res.GTID); merr != nil {
			err = errors.Join(err, fmt.Errorf("and marking the standby as promoted again failed (a restarted cell would refuse to start): %w", merr))
		}
		resume()
		return res, fmt.Errorf("storage: switch back: %w", err)
	}
	// From here on the primary is the cell's database whatever happens. The
	// standby (the cell's calls to it refused) follows it before the first
	// commit, so the primary's semi-synchronous acknowledgement has its
	// replica from the start.
	resumed = true
	fctx, fcancel := context.WithTimeout(wctx, 30*time.Second)
	defer fcancel()
	ferr := f.followPrimary(fctx, lock, pdb)
	semisync := "SET GLOBAL rpl_semi_sync_master_enabled = 1"
	if ferr != nil {
		semisync = "SET GLOBAL rpl_semi_sync_master_enabled = 0" // no replica: its commits would wait for the timeout
	}
	if _, err := pdb.ExecContext(wctx, semisync); err != nil {
		ferr = errors.Join(ferr, fmt.Errorf("the primary: %s: %w", semisync, err))
	}
	f.sw.set(pc)
	f.promoted.Store(false)
	f.primaryDown.Store(0)
	f.replicating.Store(-1)
	res.Paused = time.Since(t1)
	f.log.Info("failover: the primary serves again", "paused", res.Paused.Round(time.Millisecond), "gtid", res.GTID)
	f.startWatch()
	if ferr != nil {
		f.log.Error("failover: the primary serves again, but the standby could not be made its replica: the cell has no standby until it is (docs/operations.md)", "err", ferr)
		return res, fmt.Errorf("storage: switch back: the primary serves; the standby's setup as its replica failed: %w", ferr)
	}
	return res, nil
}

// killOthers ends every client connection of the server behind conn but
// conn and replication's (a replica's binlog dump).
func killOthers(ctx context.Context, conn *sql.Conn) error {
	return killConns(ctx, conn, "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() "+
		"AND user <> 'system user' AND command NOT IN ('Binlog Dump', 'Binlog Dump GTID', 'Daemon', 'Killed')")
}

// killConns ends the connections whose ids query lists (a connection that
// ended meanwhile is not an error).
func killConns(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, query string, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		if _, err := q.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil && !isMySQLErr(err, errNoSuchThread) {
			return fmt.Errorf("ending connection %d: %w", id, err)
		}
	}
	return nil
}

// errNoSuchThread: KILL of a connection that ended meanwhile.
const errNoSuchThread = 1094

// followPrimary makes the server behind conn (the standby, which served
// until now, its tables unlocked, its promotion mark gone) the
// semi-synchronous replica of the primary, from the primary's binlog
// position, by GTID.
func (f *Failover) followPrimary(ctx context.Context, conn *sql.Conn, pdb *sql.DB) error {
	var ppos string
	if err := pdb.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&ppos); err != nil {
		return err
	}
	pcfg, _ := mysql.ParseDSN(f.primary)
	host, port, err := net.SplitHostPort(pcfg.Addr)
	if err != nil {
		return err
	}
	for _, q := range []string{
		"SET GLOBAL gtid_slave_pos = " + sqlQuote(ppos),
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%s, MASTER_USER=%s, MASTER_PASSWORD=%s, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
			sqlQuote(host), port, sqlQuote(pcfg.User), sqlQuote(pcfg.Passwd)),
		"SET GLOBAL rpl_semi_sync_slave_enabled = 1",
		// A replica now: its applier's commits must not wait for
		// acknowledgements of its own.
		"SET GLOBAL rpl_semi_sync_master_enabled = 0",
		"START SLAVE",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			words := strings.Fields(q)
			return fmt.Errorf("%s: %w", strings.Join(words[:min(3, len(words))], " "), err)
		}
	}
	return nil
}

// startWatch runs Watch again with the arguments it was last given (after a
// switch back; none: it was never started).
func (f *Failover) startWatch() {
	f.watchMu.Lock()
	ctx, after, every := f.watchCtx, f.watchAfter, f.watchEvery
	f.watchMu.Unlock()
	if ctx != nil && ctx.Err() == nil {
		go f.Watch(ctx, after, every)
	}
}

// gtidWait waits, in MASTER_GTID_WAIT, until the replica behind db has
// applied pos, up to max.
func gtidWait(ctx context.Context, db *sql.DB, pos string, max time.Duration) error {
	var waited sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", pos, max.Seconds()).Scan(&waited); err != nil {
		return err
	}
	if !waited.Valid || waited.Int64 != 0 {
		return fmt.Errorf("GTID %s not applied within %s", pos, max)
	}
	return nil
}

func sqlQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// markPromoted leaves the promotion mark on the server behind db (the
// standby that serves): redcell_failover.t_promoted.
func markPromoted(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, oldPrimary, gtid string) error {
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS redcell_failover" + dbDefaults,
		"CREATE TABLE IF NOT EXISTS redcell_failover.t_promoted (id TINYINT NOT NULL PRIMARY KEY, " +
			"old_primary VARCHAR(255) NOT NULL, gtid VARCHAR(255) NOT NULL, promoted_ms BIGINT NOT NULL) ENGINE=InnoDB",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, "REPLACE INTO redcell_failover.t_promoted VALUES (1, ?, ?, ?)", oldPrimary, gtid, time.Now().UnixMilli())
	return err
}
