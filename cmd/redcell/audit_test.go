package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// twoCellConfig writes the config of a cluster of two cells on the test
// databases (testenv.MySQLDSN 1 and 2), cell-1 owning shards1 and cell-2
// shards2 (ranges such as "0-499"), and returns its path and the two DSNs.
func twoCellConfig(t *testing.T, shards1, shards2 string) (path, dsn1, dsn2 string) {
	t.Helper()
	dsn1, dsn2 = testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)
	path = filepath.Join(t.TempDir(), "redcell.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`cells:
  - {name: cell-1, listen: "127.0.0.1:1", gossip: "127.0.0.1:2", shards: %q, dsn: %q}
  - {name: cell-2, listen: "127.0.0.1:3", gossip: "127.0.0.1:4", shards: %q, dsn: %q}
`, shards1, dsn1, shards2, dsn2)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, dsn1, dsn2
}

// TestAuditCatchesCorruptRows: `redcell audit` over both test databases is
// clean after a packet whose claims were credited in both cells; then rows are
// corrupted straight in MariaDB, one fault at a time, and each time the audit
// fails (an error, so the command exits non-zero) and prints the problem and
// the difference: a credit row gone with the balance it made (the balance no
// longer its flows), a credit without a claim, a claim whose amount changed
// under its credit. A credit lost with its balance set back is no fault: the
// claim is in flight again, and the audit passes. Each fault is undone.
func TestAuditCatchesCorruptRows(t *testing.T) {
	config, dsn1, dsn2 := twoCellConfig(t, "0-499", "500-999")
	ctx := context.Background()
	m1, m2 := openStore(t, dsn1), openStore(t, dsn2)
	db1, db2 := openDB(t, dsn1), openDB(t, dsn2)

	// A packet of cell-1, claimed by a wallet of each cell, both credited.
	pre := testenv.Prefix()
	sender, near, far := actIn(pre+"-s", 0, 499), actIn(pre+"-n", 0, 499), actIn(pre+"-f", 500, 999)
	sh := sharding.ShardOfAct(sender)
	if _, err := storage.Deposit(ctx, m1, sh, sender, "dep-1", 1000); err != nil {
		t.Fatal(err)
	}
	id := model.NewPacketID(sh, time.Now())
	if _, _, err := storage.Send(ctx, m1, sh, model.SendRequest{Sender: sender, Amount: 600, Count: 2, Kind: model.KindRandom, OrderNo: "snd-1"}, id, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ref, _ := model.ParsePacketID(string(id))
	res, _, err := storage.OpenBatch(ctx, m1, ref, []model.OpenRequest{{ActID: near, Shard: sharding.ShardOfAct(near)}, {ActID: far, Shard: sharding.ShardOfAct(far)}}, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	credit := func(c model.Claim) model.Credit {
		return model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount}
	}
	cNear, cFar := credit(res[0].Claim), credit(res[1].Claim)
	if _, _, err := storage.ApplyCredits(ctx, m1, []model.Credit{cNear}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := storage.ApplyCredits(ctx, m2, []model.Credit{cFar}); err != nil {
		t.Fatal(err)
	}

	run := func() (string, error) {
		var out bytes.Buffer
		err := audit(ctx, []string{"--config", config, "--settle", "0s"}, &out)
		return out.String(), err
	}
	out, err := run()
	if err != nil || !strings.Contains(out, "audit OK") {
		t.Fatalf("audit before any fault: %v\n%s", err, out)
	}
	inFlight := func(out string) model.Cents { // the audit's in-flight line, in cents
		var cents model.Cents
		if i := strings.Index(out, "  in flight "); i >= 0 {
			fmt.Sscanf(out[i+len("  in flight "):], "%d", &cents)
		}
		return cents
	}
	before := inFlight(out)
	farFlow := fmt.Sprintf("db_%02d.t_flow_%d", cFar.Shard.DB(), cFar.Shard.Table())
	farAccount := fmt.Sprintf("db_%02d.t_account_%d", cFar.Shard.DB(), cFar.Shard.Table())
	claims := fmt.Sprintf("db_%02d.t_claim_%d_%02d", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
	invented := model.ClaimID(model.NewPacketID(sh, time.Now()), 1)
	faults := []struct {
		name          string
		corrupt, undo func()
		problems      []string
		differenceCts model.Cents
	}{
		{"credit row of a credited claim deleted, its balance kept",
			func() {
				sqlExec(t, db2, "DELETE FROM "+farFlow+" WHERE act_id = ? AND order_no = ?", far, "claim:"+cFar.ClaimID)
			},
			func() {
				sqlExec(t, db2, "INSERT INTO "+farFlow+" (act_id, order_no, kind, amount, ref, created_ms) VALUES (?, ?, 'credit', ?, ?, ?)",
					far, "claim:"+cFar.ClaimID, cFar.Amount, string(id), time.Now().UnixMilli())
			},
			[]string{fmt.Sprintf("cell-2: account %s (shard %d): balance %d, flows sum to 0", far, cFar.Shard, cFar.Amount)}, -cFar.Amount},
		{"credit without a claim",
			func() {
				sqlExec(t, db2, "INSERT INTO "+farFlow+" (act_id, order_no, kind, amount, ref, created_ms) VALUES (?, ?, 'credit', 77, '', ?)",
					far, "claim:"+invented, time.Now().UnixMilli())
				sqlExec(t, db2, "UPDATE "+farAccount+" SET balance = balance + 77 WHERE act_id = ?", far)
			},
			func() {
				sqlExec(t, db2, "DELETE FROM "+farFlow+" WHERE act_id = ? AND order_no = ?", far, "claim:"+invented)
				sqlExec(t, db2, "UPDATE "+farAccount+" SET balance = balance - 77 WHERE act_id = ?", far)
			},
			[]string{fmt.Sprintf("credit %s of 77 cents to %s (cell-2, db_%02d) has no claim", invented, far, cFar.Shard.DB())}, -77},
		{"amount of a credited claim changed",
			func() {
				sqlExec(t, db1, "UPDATE "+claims+" SET amount = amount - 1 WHERE packet_id = ? AND seq = ?", string(id), res[0].Claim.Seq)
			},
			func() {
				sqlExec(t, db1, "UPDATE "+claims+" SET amount = amount + 1 WHERE packet_id = ? AND seq = ?", string(id), res[0].Claim.Seq)
			},
			[]string{fmt.Sprintf("credit %s is %d cents to %s (", cNear.ClaimID, cNear.Amount, near),
				fmt.Sprintf("its claim %d cents to %s (", cNear.Amount-1, near)}, 0},
	}
	for _, f := range faults {
		f.corrupt()
		undone := false
		t.Cleanup(func() {
			if !undone {
				f.undo()
			}
		})
		out, err := run()
		named := !slices.ContainsFunc(f.problems, func(p string) bool { return !strings.Contains(out, p) })
		if err == nil || !strings.Contains(out, "audit FAILED") || !named ||
			!strings.Contains(out, fmt.Sprintf("difference      %14d cents", f.differenceCts)) {
			t.Errorf("%s: audit answered %v, want a failure naming %q and difference %d:\n%s", f.name, err, f.problems, f.differenceCts, out)
		}
		t.Logf("%s:\n%s", f.name, out)
		f.undo()
		undone = true
	}
	if out, err := run(); err != nil {
		t.Fatalf("audit after undoing the faults: %v\n%s", err, out)
	}

	// Not a fault: the far credit lost with the balance it made (as a
	// receiver that lost the transaction would leave it). The claim is in
	// flight again, for the relay or reconciliation to deliver: the books
	// balance.
	sqlExec(t, db2, "DELETE FROM "+farFlow+" WHERE act_id = ? AND order_no = ?", far, "claim:"+cFar.ClaimID)
	sqlExec(t, db2, "UPDATE "+farAccount+" SET balance = balance - ? WHERE act_id = ?", cFar.Amount, far)
	out, err = run()
	if _, _, err := storage.ApplyCredits(ctx, m2, []model.Credit{cFar}); err != nil { // delivered again
		t.Fatal(err)
	}
	if err != nil || !strings.Contains(out, "audit OK") || inFlight(out) != before+cFar.Amount {
		t.Errorf("a credit lost with its balance: audit answered %v with %d cents in flight, want OK with %d (%d before, and the claim's %d):\n%s",
			err, inFlight(out), before+cFar.Amount, before, cFar.Amount, out)
	}
	if out, err := run(); err != nil || inFlight(out) != before {
		t.Fatalf("audit after the credit was delivered again: %v, %d cents in flight, want %d\n%s", err, inFlight(out), before, out)
	}
}

func openStore(t *testing.T, dsn string) *storage.MySQL {
	t.Helper()
	m, err := storage.Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func sqlExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestPrintAuditRewardsAndWithdrawals: the text report shows reward income
// and withdrawals next to deposits, and the difference they enter.
func TestPrintAuditRewardsAndWithdrawals(t *testing.T) {
	r := model.Audit([]model.Ledger{{Cell: "a", Deposits: 1000, Rewards: 250, Withdrawals: 120, Balances: 1100}})
	var b bytes.Buffer
	printAudit(&b, r)
	out := b.String()
	for _, want := range []string{
		"audit FAILED over cells [a]",
		fmt.Sprintf("  deposits        %14d cents\n", 1000),
		fmt.Sprintf("  rewards         %14d cents\n", 250),
		fmt.Sprintf("  withdrawals     %14d cents\n", 120),
		fmt.Sprintf("  balances        %14d cents\n", 1100),
		fmt.Sprintf("  difference      %14d cents (deposits + rewards - withdrawals - balances - open - in flight)\n", 30),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestClusterOwners: the audit decides who owns a database from the cluster's
// shard map: the ranges each cell saved after a move (or its config's), the
// higher map version winning a database two cells claim. cell-1 was stopped
// in the hand-over of db_38 to cell-3 (its saved ranges still hold db_38,
// at version 1); cell-3 adopted it at version 2: db_38 is cell-3's.
func TestClusterOwners(t *testing.T) {
	fc := fileConfig{Cells: []cellEntry{{Name: "cell-1", Shards: "0-499"}, {Name: "cell-2", Shards: "500-999"}, {Name: "cell-3", Shards: ""}}}
	saved := map[string]struct {
		ranges  string
		version int64
	}{"cell-1": {"0-499", 1}, "cell-3": {"380-389", 2}}
	owners, ties, err := clusterOwners(fc, func(i int) (string, int64, bool, error) {
		s, ok := saved[fc.Cells[i].Name]
		return s.ranges, s.version, ok, nil
	})
	if err != nil || len(ties) != 0 {
		t.Fatal(err, ties)
	}
	for db, want := range map[int]string{0: "cell-1", 37: "cell-1", 38: "cell-3", 39: "cell-1", 49: "cell-1", 50: "cell-2", 99: "cell-2"} {
		if owners[db] != want {
			t.Errorf("db_%02d owned by %q, want %q", db, owners[db], want)
		}
	}
	// Before the adoption was saved, db_38 is still cell-1's.
	delete(saved, "cell-3")
	if owners, _, _ = clusterOwners(fc, func(i int) (string, int64, bool, error) {
		s, ok := saved[fc.Cells[i].Name]
		return s.ranges, s.version, ok, nil
	}); owners[38] != "cell-1" {
		t.Errorf("db_38 before the adoption owned by %q, want cell-1", owners[38])
	}
	// Two cells claiming db_38 under one version: a problem naming both,
	// not a silent pick by name.
	saved["cell-3"] = struct {
		ranges  string
		version int64
	}{"380-389", 1}
	_, ties, _ = clusterOwners(fc, func(i int) (string, int64, bool, error) {
		s, ok := saved[fc.Cells[i].Name]
		return s.ranges, s.version, ok, nil
	})
	if want := "db_38 is claimed by cell-1 and cell-3 under one map version 1"; len(ties) != 1 || !strings.Contains(ties[0], want) {
		t.Errorf("a tie gave problems %q, want one with %q", ties, want)
	}
}

// TestPrintAuditCopies: the text report lists the copies it did not count,
// one line each, those with no move record in one line per cell.
func TestPrintAuditCopies(t *testing.T) {
	r := model.Audit(nil)
	r.AddCopies([]model.DBCopy{
		{Cell: "cell-1", DB: 38, Kind: model.CopyFrozen, Version: 4, Owner: "cell-3"},
		{Cell: "cell-1", DB: 61, Kind: model.CopyUnrecorded, Owner: "cell-2"},
		{Cell: "cell-1", DB: 62, Kind: model.CopyUnrecorded, Owner: "cell-2"},
	})
	var b bytes.Buffer
	printAudit(&b, r)
	for _, want := range []string{
		"audit OK over cells []",
		"  copy, not counted: cell-1: db_38, owned by cell-3 by the map, frozen copy of a hand-over under map version 4, not released yet\n",
		"  copies, not counted: cell-1: db_61 (cell-2's), db_62 (cell-2's), with no move record\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
