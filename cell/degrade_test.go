package cell_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
)

// degrade PUTs body to a cell's /admin/degrade with the token and returns the
// switches as the cell answers them.
func degrade(t *testing.T, c *testCell, body string) api.DegradeSetting {
	t.Helper()
	var out api.DegradeSetting
	if st, code := callRaw(t, map[string]string{"Authorization": "Bearer " + adminToken}, "PUT", c.adminURL+"/admin/degrade", []byte(body), &out); st != 200 {
		t.Fatalf("PUT /admin/degrade %s: %d %s", body, st, code)
	}
	return out
}

// TestDegradeSwitches: each switch is read and set through the admin port
// (token required, unknown fields and values refused), shows in the metrics,
// and changes what the public API answers: no claims in packet detail, grab
// answered from the database.
func TestDegradeSwitches(t *testing.T) {
	c := oneCell(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken })
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	auth := map[string]string{"Authorization": "Bearer " + adminToken}
	var got api.DegradeSetting
	if st, code := callH(t, auth, "GET", c.adminURL+"/admin/degrade", nil, &got); st != 200 || got != (api.DegradeSetting{ClaimsList: "on", GrabCache: "on", Relay: "on", WalletFlow: "on", Booking: "on", CouponIssue: "on", TokenRestore: "on"}) {
		t.Fatalf("GET /admin/degrade: %d %s %+v", st, code, got)
	}
	if st, _ := callRaw(t, nil, "PUT", c.adminURL+"/admin/degrade", []byte(`{"claims_list":"off"}`), nil); st != 401 {
		t.Fatalf("PUT without the token: %d", st)
	}
	for _, bad := range []string{`{"claims_list":"maybe"}`, `{"claim_list":"off"}`, `{"relay":false}`, `not json`} {
		if st, code := callRaw(t, auth, "PUT", c.adminURL+"/admin/degrade", []byte(bad), nil); st != 400 || code != "INVALID_ARGUMENT" {
			t.Fatalf("PUT %s: %d %s", bad, st, code)
		}
	}
	if got := degrade(t, c, `{}`); got.ClaimsList != "on" {
		t.Fatalf("an empty PUT changed a switch: %+v", got)
	}

	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 1000)
	id := c.send(t, sender, 1000, 3, "snd-1")
	openOne(t, c, nil, id, pre+"-u")
	detail := func() api.PacketResponse {
		var d api.PacketResponse
		if st, code := call(t, "GET", c.url+"/v1/packets/"+id, nil, &d); st != 200 {
			t.Fatalf("detail: %d %s", st, code)
		}
		return d
	}
	grab := func() api.GrabResponse {
		var g api.GrabResponse
		if st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/grab", api.ActRequest{ActID: pre + "-g"}, &g); st != 200 {
			t.Fatalf("grab: %d %s", st, code)
		}
		return g
	}
	if d := detail(); len(d.Claims) != 1 || d.ClaimsDegraded {
		t.Fatalf("detail with the claims list on: %+v", d)
	}
	// The open's worker writes the copy after its answer: wait for it.
	var g api.GrabResponse
	waitFor(t, 5*time.Second, func() bool { g = grab(); return g.Remaining == 2 }, "the grab cache's copy after the open")
	if g.Source != "cache" {
		t.Fatalf("grab with the cache on: %+v", g)
	}

	if got := degrade(t, c, `{"claims_list":"off","grab_cache":"off"}`); got != (api.DegradeSetting{ClaimsList: "off", GrabCache: "off", Relay: "on", WalletFlow: "on", Booking: "on", CouponIssue: "on", TokenRestore: "on"}) {
		t.Fatalf("after switching off: %+v", got)
	}
	if d := detail(); len(d.Claims) != 0 || !d.ClaimsDegraded || d.RemainingCount != 2 || d.Claims == nil {
		t.Fatalf("detail with the claims list off: %+v", d)
	}
	openOne(t, c, nil, id, pre+"-v") // the open worker still refreshes the cache
	if g := grab(); g.Source != "db" || g.Remaining != 1 || !g.Available {
		t.Fatalf("grab with the cache off: %+v", g)
	}
	m := scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_degrade_switch{switch="claims_list"}`, "1")
	wantMetric(t, m, `redcell_degrade_switch{switch="grab_cache"}`, "1")
	wantMetric(t, m, `redcell_degrade_switch{switch="relay"}`, "0")

	degrade(t, c, `{"claims_list":"on","grab_cache":"on"}`)
	if d := detail(); len(d.Claims) != 2 || d.ClaimsDegraded {
		t.Fatalf("detail with the claims list back on: %+v", d)
	}
	if g := grab(); g.Source != "cache" || g.Remaining != 1 {
		t.Fatalf("grab with the cache back on (the copy must be fresh): %+v", g)
	}
	wantMetric(t, scrape(t, c.adminURL), `redcell_degrade_switch{switch="grab_cache"}`, "0")
}

// TestRelaySwitch: with the relay off, a cross-cell claim stays uncredited,
// held by the sending cell's relay (redcell_cell_credits_pending), and the
// books still balance (the audit counts it in flight; reconciliation calls
// it lag, not a difference, and hands it to the relay again, which holds
// it). Back on, it is credited exactly once and the relay lets it go. The
// switch stops the relays of both spaces; the test moves stress-test money,
// whose shadow tables hold few rows, so the audits read little.
func TestRelaySwitch(t *testing.T) {
	a, b := twoCells(t, fastRecon(t))
	degrade(t, a, `{"relay":"off"}`)
	wantMetric(t, scrape(t, a.adminURL), `redcell_degrade_switch{switch="relay"}`, "1")
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	claimant := actIn(t, pre+"-c", b.cfg.Shards)
	stressDeposit(t, a, sender, "dep-1", 500)
	packetID := stressSend(t, a, sender, 500, 1, "snd-1")
	claim := openOne(t, a, stress, packetID, claimant)
	opened := time.Now()
	balance := func() int64 {
		var acct model.Account
		callH(t, stress, "GET", b.url+"/v1/accounts/"+claimant, nil, &acct)
		return int64(acct.Balance)
	}
	waitFor(t, 15*time.Second, func() bool {
		return metric(t, a, `redcell_recon_lagging_claims_total{space="shadow"}`) >= 1
	}, "reconciliation to see the claim lag")
	if got, held := balance(), creditsPending(t, a, "shadow"); got != 0 || held < 1 || hasCredit(t, b.db, "shadow_", claimant, claim.ClaimID) {
		t.Fatalf("relay off: claimant credited %d (credit flow %v), %v credits held by the relay, want 0, none, at least 1",
			got, hasCredit(t, b.db, "shadow_", claimant, claim.ClaimID), held)
	}
	if age, least := metric(t, a, `redcell_cell_credits_pending_oldest_seconds{space="shadow"}`), time.Since(opened).Seconds()-1; age < least {
		t.Fatalf("relay off: the oldest credit held is %v s old, want at least the claim's age, %.1f s", age, least)
	}
	for _, k := range model.DiffKinds {
		if n := metric(t, a, `redcell_recon_differences_total{kind="`+k+`",space="shadow"}`); n != 0 {
			t.Fatalf("relay off: %v differences of kind %s", n, k)
		}
	}
	if rep := auditShadow(t); !rep.OK() || rep.InFlight < model.Cents(claim.Amount) {
		t.Fatalf("audit with the relay off: %+v", rep)
	}

	degrade(t, a, `{"relay":"on"}`)
	waitFor(t, 10*time.Second, func() bool { return balance() == claim.Amount }, "credit once the relay is back on")
	waitFor(t, 5*time.Second, func() bool { return creditsPending(t, a, "shadow") == 0 }, "the relay to let the delivered credit go")
	waitScans(t, a, "shadow", 3) // more passes must not credit again
	if got := balance(); got != claim.Amount || !hasCredit(t, b.db, "shadow_", claimant, claim.ClaimID) {
		t.Fatalf("balance %d, want %d, credited once", got, claim.Amount)
	}
	if rep := auditShadow(t); !rep.OK() {
		t.Fatalf("audit after delivery: %+v", rep)
	}
}

// auditShadow reads the shadow tables of both test databases as `redcell
// audit --shadow` does and combines them; like it, it reads again (for up to
// 5 s) while the report is not clean, since a credit applied between the two
// reads can look off.
func auditShadow(t *testing.T) model.AuditReport {
	t.Helper()
	var rep model.AuditReport
	testenv.Until(5*time.Second, func() bool {
		var ledgers []model.Ledger
		for n := 1; n <= 2; n++ {
			st, err := storage.Open(testenv.MySQLDSN(t, n), 2)
			if err != nil {
				t.Fatal(err)
			}
			l, err := st.Shadow().Ledger(context.Background(), fmt.Sprintf("db%d", n))
			st.Close()
			if err != nil {
				t.Fatal(err)
			}
			ledgers = append(ledgers, l)
		}
		rep = model.Audit(ledgers)
		return rep.OK()
	})
	return rep
}
