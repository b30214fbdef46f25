package storage

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"redcell/model"
)

// exporter runs the steps of one database's export.
type exporter struct {
	m    *MySQL
	p    *ExportPass
	db   int
	dir  string
	date string // claims and credits dated before this (YYYYMMDD) leave; "" none
}

// loop runs step until it reports it is done.
func (x *exporter) loop(ctx context.Context, step func(context.Context) (more bool, err error)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		leave, ok := enterDB(x.p.Enter, x.db)
		if !ok {
			return nil
		}
		more, err := step(ctx)
		leave()
		if err != nil || !more {
			return err
		}
	}
}

// exportRow is one row read for export: its columns as text (NULL: nil),
// and which are numbers.
type exportRow struct {
	cols []string
	vals []*string
	num  []bool
}

func (r exportRow) str(col string) string {
	if i := slices.Index(r.cols, col); i >= 0 && r.vals[i] != nil {
		return *r.vals[i]
	}
	return ""
}

func (r exportRow) int(col string) int64 {
	n, _ := strconv.ParseInt(r.str(col), 10, 64)
	return n
}

// line is the row as one JSON object, "table" first, then its columns in
// table order (numbers as numbers).
func (r exportRow) line(table string) []byte {
	var b strings.Builder
	t, _ := json.Marshal(table)
	b.WriteString(`{"table":` + string(t))
	for i, c := range r.cols {
		k, _ := json.Marshal(c)
		b.WriteString("," + string(k) + ":")
		switch v := r.vals[i]; {
		case v == nil:
			b.WriteString("null")
		case r.num[i]:
			b.WriteString(*v)
		default:
			s, _ := json.Marshal(*v)
			b.Write(s)
		}
	}
	b.WriteString("}\n")
	return []byte(b.String())
}

