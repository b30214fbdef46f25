package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/invariant"
	"redcell/model"
)

// Coupons in MariaDB, in the person's database (the act_id's shard's
// db_XX): t_coupon_req holds the issue requests, keyed by (app, serial_no),
// the idempotency key; t_coupon the issued coupons, keyed by
// model.CouponID(app, serial), so a request holds one coupon at most;
// t_coupon_person one row per person who was ever issued to, locked by the
// issuing transaction so that two merges holding one person's requests
// decide one after the other against the same holding. The stock is not
// here: it is a Budgets row of the batch's home shard, a merged deduction a
// lease of it (model.GrantLease, no reserve).

var _ Coupons = (*MySQL)(nil)

// couponDay is the ensureKey.day of a database's coupon tables.
const couponDay = -4

func (m *MySQL) couponReqTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return fmt.Sprintf("%sdb_%02d.t_coupon_req", m.ns, db)
}

func (m *MySQL) couponTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return fmt.Sprintf("%sdb_%02d.t_coupon", m.ns, db)
}

func (m *MySQL) couponPersonTable(db int) string {
	invariant.That(db >= 0 && db < model.ShardCount/10, "db index out of range")
	return fmt.Sprintf("%sdb_%02d.t_coupon_person", m.ns, db)
}

func (m *MySQL) couponDDL(db int) []string {
	ascii := "CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
	return []string{
		fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %sdb_%02d", m.ns, db),
		`CREATE TABLE IF NOT EXISTS ` + m.couponReqTable(db) + ` (
  app         VARCHAR(64) ` + ascii + ` DEFAULT '',
  serial_no   VARCHAR(64) ` + ascii + `,
  act_id      VARCHAR(64) ` + ascii + `,
  act_shard   SMALLINT NOT NULL,
  batch_id    VARCHAR(64) ` + ascii + `,
  green       TINYINT NOT NULL DEFAULT 0,
  device_id   VARCHAR(64) ` + ascii + ` DEFAULT '',
  client_ip   VARCHAR(45) ` + ascii + ` DEFAULT '',
  state       VARCHAR(9) ` + ascii + `,
  reason      VARCHAR(20) ` + ascii + ` DEFAULT '',
  coupon_id   CHAR(32) ` + ascii + ` DEFAULT '',
  accepted_ms BIGINT NOT NULL,
  taken_ms    BIGINT NOT NULL DEFAULT 0,
  decided_ms  BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (app, serial_no),
  KEY k_state (state, accepted_ms),
  KEY k_taken (state, taken_ms),
  KEY k_act (act_id, accepted_ms)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + m.couponTable(db) + ` (
  coupon_id  CHAR(32) ` + ascii + ` PRIMARY KEY,
  act_id     VARCHAR(64) ` + ascii + `,
  act_shard  SMALLINT NOT NULL,
  batch_id   VARCHAR(64) ` + ascii + `,
  group_id   VARCHAR(64) ` + ascii + ` DEFAULT '',
  app        VARCHAR(64) ` + ascii + ` DEFAULT '',
  serial_no  VARCHAR(64) ` + ascii + `,
  lease_id   VARCHAR(40) ` + ascii + ` DEFAULT '',
  issued_ms  BIGINT NOT NULL,
  KEY k_act (act_id, issued_ms),
  KEY k_lease (lease_id)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + m.couponPersonTable(db) + ` (
  act_id     VARCHAR(64) ` + ascii + ` PRIMARY KEY,
  updated_ms BIGINT NOT NULL
) ENGINE=InnoDB`,
	}
}

func (m *MySQL) ensureCoupons(ctx context.Context, db int) error {
	return m.ensure(ctx, ensureKey{shard: model.ShardID(db * 10), day: couponDay}, m.couponDDL(db))
}

const couponReqCols = "app, serial_no, act_id, act_shard, batch_id, green, device_id, client_ip, state, reason, coupon_id, accepted_ms, taken_ms, decided_ms"

func scanCouponReq(r rowScanner) (model.CouponRequest, error) {
	var x model.CouponRequest
	var shard int
	err := r.Scan(&x.App, &x.Serial, &x.ActID, &shard, &x.Batch, &x.Green, &x.DeviceID, &x.ClientIP, &x.State, &x.Reason,
		&x.CouponID, &x.AcceptedMS, &x.TakenMS, &x.DecidedMS)
	x.Shard = model.ShardID(shard)
	return x, err
}

func (m *MySQL) queryCouponReqs(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]model.CouponRequest, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []model.CouponRequest
	for rows.Next() {
		r, err := scanCouponReq(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// AcceptCoupon implements Coupons: one INSERT ... ON DUPLICATE KEY UPDATE
// (1 row affected: stored now; 0: the serial was there, and the stored
// request is read and decided against, model.ReplayCouponRequest).
func (m *MySQL) AcceptCoupon(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error) {
	if err := model.ValidateCouponRequest(r); err != nil {
		return model.CouponRequest{}, false, err
	}
	db := r.Shard.DB()
	if err := m.ensureCoupons(ctx, db); err != nil {
		return model.CouponRequest{}, false, err
	}
	if r.AcceptedMS == 0 {
		r.AcceptedMS = m.nowMS()
	}
	r.State, r.Reason, r.CouponID, r.TakenMS, r.DecidedMS = model.CouponAccepted, "", "", 0, 0
	res, err := m.db.ExecContext(ctx, "INSERT INTO "+m.couponReqTable(db)+" ("+couponReqCols+") VALUES "+rowsOf(1, 14)+
		" ON DUPLICATE KEY UPDATE serial_no = serial_no",
		r.App, r.Serial, r.ActID, int(r.Shard), r.Batch, r.Green, r.DeviceID, r.ClientIP, string(r.State), "", "", r.AcceptedMS, 0, 0)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			return model.CouponRequest{}, false, fmt.Errorf("storage: accept coupon: %w", err)
		}
		return model.CouponRequest{}, false, fmt.Errorf("storage: accept coupon: %w", errors.Join(ErrCommitUnknown, err))
	}
	if n, err := res.RowsAffected(); err != nil {
		return model.CouponRequest{}, false, err
	} else if n == 1 {
		return r, false, nil
	}
	prior, err := m.CouponRequestOf(ctx, r.Shard, r.App, r.Serial)
	if err != nil {
		return model.CouponRequest{}, false, fmt.Errorf("storage: accept coupon: read the stored one: %w", err)
	}
	if err := model.ReplayCouponRequest(prior, r); err != nil {
		return model.CouponRequest{}, false, err
	}
	return prior, true, nil
}

// CouponRequestOf implements Coupons.
func (m *MySQL) CouponRequestOf(ctx context.Context, s model.ShardID, app, serial string) (model.CouponRequest, error) {
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return model.CouponRequest{}, err
	}
	r, err := scanCouponReq(m.db.QueryRowContext(ctx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(s.DB())+
		" WHERE app = ? AND serial_no = ?", app, serial))
	if errors.Is(err, sql.ErrNoRows) {
		return model.CouponRequest{}, model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", serial, app)
	}
	if err != nil {
		return model.CouponRequest{}, fmt.Errorf("storage: read coupon request: %w", err)
	}
	return r, nil
}

