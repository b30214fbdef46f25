package main

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
)

// The reward drills of docs/operations.md: rewards issued through the
// router at a steady rate (the demo activities of deploy/local, parent
// demo-festival: scene rain pays cash, scene card a coupon kind) while a
// cell is killed (reward_cell_kill) or the booking is switched off on both
// cells (reward_booking_off). Afterwards every request is retried under its
// order number (act_id, scene, rain) and the rows are read straight from
// both MariaDB servers:
//
//   - a reward answered 200 is answered again as a repeat with the same
//     order number, token and amount; a refused one (a code that writes
//     nothing) is never found applied; an unknown outcome settles;
//   - the rows under the drill's act_ids are exactly the rewards answered
//     200, each once, in its act_id's home database, all booked within a
//     bounded wait (a reward a killed booker left processing is taken again
//     after 30 s);
//   - each official cash reward has exactly one reward flow
//     (model.RewardFlowOrderNo) of its amount in its person's wallet, no
//     other reward flow exists, and each wallet's balance is its cash less
//     its withdrawals, nothing pending;
//   - the scenes' budgets were not over-issued: each lease spent at most its
//     amount (a returned one at most what it did not give back), the leases'
//     sum is the budget row's granted − returned, at most the budget less
//     its reserve, and covers every reward of the scene;
//   - redcell audit is clean.

// rewardParent is the demo activities' parent activity; budgetScenes are
// its scenes that control their stock.
const rewardParent = "demo-festival"

var budgetScenes = []string{"demo-festival/demo-official/rain", "demo-festival/demo-official/card"}

// rewardRec is one reward request and the answer the client saw first.
type rewardRec struct {
	act, scene, rain string
	amount           int64
	at               time.Time
	res              answer
	out              api.RewardResponse
}

func (r *rewardRec) body() map[string]any {
	award := "cash"
	if r.scene == "card" {
		award = "coupon"
	}
	return map[string]any{"parent_activity_id": rewardParent, "scene_id": r.scene, "rain_id": r.rain, "act_id": r.act,
		"award_type": award, "amount": r.amount}
}

func (r *rewardRec) orderNo() string {
	award := r.body()["award_type"].(string)
	return model.RewardOrderNo(r.act, r.scene, r.rain, award, model.StageOfficial)
}

// rewardLoad is one reward drill's client: fresh act_ids (prefix), and a
// record of every request and withdrawal.
type rewardLoad struct {
	c      *cluster
	dl     *drillLoad // its call and settle, with the same HTTP client
	prefix string
	people []string
	seq    atomic.Int64
	missed atomic.Int64 // ticks whose requests found every worker busy

	mu       sync.Mutex // guards recs, withdrawn
	recs     []*rewardRec
	withdraw map[string]int64 // cents withdrawn by act_id
}

func newRewardLoad(c *cluster, prefix string, people int) *rewardLoad {
	l := &rewardLoad{c: c, prefix: prefix, withdraw: map[string]int64{},
		dl: &drillLoad{c: c, hc: &http.Client{Timeout: 10 * time.Second, Transport: specTransport{next: &http.Transport{MaxIdleConnsPerHost: 64}}}}}
	for i := range people {
		l.people = append(l.people, fmt.Sprintf("%s-%d", prefix, i))
	}
	return l
}

