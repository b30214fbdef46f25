package storage

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"redcell/internal/invariant"
	"redcell/model"
)

// reqKey names a stored request: its database, app and serial (the
// primary key of its database's t_coupon_req).
type reqKey struct {
	db          int
	app, serial string
}

func reqKeyOf(r model.CouponRequest) reqKey { return reqKey{r.Shard.DB(), r.App, r.Serial} }

// personKey names a person of one database.
type personKey struct {
	db  int
	act string
}

// personsOf lists the persons of reqs once each, in the one order every
// issuer locks them in: database, then act_id.
func personsOf(reqs []model.CouponRequest) []personKey {
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
	return ps
}

// lockPersons makes and locks the person rows ps (personsOf), one
// statement list: an upsert per database.
func (m *MySQL) lockPersons(ctx context.Context, tx *sql.Tx, ps []personKey, now int64) error {
	var q []string
	var args []any
	byDB(ps, func(p personKey) int { return p.db }, func(db int, run []personKey) {
		q = append(q, "INSERT INTO "+m.couponPersonTable(db)+" (act_id, updated_ms) VALUES "+rowsOf(len(run), 2)+
			" ON DUPLICATE KEY UPDATE updated_ms = VALUES(updated_ms)")
		for _, p := range run {
			args = append(args, p.act, now)
		}
	})
	_, err := tx.ExecContext(ctx, strings.Join(q, ";"), args...)
	return err
}

// holdings reads the holdings of persons ps (locked by lockPersons), one
// statement over their databases.
func (m *MySQL) holdings(ctx context.Context, q rowsQueryer, ps []personKey) (map[string]*model.CouponHolding, error) {
	out := map[string]*model.CouponHolding{}
	var parts []string
	var args []any
	byDB(ps, func(p personKey) int { return p.db }, func(db int, run []personKey) {
		parts = append(parts, "SELECT act_id, batch_id, group_id, COUNT(*) FROM "+m.couponReqTable(db)+" WHERE act_id IN ("+
			placeholders(len(run))+") AND state = ? GROUP BY act_id, batch_id, group_id")
		for _, p := range run {
			args = append(args, p.act)
		}
		args = append(args, string(model.CouponIssued))
	})
	for _, p := range ps {
		out[p.act] = &model.CouponHolding{ByBatch: map[string]int{}, Groups: map[string]string{}}
	}
	rows, err := q.QueryContext(ctx, strings.Join(parts, " UNION ALL "), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var act, batch, group string
		var n int
		if err := rows.Scan(&act, &batch, &group, &n); err != nil {
			return nil, err
		}
		h := out[act]
		if h == nil {
			continue
		}
		h.ByBatch[batch] += n
		if group != "" {
			h.Groups[group] = batch
		}
	}
	return out, rows.Err()
}

// lockCouponReqs reads reqs as stored, locked: one statement, a UNION ALL
// of a locking read per database (each part takes its locks in turn, in
// database order, then app and serial within one). The map is by app and
// serial.
func (m *MySQL) lockCouponReqs(ctx context.Context, tx *sql.Tx, reqs []model.CouponRequest) (map[reqKey]model.CouponRequest, error) {
	sorted := slices.Clone(reqs)
	slices.SortFunc(sorted, func(a, b model.CouponRequest) int {
		return cmp.Or(cmp.Compare(a.Shard.DB(), b.Shard.DB()), cmp.Compare(a.App, b.App), cmp.Compare(a.Serial, b.Serial))
	})
	var u union
	byDB(sorted, func(r model.CouponRequest) int { return r.Shard.DB() }, func(db int, run []model.CouponRequest) {
		args := make([]any, 0, 2*len(run))
		for _, r := range run {
			args = append(args, r.App, r.Serial)
		}
		u.add("SELECT "+couponReqCols+" FROM "+m.couponReqTable(db)+" WHERE (app, serial_no) IN ("+
			strings.TrimSuffix(strings.Repeat("(?, ?),", len(run)), ",")+") ORDER BY app, serial_no FOR UPDATE", args...)
	})
	q, args := u.sql()
	rs, err := m.queryCouponReqs(ctx, tx, q, args...)
	if err != nil {
		return nil, err
	}
	out := make(map[reqKey]model.CouponRequest, len(rs))
	for _, cur := range rs {
		out[reqKeyOf(cur)] = cur
	}
	return out, nil
}

