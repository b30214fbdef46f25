package cell_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/rewardtoken"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// rewardCell starts a cell owning every shard with a reward key file and an
// activities file of two parents: pre+"-fest" (an official child, open
// ended, scenes rain and card) and pre+"-rehearsal" (a gray child, open
// ended, scene rain). It answers the cell and the key file's path.
func rewardCell(t *testing.T, pre string, controlStock bool, tune func(*cell.Config)) (*testCell, string) {
	t.Helper()
	keys, acts := rewardFiles(t, pre, controlStock, 100000)
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.RewardKeys, cfg.Activities = keys, acts
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		if tune != nil {
			tune(cfg)
		}
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	return c, keys
}

// keyFileDir makes a folder with a key file (one active key, k1) and answers
// its path and the path of an activities file beside it, not written yet.
func keyFileDir(t *testing.T) (keys, acts string) {
	t.Helper()
	dir := t.TempDir()
	keys = filepath.Join(dir, "keys.yaml")
	if err := rewardtoken.NewKeyFile(keys, "k1"); err != nil {
		t.Fatal(err)
	}
	return keys, filepath.Join(dir, "activities.yaml")
}

// rewardFiles writes a key file and the activities of rewardCell, with the
// cash scenes' budget.
func rewardFiles(t *testing.T, pre string, controlStock bool, budget int64) (keys, acts string) {
	t.Helper()
	keys, acts = keyFileDir(t)
	yaml := fmt.Sprintf(`activities:
  - id: %[1]s-fest
    children:
      - id: %[1]s-off
        stage: official
        rewards:
          - id: rain
            scenes:
              - {id: %[1]s-rain, award_type: cash, amount: {min: 1, max: 888}, budget: %[3]d, rate_limit: {per_sec: 10000, burst: 1000}, compensate: true, control_stock: %[2]v, pay_into: wallet}
          - id: cards
            scenes:
              - {id: %[1]s-card, award_type: coupon, template_id: tpl-1, amount: {min: 1, max: 1}, stock: 1000, rate_limit: {per_sec: 10000, burst: 1000}, compensate: true, control_stock: %[2]v, pay_into: wallet}
  - id: %[1]s-rehearsal
    children:
      - id: %[1]s-gray
        stage: gray
        rewards:
          - id: rain
            scenes:
              - {id: %[1]s-grain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: 10000, burst: 1000}, compensate: true, control_stock: %[2]v, pay_into: wallet}
`, pre, controlStock, budget)
	if err := os.WriteFile(acts, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return keys, acts
}

// setDegrade sets degrade switches on c's admin port.
func setDegrade(t *testing.T, c *testCell, d api.DegradeSetting) {
	t.Helper()
	if st, code := callAdmin(t, c, "PUT", "/admin/degrade", d, nil); st != 200 {
		t.Fatalf("PUT /admin/degrade %+v: %d %s", d, st, code)
	}
}

func issue(t *testing.T, c *testCell, req api.RewardRequest) (api.RewardResponse, int, string) {
	t.Helper()
	var out api.RewardResponse
	st, code := call(t, "POST", c.url+api.RewardsPath, req, &out)
	return out, st, code
}

func walletOf(t *testing.T, c *testCell, act, stage string) api.WalletResponse {
	t.Helper()
	var w api.WalletResponse
	url := c.url + api.AccountSubPath(act, "wallet")
	if stage != "" {
		url += "?stage=" + stage
	}
	if st, code := call(t, "GET", url, nil, &w); st != 200 {
		t.Fatalf("wallet of %s: %d %s", act, st, code)
	}
	return w
}

// waitBooked waits until act's stage has nothing pending and answers its
// wallet. The booker takes a database an issue marked at its next tick
// (100 ms), even during its scan of every database
// (TestBookerBooksAnIssueDuringItsScan); the limit is far above that.
func waitBooked(t *testing.T, c *testCell, act, stage string) api.WalletResponse {
	t.Helper()
	waitFor(t, 30*time.Second, func() bool { return walletOf(t, c, act, stage).Pending == 0 }, "the rewards of "+act+" booked")
	return walletOf(t, c, act, stage)
}

// TestRewards drives the reward wallet on one cell with the real store:
// issuance (the order number, repeats, every refusal), booking behind,
// stages kept apart, withdrawals with forced booking, the flow listing, the
// client's token copies (known, restored after a loss, refused with a code)
// and issued so far.
func TestRewards(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	c, _ := rewardCell(t, pre, false, nil)
	fest, rain, card := pre+"-fest", pre+"-rain", pre+"-card"
	act := pre + "_alice"

	r1, st, code := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r1", ActID: act, AwardType: "cash", Amount: 500, App: "chat"})
	wantOrder := act + "_" + rain + "_r1_cash_official"
	if st != 200 || r1.OrderNo != wantOrder || r1.Repeat || r1.Status != "pending" || r1.Stage != "official" || r1.Amount != 500 ||
		r1.ChildActivityID != pre+"-off" || !strings.HasPrefix(r1.Token, "v1.k1.") {
		t.Fatalf("issue: %d %s %+v", st, code, r1)
	}
	again, st, _ := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r1", ActID: act, AwardType: "cash", Amount: 500, App: "chat"})
	if st != 200 || !again.Repeat || again.Token != r1.Token || again.CreatedMS != r1.CreatedMS {
		t.Fatalf("repeat: %d %+v, want the first reward as a repeat", st, again)
	}
	for _, bad := range []struct {
		req  api.RewardRequest
		st   int
		code string
	}{
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r1", ActID: act, AwardType: "cash", Amount: 501, App: "chat"}, 409, "ORDER_CONFLICT"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r2", ActID: act, AwardType: "cash", Amount: 889}, 400, "INVALID_ARGUMENT"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r2", ActID: act, AwardType: "cash", Amount: 0}, 400, "INVALID_ARGUMENT"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r2", ActID: act, AwardType: "coupon", Amount: 5}, 400, "INVALID_ARGUMENT"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r_2", ActID: act, AwardType: "cash", Amount: 5}, 400, "INVALID_ARGUMENT"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: "nope", RainID: "r2", ActID: act, AwardType: "cash", Amount: 5}, 404, "NOT_FOUND"},
		{api.RewardRequest{ParentActivityID: "nope", SceneID: rain, RainID: "r2", ActID: act, AwardType: "cash", Amount: 5}, 404, "NOT_FOUND"},
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r2", ActID: "bad act", AwardType: "cash", Amount: 5}, 400, "INVALID_ARGUMENT"},
		// Meant for the gray stage, while the official one is open: refused, never a new official reward.
		{api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r2", ActID: act, AwardType: "cash", Amount: 5, Stage: "gray"}, 409, "NO_ACTIVE_STAGE"},
	} {
		if _, st, code := issue(t, c, bad.req); st != bad.st || code != bad.code {
			t.Errorf("%+v: %d %s, want %d %s", bad.req, st, code, bad.st, bad.code)
		}
	}
	if w := walletOf(t, c, act, ""); w.Stage != "official" || w.Pending+w.Balance != 500 || w.CumulativeIncome != 500 {
		t.Fatalf("wallet right after the issue: %+v", w)
	}
	w := waitBooked(t, c, act, "")
	if w.Balance != 500 || w.Pending != 0 || w.CumulativeIncome != 500 {
		t.Fatalf("wallet after booking: %+v, want 500 booked", w)
	}

	// A coupon kind is booked by its state: no money.
	cp, st, code := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: card, RainID: "r1", ActID: act, AwardType: "coupon", Amount: 1})
	if st != 200 || cp.TemplateID != "tpl-1" || cp.OrderNo != act+"_"+card+"_r1_coupon_official" {
		t.Fatalf("coupon issue: %d %s %+v", st, code, cp)
	}
	// Gray money never shows in the official wallet, nor can it leave.
	if _, st, code := issue(t, c, api.RewardRequest{ParentActivityID: pre + "-rehearsal", SceneID: pre + "-grain", RainID: "r1", ActID: act, AwardType: "cash", Amount: 300}); st != 200 {
		t.Fatalf("gray issue: %d %s", st, code)
	}
	g := waitBooked(t, c, act, "gray")
	if g.Stage != "gray" || g.Balance != 300 || g.CumulativeIncome != 300 {
		t.Fatalf("gray wallet: %+v, want 300 booked", g)
	}
	o := walletOf(t, c, act, "official")
	if o.Balance != 500 || o.CumulativeIncome != 500 || len(o.Stages) != 3 {
		t.Fatalf("official wallet beside a gray reward: %+v, want 500", o)
	}
	var wd api.WithdrawResponse
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "withdraw"), api.WithdrawRequest{Amount: 100, OrderNo: "w0", Stage: "gray"}, &wd); st != 400 {
		t.Errorf("withdraw gray money: %d %s, want 400", st, code)
	}

	// Booking switched off: a reward waits; a withdrawal books it first.
	setDegrade(t, c, api.DegradeSetting{Booking: "off"})
	if _, st, code := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r3", ActID: act, AwardType: "cash", Amount: 88}); st != 200 {
		t.Fatalf("issue r3: %d %s", st, code)
	}
	// Three ticks of the booker (each would have booked it) pass with the
	// reward pending.
	ticks := metric(t, c, `redcell_reward_booker_ticks_total{space="real"}`)
	testenv.WaitFor(t, 10*time.Second, "three ticks of the booker", func() bool {
		return metric(t, c, `redcell_reward_booker_ticks_total{space="real"}`) >= ticks+3
	})
	if w := walletOf(t, c, act, ""); w.Pending != 88 || w.Balance != 500 {
		t.Fatalf("with booking off: %+v, want 88 pending", w)
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "withdraw"), api.WithdrawRequest{Amount: 588, OrderNo: "w1"}, &wd); st != 200 ||
		wd.BookedNow != 1 || wd.Balance != 0 || wd.Repeat {
		t.Fatalf("withdraw all: %d %s %+v, want the pending reward booked first and 0 left", st, code, wd)
	}
	if st, _ := call(t, "POST", c.url+api.AccountSubPath(act, "withdraw"), api.WithdrawRequest{Amount: 588, OrderNo: "w1"}, &wd); st != 200 || !wd.Repeat {
		t.Fatalf("withdraw again: %d %+v, want a repeat", st, wd)
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "withdraw"), api.WithdrawRequest{Amount: 1, OrderNo: "w2"}, nil); st != 409 || code != "INSUFFICIENT_BALANCE" {
		t.Fatalf("withdraw from nothing: %d %s", st, code)
	}
	setDegrade(t, c, api.DegradeSetting{Booking: "on"})

	// The flow: newest first, rewards at their issue time, paged one by one.
	var kinds []string
	cursor := ""
	for range 10 {
		var f api.FlowResponse
		url := c.url + api.AccountSubPath(act, "flow") + "?limit=1"
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		if st, code := call(t, "GET", url, nil, &f); st != 200 {
			t.Fatalf("flow: %d %s", st, code)
		}
		for _, it := range f.Items {
			kinds = append(kinds, fmt.Sprintf("%s:%d:%s", it.Kind, it.Amount, it.Status))
		}
		if cursor = f.NextCursor; cursor == "" {
			break
		}
	}
	want := "[withdraw:-588:booked reward:88:booked reward_coupon:1:booked reward:500:booked]"
	if got := fmt.Sprint(kinds); got != want {
		t.Fatalf("flow pages %s, want %s", got, want)
	}
	setDegrade(t, c, api.DegradeSetting{WalletFlow: "off"})
	if st, code := call(t, "GET", c.url+api.AccountSubPath(act, "flow"), nil, nil); st != 503 || code != "DEGRADED" {
		t.Errorf("flow degraded: %d %s, want 503 DEGRADED", st, code)
	}
	if w := walletOf(t, c, act, ""); !w.FlowDegraded {
		t.Errorf("wallet with the flow degraded: %+v, want flow_degraded", w)
	}
	setDegrade(t, c, api.DegradeSetting{WalletFlow: "on"})

	// "Did this person win": the rewards of one parent.
	var rs api.RewardsResponse
	if st, code := call(t, "GET", c.url+api.AccountSubPath(act, "rewards")+"?parent_activity_id="+fest, nil, &rs); st != 200 || len(rs.Rewards) != 3 {
		t.Fatalf("rewards of %s: %d %s %+v, want 3", fest, st, code, rs)
	}

	// Issued so far, from the cell's counters.
	var is api.IssuedResponse
	if st, code := call(t, "GET", c.url+api.IssuedPath(fest), nil, &is); st != 200 || len(is.Scenes) != 2 || is.Scenes[0].Issued != 588 || is.Scenes[1].Issued != 1 {
		t.Fatalf("issued: %d %s %+v, want rain 588 and card 1", st, code, is)
	}
}

