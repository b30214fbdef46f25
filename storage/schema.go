// Package storage is redcell's MySQL/MariaDB store. One MySQL value talks to one
// cell's database server, which holds the databases db_00..db_99 of the shards the
// cell owns. Table names are built only from validated integers:
//
//	db_XX.t_account_Y        wallets of shard XX*10+Y
//	db_XX.t_flow_Y           every balance change of those wallets (UNIQUE act_id, order_no)
//	db_XX.t_packet_Y_DD      red packets created on day DD by senders of the shard
//	db_XX.t_claim_Y_DD       their claims (UNIQUE packet_id, act_id); each owes its claimant a credit (the relay's outbox)
//	db_XX.t_packet_Y_00      the archive: settled packets older than the retention, moved
//	db_XX.t_claim_Y_00       with their claims (ArchiveDay), so day DD is empty when it comes round
//	db_XX.t_relay_position   the relay's position: every claim of the database created before it is credited
//	db_XX.t_identity_Y       app accounts bound to actIDs, homed in shard XX*10+Y (phones only as keyed hashes)
//	db_XX.t_reward           rewards issued to the actIDs of the database's shards (UNIQUE order_no), booked behind
package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/clock"
	"redcell/internal/invariant"
	"redcell/model"
)

// dbDefaults follows every CREATE DATABASE: its tables compare text byte by
// byte (an order number "O-1" is not "o-1", nor act_id "Alice" "alice"),
// whatever the server's own default collation is (MariaDB's is
// case-insensitive unless set otherwise).
const dbDefaults = " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

// tableNames are a store's database and table names, made once per
// namespace instead of formatted for every statement: the shard tables'
// and the per-database tables' all at once, each shard's day tables (32
// days, the archive's included) the first time the shard is used.
type tableNames struct {
	ns                   string
	db, relayPos         [model.ShardCount / 10]string
	reward               [model.ShardCount / 10]string
	couponReq, couponPer [model.ShardCount / 10]string
	account, flow        [model.ShardCount]string
	days                 [model.ShardCount]atomic.Pointer[dayNames]
}

// dayNames are one shard's day tables, by day of month (ArchiveDay: the
// archive's).
type dayNames struct {
	packet, claim [32]string
}

func newTableNames(ns string) *tableNames {
	n := &tableNames{ns: ns}
	for db := range n.db {
		n.db[db] = fmt.Sprintf("%sdb_%02d", ns, db)
		n.relayPos[db] = n.db[db] + ".t_relay_position"
		n.reward[db] = n.db[db] + ".t_reward"
		n.couponReq[db] = n.db[db] + ".t_coupon_req"
		n.couponPer[db] = n.db[db] + ".t_coupon_person"
	}
	for s := range n.account {
		sh := model.ShardID(s)
		n.account[s] = fmt.Sprintf("%s.t_account_%d", n.db[sh.DB()], sh.Table())
		n.flow[s] = fmt.Sprintf("%s.t_flow_%d", n.db[sh.DB()], sh.Table())
	}
	return n
}

// dayOf is shard s's day tables, made on first use (two goroutines may
// both make them; either copy is right).
func (n *tableNames) dayOf(s model.ShardID) *dayNames {
	if d := n.days[s].Load(); d != nil {
		return d
	}
	d := &dayNames{}
	for day := range d.packet {
		d.packet[day] = fmt.Sprintf("%s.t_packet_%d_%02d", n.db[s.DB()], s.Table(), day)
		d.claim[day] = fmt.Sprintf("%s.t_claim_%d_%02d", n.db[s.DB()], s.Table(), day)
	}
	n.days[s].Store(d)
	return d
}

// tableNamesOf is the store's names for its current namespace (m.ns).
func (m *MySQL) tableNamesOf() *tableNames {
	if n := m.names.Load(); n != nil && n.ns == m.ns {
		return n
	}
	n := newTableNames(m.ns)
	m.names.Store(n)
	return n
}

func (m *MySQL) dbName(s model.ShardID) string {
	invariant.That(s.Valid(), "shard out of range")
	return m.tableNamesOf().db[s.DB()]
}

func (m *MySQL) accountTable(s model.ShardID) string {
	invariant.That(s.Valid(), "shard out of range")
	return m.tableNamesOf().account[s]
}
func (m *MySQL) flowTable(s model.ShardID) string {
	invariant.That(s.Valid(), "shard out of range")
	return m.tableNamesOf().flow[s]
}
func (m *MySQL) relayPosTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return m.tableNamesOf().relayPos[db]
}

