package cell_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// sceneFiles writes a key file and an activities file of one parent
// pre+"-fest" with an open-ended official child whose reward holds scenes
// (each a YAML flow map); it answers both paths.
func sceneFiles(t *testing.T, pre string, scenes ...string) (keys, acts string) {
	t.Helper()
	keys, acts = keyFileDir(t)
	writeScenes(t, acts, pre, scenes...)
	return keys, acts
}

func writeScenes(t *testing.T, path, pre string, scenes ...string) {
	t.Helper()
	yaml := fmt.Sprintf("activities:\n  - id: %[1]s-fest\n    children:\n      - id: %[1]s-off\n        stage: official\n"+
		"        rewards:\n          - id: rain\n            scenes:\n", pre)
	for _, sc := range scenes {
		yaml += "              - " + sc + "\n"
	}
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

// reloadActivities reloads c's activities file on its admin port.
func reloadActivities(t *testing.T, c *testCell) api.ActivitiesResponse {
	t.Helper()
	return adminAnswer[api.ActivitiesResponse](t, c, "POST", "/admin/activities/reload")
}

// actsOf answers n act_ids of c's shards, each new.
func actsOf(c *testCell, pre string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if a := fmt.Sprintf("%s_p%d", pre, i); c.cfg.Shards.Contains(sharding.ShardOfAct(a)) {
			out = append(out, a)
		}
	}
	return out
}

// A scene's rate_limit holds for the cluster: two cells sharing memcached,
// offered a scene at 1/s with a burst of 4, accept at most 4 + 1·T together
// (each cell kept its own bucket before, and accepted 4 at once); the rest
// are 429 SCENE_RATE_LIMITED, with nothing stored. A reload raising the rate
// holds on both cells from the next request.
func TestSceneRateLimitAcrossCells(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	scene := func(perSec, burst int) string {
		return fmt.Sprintf("{id: %s-rain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: %d, burst: %d}, pay_into: wallet}",
			pre, perSec, burst)
	}
	keys, acts := sceneFiles(t, pre, scene(1, 4))
	a, b := twoCells(t, func(cfg *cell.Config) {
		cfg.RewardKeys, cfg.Activities = keys, acts
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		mc := memcache.New(testenv.Memcached(t))
		// A slow answer on a loaded machine must not send a cell to its
		// local fallback (burst/2 each, on top of the shared bucket): the
		// bound asserted here is the shared bucket's.
		mc.Timeout = 5 * time.Second
		cfg.SceneMemcache = mc
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(b.adminURL + "/metrics"); return err == nil }, "admin port of cell-b up")
	cells := []*testCell{a, b}
	people := [][]string{actsOf(a, pre, 20), actsOf(b, pre, 20)}
	send := func(i int, rain string) (int, string, string) {
		c, act := cells[i%2], people[i%2][i/2]
		_, st, code := issue(t, c, api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: rain, ActID: act, AwardType: "cash", Amount: 10})
		return st, code, act
	}

	const n = 12
	start := time.Now()
	accepted := 0
	var refused []string
	for i := range n {
		switch st, code, act := send(i, "r1"); {
		case st == 200:
			accepted++
		case st == 429 && code == "SCENE_RATE_LIMITED":
			refused = append(refused, act)
		default:
			t.Fatalf("issue %d: %d %s, want 200 or 429 SCENE_RATE_LIMITED", i, st, code)
		}
	}
	elapsed := time.Since(start)
	if bound := 4 + int(elapsed.Seconds()); accepted > bound || accepted < 4 {
		t.Fatalf("%d of %d accepted by two cells in %v: want 4..%d (burst 4 + 1/s, for the cluster)", accepted, n, elapsed, bound)
	}
	for i, act := range refused {
		c := cells[0]
		if !c.cfg.Shards.Contains(sharding.ShardOfAct(act)) {
			c = cells[1]
		}
		if w := walletOf(t, c, act, ""); w.Pending != 0 || w.Balance != 0 || w.CumulativeIncome != 0 {
			t.Fatalf("refused issue %d (%s): wallet %+v, want nothing", i, act, w)
		}
	}
	t.Logf("%d accepted, %d refused in %v", accepted, len(refused), elapsed)

	// Raised on both cells: every request passes at once.
	writeScenes(t, acts, pre, scene(1000, 1000))
	reloadActivities(t, a)
	reloadActivities(t, b)
	for i := range 2 * n {
		if st, code, _ := send(i%n+n, fmt.Sprintf("r%d", 2+i/n)); st != 200 {
			t.Fatalf("issue %d after the reload to 1000/s: %d %s, want 200", i, st, code)
		}
	}
	// Lowered again: the new burst holds at once.
	writeScenes(t, acts, pre, scene(1, 2))
	reloadActivities(t, a)
	reloadActivities(t, b)
	accepted = 0
	start = time.Now()
	for i := range 8 {
		if st, _, _ := send(i, "r9"); st == 200 {
			accepted++
		}
	}
	if bound := 2 + int(time.Since(start).Seconds()); accepted > bound {
		t.Fatalf("after the reload to 1/s, burst 2: %d of 8 accepted, want at most %d", accepted, bound)
	}
}

