package cell_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testaudit"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// grouped runs a cell under the grouped strategy.
func grouped(cfg *cell.Config) { cfg.OpenStrategy = cell.StrategyGrouped }

// histogram reads one histogram series of reg: its sample count and sum.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (count uint64, sum float64) {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// groupStats are a cell's group-commit counts in one space.
type groupStats struct {
	commits  float64
	groups   uint64  // groups observed by the size histogram (= commits)
	requests float64 // requests in them
	hold     float64 // seconds groups were held open
}

func groupsOf(t *testing.T, c *testCell, space string) groupStats {
	t.Helper()
	l := map[string]string{"space": space}
	var g groupStats
	g.commits = counter(t, c.reg, "redcell_cell_group_commits_total", l)
	g.groups, g.requests = histogram(t, c.reg, "redcell_cell_group_requests", l)
	_, g.hold = histogram(t, c.reg, "redcell_cell_group_hold_seconds", l)
	return g
}

// TestGroupedMoney: under grouped, concurrent deposits, sends and opens of
// many packets on two cells (stress traffic: shadow tables) all go through
// the group committer and are answered right — reused order numbers, an
// overdraft and sold-out packets answer their own request only — the
// credits relayed between the cells (received through the committer, split
// per database) reach every claimant once, and the audit of the books is
// clean.
func TestGroupedMoney(t *testing.T) {
	// The real space of the test servers holds what earlier tests left: a
	// claim credited past its database's saved relay position is read and
	// delivered again by the next relay (the receiver ignores it), a group of
	// the real space, which the check below would take for stress traffic
	// there (seen once in a clean-clone run). Move the positions past those
	// first, as the cluster tests do.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := testaudit.Settle(ctx, []string{testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)}); err != nil {
		t.Fatal(err)
	}
	a, b := twoCells(t, grouped)
	pre := testenv.Prefix()
	type sender struct {
		act  string
		cell *testCell
	}
	var senders []sender
	for i := 0; i < 6; i++ {
		senders = append(senders, sender{actIn(t, fmt.Sprintf("%s-sa%d", pre, i), a.cfg.Shards), a},
			sender{actIn(t, fmt.Sprintf("%s-sb%d", pre, i), b.cfg.Shards), b})
	}
	do := func(c *testCell, method, path string, body, out any) (int, string) {
		return callH(t, stress, method, c.url+path, body, out)
	}
	// Two deposits per sender at once, then each again (a repeat) and one
	// order number reused with another amount (a conflict).
	var wg sync.WaitGroup
	for _, s := range senders {
		for _, order := range []string{"d1", "d2"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if st, code := do(s.cell, "POST", "/v1/accounts/"+s.act+"/deposit", api.DepositRequest{Amount: 5000, OrderNo: order}, nil); st != 200 {
					t.Errorf("deposit %s of %s: %d %s", order, s.act, st, code)
				}
			}()
		}
	}
	wg.Wait()
	for _, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d model.Deposit
			if st, code := do(s.cell, "POST", "/v1/accounts/"+s.act+"/deposit", api.DepositRequest{Amount: 5000, OrderNo: "d1"}, &d); st != 200 || !d.Repeat || d.Balance != 5000 && d.Balance != 10000 { // the first answer again
				t.Errorf("repeated deposit: %d %s %+v", st, code, d)
			}
			if st, code := do(s.cell, "POST", "/v1/accounts/"+s.act+"/deposit", api.DepositRequest{Amount: 7, OrderNo: "d2"}, nil); st != 409 || code != "ORDER_CONFLICT" {
				t.Errorf("reused order number: %d %s", st, code)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Two sends per sender at once (9000 of the 10000), then one more that
	// the balance cannot pay.
	type packet struct {
		id     string
		cell   *testCell
		amount int64
		count  int64
	}
	var mu sync.Mutex
	var packets []packet
	for _, s := range senders {
		for i, shape := range [][2]int64{{4000, 8}, {5000, 3}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out api.SendResponse
				if st, code := do(s.cell, "POST", "/v1/packets", api.SendRequest{Sender: s.act, Amount: shape[0], Count: shape[1], OrderNo: fmt.Sprintf("s%d", i)}, &out); st != 200 {
					t.Errorf("send: %d %s", st, code)
					return
				}
				mu.Lock()
				packets = append(packets, packet{out.PacketID, s.cell, shape[0], shape[1]})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for _, s := range senders {
		if st, code := do(s.cell, "POST", "/v1/packets", api.SendRequest{Sender: s.act, Amount: 5000, Count: 1, OrderNo: "s9"}, nil); st != 409 || code != "INSUFFICIENT_BALANCE" {
			t.Fatalf("overdraft: %d %s", st, code)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// A hot packet on cell a, opened by 150 users at once while 24 others
	// open every cold packet, on both cells, through 12 goroutines.
	hotSender := senders[0]
	if st, code := do(a, "POST", "/v1/accounts/"+hotSender.act+"/deposit", api.DepositRequest{Amount: 10000, OrderNo: "d-hot"}, nil); st != 200 {
		t.Fatalf("deposit: %d %s", st, code)
	}
	var hot api.SendResponse
	if st, code := do(a, "POST", "/v1/packets", api.SendRequest{Sender: hotSender.act, Amount: 10000, Count: 100, OrderNo: "s-hot"}, &hot); st != 200 {
		t.Fatalf("hot send: %d %s", st, code)
	}
	packets = append(packets, packet{hot.PacketID, a, 10000, 100})
	claimed := map[string]int64{} // packet -> cents answered
	owed := map[string]int64{}    // claimant -> cents
	won := map[string]int{}       // packet -> claims answered
	record := func(id string, st int, code string, o api.OpenResponse, user string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case st == 200:
			if o.Repeat || o.ActID != user || o.Amount < 1 {
				t.Errorf("claim %+v for %s", o, user)
			}
			claimed[id] += o.Amount
			owed[user] += o.Amount
			won[id]++
		case code != "SOLD_OUT":
			t.Errorf("open of %s: %d %s", id, st, code)
		}
	}
	for i := 0; i < 150; i++ {
		user := fmt.Sprintf("%s-h%d", pre, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o api.OpenResponse
			st, code := do(a, "POST", "/v1/packets/"+hot.PacketID+"/open", api.ActRequest{ActID: user}, &o)
			record(hot.PacketID, st, code, o, user)
		}()
	}
	jobs := make(chan [2]string)
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				c := a
				if !a.cfg.Shards.Contains(mustRef(t, j[0]).Shard) {
					c = b
				}
				var o api.OpenResponse
				st, code := do(c, "POST", "/v1/packets/"+j[0]+"/open", api.ActRequest{ActID: j[1]}, &o)
				record(j[0], st, code, o, j[1])
			}
		}()
	}
	for u := 0; u < 24; u++ {
		for _, p := range packets[:len(packets)-1] {
			jobs <- [2]string{p.id, fmt.Sprintf("%s-u%d", pre, u)}
		}
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, p := range packets {
		if claimed[p.id] != p.amount || won[p.id] != int(p.count) {
			t.Fatalf("packet %s: %d claims answered summing to %d, want %d summing to %d", p.id, won[p.id], claimed[p.id], p.count, p.amount)
		}
		var detail api.PacketResponse
		if st, code := do(p.cell, "GET", "/v1/packets/"+p.id+"?limit=100", nil, &detail); st != 200 || detail.RemainingCount != 0 ||
			detail.RemainingAmount != 0 || detail.Status != "sold_out" || len(detail.Claims) != int(p.count) {
			t.Fatalf("detail of %s: %d %s %+v", p.id, st, code, detail)
		}
	}
	// Every claimant is credited what the answers said, once.
	balanceOf := func(act string) int64 {
		c := a
		if !a.cfg.Shards.Contains(sharding.ShardOfAct(act)) {
			c = b
		}
		var acct model.Account
		do(c, "GET", "/v1/accounts/"+act, nil, &acct)
		return int64(acct.Balance)
	}
	waitFor(t, 20*time.Second, func() bool {
		for user, want := range owed {
			if balanceOf(user) != want {
				return false
			}
		}
		return true
	}, "every claimant credited")
	for _, s := range senders { // 10000 deposited, 9000 sent (the hot sender's extra 10000 went out whole)
		if got := balanceOf(s.act); got != 1000 {
			t.Fatalf("sender %s balance %d, want 1000", s.act, got)
		}
	}
	if rep := auditShadow(t); !rep.OK() {
		t.Fatalf("audit: %+v", rep)
	}
	// It all went through the committer: every deposit, send and open (and
	// the credits received from the other cell) is a request of a group.
	for _, c := range []*testCell{a, b} {
		// The relay may commit a group between the two metric reads: read
		// until two reads in a row agree (bounded).
		g := groupsOf(t, c, "shadow")
		testenv.Until(5*time.Second, func() bool {
			again := groupsOf(t, c, "shadow")
			same := again == g
			g = again
			return same
		})
		if g.commits == 0 || float64(g.groups) != g.commits || g.requests < g.commits {
			t.Fatalf("%s: %+v", c.name, g)
		}
	}
	// Stress traffic wrote nothing real: no real balance for any sender or
	// claimant, no real packet. (The real space's group counter is no proof
	// either way: the relay delivers there the claims earlier tests left past
	// the saved positions in the test servers' real space, a real group each;
	// seen in a clean-clone run.)
	realBalance := func(act string) (int, int64) {
		c := a
		if !a.cfg.Shards.Contains(sharding.ShardOfAct(act)) {
			c = b
		}
		var acct model.Account
		st, _ := call(t, "GET", c.url+"/v1/accounts/"+act, nil, &acct)
		return st, int64(acct.Balance)
	}
	acts := []string{hotSender.act}
	for _, s := range senders {
		acts = append(acts, s.act)
	}
	for user := range owed {
		acts = append(acts, user)
	}
	for _, act := range acts {
		if st, bal := realBalance(act); (st != 200 && st != 404) || bal != 0 {
			t.Fatalf("the real account of %s: %d, balance %d; want none: stress traffic only", act, st, bal)
		}
	}
	for _, p := range packets {
		if st, code := call(t, "GET", p.cell.url+"/v1/packets/"+p.id, nil, nil); st != 404 {
			t.Fatalf("the real space answers packet %s: %d %s; want 404: it was sent as stress traffic", p.id, st, code)
		}
	}
	// At least: 4 deposits and 3 sends per sender (repeats, conflicts and
	// the overdraft answered in their groups), the hot deposit and send, and
	// one open per claim (opens of packets known closed are answered without
	// a transaction, credits come on top).
	claims := 0
	for _, n := range won {
		claims += n
	}
	ga, gb := groupsOf(t, a, "shadow"), groupsOf(t, b, "shadow")
	if min := float64(7*len(senders) + 2 + claims); ga.requests+gb.requests < min {
		t.Fatalf("%v + %v requests in groups, want at least %v", ga.requests, gb.requests, min)
	}
	t.Logf("groups: cell a %v of %v requests, cell b %v of %v requests", ga.commits, ga.requests, gb.commits, gb.requests)
}

// mustRef parses a packet ID.
func mustRef(t *testing.T, id string) model.PacketRef {
	t.Helper()
	ref, err := model.ParsePacketID(id)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestGroupedLoneRequests: requests sent one after another to a grouped
// cell, however long the group wait, each commit in a group of their own at
// once: as many groups as requests, none held open.
func TestGroupedLoneRequests(t *testing.T) {
	// The relay is off: the opens' credits, booked here through the
	// committer too, would add groups of their own at their own time.
	c := oneCell(t, func(cfg *cell.Config) { grouped(cfg); cfg.GroupWait = time.Second; cfg.Degrade.Relay = true })
	pre := testenv.Prefix()
	sender := pre + "-s"
	before := groupsOf(t, c, "real")
	for i := 0; i < 4; i++ {
		if st, code := call(t, "POST", c.url+"/v1/accounts/"+sender+"/deposit", api.DepositRequest{Amount: 1000, OrderNo: fmt.Sprintf("d%d", i)}, nil); st != 200 {
			t.Fatalf("deposit: %d %s", st, code)
		}
	}
	id := c.send(t, sender, 3000, 3, "s1")
	for i := 0; i < 3; i++ {
		openOne(t, c, nil, id, fmt.Sprintf("%s-u%d", pre, i))
	}
	after := groupsOf(t, c, "real")
	if n := after.commits - before.commits; n != 8 {
		t.Fatalf("%v groups for 8 requests sent one at a time", n)
	}
	if n := after.requests - before.requests; n != 8 {
		t.Fatalf("%v requests in the groups, want 8", n)
	}
	if held := after.hold - before.hold; held != 0 {
		t.Fatalf("lone requests were held %vs", held)
	}
}

// TestGroupedFIFOPerKey: two deposits into one wallet and then a send of
// their sum from it, queued behind a commit in flight, go into one group in
// arrival order: the send sees both deposits and succeeds.
func TestGroupedFIFOPerKey(t *testing.T) {
	// Databases of its own: a credit the relay delivers for an earlier
	// test's leftover claim would queue in the held lane too and throw the
	// queue's counts off.
	privateDatabases(t)
	c := oneCell(t, func(cfg *cell.Config) { grouped(cfg); cfg.GroupWait = 0 })
	pre := testenv.Prefix()
	blocker := pre + "-b"
	db := sharding.ShardOfAct(blocker).DB()
	wallet := ""
	for i := 0; wallet == ""; i++ {
		if a := fmt.Sprintf("%s-w%d", pre, i); sharding.ShardOfAct(a).DB() == db && a != blocker {
			wallet = a
		}
	}
	c.deposit(t, blocker, 100)
	c.deposit(t, wallet, 1) // its tables exist before the lane is held
	// Hold the blocker's wallet row, so that the next deposit into it stalls
	// its lane's commit.
	sh := sharding.ShardOfAct(blocker)
	tx, err := c.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var bal int64
	if err := tx.QueryRow(fmt.Sprintf("SELECT balance FROM %sdb_%02d.t_account_%d WHERE act_id = ? FOR UPDATE", c.ns, sh.DB(), sh.Table()), blocker).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	before := groupsOf(t, c, "real")
	queued := func() float64 { return counter(t, c.reg, "redcell_cell_group_queued", nil) }
	type answer struct {
		what     string
		st       int
		code     string
		balance  int64
		packetID string
	}
	answers := make(chan answer, 4)
	deposit := func(act, order string, amount int64) {
		var d model.Deposit
		st, code := call(t, "POST", c.url+"/v1/accounts/"+act+"/deposit", api.DepositRequest{Amount: amount, OrderNo: order}, &d)
		answers <- answer{what: order, st: st, code: code, balance: int64(d.Balance)}
	}
	go deposit(blocker, "b2", 1)
	// The lane's commit is stalled once a statement naming the blocker waits
	// in the server (a row-lock wait, whatever statement the store sends first).
	waitFor(t, 5*time.Second, func() bool {
		var n int
		c.db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE INFO LIKE ? AND INFO NOT LIKE '%processlist%'",
			"%'"+blocker+"'%").Scan(&n)
		return n > 0
	}, "the lane's commit waiting for the held row")
	go deposit(wallet, "w1", 300)
	waitFor(t, 5*time.Second, func() bool { return queued() == 1 }, "first deposit queued")
	go deposit(wallet, "w2", 200)
	waitFor(t, 5*time.Second, func() bool { return queued() == 2 }, "second deposit queued")
	go func() {
		var out api.SendResponse
		st, code := call(t, "POST", c.url+"/v1/packets", api.SendRequest{Sender: wallet, Amount: 501, Count: 2, OrderNo: "s1"}, &out)
		answers <- answer{what: "send", st: st, code: code, packetID: out.PacketID}
	}()
	waitFor(t, 5*time.Second, func() bool { return queued() == 3 }, "send queued")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		a := <-answers
		if a.st != 200 {
			t.Fatalf("%s: %d %s", a.what, a.st, a.code)
		}
		switch a.what {
		case "w1":
			if a.balance != 301 {
				t.Fatalf("first deposit answered balance %d, want 301", a.balance)
			}
		case "w2":
			if a.balance != 501 {
				t.Fatalf("second deposit answered balance %d, want 501", a.balance)
			}
		}
	}
	if got := c.balance(t, wallet); got != 0 {
		t.Fatalf("wallet balance %d after sending both deposits, want 0", got)
	}
	after := groupsOf(t, c, "real")
	if n, reqs := after.commits-before.commits, after.requests-before.requests; n != 2 || reqs != 4 {
		t.Fatalf("%v groups of %v requests, want 2 of 4 (the stalled deposit, then the three queued behind it)", n, reqs)
	}
}

