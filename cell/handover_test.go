package cell_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testaudit"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// outboxDest reads the dest of a claim's outbox row in namespace ns ("" when
// there is no row).
func outboxDest(t *testing.T, c *testCell, claimID string) string {
	t.Helper()
	ref, _, err := model.ParseClaimID(claimID)
	if err != nil {
		t.Fatal(err)
	}
	var dest string
	c.db.QueryRow(fmt.Sprintf("SELECT dest FROM %sdb_%02d.t_outbox WHERE claim_id = ?", c.ns, ref.Shard.DB()), claimID).Scan(&dest)
	return dest
}

// TestCreditOnceAcrossHandOver: a credit is applied once across the cluster,
// not only once per database. A claimant's database is handed from cell-a
// to cell-b without its rows (the move's steps without the copy, as a move
// that lost them would), after one claim (c1) was credited at cell-a and
// while another (c2) waited in the outbox with the relay switched off. The
// packet's outbox rows name cell-a as where their credits go. Then c1's
// outbox mark is lost. The relay, switched on, asks cell-a's copy before it
// delivers to cell-b: c1 is found there, marked with where it was applied
// and counted (never booked at cell-b); c2 is not, and is credited at cell-b.
// The mark lost once more, the relay asks again and again books nothing.
// Reconciliation reports c1 as credit_elsewhere, not credit_missing. The
// audit of both servers' books finds every claim credited once.
func TestCreditOnceAcrossHandOver(t *testing.T) {
	prefix := privateDatabases(t)
	peers := &staticPeers{}
	tune := func(cfg *cell.Config) {
		fastRecon(t)(cfg)
		cfg.RelayInterval = 100 * time.Millisecond
		cfg.MoveGrace = time.Hour // cell-a keeps its copy
	}
	a := startCell(t, "ho-a", "0-499", 1, peers, tune)
	b := startCell(t, "ho-b", "500-999", 2, peers, tune)
	setMap := func() {
		sa, sb := movesState(t, a), movesState(t, b)
		ra, _ := sharding.ParseRanges(sa.Shards)
		rb, _ := sharding.ParseRanges(sb.Shards)
		m, _ := sharding.NewMap([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: ra, Version: sa.Version},
			{Name: b.name, Addr: b.addr, Shards: rb, Version: sb.Version}})
		peers.m.Store(m)
	}
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(a.adminURL + "/metrics"); return err == nil }, "admin port up")
	setMap()
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-ho-s", b.cfg.Shards)
	act1 := actIn(t, pre+"-ho-1", a.cfg.Shards)
	db := sharding.ShardOfAct(act1).DB()
	act2 := actInDB(pre+"-ho-2", db)
	b.deposit(t, sender, 10_000)
	packet := b.send(t, sender, 1_000, 4, "ho-send")

	c1 := openOne(t, b, nil, packet, act1)
	waitFor(t, 10*time.Second, func() bool { return outboxState(t, b.db, b.ns, c1.ClaimID) == 1 }, "c1 credited and marked")
	if !hasCredit(t, a.db, a.ns, act1, c1.ClaimID) {
		t.Fatal("c1 marked delivered without its credit at cell-a")
	}
	setDegrade(t, b, api.DegradeSetting{Relay: "off"})
	c2 := openOne(t, b, nil, packet, act2)
	if d1, d2 := outboxDest(t, b, c1.ClaimID), outboxDest(t, b, c2.ClaimID); d1 != a.name || d2 != a.name {
		t.Fatalf("outbox rows name %q (delivered) and %q (pending) as where the credits go, want %q", d1, d2, a.name)
	}

	// The hand-over without the rows: cell-b adopts a database it holds no copy of.
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "freeze", DB: db}); st != 200 {
		t.Fatalf("freeze db_%02d at cell-a: %d %s", db, st, code)
	}
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: db, Version: 2, Digest: strings.Repeat("0", 64)}); st != 200 {
		t.Fatalf("release: %d %s", st, code)
	}
	if st, code, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: db, Version: 2}); st != 200 {
		t.Fatalf("adopt: %d %s", st, code)
	}
	setMap()

	ref, _ := model.ParsePacketID(packet)
	outbox := fmt.Sprintf("%sdb_%02d.t_outbox", b.ns, ref.Shard.DB())
	loseMark := func() {
		exec(t, b.db, "UPDATE "+outbox+" SET state = 0, delivered_ms = NULL WHERE claim_id = ?", c1.ClaimID)
	}
	loseMark()
	setDegrade(t, b, api.DegradeSetting{Relay: "on"})
	waitFor(t, 20*time.Second, func() bool {
		return outboxState(t, b.db, b.ns, c1.ClaimID) == 1 && outboxState(t, b.db, b.ns, c2.ClaimID) == 1
	}, "both outbox rows marked")
	elsewhere := "redcell_cell_relay_applied_elsewhere_total"
	if n := metric(t, b, elsewhere); n != 1 {
		t.Errorf("cell-b counted %v credits found applied elsewhere, want 1 (c1)", n)
	}
	check := func(when string) {
		t.Helper()
		if !hasCredit(t, a.db, a.ns, act1, c1.ClaimID) || hasCredit(t, b.db, b.ns, act1, c1.ClaimID) {
			t.Fatalf("%s: c1 credited at cell-a %v, at cell-b %v; want only at cell-a", when,
				hasCredit(t, a.db, a.ns, act1, c1.ClaimID), hasCredit(t, b.db, b.ns, act1, c1.ClaimID))
		}
		if hasCredit(t, a.db, a.ns, act2, c2.ClaimID) || !hasCredit(t, b.db, b.ns, act2, c2.ClaimID) {
			t.Fatalf("%s: c2 credited at cell-a %v, at cell-b %v; want only at cell-b", when,
				hasCredit(t, a.db, a.ns, act2, c2.ClaimID), hasCredit(t, b.db, b.ns, act2, c2.ClaimID))
		}
		if d1, d2 := outboxDest(t, b, c1.ClaimID), outboxDest(t, b, c2.ClaimID); d1 != a.name || d2 != b.name {
			t.Fatalf("%s: outbox rows record c1 applied at %q and c2 at %q, want %q and %q", when, d1, d2, a.name, b.name)
		}
	}
	check("after the relay")
	if bal := b.balance(t, act2); bal != c2.Amount {
		t.Errorf("c2's claimant holds %d at cell-b, want %d", bal, c2.Amount)
	}

	// The relay re-driven: the mark lost again, the row read again.
	loseMark()
	waitFor(t, 20*time.Second, func() bool { return outboxState(t, b.db, b.ns, c1.ClaimID) == 1 }, "c1 marked again")
	if n := metric(t, b, elsewhere); n != 2 {
		t.Errorf("cell-b counted %v credits found applied elsewhere, want 2 (c1 twice)", n)
	}
	check("after the relay read c1 again")

	// Reconciliation at cell-b: c1 reported where it is, not as missing.
	waitFor(t, 20*time.Second, func() bool {
		return metric(t, b, `redcell_recon_differences_total{kind="credit_elsewhere",space="real"}`) >= 1
	}, "reconciliation to report c1 as credit_elsewhere")
	if n := metric(t, b, `redcell_recon_differences_total{kind="credit_missing",space="real"}`); n != 0 {
		t.Errorf("reconciliation reported %v claims credit_missing, want 0", n)
	}
	check("after reconciliation")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sp, err := testaudit.Audit(ctx, []string{testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)}, prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	if !sp.Report.OK() || sp.Report.CreditsCount != 2 || sp.Report.ClaimsCount != 2 {
		t.Fatalf("audit of both servers: %d claims, %d credits, difference %d, problems %v; want 2, 2, 0, none",
			sp.Report.ClaimsCount, sp.Report.CreditsCount, sp.Report.Difference, sp.Report.Problems)
	}
}