// reserve_percent sets what a scene holds back of its budget: with 0 all of
// it is issued, with 50 half, and without it 10 % (budget 2,000 cents, 10 a
// reward: a lease is a chunk of total/200 = 10, so every lease is spent
// whole). A scene's compensate loads, with a warning the admin port
// answers, and changes nothing: its rewards are booked.
func TestSceneReservePercent(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	sc := func(id, extra string) string {
		return fmt.Sprintf("{id: %s-%s, award_type: cash, amount: {min: 1, max: 888}, budget: 2000, rate_limit: {per_sec: 10000, burst: 1000}, control_stock: true, pay_into: wallet%s}",
			pre, id, extra)
	}
	keys, acts := sceneFiles(t, pre, sc("r0", ", reserve_percent: 0, compensate: false"), sc("r50", ", reserve_percent: 50"), sc("rdef", ""))
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.RewardKeys, cfg.Activities = keys, acts
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	var got api.ActivitiesResponse
	if st, code := callAdmin(t, c, "GET", "/admin/activities", nil, &got); st != 200 ||
		len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], "scenes[0].compensate: no longer read") {
		t.Fatalf("GET /admin/activities: %d %s, warnings %q; want one on compensate", st, code, got.Warnings)
	}
	act := pre + "_res"
	for _, want := range []struct {
		scene  string
		issued int
	}{{"r0", 200}, {"r50", 100}, {"rdef", 180}} {
		n, i := 0, 0
		for ; i < 210; i++ {
			_, st, code := issue(t, c, api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-" + want.scene, RainID: fmt.Sprintf("r%d", i),
				ActID: act, AwardType: "cash", Amount: 10})
			if st == 409 && code == "BUDGET_EXHAUSTED" {
				break
			}
			if st != 200 {
				t.Fatalf("scene %s, issue %d: %d %s", want.scene, i, st, code)
			}
			n++
		}
		if n != want.issued {
			t.Errorf("scene %s: %d issued of 10 from a budget of 2,000 before it was spent, want %d", want.scene, n, want.issued)
		}
	}
	// compensate: false did not stop the booking of r0's rewards.
	if w := waitBooked(t, c, act, ""); w.Pending != 0 || w.Balance != 4800 {
		t.Fatalf("wallet: %+v, want 4,800 booked (200 + 100 + 180 rewards of 10)", w)
	}
}

// reward_cash_max refuses a cash reward above it whatever the scene's rule
// allows: 400 INVALID_ARGUMENT naming the setting, and no money moves (no
// reward stored under its order number, nothing pending or booked, nothing
// counted as issued); a reward at the cap is issued.
func TestRewardCashMax(t *testing.T) {
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	keys, acts := sceneFiles(t, pre, fmt.Sprintf("{id: %s-rain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, "+
		"rate_limit: {per_sec: 10000, burst: 1000}, control_stock: true, pay_into: wallet}", pre))
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.RewardKeys, cfg.Activities = keys, acts
		cfg.RewardCashMax = 500
	})
	act := pre + "_cap"
	req := api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: "r1", ActID: act, AwardType: "cash", Amount: 501}
	body, _ := json.Marshal(req)
	hr := newRequest(nil, "POST", c.url+api.RewardsPath, body)
	signer.SignRequest(hr, time.Now())
	resp, err := roundTrip(t, hr)
	var e api.ErrorBody
	if err != nil || resp.StatusCode() != 400 || json.Unmarshal(resp.Body(), &e) != nil || e.Error.Code != "INVALID_ARGUMENT" ||
		!strings.Contains(e.Error.Message, "reward_cash_max") {
		t.Fatalf("a reward of 501 above reward_cash_max 500: %v %d %s, want 400 INVALID_ARGUMENT naming reward_cash_max", err, resp.StatusCode(), resp.Body())
	}
	if w := walletOf(t, c, act, ""); w.Pending != 0 || w.Balance != 0 || w.CumulativeIncome != 0 {
		t.Fatalf("wallet after the refusal: %+v, want nothing", w)
	}
	var is api.IssuedResponse
	if st, code := call(t, "GET", c.url+api.IssuedPath(pre+"-fest"), nil, &is); st != 200 || len(is.Scenes) != 1 || is.Scenes[0].Issued != 0 {
		t.Fatalf("issued so far after the refusal: %d %s %+v, want 0", st, code, is)
	}
	// The refusal stored nothing under the order number: the same number
	// at the cap is a new reward (a stored one would answer ORDER_CONFLICT).
	req.Amount = 500
	if r, st, code := issue(t, c, req); st != 200 || r.Repeat || r.Amount != 500 {
		t.Fatalf("a reward of 500, at the cap: %d %s %+v, want a new reward", st, code, r)
	}
	if w := waitBooked(t, c, act, ""); w.Pending != 0 || w.Balance != 500 || w.CumulativeIncome != 500 {
		t.Fatalf("wallet: %+v, want the 500 at the cap booked, nothing of the refused 501", w)
	}
}