// TakeCouponRequests implements Coupons: a locking read that skips rows
// other takers hold, then one UPDATE to deciding.
func (m *MySQL) TakeCouponRequests(ctx context.Context, db int, staleMS int64, limit int) ([]model.CouponRequest, error) {
	if limit < 1 {
		return nil, nil
	}
	if err := m.ensureCoupons(ctx, db); err != nil {
		return nil, err
	}
	var out []model.CouponRequest
	// READ COMMITTED: the locking reads lock the rows they take, not the
	// ranges they walk, so a take neither blocks new requests (a gap lock
	// past the last accepted row) nor holds every deciding row it passed.
	err := func() error {
		tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		accepted, err := m.queryCouponReqs(ctx, tx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+
			" WHERE state = ? ORDER BY accepted_ms, app, serial_no LIMIT ? FOR UPDATE SKIP LOCKED", string(model.CouponAccepted), limit)
		if err != nil {
			return err
		}
		stale, err := m.queryCouponReqs(ctx, tx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+
			" WHERE state = ? AND taken_ms <= ? ORDER BY accepted_ms, app, serial_no LIMIT ? FOR UPDATE SKIP LOCKED", string(model.CouponDeciding), staleMS, limit)
		if err != nil {
			return err
		}
		all := append(accepted, stale...)
		slices.SortFunc(all, model.CompareCouponRequests)
		all = all[:min(len(all), limit)]
		if len(all) == 0 {
			return tx.Commit()
		}
		now := m.nowMS()
		args := []any{string(model.CouponDeciding), now}
		keys := make([]string, len(all))
		for i := range all {
			all[i].State, all[i].TakenMS = model.CouponDeciding, now
			args = append(args, all[i].App, all[i].Serial)
			keys[i] = "(?, ?)"
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+m.couponReqTable(db)+" SET state = ?, taken_ms = ? WHERE (app, serial_no) IN ("+
			strings.Join(keys, ", ")+")", args...); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return errors.Join(ErrCommitUnknown, err)
		}
		out = all
		return nil
	}()
	if err != nil {
		return nil, fmt.Errorf("storage: take coupon requests: %w", err)
	}
	return out, nil
}

