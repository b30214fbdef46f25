package cell_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// freshRounds is how many rounds of freshBurst identical requests each
// idempotent entry gets under each open strategy in TestFreshOnce.
const (
	freshRounds = 20
	freshBurst  = 20
)

// freshEntry is one idempotent entry as TestFreshOnce drives it: the
// request of a round (one idempotency key per round) and the fields of the
// answer that name the operation (the same in every answer of a round).
type freshEntry struct {
	name    string
	method  string
	headers map[string]string
	path    func(round int) string
	body    func(round int) any
	same    []string // answer fields every answer of a round shares
	queued  bool     // the fresh answer is 202 (a coupon request queued), repeats 200
	rows    func(t *testing.T)
}

// freshAnswer is one answer of a burst: its status, error code, repeat
// field (nil when missing) and the fields that name the operation.
type freshAnswer struct {
	status int
	code   string
	repeat *bool
	same   string
}

// TestFreshOnce: every idempotent entry (deposit, withdraw, send, open,
// reward, identity bind, coupon issue queued and green) answers exactly one
// of freshBurst identical requests sent at once as new ("repeat": false; a
// queued coupon request 202) and every other as a repeat of the same
// operation, for freshRounds rounds; then the rows hold one operation per
// key and the balances that follow from it. Every entry runs under each
// open strategy (naive, serial, batched, grouped). The grouped strategy's reward issue answered a request stored
// by an earlier group as new again (its token and time matched the stored
// row's); a withdrawal that emptied the wallet refused its concurrent
// repeats INSUFFICIENT_BALANCE.
func TestFreshOnce(t *testing.T) {
	pre := testenv.Prefix()
	keys, acts := rewardFiles(t, pre, false, 1_000_000)
	batches := filepath.Join(t.TempDir(), "coupons.yaml")
	if err := os.WriteFile(batches, []byte(fmt.Sprintf("batches:\n  - {id: %s-b, stock: 100000, face_value: 1, per_person_limit: 1}\n", pre)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.RewardKeys, cfg.Activities, cfg.Coupons, cfg.IdentityKey = keys, acts, batches, testIdentityKey
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		// This test checks answers, not shedding: a loaded machine (the race
		// detector, other tests' servers) must not turn a burst into timeouts.
		cfg.RequestTimeout, cfg.QueueWaitMax = 30*time.Second, 30*time.Second
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")

	for k, strategy := range []string{cell.StrategyNaive, cell.StrategySerial, cell.StrategyBatched, cell.StrategyGrouped} {
		body := fmt.Sprintf(`{"strategy":%q,"batch_max":128,"batch_wait_ms":1,"group_max":64,"group_wait_ms":1}`, strategy)
		if code, errCode := adminCall(t, c, "PUT", "Bearer "+adminToken, body, false, nil); code != 200 {
			t.Fatalf("switch to %s: %d %s", strategy, code, errCode)
		}
		t.Run(strategy, func(t *testing.T) { freshUnder(t, c, pre, fmt.Sprintf("%s-%d", pre, k)) })
	}
}

// freshUnder runs TestFreshOnce's rounds under the strategy set now, with
// act_ids, order numbers and serials made from p (pre names the test's
// activities and batch), then checks each entry's rows.
func freshUnder(t *testing.T, c *testCell, pre, p string) {
	entries := freshEntries(t, c, pre, p)
	slow := map[string]time.Duration{} // each entry's slowest answer, logged: a slow run says why
	var slowMu sync.Mutex
	defer func() { t.Logf("slowest answers: %v", slow) }()
	for r := range freshRounds {
		// Every entry's burst of the round at once: one gate opens them all.
		gate := make(chan struct{})
		answers := make([][]freshAnswer, len(entries))
		var wg sync.WaitGroup
		for i, e := range entries {
			answers[i] = make([]freshAnswer, freshBurst)
			raw, _ := json.Marshal(e.body(r))
			for j := range freshBurst {
				wg.Go(func() {
					req := newRequest(e.headers, e.method, c.url+e.path(r), raw)
					signer.SignRequest(req, time.Now())
					<-gate
					t0 := time.Now()
					answers[i][j] = freshDo(t, req, e.same)
					slowMu.Lock()
					slow[e.name] = max(slow[e.name], time.Since(t0))
					slowMu.Unlock()
				})
			}
		}
		close(gate)
		wg.Wait()
		for i, e := range entries {
			checkBurst(t, fmt.Sprintf("%s round %d", e.name, r), e, answers[i])
		}
		if t.Failed() {
			return
		}
	}
	for _, e := range entries {
		e.rows(t)
	}
}

// freshEntries are the idempotent entries of TestFreshOnce, each with the
// check of the rows its freshRounds rounds leave: one flow per deposit,
// withdrawal and send order, one packet per send, one claim per opener, one
// reward per rain, one binding per app user, one request per coupon serial
// and at most one coupon (one when green: decided at once), and every
// balance. The wallets that pay are funded here.
func freshEntries(t *testing.T, c *testCell, pre, p string) []freshEntry {
	const depositCents, withdrawCents, sendCents, rewardCents = 7, 3, 10, 5
	dep, wd, snd, fan, rw := p+"-dep", p+"-wd", p+"-snd", p+"-fan", p+"-rw"
	c.deposit(t, wd, freshRounds*withdrawCents)
	c.deposit(t, snd, freshRounds*sendCents)
	c.deposit(t, fan, 2000)
	packet := c.send(t, fan, 2000, freshRounds, "fan")
	app := strings.ReplaceAll(p, "-", "") + "app"
	count := func(t *testing.T, q string, args ...any) (n, sum int64) {
		t.Helper()
		if err := c.db.QueryRow(q, args...).Scan(&n, &sum); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n, sum
	}
	// flows checks act's flows of kind, their count and sum, and its balance.
	flows := func(act string, kind model.FlowKind, cents, balance int64) func(t *testing.T) {
		return func(t *testing.T) {
			s := sharding.ShardOfAct(act)
			q := fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = ?", s.DB(), s.Table())
			if n, sum := count(t, q, act, string(kind)); n != freshRounds || sum != freshRounds*cents {
				t.Errorf("%s flows of %s: %d rows of %d cents, want %d of %d", kind, act, n, sum, freshRounds, freshRounds*cents)
			}
			if got := c.balance(t, act); got != balance {
				t.Errorf("balance of %s: %d, want %d", act, got, balance)
			}
		}
	}
	sendRows := func(t *testing.T) {
		flows(snd, model.FlowSend, -sendCents, 0)(t)
		// Each send order's flow names its packet: one row each.
		s := sharding.ShardOfAct(snd)
		sent := listStrings(t, c.db, fmt.Sprintf("SELECT ref FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = ?", s.DB(), s.Table()), snd, string(model.FlowSend))
		for _, id := range sent {
			ref, err := model.ParsePacketID(id)
			if err != nil {
				t.Fatal(err)
			}
			q := fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM db_%02d.t_packet_%d_%02d WHERE packet_id = ? AND sender = ?", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
			if n, sum := count(t, q, id, snd); n != 1 || sum != sendCents {
				t.Errorf("packet %s: %d rows of %d cents, want 1 of %d", id, n, sum, sendCents)
			}
		}
	}
	couponRows := func(green bool) func(t *testing.T) {
		return func(t *testing.T) {
			for r := range freshRounds {
				act := fmt.Sprintf("%s-cq%v-%d", p, green, r)
				db := sharding.ShardOfAct(act).DB()
				if n, _ := count(t, fmt.Sprintf("SELECT COUNT(*), 0 FROM db_%02d.t_coupon_req WHERE act_id = ?", db), act); n != 1 {
					t.Errorf("coupon requests of %s: %d, want 1", act, n)
				}
				if n, _ := count(t, fmt.Sprintf("SELECT COUNT(*), 0 FROM db_%02d.t_coupon_req WHERE act_id = ? AND state = 'issued' AND coupon_id <> ''", db), act); n > 1 || green && n != 1 {
					t.Errorf("coupons of %s: %d, want one (green: decided at once) or, queued, at most one", act, n)
				}
			}
		}
	}
	coupon := func(green bool) func(int) any {
		return func(r int) any {
			return api.CouponIssueRequest{ActID: fmt.Sprintf("%s-cq%v-%d", p, green, r), BatchID: pre + "-b", SerialNo: fmt.Sprintf("s%v%d", green, r), Green: green}
		}
	}
	couponPath := func(int) string { return api.CouponIssuePath }
	appHeader := map[string]string{api.HeaderApp: app}
	return []freshEntry{
		{name: "deposit", method: "POST", path: func(int) string { return api.AccountSubPath(dep, "deposit") },
			body: func(r int) any { return api.DepositRequest{Amount: depositCents, OrderNo: fmt.Sprintf("d%d", r)} },
			same: []string{"order_no", "amount", "balance"}, rows: flows(dep, model.FlowDeposit, depositCents, freshRounds*depositCents)},
		{name: "withdraw", method: "POST", path: func(int) string { return api.AccountSubPath(wd, "withdraw") },
			body: func(r int) any { return api.WithdrawRequest{Amount: withdrawCents, OrderNo: fmt.Sprintf("w%d", r)} },
			same: []string{"order_no", "amount", "balance"}, rows: flows(wd, model.FlowWithdraw, -withdrawCents, 0)},
		{name: "send", method: "POST", path: func(int) string { return "/v1/packets" },
			body: func(r int) any {
				return api.SendRequest{Sender: snd, Amount: sendCents, Count: 2, Kind: "random", OrderNo: fmt.Sprintf("s%d", r)}
			},
			same: []string{"packet_id", "amount", "count"}, rows: sendRows},
		{name: "open", method: "POST", path: func(int) string { return api.OpenPath(packet) },
			body: func(r int) any { return api.ActRequest{ActID: fmt.Sprintf("%s-o%d", p, r)} },
			same: []string{"claim_id", "amount", "seq"},
			rows: func(t *testing.T) {
				if sum, n, _ := claimRows(t, c.db, packet); n != freshRounds || sum != 2000 {
					t.Errorf("claims of %s: %d of %d cents, want %d of 2000", packet, n, sum, freshRounds)
				}
				// Each claim is credited once, by this cell's relay (it owns every
				// shard): no claim is left uncredited to a later test's cells.
				var claims api.PacketResponse
				if st, code := call(t, "GET", c.url+"/v1/packets/"+packet+"?limit=100", nil, &claims); st != 200 || len(claims.Claims) != freshRounds {
					t.Fatalf("claims of %s: %d %s, %d claims", packet, st, code, len(claims.Claims))
				}
				for _, cl := range claims.Claims {
					waitFor(t, 60*time.Second, func() bool { return hasCredit(t, c.db, "", cl.ActID, cl.ID) }, "the credit of claim "+cl.ID)
					if got := c.balance(t, cl.ActID); got != int64(cl.Amount) {
						t.Errorf("balance of opener %s: %d, want its claim's %d", cl.ActID, got, cl.Amount)
					}
				}
			}},
		{name: "reward", method: "POST", path: func(int) string { return api.RewardsPath },
			body: func(r int) any {
				return api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: fmt.Sprintf("r%d", r),
					ActID: rw, AwardType: "cash", Amount: rewardCents}
			},
			same: []string{"order_no", "token", "amount", "created_ms"},
			rows: func(t *testing.T) {
				q := fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM db_%02d.t_reward WHERE act_id = ?", sharding.ShardOfAct(rw).DB())
				if n, sum := count(t, q, rw); n != freshRounds || sum != freshRounds*rewardCents {
					t.Errorf("rewards of %s: %d of %d cents, want %d of %d", rw, n, sum, freshRounds, freshRounds*rewardCents)
				}
			}},
		{name: "identity", method: "PUT", path: func(r int) string { return api.IdentityPath(app, fmt.Sprintf("u%d", r)) },
			body: func(r int) any { return map[string]string{"phone": fmt.Sprintf("+86139%08d", freshPhone(p, r))} },
			same: []string{"act_id", "created_at_ms"},
			rows: func(t *testing.T) {
				for r := range freshRounds {
					user := fmt.Sprintf("u%d", r)
					s := sharding.ShardOfIdentity(app, user)
					q := fmt.Sprintf("SELECT COUNT(*), 0 FROM db_%02d.t_identity_%d WHERE app = ? AND app_user_id = ?", s.DB(), s.Table())
					if n, _ := count(t, q, app, user); n != 1 {
						t.Errorf("bindings of %s/%s: %d, want 1", app, user, n)
					}
				}
			}},
		{name: "coupon", method: "POST", headers: appHeader, path: couponPath, body: coupon(false),
			same: []string{"serial_no", "act_id", "accepted_ms"}, queued: true, rows: couponRows(false)},
		{name: "coupon_green", method: "POST", headers: appHeader, path: couponPath, body: coupon(true),
			same: []string{"serial_no", "act_id", "accepted_ms"}, rows: couponRows(true)},
	}
}

// freshPhone is a phone number's last 8 digits for round r of prefix p.
func freshPhone(p string, r int) int {
	h := 0
	for _, ch := range p {
		h = (h*31 + int(ch)) % 1_000_000
	}
	return h*100 + r
}

// freshDo sends req and reads its answer: status, error code, the repeat
// field and the fields named by same, joined.
func freshDo(t *testing.T, req *fasthttp.Request, same []string) freshAnswer {
	resp, err := roundTrip(t, req)
	if err != nil {
		t.Errorf("%s %s: %v", req.Header.Method(), req.URI(), err)
		return freshAnswer{code: "TRANSPORT"}
	}
	a := freshAnswer{status: resp.StatusCode()}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(resp.Body()))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Errorf("%s %s: %d %s: %v", req.Header.Method(), req.URI(), a.status, resp.Body(), err)
		return a
	}
	if a.status != http.StatusOK && a.status != http.StatusAccepted {
		if e, ok := m["error"].(map[string]any); ok {
			a.code, _ = e["code"].(string)
		}
		return a
	}
	if v, ok := m["repeat"].(bool); ok {
		a.repeat = &v
	}
	parts := make([]string, len(same))
	for i, f := range same {
		parts[i] = fmt.Sprintf("%s=%v", f, m[f])
	}
	a.same = strings.Join(parts, " ")
	return a
}

// checkBurst asserts one fresh answer among a burst's and every other a
// repeat of the same operation.
func checkBurst(t *testing.T, what string, e freshEntry, answers []freshAnswer) {
	t.Helper()
	fresh := 0
	for _, a := range answers {
		switch {
		case a.repeat == nil:
			t.Errorf("%s: answer %d %s without a repeat field", what, a.status, a.code)
			continue
		case !*a.repeat:
			fresh++
			if want := map[bool]int{false: http.StatusOK, true: http.StatusAccepted}[e.queued]; a.status != want {
				t.Errorf("%s: the fresh answer is %d, want %d", what, a.status, want)
			}
		case a.status != http.StatusOK:
			t.Errorf("%s: a repeat answered %d, want 200", what, a.status)
		}
		if a.same != answers[0].same {
			t.Errorf("%s: answers name two operations: %s and %s", what, answers[0].same, a.same)
		}
	}
	if fresh != 1 {
		t.Errorf("%s: %d of %d identical requests answered new, want exactly 1", what, fresh, len(answers))
	}
}
