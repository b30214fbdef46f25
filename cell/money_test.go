package cell_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestRefundAtExpiryRacingOpens: openers keep opening while the packet expires
// and the cell's expiry loop refunds it: claims + refund = amount, the refund is
// applied once, the sender gets exactly the remainder, late opens get EXPIRED.
func TestRefundAtExpiryRacingOpens(t *testing.T) {
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.PacketExpiry = time.Second
		cfg.ExpiryInterval = 50 * time.Millisecond
	})
	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 50000)
	id := c.send(t, sender, 50000, 1000, "snd-1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered, expired := int64(0), 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Paced, not a wait: 8 x 60 opens spread over the 1 s expiry.
			pace := time.NewTicker(25 * time.Millisecond)
			defer pace.Stop()
			for i := 0; i < 60; i++ {
				var out api.OpenResponse
				st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: fmt.Sprintf("%s-g%d-%d", pre, g, i)}, &out)
				mu.Lock()
				switch {
				case st == 200:
					answered += out.Amount
				case code == "EXPIRED":
					expired++
				default:
					t.Errorf("open answered %d %s", st, code)
				}
				mu.Unlock()
				<-pace.C

			}
		}()
	}
	wg.Wait()
	if expired == 0 || answered == 0 {
		t.Fatalf("the race did not happen: %d cents claimed, %d EXPIRED answers", answered, expired)
	}
	var refund int64
	waitFor(t, 10*time.Second, func() bool {
		_, _, refund, _ = packetRow(t, c.db, id)
		return refund > 0
	}, "refund")
	rowSum, n, _ := claimRows(t, c.db, id)
	remA, remC, refund, status := packetRow(t, c.db, id)
	if rowSum != answered || rowSum+refund != 50000 || remA != 0 || status != int(model.StatusRefunded) || int64(n)+remC != 1000 {
		t.Fatalf("claims %d (answered %d) + refund %d != 50000; remaining %d in %d, status %d", rowSum, answered, refund, remA, remC, status)
	}
	shard := sharding.ShardOfAct(sender)
	var flows int
	var sum int64
	c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*), SUM(amount) FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = 'refund'", shard.DB(), shard.Table()), sender).Scan(&flows, &sum)
	if flows != 1 || sum != refund {
		t.Fatalf("%d refund flows summing to %d, want 1 of %d", flows, sum, refund)
	}
	if b := c.balance(t, sender); b != refund {
		t.Fatalf("sender balance %d, want the refund %d", b, refund)
	}
	var detail api.PacketResponse
	call(t, "GET", c.url+"/v1/packets/"+id, nil, &detail)
	if detail.Status != "refunded" || detail.RefundAmount != refund {
		t.Fatalf("detail %+v", detail)
	}
	var g api.GrabResponse
	call(t, "POST", c.url+"/v1/packets/"+id+"/grab", api.ActRequest{ActID: pre + "-late"}, &g)
	if g.Available {
		t.Fatalf("grab of a refunded packet: %+v", g)
	}
}

// actIn returns an act_id whose shard is in r.
func actIn(t *testing.T, prefix string, r sharding.Ranges) string {
	for i := 0; i < 100000; i++ {
		a := fmt.Sprintf("%s-%d", prefix, i)
		if r.Contains(sharding.ShardOfAct(a)) {
			return a
		}
	}
	t.Fatal("no act_id found")
	return ""
}

