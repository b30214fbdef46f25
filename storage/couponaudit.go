package storage

import (
	"context"
	"database/sql"
	"fmt"

	"redcell/model"
)

// ledgerCoupons reads the coupon requests of every database (an issued
// request is its coupon) into l.CouponRows, in the ledger's snapshot: sums
// by state, batch and deduction, and the rows that break a rule (an issued
// request without a coupon ID, a refused or open request holding one, a
// person with more than one coupon of a batch or two batches of a group).
// The ledger brought the tables to this version's shape before its snapshot
// (upgradeCoupons).
func (m *MySQL) ledgerCoupons(ctx context.Context, tx *sql.Conn, byKind map[string][]tableRef, l *model.Ledger) error {
	c := &l.CouponRows
	c.Requests, c.ByBatch, c.LeaseSpent = map[model.CouponState]int64{}, map[string]int64{}, map[string]int64{}
	for _, t := range byKind["coupon_req"] {
		db := t.shard.DB()
		req := m.couponReqTable(db)
		issued := "FROM " + req + " WHERE state = 'issued'"
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
			err = scanEach(ctx, tx, "SELECT COUNT(*) "+issued+" AND coupon_id = ''",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.IssuedNoCoupon += n; return err })
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT COUNT(*) FROM "+req+" WHERE state <> 'issued' AND coupon_id <> ''",
				func(rows *sql.Rows) error { var n int64; err := rows.Scan(&n); c.CouponNoRequest += n; return err })
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT batch_id, lease_id, COUNT(*) "+issued+" GROUP BY batch_id, lease_id", func(rows *sql.Rows) error {
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
			err = scanEach(ctx, tx, "SELECT act_id, batch_id, COUNT(*) "+issued+" GROUP BY act_id, batch_id HAVING COUNT(*) > 1",
				func(rows *sql.Rows) error {
					var x model.CouponCount
					err := rows.Scan(&x.ActID, &x.Batch, &x.N)
					c.Multi = append(c.Multi, x)
					return err
				})
		}
		if err == nil {
			err = scanEach(ctx, tx, "SELECT act_id, group_id, GROUP_CONCAT(DISTINCT batch_id ORDER BY batch_id) "+issued+
				" AND group_id <> '' GROUP BY act_id, group_id HAVING COUNT(DISTINCT batch_id) > 1 LIMIT 100",
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