// ArchiveDay is the "day" of a shard's archive tables, t_packet_Y_00 and
// t_claim_Y_00: no day of a month is 0, so the archive keeps the day tables'
// name shape and columns, and everything that reads packet and claim tables
// (the audits, reconciliation) reads it as one more day. Packets move there
// with their claims once settled and older than the retention (Archive).
const ArchiveDay = 0

// archiveEnsure is the ensureKey.day of a shard's archive tables (day 0 is
// the shard's own tables).
const archiveEnsure = -5

func (m *MySQL) packetTable(s model.ShardID, day int) string {
	invariant.That(day >= ArchiveDay && day <= 31, "day out of range")
	invariant.That(s.Valid(), "shard out of range")
	return m.tableNamesOf().dayOf(s).packet[day]
}

func (m *MySQL) claimTable(s model.ShardID, day int) string {
	invariant.That(day >= ArchiveDay && day <= 31, "day out of range")
	invariant.That(s.Valid(), "shard out of range")
	return m.tableNamesOf().dayOf(s).claim[day]
}

func (m *MySQL) shardDDL(s model.ShardID) []string {
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + m.dbName(s) + dbDefaults,
		`CREATE TABLE IF NOT EXISTS ` + m.accountTable(s) + ` (
  act_id     VARCHAR(64) NOT NULL PRIMARY KEY,
  balance    BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  CONSTRAINT balance_not_negative CHECK (balance >= 0)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + m.flowTable(s) + ` (
  id            BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  act_id        VARCHAR(64) NOT NULL,
  order_no      VARCHAR(80) NOT NULL,
  kind          VARCHAR(12) NOT NULL,
  amount        BIGINT NOT NULL,
  balance_after BIGINT NULL,
  ref           VARCHAR(40) NOT NULL DEFAULT '',
  req_hash      CHAR(32) NOT NULL DEFAULT '',
  created_ms    BIGINT NOT NULL,
  UNIQUE KEY uk_order (act_id, order_no),
  KEY k_act_time (act_id, created_ms)
) ENGINE=InnoDB`,
		// Flow tables made before k_act_time existed get it here (a no-op
		// where it exists): the wallet's flow listing reads by it.
		`ALTER TABLE ` + m.flowTable(s) + ` ADD INDEX IF NOT EXISTS k_act_time (act_id, created_ms)`,
		m.relayPosDDL(s.DB()),
	}
}

// relayPosDDL makes database db's relay position table (storage.SetRelayPositions):
// one row, id 1.
func (m *MySQL) relayPosDDL(db int) string {
	return `CREATE TABLE IF NOT EXISTS ` + m.relayPosTable(db) + ` (
  id         TINYINT NOT NULL PRIMARY KEY,
  pos_ms     BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL
) ENGINE=InnoDB`
}

func (m *MySQL) dayDDL(s model.ShardID, day int) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + m.packetTable(s, day) + ` (
  packet_id        CHAR(27) NOT NULL PRIMARY KEY,
  sender           VARCHAR(64) NOT NULL,
  order_no         VARCHAR(64) NOT NULL,
  kind             VARCHAR(8) NOT NULL,
  greeting         VARCHAR(256) NOT NULL,
  amount           BIGINT NOT NULL,
  count            BIGINT NOT NULL,
  remaining_amount BIGINT NOT NULL,
  remaining_count  BIGINT NOT NULL,
  refund_amount    BIGINT NOT NULL DEFAULT 0,
  status           TINYINT NOT NULL,
  created_ms       BIGINT NOT NULL,
  expires_ms       BIGINT NOT NULL,
  KEY k_expiry (status, expires_ms),
  KEY k_created (created_ms),
  CONSTRAINT remaining_not_negative CHECK (remaining_amount >= 0 AND remaining_count >= 0)
) ENGINE=InnoDB`,
		// Packet tables made before k_created existed get it here (a no-op
		// where it exists): the archive pass finds old packets by it.
		`ALTER TABLE ` + m.packetTable(s, day) + ` ADD INDEX IF NOT EXISTS k_created (created_ms)`,
		`CREATE TABLE IF NOT EXISTS ` + m.claimTable(s, day) + ` (
  packet_id  CHAR(27) NOT NULL,
  seq        BIGINT NOT NULL,
  act_id     VARCHAR(64) NOT NULL,
  amount     BIGINT NOT NULL,
  created_ms BIGINT NOT NULL,
  act_shard  SMALLINT NOT NULL DEFAULT -1,
  dest       VARCHAR(64) NOT NULL DEFAULT '',
  PRIMARY KEY (packet_id, seq),
  UNIQUE KEY uk_claim (packet_id, act_id),
  KEY k_created (created_ms),
  CONSTRAINT share_positive CHECK (amount >= 1)
) ENGINE=InnoDB`,
		// Claim tables made before a claim was its own outbox row get its
		// claimant's shard (-1 in rows made before: computed from act_id)
		// and the cell its credit goes to (Credit.Dest) here.
		`ALTER TABLE ` + m.claimTable(s, day) + ` ADD COLUMN IF NOT EXISTS act_shard SMALLINT NOT NULL DEFAULT -1 AFTER created_ms, ADD COLUMN IF NOT EXISTS dest VARCHAR(64) NOT NULL DEFAULT '' AFTER act_shard`,
		// Claim tables made before k_created existed get it here (a no-op,
		// a fraction of a millisecond, where it exists): reconciliation reads
		// a time window by it. Day tables are reused month after month.
		`ALTER TABLE ` + m.claimTable(s, day) + ` ADD INDEX IF NOT EXISTS k_created (created_ms)`,
	}
}

// MySQL is the store of one cell. It is safe for concurrent use.
type MySQL struct {
	db       *sql.DB
	clock    clock.Clock                // the only source of time: rows' times, expiry, cache ages, retry waits
	ns       string                     // database name prefix: base for real money, base+ShadowPrefix for stress traffic
	base     string                     // the namespace of OpenPrefixed ("" for Open): prefixes ns
	filter   *dbFilter                  // the databases the table listings take (SetDBFilter)
	bulk     creditPaths                // how credits were booked (credits.go)
	issues   issuePaths                 // how grouped issues were stored (rewardissue.go)
	accepts  issuePaths                 // how grouped coupon accepts were stored (couponaccept.go)
	trips    *atomic.Int64              // round trips to the server, over both pools (switchConnector)
	sw       *switchConnector           // what both pools dial through
	gate     *gate                      // the pool's breaker (SetBreaker)
	maxConns int                        // the pool's connections at most
	shadow   *shadowOf                  // the real store's Shadow, shared by both
	txConns  *txConnMap                 // inTx's transactions and their connections (counted.go)
	names    atomic.Pointer[tableNames] // made for ns on first use (tableNamesOf)
	// upgradedNS: the namespace whose claim tables upgradeClaimTables has
	// brought to this version's columns.
	upgradedNS atomic.Pointer[string]
	upgradeMu  sync.Mutex // one upgradeClaimTables at a time
	// claimRereads: groups run again with their openers' claims read (a
	// repeat, or an open answered SOLD_OUT or EXPIRED; CommitGroup).
	claimRereads atomic.Int64
	// unfitMS: when (Unix ms) a group that locks rows last ran with
	// savepoints after an unfit bulk list (CommitGroup, unfitQuiet).
	unfitMS atomic.Int64
	// belowHorizon counts credits left unbooked below their database's
	// credits horizon (dropExported).
	belowHorizon atomic.Int64

	mu           sync.Mutex               // guards ensured, forgets, errs, tableList, tableKnown, tableListAt, tableMade
	ensured      map[ensureKey]*sync.Once // tables created by this process
	forgets      int64                    // times forgetDBs dropped entries of ensured
	errs         map[ensureKey]error
	tableList    []tableRef        // packet and claim tables known to exist (ExpiredIn, ReconWindow)
	tableKnown   map[tableRef]bool // the entries of tableList
	tableListAt  time.Time
	tableListGen int64 // the filter's generation the list was read under
	// tableMade: day tables EnsureDay made sure of since the last forgetTables.
	// A refresh of tableList reads information_schema without the lock, so it
	// may miss a table made meanwhile; every refresh merges these back in.
	tableMade map[tableRef]bool
}

type ensureKey struct {
	shard model.ShardID
	day   int // 0 = the shard's account and flow tables and its database's relay position; identityDay its identity table
}

// Open connects to a MariaDB/MySQL server. dsn is a go-sql-driver DSN without a
// database name, e.g. "root@tcp(127.0.0.1:3307)/". maxConns caps open connections.
func Open(dsn string, maxConns int) (*MySQL, error) {
	full, err := withParams(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := connectorOf(full)
	if err != nil {
		return nil, fmt.Errorf("storage: open: %w", err)
	}
	// A connector that never switches: it counts the round trips.
	return newMySQL(&switchConnector{cur: conn}, maxConns), nil
}

// OpenPrefixed is Open for a store whose databases carry a name prefix:
// prefix+"db_XX" for real money, prefix+"shadow_db_XX" for stress traffic,
// prefix+"redcell_meta" and prefix+"shadow_redcell_meta" for the
// reconciliation positions. Several clusters of test cells share one server
// this way, each layout with books of its own (cell tests,
// internal/testaudit). prefix is lower-case letters and digits ending in
// "_", not "shadow_". Moves and their records (MoveSchemas, Digest,
// redcell_meta.t_ownership and t_moved_out) know the unprefixed names only:
// a prefixed store is not for cells that move databases.
func OpenPrefixed(dsn string, maxConns int, prefix string) (*MySQL, error) {
	if !ValidPrefix(prefix) {
		return nil, fmt.Errorf("storage: bad database name prefix %q (lower-case letters and digits, then _; not shadow_)", prefix)
	}
	m, err := Open(dsn, maxConns)
	if err != nil {
		return nil, err
	}
	m.ns, m.base = prefix, prefix
	return m, nil
}

// ValidPrefix reports whether prefix can name a store's databases
// (OpenPrefixed): lower-case letters and digits ending in "_", not
// ShadowPrefix, which names the stress space.
func ValidPrefix(prefix string) bool {
	if len(prefix) < 2 || len(prefix) > 24 || prefix[len(prefix)-1] != '_' || prefix == ShadowPrefix {
		return false
	}
	for _, c := range prefix[:len(prefix)-1] {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Prefix is the store's database name prefix: "" for Open's store,
// OpenPrefixed's prefix, ShadowPrefix after it for a Shadow store.
func (m *MySQL) Prefix() string { return m.ns }

// newMySQL is the store over pool db.
// newMySQL returns a store of real money whose pool (up to maxConns
// connections) dials through sw.
func newMySQL(sw *switchConnector, maxConns int) *MySQL {
	m := &MySQL{clock: clock.Real{}, ensured: map[ensureKey]*sync.Once{}, errs: map[ensureKey]error{}, filter: &dbFilter{},
		txConns: &txConnMap{}, sw: sw, maxConns: maxConns, shadow: &shadowOf{}}
	m.db, m.gate = openPool(sw, maxConns)
	m.trips = &sw.trips
	return m
}

// openPool opens a pool of up to maxConns connections dialed through sw,
// behind a gate of its own.
func openPool(sw *switchConnector, maxConns int) (*sql.DB, *gate) {
	g := &gate{}
	db := sql.OpenDB(&gateConnector{sw: sw, gate: g})
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	// Recycle connections so a restarted server's stale sockets do not linger.
	db.SetConnMaxLifetime(5 * time.Minute)
	return db, g
}

// shadowOf holds a store's Shadow, made once.
type shadowOf struct {
	once  sync.Once
	store atomic.Pointer[MySQL]
}

// dbFilter says which databases the store's table listings (the ledger, the
// cell audit, the archive, the expiry and reconciliation table lists) take;
// shared by a store and its Shadow.
type dbFilter struct {
	keep atomic.Pointer[func(db int) bool]
	gen  atomic.Int64 // bumped when what keep accepts changes (FilterChanged)
	// dest names the cell a claimant's shard is credited at now (SetCreditDest).
	dest atomic.Pointer[func(model.ShardID) string]
}

// SetDBFilter makes the store list the tables of the databases keep accepts
// only (nil: all): a server holding a copy of a database another cell owns
// now (a move's, until it is dropped) or a copy being made must not count it
// as its own. It applies to the Shadow stores made from this one too.
func (m *MySQL) SetDBFilter(keep func(db int) bool) {
	if keep == nil {
		m.filter.keep.Store(nil)
		return
	}
	m.filter.keep.Store(&keep)
}

// SetCreditDest sets how the store names, in a new claim row, the cell its
// credit goes to: the cell that owns the claimant's shard when the claim is
// made ("" when none does; nil: "" for every row). The relay reads it back
// (Credit.Dest) to ask that cell before it delivers the credit anywhere else.
// It applies to the Shadow stores made from this one too.
func (m *MySQL) SetCreditDest(dest func(model.ShardID) string) {
	if dest == nil {
		m.filter.dest.Store(nil)
		return
	}
	m.filter.dest.Store(&dest)
}

// creditDest is SetCreditDest's name for a credit to a claimant of shard sh.
func (m *MySQL) creditDest(sh model.ShardID) string {
	if m.filter == nil {
		return ""
	}
	if f := m.filter.dest.Load(); f != nil {
		return (*f)(sh)
	}
	return ""
}

// FilterChanged says that what the filter accepts changed (a database moved
// in or out): the cached table lists of this store and its Shadow stores are
// read again at their next use.
func (m *MySQL) FilterChanged() {
	if m.filter != nil {
		m.filter.gen.Add(1)
	}
}

func (m *MySQL) filterGen() int64 {
	if m.filter == nil {
		return 0
	}
	return m.filter.gen.Load()
}

// keeps reports whether the store's listings take database db.
func (m *MySQL) keeps(db int) bool {
	if m.filter == nil {
		return true
	}
	f := m.filter.keep.Load()
	return f == nil || (*f)(db)
}

// withParams sets the driver parameters every connection needs, whatever the
// DSN says: client-side interpolation (one round trip per statement), utf8mb4,
// timeouts, and clientFoundRows off — the credit path relies on an unchanged
// duplicate reporting 0 rows affected.
func withParams(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("storage: bad DSN: %w", err)
	}
	cfg.InterpolateParams = true
	cfg.MultiStatements = true // group commit sends its reads and its writes as one statement list each
	cfg.ClientFoundRows = false
	cfg.Collation = "utf8mb4_bin"
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 30*time.Second, 30*time.Second
	cfg.ParseTime = false
	return cfg.FormatDSN(), nil
}

// ShadowPrefix names the shadow databases: shadow_db_00 .. shadow_db_99 hold
// the same tables as db_XX for stress-test traffic.
const ShadowPrefix = "shadow_"

// Shadow returns the store over the same server that reads and writes the
// shadow databases: stress-test traffic never touches real rows. It is made
// on the first call (with the store's clock; SetClock on the store sets
// both) and the same after: one per store, with a connection pool of its
// own (up to as many connections as the store's: a cell opens up to twice
// max_conns) behind a breaker of its own (SetBreaker on it), so stress
// traffic neither takes real money's connections nor opens its breaker. The
// shadow store's Shadow is itself. The store's Close closes both pools; a
// shadow store's Close closes its own only.
func (m *MySQL) Shadow() *MySQL {
	if m.ns != m.base {
		return m
	}
	m.shadow.once.Do(func() {
		sh := &MySQL{clock: m.clock, ns: m.base + ShadowPrefix, base: m.base, ensured: map[ensureKey]*sync.Once{}, errs: map[ensureKey]error{},
			filter: m.filter, trips: m.trips, txConns: m.txConns, sw: m.sw, maxConns: m.maxConns, shadow: m.shadow}
		sh.db, sh.gate = openPool(m.sw, m.maxConns)
		m.shadow.store.Store(sh)
	})
	return m.shadow.store.Load()
}

// RoundTrips is how many round trips the store's connections have made to
// its server since it was opened, whatever they carried: a statement or a
// statement list, a BEGIN (two with an isolation level), a COMMIT or
// ROLLBACK, a ping; not those its breaker refused (SetBreaker). Shadow
// stores share their store's count.
func (m *MySQL) RoundTrips() int64 {
	if m.trips == nil {
		return 0
	}
	return m.trips.Load()
}

// Ping checks the connection.
func (m *MySQL) Ping(ctx context.Context) error { return m.db.PingContext(ctx) }

// Close closes the store's pool, and its Shadow's when it was made; a
// shadow store's Close closes its own pool only.
func (m *MySQL) Close() error {
	err := m.db.Close()
	if sh := m.shadow.store.Load(); m.ns == m.base && sh != nil {
		err = errors.Join(err, sh.db.Close())
	}
	return err
}

// SetClock replaces the clock (tests and the simulation; nil: the system
// clock), of the store's Shadow too when it was made (a shadow store's
// SetClock sets its own only). Call it before the store is used: it is not
// synchronized.
func (m *MySQL) SetClock(c clock.Clock) {
	m.clock = clock.Or(c)
	if sh := m.shadow.store.Load(); m.ns == m.base && sh != nil {
		sh.clock = m.clock
	}
}

// nowMS is the store's clock in Unix ms.
func (m *MySQL) nowMS() int64 { return m.clock.Now().UnixMilli() }
