package cell_test

import (
	"context"
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

// TestCreditOnceAcrossHandOver: a credit is applied once across the cluster,
// not only once per database. Two claims of a packet of cell-b, for
// claimants of one database of cell-a, wait with cell-b's relay switched
// off: their rows name cell-a as where their credits go. One (c1) is
// credited at cell-a all the same, by a delivery whose answer never reached
// the relay (the test posts it, as the relay would). Then the claimants'
// database is handed from cell-a to cell-b without its rows (the move's
// steps without the copy, as a move that lost them would). The relay,
// switched on, asks cell-a's copy before it delivers to cell-b: c1 is found
// there, counted and let go (never booked at cell-b), its row still naming
// cell-a; c2 is not, its row is changed to name cell-b, and it is credited at
// cell-b. Reconciliation reports c1 as credit_elsewhere, not as lag. The
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

	setDegrade(t, b, api.DegradeSetting{Relay: "off"})
	c1 := openOne(t, b, nil, packet, act1)
	c2 := openOne(t, b, nil, packet, act2)
	if d1, d2 := claimDest(t, b.db, b.ns, c1.ClaimID), claimDest(t, b.db, b.ns, c2.ClaimID); d1 != a.name || d2 != a.name {
		t.Fatalf("claim rows name %q and %q as where the credits go, want %q", d1, d2, a.name)
	}
	if held := creditsPending(t, b, "real"); held != 2 {
		t.Fatalf("cell-b's relay holds %v credits with the relay off, want 2 (c1, c2)", held)
	}
	// c1 credited at cell-a, the answer lost: the relay still holds it.
	var out api.CreditsResponse
	credit1 := model.Credit{ClaimID: c1.ClaimID, PacketID: model.PacketID(packet), ActID: act1, Shard: sharding.ShardOfAct(act1), Amount: model.Cents(c1.Amount)}
	if st, code := postCredits(t, a.url, testSecret, time.Now(), []model.Credit{credit1}, &out); st != 200 || out.Applied != 1 {
		t.Fatalf("c1's credit at cell-a: %d %s %+v, want 1 applied", st, code, out)
	}

	// The hand-over without the rows: cell-b adopts a database it holds no copy of.
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "freeze", DB: db}); st != 200 {
		t.Fatalf("freeze db_%02d at cell-a: %d %s", db, st, code)
	}
	if st, code, _ := moveStep(t, a, api.MoveStep{Op: "release", DB: db, Version: 2, Digest: strings.Repeat("0", 64)}); st != 200 {
		t.Fatalf("release: %d %s", st, code)
	}
	if st, code, _ := moveStep(t, b, api.MoveStep{Op: "adopt", DB: db, Version: 2, Digest: copyDigest(t, b, db)}); st != 200 { // the digest of its own copy: the test's hand-over without the rows
		t.Fatalf("adopt: %d %s", st, code)
	}
	setMap()

	setDegrade(t, b, api.DegradeSetting{Relay: "on"})
	waitFor(t, 20*time.Second, func() bool {
		return hasCredit(t, b.db, b.ns, act2, c2.ClaimID) && creditsPending(t, b, "real") == 0
	}, "c2 credited at cell-b, and both credits let go by the relay")
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
		if d1, d2 := claimDest(t, b.db, b.ns, c1.ClaimID), claimDest(t, b.db, b.ns, c2.ClaimID); d1 != a.name || d2 != b.name {
			t.Fatalf("%s: claim rows record c1 applied at %q and c2 at %q, want %q and %q", when, d1, d2, a.name, b.name)
		}
	}
	check("after the relay")
	if bal := b.balance(t, act2); bal != c2.Amount {
		t.Errorf("c2's claimant holds %d at cell-b, want %d", bal, c2.Amount)
	}

	// Reconciliation at cell-b: c1 reported where it is, not as lag (nor
	// re-driven: the relay would only find it elsewhere again).
	waitFor(t, 20*time.Second, func() bool {
		return metric(t, b, `redcell_recon_differences_total{kind="credit_elsewhere",space="real"}`) >= 1
	}, "reconciliation to report c1 as credit_elsewhere")
	if n := metric(t, b, `redcell_recon_differences_total{kind="credit_missing",space="real"}`); n != 0 {
		t.Errorf("reconciliation reported %v claims credit_missing, want 0", n)
	}
	if n := metric(t, b, elsewhere); n != 1 {
		t.Errorf("cell-b counted %v credits found applied elsewhere after reconciliation, want 1 (c1, not re-driven)", n)
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
