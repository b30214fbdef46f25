package cell_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// staticPeers is a fixed shard map: these tests wire cells directly; the real
// membership runs in the end-to-end test.
type staticPeers struct{ m atomic.Pointer[sharding.Map] }

func (p *staticPeers) Map() *sharding.Map { return p.m.Load() }

type testCell struct {
	name     string
	url      string
	addr     string
	cfg      cell.Config
	db       *sql.DB
	reg      *prometheus.Registry
	dbBreak  *guard.Breaker
	adminURL string // "" unless tune set cfg.AdminListen
	ns       string // the prefix of the cell's database names: "" but in a test of privateDatabases
}

// startCell runs a cell on 127.0.0.1 with a real store (test database dbN) and
// the real memcached, each behind a circuit breaker as in redcell cell, until
// the test ends. It logs warnings and errors to stderr.
func startCell(t *testing.T, name, shards string, dbN int, peers cell.Peers, tune func(*cell.Config)) *testCell {
	t.Helper()
	return startCellLog(t, name, shards, dbN, peers, tune, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// startCellLog is startCell logging to log. The store reaches the database
// at cfg.DSN as tune leaves it (a proxy, say); testCell.db reaches test
// database dbN directly.
func startCellLog(t *testing.T, name, shards string, dbN int, peers cell.Peers, tune func(*cell.Config), log *slog.Logger) *testCell {
	t.Helper()
	dsn := testenv.MySQLDSN(t, dbN)
	mcAddr := testenv.Memcached(t)
	ns := privatePrefix(t)
	if ns == "" {
		settleForLayout(t, shards, dbN)
	}
	cfg := cell.DefaultConfig()
	cfg.Name, cfg.Listen, cfg.DSN, cfg.Memcached = name, "127.0.0.1:0", dsn, []string{mcAddr}
	r, err := sharding.ParseRanges(shards)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Shards = r
	cfg.ClusterSecret = testSecret
	cfg.RelayInterval = 200 * time.Millisecond
	cfg.ExpiryInterval = 200 * time.Millisecond
	cfg.WarmSchema = false             // tables are created on first use; the e2e test runs the warm-up
	cfg.QueueWaitMax = 5 * time.Second // these tests check results, not shedding
	cfg.CreditShedFrom = 0             // nor shedding for credits (TestOpensShedWhileCreditsLag turns it on)
	if tune != nil {
		tune(&cfg)
	}
	store, err := storage.Open(cfg.DSN, cfg.MaxConns)
	if ns != "" {
		store, err = storage.OpenPrefixed(cfg.DSN, cfg.MaxConns, ns)
	}
	if err != nil {
		t.Fatal(err)
	}
	forgetReconPositions(t, dsn, ns)
	reg := prometheus.NewRegistry()
	dbBreak, err := guard.NewBreaker("db", guard.DefaultConfig(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	mcBreak, err := guard.NewBreaker("memcached", guard.DefaultConfig(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	mc := guard.NewMemcache(admission.NewClient(cfg.Memcached), mcBreak)
	if cfg.CouponMemcache == nil { // the coupon layers' pools, as redcell cell gives them
		cfg.CouponMemcache = mc
	}
	shadowStore := store.Shadow()
	store.SetBreaker(dbBreak)
	shadowStore.SetBreaker(dbBreak)
	stores := cell.Stores{Real: store, Shadow: shadowStore, ShadowDrop: shadowStore, Moves: store, RealCoupons: store, ShadowCoupons: shadowStore}
	// Without peers the cell knows itself only: its relay still reads the
	// claims past its saved positions (its own, or earlier tests' on the
	// shared server) and asks the map for their owners.
	var self *staticPeers
	if peers == nil {
		self = &staticPeers{}
		peers = self
	}
	srv, err := cell.New(cfg, stores, admission.NewSlots(mc, cfg.TxPerPacket, log), admission.NewCache(mc, log), peers, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if self != nil {
		m, err := sharding.NewMap([]sharding.Cell{{Name: name, Addr: ln.Addr().String(), Shards: cfg.Shards}})
		if err != nil {
			t.Fatal(err)
		}
		self.m.Store(m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cell %s: %v", name, err)
		}
		store.Close()
	})
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	addr := ln.Addr().String()
	tc := &testCell{name: name, url: "http://" + addr, addr: addr, cfg: cfg, db: db, reg: reg, dbBreak: dbBreak, ns: ns}
	if cfg.AdminListen != "" {
		// The admin port starts with Serve, beside the public one: a test
		// that reads it first waits for it.
		tc.adminURL = "http://" + cfg.AdminListen
		waitFor(t, 5*time.Second, func() bool { _, err := client.Get(tc.adminURL + "/metrics"); return err == nil }, "admin port of "+name+" up")
	}
	return tc
}

// forgetReconPositions drops the reconciliation positions saved in test
// database dsn (those of prefix ns): the tests share one database, and a cell started by a test is
// a new cell there, whose reconciliation must start when it does rather than
// resume where another test's cell stopped (and check that test's rows).
func forgetReconPositions(t *testing.T, dsn, ns string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, space := range []string{"", storage.ShadowPrefix} {
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + ns + space + "redcell_meta"); err != nil {
			t.Fatal(err)
		}
	}
}

// oneCell runs a cell owning every shard.
func oneCell(t *testing.T, tune func(*cell.Config)) *testCell {
	peers := &staticPeers{}
	c := startCell(t, "solo", "0-999", 1, peers, tune)
	m, _ := sharding.NewMap([]sharding.Cell{{Name: c.name, Addr: c.addr, Shards: c.cfg.Shards}})
	peers.m.Store(m)
	return c
}

// call sends a JSON request, signed as a router would sign it, and decodes a
// 200 answer into out; it returns the status and the error code of a non-200
// answer.
func call(t *testing.T, method, url string, body, out any) (int, string) {
	t.Helper()
	return callH(t, nil, method, url, body, out)
}

// callH is call with extra request headers.
func callH(t *testing.T, headers map[string]string, method, url string, body, out any) (int, string) {
	t.Helper()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	return callRaw(t, headers, method, url, raw, out)
}

// callRaw sends raw as the body (nil for none), signed.
func callRaw(t *testing.T, headers map[string]string, method, url string, raw []byte, out any) (int, string) {
	t.Helper()
	req := newRequest(headers, method, url, raw)
	signer.SignRequest(req, time.Now())
	return exchange(t, req, out)
}

// signer signs the tests' requests with the cells' secret, as routers and
// cells do; tests of the refusals build requests with newRequest and sign them
// otherwise, or not at all.
var signer = api.NewSigner(testSecret)

// fastClient sends the tests' requests to cells: fasthttp, like the router, so
// that what is signed (api.Signer.SignRequest) is what goes on the wire.
var fastClient = &fasthttp.Client{Name: "redcell-test", MaxConnsPerHost: 512, ReadTimeout: 20 * time.Second, WriteTimeout: 20 * time.Second}

// newRequest builds an unsigned JSON request with raw as the body (nil for none).
func newRequest(headers map[string]string, method, url string, raw []byte) *fasthttp.Request {
	req := &fasthttp.Request{}
	req.Header.SetMethod(method)
	req.SetRequestURI(url)
	req.Header.SetContentType("application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if raw != nil {
		req.SetBody(raw)
	}
	return req
}

// roundTrip sends req as it is and returns the answer.
func roundTrip(t *testing.T, req *fasthttp.Request) (*fasthttp.Response, error) {
	t.Helper()
	resp := &fasthttp.Response{}
	err := fastClient.DoTimeout(req, resp, 20*time.Second)
	return resp, err
}

// exchange sends req as it is and decodes a 200 answer into out; it returns
// the status and the error code of a non-200 answer.
func exchange(t *testing.T, req *fasthttp.Request, out any) (int, string) {
	t.Helper()
	method, url := string(req.Header.Method()), req.URI().String()
	resp, err := roundTrip(t, req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return 0, "TRANSPORT"
	}
	b := resp.Body()
	if resp.StatusCode() != http.StatusOK {
		var e api.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" {
			t.Errorf("%s %s: status %d with a body that is not an error body: %s", method, url, resp.StatusCode(), b)
		}
		return resp.StatusCode(), e.Error.Code
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Errorf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode(), ""
}

func (c *testCell) deposit(t *testing.T, act string, amount int64) {
	t.Helper()
	if st, code := call(t, "POST", c.url+"/v1/accounts/"+act+"/deposit", api.DepositRequest{Amount: amount, OrderNo: "dep-" + act}, nil); st != 200 {
		t.Fatalf("deposit: %d %s", st, code)
	}
}

func (c *testCell) send(t *testing.T, sender string, amount, count int64, order string) string {
	t.Helper()
	return c.sendKind(t, sender, amount, count, "random", order)
}

func (c *testCell) sendKind(t *testing.T, sender string, amount, count int64, kind, order string) string {
	t.Helper()
	var out api.SendResponse
	if st, code := call(t, "POST", c.url+"/v1/packets", api.SendRequest{Sender: sender, Amount: amount, Count: count, Kind: kind, OrderNo: order}, &out); st != 200 {
		t.Fatalf("send: %d %s", st, code)
	}
	return out.PacketID
}

func (c *testCell) balance(t *testing.T, act string) int64 {
	t.Helper()
	var a model.Account
	if st, code := call(t, "GET", c.url+"/v1/accounts/"+act, nil, &a); st != 200 {
		t.Fatalf("account: %d %s", st, code)
	}
	return int64(a.Balance)
}

// claimRows reads a packet's claims straight from the database.
func claimRows(t *testing.T, db *sql.DB, packetID string) (sum int64, n int, users map[string]bool) {
	t.Helper()
	ref, err := model.ParsePacketID(packetID)
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("SELECT act_id, amount FROM db_%02d.t_claim_%d_%02d WHERE packet_id = ?", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
	rows, err := db.Query(q, packetID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	users = map[string]bool{}
	for rows.Next() {
		var act string
		var amount int64
		if err := rows.Scan(&act, &amount); err != nil {
			t.Fatal(err)
		}
		if amount < 1 {
			t.Fatalf("claim of %d cents", amount)
		}
		if users[act] {
			t.Fatalf("user %s claimed twice", act)
		}
		users[act] = true
		sum += amount
		n++
	}
	return sum, n, users
}

func packetRow(t *testing.T, db *sql.DB, packetID string) (remainingAmount, remainingCount, refund int64, status int) {
	t.Helper()
	ref, _ := model.ParsePacketID(packetID)
	q := fmt.Sprintf("SELECT remaining_amount, remaining_count, refund_amount, status FROM db_%02d.t_packet_%d_%02d WHERE packet_id = ?", ref.Shard.DB(), ref.Shard.Table(), ref.Day)
	if err := db.QueryRow(q, packetID).Scan(&remainingAmount, &remainingCount, &refund, &status); err != nil {
		t.Fatal(err)
	}
	return
}

// openAll has every user open the packet at once and returns the answers.
func openAll(t *testing.T, url, packetID string, users []string) []struct {
	status int
	code   string
	claim  api.OpenResponse
} {
	out := make([]struct {
		status int
		code   string
		claim  api.OpenResponse
	}, len(users))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i].status, out[i].code = call(t, "POST", url+"/v1/packets/"+packetID+"/open", api.ActRequest{ActID: u}, &out[i].claim)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

const testSecret = "test-cluster-secret-0123456789"

var strategies = []string{cell.StrategyNaive, cell.StrategySerial, cell.StrategyBatched, cell.StrategyGrouped}

// TestManyUsersOpenOnePacket: 200 distinct users open packet(1000, 10) at once:
// exactly 10 claims summing to 1000, remaining 0, never negative; three rounds;
// then count=1 with 64 openers, and a fixed packet. Every strategy must give the
// same results.
func TestManyUsersOpenOnePacket(t *testing.T) {
	for _, strategy := range strategies {
		t.Run(strategy, func(t *testing.T) {
			c := oneCell(t, func(cfg *cell.Config) { cfg.OpenStrategy = strategy })
			pre := testenv.Prefix()
			sender := pre + "-s"
			c.deposit(t, sender, 100000)
			for round, shape := range [][3]int64{{1000, 10, 0}, {1000, 10, 0}, {1000, 10, 0}, {777, 1, 0}, {999, 9, 1}} {
				openers := 200
				if shape[1] == 1 {
					openers = 64
				}
				kind := map[int64]string{0: "random", 1: "fixed"}[shape[2]]
				id := c.sendKind(t, sender, shape[0], shape[1], kind, fmt.Sprintf("snd-%d", round))
				users := make([]string, openers)
				for i := range users {
					users[i] = fmt.Sprintf("%s-r%d-u%d", pre, round, i)
				}
				answers := openAll(t, c.url, id, users)
				won, sum := 0, int64(0)
				for i, a := range answers {
					switch {
					case a.status == 200:
						won++
						sum += a.claim.Amount
						if a.claim.ActID != users[i] || a.claim.Amount < 1 || a.claim.Repeat || kind == "fixed" && a.claim.Amount != 111 {
							t.Fatalf("claim %+v for %s", a.claim, users[i])
						}
					case a.code != "SOLD_OUT":
						t.Fatalf("open answered %d %s", a.status, a.code)
					}
				}
				if won != int(shape[1]) || sum != shape[0] {
					t.Fatalf("round %d: %d claims answered summing to %d, want %d summing to %d", round, won, sum, shape[1], shape[0])
				}
				rowSum, n, _ := claimRows(t, c.db, id)
				remA, remC, _, status := packetRow(t, c.db, id)
				if rowSum != shape[0] || n != int(shape[1]) || remA != 0 || remC != 0 || status != int(model.StatusSoldOut) {
					t.Fatalf("rows: claims %d in %d, remaining %d in %d, status %d", rowSum, n, remA, remC, status)
				}
				var detail api.PacketResponse
				call(t, "GET", c.url+"/v1/packets/"+id+"?limit=100", nil, &detail)
				if detail.RemainingCount != 0 || detail.Status != "sold_out" || len(detail.Claims) != int(shape[1]) {
					t.Fatalf("detail %+v", detail)
				}
			}
		})
	}
}

// TestOneUserManyOpens: one user opens one packet 20 times at once: one claim,
// one credit, 19 answers that return that same claim.
func TestOneUserManyOpens(t *testing.T) {
	for _, strategy := range strategies {
		t.Run(strategy, func(t *testing.T) {
			c := oneCell(t, func(cfg *cell.Config) { cfg.OpenStrategy = strategy })
			pre := testenv.Prefix()
			sender, user := pre+"-s", pre+"-u"
			c.deposit(t, sender, 1000)
			id := c.send(t, sender, 1000, 10, "snd-1")
			users := make([]string, 20)
			for i := range users {
				users[i] = user
			}
			answers := openAll(t, c.url, id, users)
			first, repeats := "", 0
			var amount int64
			for _, a := range answers {
				if a.status != 200 {
					t.Fatalf("open answered %d %s", a.status, a.code)
				}
				if first == "" {
					first, amount = a.claim.ClaimID, a.claim.Amount
				}
				if a.claim.ClaimID != first || a.claim.Amount != amount {
					t.Fatalf("two claims: %s and %s", first, a.claim.ClaimID)
				}
				if a.claim.Repeat {
					repeats++
				}
			}
			if repeats != 19 {
				t.Fatalf("%d repeats, want 19", repeats)
			}
			if _, n, _ := claimRows(t, c.db, id); n != 1 {
				t.Fatalf("%d claim rows", n)
			}
			waitFor(t, 10*time.Second, func() bool { return c.balance(t, user) == amount }, "claimant credited")
			shard := sharding.ShardOfAct(user)
			var credits int
			c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_flow_%d WHERE act_id = ? AND kind = 'credit'", shard.DB(), shard.Table()), user).Scan(&credits)
			if credits != 1 {
				t.Fatalf("%d credit flows", credits)
			}
		})
	}
}

func waitFor(t *testing.T, limit time.Duration, cond func() bool, what string) {
	t.Helper()
	if !testenv.Until(limit, cond) {
		t.Fatalf("timed out waiting for: %s", what)
	}
}