// TestRewardTokens: the client's copies of its tokens. A token the cell has
// is known; one it lost (its row deleted here) is restored and booked once;
// an altered one, another person's, and one signed by a key the cell does
// not know are refused, each with its code, and the answer is 422. Each
// refusal is counted by code; with the token_restore switch off a lost
// token is refused, not restored. The reward metrics count the issues, the
// booker's bookings and their lag, the restores and each scene's budget
// left.
func TestRewardTokens(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	c, _ := rewardCell(t, pre, false, nil)
	fest, rain := pre+"-fest", pre+"-rain"
	act, other := pre+"-bob", pre+"-carol"
	var toks []string
	for i, amt := range []int64{100, 200} {
		r, st, code := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: fmt.Sprintf("r%d", i), ActID: act, AwardType: "cash", Amount: amt})
		if st != 200 {
			t.Fatalf("issue: %d %s", st, code)
		}
		toks = append(toks, r.Token)
	}
	theirs, _, _ := issue(t, c, api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r0", ActID: other, AwardType: "cash", Amount: 5})
	// A stress-test reward of this person (the shadow tables): its token is
	// never taken back as real money.
	var stress api.RewardResponse
	if st, code := callH(t, map[string]string{api.HeaderStress: "1"}, "POST", c.url+api.RewardsPath,
		api.RewardRequest{ParentActivityID: fest, SceneID: rain, RainID: "r7", ActID: act, AwardType: "cash", Amount: 888}, &stress); st != 200 {
		t.Fatalf("stress issue: %d %s", st, code)
	}
	waitBooked(t, c, act, "")
	// The booker books the three real rewards, each observed in the lag.
	waitFor(t, 30*time.Second, func() bool {
		return metricValue(t, scrape(t, c.adminURL), `redcell_reward_booked_total{space="real"}`) == "3"
	}, "three real rewards booked")
	wantMetric(t, scrape(t, c.adminURL), `redcell_reward_booking_lag_seconds_count{space="real"}`, "3")

	var res api.TokensResponse
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "tokens"), api.TokensRequest{Tokens: toks}, &res); st != 200 ||
		len(res.Results) != 2 || res.Results[0].Result != "known" || res.Results[1].Result != "known" {
		t.Fatalf("known tokens: %d %s %+v", st, code, res)
	}
	// The cell loses the second reward's row; the client's copy brings it back.
	sh := sharding.ShardOfAct(act)
	order := act + "_" + rain + "_r1_cash_official"
	exec(t, c.db, fmt.Sprintf("DELETE FROM db_%02d.t_reward WHERE order_no = ?", sh.DB()), order)
	exec(t, c.db, fmt.Sprintf("DELETE FROM db_%02d.t_flow_%d WHERE act_id = ? AND order_no = ?", sh.DB(), sh.Table()), act, model.RewardFlowOrderNo(order))
	exec(t, c.db, fmt.Sprintf("UPDATE db_%02d.t_account_%d SET balance = balance - 200 WHERE act_id = ?", sh.DB(), sh.Table()), act)
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "tokens"), api.TokensRequest{Tokens: toks}, &res); st != 200 ||
		res.Results[0].Result != "known" || res.Results[1].Result != "restored" {
		t.Fatalf("a lost token: %d %s %+v, want known and restored", st, code, res)
	}
	if st, _ := call(t, "POST", c.url+api.AccountSubPath(act, "tokens"), api.TokensRequest{Tokens: toks[1:]}, &res); st != 200 || res.Results[0].Result != "known" {
		t.Fatalf("the restored token again: %d %+v, want known", st, res)
	}
	if w := walletOf(t, c, act, ""); w.Balance != 300 || w.Pending != 0 {
		t.Fatalf("wallet after the restore: %+v, want 300, each reward once", w)
	}
	m := scrape(t, c.adminURL)
	wantMetric(t, m, `redcell_reward_tokens_restored_total{space="real"}`, "1")
	wantMetric(t, m, `redcell_reward_issued_total{space="real"}`, "4") // three issued, one restored
	wantMetric(t, m, `redcell_reward_issued_total{space="shadow"}`, "1")
	// The scene's budget less what was issued (the restore re-issues what
	// its first issue counted already).
	left := func(space string) string {
		return fmt.Sprintf(`redcell_reward_budget_left{award_type="cash",child="%[1]s-off",parent="%[1]s-fest",scene="%[1]s-rain",space="%[2]s"}`, pre, space)
	}
	wantMetric(t, m, left("real"), "99695")
	wantMetric(t, m, left("shadow"), "99112")

	// Refusals, each with its code, in one 422 answer.
	altered := []byte(toks[0])
	i := strings.LastIndexByte(toks[0], '.') - 3
	altered[i] ^= 1
	forgedKeys := filepath.Join(t.TempDir(), "k.yaml")
	if err := rewardtoken.NewKeyFile(forgedKeys, "k9"); err != nil {
		t.Fatal(err)
	}
	ring, err := rewardtoken.LoadRing(forgedKeys)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := ring.Sign(rewardtoken.Claims{ActID: act, OrderNo: act + "_" + rain + "_r9_cash_official", Amount: 888, Stage: "official"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(api.TokensRequest{Tokens: []string{toks[0], string(altered), theirs.Token, forged, "junk", stress.Token}})
	req := newRequest(nil, "POST", c.url+api.AccountSubPath(act, "tokens"), raw)
	signer.SignRequest(req, time.Now())
	resp, err := roundTrip(t, req)
	if err != nil {
		t.Fatal(err)
	}
	res = api.TokensResponse{}
	if err := json.Unmarshal(resp.Body(), &res); err != nil {
		t.Fatalf("422 body %s: %v", resp.Body(), err)
	}
	st, code := resp.StatusCode(), string(resp.Header.Peek(api.HeaderCode))
	if res.Error == nil || res.Error.Code != code {
		t.Errorf("the 422 body's error %+v, header code %s", res.Error, code)
	}
	got := []string{}
	for _, r := range res.Results {
		got = append(got, r.Result+":"+r.Code)
	}
	want := "[known: refused:TOKEN_BAD_SIGNATURE refused:TOKEN_WRONG_ACCOUNT refused:TOKEN_UNKNOWN_KEY refused:TOKEN_MALFORMED refused:TOKEN_WRONG_SPACE]"
	if st != 422 || code != "TOKEN_REFUSED" || fmt.Sprint(got) != want || res.Error == nil {
		t.Fatalf("refusals: %d %s %v, want 422 TOKEN_REFUSED %s", st, code, got, want)
	}
	if w := walletOf(t, c, act, ""); w.Balance != 300 {
		t.Fatalf("wallet after refused tokens: %+v, want 300", w)
	}
	refusedMetric := func(code string) string {
		return fmt.Sprintf(`redcell_reward_tokens_refused_total{code=%q,space="real"}`, code)
	}
	m = scrape(t, c.adminURL)
	for code, n := range map[string]string{"TOKEN_BAD_SIGNATURE": "1", "TOKEN_WRONG_ACCOUNT": "1", "TOKEN_UNKNOWN_KEY": "1",
		"TOKEN_MALFORMED": "1", "TOKEN_WRONG_SPACE": "1", "TOKEN_MISMATCH": "0", "TOKEN_EXPIRED": "0", "TOKEN_RESTORE_OFF": "0"} {
		wantMetric(t, m, refusedMetric(code), n)
	}

	// The token_restore switch off (a signing key may have leaked): a valid
	// token whose reward the cell lost is refused, counted, and nothing is
	// stored; a known one still answers known. Back on, it is restored.
	setDegrade(t, c, api.DegradeSetting{TokenRestore: "off"})
	wantMetric(t, scrape(t, c.adminURL), `redcell_degrade_switch{switch="token_restore"}`, "1")
	order = act + "_" + rain + "_r0_cash_official"
	exec(t, c.db, fmt.Sprintf("DELETE FROM db_%02d.t_reward WHERE order_no = ?", sh.DB()), order)
	exec(t, c.db, fmt.Sprintf("DELETE FROM db_%02d.t_flow_%d WHERE act_id = ? AND order_no = ?", sh.DB(), sh.Table()), act, model.RewardFlowOrderNo(order))
	exec(t, c.db, fmt.Sprintf("UPDATE db_%02d.t_account_%d SET balance = balance - 100 WHERE act_id = ?", sh.DB(), sh.Table()), act)
	raw, _ = json.Marshal(api.TokensRequest{Tokens: toks})
	req = newRequest(nil, "POST", c.url+api.AccountSubPath(act, "tokens"), raw)
	signer.SignRequest(req, time.Now())
	if resp, err = roundTrip(t, req); err != nil {
		t.Fatal(err)
	}
	res = api.TokensResponse{}
	if err := json.Unmarshal(resp.Body(), &res); err != nil {
		t.Fatalf("422 body %s: %v", resp.Body(), err)
	}
	if st, code := resp.StatusCode(), string(resp.Header.Peek(api.HeaderCode)); st != 422 || code != "TOKEN_REFUSED" ||
		len(res.Results) != 2 || res.Results[0].Code != "TOKEN_RESTORE_OFF" || res.Results[1].Result != "known" {
		t.Fatalf("a lost token with token_restore off: %d %s %+v, want it refused TOKEN_RESTORE_OFF, the other known", st, code, res)
	}
	if w := walletOf(t, c, act, ""); w.Balance != 200 {
		t.Fatalf("wallet with token_restore off: %+v, want 200 (nothing restored)", w)
	}
	m = scrape(t, c.adminURL)
	wantMetric(t, m, refusedMetric("TOKEN_RESTORE_OFF"), "1")
	wantMetric(t, m, `redcell_reward_tokens_restored_total{space="real"}`, "1")
	setDegrade(t, c, api.DegradeSetting{TokenRestore: "on"})
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "tokens"), api.TokensRequest{Tokens: toks}, &res); st != 200 ||
		res.Results[0].Result != "restored" || res.Results[1].Result != "known" {
		t.Fatalf("the lost token with token_restore back on: %d %s %+v, want restored and known", st, code, res)
	}
	if w := walletOf(t, c, act, ""); w.Balance != 300 {
		t.Fatalf("wallet after the restore: %+v, want 300", w)
	}
	wantMetric(t, scrape(t, c.adminURL), `redcell_reward_tokens_restored_total{space="real"}`, "2")
}

