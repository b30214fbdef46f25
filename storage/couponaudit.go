package storage

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"redcell/model"
)

// ledgerCoupons reads the coupon requests of every database (an issued
// request is its coupon) into l.CouponRows, in the ledger's snapshot: sums
// by state, batch and deduction, and the rows that break a rule (an issued
// request without its coupon, a coupon without its issued request, a
// person with more than one coupon of a batch or two batches of a group).
//
// The ledger writes nothing, so it reads whatever a fold (foldCoupons) has
// made of an earlier version's tables so far:
//   - t_coupon_req without lease_id (not folded): as that version did, its
//     coupons those of t_coupon (none when there is none: the pair is being
//     made);
//   - with lease_id: its coupons the issued requests holding a lease, and
//     the rows of a t_coupon or t_coupon_folding (a fold under way, or a
//     table an earlier version made again) that no issued request holds
//     yet; an issued request is without its coupon when it holds no coupon
//     ID, or no lease and no such row; every row of those tables and of
//     t_coupon_folded is checked against its request.
func (m *MySQL) ledgerCoupons(ctx context.Context, tx *sql.Conn, byKind map[string][]tableRef, l *model.Ledger) error {
	c := &l.CouponRows
	c.Requests, c.ByBatch, c.LeaseSpent = map[model.CouponState]int64{}, map[string]int64{}, map[string]int64{}
	if len(byKind["coupon_req"]) == 0 {
		return nil
	}
	folded := map[string]bool{} // schemas whose t_coupon_req has lease_id
	err := scanEach(ctx, tx, "SELECT TABLE_SCHEMA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA LIKE ? AND TABLE_NAME = 't_coupon_req' AND COLUMN_NAME = 'lease_id'",
		func(rows *sql.Rows) error {
			var schema string
			err := rows.Scan(&schema)
			folded[schema] = true
			return err
		}, strings.ReplaceAll(m.ns+"db_", "_", `\_`)+"%")
	if err != nil {
		return fmt.Errorf("storage: ledger: the coupon tables' shape: %w", err)
	}
	in := func(kind string, db int) bool {
		return slices.ContainsFunc(byKind[kind], func(t tableRef) bool { return t.shard.DB() == db })
	}
	for _, t := range byKind["coupon_req"] {
		if err := m.ledgerCouponDB(ctx, tx, c, t.shard.DB(), folded, in); err != nil {
			return err
		}
	}
	return nil
}

// ledgerCouponDB adds the coupon tables of database db to c: its requests,
// its coupon rows (in the request table once folded[schema], else kept
// apart; in(kind, db) tells which other coupon tables it has), and the rows
// of either without the other. Errors: the database's, as "storage: ledger
// of the coupon tables of db".
func (m *MySQL) ledgerCouponDB(ctx context.Context, tx *sql.Conn, c *model.CouponRows, db int, folded map[string]bool, in func(kind string, db int) bool) error {
	const cols = "coupon_id, act_id, batch_id, group_id, app, serial_no, lease_id"
	schema := m.tableNamesOf().db[db]
	req := m.couponReqTable(db)
	err := ledgerCouponRequests(ctx, tx, c, req)
	// The coupon rows kept apart: an earlier version's table, or a
	// fold's under way (both, should a fold have stopped half way and
	// that version have made one again); and those a fold finished.
	var apart, checked []string
	if in("coupon_old", db) {
		apart = append(apart, "SELECT "+cols+" FROM "+schema+".t_coupon")
	}
	if in("coupon_folding", db) {
		apart = append(apart, "SELECT "+cols+" FROM "+schema+".t_coupon_folding")
	}
	checked = append(checked, apart...)
	if in("coupon_folded", db) {
		checked = append(checked, "SELECT "+cols+" FROM "+schema+".t_coupon_folded")
	}
	union := func(parts []string) string { return "(" + strings.Join(parts, " UNION ALL ") + ")" }
	var coupons string
	switch {
	case !folded[schema] && len(apart) == 0:
		coupons = "" // an earlier version's pair being made: no coupons yet
	case !folded[schema]:
		coupons = union(apart)
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" r LEFT JOIN "+coupons+" c ON c.coupon_id = r.coupon_id "+
				"WHERE r.state = 'issued' AND (c.coupon_id IS NULL OR c.app <> r.app OR c.serial_no <> r.serial_no)",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
		}
	default:
		inRow := "SELECT " + cols + " FROM " + req + " WHERE state = 'issued' AND lease_id <> ''"
		coupons = "(" + inRow + ")"
		noCoupon := "coupon_id = '' OR lease_id = ''"
		if len(apart) > 0 {
			coupons = union([]string{inRow, "SELECT c.coupon_id, c.act_id, c.batch_id, c.group_id, c.app, c.serial_no, c.lease_id FROM " + union(apart) +
				" c LEFT JOIN " + req + " r ON r.app = c.app AND r.serial_no = c.serial_no AND r.coupon_id = c.coupon_id AND r.state = 'issued' AND r.lease_id <> '' " +
				"WHERE r.app IS NULL"})
			noCoupon = "coupon_id = '' OR (lease_id = '' AND NOT EXISTS (SELECT 1 FROM " + union(apart) +
				" c WHERE c.coupon_id = r.coupon_id AND c.app = r.app AND c.serial_no = r.serial_no))"
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" r WHERE state = 'issued' AND ("+noCoupon+")",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" WHERE state <> 'issued' AND (coupon_id <> '' OR lease_id <> '')",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
		}
	}
	if err == nil && len(checked) > 0 {
		// Every coupon row kept apart against its request.
		err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+union(checked)+" c LEFT JOIN "+req+" r ON r.app = c.app AND r.serial_no = c.serial_no "+
			"WHERE r.state IS NULL OR r.state <> 'issued' OR r.coupon_id <> c.coupon_id OR r.act_id <> c.act_id OR r.batch_id <> c.batch_id",
			func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
	}
	if coupons == "" {
		if err != nil {
			return fmt.Errorf("storage: ledger of the coupon tables of db %d: %w", db, err)
		}
		return nil
	}
	if err == nil {
		err = ledgerCouponRows(ctx, tx, c, coupons)
	}
	if err != nil {
		return fmt.Errorf("storage: ledger of the coupon tables of db %d: %w", db, err)
	}
	return nil
}