// TestGroupedSwitch: the admin port switches a cell to grouped and sets the
// group limits; bad limits are refused and change nothing.
func TestGroupedSwitch(t *testing.T) {
	// The relay is off: the open's credit, booked here through the committer
	// too, would add a group of its own at its own time.
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		cfg.Degrade.Relay = true
	})
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	var st api.StrategySetting
	if code, _ := adminCall(t, c, "PUT", "Bearer "+adminToken, `{"strategy":"grouped","group_max":64,"group_wait_ms":1}`, false, &st); code != 200 ||
		st.Strategy != cell.StrategyGrouped || st.GroupMax != 64 || st.GroupWaitMS != 1 || st.BatchMax != 128 {
		t.Fatalf("switch to grouped: %d %+v", code, st)
	}
	for _, body := range []string{`{"group_max":0}`, `{"group_max":5000}`, `{"group_wait_ms":-1}`, `{"group_wait_ms":1001}`, `{"strategy":"grupped"}`} {
		if code, errCode := adminCall(t, c, "PUT", "Bearer "+adminToken, body, false, nil); code != 400 || errCode != "INVALID_ARGUMENT" {
			t.Errorf("%s: %d %s", body, code, errCode)
		}
	}
	if got := cellStrategy(t, c); got != cell.StrategyGrouped {
		t.Fatalf("strategy %q, want grouped", got)
	}
	pre := testenv.Prefix()
	c.deposit(t, pre+"-s", 500)
	id := c.send(t, pre+"-s", 500, 1, "s1")
	if o := openOne(t, c, nil, id, pre+"-u"); o.Amount != 500 {
		t.Fatalf("claim %+v", o)
	}
	if g := groupsOf(t, c, "real"); g.commits != 3 {
		t.Fatalf("%v groups for a deposit, a send and an open", g.commits)
	}
}
