package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/bench"
	"redcell/internal/testenv"
)

// doOpen is do for an open: an open shed with 503 OVERLOADED (the cell's
// credits behind, or its queue full: on a loaded test machine a credit can
// lag past credit_shed_from) is sent again after a moment, as an app does,
// for up to 60 s.
func doOpen(t *testing.T, url string, body, out any) (int, string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, code := do(t, "POST", url, body, out)
		if st != 503 || code != "OVERLOADED" || time.Now().After(deadline) {
			return st, code
		}
	}
}

func TestEndToEnd(t *testing.T) {
	// Servers of its own (the drills' deps): its audits read every row of
	// both cells, and the shared test servers hold what earlier packages'
	// tests left, in layouts of their own. Twice in a day a smoke run's
	// audit there found two claims credited on both servers while the
	// smoke's own openers all matched, most likely among those leftovers
	// (not proven: the notes of 2026-12-01); here it audits its own rows.
	d := startDrillDeps(t)
	c := startClusterSpec(t, clusterSpec{dsn: [2]string{d.dsn(0), d.dsn(1)}, mc: fmt.Sprintf("127.0.0.1:%d", d.mcPort), cell: e2eCell, identity: true})
	r := c.router
	pre := testenv.Prefix()
	sender := actIn(pre+"-s", 0, 499)      // cell-1
	far := actIn(pre+"-far", 500, 999)     // cell-2
	near := actIn(pre+"-near", 0, 499)     // cell-1
	other := actIn(pre+"-other", 500, 999) // cell-2

	var dep struct{ Balance int64 }
	if st, code := do(t, "POST", r+"/v1/accounts/"+sender+"/deposit", map[string]any{"amount": 10000, "order_no": "dep-1"}, &dep); st != 200 || dep.Balance != 10000 {
		t.Fatalf("deposit: %d %s %+v", st, code, dep)
	}
	do(t, "POST", r+"/v1/accounts/"+sender+"/deposit", map[string]any{"amount": 10000, "order_no": "dep-1"}, &dep)
	if dep.Balance != 10000 {
		t.Fatalf("a retried deposit moved the balance to %d", dep.Balance)
	}
	if st, code := do(t, "POST", r+"/v1/accounts/"+sender+"/deposit", map[string]any{"amount": 5, "order_no": "dep-1"}, nil); st != 409 || code != "ORDER_CONFLICT" {
		t.Fatalf("same order_no, other amount: %d %s", st, code)
	}
	if st, code := do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 20000, "count": 2, "order_no": "snd-x"}, nil); st != 409 || code != "INSUFFICIENT_BALANCE" {
		t.Fatalf("send above balance: %d %s", st, code)
	}
	if st, code := do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 5, "count": 10, "order_no": "snd-y"}, nil); st != 400 || code != "INVALID_ARGUMENT" {
		t.Fatalf("count above amount: %d %s", st, code)
	}
	var pkt api.SendResponse
	if st, code := do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 1000, "count": 3, "kind": "random", "greeting": "恭喜发财", "order_no": "snd-1"}, &pkt); st != 200 {
		t.Fatalf("send: %d %s", st, code)
	}
	var again api.SendResponse
	do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 1000, "count": 3, "kind": "random", "greeting": "恭喜发财", "order_no": "snd-1"}, &again)
	if again.PacketID != pkt.PacketID || !again.Repeat {
		t.Fatalf("retried send made %s, first %s", again.PacketID, pkt.PacketID)
	}
	var g api.GrabResponse
	if st, _ := do(t, "POST", r+"/v1/packets/"+pkt.PacketID+"/grab", map[string]any{"act_id": far}, &g); st != 200 || !g.Available || g.Remaining != 3 {
		t.Fatalf("grab: %d %+v", st, g)
	}
	claims := map[string]api.OpenResponse{}
	for _, who := range []string{far, near, other} {
		var o api.OpenResponse
		if st, code := doOpen(t, r+"/v1/packets/"+pkt.PacketID+"/open", map[string]any{"act_id": who}, &o); st != 200 {
			t.Fatalf("open by %s: %d %s", who, st, code)
		}
		claims[who] = o
	}
	if st, code := doOpen(t, r+"/v1/packets/"+pkt.PacketID+"/open", map[string]any{"act_id": pre + "-late"}, nil); st != 409 || code != "SOLD_OUT" {
		t.Fatalf("fourth open: %d %s", st, code)
	}
	var rep api.OpenResponse
	doOpen(t, r+"/v1/packets/"+pkt.PacketID+"/open", map[string]any{"act_id": far}, &rep)
	if rep.ClaimID != claims[far].ClaimID || !rep.Repeat {
		t.Fatalf("second open by the same user: %+v, first %+v", rep, claims[far])
	}
	var sum int64
	for who, cl := range claims {
		sum += cl.Amount
		deadline := time.Now().Add(10 * time.Second)
		for {
			var a struct{ Balance int64 }
			do(t, "GET", r+"/v1/accounts/"+who, nil, &a)
			if a.Balance == cl.Amount {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s balance %d, claim %d", who, a.Balance, cl.Amount)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if sum != 1000 {
		t.Fatalf("claims sum to %d", sum)
	}
	var detail api.PacketResponse
	do(t, "GET", r+"/v1/packets/"+pkt.PacketID+"?limit=2", nil, &detail)
	if detail.Status != "sold_out" || len(detail.Claims) != 2 || detail.NextAfter != 2 || detail.Greeting != "恭喜发财" {
		t.Fatalf("detail page 1: %+v", detail)
	}
	var page2 api.PacketResponse
	do(t, "GET", fmt.Sprintf("%s/v1/packets/%s?limit=2&after=%d", r, pkt.PacketID, detail.NextAfter), nil, &page2)
	if len(page2.Claims) != 1 || page2.NextAfter != 0 || page2.Claims[0].Seq != 3 {
		t.Fatalf("detail page 2: %+v", page2)
	}
	// A packet that expires with money left is refunded to the sender.
	var short api.SendResponse
	do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 500, "count": 5, "order_no": "snd-2"}, &short)
	var one api.OpenResponse
	doOpen(t, r+"/v1/packets/"+short.PacketID+"/open", map[string]any{"act_id": near}, &one)
	deadline := time.Now().Add(15 * time.Second)
	for {
		do(t, "GET", r+"/v1/packets/"+short.PacketID, nil, &detail)
		if detail.Status == "refunded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("packet never refunded: %+v", detail)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if detail.RefundAmount != 500-one.Amount {
		t.Fatalf("refund %d, want %d", detail.RefundAmount, 500-one.Amount)
	}
	var acct struct{ Balance int64 }
	do(t, "GET", r+"/v1/accounts/"+sender, nil, &acct)
	if acct.Balance != 10000-1000-500+detail.RefundAmount {
		t.Fatalf("sender balance %d", acct.Balance)
	}
	// Errors are JSON with stable codes.
	for _, bad := range []struct{ method, path, code string }{
		{"GET", "/v1/packets/nope", "INVALID_ARGUMENT"},
		{"GET", "/v1/packets/20261129000ffffffffffffffff", "NOT_FOUND"},
		{"GET", "/v1/accounts/a%27b", "INVALID_ARGUMENT"},
		{"DELETE", "/v1/accounts/" + sender, "METHOD_NOT_ALLOWED"},
		{"GET", "/v2/whatever", "NOT_FOUND"},
	} {
		if _, code := do(t, bad.method, r+bad.path, nil, nil); code != bad.code {
			t.Errorf("%s %s: code %s, want %s", bad.method, bad.path, code, bad.code)
		}
	}

	// Everything above went through the router, which signs what it forwards.
	// A cell called directly without the signature refuses, and changes nothing.
	if st, code := do(t, "POST", c.cellURL["cell-1"]+"/v1/accounts/"+sender+"/deposit", map[string]any{"amount": 100, "order_no": "dep-direct"}, nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("unsigned deposit straight to the cell: %d %s", st, code)
	}
	do(t, "GET", r+"/v1/accounts/"+sender, nil, &acct)
	if acct.Balance != 10000-1000-500+detail.RefundAmount {
		t.Fatalf("sender balance %d after an unsigned deposit", acct.Balance)
	}

	// The router takes only calling apps with a key: none, a key without the
	// route's scope and a stress mark it cannot verify are refused, and nothing
	// moves. A key revoked with redcell apikey (a process of its own, sharing
	// the key file) is refused by the running router within a few seconds.
	e2eAPIKeys(t, c, sender, acct.Balance)

	// What no other cluster test sends, for the API contract's checks
	// (docs/openapi.yaml; every exchange of this test is checked against it).
	openAPITour(t, c, sender, short.PacketID)

	// The admin port: no token or a wrong one is refused; the right one switches
	// the open strategy at run time, and the cell keeps paying out correctly.
	// adminAt sends method path to cell-1's admin port with token ("" none)
	// and answers the status and body.
	adminAt := func(method, path, token string, body string) (int, string) {
		req, _ := http.NewRequest(method, c.adminURL["cell-1"]+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, b := testenv.Do(t, nil, req)
		return resp.StatusCode, string(b)
	}
	admin := func(method, token string, body string) (int, string) {
		return adminAt(method, "/admin/strategy", token, body)
	}
	if st, _ := admin("GET", "", ""); st != 401 {
		t.Fatalf("admin without a token: %d", st)
	}
	if st, _ := admin("PUT", "wrong", `{"strategy":"naive"}`); st != 401 {
		t.Fatalf("admin with a wrong token: %d", st)
	}
	if st, body := admin("PUT", "e2e-admin-token-0123", `{"strategy":"serial"}`); st != 200 || !strings.Contains(body, `"serial"`) {
		t.Fatalf("set strategy: %d %s", st, body)
	}
	var h struct{ Strategy string }
	do(t, "GET", c.cellURL["cell-1"]+"/healthz", nil, &h)
	if h.Strategy != "serial" {
		t.Fatalf("cell-1 runs %q after the switch", h.Strategy)
	}
	var serialPkt api.SendResponse
	do(t, "POST", r+"/v1/packets", map[string]any{"sender": sender, "amount": 100, "count": 2, "order_no": "snd-serial"}, &serialPkt)
	for _, who := range []string{near, far, other} {
		doOpen(t, r+"/v1/packets/"+serialPkt.PacketID+"/open", map[string]any{"act_id": who}, nil)
	}
	do(t, "GET", r+"/v1/packets/"+serialPkt.PacketID, nil, &detail)
	if detail.RemainingCount != 0 || detail.RemainingAmount != 0 {
		t.Fatalf("serial packet after three opens: %+v", detail)
	}
	if st, _ := admin("PUT", "e2e-admin-token-0123", `{"strategy":"batched"}`); st != 200 {
		t.Fatalf("set strategy back: %d", st)
	}

	// The shard map as cell-1 sees it through memberlist: both cells, all
	// shards covered; only with the token.
	shards := func(token string) (int, api.ShardMapResponse) {
		st, body := adminAt("GET", "/admin/shards", token, "")
		var m api.ShardMapResponse
		_ = json.Unmarshal([]byte(body), &m)
		return st, m
	}
	if st, _ := shards(""); st != 401 {
		t.Fatalf("/admin/shards without the token: %d", st)
	}
	if st, m := shards("e2e-admin-token-0123"); st != 200 || m.Cell != "cell-1" || m.Shards != "0-499" || m.Uncovered != 0 || len(m.Cells) != 2 ||
		m.Cells[0].Addr != strings.TrimPrefix(c.cellURL[m.Cells[0].Name], "http://") || m.Cells[0].StartedMS == 0 {
		t.Fatalf("/admin/shards: %d %+v", st, m)
	}

	// Metrics: the router's and a cell's on their admin ports without the
	// token, both with the Go runtime's series of the process; none on the
	// router's public port.
	if st, code := do(t, "GET", r+"/metrics", nil, nil); st != 404 || code != "NOT_FOUND" {
		t.Fatalf("/metrics on the router's public port: %d %s", st, code)
	}
	for name, url := range map[string]string{"router": c.routerAdmin, "cell-1 admin": c.adminURL["cell-1"]} {
		st, b := testenv.Get(t, url+"/metrics")
		want := map[string]string{"router": `redcell_router_request_duration_seconds_count{code="SOLD_OUT",route="open"} 2`,
			"cell-1 admin": `redcell_breaker_state{breaker="db"} 0`}[name]
		if st != 200 || !strings.Contains(string(b), want) || !strings.Contains(string(b), "go_goroutines ") {
			t.Fatalf("%s /metrics: %d, want %q and go_goroutines in:\n%s", name, st, want, b)
		}
	}

	// The audit proves conservation over every row of both cells.
	out, err := exec.Command(c.bin, "audit", "--config", c.config).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "audit OK") {
		t.Fatalf("audit: %v\n%s", err, out)
	}

	// A short smoke load through the router, ending with a clean audit, once the
	// cells have finished creating today's and tomorrow's tables (a startup phase
	// whose DDL load would otherwise make the first opens wait).
	c.waitSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// No shadow tables made first (--prepare-shadow=false): a 2 s smoke load
	// touches a few shards, and making every shard's would be most of the
	// test's time (TestPrepareShadow covers that step).
	bench := exec.CommandContext(ctx, c.bin, "bench", "--router", r, "--config", c.config, "--prepare-shadow=false", "--bare=false", "--senders", "2", "--openers", "8", "--duration", "2s", "--allow-shed")
	if out, err := bench.CombinedOutput(); err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	// And straight to the cells, signed with the config's cluster secret.
	direct := exec.CommandContext(ctx, c.bin, "bench", "--router", r, "--config", c.config, "--prepare-shadow=false", "--bare=false", "--direct", "--senders", "2", "--openers", "8", "--duration", "1s", "--allow-shed")
	if out, err := direct.CombinedOutput(); err != nil {
		t.Fatalf("bench --direct: %v\n%s", err, out)
	}
	e2eBenchWork(ctx, t, c)
	e2eBenchExternal(ctx, t, c)

	// cell-2 leaves: its shards answer 503 within a bounded time, cell-1's still work.
	c.stop(t, "cell-2")
	c.waitReady(t, 500)
	if st, code := do(t, "GET", r+"/v1/accounts/"+far, nil, nil); st != 503 || code != "CELL_UNAVAILABLE" {
		t.Fatalf("account on the stopped cell: %d %s", st, code)
	}
	if st, _ := do(t, "GET", r+"/v1/accounts/"+near, nil, nil); st != 200 {
		t.Fatalf("account on the live cell: %d", st)
	}
}

