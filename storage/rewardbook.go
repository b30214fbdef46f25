package storage

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"sort"
	"strings"

	"redcell/internal/invariant"
	"redcell/model"
)

// takeRewards runs TakeRewardsOp: in one transaction, the oldest pending rows
// and the stale processing ones, skipping rows another booker holds (SKIP
// LOCKED), are marked processing and read.
//
// A database whose reward table does not exist yet has nothing to take: the
// booker's scan of every database makes no table.
func (m *MySQL) takeRewards(ctx context.Context, db int, staleMS int64, limit int) ([]model.Reward, error) {
	t := m.rewardTable(db)
	var out []model.Reward
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		out = out[:0]
		rs, err := m.lockToBook(ctx, tx, RewardTake{DB: db, StaleMS: staleMS, IssuedByMS: math.MaxInt64, Limit: limit})
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return nil
		}
		now := m.nowMS()
		args := []any{model.RewardProcessing, now}
		for _, r := range rs {
			args = append(args, r.OrderNo)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+t+" SET status = ?, claimed_ms = ? WHERE order_no IN ("+placeholders(len(rs))+")", args...); err != nil {
			return err
		}
		for i := range rs {
			rs[i].Status, rs[i].ClaimedMS = model.RewardProcessing, now
		}
		out = rs
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storage: take rewards of db %d: %w", db, err)
	}
	return out, nil
}

// rewardsDue answers RewardsDueQuery: one statement, no lock.
func (m *MySQL) rewardsDue(ctx context.Context, db int, staleMS int64) (bool, error) {
	t := m.rewardTable(db)
	var n int
	err := m.db.QueryRowContext(ctx, "SELECT (EXISTS (SELECT 1 FROM "+t+" WHERE status = ?)) + (EXISTS (SELECT 1 FROM "+t+
		" WHERE status = ? AND claimed_ms <= ?))", model.RewardPending, model.RewardProcessing, staleMS).Scan(&n)
	if isMySQLErr(err, errNoSuchTable) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("storage: rewards due in db %d: %w", db, err)
	}
	return n > 0, nil
}

// lockToBook reads and locks the rewards tk names, oldest first, in tx
// (none when the database has no reward table yet: a booker's scan of
// every database makes no table).
func (m *MySQL) lockToBook(ctx context.Context, tx *sql.Tx, tk RewardTake) ([]model.Reward, error) {
	t := m.rewardTable(tk.DB)
	rs, err := m.queryRewards(ctx, tx, "(SELECT "+rewardCols+" FROM "+t+" WHERE status = ? AND created_ms <= ? ORDER BY created_ms LIMIT ? FOR UPDATE SKIP LOCKED)"+
		" UNION ALL (SELECT "+rewardCols+" FROM "+t+" WHERE status = ? AND created_ms <= ? AND claimed_ms <= ? ORDER BY created_ms LIMIT ? FOR UPDATE SKIP LOCKED)",
		model.RewardPending, tk.IssuedByMS, tk.Limit, model.RewardProcessing, tk.IssuedByMS, tk.StaleMS, tk.Limit)
	if isMySQLErr(err, errNoSuchTable) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].CreatedMS < rs[j].CreatedMS })
	if len(rs) > tk.Limit {
		rs = rs[:tk.Limit]
	}
	return rs, nil
}

// takeAndBookTx books, in tx, the rewards tk names (a group's BookOp with
// Take) and answers them: one locking read, then bookFound's statements.
// A reward whose wallet tables this process has not made sure of yet (DDL
// cannot run in a transaction: it would commit it) is left as it is
// (pending, or a stale processing) and answered in left, its shard in shards: CommitGroup makes those tables
// after the transaction, and the next pass books it. An issue makes its
// shard's tables sure (ensureGroup), so only a reward from before a start,
// or from another owner, is left once.
func (m *MySQL) takeAndBookTx(ctx context.Context, tx *sql.Tx, tk RewardTake, now int64) (booked []model.Reward, left []string, shards []model.ShardID, err error) {
	rs, err := m.lockToBook(ctx, tx, tk)
	if err != nil || len(rs) == 0 {
		return nil, nil, nil, err
	}
	for _, r := range rs {
		if r.IntoWallet() && !m.ensuredOK(ensureKey{shard: r.Shard}) {
			left, shards = append(left, r.OrderNo), append(shards, r.Shard)
			continue
		}
		booked = append(booked, r)
	}
	if len(booked) == 0 {
		return nil, left, shards, nil
	}
	if err := m.bookFound(ctx, tx, tk.DB, booked, now); err != nil {
		return nil, nil, nil, err
	}
	for i := range booked {
		booked[i].Status, booked[i].BookedMS = model.RewardBooked, now
	}
	return booked, left, shards, nil
}

// ensureRewardBooking makes the tables booking rs touches exist (outside a
// transaction: DDL would commit it) and answers rs's databases, sorted.
func (m *MySQL) ensureRewardBooking(ctx context.Context, rs []model.Reward) ([]int, error) {
	seen := map[int]bool{}
	var dbs []int
	for _, r := range rs {
		invariant.That(r.Shard.Valid(), "shard out of range")
		if r.IntoWallet() {
			if err := m.EnsureShard(ctx, r.Shard); err != nil {
				return nil, err
			}
		}
		if db := r.Shard.DB(); !seen[db] {
			seen[db] = true
			if err := m.ensureRewards(ctx, db); err != nil {
				return nil, err
			}
			dbs = append(dbs, db)
		}
	}
	sort.Ints(dbs)
	return dbs, nil
}