// TestWithdrawRelease: the gray release lets only the allow-list and the
// released share of act_ids withdraw; others are refused cleanly.
func TestWithdrawRelease(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	in, out := pre+"-in", pre+"-out"
	c, _ := rewardCell(t, pre, false, func(cfg *cell.Config) { cfg.WithdrawRelease = cell.WithdrawRelease{Percent: 0, Allow: []string{in}} })
	for _, act := range []string{in, out} {
		var d model.Deposit
		if st, code := call(t, "POST", c.url+api.DepositPath(act), api.DepositRequest{Amount: 50, OrderNo: "d1"}, &d); st != 200 {
			t.Fatalf("deposit: %d %s", st, code)
		}
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(in, "withdraw"), api.WithdrawRequest{Amount: 50, OrderNo: "w1"}, nil); st != 200 {
		t.Errorf("an allowed act_id: %d %s", st, code)
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(out, "withdraw"), api.WithdrawRequest{Amount: 50, OrderNo: "w1"}, nil); st != 403 || code != "WITHDRAW_NOT_RELEASED" {
		t.Errorf("an act_id not released: %d %s, want 403 WITHDRAW_NOT_RELEASED", st, code)
	}
	var bal model.Account
	if call(t, "GET", c.url+api.AccountPath(out), nil, &bal); bal.Balance != 50 {
		t.Errorf("the refused act_id's balance: %d, want 50", bal.Balance)
	}
	// Released no more, the allowed act_id's retry still answers its first result.
	if st, code := callAdmin(t, c, "PUT", "/admin/withdraw", api.WithdrawRelease{Percent: 0, Allow: []string{}}, nil); st != 200 {
		t.Fatalf("PUT /admin/withdraw: %d %s", st, code)
	}
	var w api.WithdrawResponse
	if st, code := call(t, "POST", c.url+api.AccountSubPath(in, "withdraw"), api.WithdrawRequest{Amount: 50, OrderNo: "w1"}, &w); st != 200 || !w.Repeat || w.Balance != 0 {
		t.Errorf("a retry once no longer released: %d %s %+v, want the first result as a repeat", st, code, w)
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(in, "withdraw"), api.WithdrawRequest{Amount: 49, OrderNo: "w1"}, nil); st != 409 || code != "ORDER_CONFLICT" {
		t.Errorf("another amount under it: %d %s, want 409 ORDER_CONFLICT", st, code)
	}
	if st, code := call(t, "POST", c.url+api.AccountSubPath(in, "withdraw"), api.WithdrawRequest{Amount: 1, OrderNo: "w2"}, nil); st != 403 || code != "WITHDRAW_NOT_RELEASED" {
		t.Errorf("a new withdrawal once no longer released: %d %s, want 403", st, code)
	}
}

