package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"redcell/model"
)

// issueRewardsTx stores the rewards of a group's IssueOp ops. First
// issueAll tries the whole group in one round trip. When that cannot store
// every op (a stored order number, or a lock), each database in turn gets
// issueDB: a statement list of one INSERT ... ON DUPLICATE KEY UPDATE
// order_no = order_no per op, sorted by order number (one lock order for
// every writer), each counting the row it stored. It stores the new ones
// and locks the stored ones without a gap lock, so two groups never
// deadlock over a missing order number. An op is new only when its own
// INSERT stored its row: what a stored row holds cannot tell (a client's
// retries sent in one millisecond carry one token and one time). The
// others are read back and model.ReplayReward decides: a repeat, or
// ErrOrderConflict. It answers a probe that finds a stored reward after a
// COMMIT without answer (nil when the group stored none); the probe
// compares the token and time, which another group's copy of the same
// request shares, so groupTx uses it only for a group of issues alone.
func (m *MySQL) issueRewardsTx(ctx context.Context, tx *sql.Tx, ops []*IssueOp, fresh bool) (func() (bool, error), error) {
	byDB := map[int][]*IssueOp{}
	var dbs []int
	for _, op := range ops {
		db := op.Reward.Shard.DB()
		if byDB[db] == nil {
			dbs = append(dbs, db)
		}
		byDB[db] = append(byDB[db], op)
	}
	sort.Ints(dbs)
	for _, db := range dbs {
		sortIssues(byDB[db])
	}
	if ok, err := m.issueAll(ctx, tx, byDB, dbs, fresh); err != nil || ok {
		if err != nil {
			return nil, err
		}
		m.issues.Bulk.Add(1)
		return m.rewardProbe(ctx, ops[0].Issued), nil
	}
	m.issues.Fallback.Add(1)
	var probe func() (bool, error)
	for _, db := range dbs {
		if err := m.issueDB(ctx, tx, db, byDB[db]); err != nil {
			return nil, err
		}
		for _, op := range byDB[db] {
			if op.Err == nil && !op.Repeat && probe == nil {
				probe = m.rewardProbe(ctx, op.Issued)
			}
		}
	}
	return probe, nil
}

// issueDB stores one database's issues (sorted by order number) in one
// statement list: per op an INSERT ... ON DUPLICATE KEY UPDATE order_no =
// order_no, which affects 1 row when it stored it now and 0 when it was
// there already (execCounted). An op whose INSERT stored its row
// is new; the others (stored before, by another transaction or an earlier
// op of this list) are read back, locked, and decided by
// model.ReplayReward: a repeat, or ErrOrderConflict.
func (m *MySQL) issueDB(ctx context.Context, tx *sql.Tx, db int, list []*IssueOp) error {
	q := make([]string, len(list))
	args := make([]any, 0, len(list)*19)
	for i, op := range list {
		q[i] = m.issueInsert(db, 1)
		args = append(args, issueArgs(op.Reward)...)
	}
	counts, err := m.execCounted(ctx, tx, strings.Join(q, ";"), args...)
	if err != nil {
		return err
	}
	if len(counts) != len(list) {
		return fmt.Errorf("storage: issue of %d rewards counted %v", len(list), counts)
	}
	var orders []any
	for i, op := range list {
		if counts[i] == 1 {
			op.Stored()
			continue
		}
		orders = append(orders, op.Reward.OrderNo)
	}
	if len(orders) == 0 {
		return nil
	}
	stored, err := m.queryRewards(ctx, tx, "SELECT "+rewardCols+" FROM "+m.rewardTable(db)+" WHERE order_no IN ("+
		placeholders(len(orders))+") FOR UPDATE", orders...)
	if err != nil {
		return err
	}
	have := make(map[string]model.Reward, len(stored))
	for _, r := range stored {
		have[r.OrderNo] = r
	}
	for i, op := range list {
		if counts[i] == 1 {
			continue
		}
		prior, ok := have[op.Reward.OrderNo]
		if !ok {
			return fmt.Errorf("storage: issue: order number %s counted stored but not found", op.Reward.OrderNo)
		}
		op.Replay(prior)
	}
	return nil
}

// sortIssues puts one database's issue ops in order-number order: the
// order InnoDB locks a multi-row INSERT's rows in, the same for every
// writer.
func sortIssues(list []*IssueOp) {
	sort.SliceStable(list, func(i, j int) bool { return list[i].Reward.OrderNo < list[j].Reward.OrderNo })
}

// pendingReward is r as stored by an issue: pending, never taken or booked.
func pendingReward(r model.Reward) model.Reward {
	r.Status, r.ClaimedMS, r.BookedMS = model.RewardPending, 0, 0
	return r
}

// issueInsert is the INSERT of n new rewards of database db (issueArgs
// each): ON DUPLICATE KEY UPDATE of the order number to itself stores
// nothing for one stored before and counts 0 for it.
func (m *MySQL) issueInsert(db, n int) string {
	return "INSERT INTO " + m.rewardTable(db) + " (" + rewardCols + ", req_hash) VALUES " + rowsOf(n, 19) +
		" ON DUPLICATE KEY UPDATE order_no = order_no"
}