// personKey names a person of one database.
type personKey struct {
	db  int
	act string
}

// lockPersons makes and locks the person rows of reqs' act_ids, in one
// order (database, then act_id) for every issuer.
func (m *MySQL) lockPersons(ctx context.Context, tx *sql.Tx, reqs []model.CouponRequest, now int64) ([]personKey, error) {
	seen := map[personKey]bool{}
	var ps []personKey
	for _, r := range reqs {
		k := personKey{r.Shard.DB(), r.ActID}
		if !seen[k] {
			seen[k] = true
			ps = append(ps, k)
		}
	}
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].db != ps[j].db {
			return ps[i].db < ps[j].db
		}
		return ps[i].act < ps[j].act
	})
	for i := 0; i < len(ps); {
		j := i
		var args []any
		for j < len(ps) && ps[j].db == ps[i].db {
			args = append(args, ps[j].act, now)
			j++
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+m.couponPersonTable(ps[i].db)+" (act_id, updated_ms) VALUES "+rowsOf(j-i, 2)+
			" ON DUPLICATE KEY UPDATE updated_ms = VALUES(updated_ms)", args...); err != nil {
			return nil, err
		}
		i = j
	}
	return ps, nil
}

// holdings reads the holdings of persons ps (locked by lockPersons).
func (m *MySQL) holdings(ctx context.Context, q rowsQueryer, ps []personKey) (map[string]*model.CouponHolding, error) {
	out := map[string]*model.CouponHolding{}
	for _, p := range ps {
		h := &model.CouponHolding{ByBatch: map[string]int{}, Groups: map[string]string{}}
		rows, err := q.QueryContext(ctx, "SELECT batch_id, group_id, COUNT(*) FROM "+m.couponTable(p.db)+
			" WHERE act_id = ? GROUP BY batch_id, group_id", p.act)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var batch, group string
			var n int
			if err := rows.Scan(&batch, &group, &n); err != nil {
				rows.Close()
				return nil, err
			}
			h.ByBatch[batch] += n
			if group != "" {
				h.Groups[group] = batch
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out[p.act] = h
	}
	return out, nil
}

// IssueCoupons implements Coupons.
func (m *MySQL) IssueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) ([]model.CouponDecision, int64, error) {
	invariant.That(granted >= 0, "granted >= 0")
	if len(reqs) == 0 {
		return nil, granted, nil
	}
	for _, r := range reqs {
		invariant.That(r.Batch == rule.Batch, "every request of an issue is of its batch")
		if err := m.ensureCoupons(ctx, r.Shard.DB()); err != nil {
			return nil, 0, err
		}
	}
	var out []model.CouponDecision
	var unused int64
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		now := m.nowMS()
		ps, err := m.lockPersons(ctx, tx, reqs, now)
		if err != nil {
			return err
		}
		// Requests already final (a re-driven request a slower issuer
		// decided first) keep their decision and take no unit.
		var asks []model.CouponAsk
		var open []model.CouponRequest
		for _, r := range reqs {
			cur, err := scanCouponReq(tx.QueryRowContext(ctx, "SELECT "+couponReqCols+" FROM "+m.couponReqTable(r.Shard.DB())+
				" WHERE app = ? AND serial_no = ? FOR UPDATE", r.App, r.Serial))
			if errors.Is(err, sql.ErrNoRows) {
				return model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", r.Serial, r.App)
			}
			if err != nil {
				return fmt.Errorf("coupon request %s: %w", r.Serial, err)
			}
			if cur.State.Final() {
				continue
			}
			asks = append(asks, model.CouponAsk{Serial: cur.App + "\x00" + cur.Serial, ActID: cur.ActID, Rule: rule})
			open = append(open, cur)
		}
		hs, err := m.holdings(ctx, tx, ps)
		if err != nil {
			return err
		}
		units := min(granted, int64(len(asks)))
		ds, left := model.AssignCoupons(units, asks, hs)
		unused = granted - units + left
		out = out[:0]
		for i, d := range ds {
			r := open[i]
			d.Serial, d.App = r.Serial, r.App
			out = append(out, d)
			if d.Issued {
				id := model.CouponID(r.App, r.Serial)
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+m.couponTable(r.Shard.DB())+
					" (coupon_id, act_id, act_shard, batch_id, group_id, app, serial_no, lease_id, issued_ms) VALUES "+rowsOf(1, 9),
					id, r.ActID, int(r.Shard), r.Batch, rule.Group, r.App, r.Serial, leaseID, now); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "UPDATE "+m.couponReqTable(r.Shard.DB())+
					" SET state = ?, coupon_id = ?, decided_ms = ? WHERE app = ? AND serial_no = ?",
					string(model.CouponIssued), id, now, r.App, r.Serial); err != nil {
					return err
				}
				continue
			}
			if _, err := tx.ExecContext(ctx, "UPDATE "+m.couponReqTable(r.Shard.DB())+
				" SET state = ?, reason = ?, decided_ms = ? WHERE app = ? AND serial_no = ?",
				string(model.CouponRefused), string(d.Reason), now, r.App, r.Serial); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil { // ErrCommitUnknown too: the requests are final or still deciding, and a re-drive settles them
		return nil, 0, fmt.Errorf("storage: issue coupons: %w", err)
	}
	return out, unused, nil
}