// e2eAPIKeys checks the router's callers' authentication end to end; sender
// holds balance cents, which no refused call may change.
func e2eAPIKeys(t *testing.T, c *cluster, sender string, balance int64) {
	t.Helper()
	r := c.router
	send := func(method, path, body string, hdr map[string]string) (int, string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, r+path, rd)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code
	}
	deposit := `{"amount":100,"order_no":"dep-auth"}`
	path := "/v1/accounts/" + sender + "/deposit"
	if st, code := send("POST", path, deposit, map[string]string{"Content-Type": "application/json"}); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("deposit without a key: %d %s", st, code)
	}
	if st, code := send("POST", path, deposit, map[string]string{"Authorization": "Bearer " + testAPIKey}); st != 415 || code != "UNSUPPORTED_MEDIA_TYPE" {
		t.Fatalf("deposit sent as a form (curl -d's default): %d %s", st, code)
	}
	if st, code := send("POST", path, deposit, map[string]string{"Authorization": "Bearer " + testAPIKey, "Content-Type": "application/json", api.HeaderStress: "1"}); st != 403 || code != "PERMISSION_DENIED" {
		t.Fatalf("deposit marked as stress traffic without the cluster's signature: %d %s", st, code)
	}
	out, err := exec.Command(c.bin, "apikey", "add", "--config", c.config, "--app", "reader", "--scopes", "read").Output()
	if err != nil {
		t.Fatalf("apikey add: %v", err)
	}
	reader := strings.TrimSpace(string(out))
	readHdr := map[string]string{"Authorization": "Bearer " + reader, "Content-Type": "application/json"}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the router to take a key added by redcell apikey", func() bool { st, _ := send("GET", "/v1/accounts/"+sender, "", readHdr); return st == 200 })
	if st, code := send("POST", path, deposit, readHdr); st != 403 || code != "PERMISSION_DENIED" {
		t.Fatalf("deposit with a read-only key: %d %s", st, code)
	}
	id := strings.SplitN(reader, "_", 3)[1]
	if out, err := exec.Command(c.bin, "apikey", "revoke", "--config", c.config, "--id", id).CombinedOutput(); err != nil {
		t.Fatalf("apikey revoke: %v\n%s", err, out)
	}
	waitFor("the router to refuse a revoked key", func() bool { st, _ := send("GET", "/v1/accounts/"+sender, "", readHdr); return st == 401 })
	var acct struct{ Balance int64 }
	if st, _ := do(t, "GET", r+"/v1/accounts/"+sender, nil, &acct); st != 200 || acct.Balance != balance {
		t.Fatalf("refused calls moved the balance: %d → %d", balance, acct.Balance)
	}
}