// start issues rewards at rate per second, paced every 10 ms, with 32
// workers (a tick that finds them all busy drops its requests and counts
// them in missed: the rate is an upper bound), until the returned stop is
// called. One request in twenty repeats an earlier one of the load.
func (l *rewardLoad) start(rate int) (stop func()) {
	jobs := make(chan *rewardRec, 64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range jobs {
				l.issue(r)
			}
		}()
	}
	go func() {
		defer close(jobs)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		owed := 0.0
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for owed += float64(rate) / 100; owed >= 1; owed-- {
				select {
				case jobs <- l.next(rng):
				default:
					l.missed.Add(1)
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// next is a new reward request (rain: 1..888 cents; card: one coupon), or
// now and then one made before, sent again.
func (l *rewardLoad) next(rng *rand.Rand) *rewardRec {
	l.mu.Lock()
	n := len(l.recs)
	var again *rewardRec
	if n > 0 && rng.IntN(20) == 0 {
		again = l.recs[rng.IntN(n)]
	}
	l.mu.Unlock()
	if again != nil {
		return &rewardRec{act: again.act, scene: again.scene, rain: again.rain, amount: again.amount}
	}
	r := &rewardRec{act: l.people[rng.IntN(len(l.people))], scene: "rain", rain: fmt.Sprintf("d%d", l.seq.Add(1)), amount: int64(1 + rng.IntN(888))}
	if rng.IntN(7) == 0 {
		r.scene, r.amount = "card", 1
	}
	return r
}

func (l *rewardLoad) issue(r *rewardRec) {
	r.at = time.Now()
	r.res = l.dl.call("POST", "/v1/rewards", r.body(), &r.out)
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
}

// rewardRefused: codes answered before anything was written for the reward.
func rewardRefused(a answer) bool {
	switch a.code {
	case "BUDGET_EXHAUSTED", "SCENE_RATE_LIMITED", "NO_ACTIVE_STAGE":
		return true
	}
	return a.definite()
}

// settle retries every request under its order number and returns the
// reward each order number holds now, checking the first answers: a 200 is
// answered again as the same reward, marked repeat; a refusal was not
// applied.
func (l *rewardLoad) settle(t *testing.T) map[string]api.RewardResponse {
	t.Helper()
	byOrder := map[string][]*rewardRec{}
	for _, r := range l.recs {
		byOrder[r.orderNo()] = append(byOrder[r.orderNo()], r)
	}
	orders := make([]string, 0, len(byOrder))
	for o := range byOrder {
		orders = append(orders, o)
	}
	var mu sync.Mutex
	held := map[string]api.RewardResponse{}
	parallel(len(orders), func(i int) {
		recs := byOrder[orders[i]]
		var out api.RewardResponse
		a := l.dl.settle(t, "POST", "/v1/rewards", recs[0].body(), &out)
		if !a.ok() {
			t.Errorf("reward %s retried after the drill: %+v", orders[i], a)
			return
		}
		refused, answered := true, 0
		for _, r := range recs {
			switch {
			case r.res.ok():
				answered++
				refused = false
				if !out.Repeat || out.OrderNo != orders[i] || out.Token != r.out.Token || out.Amount != r.amount || r.out.OrderNo != orders[i] {
					t.Errorf("reward %s answered %+v, its retry %+v", orders[i], r.out, out)
				}
			case !rewardRefused(r.res):
				refused = false
			}
		}
		if refused && out.Repeat {
			t.Errorf("reward %s was refused (%+v) but had been stored", orders[i], recs[0].res)
		}
		if answered > 1 && !slices.ContainsFunc(recs, func(r *rewardRec) bool { return r.res.ok() && r.out.Repeat }) {
			t.Errorf("reward %s answered 200 %d times, never as a repeat", orders[i], answered)
		}
		mu.Lock()
		held[orders[i]] = out
		mu.Unlock()
	})
	return held
}

// rewardRow is a t_reward row as the drill reads it.
type rewardRow struct {
	orderNo, act, scene, award, token, lease string
	shard, status                            int
	amount                                   int64
	server, db                               int
	createdMS, claimedMS                     int64
}

// rewardSchemas lists the real (not shadow) databases of each server that
// have a reward table.
func rewardSchemas(t *testing.T, dbs []*sql.DB) [][]string {
	t.Helper()
	out := make([][]string, len(dbs))
	for i, db := range dbs {
		rows, err := db.Query(`SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME = 't_reward' AND TABLE_SCHEMA REGEXP '^db_[0-9]{2}$'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out[i] = append(out[i], s)
		}
		rows.Close()
	}
	return out
}

// rewardRows reads every reward row whose order number starts with prefix,
// from both servers.
func rewardRows(t *testing.T, dbs []*sql.DB, prefix string) []rewardRow {
	t.Helper()
	var out []rewardRow
	for i, schemas := range rewardSchemas(t, dbs) {
		for _, s := range schemas {
			rows, err := dbs[i].Query("SELECT order_no, act_id, act_shard, scene_id, award_type, amount, token, lease_id, status, created_ms, claimed_ms FROM "+
				s+".t_reward WHERE order_no LIKE ?", prefix+"%")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				r := rewardRow{server: i}
				if err := rows.Scan(&r.orderNo, &r.act, &r.shard, &r.scene, &r.award, &r.amount, &r.token, &r.lease, &r.status, &r.createdMS, &r.claimedMS); err != nil {
					t.Fatal(err)
				}
				fmt.Sscanf(s, "db_%d", &r.db)
				out = append(out, r)
			}
			rows.Close()
		}
	}
	return out
}

// serverOf is the index of the MariaDB server holding shard s (cell-1 owns
// 0-499 on the first, cell-2 500-999 on the second).
func serverOf(s model.ShardID) int {
	if s < 500 {
		return 0
	}
	return 1
}

// waitBooked waits up to limit for every reward row under prefix to be
// booked; it returns how long that took.
func waitBooked(t *testing.T, dbs []*sql.DB, prefix string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		left := 0
		for _, r := range rewardRows(t, dbs, prefix) {
			if r.status != int(model.RewardBooked) {
				left++
			}
		}
		if left == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%d rewards still not booked %s after the load", left, limit)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// verify settles every request, waits up to bookWait for the booking, and
// checks the rows, the wallets, the budgets and the audit (see the top of
// this file); it returns a one-line summary.
func (l *rewardLoad) verify(t *testing.T, bookWait time.Duration) string {
	t.Helper()
	held := l.settle(t)
	if t.Failed() {
		return ""
	}
	dbs := []*sql.DB{openDB(t, l.c.spec.dsn[0]), openDB(t, l.c.spec.dsn[1])}
	took := waitBooked(t, dbs, l.prefix+"-", bookWait)
	rows := rewardRows(t, dbs, l.prefix+"-")
	seen := map[string]bool{}
	cash := map[string]int64{} // act_id -> cents of official cash rewards
	flowOf := map[string]rewardRow{}
	for _, r := range rows {
		want, ok := held[r.orderNo]
		home := sharding.ShardOfAct(r.act)
		switch {
		case seen[r.orderNo]:
			t.Errorf("reward %s stored twice", r.orderNo)
		case !ok:
			t.Errorf("reward %s is stored but no request of the drill holds it", r.orderNo)
		case want.Token != r.token || want.Amount != r.amount || r.shard != int(home) || r.db != home.DB() || r.server != serverOf(home):
			t.Errorf("reward %s stored as %+v, answered %+v (home shard %d)", r.orderNo, r, want, home)
		}
		seen[r.orderNo] = true
		if r.award == model.AwardCash {
			cash[r.act] += r.amount
			flowOf[model.RewardFlowOrderNo(r.orderNo)] = r
		}
	}
	for o := range held {
		if !seen[o] {
			t.Errorf("reward %s was answered 200 but is not stored (lost)", o)
		}
	}
	flows := l.checkRewardFlows(t, dbs, flowOf)
	l.checkWallets(t, cash)
	budgets := checkBudgets(t, dbs)
	rep := l.c.waitAudit(t)
	ok, unknown, refused := 0, 0, 0
	for _, r := range l.recs {
		switch {
		case r.res.ok():
			ok++
		case rewardRefused(r.res):
			refused++
		default:
			unknown++
		}
	}
	return fmt.Sprintf("%d reward requests (%d answered 200, %d refused, %d unknown outcome; %d not sent, all workers busy): %d rewards stored once each, all booked %s after the load, %d reward flows once each; %s; audit: rewards %d, withdrawals %d, difference %d",
		len(l.recs), ok, refused, unknown, l.missed.Load(), len(rows), took.Round(100*time.Millisecond), flows, budgets, rep.Rewards, rep.Withdrawals, rep.Difference)
}

// checkRewardFlows reads the reward flows of the drill's people from their
// shards' flow tables: exactly one per official cash reward (flowOf, by
// flow order number), of its amount, in its person's wallet. It returns how
// many it found.
func (l *rewardLoad) checkRewardFlows(t *testing.T, dbs []*sql.DB, flowOf map[string]rewardRow) int {
	t.Helper()
	shards := map[model.ShardID]bool{}
	for _, p := range l.people {
		shards[sharding.ShardOfAct(p)] = true
	}
	found := map[string]int{}
	for s := range shards {
		rows, err := dbs[serverOf(s)].Query(fmt.Sprintf("SELECT act_id, order_no, amount FROM db_%02d.t_flow_%d WHERE kind = 'reward' AND act_id LIKE ?", s.DB(), s.Table()),
			l.prefix+"-%")
		if err != nil {
			t.Fatalf("reward flows of shard %d: %v", s, err)
		}
		for rows.Next() {
			var act, order string
			var amount int64
			if err := rows.Scan(&act, &order, &amount); err != nil {
				t.Fatal(err)
			}
			found[order]++
			r, ok := flowOf[order]
			if !ok || r.act != act || r.amount != amount || sharding.ShardOfAct(act) != s {
				t.Errorf("reward flow %s of %s (%d cents) in shard %d books no stored cash reward of that person and amount (%+v)", order, act, amount, s, r)
			}
		}
		rows.Close()
	}
	for order, r := range flowOf {
		if found[order] != 1 {
			t.Errorf("reward %s (%d cents) has %d reward flows, want 1", r.orderNo, r.amount, found[order])
		}
	}
	return len(found)
}

// checkWallets reads every person's wallet through the router: the balance
// is its cash rewards less its withdrawals, nothing pending, the income its
// cash rewards.
func (l *rewardLoad) checkWallets(t *testing.T, cash map[string]int64) {
	t.Helper()
	parallel(len(l.people), func(i int) {
		p := l.people[i]
		var w api.WalletResponse
		if a := l.dl.settle(t, "GET", "/v1/accounts/"+p+"/wallet?stage=official", nil, &w); !a.ok() {
			t.Errorf("wallet of %s: %+v", p, a)
			return
		}
		l.mu.Lock()
		out := l.withdraw[p]
		l.mu.Unlock()
		if w.Balance != cash[p]-out || w.Pending != 0 || w.CumulativeIncome != cash[p] {
			t.Errorf("wallet of %s: balance %d, pending %d, income %d; want %d (cash %d less withdrawn %d), 0, %d",
				p, w.Balance, w.Pending, w.CumulativeIncome, cash[p]-out, cash[p], out, cash[p])
		}
	})
}

// budgetLease is a lease as the drill reads it, with what the rewards
// issued from it add up to.
type budgetLease struct {
	amount, unspent, spent int64
	state                  string
}

// checkBudgets checks every budget scene of the demo activities against its
// leases and the rewards issued from them (all drills' rewards: the drill's
// servers hold no other): each lease spent at most its amount, a returned
// one at most what it kept; the row's granted and returned are the leases'
// sums; spent <= granted − returned <= total − reserve (total/10); every
// reward of the scene names a lease of it. It returns a summary.
func checkBudgets(t *testing.T, dbs []*sql.DB) string {
	t.Helper()
	var sums []string
	schemas := rewardSchemas(t, dbs)
	for _, key := range budgetScenes {
		home := sharding.BudgetShard(key)
		var total, granted, returned int64
		err := dbs[serverOf(home)].QueryRow(fmt.Sprintf("SELECT total, granted, returned FROM db_%02d.t_budget WHERE budget_key = ?", home.DB()), key).
			Scan(&total, &granted, &returned)
		if err == sql.ErrNoRows {
			continue // nothing issued from it yet
		}
		if err != nil {
			t.Fatalf("budget %s: %v", key, err)
		}
		leases, states := budgetLeases(t, dbs[serverOf(home)], home, key)
		issued, spent := spentFrom(t, dbs, schemas, key, leases)
		var sumAmount, sumUnspent int64
		for id, l := range leases {
			sumAmount += l.amount
			if l.state == string(model.LeaseReturned) {
				sumUnspent += l.unspent
			}
			if l.spent > l.amount || l.state == string(model.LeaseReturned) && l.spent > l.amount-l.unspent {
				t.Errorf("budget %s: lease %s (%s) of %d, %d given back, spent %d: over-issued", key, id, l.state, l.amount, l.unspent, l.spent)
			}
		}
		if sumAmount != granted || sumUnspent != returned || spent > granted-returned || granted-returned > total-total/10 {
			t.Errorf("budget %s: total %d, granted %d, returned %d; its leases sum to %d, give back %d; %d spent", key, total, granted, returned, sumAmount, sumUnspent, spent)
		}
		sums = append(sums, fmt.Sprintf("%s: %d issued (%d) from %d leases %v, granted %d − returned %d of %d",
			key[strings.LastIndexByte(key, '/')+1:], issued, spent, len(leases), states, granted, returned, total))
	}
	return "budgets " + strings.Join(sums, "; ")
}

// budgetLeases reads every lease of key at its home, by ID, and counts them
// by state.
func budgetLeases(t *testing.T, db *sql.DB, home model.ShardID, key string) (map[string]*budgetLease, map[string]int) {
	t.Helper()
	rows, err := db.Query(fmt.Sprintf("SELECT lease_id, amount, unspent, state FROM db_%02d.t_budget_lease WHERE budget_key = ?", home.DB()), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	leases, states := map[string]*budgetLease{}, map[string]int{}
	for rows.Next() {
		var id string
		l := &budgetLease{}
		if err := rows.Scan(&id, &l.amount, &l.unspent, &l.state); err != nil {
			t.Fatal(err)
		}
		leases[id] = l
		states[l.state]++
	}
	return leases, states
}

// spentFrom sums the rewards of key's scene in every reward table of both
// servers by lease into leases (a reward naming no lease of key is an
// error), and answers their count and total.
func spentFrom(t *testing.T, dbs []*sql.DB, schemas [][]string, key string, leases map[string]*budgetLease) (issued, spent int64) {
	t.Helper()
	parts := strings.Split(key, "/")
	for i, ss := range schemas {
		for _, s := range ss {
			rows, err := dbs[i].Query("SELECT lease_id, SUM(amount), COUNT(*) FROM "+s+".t_reward WHERE parent_id = ? AND child_id = ? AND scene_id = ? GROUP BY lease_id",
				parts[0], parts[1], parts[2])
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				var amount, n int64
				if err := rows.Scan(&id, &amount, &n); err != nil {
					t.Fatal(err)
				}
				issued, spent = issued+n, spent+amount
				if l := leases[id]; l == nil {
					t.Errorf("budget %s: %d rewards (%d) issued from lease %q, which it never granted", key, n, amount, id)
				} else {
					l.spent += amount
				}
			}
			rows.Close()
		}
	}
	return issued, spent
}

// rewardKillDrill: rewards are issued through the router at a steady rate
// while cell-1 is killed with SIGKILL and started again on its ports; its
// booker's batch in flight rolls back with its transaction (a reward left
// processing, by a take of an earlier version, would be taken again once
// 30 s stale). Every reward answered 200 is stored and booked exactly once,
// within bookWait.
func rewardKillDrill(t *testing.T, c *cluster, full bool) {
	loadFor, rate := 6*time.Second, 400
	if full {
		loadFor = 30 * time.Second
	}
	l := newRewardLoad(c, "rk"+randHex(), 600)
	stop := l.start(rate)
	time.Sleep(loadFor / 3)
	before := routerSees(t, c, "cell-1")
	killed := time.Now()
	c.kill(t, "cell-1")
	time.Sleep(loadFor / 12)
	ready, serves := restartServes(t, c, "cell-1", actIn("probe-a", 0, 499), before)
	time.Sleep(loadFor / 3)
	stop()
	if t.Failed() {
		return
	}
	dbs := []*sql.DB{openDB(t, c.spec.dsn[0]), openDB(t, c.spec.dsn[1])}
	stuck := 0
	for _, r := range rewardRows(t, dbs, l.prefix+"-") {
		if r.status == int(model.RewardProcessing) && r.claimedMS <= killed.UnixMilli() {
			stuck++
		}
	}
	t.Logf("cell-1 killed with SIGKILL under %d rewards/s and started again: ready %s after the start, served %s after that; %d rewards its booker had taken were left processing",
		rate, ready.Round(time.Millisecond), serves.Round(time.Millisecond), stuck)
	// A reward left processing is taken again 30 s after it was taken
	// (bookerStale), by a booker that scans every database every 30 s; then the backlog.
	t.Logf("reward_cell_kill: %s", l.verify(t, 60*time.Second))
	// The restarted cell settles the leases the killed process held once
	// their homes marked them expired (budget_lease_ttl 5 s here; marked and
	// settled every 10 s, 10 s past their expiry): each returns what its
	// rewards did not spend, and the budgets checks above hold with them
	// returned.
	deadline := time.Now().Add(45 * time.Second)
	for {
		n, held := deadLeases(t, dbs, "cell-1", killed)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d budget leases the killed process held (%d units) are still open 45 s after the checks: the restarted cell did not settle them", n, held)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// deadLeases counts the leases of the demo budgets that holder took before
// killed and that are still open or expired (not settled), and sums their
// amounts.
func deadLeases(t *testing.T, dbs []*sql.DB, holder string, killed time.Time) (n, amount int64) {
	t.Helper()
	for _, key := range budgetScenes {
		home := sharding.BudgetShard(key)
		var c, a int64
		err := dbs[serverOf(home)].QueryRow(fmt.Sprintf("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM db_%02d.t_budget_lease WHERE budget_key = ? AND holder = ? AND state <> 'returned' AND created_ms < ?",
			home.DB()), key, holder, killed.UnixMilli()).Scan(&c, &a)
		if err != nil {
			t.Fatalf("leases of %s: %v", key, err)
		}
		n, amount = n+c, amount+a
	}
	return n, amount
}

// rewardBookingOffDrill: rewards are issued at a steady rate while the
// booking degrade switch is off on both cells: they wait pending, the
// wallets show them pending (exactly the cash of the person's unbooked
// rows), no reward issued after the switch is booked, and a withdrawal
// still books its own person's rewards first. Switched on again, with the
// load going on, everything is booked exactly once within a bounded wait.
func rewardBookingOffDrill(t *testing.T, c *cluster, full bool) {
	offFor, rate := 5*time.Second, 250
	if full {
		offFor = 30 * time.Second
	}
	l := newRewardLoad(c, "rb"+randHex(), 600)
	stop := l.start(rate)
	time.Sleep(offFor / 3)
	for _, cell := range []string{"cell-1", "cell-2"} {
		c.admin(t, cell, "PUT", "/admin/degrade", `{"booking":"off"}`)
	}
	off := time.Now()
	time.Sleep(offFor)
	stop()
	pending := l.checkBookingOff(t, off)
	for _, cell := range []string{"cell-1", "cell-2"} {
		c.admin(t, cell, "PUT", "/admin/degrade", `{"booking":"on"}`)
	}
	stop = l.start(rate)
	time.Sleep(offFor / 3)
	stop()
	if t.Failed() {
		return
	}
	t.Logf("booking off for %s under %d rewards/s: %d rewards (%d cents of cash) waited pending", offFor, rate, pending.rewards, pending.cash)
	// The backlog drains at both cells' booking_rate (150/s each) less
	// what the load adds meanwhile.
	t.Logf("reward_booking_off: %s", l.verify(t, 60*time.Second+time.Duration(pending.rewards)*time.Second/200))
}

type pendingSum struct{ rewards, cash int64 }

// checkBookingOff runs with the booking off and the load stopped, so that
// nothing moves: no reward issued a second after the switch is booked; each
// wallet's pending is the cash of its person's unbooked rows, its balance
// that of the booked ones; then one person with cash pending withdraws a
// cent, which books that person's rewards first. It answers what was
// pending before the withdrawal.
func (l *rewardLoad) checkBookingOff(t *testing.T, off time.Time) pendingSum {
	t.Helper()
	dbs := []*sql.DB{openDB(t, l.c.spec.dsn[0]), openDB(t, l.c.spec.dsn[1])}
	since := off.Add(time.Second).UnixMilli() // a booker pass begun before the switch has ended by then
	pend, booked := map[string]int64{}, map[string]int64{}
	var sum pendingSum
	for _, r := range rewardRows(t, dbs, l.prefix+"-") {
		if r.status == int(model.RewardBooked) {
			if r.createdMS > since {
				t.Errorf("reward %s was issued %d ms after the booking was switched off, and booked", r.orderNo, r.createdMS-off.UnixMilli())
			}
			if r.award == model.AwardCash {
				booked[r.act] += r.amount
			}
			continue
		}
		sum.rewards++
		if r.award == model.AwardCash {
			pend[r.act] += r.amount
			sum.cash += r.amount
		}
	}
	if sum.rewards == 0 {
		t.Errorf("booking off: no reward waits pending")
	}
	parallel(len(l.people), func(i int) {
		p := l.people[i]
		var w api.WalletResponse
		if a := l.dl.settle(t, "GET", "/v1/accounts/"+p+"/wallet?stage=official", nil, &w); !a.ok() {
			t.Errorf("wallet of %s: %+v", p, a)
			return
		}
		if w.Pending != pend[p] || w.Balance != booked[p] || w.CumulativeIncome != pend[p]+booked[p] {
			t.Errorf("booking off: wallet of %s shows balance %d, pending %d, income %d; its rows: %d booked, %d pending",
				p, w.Balance, w.Pending, w.CumulativeIncome, booked[p], pend[p])
		}
	})
	var who string
	for _, p := range l.people {
		if pend[p] > 0 {
			who = p
			break
		}
	}
	if who == "" {
		return sum
	}
	var out api.WithdrawResponse
	if a := l.dl.settle(t, "POST", "/v1/accounts/"+who+"/withdraw", map[string]any{"amount": 1, "order_no": l.prefix + "-w1"}, &out); !a.ok() ||
		out.BookedNow < 1 || out.Balance != booked[who]+pend[who]-1 {
		t.Errorf("withdrawal of a cent by %s (pending %d) while the booking is off: %+v %+v", who, pend[who], a, out)
	}
	l.mu.Lock()
	l.withdraw[who]++
	l.mu.Unlock()
	return sum
}
