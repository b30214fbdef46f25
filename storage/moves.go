package storage

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"redcell/model"
)

// A cell's shard ownership survives restarts in its own database, so that a
// database moved away is never claimed again from a stale config file:
// redcell_meta.t_ownership holds the ranges and the map version the cell
// announces, and redcell_meta.t_moved_out the databases it handed over and
// still holds a copy of (dropped after a grace period, cell/moves.go).

const (
	ownershipTable = "redcell_meta.t_ownership"
	movedOutTable  = "redcell_meta.t_moved_out"
)

func (m *MySQL) makeMetaTables(ctx context.Context) error {
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS redcell_meta" + dbDefaults,
		`CREATE TABLE IF NOT EXISTS ` + ownershipTable + ` (
  cell       VARCHAR(64) NOT NULL PRIMARY KEY,
  ranges     VARCHAR(512) NOT NULL,
  version    BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + movedOutTable + ` (
  cell        VARCHAR(64) NOT NULL,
  db          SMALLINT NOT NULL,
  version     BIGINT NOT NULL,
  digest      CHAR(64) NOT NULL,
  released_ms BIGINT NOT NULL,
  PRIMARY KEY (cell, db)
) ENGINE=InnoDB`,
	} {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("storage: meta tables: %w", err)
		}
	}
	return nil
}

// Ownership returns the shard ranges (sharding.Ranges form, "" for none) and
// map version cell last saved, and whether it ever saved any.
func (m *MySQL) Ownership(ctx context.Context, cell string) (ranges string, version int64, found bool, err error) {
	err = m.db.QueryRowContext(ctx, "SELECT ranges, version FROM "+ownershipTable+" WHERE cell = ?", cell).Scan(&ranges, &version)
	switch {
	case errors.Is(err, sql.ErrNoRows), isMySQLErr(err, errNoSuchTable), isMySQLErr(err, errUnknownDB):
		return "", 0, false, nil
	case err != nil:
		return "", 0, false, fmt.Errorf("storage: ownership of %s: %w", cell, err)
	}
	return ranges, version, true, nil
}

// SaveOwnership records cell's ranges and version. A version below the one
// saved is refused (an older plan never overwrites a newer one).
func (m *MySQL) SaveOwnership(ctx context.Context, cell, ranges string, version int64) error {
	if err := m.makeMetaTables(ctx); err != nil {
		return err
	}
	res, err := m.db.ExecContext(ctx, "INSERT INTO "+ownershipTable+" (cell, ranges, version, updated_ms) VALUES (?, ?, ?, ?)"+
		" ON DUPLICATE KEY UPDATE ranges = IF(VALUES(version) >= version, VALUES(ranges), ranges),"+
		" updated_ms = IF(VALUES(version) >= version, VALUES(updated_ms), updated_ms), version = GREATEST(version, VALUES(version))",
		cell, ranges, version, m.clock.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("storage: save ownership of %s: %w", cell, err)
	}
	if _, v, _, err := m.Ownership(ctx, cell); err == nil && v > version {
		return fmt.Errorf("storage: ownership of %s is at version %d, above %d", cell, v, version)
	}
	_ = res
	return nil
}

// SaveMove saves, in one transaction, cell's new ranges and version and the
// record of the database the change concerns: add (a database handed over,
// kept until dropped) when not nil, and the record of database forget
// removed when forget >= 0 (a database adopted). Nothing is saved on an
// error. A version below the one saved is refused.
func (m *MySQL) SaveMove(ctx context.Context, cell, ranges string, version int64, add *MovedOut, forget int) error {
	if err := m.makeMetaTables(ctx); err != nil {
		return err
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("storage: save move: %w", err)
	}
	defer tx.Rollback()
	var saved int64
	err = tx.QueryRowContext(ctx, "SELECT version FROM "+ownershipTable+" WHERE cell = ? FOR UPDATE", cell).Scan(&saved)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("storage: save move: %w", err)
	}
	if saved > version {
		return fmt.Errorf("storage: ownership of %s is at version %d, above %d", cell, saved, version)
	}
	now := m.clock.Now().UnixMilli()
	if _, err := tx.ExecContext(ctx, "REPLACE INTO "+ownershipTable+" (cell, ranges, version, updated_ms) VALUES (?, ?, ?, ?)", cell, ranges, version, now); err != nil {
		return fmt.Errorf("storage: save move: %w", err)
	}
	if add != nil {
		if _, err := tx.ExecContext(ctx, "REPLACE INTO "+movedOutTable+" (cell, db, version, digest, released_ms) VALUES (?, ?, ?, ?, ?)",
			cell, add.DB, add.Version, add.Digest, add.ReleasedMS); err != nil {
			return fmt.Errorf("storage: save move: %w", err)
		}
	}
	if forget >= 0 {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+movedOutTable+" WHERE cell = ? AND db = ?", cell, forget); err != nil {
			return fmt.Errorf("storage: save move: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("storage: save move: %w", err)
	}
	return nil
}

// MovedOut is a database cell Cell handed to another and still holds a copy
// of: Digest is the copy's Digest.Sum when it was handed over. A record with
// no Digest marks a database frozen by a move in progress.
type MovedOut struct {
	Cell       string
	DB         int
	Version    int64
	Digest     string
	ReleasedMS int64
}

// AddMovedOut records a database handed over.
func (m *MySQL) AddMovedOut(ctx context.Context, mo MovedOut) error {
	if err := m.makeMetaTables(ctx); err != nil {
		return err
	}
	_, err := m.db.ExecContext(ctx, "REPLACE INTO "+movedOutTable+" (cell, db, version, digest, released_ms) VALUES (?, ?, ?, ?, ?)",
		mo.Cell, mo.DB, mo.Version, mo.Digest, mo.ReleasedMS)
	if err != nil {
		return fmt.Errorf("storage: record db_%02d moved out: %w", mo.DB, err)
	}
	return nil
}

// MovedOuts lists cell's databases handed over and not dropped yet, and
// those frozen by a move in progress, by db.
func (m *MySQL) MovedOuts(ctx context.Context, cell string) ([]MovedOut, error) {
	rows, err := m.db.QueryContext(ctx, "SELECT cell, db, version, digest, released_ms FROM "+movedOutTable+" WHERE cell = ? ORDER BY db", cell)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: moved-out databases: %w", err)
	}
	defer rows.Close()
	var out []MovedOut
	for rows.Next() {
		var mo MovedOut
		if err := rows.Scan(&mo.Cell, &mo.DB, &mo.Version, &mo.Digest, &mo.ReleasedMS); err != nil {
			return nil, fmt.Errorf("storage: moved-out databases: %w", err)
		}
		out = append(out, mo)
	}
	return out, rows.Err()
}

// DropMovedOut drops db_XX and shadow_db_XX of a database handed over, and
// its record. The caller has checked the copy is unchanged (DBDigest).
func (m *MySQL) DropMovedOut(ctx context.Context, cell string, db int) error {
	for _, schema := range MoveSchemas(db) {
		if _, err := m.db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+schema); err != nil {
			return fmt.Errorf("storage: drop %s: %w", schema, err)
		}
	}
	m.forgetTables()
	if _, err := m.db.ExecContext(ctx, "DELETE FROM "+movedOutTable+" WHERE cell = ? AND db = ?", cell, db); err != nil {
		return fmt.Errorf("storage: drop db_%02d record: %w", db, err)
	}
	return nil
}

// MoveSchemas are the schemas that move with database db: db_XX and its
// stress-traffic twin shadow_db_XX.
func MoveSchemas(db int) []string {
	return []string{fmt.Sprintf("db_%02d", db), fmt.Sprintf("%sdb_%02d", ShadowPrefix, db)}
}

// Digest is the content of a database's schemas as a move verifies it: every
// table's row count and CHECKSUM TABLE, by "schema.table". Empty tables and
// missing ones compare equal (a day table one side made and the other not).
type Digest map[string]TableDigest

// TableDigest is one table's row count and checksum.
type TableDigest struct {
	Rows     int64
	Checksum int64
}

// Sum is a SHA-256 over the digest's non-empty tables in name order: two
// servers hold the same rows iff their sums are equal.
func (d Digest) Sum() string {
	names := make([]string, 0, len(d))
	for n, t := range d {
		if t.Rows > 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s %d %d\n", n, d[n].Rows, d[n].Checksum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Diff names the tables whose rows differ between d and o (at most 5).
func (d Digest) Diff(o Digest) []string {
	var out []string
	seen := map[string]bool{}
	for _, pair := range [2][2]Digest{{d, o}, {o, d}} {
		for n, t := range pair[0] {
			if seen[n] {
				continue
			}
			seen[n] = true
			u := pair[1][n]
			if (t.Rows > 0 || u.Rows > 0) && t != u {
				out = append(out, fmt.Sprintf("%s: %d rows/%d vs %d rows/%d", n, d[n].Rows, d[n].Checksum, o[n].Rows, o[n].Checksum))
			}
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = out[:5]
	}
	return out
}

// digestWorkers is how many connections DBDigest reads tables on at once.
const digestWorkers = 4

// DBDigest reads the Digest of database db's schemas (MoveSchemas) on the
// server behind q: the tables, split in up to digestWorkers groups read at
// once (a move's verify runs inside its freeze), each group with one
// statement counting its tables' rows and one CHECKSUM TABLE over them.
func DBDigest(ctx context.Context, q *sql.DB, db int) (Digest, error) {
	return digestOf(ctx, q, db, MoveSchemas(db))
}

// DBDigestIn is DBDigest of database db's schemas under name prefix ns on
// the server behind q: a store's, for a store opened with that prefix (a
// test's own databases); ns "" is DBDigest.
func DBDigestIn(ctx context.Context, q *sql.DB, db int, ns string) (Digest, error) {
	return digestOf(ctx, q, db, []string{fmt.Sprintf("%sdb_%02d", ns, db), fmt.Sprintf("%s%sdb_%02d", ns, ShadowPrefix, db)})
}

// digestOf is DBDigest of database db's schemas named.
func digestOf(ctx context.Context, q *sql.DB, db int, schemas []string) (Digest, error) {
	rows, err := q.QueryContext(ctx, "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema IN (?, ?) AND table_type = 'BASE TABLE'",
		schemas[0], schemas[1])
	if err != nil {
		return nil, fmt.Errorf("storage: tables of db_%02d: %w", db, err)
	}
	var names []string
	for rows.Next() {
		var s, t string
		if err := rows.Scan(&s, &t); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, s+"."+t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	d := Digest{}
	if len(names) == 0 {
		return d, nil
	}
	sort.Strings(names)
	n := min(digestWorkers, len(names))
	var (
		mu   sync.Mutex
		errs = make([]error, n)
		wg   sync.WaitGroup
	)
	put := func(name string, set func(*TableDigest)) {
		mu.Lock()
		defer mu.Unlock()
		t := d[name]
		set(&t)
		d[name] = t
	}
	for w := range n {
		var group []string
		for i := w; i < len(names); i += n {
			group = append(group, names[i])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts := make([]string, len(group))
			for i, name := range group {
				counts[i] = fmt.Sprintf("SELECT '%s', COUNT(*) FROM %s", name, name)
			}
			if err := scanPairs(ctx, q, strings.Join(counts, " UNION ALL "), func(name string, v int64) {
				put(name, func(t *TableDigest) { t.Rows = v })
			}); err != nil {
				errs[w] = fmt.Errorf("storage: row counts of db_%02d: %w", db, err)
				return
			}
			if err := scanPairs(ctx, q, "CHECKSUM TABLE "+strings.Join(group, ", "), func(name string, v int64) {
				put(name, func(t *TableDigest) { t.Checksum = v })
			}); err != nil {
				errs[w] = fmt.Errorf("storage: checksums of db_%02d: %w", db, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return d, nil
}

func scanPairs(ctx context.Context, q *sql.DB, query string, put func(string, int64)) error {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var v sql.NullInt64
		if err := rows.Scan(&n, &v); err != nil {
			return err
		}
		put(n, v.Int64)
	}
	return rows.Err()
}

// ForgetMovedOut removes the record of db (a freeze abandoned: the cell
// serves the database again), keeping the database.
func (m *MySQL) ForgetMovedOut(ctx context.Context, cell string, db int) error {
	_, err := m.db.ExecContext(ctx, "DELETE FROM "+movedOutTable+" WHERE cell = ? AND db = ?", cell, db)
	if isMySQLErr(err, errNoSuchTable) || isMySQLErr(err, errUnknownDB) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: forget db_%02d record: %w", db, err)
	}
	return nil
}

// Digest is DBDigest of database db on this store's server (of its
// schemas under the store's name prefix, moveSchemas).
func (m *MySQL) Digest(ctx context.Context, db int) (Digest, error) {
	return digestOf(ctx, m.db, db, m.moveSchemas(db))
}

// moveSchemas are MoveSchemas of database db for the real and the shadow
// store, and the same two under the name prefix of a store of a test's own
// databases.
func (m *MySQL) moveSchemas(db int) []string {
	base := m.ns
	if base == ShadowPrefix {
		base = ""
	}
	return []string{fmt.Sprintf("%sdb_%02d", base, db), fmt.Sprintf("%s%sdb_%02d", base, ShadowPrefix, db)}
}

// Copies lists the databases of the store's space on its server that keep
// does not accept (the cell does not own them by the cluster's shard map),
// ascending, each as the moves left it (a model.DBCopy without its Owner):
// handed over by cell (a record of MovedOuts with a digest), with its rows
// and whether they changed since the hand-over (its Digest read now against
// the recorded one); frozen by a move of cell (a record without a digest);
// being copied onto the server (a move's replication channel,
// MoveChannels); or none of these. It reads the digest of the copies
// handed over only: every table of each.
func (m *MySQL) Copies(ctx context.Context, cell string, keep func(db int) bool) ([]model.DBCopy, error) {
	present, err := m.databases(ctx)
	if err != nil {
		return nil, err
	}
	mos, err := m.MovedOuts(ctx, cell)
	if err != nil {
		return nil, err
	}
	record := map[int]MovedOut{}
	for _, mo := range mos {
		record[mo.DB] = mo
	}
	chans, err := m.MoveChannels(ctx)
	if err != nil {
		return nil, err
	}
	var out []model.DBCopy
	for _, db := range present {
		if keep(db) {
			continue
		}
		c := model.DBCopy{Cell: cell, DB: db, Kind: model.CopyUnrecorded}
		mo, recorded := record[db]
		switch {
		case recorded && mo.Digest != "":
			d, err := m.Digest(ctx, db)
			if err != nil {
				return nil, err
			}
			c.Kind, c.Version, c.Changed = model.CopyHandedOver, mo.Version, d.Sum() != mo.Digest
			for _, t := range d {
				c.Rows += t.Rows
			}
		case recorded:
			c.Kind, c.Version = model.CopyFrozen, mo.Version
		case slices.Contains(chans, db):
			c.Kind = model.CopyMovingIn
		}
		out = append(out, c)
	}
	return out, nil
}

// databases lists the databases (db_XX) of the store's space on its server,
// ascending.
func (m *MySQL) databases(ctx context.Context) ([]int, error) {
	rows, err := m.db.QueryContext(ctx, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?",
		strings.ReplaceAll(m.ns+"db_", "_", "\\_")+"%")
	if err != nil {
		return nil, fmt.Errorf("storage: list databases: %w", err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		db, err := strconv.Atoi(strings.TrimPrefix(name, m.ns+"db_"))
		if err != nil || db < 0 || db >= model.DBCount || len(name) != len(m.ns)+5 {
			continue
		}
		out = append(out, db)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: list databases: %w", err)
	}
	sort.Ints(out)
	return out, nil
}

// MoveChannels lists the databases a move's replication channel (move_db_XX)
// is copying onto this server.
func (m *MySQL) MoveChannels(ctx context.Context) ([]int, error) {
	rows, err := m.db.QueryContext(ctx, "SHOW ALL SLAVES STATUS")
	if err != nil {
		return nil, fmt.Errorf("storage: replication channels: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out []int
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		for i, c := range cols {
			var db int
			if c == "Connection_name" {
				if _, err := fmt.Sscanf(string(vals[i]), "move_db_%d", &db); err == nil {
					out = append(out, db)
				}
			}
		}
	}
	return out, rows.Err()
}

// DB is the store's connection pool, for the moves' replication statements
// and digests.
func (m *MySQL) DB() *sql.DB { return m.db }
