package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"redcell/internal/invariant"
	"redcell/model"
)

// Rewards in MariaDB: one table per database, db_XX.t_reward, keyed by the
// reward's order number (ascii_bin: compared byte for byte, never folded).
// The rows of a person are found by (act_id, created_ms); the booker's
// queue is (status, created_ms); the lease settlement's sums are by lease_id.

// rewardDay is the ensureKey.day of a database's reward table (shard = the
// database's first shard): made on first use.
const rewardDay = -2

func (m *MySQL) rewardTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return m.tableNamesOf().reward[db]
}

func (m *MySQL) rewardDDL(db int) []string {
	return []string{
		fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %sdb_%02d", m.ns, db) + dbDefaults,
		`CREATE TABLE IF NOT EXISTS ` + m.rewardTable(db) + ` (
  order_no    VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  act_id      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  act_shard   SMALLINT NOT NULL,
  app         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  parent_id   VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  child_id    VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  stage       VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  scene_id    VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  rain_id     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  award_type  VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  template_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  amount      BIGINT NOT NULL,
  lease_id    VARCHAR(40) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  token       VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  req_hash    CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  status      TINYINT NOT NULL DEFAULT 0,
  created_ms  BIGINT NOT NULL,
  claimed_ms  BIGINT NOT NULL DEFAULT 0,
  booked_ms   BIGINT NOT NULL DEFAULT 0,
  KEY k_status (status, created_ms),
  KEY k_act (act_id, created_ms, order_no),
  KEY k_lease (lease_id),
  KEY k_booked (act_shard, status, booked_ms),
  CONSTRAINT reward_amount_positive CHECK (amount >= 1)
) ENGINE=InnoDB`,
		// Reward tables made before k_booked existed get it here (a no-op
		// where it exists): reconciliation reads a window of bookings by it.
		`ALTER TABLE ` + m.rewardTable(db) + ` ADD INDEX IF NOT EXISTS k_booked (act_shard, status, booked_ms)`,
	}
}

func (m *MySQL) ensureRewards(ctx context.Context, db int) error {
	return m.ensure(ctx, ensureKey{shard: model.ShardID(db * 10), day: rewardDay}, m.rewardDDL(db))
}

// rewardCols are the columns scanReward reads, in its order.
const rewardCols = "order_no, act_id, act_shard, app, parent_id, child_id, stage, scene_id, rain_id, award_type, template_id, " +
	"amount, lease_id, token, status, created_ms, claimed_ms, booked_ms"

type rowScanner interface{ Scan(dest ...any) error }

func scanReward(r rowScanner) (model.Reward, error) {
	var x model.Reward
	var shard int
	err := r.Scan(&x.OrderNo, &x.ActID, &shard, &x.App, &x.Parent, &x.Child, &x.Stage, &x.Scene, &x.Rain, &x.AwardType,
		&x.TemplateID, &x.Amount, &x.LeaseID, &x.Token, &x.Status, &x.CreatedMS, &x.ClaimedMS, &x.BookedMS)
	x.Shard = model.ShardID(shard)
	return x, err
}