// e2eBenchWork runs a short roundrobin load with --work and checks what it
// says an open costs: statements with the idle rate within bounds an open
// could have (inserts among them), the net figures below them, CPU of every
// process measured (MariaDB's too: the test servers run on this machine),
// and memcached commands counted (0 or more: stress traffic skips the
// per-person limit).
func e2eBenchWork(ctx context.Context, t *testing.T, c *cluster) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "work.json")
	cmd := exec.CommandContext(ctx, c.bin, "bench", "--config", c.config, "--prepare-shadow=false", "--workload", "roundrobin",
		"--packets", "20", "--senders", "2", "--openers", "8", "--duration", "2s", "--idle-window", "1s", "--allow-shed", "--bare-duration", "1s", "--json", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bench --work: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var suite struct {
		Runs []struct {
			Open struct {
				OK int64 `json:"ok"`
			} `json:"open"`
			Work *bench.Work `json:"work"`
		} `json:"runs"`
		Bare *bench.BareReport `json:"bare"`
	}
	if err := json.Unmarshal(b, &suite); err != nil || len(suite.Runs) != 1 || suite.Runs[0].Work == nil {
		t.Fatalf("bench --work: %v, report:\n%s", err, b)
	}
	w := suite.Runs[0].Work
	t.Logf("roundrobin, work per open: %s", w.Text())
	if w.Ops < 10 || w.Ops > suite.Runs[0].Open.OK {
		t.Errorf("work over %d ops, of %d opens answered", w.Ops, suite.Runs[0].Open.OK)
	}
	in := func(name string, v *float64, lo, hi float64) {
		t.Helper()
		if v == nil || *v < lo || *v > hi {
			t.Errorf("%s per open = %v, want %.1f..%.1f (work %+v)", name, v, lo, hi, *w)
		}
	}
	// An open is at least its claim's INSERT and its packet's UPDATE, and a
	// credit's; far fewer than 60 statements however the cell groups them.
	// Gross: the idle rate, over 1 s, may or may not have caught a sweep of
	// the background readers, so the net figure is only bounded above.
	// The net figures (the idle rate taken off) are only bounded above: a
	// kind the background also runs (its UPDATEs, its round trips, its CPU)
	// may come out at 0 after a window that caught more of it than the run.
	in("statements with the idle rate", w.StatementsGross, 2, 60)
	in("statements", w.Statements, 0, 60)
	in("db round trips", w.DBRoundTrips, 0, 40)
	in("memcached commands", w.MemcachedCommands, 0, 20)
	if w.ByKind["insert"] <= 0 {
		t.Errorf("statements by kind %v: want inserts (each open's claim)", w.ByKind)
	}
	for _, p := range []string{"mariadb", "cells", "router", "memcached", "bench", "total"} {
		if _, ok := w.CPUMicros[p]; !ok {
			t.Errorf("no CPU of %s: %v (missing %v)", p, w.CPUMicros, w.Missing)
		}
	}
	if w.CPUMicros["total"] <= 0 {
		t.Errorf("CPU per open %v: the processes did work", w.CPUMicros)
	}
	if w.IdleStatementsPerSec == nil {
		t.Errorf("no idle rate (missing %v)", w.Missing)
	}

	// The floor beside it: the bare open ran after the run, 16 claims a
	// transaction of 5 statements (0.3125 an open), on the same servers,
	// metered the same way (the gross figure adds the idle rate's share),
	// and its database is gone.
	bare := suite.Bare
	if bare == nil || bare.Work == nil {
		t.Fatalf("bench --work: no bare run in the report:\n%s", b)
	}
	t.Logf("bare: %d opens in %d ms; work per open: %s", bare.Opens, bare.DurationMS, bare.Work.Text())
	if bare.Opens < 16 || bare.Opens != 16*bare.Transactions || bare.Work.Ops != bare.Opens {
		t.Errorf("bare: %+v", *bare)
	}
	if g := bare.Work.StatementsGross; g == nil || *g < 0.3 || *g > 1.5 {
		t.Errorf("bare: statements per open with the idle rate %v, want 0.3..1.5 (5 for 16 opens, plus the idle share)", g)
	}
	if bare.Work.Statements == nil || w.Statements == nil || *bare.Work.Statements >= *w.Statements {
		t.Errorf("bare: %v statements per open, the roundrobin run's %v: the floor is not below the open", bare.Work.Statements, w.Statements)
	}
	if _, ok := bare.Work.CPUMicros["mariadb"]; !ok {
		t.Errorf("bare: no MariaDB CPU: %v (missing %v)", bare.Work.CPUMicros, bare.Work.Missing)
	}
	db := openDB(t, c.spec.dsn[0])
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", bench.BareDatabase).Scan(&n); err != nil || n != 0 {
		t.Errorf("the bare database after the run: %d (%v), want dropped", n, err)
	}
}

