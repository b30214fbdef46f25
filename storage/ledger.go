package storage

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"redcell/model"
)

// tableRef is a table found on the server, with its indexes parsed back to ints.
type tableRef struct {
	kind  string // account, flow, packet, claim, outbox
	shard model.ShardID
	day   int
}

var tableName = regexp.MustCompile(`^t_(account|flow|packet|claim)_([0-9])(?:_([0-9]{2}))?$`)

// tables lists redcell's tables on the server.
func tables(ctx context.Context, tx *sql.Tx) ([]tableRef, error) {
	rows, err := tx.QueryContext(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA LIKE 'db\\_%'")
	if err != nil {
		return nil, fmt.Errorf("storage: list tables: %w", err)
	}
	defer rows.Close()
	var out []tableRef
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			return nil, err
		}
		db, err := strconv.Atoi(strings.TrimPrefix(schema, "db_"))
		if err != nil || db < 0 || db >= model.ShardCount/10 || len(schema) != 5 {
			continue
		}
		if name == "t_outbox" {
			out = append(out, tableRef{kind: "outbox", shard: model.ShardID(db * 10)})
			continue
		}
		m := tableName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		t, _ := strconv.Atoi(m[2])
		ref := tableRef{kind: m[1], shard: model.ShardID(db*10 + t)}
		if m[3] != "" {
			ref.day, _ = strconv.Atoi(m[3])
			if ref.day < 1 || ref.day > 31 {
				continue
			}
		}
		if (ref.kind == "packet" || ref.kind == "claim") != (m[3] != "") {
			continue
		}
		out = append(out, ref)
	}
	return out, rows.Err()
}

// Ledger reads every money row of this store in one consistent snapshot and
// checks the row-level invariants: each balance equals the sum of its flows, each
// packet's claims + refund + remainder equal its amount and its claim count plus
// remaining count equal its count, an open packet holds at least a cent per share.
func (m *MySQL) Ledger(ctx context.Context, cell string) (model.Ledger, error) {
	l := model.Ledger{Cell: cell, Claims: map[string]model.Claim{}, Credits: map[string]model.Cents{}}
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return l, fmt.Errorf("storage: ledger: %w", err)
	}
	defer tx.Rollback()
	ts, err := tables(ctx, tx)
	if err != nil {
		return l, err
	}
	for _, t := range ts {
		var err error
		switch t.kind {
		case "account":
			err = m.ledgerAccounts(ctx, tx, t.shard, &l)
		case "flow":
			err = m.ledgerFlows(ctx, tx, t.shard, &l)
		case "packet":
			err = m.ledgerPackets(ctx, tx, t.shard, t.day, &l)
		case "claim":
			err = m.ledgerClaims(ctx, tx, t.shard, t.day, &l)
		}
		if err != nil {
			return l, fmt.Errorf("storage: ledger of %s shard %d day %d: %w", t.kind, t.shard, t.day, err)
		}
	}
	return l, nil
}

func (m *MySQL) ledgerAccounts(ctx context.Context, tx *sql.Tx, s model.ShardID, l *model.Ledger) error {
	var sum sql.NullInt64
	if err := tx.QueryRowContext(ctx, "SELECT SUM(balance) FROM "+accountTable(s)).Scan(&sum); err != nil {
		return err
	}
	l.Balances += model.Cents(sum.Int64)
	rows, err := tx.QueryContext(ctx, "SELECT a.act_id, a.balance, COALESCE(f.total, 0) FROM "+accountTable(s)+" a LEFT JOIN "+
		"(SELECT act_id, SUM(amount) AS total FROM "+flowTable(s)+" GROUP BY act_id) f ON f.act_id = a.act_id "+
		"WHERE a.balance <> COALESCE(f.total, 0) OR a.balance < 0 LIMIT 100")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var act string
		var bal, flows int64
		if err := rows.Scan(&act, &bal, &flows); err != nil {
			return err
		}
		l.Problems = append(l.Problems, fmt.Sprintf("account %s (shard %d): balance %d, flows sum to %d", act, s, bal, flows))
	}
	return rows.Err()
}

