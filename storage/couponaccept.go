package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"redcell/model"
)

// acceptSavepoint is where acceptAll's statement list goes back to.
const acceptSavepoint = "accepts_bulk"

// couponAcceptArgs are the INSERT arguments of a request as an accept
// stores it (acceptedAs), in couponReqCols order.
func couponAcceptArgs(r model.CouponRequest) []any {
	r = acceptedAs(r)
	return []any{r.App, r.Serial, r.ActID, int(r.Shard), r.Batch, r.Green, r.DeviceID, r.ClientIP,
		string(r.State), string(r.Reason), "", r.AcceptedMS, 0, r.DecidedMS}
}

// acceptInsert is the INSERT of n coupon requests of database db
// (couponAcceptArgs each): ON DUPLICATE KEY UPDATE of the serial to itself
// stores nothing for one stored before and counts 0 for it.
func (m *MySQL) acceptInsert(db, n int) string {
	return "INSERT INTO " + m.couponReqTable(db) + " (" + couponReqCols + ") VALUES " + rowsOf(n, 14) +
		" ON DUPLICATE KEY UPDATE serial_no = serial_no"
}

// acceptedAs is r as an accept stores it (model.AcceptedForm): accepted,
// nothing decided, or refused SOLD_OUT at its accept.
func acceptedAs(r model.CouponRequest) model.CouponRequest { return model.AcceptedForm(r) }

// acceptCouponsTx stores the coupon requests of a group's AcceptOp ops, as
// AcceptCoupon does one: a new (app, serial) is stored accepted (or
// refused, model.RefusedAtAccept), a stored
// one answers the stored request (Repeat) or ErrOrderConflict
// (model.ReplayCouponRequest), an invalid request ErrInvalidArgument (op.Err
// each, nothing of that op written). First acceptAll tries the whole group
// in one round trip; when that cannot store every op (a stored serial, two
// ops of the group with one serial, or a row another transaction holds),
// acceptDB stores each database's ops with a count per row. It answers a
// probe that finds every request the group stored new after a COMMIT
// without answer (nil when it stored none). The probe compares what a
// request holds (person, batch, accept time): a client's retry stored by
// another group in the same millisecond looks the same, so CommitGroup uses
// it only for a group of accepts alone.
func (m *MySQL) acceptCouponsTx(ctx context.Context, tx *sql.Tx, ops []*AcceptOp, now int64, fresh bool) (func() (bool, error), error) {
	byDB := map[int][]*AcceptOp{}
	var dbs []int
	for _, op := range ops {
		if op.Coupon.AcceptedMS == 0 {
			op.Coupon.AcceptedMS = now
		}
		if op.Err = model.ValidateCouponRequest(op.Coupon); op.Err != nil {
			continue
		}
		db := op.Coupon.Shard.DB()
		if byDB[db] == nil {
			dbs = append(dbs, db)
		}
		byDB[db] = append(byDB[db], op)
	}
	if len(dbs) == 0 {
		return nil, nil
	}
	slices.Sort(dbs)
	for _, db := range dbs {
		slices.SortStableFunc(byDB[db], func(a, b *AcceptOp) int {
			return cmp.Or(cmp.Compare(a.Coupon.App, b.Coupon.App), cmp.Compare(a.Coupon.Serial, b.Coupon.Serial))
		})
	}
	ok, err := m.acceptAll(ctx, tx, byDB, dbs, fresh)
	if err != nil {
		return nil, err
	}
	if ok {
		m.accepts.Bulk.Add(1)
	} else {
		m.accepts.Fallback.Add(1)
		for _, db := range dbs {
			if err := m.acceptDB(ctx, tx, db, byDB[db]); err != nil {
				return nil, err
			}
		}
	}
	var stored []model.CouponRequest
	for _, db := range dbs {
		for _, op := range byDB[db] {
			if op.Err == nil && !op.Repeat {
				stored = append(stored, op.Accepted)
			}
		}
	}
	if len(stored) == 0 {
		return nil, nil
	}
	return m.acceptProbe(ctx, stored), nil
}