// e2eBenchExternal: bench --external meters an outside command on the
// cluster: five deposits sent with curl to new accounts through the router,
// with the key and router the bench gives it; the report has its count and
// the servers' statements over it (each deposit at least its INSERT).
func e2eBenchExternal(ctx context.Context, t *testing.T, c *cluster) {
	t.Helper()
	dir := t.TempDir()
	command := `ok=0; for i in 1 2 3 4 5; do ` +
		`curl -fsS -o /dev/null -H "Authorization: Bearer $REDCELL_API_KEY" -H 'Content-Type: application/json' ` +
		`-d '{"amount": 100, "order_no": "x1"}' "$REDCELL_ROUTER_URL/v1/accounts/ext-$REDCELL_ROUND-$$-$i/deposit" && ok=$((ok+1)); done; ` +
		`echo "REDCELL_FRESH $ok"`
	cmd := exec.CommandContext(ctx, c.bin, "bench", "--config", c.config, "--idle-window", "1s", "--external-op", "deposit",
		"--external", command, "--out", dir)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bench --external: %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(dir, bench.ReportJSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.ExternalReport
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Runs) != 1 {
		t.Fatalf("bench --external: %v, report:\n%s", err, b)
	}
	r := rep.Runs[0]
	if r.Fresh != 5 || r.Error != "" || r.Work == nil || r.Work.Ops != 5 {
		t.Fatalf("bench --external: run %+v, want 5 deposits metered", r)
	}
	if g := r.Work.StatementsGross; g == nil || *g < 1 || *g > 200 {
		t.Errorf("bench --external: %v statements per deposit with the idle rate, want 1..200 (work %s)", g, r.Work.Text())
	}
	if _, err := os.Stat(filepath.Join(dir, bench.ChartFile)); err != nil {
		t.Error(err)
	}
	t.Logf("external deposits, work per deposit: %s", r.Work.Text())
}