// TestRewardBudgetAcrossCells: two cells issue against one scene's budget of
// 10,000 cents, 100 cents a reward, concurrently; the scene's home is one of
// them, so the other takes its leases over HTTP. The reserve (a tenth)
// stops issuing at 9,000: at most 90 rewards are issued, the rest answer
// BUDGET_EXHAUSTED, and the rows agree: the rewards' sum is what was
// answered, the leases granted never pass the budget less its reserve, and
// what they hold out covers every reward.
func TestRewardBudgetAcrossCells(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	keys, acts := rewardFiles(t, pre, true, 10_000)
	a, b := twoCells(t, func(cfg *cell.Config) { cfg.RewardKeys, cfg.Activities = keys, acts })
	cellOf := func(act string) *testCell {
		if sharding.ShardOfAct(act) < 500 {
			return a
		}
		return b
	}
	const people = 120
	type result struct {
		st   int
		code string
	}
	results := make(chan result, people)
	work := make(chan string, people)
	for i := range people {
		work <- fmt.Sprintf("%s-p%03d", pre, i)
	}
	close(work)
	for range 8 {
		go func() {
			for act := range work {
				_, st, code := issue(t, cellOf(act), api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: "r1",
					ActID: act, AwardType: "cash", Amount: 100})
				results <- result{st, code}
			}
		}()
	}
	issued, exhausted := 0, 0
	for range people {
		r := <-results
		switch {
		case r.st == 200:
			issued++
		case r.code == "BUDGET_EXHAUSTED":
			exhausted++
		default:
			t.Errorf("issue: %d %s", r.st, r.code)
		}
	}
	// Leases a cell holds when the other has run out may be left unspent
	// (under-issue by design); never more than the budget less its reserve.
	if issued > 90 || issued < 70 || issued+exhausted != people {
		t.Fatalf("%d issued, %d exhausted; want 70..90 issued and the rest exhausted (budget 10,000 less a reserve of 1,000, 100 a reward)", issued, exhausted)
	}
	var sum int64
	for _, c := range []*testCell{a, b} {
		for db := 0; db < 100; db++ {
			var n sql.NullInt64
			err := c.db.QueryRow(fmt.Sprintf("SELECT SUM(amount) FROM db_%02d.t_reward WHERE scene_id = ?", db), pre+"-rain").Scan(&n)
			if err == nil {
				sum += n.Int64
			}
		}
	}
	if sum != int64(issued)*100 {
		t.Fatalf("rewards' rows sum to %d, want %d", sum, issued*100)
	}
	key := model.BudgetKey(pre+"-fest", pre+"-off", pre+"-rain")
	home := a
	if sh := sharding.BudgetShard(key); sh >= 500 {
		home = b
	}
	var total, granted, returned int64
	sh := sharding.BudgetShard(key)
	if err := home.db.QueryRow(fmt.Sprintf("SELECT total, granted, returned FROM db_%02d.t_budget WHERE budget_key = ?", sh.DB()), key).Scan(&total, &granted, &returned); err != nil {
		t.Fatalf("budget row of %s: %v", key, err)
	}
	if total != 10_000 || granted > 9_000 || granted-returned < sum {
		t.Fatalf("budget row: total %d granted %d returned %d; want 10,000, granted <= 9,000 and at least the %d issued out", total, granted, returned, sum)
	}
}