// issueArgs are the INSERT arguments of a new reward, in rewardCols order
// and req_hash.
func issueArgs(r model.Reward) []any {
	return []any{r.OrderNo, r.ActID, int(r.Shard), r.App, r.Parent, r.Child, r.Stage, r.Scene, r.Rain, r.AwardType,
		r.TemplateID, r.Amount, r.LeaseID, r.Token, model.RewardPending, r.CreatedMS, 0, 0, model.RewardHash(r)}
}

// issuePaths counts, since the store was opened, the groups of issues
// (or accepts) stored by each path: Alone, a group of one as its INSERT in
// autocommit (storeAlone); Bulk in one statement list (issueAll); Fallback
// by an INSERT (and, for a group holding a stored order number, a read)
// per database.
type issuePaths struct {
	Alone, Bulk, Fallback atomic.Int64
}

// issueSavepoint is where issueAll's statement list goes back to.
const issueSavepoint = "issues_bulk"

// issueAll tries to store every op of byDB as a new reward in one round
// trip: one statement list of a SAVEPOINT and, per database in dbs, a
// multi-row INSERT that does not wait for a lock, whose rows stored the
// driver reports (allStored). A group's issues
// are almost always new order numbers spread over many databases, so this
// replaces a locking read and an INSERT per database. An order number
// stored before (a repeat, or two ops of the group with one) is not stored
// again (ON DUPLICATE KEY UPDATE order_no = order_no: the stored row is
// locked for update, never only shared, so what follows in this
// transaction cannot deadlock another group doing the same); a statement
// that meets another transaction's lock stops the list. Either way ok is
// false: the transaction goes back to the savepoint, nothing of the group
// written, and issueRewardsTx's per-database path decides each op (with the
// locks taken so far still held).
func (m *MySQL) issueAll(ctx context.Context, tx *sql.Tx, byDB map[int][]*IssueOp, dbs []int, fresh bool) (ok bool, err error) {
	var inserts []string
	n := 0
	for _, db := range dbs {
		n += len(byDB[db])
	}
	args := make([]any, 0, n*19)
	for _, db := range dbs {
		list := byDB[db]
		for _, op := range list {
			args = append(args, issueArgs(op.Reward)...)
		}
		inserts = append(inserts, m.issueInsert(db, len(list)))
	}
	if ok, err := m.allStored(ctx, tx, issueSavepoint, inserts, args, n, fresh); !ok || err != nil {
		return false, err
	}
	for _, db := range dbs {
		for _, op := range byDB[db] {
			op.Stored()
		}
	}
	return true, nil
}

// allStored runs inserts, INSERT statements meant to store n new rows in
// all, as one statement list after SAVEPOINT sp, each without waiting for
// a lock (noWait), and adds up the rows they stored (execCounted: 1 per
// row stored, 0 per key that was there, under ON DUPLICATE KEY UPDATE of
// the key to itself). ok: all n stored. A lock met, a duplicate key or a
// short count takes tx back to sp (nothing of the list written, the locks
// taken kept) and answers false.
//
// Fresh: the transaction's first run (applyCreditsTx's fresh): no
// SAVEPOINT, and errBulkUnfit where it would go back to it.
func (m *MySQL) allStored(ctx context.Context, tx *sql.Tx, sp string, inserts []string, args []any, n int, fresh bool) (ok bool, err error) {
	q := make([]string, 0, len(inserts)+1)
	if !fresh {
		q = append(q, "SAVEPOINT "+sp)
	}
	for _, ins := range inserts {
		q = append(q, noWait+ins)
	}
	undo := func() error {
		if fresh {
			return errBulkUnfit
		}
		return undoTo(ctx, tx, sp)
	}
	counts, err := m.execCounted(ctx, tx, strings.Join(q, ";"), args...)
	if isMySQLErr(err, errLockWait) || isMySQLErr(err, errDupEntry) {
		return false, undo()
	}
	if err != nil {
		return false, err
	}
	if len(counts) != len(q) {
		return false, undo()
	}
	var stored int64
	for _, c := range counts[len(q)-len(inserts):] { // after the SAVEPOINT's, if any
		stored += c
	}
	if stored != int64(n) {
		return false, undo()
	}
	return true, nil
}

// rewardProbe tells whether reward want, as this attempt stored it (its
// token, time and lease), is in its table. A retry of the request sent in
// the same millisecond without a lease (a scene that does not control its
// stock) stores the same, so the probe settles only groups of issues alone.
func (m *MySQL) rewardProbe(ctx context.Context, want model.Reward) func() (bool, error) {
	return func() (bool, error) {
		r, err := m.reward(ctx, want.Shard, want.OrderNo)
		if errors.Is(err, model.ErrNotFound) {
			return false, nil
		}
		return err == nil && r.Token == want.Token && r.CreatedMS == want.CreatedMS && r.LeaseID == want.LeaseID, err
	}
}
