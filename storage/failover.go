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

	"redcell/internal/clock"
	"redcell/internal/incident"
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
	clock            clock.Clock // where Watch, Promote and SwitchBack read time (SetClock)

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
	f := &Failover{primary: primary, standby: standby, primaryAddr: pcfg.Addr, sw: &switchConnector{cur: pc}, maxConns: maxConns, log: log,
		clock: clock.Real{}}
	f.replicating.Store(-1)
	// On the system clock: no other can be set before OpenFailover returns
	// the Failover (tests shorten standbyWait instead).
	role, err := f.standbyRole()
	for deadline := f.clock.Now().Add(standbyWait); err != nil && f.clock.Now().Before(deadline); {
		<-f.clock.After(time.Second)
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

// SetClock replaces the system clock (nil) as where Watch, Promote and
// SwitchBack read time: the outage's length, the promotion's mark, a switch
// back's durations. Call it before Watch: it is not synchronized.
func (f *Failover) SetClock(c clock.Clock) { f.clock = clock.Or(c) }

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
	tick := clock.NewTicker(f.clock, interval) // a ping per interval, however long a promotion's try took
	for n := 0; !f.promoted.Load(); n++ {
		if !tick.Wait(ctx) {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, min(interval, 2*time.Second))
		err := probe.PingContext(pctx)
		cancel()
		now := f.clock.Now()
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
			"primary_down_for", f.clock.Now().Sub(time.UnixMilli(down)).Round(time.Millisecond))
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
