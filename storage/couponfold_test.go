package storage

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"redcell/internal/clock"
	"redcell/model"
)

// oldCouponDDL is the coupon tables' shape before an issued request held its
// coupon: coupons in t_coupon, the request row without group or lease.
func oldCouponDDL(schema string) []string {
	a := "CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + schema,
		`CREATE TABLE ` + schema + `.t_coupon_req (app VARCHAR(64) ` + a + ` DEFAULT '', serial_no VARCHAR(64) ` + a + `,
 act_id VARCHAR(64) ` + a + `, act_shard SMALLINT NOT NULL, batch_id VARCHAR(64) ` + a + `, green TINYINT NOT NULL DEFAULT 0,
 device_id VARCHAR(64) ` + a + ` DEFAULT '', client_ip VARCHAR(45) ` + a + ` DEFAULT '', state VARCHAR(9) ` + a + `,
 reason VARCHAR(20) ` + a + ` DEFAULT '', coupon_id CHAR(32) ` + a + ` DEFAULT '', accepted_ms BIGINT NOT NULL,
 taken_ms BIGINT NOT NULL DEFAULT 0, decided_ms BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (app, serial_no),
 KEY k_state (state, accepted_ms), KEY k_taken (state, taken_ms), KEY k_act (act_id, accepted_ms)) ENGINE=InnoDB`,
		`CREATE TABLE ` + schema + `.t_coupon (coupon_id CHAR(32) ` + a + ` PRIMARY KEY, act_id VARCHAR(64) ` + a + `,
 act_shard SMALLINT NOT NULL, batch_id VARCHAR(64) ` + a + `, group_id VARCHAR(64) ` + a + ` DEFAULT '',
 app VARCHAR(64) ` + a + ` DEFAULT '', serial_no VARCHAR(64) ` + a + `, lease_id VARCHAR(40) ` + a + ` DEFAULT '',
 issued_ms BIGINT NOT NULL, KEY k_act (act_id, issued_ms), KEY k_lease (lease_id)) ENGINE=InnoDB`,
		`CREATE TABLE ` + schema + `.t_coupon_person (act_id VARCHAR(64) ` + a + ` PRIMARY KEY, updated_ms BIGINT NOT NULL) ENGINE=InnoDB`,
	}
}