// ledgerCouponRequests counts the requests of coupon request table req into
// c, by state, and notes the oldest open and deciding ones and the refusals
// without a reason. Errors: the database's.
func ledgerCouponRequests(ctx context.Context, tx *sql.Conn, c *model.CouponRows, req string) error {
	return scanEach(ctx, tx, "SELECT state, reason = '', COUNT(*), MIN(accepted_ms), MIN(taken_ms) FROM "+req+" GROUP BY state, reason = ''",
		func(rows *sql.Rows) error {
			var st string
			var noReason bool
			var n, oldest, taken int64
			if err := rows.Scan(&st, &noReason, &n, &oldest, &taken); err != nil {
				return err
			}
			if model.CouponState(st) == model.CouponDeciding && (c.OldestTakenMS == 0 || taken < c.OldestTakenMS) {
				c.OldestTakenMS = taken
			}
			s := model.CouponState(st)
			c.Requests[s] += n
			if s == model.CouponRefused && noReason {
				c.RefusedNoReason += n
			}
			if !s.Final() && (c.OldestOpenMS == 0 || oldest < c.OldestOpenMS) {
				c.OldestOpenMS = oldest
			}
			return nil
		})
}

// ledgerCouponRows counts the coupon rows that query coupons (an SQL
// table expression) yields into c: by batch and by lease, the holders of a
// batch more than once, and the holders of two batches of one group.
// Errors: the database's.
func ledgerCouponRows(ctx context.Context, tx *sql.Conn, c *model.CouponRows, coupons string) error {
	if err := scanEach(ctx, tx, "SELECT batch_id, lease_id, COUNT(*) FROM "+coupons+" c GROUP BY batch_id, lease_id", func(rows *sql.Rows) error {
		var batch, lease string
		var n int64
		if err := rows.Scan(&batch, &lease, &n); err != nil {
			return err
		}
		c.ByBatch[batch] += n
		c.LeaseSpent[lease] += n
		return nil
	}); err != nil {
		return err
	}
	if err := scanEach(ctx, tx, "SELECT act_id, batch_id, COUNT(*) FROM "+coupons+" c GROUP BY act_id, batch_id HAVING COUNT(*) > 1",
		func(rows *sql.Rows) error {
			var x model.CouponCount
			err := rows.Scan(&x.ActID, &x.Batch, &x.N)
			c.Multi = append(c.Multi, x)
			return err
		}); err != nil {
		return err
	}
	return scanEach(ctx, tx, "SELECT act_id, group_id, GROUP_CONCAT(DISTINCT batch_id ORDER BY batch_id) FROM "+coupons+
		" c WHERE group_id <> '' GROUP BY act_id, group_id HAVING COUNT(DISTINCT batch_id) > 1 LIMIT 100",
		func(rows *sql.Rows) error {
			var act, group, batches string
			err := rows.Scan(&act, &group, &batches)
			c.GroupClash = append(c.GroupClash, fmt.Sprintf("%s holds batches %s of group %s", act, batches, group))
			return err
		})
}

// scanEach runs query (with args) and calls scan for each row.
func scanEach(ctx context.Context, q rowsQueryer, query string, scan func(*sql.Rows) error, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
