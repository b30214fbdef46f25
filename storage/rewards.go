package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"

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
