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
// difference, local and cross-cell credits alike. Then a fault of each kind
// is put straight into the databases (a credit flow row deleted, a claim's
// amount changed, an outbox row dropped): reconciliation reports each by its
// kind within seconds, and the admin audit of the cell's books finds them too
// (and refuses a caller without the token). The faults are made in the shadow
// tables of stress traffic, which reconciliation checks like real money, so
// the audit reads few rows; they are undone afterwards.
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
		t.Fatalf("%v claims checked against the outbox", n)
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
	if st, code := callH(t, stress, "POST", a.url+"/v1/accounts/"+sender+"/deposit", api.DepositRequest{Amount: 1000, OrderNo: "dep-1"}, nil); st != 200 {
		t.Fatalf("stress deposit: %d %s", st, code)
	}
	sendStress := func(order string) string {
		var out api.SendResponse
		if st, code := callH(t, stress, "POST", a.url+"/v1/packets", api.SendRequest{Sender: sender, Amount: 100, Count: 1, OrderNo: order}, &out); st != 200 {
			t.Fatalf("stress send: %d %s", st, code)
		}
		return out.PacketID
	}
	lost, changed, dropped := sendStress("snd-lost"), sendStress("snd-changed"), sendStress("snd-dropped")

	// 1. The credit flow row of a cross-cell claim, delivered, is deleted.
	cLost := openOne(t, a, stress, lost, far)
	waitFor(t, 5*time.Second, func() bool { return outboxState(t, a.db, "shadow_", cLost.ClaimID) == 1 }, "delivery")
	farShard := sharding.ShardOfAct(far)
	flowTable := fmt.Sprintf("shadow_db_%02d.t_flow_%d", farShard.DB(), farShard.Table())
	var flowID, flowMS int64
	if err := b.db.QueryRow("SELECT id, created_ms FROM "+flowTable+" WHERE act_id = ? AND order_no = ?", far, "claim:"+cLost.ClaimID).Scan(&flowID, &flowMS); err != nil {
		t.Fatal(err)
	}
	exec(t, b.db, "DELETE FROM "+flowTable+" WHERE id = ?", flowID)
	t.Cleanup(func() {
		exec(t, b.db, "INSERT INTO "+flowTable+" (id, act_id, order_no, kind, amount, ref, created_ms) VALUES (?, ?, ?, 'credit', ?, ?, ?)",
			flowID, far, "claim:"+cLost.ClaimID, cLost.Amount, lost, flowMS)
	})

	// 2. A claim's amount is changed (its outbox row and credit keep the old one).
	cChanged := openOne(t, a, stress, changed, near)
	ref, _ := model.ParsePacketID(changed)
	claimTable := fmt.Sprintf("shadow_db_%02d.t_claim_%d_%02d", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
	exec(t, a.db, "UPDATE "+claimTable+" SET amount = amount - 1 WHERE packet_id = ? AND seq = ?", changed, cChanged.Seq)
	t.Cleanup(func() {
		exec(t, a.db, "UPDATE "+claimTable+" SET amount = amount + 1 WHERE packet_id = ? AND seq = ?", changed, cChanged.Seq)
	})

	// 3. A claim's outbox row is dropped.
	cDropped := openOne(t, a, stress, dropped, near)
	ref, _ = model.ParsePacketID(dropped)
	outbox := fmt.Sprintf("shadow_db_%02d.t_outbox", ref.Shard.DB())
	exec(t, a.db, "DELETE FROM "+outbox+" WHERE claim_id = ?", cDropped.ClaimID)
	t.Cleanup(func() { // delivered: the relay credited it from the claim it was handed
		waitFor(t, 5*time.Second, func() bool { return hasCredit(t, a.db, "shadow_", near, cDropped.ClaimID) }, "credit of the claim whose outbox row was dropped")
		exec(t, a.db, "INSERT INTO "+outbox+" (claim_id, packet_id, act_id, act_shard, amount, state, created_ms, delivered_ms) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
			cDropped.ClaimID, dropped, near, int(sharding.ShardOfAct(near)), cDropped.Amount, time.Now().UnixMilli(), time.Now().UnixMilli())
	})

	for _, kind := range []string{model.DiffCreditMissing, model.DiffOutboxMismatch, model.DiffOutboxMissing} {
		waitFor(t, 15*time.Second, func() bool {
			return metric(t, a, `redcell_recon_differences_total{kind="`+kind+`",space="shadow"}`) >= 1
		}, "reconciliation to report "+kind)
	}
	for _, kind := range []string{model.DiffOutboxOrphan, model.DiffCreditMismatch} {
		if n := metric(t, a, `redcell_recon_differences_total{kind="`+kind+`",space="shadow"}`); n != 0 {
			t.Errorf("%v differences of kind %s, none was made", n, kind)
		}
	}
	if n := metric(t, a, `redcell_recon_differences_total{kind="credit_missing",space="real"}`); n != 0 {
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
	var rep api.AuditResponse
	if st, code := callH(t, map[string]string{"Authorization": "Bearer " + adminToken}, "POST", auditURL, nil, &rep); st != 200 {
		t.Fatalf("audit: %d %s", st, code)
	}
	books := rep.Spaces["shadow"]
	if rep.OK || books.Differences[model.DiffOutboxMissing] != 1 || books.Differences[model.DiffOutboxMismatch] != 1 || len(rep.Spaces) != 1 {
		t.Fatalf("audit with the faults in place: %+v", rep)
	}
	if metric(t, a, `redcell_audit_runs_total{result="failed",space="shadow"}`) != 1 {
		t.Fatal("failed audit not counted")
	}
}