// readRows reads every column of the rows query answers.
func readRows(ctx context.Context, q rowsQueryer, query string, args ...any) ([]exportRow, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	types, err := rows.ColumnTypes()
	if err != nil {
		return nil, err
	}
	num := make([]bool, len(cols))
	for i, t := range types {
		switch t.DatabaseTypeName() {
		case "BIGINT", "INT", "SMALLINT", "TINYINT", "MEDIUMINT", "UNSIGNED BIGINT", "UNSIGNED INT", "UNSIGNED SMALLINT", "UNSIGNED TINYINT":
			num[i] = true
		}
	}
	var out []exportRow
	for rows.Next() {
		ns := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range ns {
			ptrs[i] = &ns[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		r := exportRow{cols: cols, vals: make([]*string, len(cols)), num: num}
		for i, v := range ns {
			if v.Valid {
				s := v.String
				r.vals[i] = &s
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// carry is what one step adds to the database's carry tables.
type carry struct {
	sums  map[string][2]int64 // key -> (rows, amount)
	accts map[string][2]int64 // act_id -> (rows, amount)
}

func (c *carry) add(k string, n, amount int64) {
	if c.sums == nil {
		c.sums = map[string][2]int64{}
	}
	v := c.sums[k]
	c.sums[k] = [2]int64{v[0] + n, v[1] + amount}
}

func (c *carry) addAct(act string, amount int64) {
	if c.accts == nil {
		c.accts = map[string][2]int64{}
	}
	v := c.accts[act]
	c.accts[act] = [2]int64{v[0] + 1, v[1] + amount}
}

// deletion is one DELETE of a step with the number of rows it must remove.
type deletion struct {
	sql  string
	args []any
	want int
}

// commit writes the step's file, then, in one transaction, raises the
// horizon named (claimsHorizon or creditsHorizon; "" none) to the step's
// claim date, first, so a crediting transaction that read it under a
// shared lock (dropExported) commits before the rows go; deletes its rows;
// adds its carry; and records the file. A file whose transaction fails is
// removed; one whose commit's answer was lost stays until the next pass
// looks it up.
func (x *exporter) commit(ctx context.Context, kind string, lines [][]byte, rows int64, cents model.Cents, c carry, dels []deletion, horizon string) error {
	now := x.m.clock.Now()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	name := fmt.Sprintf("%s-%s-%x.jsonl", kind, now.UTC().Format("20060102T150405"), b)
	path := filepath.Join(x.dir, name)
	if err := os.MkdirAll(x.dir, 0o750); err != nil {
		return err
	}
	sum, err := writeExportFile(path, lines)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = os.Remove(path)
			_ = os.Remove(path + ".sha256")
		}
	}()
	tx, err := x.m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if horizon != "" {
		h, _ := strconv.ParseInt(x.date, 10, 64)
		if _, err := tx.ExecContext(ctx, "UPDATE "+x.m.carryTable(x.db)+" SET amount = GREATEST(amount, ?) WHERE k = ?", h, horizon); err != nil {
			return err
		}
	}
	for _, d := range dels {
		r, err := tx.ExecContext(ctx, d.sql, d.args...)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n != int64(d.want) {
			return errors.Join(err, fmt.Errorf("export: read %d rows to delete, deleted %d", d.want, n))
		}
	}
	for _, u := range []struct {
		table, key string
		sums       map[string][2]int64
	}{{x.m.carryTable(x.db), "k", c.sums}, {x.m.flowCarryTable(x.db), "act_id", c.accts}} {
		if len(u.sums) == 0 {
			continue
		}
		args := make([]any, 0, 3*len(u.sums))
		for _, k := range sortedKeys(u.sums) {
			args = append(args, k, u.sums[k][0], u.sums[k][1])
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+u.table+" ("+u.key+", n, amount) VALUES "+rowsOf(len(u.sums), 3)+
			" ON DUPLICATE KEY UPDATE n = n + VALUES(n), amount = amount + VALUES(amount)", args...); err != nil {
			return err
		}
	}
	rel := filepath.Base(x.dir) + "/" + name
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+x.m.exportLogTable(x.db)+" (file, kind, n, cents, sha256, created_ms) VALUES (?, ?, ?, ?, ?, ?)",
		rel, kind, rows, int64(cents), sum, now.UnixMilli()); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		committed = true // perhaps committed: the next pass keeps it only if its log row is there
		return commitUnknown(err)
	}
	committed = true
	x.p.Result.Files++
	x.p.Result.Cents += cents
	return nil
}

// writeExportFile writes lines to path and its SHA-256 to path.sha256 (as
// sha256sum prints it), each through a temporary file, fsynced and renamed,
// then fsyncs the directory; it returns the checksum in hex.
func writeExportFile(path string, lines [][]byte) (string, error) {
	h := sha256.New()
	write := func(p string, fill func(w *bufio.Writer) error) error {
		tmp := p + ".tmp"
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
		if err != nil {
			return err
		}
		w := bufio.NewWriter(f)
		err = errors.Join(fill(w), w.Flush(), f.Sync(), f.Close())
		if err != nil {
			_ = os.Remove(tmp)
			return err
		}
		return os.Rename(tmp, p)
	}
	err := write(path, func(w *bufio.Writer) error {
		for _, l := range lines {
			h.Write(l)
			if _, err := w.Write(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	err = write(path+".sha256", func(w *bufio.Writer) error {
		_, err := fmt.Fprintf(w, "%s  %s\n", sum, filepath.Base(path))
		return err
	})
	if err != nil {
		return "", err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", err
	}
	return sum, errors.Join(d.Sync(), d.Close())
}

// packets exports shard s's archived packets dated before the claim date,
// with their claims, up to a chunk of rows (one packet with all its claims
// when it alone has more).
func (x *exporter) packets(ctx context.Context, s model.ShardID) (bool, error) {
	m := x.m
	pt, ct := m.packetTable(s, ArchiveDay), m.claimTable(s, ArchiveDay)
	ps, err := readRows(ctx, m.db, "SELECT * FROM "+pt+" WHERE packet_id < ? ORDER BY packet_id LIMIT ?", x.date, x.p.Chunk)
	if err != nil || len(ps) == 0 {
		return false, err
	}
	// A chunk of rows: packets with their claims (count - remaining_count
	// each), at least one packet, however many claims it has.
	more := len(ps) == x.p.Chunk
	for i, rows := 0, 0; i < len(ps); i++ {
		rows += 1 + int(ps[i].int("count")-ps[i].int("remaining_count"))
		if rows > x.p.Chunk && i > 0 {
			ps, more = ps[:i], true
			break
		}
	}
	ids := make([]any, len(ps))
	var c carry
	var lines [][]byte
	var cents model.Cents
	for i, r := range ps {
		ids[i] = r.str("packet_id")
		c.add("packets", 1, r.int("amount"))
		c.add("packet_refunds", 0, r.int("refund_amount"))
		c.add("packet_remaining", 0, r.int("remaining_amount"))
		cents += model.Cents(r.int("amount"))
		lines = append(lines, r.line(pt))
	}
	in := " WHERE packet_id IN (" + placeholders(len(ids)) + ")"
	cs, err := readRows(ctx, m.db, "SELECT * FROM "+ct+in+" ORDER BY packet_id, seq", ids...)
	if err != nil {
		return false, err
	}
	for _, r := range cs {
		c.add("claims", 1, r.int("amount"))
		lines = append(lines, r.line(ct))
	}
	dels := []deletion{{"DELETE FROM " + ct + in, ids, len(cs)}, {"DELETE FROM " + pt + in, ids, len(ps)}}
	if err := x.commit(ctx, "packets", lines, int64(len(ps)+len(cs)), cents, c, dels, claimsHorizon); err != nil {
		return false, err
	}
	x.p.Result.Rows["packets"] += int64(len(ps))
	x.p.Result.Rows["claims"] += int64(len(cs))
	return more, nil
}

// flows exports the flows of shard s past the cut among the next chunk of
// rows after *after (by id): credits of claims dated before the claim date,
// the others created before BeforeMS. Flows are never changed once written,
// so they are read without locks. It is done once a chunk holds only rows
// created at or after BeforeMS: a credit booked later than that for an
// older claim stays in the table (compared by sums below the horizon).
func (x *exporter) flows(ctx context.Context, s model.ShardID, after *int64) (bool, error) {
	m := x.m
	ft := m.flowTable(s)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+ft+" WHERE id > ? ORDER BY id LIMIT ?", *after, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	*after = rs[len(rs)-1].int("id")
	var c carry
	var lines [][]byte
	var ids []any
	var cents model.Cents
	newer, credits := 0, false
	for _, r := range rs {
		kind, created := r.str("kind"), r.int("created_ms")
		if created >= x.p.BeforeMS {
			newer++
		}
		// Reward flows leave with their rewards (the rewards step).
		due := created < x.p.BeforeMS && kind != string(model.FlowCredit) && kind != string(model.FlowReward)
		if kind == string(model.FlowCredit) {
			due = x.date != "" && strings.TrimPrefix(r.str("order_no"), "claim:") < x.date
			credits = credits || due
		}
		if !due {
			continue
		}
		amount := r.int("amount")
		ids = append(ids, r.int("id"))
		c.add("flow:"+kind, 1, amount)
		c.addAct(r.str("act_id"), amount)
		cents += model.Cents(max(amount, -amount))
		lines = append(lines, r.line(ft))
	}
	more := newer < len(rs) && len(rs) == x.p.Chunk
	if len(ids) == 0 {
		return more, nil
	}
	dels := []deletion{{"DELETE FROM " + ft + " WHERE id IN (" + placeholders(len(ids)) + ")", ids, len(ids)}}
	horizon := ""
	if credits {
		horizon = creditsHorizon
	}
	if err := x.commit(ctx, "flows", lines, int64(len(ids)), cents, c, dels, horizon); err != nil {
		return false, err
	}
	x.p.Result.Rows["flows"] += int64(len(ids))
	return more, nil
}

// rewards exports up to a chunk of the database's booked rewards created
// and booked before BeforeMS, with the reward flows the official cash ones
// booked into wallets (written at the booking, so before BeforeMS too).
func (x *exporter) rewards(ctx context.Context) (bool, error) {
	m := x.m
	rt := m.rewardTable(x.db)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+rt+" WHERE status = ? AND created_ms < ? AND booked_ms < ? ORDER BY status, created_ms LIMIT ?",
		int(model.RewardBooked), x.p.BeforeMS, x.p.BeforeMS, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	var c carry
	var lines [][]byte
	var cents model.Cents
	ids := make([]any, len(rs))
	flowKeys := map[model.ShardID][]any{} // (act_id, order_no) of the reward flows, by shard
	for i, r := range rs {
		ids[i] = r.str("order_no")
		rw := model.Reward{Stage: r.str("stage"), AwardType: r.str("award_type"), Status: model.RewardBooked, Amount: model.Cents(r.int("amount")), LeaseID: r.str("lease_id")}
		c.add("rewards", 1, 0)
		if rw.LeaseID != "" {
			c.add("lease:"+rw.LeaseID, 0, int64(rw.Amount))
		}
		if rw.Cash() {
			c.add("reward_issued", 0, int64(rw.Amount))
			c.add("reward_booked", 0, int64(rw.Amount))
			if rw.IntoWallet() {
				c.add("reward_into_wallet", 0, int64(rw.Amount))
				if sh := model.ShardID(r.int("act_shard")); sh.Valid() && sh.DB() == x.db {
					flowKeys[sh] = append(flowKeys[sh], r.str("act_id"), model.RewardFlowOrderNo(r.str("order_no")))
				}
			}
		}
		lines = append(lines, r.line(rt))
	}
	dels := []deletion{{"DELETE FROM " + rt + " WHERE status = " + strconv.Itoa(int(model.RewardBooked)) + " AND order_no IN (" + placeholders(len(ids)) + ")", ids, len(ids)}}
	// Their reward flows leave with them, in the same step: reconciliation
	// of rewards against their flows never sees one without the other.
	flows := int64(0)
	for _, sh := range sortedKeys(flowKeys) {
		ft, keys := m.flowTable(sh), flowKeys[sh]
		where := " WHERE kind = '" + string(model.FlowReward) + "' AND (act_id, order_no) IN (" + rowsOf(len(keys)/2, 2) + ")"
		fs, err := readRows(ctx, m.db, "SELECT * FROM "+ft+where+" ORDER BY id", keys...)
		if err != nil {
			return false, err
		}
		for _, f := range fs {
			amount := f.int("amount")
			c.add("flow:"+string(model.FlowReward), 1, amount)
			c.addAct(f.str("act_id"), amount)
			cents += model.Cents(amount)
			lines = append(lines, f.line(ft))
		}
		flows += int64(len(fs))
		dels = append(dels, deletion{"DELETE FROM " + ft + where, keys, len(fs)})
	}
	if err := x.commit(ctx, "rewards", lines, int64(len(rs))+flows, cents, c, dels, ""); err != nil {
		return false, err
	}
	x.p.Result.Rows["rewards"] += int64(len(rs))
	x.p.Result.Rows["flows"] += flows
	return len(rs) == x.p.Chunk, nil
}

// coupons exports up to a chunk of the database's refused coupon requests
// accepted before BeforeMS.
func (x *exporter) coupons(ctx context.Context) (bool, error) {
	m := x.m
	qt := m.couponReqTable(x.db)
	rs, err := readRows(ctx, m.db, "SELECT * FROM "+qt+" WHERE state = ? AND accepted_ms < ? ORDER BY state, accepted_ms LIMIT ?",
		string(model.CouponRefused), x.p.BeforeMS, x.p.Chunk)
	if err != nil || len(rs) == 0 {
		return false, err
	}
	var c carry
	var lines [][]byte
	keys := make([]any, 0, 2*len(rs))
	for _, r := range rs {
		keys = append(keys, r.str("app"), r.str("serial_no"))
		c.add("coupon_refused", 1, 0)
		if r.str("reason") == "" {
			c.add("coupon_refused_no_reason", 1, 0)
		}
		lines = append(lines, r.line(qt))
	}
	dels := []deletion{{"DELETE FROM " + qt + " WHERE state = '" + string(model.CouponRefused) + "' AND (app, serial_no) IN (" + rowsOf(len(rs), 2) + ")", keys, len(rs)}}
	if err := x.commit(ctx, "coupons", lines, int64(len(rs)), 0, c, dels, ""); err != nil {
		return false, err
	}
	x.p.Result.Rows["coupons"] += int64(len(rs))
	return len(rs) == x.p.Chunk, nil
}
