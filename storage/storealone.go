package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/retry"
	"redcell/model"
)

// A group of one op that stores one row under its idempotency key (a
// reward's issue, IssueOp, or a coupon request's accept, AcceptOp) is that
// row's INSERT alone, in autocommit: one statement and one round trip,
// where a transaction of its own would add a BEGIN and a COMMIT to it. At
// the rates most cells see, a lane's group holds one such op most of the
// time (a reward or a coupon request falls in one of 100 databases), so
// this is most issues' and accepts' path; two or more ops share a
// transaction as before (issueRewardsTx, acceptCouponsTx).
//
// The answers are the group's: the INSERT ... ON DUPLICATE KEY UPDATE of the
// key to itself stores the row and counts 1, or finds the key stored and
// counts 0, and then the stored row, read back, decides a repeat or
// ErrOrderConflict (model.ReplayReward, model.ReplayCouponRequest). A lock
// victim runs again (three tries, as inTx). A statement the server refused
// before executing it (notExecuted) wrote nothing. Any other failure (the
// connection lost, ctx ended, an error of the commit itself) is settled by
// the probe a COMMIT without answer gets, else answers ErrCommitUnknown: a
// retry with the key settles it, never storing twice.

// storeAlone runs ops, one IssueOp or AcceptOp, as its INSERT alone
// (above); ok is false for any other group, which storeAlone leaves as it
// is.
func (m *MySQL) storeAlone(ctx context.Context, ops []MoneyOp) (ok bool, err error) {
	if len(ops) != 1 {
		return false, nil
	}
	switch ops[0].(type) {
	case *IssueOp, *AcceptOp:
	default:
		return false, nil
	}
	ResetAnswers(ops)
	now := m.nowMS()
	var (
		kind   = ops[0].Kind()
		q      string
		args   []any
		stored func()                          // sets the answer of a row stored now
		probe  func() (bool, error)            // after no answer: is this attempt's row there
		replay func(ctx context.Context) error // after a count of 0: read the stored row, decide
	)
	switch op := ops[0].(type) {
	case *IssueOp:
		q, args, stored, probe, replay = m.issueAlone(ctx, op, now)
	case *AcceptOp:
		if op.Coupon.AcceptedMS == 0 {
			op.Coupon.AcceptedMS = now
		}
		if op.Err = model.ValidateCouponRequest(op.Coupon); op.Err != nil {
			return true, nil
		}
		r := op.Coupon
		q = m.acceptInsert(r.Shard.DB(), 1)
		args = couponAcceptArgs(r)
		stored = op.Stored
		probe = m.acceptProbe(ctx, []model.CouponRequest{acceptedAs(r)})
		replay = func(ctx context.Context) error {
			prior, err := m.couponRequestOf(ctx, r.Shard, r.App, r.Serial)
			if err != nil {
				return fmt.Errorf("storage: accept: serial %s counted stored: %w", r.Serial, err)
			}
			op.Replay(prior)
			return nil
		}
	}
	m.issuePathsOf(kind).Alone.Add(1)
	var res sql.Result
	err = retry.Do(ctx, retry.Policy{Attempts: 3, Retryable: lockVictim, Clock: m.clock}, func(int) error {
		var err error
		res, err = m.db.ExecContext(ctx, q, args...)
		return err
	})
	if err != nil {
		if notExecuted(err) {
			return true, fmt.Errorf("storage: %s alone: %w", kind, err) // nothing written
		}
		if ok, known := m.settleCommit(ctx, probe); known && ok {
			stored()
			return true, nil
		}
		return true, fmt.Errorf("storage: %s alone: %w", kind, commitUnknown(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return true, fmt.Errorf("storage: %s alone: %w", kind, err)
	}
	if n == 1 {
		stored()
		return true, nil
	}
	return true, replay(ctx)
}

// issueAlone is storeAlone's statement for an issue (op; a reward without
// a creation time gets now) and what follows it: stored sets the answer of
// a row stored now, probe tells after no answer whether this attempt's row
// is there, replay reads the stored row after a count of 0 and decides.
func (m *MySQL) issueAlone(ctx context.Context, op *IssueOp, now int64) (q string, args []any, stored func(), probe func() (bool, error), replay func(ctx context.Context) error) {
	if op.Reward.CreatedMS == 0 {
		op.Reward.CreatedMS = now
	}
	r := op.Reward
	q = m.issueInsert(r.Shard.DB(), 1)
	args = issueArgs(r)
	stored = op.Stored
	probe = m.rewardProbe(ctx, pendingReward(r))
	replay = func(ctx context.Context) error {
		prior, err := m.reward(ctx, r.Shard, r.OrderNo)
		if err != nil {
			return fmt.Errorf("storage: issue: order number %s counted stored: %w", r.OrderNo, err)
		}
		op.Replay(prior)
		return nil
	}
	return q, args, stored, probe, replay
}

// notExecuted reports whether err, an autocommit statement's, says the
// statement was not executed: the breaker refused it before it was sent,
// or the server refused it before any commit (a lock wait or deadlock, a
// missing table, a read-only server, a value the column refuses). Any other
// error, the server's errors of its commit phase (a killed connection, a
// shutdown, an error during commit) among them, leaves the outcome unknown.
func notExecuted(err error) bool {
	if errors.Is(err, ErrDBOpen) {
		return true
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case errLockWait, errLockDeadlock, errNoSuchTable,
		1290, 1836, // read-only (--read-only, a replica)
		1048, 1054, 1064, 1264, 1292, 1364, 1366, 1406: // a value or column refused, a syntax error
		return true
	}
	return false
}

// issuePathsOf is the path counter of kind k's groups: issues' or accepts'.
func (m *MySQL) issuePathsOf(k GroupKind) *issuePaths {
	if k == OpAccept {
		return &m.accepts
	}
	return &m.issues
}