// RefuseCoupons implements Coupons.
func (m *MySQL) RefuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	invariant.That(reason != "", "a refusal has a reason")
	for _, r := range reqs {
		if err := m.ensureCoupons(ctx, r.Shard.DB()); err != nil {
			return err
		}
	}
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		now := m.nowMS()
		for _, r := range reqs {
			if _, err := tx.ExecContext(ctx, "UPDATE "+m.couponReqTable(r.Shard.DB())+
				" SET state = ?, reason = ?, decided_ms = ? WHERE app = ? AND serial_no = ? AND state IN (?, ?)",
				string(model.CouponRefused), string(reason), now, r.App, r.Serial,
				string(model.CouponAccepted), string(model.CouponDeciding)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: refuse coupons: %w", err)
	}
	return nil
}

// ReleaseCouponRequests implements Coupons.
func (m *MySQL) ReleaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error {
	for _, r := range reqs {
		if err := m.ensureCoupons(ctx, r.Shard.DB()); err != nil {
			return err
		}
	}
	err := m.inTx(ctx, func(tx *sql.Tx) error {
		for _, r := range reqs {
			if _, err := tx.ExecContext(ctx, "UPDATE "+m.couponReqTable(r.Shard.DB())+
				" SET state = ?, taken_ms = 0 WHERE app = ? AND serial_no = ? AND state = ?",
				string(model.CouponAccepted), r.App, r.Serial, string(model.CouponDeciding)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: release coupon requests: %w", err)
	}
	return nil
}

// HoldingOf implements Coupons.
func (m *MySQL) HoldingOf(ctx context.Context, s model.ShardID, actID string) (model.CouponHolding, error) {
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return model.CouponHolding{}, err
	}
	hs, err := m.holdings(ctx, m.db, []personKey{{s.DB(), actID}})
	if err != nil {
		return model.CouponHolding{}, fmt.Errorf("storage: holding: %w", err)
	}
	return *hs[actID], nil
}

// CouponsOf implements Coupons.
func (m *MySQL) CouponsOf(ctx context.Context, s model.ShardID, actID string, limit int) ([]model.Coupon, error) {
	if limit < 1 {
		return nil, nil
	}
	if err := m.ensureCoupons(ctx, s.DB()); err != nil {
		return nil, err
	}
	rows, err := m.db.QueryContext(ctx, "SELECT coupon_id, act_id, act_shard, batch_id, group_id, app, serial_no, lease_id, issued_ms FROM "+
		m.couponTable(s.DB())+" WHERE act_id = ? ORDER BY issued_ms DESC, coupon_id DESC LIMIT ?", actID, limit)
	if err != nil {
		return nil, fmt.Errorf("storage: coupons of %s: %w", actID, err)
	}
	defer rows.Close()
	var out []model.Coupon
	for rows.Next() {
		var c model.Coupon
		var shard int
		if err := rows.Scan(&c.ID, &c.ActID, &shard, &c.Batch, &c.Group, &c.App, &c.Serial, &c.LeaseID, &c.IssuedMS); err != nil {
			return nil, err
		}
		c.Shard = model.ShardID(shard)
		out = append(out, c)
	}
	return out, rows.Err()
}

// CouponLeaseSpent implements Coupons.
func (m *MySQL) CouponLeaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error) {
	var total int64
	for _, db := range dbs {
		var n int64
		err := m.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+m.couponTable(db)+" WHERE lease_id = ?", leaseID).Scan(&n)
		if isMySQLErr(err, errNoSuchTable) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("storage: coupon lease spent: %w", err)
		}
		total += n
	}
	return total, nil
}