// fillOldCoupons writes, in old-shaped tables of db, one issued request of
// act with its coupon (batch, group, lease) and one request of act still
// accepted, and answers the coupon's ID.
func fillOldCoupons(t *testing.T, m *MySQL, db int, act, batch, group, lease string) string {
	t.Helper()
	schema := m.tableNamesOf().db[db]
	id := model.CouponID("app", "s-"+act, act)
	shard := db * 10
	for _, q := range append(oldCouponDDL(schema),
		fmt.Sprintf("INSERT INTO %s.t_coupon_req (app, serial_no, act_id, act_shard, batch_id, state, coupon_id, accepted_ms, decided_ms) VALUES "+
			"('app', 's-%s', '%s', %d, '%s', 'issued', '%s', 1000, 2000), ('app', 't-%s', '%s', %d, '%s', 'accepted', '', 3000, 0)",
			schema, act, act, shard, batch, id, act, act, shard, batch),
		fmt.Sprintf("INSERT INTO %s.t_coupon VALUES ('%s', '%s', %d, '%s', '%s', 'app', 's-%s', '%s', 2000)",
			schema, id, act, shard, batch, group, act, lease),
	) {
		if _, err := m.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return id
}

// TestOldCouponTablesUpgraded: coupon tables made by a version that kept
// coupons in t_coupon are read by the ledger as that version kept them
// (the ledger writes nothing), and brought to this version's shape at their
// first use in a cell (a coupon read, a lease's spent count): the requests
// get group_id and lease_id, each issued request its coupon's, and t_coupon
// is kept as t_coupon_folded, whose coupons the ledger still checks. A fold
// stopped half way (t_coupon renamed t_coupon_folding, not yet joined) is
// finished by the next. Holdings, coupons, a lease's spent count and the
// ledger then read the old coupons; a new issue writes no t_coupon.
func TestOldCouponTablesUpgraded(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	id7 := fillOldCoupons(t, m, 7, "old-7", "b-old", "g-old", "lease-7")
	fillOldCoupons(t, m, 8, "old-8", "b-old", "", "lease-8")
	fillOldCoupons(t, m, 9, "old-9", "b-old", "", "lease-9")
	s8, s9 := m.tableNamesOf().db[8], m.tableNamesOf().db[9]
	for _, q := range []string{
		// db 8: an issued request whose coupon is missing, and a coupon
		// whose request is not issued: what the audit must go on seeing.
		"INSERT INTO " + s8 + ".t_coupon_req (app, serial_no, act_id, act_shard, batch_id, state, coupon_id, accepted_ms, decided_ms) VALUES " +
			"('app', 'lost', 'old-8', 80, 'b-old', 'issued', 'ffffffffffffffffffffffffffffffff', 1000, 2000)",
		"INSERT INTO " + s8 + ".t_coupon VALUES ('eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee', 'old-8', 80, 'b-old', '', 'app', 't-old-8', 'lease-8', 2000)",
		// db 9: a fold that stopped after its rename.
		"ALTER TABLE " + s9 + ".t_coupon_req ADD COLUMN group_id " + couponGroupCol + ", ADD COLUMN lease_id " + couponLeaseCol + ", ADD KEY k_lease (lease_id)",
		"RENAME TABLE " + s9 + ".t_coupon TO " + s9 + ".t_coupon_folding",
	} {
		if _, err := m.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tables := func(schema string) (old, folding, folded int) {
		t.Helper()
		if err := m.db.QueryRow("SELECT SUM(TABLE_NAME = 't_coupon'), SUM(TABLE_NAME = 't_coupon_folding'), SUM(TABLE_NAME = 't_coupon_folded') "+
			"FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", schema).Scan(&old, &folding, &folded); err != nil {
			t.Fatal(err)
		}
		return old, folding, folded
	}
	// oldB, lease8: b-old's and lease-8's coupons as the ledger counts
	// them: 4 and 2 before the fold (one of lease-8's the coupon without its
	// request); 3 and 1 after it (that coupon is checked apart, and the
	// issued request without its coupon holds none).
	check := func(when string, oldB, lease8 int64) {
		t.Helper()
		l, err := m.Ledger(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		c := l.CouponRows
		if c.ByBatch["b-old"] != oldB || c.LeaseSpent["lease-7"] != 1 || c.LeaseSpent["lease-8"] != lease8 || c.LeaseSpent[""] != 0 || c.LeaseSpent["lease-9"] != 1 ||
			c.IssuedNoCoupon != 1 || c.CouponNoRequest != 1 || c.Requests[model.CouponIssued] != 4 || c.Requests[model.CouponAccepted] != 3 {
			t.Fatalf("%s: the ledger's coupons %+v; want %d coupons of b-old, %d of lease-8 and none without a lease, "+
				"one issued request without its coupon, one coupon without its request, 4 issued and 3 accepted requests", when, c, oldB, lease8)
		}
	}

	check("before any fold", 4, 2)
	if old, _, _ := tables(m.tableNamesOf().db[7]); old != 1 {
		t.Fatalf("the ledger folded db 7's tables (t_coupon %d): an audit writes nothing", old)
	}
	h := &HoldingQuery{Shard: 70, ActID: "old-7"}
	if err := m.Read(ctx, h); err != nil {
		t.Fatal(err)
	}
	if h.Holding.ByBatch["b-old"] != 1 || h.Holding.Groups["g-old"] != "b-old" {
		t.Fatalf("holding of old-7: %+v, want one coupon of b-old, held in group g-old", h.Holding)
	}
	cs := &CouponsQuery{Shard: 70, ActID: "old-7", Limit: 10}
	if err := m.Read(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Coupons) != 1 || cs.Coupons[0].ID != id7 || cs.Coupons[0].LeaseID != "lease-7" || cs.Coupons[0].Group != "g-old" ||
		cs.Coupons[0].IssuedMS != 2000 || cs.Coupons[0].Serial != "s-old-7" {
		t.Fatalf("coupons of old-7: %+v, want %s of lease-7, group g-old, issued at 2000", cs.Coupons, id7)
	}
	sp := &CouponLeaseSpentQuery{DBs: []int{7, 8, 9, 10}, LeaseID: "lease-9"}
	if err := m.Read(ctx, sp); err != nil || sp.Spent != 1 {
		t.Fatalf("lease-9 spent %d (%v), want 1", sp.Spent, err)
	}
	for _, db := range []int{7, 8, 9} {
		schema := m.tableNamesOf().db[db]
		var rows int
		if old, folding, folded := tables(schema); old != 0 || folding != 0 || folded != 1 {
			t.Fatalf("db %d after the fold: t_coupon %d, t_coupon_folding %d, t_coupon_folded %d; want 0, 0, 1", db, old, folding, folded)
		}
		if err := m.db.QueryRow("SELECT COUNT(*) FROM " + schema + ".t_coupon_folded").Scan(&rows); err != nil || rows != map[int]int{7: 1, 8: 2, 9: 1}[db] {
			t.Fatalf("db %d: t_coupon_folded holds %d rows (%v)", db, rows, err)
		}
	}
	check("after the folds", 3, 1)

	// A new issue on the upgraded tables: its coupon is its request row.
	r, _, err := AcceptCoupon(ctx, m, model.CouponRequest{App: "app", Serial: "new-7", ActID: "old-7", Shard: 70, Batch: "b-new", AcceptedMS: 4000})
	if err != nil {
		t.Fatal(err)
	}
	ds, unused, err := IssueCoupons(ctx, m, model.CouponRule{Batch: "b-new", Limit: 1}, "lease-new", 1, []model.CouponRequest{r})
	if err != nil || len(ds) != 1 || !ds[0].Issued || unused != 0 {
		t.Fatalf("issue on upgraded tables: %+v, unused %d, %v", ds, unused, err)
	}
	if err := m.Read(ctx, h); err != nil || h.Holding.ByBatch["b-new"] != 1 || h.Holding.ByBatch["b-old"] != 1 {
		t.Fatalf("holding after the new issue: %+v (%v)", h.Holding, err)
	}
	l, err := m.Ledger(ctx, "c")
	if err != nil || l.CouponRows.ByBatch["b-new"] != 1 || l.CouponRows.LeaseSpent["lease-new"] != 1 || l.CouponRows.IssuedNoCoupon != 1 {
		t.Fatalf("ledger after the new issue: %+v (%v)", l.CouponRows, err)
	}
	// An earlier version started again on db 7 (which the docs warn
	// against) makes t_coupon again and issues a coupon there: the ledger
	// still counts every coupon, the folded and in-row ones and that one.
	s7 := m.tableNamesOf().db[7]
	id := model.CouponID("app", "t-old-7", "old-7")
	for _, q := range []string{oldCouponDDL(s7)[2],
		"INSERT INTO " + s7 + ".t_coupon VALUES ('" + id + "', 'old-7', 70, 'b-old', '', 'app', 't-old-7', 'lease-again', 5000)",
		"UPDATE " + s7 + ".t_coupon_req SET state = 'issued', coupon_id = '" + id + "', decided_ms = 5000 WHERE serial_no = 't-old-7'",
	} {
		if _, err := m.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if l, err = m.Ledger(ctx, "c"); err != nil || l.CouponRows.ByBatch["b-old"] != 4 || l.CouponRows.ByBatch["b-new"] != 1 ||
		l.CouponRows.LeaseSpent["lease-again"] != 1 || l.CouponRows.LeaseSpent["lease-7"] != 1 || l.CouponRows.IssuedNoCoupon != 1 || l.CouponRows.CouponNoRequest != 1 {
		t.Fatalf("ledger with t_coupon made again after the fold: %+v (%v); want 4 coupons of b-old (one of lease-again), 1 of b-new, "+
			"one issued request without its coupon, one coupon without its request", l.CouponRows, err)
	}
	if _, _, err := IssueCoupons(ctx, m, model.CouponRule{Batch: "b-new", Limit: 1}, "", 1, []model.CouponRequest{r}); !errors.Is(err, model.ErrInvalidArgument) {
		t.Fatalf("an issue of a unit without its lease: %v, want INVALID_ARGUMENT", err)
	}
}