// TestCrossCellCredit: the claimant's wallet is in the other cell (other
// database server); the relay credits it exactly once, also when a credit is
// delivered again.
func TestCrossCellCredit(t *testing.T) {
	a, b := twoCells(t, nil)

	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	claimant := actIn(t, pre+"-c", b.cfg.Shards)
	a.deposit(t, sender, 1000)
	id := a.send(t, sender, 1000, 3, "snd-1")

	// The claimant's cell refuses a packet it does not own.
	if st, code := call(t, "POST", b.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: claimant}, nil); st != 421 || code != "WRONG_CELL" {
		t.Fatalf("open at the wrong cell: %d %s", st, code)
	}
	var claim api.OpenResponse
	if st, code := call(t, "POST", a.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: claimant}, &claim); st != 200 {
		t.Fatalf("open: %d %s", st, code)
	}
	waitFor(t, 10*time.Second, func() bool { return b.balance(t, claimant) == claim.Amount }, "cross-cell credit")

	// Deliver the same credit twice more, as a relay retrying after a lost answer would.
	credit := model.Credit{ClaimID: claim.ClaimID, PacketID: model.PacketID(id), ActID: claimant, Shard: sharding.ShardOfAct(claimant), Amount: model.Cents(claim.Amount)}
	for i := 0; i < 2; i++ {
		var out api.CreditsResponse
		if st, code := postCredits(t, b.url, testSecret, time.Now(), []model.Credit{credit}, &out); st != 200 || out.Applied != 0 {
			t.Fatalf("redelivery %d: %d %s applied %d", i, st, code, out.Applied)
		}
	}
	if got := b.balance(t, claimant); got != claim.Amount {
		t.Fatalf("claimant balance %d after redelivery, want %d", got, claim.Amount)
	}
	shard := sharding.ShardOfAct(claimant)
	var credits int
	b.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = 'credit'", shard.DB(), shard.Table()), claimant).Scan(&credits)
	if credits != 1 {
		t.Fatalf("%d credit rows in the claimant's cell", credits)
	}
	// The sender's claim row names the claimant's cell as where the credit
	// went, and the sender's relay, its delivery acknowledged, holds nothing.
	ref, _ := model.ParsePacketID(id)
	if dest := claimDest(t, a.db, "", claim.ClaimID); dest != b.name {
		t.Fatalf("the claim row names %q as where its credit went, want %q", dest, b.name)
	}
	waitFor(t, 5*time.Second, func() bool { return creditsPending(t, a, "real") == 0 }, "the sender's relay to let the delivered credit go")
	// A credit for an account the receiving cell does not own is refused.
	wrong := credit
	wrong.ActID = actIn(t, pre+"-w", a.cfg.Shards)
	wrong.Shard = sharding.ShardOfAct(wrong.ActID)
	if st, code := postCredits(t, b.url, testSecret, time.Now(), []model.Credit{wrong}, nil); st != 421 || code != "WRONG_CELL" {
		t.Fatalf("credit for a foreign shard: %d %s", st, code)
	}
	// Unsigned, wrongly signed and replayed-too-late credits are refused and
	// change nothing: nobody can invent money by posting to a cell.
	forged := model.Credit{ClaimID: string(ref.ID) + "c99", PacketID: ref.ID, ActID: claimant, Shard: shard, Amount: 1_000_000}
	unsigned, _ := json.Marshal(api.CreditsRequest{Credits: []model.Credit{forged}})
	if st, code := exchange(t, newRequest(nil, "POST", b.url+"/internal/credits", unsigned), nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("unsigned credit: %d %s", st, code)
	}
	if st, code := postCredits(t, b.url, "some-other-secret-0123456789", time.Now(), []model.Credit{forged}, nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("credit signed with another secret: %d %s", st, code)
	}
	if st, code := postCredits(t, b.url, testSecret, time.Now().Add(-time.Minute), []model.Credit{forged}, nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("replayed credit: %d %s", st, code)
	}
	// A correctly signed real call replayed as stress traffic (or back) fails:
	// the space is part of what is signed.
	body, _ := json.Marshal(api.CreditsRequest{Credits: []model.Credit{forged}})
	req := newRequest(nil, "POST", b.url+"/internal/credits", body)
	signer.SignRequest(req, time.Now())
	req.Header.Set(api.HeaderStress, "1")
	if st, code := exchange(t, req, nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("real-signed credit sent as stress traffic: %d %s", st, code)
	}
	if got := b.balance(t, claimant); got != claim.Amount {
		t.Fatalf("claimant balance %d after forged credits, want %d", got, claim.Amount)
	}
}