func (m *MySQL) ledgerFlows(ctx context.Context, tx *sql.Tx, s model.ShardID, l *model.Ledger) error {
	rows, err := tx.QueryContext(ctx, "SELECT kind, SUM(amount) FROM "+flowTable(s)+" WHERE kind <> 'credit' GROUP BY kind")
	if err != nil {
		return err
	}
	for rows.Next() {
		var kind string
		var sum int64
		if err := rows.Scan(&kind, &sum); err != nil {
			rows.Close()
			return err
		}
		switch kind {
		case "deposit":
			l.Deposits += model.Cents(sum)
		case "send":
			l.Sends += model.Cents(-sum)
		case "refund":
			l.RefundFlows += model.Cents(sum)
		default:
			l.Problems = append(l.Problems, fmt.Sprintf("shard %d: unknown flow kind %q", s, kind))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.QueryContext(ctx, "SELECT order_no, amount FROM "+flowTable(s)+" WHERE kind = 'credit'")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var order string
		var amount int64
		if err := rows.Scan(&order, &amount); err != nil {
			return err
		}
		l.Credits[strings.TrimPrefix(order, "claim:")] += model.Cents(amount)
	}
	return rows.Err()
}

func (m *MySQL) ledgerPackets(ctx context.Context, tx *sql.Tx, s model.ShardID, day int, l *model.Ledger) error {
	var n, total, open, refunds sql.NullInt64
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*), SUM(amount), SUM(remaining_amount), SUM(refund_amount) FROM "+
		packetTable(s, day)).Scan(&n, &total, &open, &refunds); err != nil {
		return err
	}
	l.Packets += n.Int64
	l.PacketTotals += model.Cents(total.Int64)
	l.OpenRemaining += model.Cents(open.Int64)
	l.RefundAmounts += model.Cents(refunds.Int64)
	rows, err := tx.QueryContext(ctx, "SELECT p.packet_id, p.amount, p.count, p.remaining_amount, p.remaining_count, p.refund_amount, p.status, "+
		"COALESCE(c.paid, 0), COALESCE(c.n, 0) FROM "+packetTable(s, day)+" p LEFT JOIN "+
		"(SELECT packet_id, SUM(amount) AS paid, COUNT(*) AS n FROM "+claimTable(s, day)+" GROUP BY packet_id) c ON c.packet_id = p.packet_id "+
		"WHERE COALESCE(c.paid, 0) + p.refund_amount + p.remaining_amount <> p.amount OR COALESCE(c.n, 0) + p.remaining_count <> p.count "+
		"OR (p.status = 0 AND p.remaining_amount < p.remaining_count) OR (p.status = 0 AND p.remaining_count = 0) "+
		"OR (p.status = 1 AND (p.remaining_count <> 0 OR p.remaining_amount <> 0)) "+
		"OR (p.status = 2 AND p.remaining_amount <> 0) LIMIT 100")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var amount, count, remA, remC, refund, status, paid, claims int64
		if err := rows.Scan(&id, &amount, &count, &remA, &remC, &refund, &status, &paid, &claims); err != nil {
			return err
		}
		l.Problems = append(l.Problems, fmt.Sprintf("packet %s: amount %d count %d, claims %d in %d, refund %d, remaining %d in %d, status %d",
			id, amount, count, paid, claims, refund, remA, remC, status))
	}
	return rows.Err()
}

func (m *MySQL) ledgerClaims(ctx context.Context, tx *sql.Tx, s model.ShardID, day int, l *model.Ledger) error {
	rows, err := tx.QueryContext(ctx, "SELECT packet_id, seq, act_id, amount FROM "+claimTable(s, day))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c model.Claim
		if err := rows.Scan(&c.PacketID, &c.Seq, &c.ActID, &c.Amount); err != nil {
			return err
		}
		c.ID = model.ClaimID(c.PacketID, c.Seq)
		l.Claims[c.ID] = c
	}
	return rows.Err()
}
