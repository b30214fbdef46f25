package storage

import (
	"context"
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
// coupons in t_coupon are brought to this version's shape at their first
// use (a coupon read; or the ledger, before its snapshot): the requests get
// group_id and lease_id, each issued request its coupon's, and t_coupon is
// kept as t_coupon_folded. Holdings, coupons, a lease's spent count and the
// ledger then read the old coupons; a new issue writes no t_coupon.
func TestOldCouponTablesUpgraded(t *testing.T) {
	m, _, _ := ContractMySQL(t, clock.Real{})
	ctx := context.Background()
	id7 := fillOldCoupons(t, m, 7, "old-7", "b-old", "g-old", "lease-7")
	fillOldCoupons(t, m, 8, "old-8", "b-old", "", "lease-8")

	// db 8 first meets the ledger (no coupon read before it).
	l, err := m.Ledger(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	c := l.CouponRows
	if c.ByBatch["b-old"] != 2 || c.LeaseSpent["lease-7"] != 1 || c.LeaseSpent["lease-8"] != 1 || c.IssuedNoCoupon != 0 ||
		c.CouponNoRequest != 0 || c.Requests[model.CouponIssued] != 2 || c.Requests[model.CouponAccepted] != 2 {
		t.Fatalf("ledger of the upgraded tables: %+v", c)
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
	sp := &CouponLeaseSpentQuery{DBs: []int{7, 8, 9}, LeaseID: "lease-8"}
	if err := m.Read(ctx, sp); err != nil || sp.Spent != 1 {
		t.Fatalf("lease-8 spent %d (%v), want 1", sp.Spent, err)
	}
	for _, db := range []int{7, 8} {
		schema := m.tableNamesOf().db[db]
		var old, folded int
		if err := m.db.QueryRow("SELECT (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 't_coupon'), "+
			"(SELECT COUNT(*) FROM "+schema+".t_coupon_folded)", schema).Scan(&old, &folded); err != nil || old != 0 || folded != 1 {
			t.Fatalf("db %d: t_coupon tables %d, t_coupon_folded rows %d (%v); want 0 and 1", db, old, folded, err)
		}
	}

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
	if l, err = m.Ledger(ctx, "c"); err != nil || l.CouponRows.ByBatch["b-new"] != 1 || l.CouponRows.LeaseSpent["lease-new"] != 1 || l.CouponRows.IssuedNoCoupon != 0 {
		t.Fatalf("ledger after the new issue: %+v (%v)", l.CouponRows, err)
	}
}