// acceptAll tries to store every op of byDB as a new request in one round
// trip: a statement list of a SAVEPOINT and, per database in dbs, a
// multi-row INSERT that does not wait for a lock, whose rows stored the
// driver reports (allStored). Any serial stored before
// (ON DUPLICATE KEY UPDATE serial_no = serial_no stores nothing and counts
// 0) or locked elsewhere makes ok false and the transaction goes back to
// the savepoint, nothing of the group's accepts written.
func (m *MySQL) acceptAll(ctx context.Context, tx *sql.Tx, byDB map[int][]*AcceptOp, dbs []int, fresh bool) (ok bool, err error) {
	var inserts []string
	n := 0
	for _, db := range dbs {
		n += len(byDB[db])
	}
	args := make([]any, 0, n*14)
	for _, db := range dbs {
		for _, op := range byDB[db] {
			args = append(args, couponAcceptArgs(op.Coupon)...)
		}
		inserts = append(inserts, m.acceptInsert(db, len(byDB[db])))
	}
	if ok, err := m.allStored(ctx, tx, acceptSavepoint, inserts, args, n, fresh); !ok || err != nil {
		return false, err
	}
	for _, db := range dbs {
		for _, op := range byDB[db] {
			op.Stored()
		}
	}
	return true, nil
}

// acceptDB stores one database's accepts, sorted by (app, serial), in one
// statement list: per op an INSERT ... ON DUPLICATE KEY UPDATE serial_no =
// serial_no (it waits for rows other transactions hold, and locks a stored
// row for update, never only shared), which affects 1 row when it stored
// it now and 0 when it was there already (execCounted). An op
// that stored its row is new; the others (stored before, or by an earlier
// op of this list) are read back, locked, and decided by
// model.ReplayCouponRequest: a repeat, or ErrOrderConflict. No gap is
// locked for a serial not stored, so concurrent groups do not deadlock over
// new serials.
func (m *MySQL) acceptDB(ctx context.Context, tx *sql.Tx, db int, list []*AcceptOp) error {
	q := make([]string, len(list))
	args := make([]any, 0, len(list)*14)
	for i, op := range list {
		q[i] = m.acceptInsert(db, 1)
		args = append(args, couponAcceptArgs(op.Coupon)...)
	}
	counts, err := m.execCounted(ctx, tx, strings.Join(q, ";"), args...)
	if err != nil {
		return err
	}
	if len(counts) != len(list) {
		return fmt.Errorf("storage: accept of %d requests counted %v", len(list), counts)
	}
	type k struct{ app, serial string }
	var where []string
	var keys []any
	for i, op := range list {
		if counts[i] == 1 {
			op.Stored()
			continue
		}
		where = append(where, "(app = ? AND serial_no = ?)")
		keys = append(keys, op.Coupon.App, op.Coupon.Serial)
	}
	if len(where) == 0 {
		return nil
	}
	stored, err := m.queryCouponReqs(ctx, tx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+" WHERE "+
		strings.Join(where, " OR ")+" FOR UPDATE", keys...)
	if err != nil {
		return err
	}
	have := make(map[k]model.CouponRequest, len(stored))
	for _, r := range stored {
		have[k{r.App, r.Serial}] = r
	}
	for i, op := range list {
		if counts[i] == 1 {
			continue
		}
		prior, ok := have[k{op.Coupon.App, op.Coupon.Serial}]
		if !ok {
			return fmt.Errorf("storage: accept: serial %s counted stored but not found", op.Coupon.Serial)
		}
		op.Replay(prior)
	}
	return nil
}

// acceptProbe tells whether every request of want, as this attempt stored
// it (its person, batch and accept time), is in its table.
func (m *MySQL) acceptProbe(ctx context.Context, want []model.CouponRequest) func() (bool, error) {
	return func() (bool, error) {
		for _, w := range want {
			r, err := m.couponRequestOf(ctx, w.Shard, w.App, w.Serial)
			if errors.Is(err, model.ErrNotFound) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if r.ActID != w.ActID || r.Batch != w.Batch || r.AcceptedMS != w.AcceptedMS {
				return false, nil
			}
		}
		return true, nil
	}
}
