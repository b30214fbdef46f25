package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
