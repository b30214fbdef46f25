package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"redcell/internal/invariant"
	"redcell/model"
)

// Coupons in MariaDB, in the person's database (the act_id's shard's
// db_XX): t_coupon_req holds the issue requests, keyed by (app, serial_no),
// the idempotency key, and an issued request is its coupon too (state
// issued, coupon_id model.CouponID(app, serial, act_id), group_id, lease_id,
// issued at decided_ms), so a request holds one coupon at most and its
// decision and coupon are one row written by one statement;
// t_coupon_person one row per person who was ever issued to, locked by the
// issuing transaction so that two merges holding one person's requests
// decide one after the other against the same holding. The stock is not
// here: it is a Budgets row of the batch's home shard, a merged deduction a
// lease of it (model.GrantLease, no reserve).

// couponDay is the ensureKey.day of a database's coupon tables.
const couponDay = -4

func (m *MySQL) couponReqTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return m.tableNamesOf().couponReq[db]
}

func (m *MySQL) couponPersonTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return m.tableNamesOf().couponPer[db]
}

func (m *MySQL) couponDDL(db int) []string {
	ascii := "CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
	return []string{
		fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %sdb_%02d", m.ns, db) + dbDefaults,
		`CREATE TABLE IF NOT EXISTS ` + m.couponReqTable(db) + ` (
  app         VARCHAR(64) ` + ascii + ` DEFAULT '',
  serial_no   VARCHAR(64) ` + ascii + `,
  act_id      VARCHAR(64) ` + ascii + `,
  act_shard   SMALLINT NOT NULL,
  batch_id    VARCHAR(64) ` + ascii + `,
  green       TINYINT NOT NULL DEFAULT 0,
  device_id   VARCHAR(64) ` + ascii + ` DEFAULT '',
  client_ip   VARCHAR(45) ` + ascii + ` DEFAULT '',
  state       VARCHAR(9) ` + ascii + `,
  reason      VARCHAR(20) ` + ascii + ` DEFAULT '',
  coupon_id   CHAR(32) ` + ascii + ` DEFAULT '',
  accepted_ms BIGINT NOT NULL,
  taken_ms    BIGINT NOT NULL DEFAULT 0,
  decided_ms  BIGINT NOT NULL DEFAULT 0,
  group_id    ` + couponGroupCol + `,
  lease_id    ` + couponLeaseCol + `,
  PRIMARY KEY (app, serial_no),
  KEY k_state (state, accepted_ms),
  KEY k_taken (state, taken_ms),
  KEY k_act (act_id, accepted_ms),
  KEY k_lease (lease_id)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + m.couponPersonTable(db) + ` (
  act_id     VARCHAR(64) ` + ascii + ` PRIMARY KEY,
  updated_ms BIGINT NOT NULL
) ENGINE=InnoDB`,
	}
}

// The columns an issued request holds as its coupon (beside coupon_id and
// decided_ms, its issue time): the batch's group, and the stock lease its
// unit came from.
const (
	couponGroupCol = "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT ''"
	couponLeaseCol = "VARCHAR(40) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT ''"
)

// couponFoldDay is the ensureKey.day of a database's coupon tables brought
// to this version (foldCoupons).
const couponFoldDay = -6

// ensureCoupons makes db's coupon tables exist, in this version's shape
// (upgradeCoupons first), once per process.
func (m *MySQL) ensureCoupons(ctx context.Context, db int) error {
	if err := m.upgradeCoupons(ctx, db); err != nil {
		return err
	}
	return m.ensure(ctx, ensureKey{shard: model.ShardID(db * 10), day: couponDay}, m.couponDDL(db))
}

// upgradeCoupons brings db's coupon tables, if a version that kept issued
// coupons in a table of their own (t_coupon) made them, to this version's
// shape, once per process (foldCoupons). Every reader and writer of the
// coupon tables in a cell calls it first: ensureCoupons, and the lease's
// spent count. The ledger (an audit) writes nothing: it reads a database
// not folded yet as its version left it.
func (m *MySQL) upgradeCoupons(ctx context.Context, db int) error {
	return m.ensureWith(ctx, ensureKey{shard: model.ShardID(db * 10), day: couponFoldDay}, func() error {
		if err := m.foldCoupons(ctx, db); err != nil {
			return fmt.Errorf("storage: upgrade the coupon tables of db %d: %w", db, err)
		}
		return nil
	})
}

// foldCoupons brings db's coupon tables of an earlier version to this one,
// in steps each of which is atomic, so that a crash between two leaves a
// state the next call goes on from, and a second process doing the same at
// once, or a process of the earlier version still writing, loses nothing:
//
//  1. t_coupon_req without lease_id: one ALTER TABLE (group_id, lease_id,
//     k_lease);
//  2. a t_coupon: renamed t_coupon_folding (an earlier version's coupon
//     INSERT after it fails and writes nothing);
//  3. a t_coupon_folding: each of its coupons' group and lease copied into
//     its issued request (one UPDATE with a join), then the table renamed
//     t_coupon_folded, kept as it was (its rows copied into one folded
//     before, and it dropped, when there is one).
//
// The ledger checks t_coupon_folded's coupons against the requests as it
// checked t_coupon's, and reads a database whose fold has not finished from
// what the fold has made of it so far (ledgerCoupons). Tables of this
// version cost one read of information_schema.
func (m *MySQL) foldCoupons(ctx context.Context, db int) error {
	// Once, whatever the caller's deadline: an old table's ALTER and join
	// take as long as its rows; callers wait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	schema := m.tableNamesOf().db[db]
	reqT, oldT, foldingT, foldedT := schema+".t_coupon_req", schema+".t_coupon", schema+".t_coupon_folding", schema+".t_coupon_folded"
	for range 8 {
		var req, lease, old, folding int
		err := m.db.QueryRowContext(ctx, `SELECT
 (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 't_coupon_req'),
 (SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 't_coupon_req' AND COLUMN_NAME = 'lease_id'),
 (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 't_coupon'),
 (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 't_coupon_folding')`,
			schema, schema, schema, schema).Scan(&req, &lease, &old, &folding)
		switch {
		case err != nil:
			return err
		case req == 0:
			return nil // no request table: nothing of an earlier version here
		case lease == 0:
			_, err = m.db.ExecContext(ctx, "ALTER TABLE "+reqT+" ADD COLUMN IF NOT EXISTS group_id "+couponGroupCol+
				", ADD COLUMN IF NOT EXISTS lease_id "+couponLeaseCol+", ADD KEY IF NOT EXISTS k_lease (lease_id)")
		case folding > 0:
			_, err = m.db.ExecContext(ctx, "UPDATE "+reqT+" r JOIN "+foldingT+" c ON c.app = r.app AND c.serial_no = r.serial_no"+
				" SET r.group_id = c.group_id, r.lease_id = c.lease_id WHERE r.state = ? AND r.coupon_id = c.coupon_id", string(model.CouponIssued))
			if err == nil {
				_, err = m.db.ExecContext(ctx, "RENAME TABLE "+foldingT+" TO "+foldedT)
			}
			if isMySQLErr(err, errTableExists) { // folded before, and made again by an earlier version since
				if _, err = m.db.ExecContext(ctx, "INSERT IGNORE INTO "+foldedT+" SELECT * FROM "+foldingT); err == nil {
					_, err = m.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+foldingT)
				}
			}
		case old > 0:
			_, err = m.db.ExecContext(ctx, "RENAME TABLE "+oldT+" TO "+foldingT)
		default:
			return nil
		}
		// A table another process moved meanwhile (1146, 1050): read again.
		if err != nil && !isMySQLErr(err, errNoSuchTable) && !isMySQLErr(err, errTableExists) {
			return err
		}
	}
	return errors.New("the tables kept changing under the fold")
}

const couponReqCols = "app, serial_no, act_id, act_shard, batch_id, green, device_id, client_ip, state, reason, coupon_id, accepted_ms, taken_ms, decided_ms"

func scanCouponReq(r rowScanner) (model.CouponRequest, error) {
	var x model.CouponRequest
	var shard int
	err := r.Scan(&x.App, &x.Serial, &x.ActID, &shard, &x.Batch, &x.Green, &x.DeviceID, &x.ClientIP, &x.State, &x.Reason,
		&x.CouponID, &x.AcceptedMS, &x.TakenMS, &x.DecidedMS)
	x.Shard = model.ShardID(shard)
	return x, err
}

func (m *MySQL) queryCouponReqs(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]model.CouponRequest, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []model.CouponRequest
	for rows.Next() {
		r, err := scanCouponReq(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// couponRequestOf answers CouponRequestQuery.
func (m *MySQL) couponRequestOf(ctx context.Context, s model.ShardID, app, serial string) (model.CouponRequest, error) {
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return model.CouponRequest{}, err
	}
	r, err := scanCouponReq(m.db.QueryRowContext(ctx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(s.DB())+
		" WHERE app = ? AND serial_no = ?", app, serial))
	if errors.Is(err, sql.ErrNoRows) {
		return model.CouponRequest{}, model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", serial, app)
	}
	if err != nil {
		return model.CouponRequest{}, fmt.Errorf("storage: read coupon request: %w", err)
	}
	return r, nil
}

// takeCouponRequests runs CouponTake in one transaction of two round
// trips and its commit: one statement of locking reads, a UNION ALL of one
// or two per database, each skipping the rows other takers hold, then a
// statement list of UPDATEs to deciding. Each database is asked for its share of limit
// and some more, so a database with more than that waiting gives its
// oldest and leaves the rest to the next take.
func (m *MySQL) takeCouponRequests(ctx context.Context, dbs []int, staleMS int64, limit int) ([]model.CouponRequest, error) {
	if limit < 1 || len(dbs) == 0 {
		return nil, nil
	}
	for _, db := range dbs {
		if err := m.ensureCoupons(ctx, db); err != nil {
			return nil, err
		}
	}
	// Each database is asked for its share and some more, not for all of
	// limit: a full queue's room over fifty databases would lock and read
	// fifty times what is kept.
	each := min(limit, max(64, 2*limit/len(dbs)))
	var out []model.CouponRequest
	// READ COMMITTED: the locking reads lock the rows they take, not the
	// ranges they walk, so a take neither blocks new requests (a gap lock
	// past the last accepted row) nor holds every deciding row it passed.
	err := func() error {
		tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var q []string
		var args []any
		for _, db := range dbs {
			q = append(q, "(SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+
				" WHERE state = ? ORDER BY accepted_ms, app, serial_no LIMIT ? FOR UPDATE SKIP LOCKED)")
			args = append(args, string(model.CouponAccepted), each)
			if staleMS >= 0 {
				q = append(q, "(SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+
					" WHERE state = ? AND taken_ms <= ? ORDER BY accepted_ms, app, serial_no LIMIT ? FOR UPDATE SKIP LOCKED)")
				args = append(args, string(model.CouponDeciding), staleMS, each)
			}
		}
		// One statement, a UNION ALL of every database's reads: a sweep of
		// an idle cell's 50 databases is one read, not 100.
		all, err := m.queryCouponReqSets(ctx, tx, strings.Join(q, " UNION ALL "), args...)
		if err != nil {
			return err
		}
		slices.SortFunc(all, model.CompareCouponRequests)
		all = all[:min(len(all), limit)]
		if len(all) == 0 {
			return tx.Commit()
		}
		now := m.nowMS()
		byDBOrder := slices.Clone(all)
		slices.SortStableFunc(byDBOrder, func(a, b model.CouponRequest) int { return cmp.Compare(a.Shard.DB(), b.Shard.DB()) })
		q, args = q[:0], args[:0]
		byDB(byDBOrder, func(r model.CouponRequest) int { return r.Shard.DB() }, func(db int, run []model.CouponRequest) {
			q = append(q, "UPDATE "+m.couponReqTable(db)+" SET state = ?, taken_ms = ? WHERE (app, serial_no) IN ("+
				strings.TrimSuffix(strings.Repeat("(?, ?),", len(run)), ",")+")")
			args = append(args, string(model.CouponDeciding), now)
			for _, r := range run {
				args = append(args, r.App, r.Serial)
			}
		})
		if _, err := tx.ExecContext(ctx, strings.Join(q, ";"), args...); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return commitUnknown(err)
		}
		for i := range all {
			all[i].State, all[i].TakenMS = model.CouponDeciding, now
		}
		out = all
		return nil
	}()
	if err != nil {
		return nil, fmt.Errorf("storage: take coupon requests: %w", err)
	}
	return out, nil
}

// queryCouponReqSets runs a statement list of reads of requests and
// answers the rows of every result set.
func (m *MySQL) queryCouponReqSets(ctx context.Context, q rowsQueryer, query string, args ...any) ([]model.CouponRequest, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []model.CouponRequest
	for {
		for rows.Next() {
			r, err := scanCouponReq(rows)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		if !rows.NextResultSet() {
			break
		}
	}
	return out, rows.Err()
}

// reqKey names a stored request: its database, app and serial (the
// primary key of its database's t_coupon_req).
type reqKey struct {
	db          int
	app, serial string
}

func reqKeyOf(r model.CouponRequest) reqKey { return reqKey{r.Shard.DB(), r.App, r.Serial} }

// personKey names a person of one database.
type personKey struct {
	db  int
	act string
}

// personsOf lists the persons of reqs once each, in the one order every
// issuer locks them in: database, then act_id.
func personsOf(reqs []model.CouponRequest) []personKey {
	seen := map[personKey]bool{}
	var ps []personKey
	for _, r := range reqs {
		k := personKey{r.Shard.DB(), r.ActID}
		if !seen[k] {
			seen[k] = true
			ps = append(ps, k)
		}
	}
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].db != ps[j].db {
			return ps[i].db < ps[j].db
		}
		return ps[i].act < ps[j].act
	})
	return ps
}

// byDB calls f with each run of xs that shares a database (xs sorted by
// database).
func byDB[T any](xs []T, dbOf func(T) int, f func(db int, run []T)) {
	for i := 0; i < len(xs); {
		j := i
		for j < len(xs) && dbOf(xs[j]) == dbOf(xs[i]) {
			j++
		}
		f(dbOf(xs[i]), xs[i:j])
		i = j
	}
}

// lockPersons makes and locks the person rows ps (personsOf), one
// statement list: an upsert per database.
func (m *MySQL) lockPersons(ctx context.Context, tx *sql.Tx, ps []personKey, now int64) error {
	var q []string
	var args []any
	byDB(ps, func(p personKey) int { return p.db }, func(db int, run []personKey) {
		q = append(q, "INSERT INTO "+m.couponPersonTable(db)+" (act_id, updated_ms) VALUES "+rowsOf(len(run), 2)+
			" ON DUPLICATE KEY UPDATE updated_ms = VALUES(updated_ms)")
		for _, p := range run {
			args = append(args, p.act, now)
		}
	})
	_, err := tx.ExecContext(ctx, strings.Join(q, ";"), args...)
	return err
}

// holdings reads the holdings of persons ps (locked by lockPersons), one
// statement over their databases.
func (m *MySQL) holdings(ctx context.Context, q rowsQueryer, ps []personKey) (map[string]*model.CouponHolding, error) {
	out := map[string]*model.CouponHolding{}
	var parts []string
	var args []any
	byDB(ps, func(p personKey) int { return p.db }, func(db int, run []personKey) {
		parts = append(parts, "SELECT act_id, batch_id, group_id, COUNT(*) FROM "+m.couponReqTable(db)+" WHERE act_id IN ("+
			placeholders(len(run))+") AND state = ? GROUP BY act_id, batch_id, group_id")
		for _, p := range run {
			args = append(args, p.act)
		}
		args = append(args, string(model.CouponIssued))
	})
	for _, p := range ps {
		out[p.act] = &model.CouponHolding{ByBatch: map[string]int{}, Groups: map[string]string{}}
	}
	rows, err := q.QueryContext(ctx, strings.Join(parts, " UNION ALL "), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var act, batch, group string
		var n int
		if err := rows.Scan(&act, &batch, &group, &n); err != nil {
			return nil, err
		}
		h := out[act]
		if h == nil {
			continue
		}
		h.ByBatch[batch] += n
		if group != "" {
			h.Groups[group] = batch
		}
	}
	return out, rows.Err()
}

// lockCouponReqs reads reqs as stored, locked: one statement, a UNION ALL
// of a locking read per database (each part takes its locks in turn, in
// database order, then app and serial within one). The map is by app and
// serial.
func (m *MySQL) lockCouponReqs(ctx context.Context, tx *sql.Tx, reqs []model.CouponRequest) (map[reqKey]model.CouponRequest, error) {
	sorted := slices.Clone(reqs)
	slices.SortFunc(sorted, func(a, b model.CouponRequest) int {
		return cmp.Or(cmp.Compare(a.Shard.DB(), b.Shard.DB()), cmp.Compare(a.App, b.App), cmp.Compare(a.Serial, b.Serial))
	})
	var u union
	byDB(sorted, func(r model.CouponRequest) int { return r.Shard.DB() }, func(db int, run []model.CouponRequest) {
		args := make([]any, 0, 2*len(run))
		for _, r := range run {
			args = append(args, r.App, r.Serial)
		}
		u.add("SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+" WHERE (app, serial_no) IN ("+
			strings.TrimSuffix(strings.Repeat("(?, ?),", len(run)), ",")+") ORDER BY app, serial_no FOR UPDATE", args...)
	})
	q, args := u.sql()
	rs, err := m.queryCouponReqs(ctx, tx, q, args...)
	if err != nil {
		return nil, err
	}
	out := make(map[reqKey]model.CouponRequest, len(rs))
	for _, cur := range rs {
		out[reqKeyOf(cur)] = cur
	}
	return out, nil
}

// issueCoupons runs CouponIssue, in four round trips whatever the
// number of requests: the persons locked, the requests read locked, the
// holdings read, and the writes (every decided request stored with its
// decision, an issued one as its coupon: one upsert per database) as one
// statement list.
func (m *MySQL) issueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) ([]model.CouponDecision, int64, error) {
	invariant.That(granted >= 0, "granted >= 0")
	if granted > 0 && leaseID == "" {
		return nil, 0, model.Invalidf("a coupon issue with units needs the lease they came from")
	}
	if len(reqs) == 0 {
		return nil, granted, nil
	}
	for _, r := range reqs {
		invariant.That(r.Batch == rule.Batch, "every request of an issue is of its batch")
		if err := m.ensureCoupons(ctx, r.Shard.DB()); err != nil {
			return nil, 0, err
		}
	}
	var out []model.CouponDecision
	var unused int64
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		now := m.nowMS()
		ps := personsOf(reqs)
		if err := m.lockPersons(ctx, tx, ps, now); err != nil {
			return err
		}
		curs, err := m.lockCouponReqs(ctx, tx, reqs)
		if err != nil {
			return err
		}
		// Requests already final (a re-driven request a slower issuer
		// decided first) keep their decision and take no unit.
		var asks []model.CouponAsk
		var open []model.CouponRequest
		seen := map[reqKey]bool{}
		for _, r := range reqs {
			k := reqKeyOf(r)
			cur, ok := curs[k]
			if !ok {
				return model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", r.Serial, r.App)
			}
			if cur.State.Final() || seen[k] { // a copy of one already asked for is decided with it
				continue
			}
			seen[k] = true
			asks = append(asks, model.CouponAsk{Serial: cur.App + "\x00" + cur.Serial, ActID: cur.ActID, Rule: rule})
			open = append(open, cur)
		}
		hs, err := m.holdings(ctx, tx, ps)
		if err != nil {
			return err
		}
		units := min(granted, int64(len(asks)))
		ds, left := model.AssignCoupons(units, asks, hs)
		unused = granted - units + left
		out = out[:0]
		type decided struct {
			r model.CouponRequest
			d model.CouponDecision
		}
		var all []decided
		for i, d := range ds {
			r := open[i]
			d.Serial, d.App = r.Serial, r.App
			out = append(out, d)
			all = append(all, decided{r, d})
		}
		if len(all) == 0 {
			return nil
		}
		slices.SortStableFunc(all, func(a, b decided) int { return cmp.Compare(a.r.Shard.DB(), b.r.Shard.DB()) })
		var q []string
		var args []any
		byDB(all, func(x decided) int { return x.r.Shard.DB() }, func(db int, run []decided) {
			// Every row is there and locked: the upsert updates each, an
			// issued one becoming its coupon (the coupon's ID, group and
			// lease; decided_ms its issue time).
			q = append(q, "INSERT INTO "+m.couponReqTable(db)+
				" (app, serial_no, act_id, act_shard, batch_id, state, reason, coupon_id, group_id, lease_id, accepted_ms, decided_ms) VALUES "+rowsOf(len(run), 12)+
				" ON DUPLICATE KEY UPDATE state = VALUES(state), reason = VALUES(reason), coupon_id = VALUES(coupon_id),"+
				" group_id = VALUES(group_id), lease_id = VALUES(lease_id), decided_ms = VALUES(decided_ms)")
			for _, x := range run {
				r := x.r
				state, id, group, lease := model.CouponRefused, "", "", ""
				if x.d.Issued {
					state, id, group, lease = model.CouponIssued, model.CouponID(r.App, r.Serial, r.ActID), rule.Group, leaseID
				}
				args = append(args, r.App, r.Serial, r.ActID, int(r.Shard), r.Batch, string(state), string(x.d.Reason), id, group, lease, r.AcceptedMS, now)
			}
		})
		_, err = tx.ExecContext(ctx, strings.Join(q, ";"), args...)
		return err
	})
	if err != nil { // ErrCommitUnknown too: the requests are final or still deciding, and a re-drive settles them
		return nil, 0, fmt.Errorf("storage: issue coupons: %w", err)
	}
	return out, unused, nil
}

// refuseCoupons runs CouponRefusal: one UPDATE per database and app, all of
// them one statement list in one transaction.
func (m *MySQL) refuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	invariant.That(reason != "", "a refusal has a reason")
	err := m.updateRequests(ctx, reqs, "state = ?, reason = ?, decided_ms = ?", []any{string(model.CouponRefused), string(reason), m.nowMS()},
		model.CouponAccepted, model.CouponDeciding)
	if err != nil {
		return fmt.Errorf("storage: refuse coupons: %w", err)
	}
	return nil
}

// releaseCouponRequests runs CouponRelease, as refuseCoupons in statements.
func (m *MySQL) releaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error {
	if err := m.updateRequests(ctx, reqs, "state = ?, taken_ms = 0", []any{string(model.CouponAccepted)}, model.CouponDeciding); err != nil {
		return fmt.Errorf("storage: release coupon requests: %w", err)
	}
	return nil
}

// updateRequests sets set (its values setArgs) on the requests reqs names
// whose state is one of from: per database and app one UPDATE of their
// serial numbers (the primary key's), in (database, app, serial) order, the
// order every writer of the rows locks them in; all in one transaction, one
// statement list, one round trip.
func (m *MySQL) updateRequests(ctx context.Context, reqs []model.CouponRequest, set string, setArgs []any, from ...model.CouponState) error {
	type dbApp struct {
		db  int
		app string
	}
	serials := map[dbApp][]string{}
	for _, r := range reqs {
		k := dbApp{r.Shard.DB(), r.App}
		if _, ok := serials[k]; !ok {
			if err := m.ensureCoupons(ctx, k.db); err != nil {
				return err
			}
		}
		serials[k] = append(serials[k], r.Serial)
	}
	keys := slices.SortedFunc(maps.Keys(serials), func(a, b dbApp) int { return cmp.Or(cmp.Compare(a.db, b.db), strings.Compare(a.app, b.app)) })
	var b sqlBatch
	for _, k := range keys {
		ss := slices.Compact(slices.Sorted(slices.Values(serials[k])))
		args := append(slices.Clone(setArgs), k.app)
		args = append(args, anys(ss)...)
		for _, st := range from {
			args = append(args, string(st))
		}
		b.add("UPDATE "+m.couponReqTable(k.db)+" SET "+set+" WHERE app = ? AND serial_no IN ("+placeholders(len(ss))+") AND state IN ("+
			placeholders(len(from))+")", args...)
	}
	q, args := b.sql()
	if q == "" {
		return nil
	}
	return m.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	})
}

// holdingOf answers HoldingQuery.
func (m *MySQL) holdingOf(ctx context.Context, s model.ShardID, actID string) (model.CouponHolding, error) {
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return model.CouponHolding{}, err
	}
	hs, err := m.holdings(ctx, m.db, []personKey{{s.DB(), actID}})
	if err != nil {
		return model.CouponHolding{}, fmt.Errorf("storage: holding: %w", err)
	}
	return *hs[actID], nil
}

// holdingsOf answers HoldingsQuery: one statement over the persons'
// databases.
func (m *MySQL) holdingsOf(ctx context.Context, reqs []model.CouponRequest) (map[string]model.CouponHolding, error) {
	out := map[string]model.CouponHolding{}
	if len(reqs) == 0 {
		return out, nil
	}
	for _, r := range reqs {
		if err := m.ensureCoupons(ctx, r.Shard.DB()); err != nil {
			return nil, err
		}
	}
	hs, err := m.holdings(ctx, m.db, personsOf(reqs))
	if err != nil {
		return nil, fmt.Errorf("storage: holdings: %w", err)
	}
	for act, h := range hs {
		out[act] = *h
	}
	return out, nil
}

// couponsOf answers CouponsQuery.
func (m *MySQL) couponsOf(ctx context.Context, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Coupon, error) {
	if limit < 1 {
		return nil, nil
	}
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return nil, err
	}
	where, args := "act_id = ?", []any{actID}
	if after != (model.FlowCursor{}) {
		where += " AND (decided_ms < ? OR (decided_ms = ? AND coupon_id < ?))"
		args = append(args, after.CreatedMS, after.CreatedMS, after.ID)
	}
	// An issued request is its coupon, issued at its decided_ms.
	rows, err := m.db.QueryContext(ctx, "SELECT coupon_id, act_id, act_shard, batch_id, group_id, app, serial_no, lease_id, decided_ms FROM "+
		m.couponReqTable(s.DB())+" WHERE "+where+" AND state = ? ORDER BY decided_ms DESC, coupon_id DESC LIMIT ?",
		append(args, string(model.CouponIssued), limit)...)
	if err != nil {
		return nil, fmt.Errorf("storage: coupons of %s: %w", actID, err)
	}
	defer rows.Close()
	var out []model.Coupon
	for rows.Next() {
		var c model.Coupon
		var shard int
		if err := rows.Scan(&c.ID, &c.ActID, &shard, &c.Batch, &c.Group, &c.App, &c.Serial, &c.LeaseID, &c.IssuedMS); err != nil {
			return nil, err
		}
		c.Shard = model.ShardID(shard)
		out = append(out, c)
	}
	return out, rows.Err()
}

// couponLeaseSpent answers CouponLeaseSpentQuery.
func (m *MySQL) couponLeaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error) {
	var total int64
	for _, db := range dbs {
		var n int64
		if err := m.upgradeCoupons(ctx, db); err != nil {
			return 0, err
		}
		err := m.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+m.couponReqTable(db)+" WHERE lease_id = ? AND state = ?",
			leaseID, string(model.CouponIssued)).Scan(&n)
		if isMySQLErr(err, errNoSuchTable) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("storage: coupon lease spent: %w", err)
		}
		total += n
	}
	return total, nil
}