func (m *MySQL) queryRewards(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]model.Reward, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []model.Reward
	for rows.Next() {
		r, err := scanReward(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// reward answers RewardQuery.
func (m *MySQL) reward(ctx context.Context, s model.ShardID, orderNo string) (model.Reward, error) {
	if err := m.ensureRewards(ctx, s.DB()); err != nil {
		return model.Reward{}, err
	}
	r, err := scanReward(m.db.QueryRowContext(ctx, "SELECT "+rewardCols+" FROM "+m.rewardTable(s.DB())+" WHERE order_no = ?", orderNo))
	if errors.Is(err, sql.ErrNoRows) {
		return model.Reward{}, model.Errorf(model.ErrNotFound, "no reward %s", orderNo)
	}
	if err != nil {
		return model.Reward{}, fmt.Errorf("storage: read reward: %w", err)
	}
	return r, nil
}

// rewardsOf answers RewardsOfQuery.
func (m *MySQL) rewardsOf(ctx context.Context, s model.ShardID, actID, stage string, after model.FlowCursor, limit int) ([]model.Reward, error) {
	if err := m.ensureRewards(ctx, s.DB()); err != nil {
		return nil, err
	}
	q := "SELECT " + rewardCols + " FROM " + m.rewardTable(s.DB()) + " WHERE act_id = ?"
	args := []any{actID}
	if stage != "" {
		q += " AND stage = ?"
		args = append(args, stage)
	}
	if after != (model.FlowCursor{}) {
		q += " AND (created_ms < ? OR created_ms = ? AND order_no < ?)"
		args = append(args, after.CreatedMS, after.CreatedMS, after.ID)
	}
	q += " ORDER BY created_ms DESC, order_no DESC LIMIT ?"
	args = append(args, limit)
	rs, err := m.queryRewards(ctx, m.db, q, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: rewards of %s: %w", actID, err)
	}
	return rs, nil
}

// rewardSums answers RewardSumsQuery: the person's rows, summed by
// model.SumRewards (a person holds one reward per scene, rain and stage).
func (m *MySQL) rewardSums(ctx context.Context, s model.ShardID, actID string) ([]model.StageSums, error) {
	if err := m.ensureRewards(ctx, s.DB()); err != nil {
		return nil, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT stage, award_type, status, amount FROM "+m.rewardTable(s.DB())+" WHERE act_id = ?", actID)
	if err != nil {
		return nil, fmt.Errorf("storage: reward sums: %w", err)
	}
	defer rows.Close()
	var rs []model.Reward
	for rows.Next() {
		var r model.Reward
		if err := rows.Scan(&r.Stage, &r.AwardType, &r.Status, &r.Amount); err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return model.SumRewards(rs), nil
}

// pendingRewardsOf answers PendingRewardsOfQuery.
func (m *MySQL) pendingRewardsOf(ctx context.Context, s model.ShardID, actID string, limit int) ([]model.Reward, error) {
	if err := m.ensureRewards(ctx, s.DB()); err != nil {
		return nil, err
	}
	rs, err := m.queryRewards(ctx, m.db, "SELECT "+rewardCols+" FROM "+m.rewardTable(s.DB())+
		" WHERE act_id = ? AND status <> ? ORDER BY created_ms, order_no LIMIT ?", actID, model.RewardBooked, limit)
	if err != nil {
		return nil, fmt.Errorf("storage: pending rewards of %s: %w", actID, err)
	}
	return rs, nil
}

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

// flowsOf answers FlowsOfQuery.
func (m *MySQL) flowsOf(ctx context.Context, s model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Flow, error) {
	if err := m.EnsureShard(ctx, s); err != nil {
		return nil, err
	}
	q := "SELECT id, kind, order_no, amount, balance_after, ref, req_hash, created_ms FROM " + m.flowTable(s) +
		" WHERE act_id = ? AND kind <> ?"
	args := []any{actID, string(model.FlowReward)}
	if after != (model.FlowCursor{}) {
		below := after.FlowSeqBelow()
		if below == math.MaxInt64 {
			q += " AND created_ms <= ?"
			args = append(args, after.CreatedMS)
		} else {
			q += " AND (created_ms < ? OR created_ms = ? AND id < ?)"
			args = append(args, after.CreatedMS, after.CreatedMS, below)
		}
	}
	q += " ORDER BY created_ms DESC, id DESC LIMIT ?"
	args = append(args, limit)
	rows, err := m.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: flows of %s: %w", actID, err)
	}
	defer rows.Close()
	var out []model.Flow
	for rows.Next() {
		f := model.Flow{ActID: actID}
		var bal sql.NullInt64
		if err := rows.Scan(&f.Seq, &f.Kind, &f.OrderNo, &f.Amount, &bal, &f.Ref, &f.ReqHash, &f.CreatedMS); err != nil {
			return nil, err
		}
		f.BalanceAfter, f.BalanceKnown = model.Cents(bal.Int64), bal.Valid
		out = append(out, f)
	}
	return out, rows.Err()
}

// ledgerRewards reads, in the ledger's snapshot, the reward rows (sums by
// stage, award type and status; sums by lease) and the budgets homed here
// with their leases, into l.RewardRows.
func (m *MySQL) ledgerRewards(ctx context.Context, tx *sql.Conn, byKind map[string][]tableRef, l *model.Ledger) error {
	rr := &l.RewardRows
	for _, t := range byKind["reward"] {
		rows, err := tx.QueryContext(ctx, "SELECT stage, award_type, status, lease_id, SUM(amount), COUNT(*) FROM "+m.rewardTable(t.shard.DB())+
			" GROUP BY stage, award_type, status, lease_id")
		if err != nil {
			return fmt.Errorf("storage: ledger of reward tables: %w", err)
		}
		for rows.Next() {
			var x model.Reward
			var sum, n int64
			if err := rows.Scan(&x.Stage, &x.AwardType, &x.Status, &x.LeaseID, &sum, &n); err != nil {
				rows.Close()
				return err
			}
			// One row stands for n rewards of sum: counted as one, then
			// the count corrected.
			x.Amount = model.Cents(sum)
			rr.AddReward(x)
			rr.Count += n - 1
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	for _, t := range byKind["budget"] {
		if !slices.ContainsFunc(byKind["lease"], func(x tableRef) bool { return x.shard == t.shard }) {
			continue // the pair is being created
		}
		bs, err := m.budgetsIn(ctx, tx, t.shard)
		if err != nil {
			return fmt.Errorf("storage: ledger of budget tables: %w", err)
		}
		rr.Budgets = append(rr.Budgets, bs...)
		ls, err := m.leases(ctx, tx, "SELECT "+leaseCols+" FROM "+m.leaseTable(t.shard)+" ORDER BY created_ms, lease_id")
		if err != nil {
			return fmt.Errorf("storage: ledger of lease tables: %w", err)
		}
		rr.Leases = append(rr.Leases, ls...)
	}
	return nil
}

// budgetsIn reads every budget row of s's database.
func (m *MySQL) budgetsIn(ctx context.Context, q rowsQueryer, s model.ShardID) ([]model.Budget, error) {
	rows, err := q.QueryContext(ctx, "SELECT budget_key, total, granted, returned, updated_ms FROM "+m.budgetTable(s)+" ORDER BY budget_key")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []model.Budget
	for rows.Next() {
		var b model.Budget
		if err := rows.Scan(&b.Key, &b.Total, &b.Granted, &b.Returned, &b.UpdatedMS); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// rewardRecon answers RewardReconQuery: per shard table of the database, one
// LEFT JOIN of the booked official cash rewards to their flows (by the
// flow's order number, model.RewardFlowOrderNo: "reward:" and the first 32
// hex digits of SHA2(order_no, 256)) and the window's sums of both sides.
func (m *MySQL) rewardRecon(ctx context.Context, db int, fromMS, toMS, staleMS int64, countFlows bool) (model.RewardRecon, error) {
	out := model.RewardRecon{DB: db, FromMS: fromMS, ToMS: toMS, FlowsCounted: countFlows}
	rt := m.rewardTable(db)
	// One range of k_status (status, created_ms): every reward not booked,
	// the stale ones among them counted apart.
	err := m.db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(created_ms < ?), 0), COALESCE(MIN(CASE WHEN created_ms < ? THEN created_ms END), 0) FROM "+rt+" WHERE status <> ?",
		staleMS, staleMS, model.RewardBooked).Scan(&out.Pending, &out.StalePending, &out.OldestPendingMS)
	if isMySQLErr(err, errNoSuchTable) {
		return out, nil // no reward was ever issued in db
	}
	if err != nil {
		return out, fmt.Errorf("storage: reward recon of db %d: %w", db, err)
	}
	for y := 0; y < 10; y++ {
		s := model.ShardID(db*10 + y)
		ft := m.flowTable(s)
		if countFlows { // a scan of the flow table: the hourly full pass only
			var n, sum int64
			err := m.db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM "+ft+" WHERE kind = ? AND created_ms >= ? AND created_ms < ?",
				string(model.FlowReward), fromMS, toMS).Scan(&n, &sum)
			if isMySQLErr(err, errNoSuchTable) {
				continue // a shard without wallets has no booked reward either: its rewards would have made them
			}
			if err != nil {
				return out, fmt.Errorf("storage: reward recon of shard %d: %w", s, err)
			}
			out.Flows += n
			out.FlowCents += model.Cents(sum)
		}
		rows, err := m.db.QueryContext(ctx, "SELECT r.order_no, r.amount, f.id IS NULL FROM "+rt+" r FORCE INDEX (k_booked) LEFT JOIN "+ft+
			" f ON f.act_id = r.act_id AND f.order_no = CONCAT('reward:', LEFT(SHA2(r.order_no, 256), 32))"+
			" WHERE r.act_shard = ? AND r.status = ? AND r.stage = ? AND r.award_type = ? AND r.booked_ms >= ? AND r.booked_ms < ?",
			int(s), model.RewardBooked, model.StageOfficial, model.AwardCash, fromMS, toMS)
		if isMySQLErr(err, errNoSuchTable) {
			continue // no wallet table: no reward of the shard was booked into one
		}
		if err != nil {
			return out, fmt.Errorf("storage: reward recon of shard %d: %w", s, err)
		}
		for rows.Next() {
			var order string
			var amount int64
			var missing bool
			if err := rows.Scan(&order, &amount, &missing); err != nil {
				rows.Close()
				return out, err
			}
			out.Booked++
			out.BookedCents += model.Cents(amount)
			if missing && len(out.Missing) < 20 {
				out.Missing = append(out.Missing, order)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}

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

// withdrawalOf answers WithdrawalQuery.
func (m *MySQL) withdrawalOf(ctx context.Context, s model.ShardID, actID, orderNo string) (model.Withdrawal, bool, error) {
	if err := m.EnsureShard(ctx, s); err != nil {
		return model.Withdrawal{}, false, err
	}
	f, ok, err := m.findFlow(ctx, m.db, s, actID, orderNo)
	if err != nil || !ok || f.Kind != model.FlowWithdraw {
		return model.Withdrawal{}, false, err
	}
	return model.Withdrawal{ActID: actID, OrderNo: orderNo, Amount: -f.Amount, Balance: f.BalanceAfter, Repeat: true}, true, nil
}