// bookRewardsTx books, in tx, the rewards of rs not booked yet and answers
// them. Databases are locked in index order, rows by order number: one lock
// order for every booker.
func (m *MySQL) bookRewardsTx(ctx context.Context, tx *sql.Tx, rs []model.Reward, now int64) ([]model.Reward, error) {
	byDB := map[int][]string{}
	var dbs []int
	for _, r := range rs {
		db := r.Shard.DB()
		if byDB[db] == nil {
			dbs = append(dbs, db)
		}
		byDB[db] = append(byDB[db], r.OrderNo)
	}
	sort.Ints(dbs)
	var booked []model.Reward
	for _, db := range dbs {
		orders := byDB[db]
		sort.Strings(orders)
		args := make([]any, 0, len(orders)+1)
		args = append(args, model.RewardBooked)
		for _, o := range orders {
			args = append(args, o)
		}
		found, err := m.queryRewards(ctx, tx, "SELECT "+rewardCols+" FROM "+m.rewardTable(db)+
			" WHERE status <> ? AND order_no IN ("+placeholders(len(orders))+") ORDER BY order_no FOR UPDATE", args...)
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			continue
		}
		if err := m.bookFound(ctx, tx, db, found, now); err != nil {
			return nil, err
		}
		booked = append(booked, found...)
	}
	return booked, nil
}

// bookFound books rs, rewards of database db read and locked in tx, not
// booked yet: their wallets' side (bookIntoWalletsSQL) and their rows marked
// booked, in one round trip.
func (m *MySQL) bookFound(ctx context.Context, tx *sql.Tx, db int, rs []model.Reward, now int64) error {
	q, args := m.bookIntoWalletsSQL(rs, now)
	if q != "" {
		q += ";"
	}
	q += "UPDATE " + m.rewardTable(db) + " SET status = ?, booked_ms = ? WHERE order_no IN (" + placeholders(len(rs)) + ")"
	args = append(args, model.RewardBooked, now)
	for _, r := range rs {
		args = append(args, r.OrderNo)
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("storage: book %d rewards: %w", len(rs), err)
	}
	return nil
}

// bookIntoWalletsSQL is the wallet side of rewards being booked, as a
// statement list and its arguments ("" when none goes into a wallet): per
// shard a multi-row INSERT of their flows and a multi-row balance upsert
// (a batch's rewards fall in as many shard tables as rewards, most of the
// time).
func (m *MySQL) bookIntoWalletsSQL(rs []model.Reward, now int64) (string, []any) {
	byShard := map[model.ShardID][]model.Flow{}
	var shards []model.ShardID
	for _, r := range rs {
		f, ok := model.RewardFlow(r, now)
		if !ok {
			continue
		}
		if byShard[r.Shard] == nil {
			shards = append(shards, r.Shard)
		}
		byShard[r.Shard] = append(byShard[r.Shard], f)
	}
	if len(shards) == 0 {
		return "", nil
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	var q strings.Builder
	var args []any
	for _, s := range shards {
		flows := byShard[s]
		sums := map[string]model.Cents{}
		var acts []string
		for _, f := range flows {
			args = append(args, flowArgs(f)...)
			if _, ok := sums[f.ActID]; !ok {
				acts = append(acts, f.ActID)
			}
			sums[f.ActID] += f.Amount
		}
		if q.Len() > 0 {
			q.WriteString(";")
		}
		q.WriteString(m.flowInsertRows(s, len(flows)))
		sort.Strings(acts)
		for _, a := range acts {
			args = append(args, a, sums[a], now)
		}
		q.WriteString(";INSERT INTO " + m.accountTable(s) + " (act_id, balance, updated_ms) VALUES " + rowsOf(len(acts), 3) +
			" ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), updated_ms = VALUES(updated_ms)")
	}
	return q.String(), args
}

// leaseSpent answers LeaseSpentQuery.
func (m *MySQL) leaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error) {
	var total int64
	for _, db := range dbs {
		var n int64
		// With what the lease's exported rewards spent (ExportPass), in the
		// same statement, so a step committing in between counts once.
		err := m.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(amount), 0) + COALESCE((SELECT amount FROM "+m.carryTable(db)+" WHERE k = ?), 0) FROM "+
			m.rewardTable(db)+" WHERE lease_id = ?", "lease:"+leaseID, leaseID).Scan(&n)
		if isMySQLErr(err, errNoSuchTable) { // no export in db yet, or no reward ever issued there
			err = m.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(amount), 0) FROM "+m.rewardTable(db)+" WHERE lease_id = ?", leaseID).Scan(&n)
		}
		if isMySQLErr(err, errNoSuchTable) { // no reward was ever issued in db
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("storage: lease spent: %w", err)
		}
		total += n
	}
	return total, nil
}
