package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"redcell/model"
)

// acceptSavepoint is where acceptAll's statement list goes back to.
const acceptSavepoint = "accepts_bulk"

// couponAcceptArgs are the INSERT arguments of a request stored as
// accepted, in couponReqCols order.
func couponAcceptArgs(r model.CouponRequest) []any {
	return []any{r.App, r.Serial, r.ActID, int(r.Shard), r.Batch, r.Green, r.DeviceID, r.ClientIP,
		string(model.CouponAccepted), "", "", r.AcceptedMS, 0, 0}
}

// acceptedAs is r as an accept stores it: accepted, nothing decided.
func acceptedAs(r model.CouponRequest) model.CouponRequest {
	r.State, r.Reason, r.CouponID, r.TakenMS, r.DecidedMS = model.CouponAccepted, "", "", 0, 0
	return r
}

// acceptCouponsTx stores the coupon requests of a group's OpAccept ops, as
// AcceptCoupon does one: a new (app, serial) is stored accepted, a stored
// one answers the stored request (Repeat) or ErrOrderConflict
// (model.ReplayCouponRequest), an invalid request ErrInvalidArgument (op.Err
// each, nothing of that op written). First acceptAll tries the whole group
// in one round trip; when that cannot store every op (a stored serial, two
// ops of the group with one serial, or a row another transaction holds),
// each database in turn gets one INSERT ... ON DUPLICATE KEY UPDATE of its
// ops' rows in (app, serial) order, the order every writer locks them in,
// and, only when it stored fewer rows than it was given, a locking read of
// them. It answers a probe that finds a stored request after a COMMIT
// without answer (nil when the group stored nothing new). The probe finds
// a request like the one stored (person, batch, accept time): a client's
// retry stored by another group in the same millisecond looks the same, so
// CommitGroup uses it only for a group of accepts alone.
func (m *MySQL) acceptCouponsTx(ctx context.Context, tx *sql.Tx, ops []*GroupOp, now int64) (func() (bool, error), error) {
	byDB := map[int][]*GroupOp{}
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
		slices.SortStableFunc(byDB[db], func(a, b *GroupOp) int {
			return cmp.Or(cmp.Compare(a.Coupon.App, b.Coupon.App), cmp.Compare(a.Coupon.Serial, b.Coupon.Serial))
		})
	}
	ok, err := m.acceptAll(ctx, tx, byDB, dbs)
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
	for _, db := range dbs {
		for _, op := range byDB[db] {
			if op.Err == nil && !op.Repeat {
				return m.acceptProbe(ctx, op.Accepted), nil
			}
		}
	}
	return nil, nil
}

// acceptAll tries to store every op of byDB as a new request in one round
// trip: a statement list of a SAVEPOINT and, per database in dbs, a
// multi-row INSERT that does not wait for a lock, each adding the rows it
// stored to a session counter read back after. Any serial stored before
// (ON DUPLICATE KEY UPDATE serial_no = serial_no stores nothing and counts
// 0) or locked elsewhere makes ok false and the transaction goes back to
// the savepoint, nothing of the group's accepts written.
func (m *MySQL) acceptAll(ctx context.Context, tx *sql.Tx, byDB map[int][]*GroupOp, dbs []int) (ok bool, err error) {
	var q strings.Builder
	q.WriteString("SAVEPOINT " + acceptSavepoint + ";SET @redcell_accepted = 0")
	n := 0
	for _, db := range dbs {
		n += len(byDB[db])
	}
	args := make([]any, 0, n*14)
	for _, db := range dbs {
		for _, op := range byDB[db] {
			args = append(args, couponAcceptArgs(op.Coupon)...)
		}
		q.WriteString(";" + noWait + "INSERT INTO " + m.couponReqTable(db) + " (" + couponReqCols + ") VALUES " + rowsOf(len(byDB[db]), 14) +
			" ON DUPLICATE KEY UPDATE serial_no = serial_no;SET @redcell_accepted = @redcell_accepted + ROW_COUNT()")
	}
	_, err = tx.ExecContext(ctx, q.String(), args...)
	if isMySQLErr(err, errLockWait) || isMySQLErr(err, errDupEntry) {
		return false, undoTo(ctx, tx, acceptSavepoint)
	}
	if err != nil {
		return false, err
	}
	var stored int
	if err := tx.QueryRowContext(ctx, "SELECT @redcell_accepted").Scan(&stored); err != nil {
		return false, err
	}
	if stored != n {
		return false, undoTo(ctx, tx, acceptSavepoint)
	}
	for _, db := range dbs {
		for _, op := range byDB[db] {
			op.Accepted = acceptedAs(op.Coupon)
		}
	}
	return true, nil
}

// acceptDB stores one database's accepts, sorted by (app, serial): one
// locking read of their serials (it waits for rows, and locks the gaps of
// serials not stored, so nobody stores them meanwhile), then, per op in
// order, a stored serial — stored before, or by an earlier op of this list
// — is decided by model.ReplayCouponRequest (a repeat, or ErrOrderConflict),
// and a new one is stored by one INSERT of the new rows. Two groups locking
// the same gap deadlock; InnoDB rolls one back and inTx runs it again.
func (m *MySQL) acceptDB(ctx context.Context, tx *sql.Tx, db int, list []*GroupOp) error {
	type k struct{ app, serial string }
	var where []string
	keys := make([]any, 0, 2*len(list))
	for _, op := range list {
		where = append(where, "(app = ? AND serial_no = ?)")
		keys = append(keys, op.Coupon.App, op.Coupon.Serial)
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
	var fresh []*GroupOp
	for _, op := range list {
		key := k{op.Coupon.App, op.Coupon.Serial}
		if prior, ok := have[key]; ok {
			if op.Err = model.ReplayCouponRequest(prior, op.Coupon); op.Err == nil {
				op.Accepted, op.Repeat = prior, true
			}
			continue
		}
		op.Accepted = acceptedAs(op.Coupon)
		have[key] = op.Accepted
		fresh = append(fresh, op)
	}
	if len(fresh) == 0 {
		return nil
	}
	args := make([]any, 0, len(fresh)*14)
	for _, op := range fresh {
		args = append(args, couponAcceptArgs(op.Coupon)...)
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO "+m.couponReqTable(db)+" ("+couponReqCols+") VALUES "+rowsOf(len(fresh), 14), args...)
	return err
}

// acceptProbe tells whether request want, as this attempt stored it (its
// person, batch and accept time), is in its table.
func (m *MySQL) acceptProbe(ctx context.Context, want model.CouponRequest) func() (bool, error) {
	return func() (bool, error) {
		r, err := m.CouponRequestOf(ctx, want.Shard, want.App, want.Serial)
		if errors.Is(err, model.ErrNotFound) {
			return false, nil
		}
		return err == nil && r.ActID == want.ActID && r.Batch == want.Batch && r.AcceptedMS == want.AcceptedMS, err
	}
}