// issueCoupons runs CouponIssue, in four round trips whatever the
// number of requests: the persons locked, the requests read locked, the
// holdings read, and the writes (every decided request stored with its
// decision, an issued one as its coupon: one upsert per database) as one
// statement list.
func (m *MySQL) issueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) ([]model.CouponDecision, int64, error) {
	invariant.That(granted >= 0, "granted >= 0")
	if granted > 0 && leaseID == "" {
		return nil, 0, model.Invalidf("a coupon issue with units needs the lease they came from")
	}
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
		ps := personsOf(reqs)
		if err := m.lockPersons(ctx, tx, ps, now); err != nil {
			return err
		}
		curs, err := m.lockCouponReqs(ctx, tx, reqs)
		if err != nil {
			return err
		}
		// Requests already final (a re-driven request a slower issuer
		// decided first) keep their decision and take no unit.
		asks, open, err := couponAsksOf(reqs, curs, rule)
		if err != nil {
			return err
		}
		hs, err := m.holdings(ctx, tx, ps)
		if err != nil {
			return err
		}
		units := min(granted, int64(len(asks)))
		ds, left := model.AssignCoupons(units, asks, hs)
		unused = granted - units + left
		out = out[:0]
		var all []couponDecided
		for i, d := range ds {
			r := open[i]
			d.Serial, d.App = r.Serial, r.App
			out = append(out, d)
			all = append(all, couponDecided{r, d})
		}
		if len(all) == 0 {
			return nil
		}
		return m.writeCouponDecisions(ctx, tx, rule, leaseID, all, now)
	})
	if err != nil { // ErrCommitUnknown too: the requests are final or still deciding, and a re-drive settles them
		return nil, 0, fmt.Errorf("storage: issue coupons: %w", err)
	}
	return out, unused, nil
}

// couponDecided is a request of an issue and its decision.
type couponDecided struct {
	r model.CouponRequest
	d model.CouponDecision
}

// couponAsksOf turns the issue's requests (reqs, as locked: curs) into the
// asks model.AssignCoupons decides, one per request not final yet (a copy
// of one already asked for is decided with it), and returns them with
// their requests, in order. Errors: ErrNotFound for a request not stored.
func couponAsksOf(reqs []model.CouponRequest, curs map[reqKey]model.CouponRequest, rule model.CouponRule) (asks []model.CouponAsk, open []model.CouponRequest, err error) {
	seen := map[reqKey]bool{}
	for _, r := range reqs {
		k := reqKeyOf(r)
		cur, ok := curs[k]
		if !ok {
			return nil, nil, model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", r.Serial, r.App)
		}
		if cur.State.Final() || seen[k] { // a copy of one already asked for is decided with it
			continue
		}
		seen[k] = true
		asks = append(asks, model.CouponAsk{Serial: cur.App + "\x00" + cur.Serial, ActID: cur.ActID, Rule: rule})
		open = append(open, cur)
	}
	return asks, open, nil
}

