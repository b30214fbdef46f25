package storage

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"redcell/model"
)

// ledgerCoupons reads the coupon requests of every database (an issued
// request is its coupon) into l.CouponRows, in the ledger's snapshot: sums
// by state, batch and deduction, and the rows that break a rule (an issued
// request without its coupon's ID or lease, a refused or open request
// holding a coupon ID, a person with more than one coupon of a batch or two
// batches of a group). The ledger writes nothing: a database whose tables an
// earlier version made and no cell has folded yet (foldCoupons: a t_coupon
// or t_coupon_folding is there) is read as that version kept it, coupons in
// their own table; a folded one's t_coupon_folded is checked against the
// requests as that table was.
func (m *MySQL) ledgerCoupons(ctx context.Context, tx *sql.Conn, byKind map[string][]tableRef, l *model.Ledger) error {
	c := &l.CouponRows
	c.Requests, c.ByBatch, c.LeaseSpent = map[model.CouponState]int64{}, map[string]int64{}, map[string]int64{}
	in := func(kind string, db int) []tableRef {
		var out []tableRef
		for _, t := range byKind[kind] {
			if t.shard.DB() == db {
				out = append(out, t)
			}
		}
		return out
	}
	for _, t := range byKind["coupon_req"] {
		db := t.shard.DB()
		schema := m.tableNamesOf().db[db]
		req := m.couponReqTable(db)
		err := scanEach(ctx, tx, "SELECT state, reason = '', COUNT(*), MIN(accepted_ms), MIN(taken_ms) FROM "+req+" GROUP BY state, reason = ''",
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
		// The coupons: the issued requests; or, not folded yet, the table
		// of coupons an earlier version kept (both of its names, should a
		// fold have stopped half way and that version have made one again).
		coupons := "(SELECT coupon_id, act_id, batch_id, group_id, app, serial_no, lease_id FROM " + req + " WHERE state = 'issued')"
		var before []string
		for kind, name := range map[string]string{"coupon_old": "t_coupon", "coupon_folding": "t_coupon_folding"} {
			if len(in(kind, db)) > 0 {
				before = append(before, "SELECT coupon_id, act_id, batch_id, group_id, app, serial_no, lease_id FROM "+schema+"."+name)
			}
		}
		sort.Strings(before)
		if len(before) > 0 {
			coupons = "(" + strings.Join(before, " UNION ALL ") + ")"
			if err == nil { // an issued request without its coupon, as the earlier version kept them
				err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" r LEFT JOIN "+coupons+" c ON c.coupon_id = r.coupon_id "+
					"WHERE r.state = 'issued' AND (c.coupon_id IS NULL OR c.app <> r.app OR c.serial_no <> r.serial_no)",
					func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
			}
			if err == nil {
				err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+coupons+" c LEFT JOIN "+req+" r ON r.app = c.app AND r.serial_no = c.serial_no "+
					"WHERE r.state IS NULL OR r.state <> 'issued' OR r.coupon_id <> c.coupon_id OR r.act_id <> c.act_id OR r.batch_id <> c.batch_id",
					func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
			}
		} else {
			if err == nil {
				err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" WHERE state = 'issued' AND (coupon_id = '' OR lease_id = '')",
					func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
			}
			if err == nil {
				err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" WHERE state <> 'issued' AND (coupon_id <> '' OR lease_id <> '')",
					func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
			}
			if err == nil && len(in("coupon_folded", db)) > 0 {
				// The coupons an earlier version kept apart, checked
				// against the requests they were folded into.
				err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+schema+".t_coupon_folded c LEFT JOIN "+req+" r ON r.app = c.app AND r.serial_no = c.serial_no "+
					"WHERE r.state IS NULL OR r.state <> 'issued' OR r.coupon_id <> c.coupon_id OR r.act_id <> c.act_id OR r.batch_id <> c.batch_id OR r.lease_id <> c.lease_id",
					func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
			}
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT batch_id, lease_id, COUNT(*) FROM "+coupons+" c GROUP BY batch_id, lease_id", func(rows *sql.Rows) error {
				var batch, lease string
				var n int64
				if err := rows.Scan(&batch, &lease, &n); err != nil {
					return err
				}
				c.ByBatch[batch] += n
				c.LeaseSpent[lease] += n
				return nil
			})
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT act_id, batch_id, COUNT(*) FROM "+coupons+" c GROUP BY act_id, batch_id HAVING COUNT(*) > 1",
				func(rows *sql.Rows) error {
					var x model.CouponCount
					err := rows.Scan(&x.ActID, &x.Batch, &x.N)
					c.Multi = append(c.Multi, x)
					return err
				})
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT act_id, group_id, GROUP_CONCAT(DISTINCT batch_id ORDER BY batch_id) FROM "+coupons+
				" c WHERE group_id <> '' GROUP BY act_id, group_id HAVING COUNT(DISTINCT batch_id) > 1 LIMIT 100",
				func(rows *sql.Rows) error {
					var act, group, batches string
					err := rows.Scan(&act, &group, &batches)
					c.GroupClash = append(c.GroupClash, fmt.Sprintf("%s holds batches %s of group %s", act, batches, group))
					return err
				})
		}
		if err != nil {
			return fmt.Errorf("storage: ledger of the coupon tables of db %d: %w", db, err)
		}
	}
	return nil
}

// scanEach runs query and calls scan for each row.
func scanEach(ctx context.Context, q rowsQueryer, query string, scan func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, query)
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
