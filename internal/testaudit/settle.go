package testaudit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// absent reports whether err says a row is not there: no row, no such table
// (1146) or no such database (1049).
func absent(err error) bool {
	var me *mysql.MySQLError
	return errors.Is(err, sql.ErrNoRows) || errors.As(err, &me) && (me.Number == 1146 || me.Number == 1049)
}

// Settle marks delivered the pending outbox rows, of every namespace and
// space on the servers dsns, whose claims are credited already (in the same
// namespace and space, on any of the servers): rows a test cell left pending
// when it stopped between booking a credit and marking its row. Cells of
// another layout (another shard map over the same databases) would deliver
// such a row to another cell, on the other server, and credit it twice. Rows
// credited nowhere stay pending, for the next relay to deliver once. It
// writes nothing else: a credit booked twice stays for the audit to find. It
// answers how many rows it marked.
//
// Safe while cells run: a row it marks is one whose credit exists, which is
// what a relay marks it for.
func Settle(ctx context.Context, dsns []string) (int, error) {
	dbs := make([]*sql.DB, len(dsns))
	for i, dsn := range dsns {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return 0, err
		}
		defer db.Close()
		dbs[i] = db
	}
	settled := 0
	for _, db := range dbs {
		schemas, err := outboxSchemas(ctx, db)
		if err != nil {
			return settled, err
		}
		for _, schema := range schemas {
			n, err := settleSchema(ctx, db, dbs, schema)
			settled += n
			if err != nil {
				return settled, err
			}
		}
	}
	return settled, nil
}

// outboxSchemas lists the databases of the server that hold an outbox.
func outboxSchemas(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME = 't_outbox'")
	if err != nil {
		return nil, fmt.Errorf("testaudit: list outboxes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		if schemaName.MatchString(s) {
			out = append(out, s)
		}
	}
	return out, rows.Err()
}

// settleSchema settles the pending rows of one outbox (schema: [prefix][shadow_]db_NN).
func settleSchema(ctx context.Context, db *sql.DB, all []*sql.DB, schema string) (int, error) {
	ns := schema[:len(schema)-len("db_00")] // the namespace and space: the claimant's database is ns + "db_NN"
	rows, err := db.QueryContext(ctx, "SELECT claim_id, act_id, act_shard FROM "+schema+".t_outbox WHERE state = 0")
	if err != nil {
		return 0, fmt.Errorf("testaudit: pending rows of %s: %w", schema, err)
	}
	type row struct {
		claim, act string
		shard      int
	}
	var list []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.claim, &r.act, &r.shard); err != nil {
			rows.Close()
			return 0, err
		}
		list = append(list, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	settled := 0
	for _, r := range list {
		credited := false
		for _, o := range all {
			var one int
			err := o.QueryRowContext(ctx, fmt.Sprintf("SELECT 1 FROM %sdb_%02d.t_flow_%d WHERE act_id = ? AND order_no = ?", ns, r.shard/10, r.shard%10),
				r.act, "claim:"+r.claim).Scan(&one)
			if err == nil {
				credited = true
				break
			}
			if !absent(err) {
				return settled, fmt.Errorf("testaudit: credit of %s: %w", r.claim, err)
			}
		}
		if !credited {
			continue // credited nowhere (or no such table): a relay delivers it
		}
		if _, err := db.ExecContext(ctx, "UPDATE "+schema+".t_outbox SET state = 1, delivered_ms = ? WHERE claim_id = ? AND state = 0",
			time.Now().UnixMilli(), r.claim); err != nil {
			return settled, fmt.Errorf("testaudit: mark %s delivered in %s: %w", r.claim, schema, err)
		}
		settled++
	}
	return settled, nil
}
