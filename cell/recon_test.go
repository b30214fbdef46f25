package cell_test

import (
	"fmt"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// fastRecon runs reconciliation every 300 ms on claims older than 1.5 s, with
// an admin port: what the reconciliation tests need.
func fastRecon(t *testing.T) func(*cell.Config) {
	return func(cfg *cell.Config) {
		cfg.ReconInterval, cfg.ReconSettle = 300*time.Millisecond, 4*time.Second
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
	}
}

// TestReconciliation: clean traffic between two cells is reconciled with no
// difference, local and cross-cell credits alike. Then faults are put
// straight into the databases, before their window is checked:
//
//  1. the credit of a delivered cross-cell claim is lost (its flow row
//     deleted and the balance set back, as a receiver that lost it would
//     leave it): reconciliation finds the claim uncredited past its settle
//     time, counts it as lag, not a difference, and hands it to the relay,
//     which credits it again;
//  2. a claim's amount is changed (its credit keeps the old one):
//     reconciliation reports credit_mismatch;
//  3. a claim the relay never got (its row and its packet's written straight
//     into the tables, as a commit whose claims no open handed over and no
//     relay read again): reconciliation finds it uncredited, lag, and the
//     relay credits it.
//
// The admin audit of the cell's books (refused without the token) finds the
// mismatch too, and nothing else. The faults are made in the shadow tables
// of stress traffic, which reconciliation checks like real money, so the
// audit reads few rows; the changed amount is set back afterwards.
func TestReconciliation(t *testing.T) {
	a, b := twoCells(t, fastRecon(t))
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	near, far := actIn(t, pre+"-near", a.cfg.Shards), actIn(t, pre+"-far", b.cfg.Shards)
	a.deposit(t, sender, 10_000)

	// Clean traffic: a packet opened by a claimant of each cell.
	clean := a.send(t, sender, 1000, 2, "snd-clean")
	for _, who := range []string{near, far} {
		o := openOne(t, a, nil, clean, who)
		owner := map[string]*testCell{near: a, far: b}[who]
		waitFor(t, 10*time.Second, func() bool { return owner.balance(t, who) == o.Amount }, "credit of "+who)
	}
	waitFor(t, 10*time.Second, func() bool {
		return metric(t, a, `redcell_recon_credited_claims_total{space="real"}`) >= 2
	}, "clean claims reconciled, both credits found")
	if n := metric(t, a, `redcell_recon_checked_claims_total{space="real"}`); n < 2 {
		t.Fatalf("%v claims checked against their credits", n)
	}
	for _, k := range model.DiffKinds {
		if n := metric(t, a, `redcell_recon_differences_total{kind="`+k+`",space="real"}`); n != 0 {
			t.Fatalf("clean traffic: %v differences of kind %s", n, k)
		}
	}
	if metric(t, a, `redcell_recon_last_success_timestamp_seconds{space="real"}`) == 0 {
		t.Fatal("no successful pass recorded")
	}

	// Three stress-traffic packets, one fault each, made before their window is checked.
	stressDeposit(t, a, sender, "dep-1", 1000)
	sendStress := func(order string) string { return stressSend(t, a, sender, 100, 1, order) }
	lost, changed, unseen := sendStress("snd-lost"), sendStress("snd-changed"), sendStress("snd-unseen")
	lagging := func() float64 { return metric(t, a, `redcell_recon_lagging_claims_total{space="shadow"}`) }
	lagBefore := lagging()

	// 1. The credit of a cross-cell claim, delivered, is lost.
	cLost := openOne(t, a, stress, lost, far)
	waitFor(t, 5*time.Second, func() bool { return hasCredit(t, b.db, "shadow_", far, cLost.ClaimID) }, "delivery")
	waitFor(t, 5*time.Second, func() bool { return creditsPending(t, a, "shadow") == 0 }, "the relay to let the delivered credit go")
	farShard := sharding.ShardOfAct(far)
	flowTable := fmt.Sprintf("shadow_db_%02d.t_flow_%d", farShard.DB(), farShard.Table())
	accountTable := fmt.Sprintf("shadow_db_%02d.t_account_%d", farShard.DB(), farShard.Table())
	tx, err := b.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("DELETE FROM "+flowTable+" WHERE act_id = ? AND order_no = ?", far, "claim:"+cLost.ClaimID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("UPDATE "+accountTable+" SET balance = balance - ? WHERE act_id = ?", cLost.Amount, far); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := stressBalance(t, b, far); got != 0 {
		t.Fatalf("the far claimant's shadow balance with its credit lost: %d, want 0", got)
	}

	// 2. A claim's amount is changed (its credit keeps the old one).
	cChanged := openOne(t, a, stress, changed, near)
	ref, _ := model.ParsePacketID(changed)
	claimTable := fmt.Sprintf("shadow_db_%02d.t_claim_%d_%02d", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
	exec(t, a.db, "UPDATE "+claimTable+" SET amount = amount - 1 WHERE packet_id = ? AND seq = ?", changed, cChanged.Seq)
	t.Cleanup(func() {
		exec(t, a.db, "UPDATE "+claimTable+" SET amount = amount + 1 WHERE packet_id = ? AND seq = ?", changed, cChanged.Seq)
	})

	// 3. A claim the relay never got: the packet's one share taken in its
	// rows, with no open (the rows as an open's commit leaves them).
	ref, _ = model.ParsePacketID(unseen)
	unseenID := model.ClaimID(model.PacketID(unseen), 1)
	exec(t, a.db, fmt.Sprintf("INSERT INTO shadow_db_%02d.t_claim_%d_%02d (packet_id, seq, act_id, amount, created_ms, act_shard, dest) VALUES (?, 1, ?, 100, ?, ?, ?)",
		ref.Shard.DB(), ref.Shard.Table(), ref.Day), unseen, near, time.Now().UnixMilli(), int(sharding.ShardOfAct(near)), a.name)
	exec(t, a.db, fmt.Sprintf("UPDATE shadow_db_%02d.t_packet_%d_%02d SET remaining_amount = 0, remaining_count = 0, status = 1 WHERE packet_id = ?",
		ref.Shard.DB(), ref.Shard.Table(), ref.Day), unseen)

	waitFor(t, 15*time.Second, func() bool {
		return metric(t, a, `redcell_recon_differences_total{kind="credit_mismatch",space="shadow"}`) >= 1
	}, "reconciliation to report credit_mismatch")
	waitFor(t, 15*time.Second, func() bool {
		return hasCredit(t, b.db, "shadow_", far, cLost.ClaimID) && hasCredit(t, a.db, "shadow_", near, unseenID)
	}, "the lost credit and the unseen claim's booked by the relay, handed the claims by reconciliation")
	if n := lagging() - lagBefore; n < 2 {
		t.Errorf("reconciliation counted %v claims lagging, want at least 2 (the lost credit, the unseen claim)", n)
	}
	if got := stressBalance(t, b, far); got != cLost.Amount {
		t.Errorf("the far claimant's shadow balance after the credit was re-driven: %d, want %d (once)", got, cLost.Amount)
	}
	if got, want := stressBalance(t, a, near), cChanged.Amount+100; got != want {
		t.Errorf("the near claimant's shadow balance: %d, want %d (the changed claim's credit and the unseen claim's)", got, want)
	}
	for _, kind := range []string{model.DiffCreditMissing, model.DiffCreditOrphan, model.DiffCreditElsewhere} {
		if n := metric(t, a, `redcell_recon_differences_total{kind="`+kind+`",space="shadow"}`); n != 0 {
			t.Errorf("%v differences of kind %s, none was made (a claim not credited is lag)", n, kind)
		}
	}
	if n := metric(t, a, `redcell_recon_differences_total{kind="credit_mismatch",space="real"}`); n != 0 {
		t.Errorf("faults in the shadow tables counted as real money: %v", n)
	}

	// The admin audit of cell-a's own books: refused without the right token,
	// and it finds the faults in cell-a's rows.
	auditURL := a.adminURL + "/admin/audit?space=shadow"
	if st, _ := call(t, "POST", auditURL, nil, nil); st != 401 {
		t.Fatalf("audit without a token: %d", st)
	}
	if st, _ := callH(t, map[string]string{"Authorization": "Bearer wrong"}, "POST", auditURL, nil, nil); st != 401 {
		t.Fatalf("audit with a wrong token: %d", st)
	}
	rep := adminAnswer[api.AuditResponse](t, a, "POST", "/admin/audit?space=shadow")
	books := rep.Spaces["shadow"]
	if rep.OK || books.Differences[model.DiffCreditMismatch] != 1 || books.Differences[model.DiffCreditOrphan] != 0 || len(rep.Spaces) != 1 {
		t.Fatalf("audit with the faults in place: %+v, want one credit_mismatch", rep)
	}
	if metric(t, a, `redcell_audit_runs_total{result="failed",space="shadow"}`) != 1 {
		t.Fatal("failed audit not counted")
	}
}
