package cell_test

import (
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// logLines collects a cell's log for a test to count.
type logLines struct{ testenv.Buffer }

// logLine is one line of slog's text handler: its level, message and space.
type logLine struct{ level, msg, space string }

var (
	levelRE = regexp.MustCompile(`level=(\w+)`)
	msgRE   = regexp.MustCompile(`msg=("(?:[^"\\]|\\.)*"|\S+)`)
	spaceRE = regexp.MustCompile(` space=(\w+)`)
)

// lines returns every line logged so far.
func (l *logLines) lines() []logLine {
	var out []logLine
	for _, s := range strings.Split(l.String(), "\n") {
		lv, m := levelRE.FindStringSubmatch(s), msgRE.FindStringSubmatch(s)
		if lv == nil || m == nil {
			continue
		}
		ll := logLine{level: lv[1], msg: strings.Trim(m[1], `"`)}
		if sp := spaceRE.FindStringSubmatch(s); sp != nil {
			ll.space = sp[1]
		}
		out = append(out, ll)
	}
	return out
}

// recoveryOf names the line that ends each incident whose start line is
// the key; every start line the cell writes must be here.
var recoveryOf = map[string]string{
	"circuit breaker opened":                  "circuit breaker closed",
	"expiry scan failing":                     "expiry scan recovered",
	"expiry refund failing":                   "expiry refund recovered",
	"reconciliation window read failing":      "reconciliation window read recovered",
	"reconciliation credit read failing":      "reconciliation credit read recovered",
	"schema warm-up failing":                  "schema warm-up recovered",
	"audit of the cell's books could not run": "audit of the cell's books runs again",
	"open batch failed":                       "open batches commit again",
	"request failed":                          "requests answered again",
	"relay position failing":                  "relay position recovered",
	"relay claims read failing":               "relay claims read recovered",
	"relay delivery failing":                  "relay delivery recovered",
	"reward booking failing":                  "reward booking recovered",
	"reward reconciliation read failing":      "reward reconciliation read recovered",
	"budget lease expiry failing":             "budget lease expiry recovered",
}

// TestOutageLogsBounded: a cell owning the shards of three databases, whose
// MariaDB is down from the start (a stopped proxy in front of the test
// server), runs its background work every 50 ms (expiry, reconciliation,
// relay), retries its schema warm-up every 200 ms, audits every 500 ms, and
// is scraped and asked for accounts, deposits and opens. In 3 s of that it
// logs each kind of warning or error at most twice (once per space), where it
// logged a line per attempt before (per database and pass for
// reconciliation: hundreds). When the database is back, every kind that
// logged its start logs its end, and the cell serves again.
func TestOutageLogsBounded(t *testing.T) {
	direct := testenv.MySQLDSN(t, 1)
	target := strings.TrimSuffix(strings.TrimPrefix(direct[strings.Index(direct, "@tcp(")+len("@tcp("):], ""), ")/")
	proxy := testenv.NewProxy(target)
	proxy.Start(t)
	proxy.Stop() // down from the start: the port refuses
	logs := &logLines{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	peers := &staticPeers{}
	c := startCellLog(t, "outage", "0-29", 1, peers, func(cfg *cell.Config) {
		cfg.DSN = "root@tcp(" + proxy.Addr() + ")/"
		cfg.RelayInterval, cfg.ExpiryInterval, cfg.ReconInterval = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		cfg.ReconSettle, cfg.AuditInterval = 100*time.Millisecond, 500*time.Millisecond
		cfg.WarmSchema, cfg.WarmRetry = true, 200*time.Millisecond
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
	}, log)
	m, _ := sharding.NewMap([]sharding.Cell{{Name: c.name, Addr: c.addr, Shards: c.cfg.Shards}})
	peers.m.Store(m)
	pre := testenv.Prefix()
	act := actIn(t, pre+"-u", c.cfg.Shards)
	fakePacket := string(model.NewPacketID(5, time.Now()))
	traffic := func() (statuses string) {
		st1, _ := call(t, "GET", c.url+"/v1/accounts/"+act, nil, nil)
		st2, _ := call(t, "POST", c.url+"/v1/accounts/"+act+"/deposit", api.DepositRequest{OrderNo: pre + "-d", Amount: 100}, nil)
		st3, _ := call(t, "POST", c.url+"/v1/packets/"+fakePacket+"/open", api.ActRequest{ActID: act}, nil)
		_, _ = client.Get(c.adminURL + "/metrics")
		return fmt.Sprint(st1, st2, st3)
	}

	end := time.Now().Add(3 * time.Second)
	pace := time.NewTicker(100 * time.Millisecond) // about 30 rounds of traffic in the 3 s the logs are judged over
	defer pace.Stop()
	for time.Now().Before(end) {
		if st := traffic(); st != "503 503 503" {
			t.Fatalf("with the database down: account, deposit, open answered %s, want 503 each", st)
		}
		<-pace.C
	}
	down := logs.lines()
	counts := map[string]int{}
	starts := map[logLine]bool{}
	for _, l := range down {
		if l.level == "WARN" || l.level == "ERROR" {
			counts[l.msg]++
			starts[logLine{msg: l.msg, space: l.space}] = true
		}
	}
	t.Logf("warnings and errors in 3 s with the database down: %v", counts)
	for msg, n := range counts {
		if n > 2 {
			t.Errorf("%q logged %d times in 3 s, want at most 2 (once per space)", msg, n)
		}
		if _, ok := recoveryOf[msg]; !ok {
			t.Errorf("%q: not a start line the test knows (a line per attempt?)", msg)
		}
	}
	for _, want := range []string{"circuit breaker opened", "expiry scan failing", "reconciliation window read failing",
		"schema warm-up failing", "audit of the cell's books could not run", "relay position failing"} {
		if counts[want] == 0 {
			t.Errorf("no %q while the database was down", want)
		}
	}

	proxy.Start(t) // the database is back
	back := time.Now()
	var missing []string
	for tries := 0; ; tries++ {
		ended := map[logLine]bool{}
		for _, l := range logs.lines() {
			ended[logLine{msg: l.msg, space: l.space}] = true
		}
		missing = missing[:0]
		for s := range starts {
			if !ended[logLine{msg: recoveryOf[s.msg], space: s.space}] {
				missing = append(missing, fmt.Sprintf("%s (space %q)", recoveryOf[s.msg], s.space))
			}
		}
		if len(missing) == 0 || tries == 150 {
			break
		}
		traffic()
		<-pace.C
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%s after the database came back, no %v", time.Since(back).Round(time.Millisecond), missing)
	}
	if st, code := call(t, "GET", c.url+"/v1/accounts/"+act, nil, nil); st != 200 {
		t.Fatalf("account after the database came back: %d %s", st, code)
	}
	t.Logf("every incident logged its end within %s of the database's return", time.Since(back).Round(time.Millisecond))
}
