package storage

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"redcell/model"
)

// ledgerCoupons reads the coupon requests and coupons of every database
// that has both tables into l.CouponRows, in the ledger's snapshot: sums
// by state, batch and deduction, and the rows that break a rule (an issued
// request without its coupon, a coupon without its issued request, a
// person with more than one coupon of a batch or two batches of a group).
// The tables of a database are made together (ensureCoupons); a database
// with one and not the other is being made and holds no rows.
func (m *MySQL) ledgerCoupons(ctx context.Context, tx *sql.Conn, byKind map[string][]tableRef, l *model.Ledger) error {
	c := &l.CouponRows
	c.Requests, c.ByBatch, c.LeaseSpent = map[model.CouponState]int64{}, map[string]int64{}, map[string]int64{}
	for _, t := range byKind["coupon_req"] {
		if !slices.ContainsFunc(byKind["coupon"], func(x tableRef) bool { return x.shard == t.shard }) {
			continue
		}
		db := t.shard.DB()
		req, cp := m.couponReqTable(db), m.couponTable(db)
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
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" r LEFT JOIN "+cp+" c ON c.coupon_id = r.coupon_id "+
				"WHERE r.state = 'issued' AND (c.coupon_id IS NULL OR c.app <> r.app OR c.serial_no <> r.serial_no)",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+cp+" c LEFT JOIN "+req+" r ON r.app = c.app AND r.serial_no = c.serial_no "+
				"WHERE r.state IS NULL OR r.state <> 'issued' OR r.coupon_id <> c.coupon_id OR r.act_id <> c.act_id OR r.batch_id <> c.batch_id",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT batch_id, lease_id, COUNT(*) FROM "+cp+" GROUP BY batch_id, lease_id", func(rows *sql.Rows) error {
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
			err = scanEach(ctx, tx, "SELECT act_id, batch_id, COUNT(*) FROM "+cp+" GROUP BY act_id, batch_id HAVING COUNT(*) > 1",
				func(rows *sql.Rows) error {
					var x model.CouponCount
					err := rows.Scan(&x.ActID, &x.Batch, &x.N)
					c.Multi = append(c.Multi, x)
					return err
				})
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT act_id, group_id, GROUP_CONCAT(DISTINCT batch_id ORDER BY batch_id) FROM "+cp+
				" WHERE group_id <> '' GROUP BY act_id, group_id HAVING COUNT(DISTINCT batch_id) > 1 LIMIT 100",
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