// TestRewardLeasesSettledAfterRestart: leases an earlier run of a cell held
// (made here through the store, as a run that died would leave them: one
// lease of 500 with 200 issued from it, one of 300 with nothing issued),
// past their expiry, are marked expired by their home and settled a few
// seconds after the cell starts: each returns exactly what its reward rows
// did not spend, once.
func TestRewardLeasesSettledAfterRestart(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	keys, acts := rewardFiles(t, pre, true, 100_000)
	key := model.BudgetKey(pre+"-fest", pre+"-off", pre+"-rain")
	sh := sharding.BudgetShard(key)
	st, err := storage.Open(testenv.MySQLDSN(t, 1), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if _, err := storage.SetBudget(ctx, st, sh, key, 100_000); err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(-time.Minute).UnixMilli() // expired a minute ago: past the settling grace
	l1, err := storage.GrantLease(ctx, st, sh, key, "solo", 500, 10_000, far)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := storage.GrantLease(ctx, st, sh, key, "solo", 300, 10_000, far)
	if err != nil {
		t.Fatal(err)
	}
	for i, amt := range []model.Cents{150, 50} {
		act := fmt.Sprintf("%s-s%d", pre, i)
		r := model.Reward{ActID: act, Shard: sharding.ShardOfAct(act), Parent: pre + "-fest", Child: pre + "-off", Stage: "official",
			Scene: pre + "-rain", Rain: "r1", AwardType: "cash", Amount: amt, LeaseID: l1.ID}
		r.OrderNo = model.RewardOrderNo(act, r.Scene, r.Rain, r.AwardType, r.Stage)
		if _, _, err := storage.IssueReward(ctx, st, r); err != nil {
			t.Fatal(err)
		}
	}
	// The leases are older than the cell's start: it starts in a later
	// millisecond than their grants'.
	granted := time.Now().UnixMilli()
	testenv.WaitFor(t, time.Second, "a millisecond past the grants", func() bool { return time.Now().UnixMilli() > granted })
	oneCell(t, func(cfg *cell.Config) { cfg.RewardKeys, cfg.Activities = keys, acts })
	var b model.Budget
	var ls []model.Lease
	waitFor(t, 10*time.Second, func() bool {
		b, ls, err = storage.Budget(ctx, st, sh, key)
		return err == nil && len(ls) == 2 && ls[0].State == model.LeaseReturned && ls[1].State == model.LeaseReturned
	}, "the earlier run's leases returned")
	un := map[string]int64{ls[0].ID: ls[0].Unspent, ls[1].ID: ls[1].Unspent}
	if un[l1.ID] != 300 || un[l2.ID] != 300 || b.Granted != 800 || b.Returned != 600 {
		t.Fatalf("after settling: budget %+v, unspent %v; want 300 back from each lease (800 granted, 600 returned)", b, un)
	}
}

// TestForceBook: with the booker off, a person's pending rewards are booked
// by POST .../book at once, each once: a second call books nothing.
func TestForceBook(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	c, _ := rewardCell(t, pre, true, func(cfg *cell.Config) { cfg.Degrade.Booking = true })
	act := pre + "-fb"
	for i, amt := range []int64{70, 30} {
		if _, st, code := issue(t, c, api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: fmt.Sprintf("r%d", i),
			ActID: act, AwardType: "cash", Amount: amt}); st != 200 {
			t.Fatalf("issue: %d %s", st, code)
		}
	}
	var b api.BookResponse
	if st, code := call(t, "POST", c.url+api.AccountSubPath(act, "book"), nil, &b); st != 200 || b.BookedNow != 2 || b.Balance != 100 {
		t.Fatalf("book: %d %s %+v, want 2 booked and 100", st, code, b)
	}
	if st, _ := call(t, "POST", c.url+api.AccountSubPath(act, "book"), nil, &b); st != 200 || b.BookedNow != 0 || b.Balance != 100 {
		t.Fatalf("book again: %d %+v, want nothing more", st, b)
	}
	if w := walletOf(t, c, act, ""); w.Pending != 0 || w.Balance != 100 {
		t.Fatalf("wallet: %+v", w)
	}
}