// TestRelayRedrivesHeldCredit: when the claimant's cell is unreachable the
// sending cell's relay holds the claim (redcell_cell_credits_pending) and
// tries again; once the cell is back it delivers it, once, and lets it go.
func TestRelayRedrivesHeldCredit(t *testing.T) {
	a, b, join := twoCellsApart(t) // at first the map points cell-b's shards at a closed port
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	claimant := actIn(t, pre+"-c", b.cfg.Shards)
	a.deposit(t, sender, 500)
	id := a.send(t, sender, 500, 1, "snd-1")
	var claim api.OpenResponse
	if st, code := call(t, "POST", a.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: claimant}, &claim); st != 200 || claim.Amount != 500 {
		t.Fatalf("open: %d %s %+v", st, code, claim)
	}
	// The relay has tried to deliver, and failed, twice (the fresh claim and
	// its retry after the backoff, or a scan): a credit could have landed by now.
	waitFor(t, 10*time.Second, func() bool { return counter(t, a.reg, "redcell_cell_relay_errors_total", nil) >= 2 },
		"two failed deliveries to the unreachable cell")
	if got, held := b.balance(t, claimant), creditsPending(t, a, "real"); got != 0 || held < 1 {
		t.Fatalf("credited %d while unreachable, %v credits held by the relay; want 0 and at least 1", got, held)
	}
	join()
	waitFor(t, 10*time.Second, func() bool { return b.balance(t, claimant) == 500 }, "credit after the cell came back")
	waitFor(t, 5*time.Second, func() bool { return creditsPending(t, a, "real") == 0 }, "the relay to let the delivered credit go")
	waitScans(t, a, "real", 3) // more passes must not credit again
	if got := b.balance(t, claimant); got != 500 {
		t.Fatalf("balance %d, want 500", got)
	}
}

// TestStressTrafficUsesShadowTables: requests marked as stress traffic move
// money only in the shadow databases, across cells too; real wallets and real
// tables never change.
func TestStressTrafficUsesShadowTables(t *testing.T) {
	a, b := twoCells(t, nil)
	stress := map[string]string{api.HeaderStress: "1"}
	pre := testenv.Prefix()
	sender := actIn(t, pre+"-s", a.cfg.Shards)
	claimant := actIn(t, pre+"-c", b.cfg.Shards)
	stressDeposit(t, a, sender, "d1", 900)
	packetID := stressSend(t, a, sender, 900, 1, "s1")
	// The real side knows neither the money nor the packet.
	if st, code := call(t, "POST", a.url+"/v1/packets", api.SendRequest{Sender: sender, Amount: 900, Count: 1, OrderNo: "s2"}, nil); st != 409 || code != "INSUFFICIENT_BALANCE" {
		t.Fatalf("real send from a shadow-funded account: %d %s", st, code)
	}
	if st, code := call(t, "GET", a.url+"/v1/packets/"+packetID, nil, nil); st != 404 || code != "NOT_FOUND" {
		t.Fatalf("real lookup of a shadow packet: %d %s", st, code)
	}
	var claim api.OpenResponse
	if st, code := callH(t, stress, "POST", a.url+"/v1/packets/"+packetID+"/open", api.ActRequest{ActID: claimant}, &claim); st != 200 || claim.Amount != 900 {
		t.Fatalf("stress open: %d %s %+v", st, code, claim)
	}
	waitFor(t, 10*time.Second, func() bool {
		var acct model.Account
		callH(t, stress, "GET", b.url+"/v1/accounts/"+claimant, nil, &acct)
		return acct.Balance == 900
	}, "shadow credit in the other cell")
	if got := b.balance(t, claimant); got != 0 {
		t.Fatalf("real balance of the claimant %d", got)
	}
	shard := sharding.ShardOfAct(claimant)
	var real, shadow int
	b.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_flow_%d WHERE act_id = ?", shard.DB(), shard.Table()), claimant).Scan(&real)
	b.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM shadow_db_%02d.t_flow_%d WHERE act_id = ?", shard.DB(), shard.Table()), claimant).Scan(&shadow)
	if real != 0 || shadow != 1 {
		t.Fatalf("claimant flows: %d real, %d shadow", real, shadow)
	}
}

// postCredits posts credits to a cell's /internal/credits signed with secret at time at.
func postCredits(t *testing.T, url, secret string, at time.Time, credits []model.Credit, out any) (int, string) {
	t.Helper()
	body, _ := json.Marshal(api.CreditsRequest{Credits: credits})
	req := newRequest(nil, "POST", url+"/internal/credits", body)
	api.NewSigner(secret).SignRequest(req, at)
	return exchange(t, req, out)
}