// writeCouponDecisions stores the issue's decisions (all) in one statement
// list, a multi-row upsert per database in ascending order; the rows are
// there and locked. An issued request gets its coupon's ID, the rule's
// group and leaseID; decided_ms is now. Errors: the database's.
func (m *MySQL) writeCouponDecisions(ctx context.Context, tx *sql.Tx, rule model.CouponRule, leaseID string, all []couponDecided, now int64) error {
	slices.SortStableFunc(all, func(a, b couponDecided) int { return cmp.Compare(a.r.Shard.DB(), b.r.Shard.DB()) })
	var q []string
	var args []any
	byDB(all, func(x couponDecided) int { return x.r.Shard.DB() }, func(db int, run []couponDecided) {
		// Every row is there and locked: the upsert updates each, an
		// issued one becoming its coupon (the coupon's ID, group and
		// lease; decided_ms its issue time).
		q = append(q, "INSERT INTO "+m.couponReqTable(db)+
			" (app, serial_no, act_id, act_shard, batch_id, state, reason, coupon_id, group_id, lease_id, accepted_ms, decided_ms) VALUES "+rowsOf(len(run), 12)+
			" ON DUPLICATE KEY UPDATE state = VALUES(state), reason = VALUES(reason), coupon_id = VALUES(coupon_id),"+
			" group_id = VALUES(group_id), lease_id = VALUES(lease_id), decided_ms = VALUES(decided_ms)")
		for _, x := range run {
			r := x.r
			state, id, group, lease := model.CouponRefused, "", "", ""
			if x.d.Issued {
				state, id, group, lease = model.CouponIssued, model.CouponID(r.App, r.Serial, r.ActID), rule.Group, leaseID
			}
			args = append(args, r.App, r.Serial, r.ActID, int(r.Shard), r.Batch, string(state), string(x.d.Reason), id, group, lease, r.AcceptedMS, now)
		}
	})
	_, err := tx.ExecContext(ctx, strings.Join(q, ";"), args...)
	return err
}

// refuseCoupons runs CouponRefusal: one UPDATE per database and app, all of
// them one statement list in one transaction.
func (m *MySQL) refuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	invariant.That(reason != "", "a refusal has a reason")
	err := m.updateRequests(ctx, reqs, "state = ?, reason = ?, decided_ms = ?", []any{string(model.CouponRefused), string(reason), m.nowMS()},
		model.CouponAccepted, model.CouponDeciding)
	if err != nil {
		return fmt.Errorf("storage: refuse coupons: %w", err)
	}
	return nil
}

// releaseCouponRequests runs CouponRelease, as refuseCoupons in statements.
func (m *MySQL) releaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error {
	if err := m.updateRequests(ctx, reqs, "state = ?, taken_ms = 0", []any{string(model.CouponAccepted)}, model.CouponDeciding); err != nil {
		return fmt.Errorf("storage: release coupon requests: %w", err)
	}
	return nil
}

// updateRequests sets set (its values setArgs) on the requests reqs names
// whose state is one of from: per database and app one UPDATE of their
// serial numbers (the primary key's), in (database, app, serial) order, the
// order every writer of the rows locks them in; all in one transaction, one
// statement list, one round trip.
func (m *MySQL) updateRequests(ctx context.Context, reqs []model.CouponRequest, set string, setArgs []any, from ...model.CouponState) error {
	type dbApp struct {
		db  int
		app string
	}
	serials := map[dbApp][]string{}
	for _, r := range reqs {
		k := dbApp{r.Shard.DB(), r.App}
		if _, ok := serials[k]; !ok {
			if err := m.ensureCoupons(ctx, k.db); err != nil {
				return err
			}
		}
		serials[k] = append(serials[k], r.Serial)
	}
	keys := slices.SortedFunc(maps.Keys(serials), func(a, b dbApp) int { return cmp.Or(cmp.Compare(a.db, b.db), strings.Compare(a.app, b.app)) })
	var b sqlBatch
	for _, k := range keys {
		ss := slices.Compact(slices.Sorted(slices.Values(serials[k])))
		args := append(slices.Clone(setArgs), k.app)
		args = append(args, anys(ss)...)
		for _, st := range from {
			args = append(args, string(st))
		}
		b.add("UPDATE "+m.couponReqTable(k.db)+" SET "+set+" WHERE app = ? AND serial_no IN ("+placeholders(len(ss))+") AND state IN ("+
			placeholders(len(from))+")", args...)
	}
	q, args := b.sql()
	if q == "" {
		return nil
	}
	return m.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	})
}
