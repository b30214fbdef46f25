package rules

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

var routeNames = []string{"", "open", "detail", "account"}

type countBucket struct{ left int }

func (b *countBucket) Allow(string) (bool, time.Duration) {
	if b.left == 0 {
		return false, 1500 * time.Millisecond
	}
	b.left--
	return true, 0
}

func newCount(string, int, int) (Bucket, error) { return &countBucket{left: 1}, nil }

// Every mistake in a rules file is refused with the rule or route named.
func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"admit:\n  opne: 1\n", `unknown route "opne"`},
		{"admit:\n  open: 101\n", "percent 0..100"},
		{"retry_after: -1\n", "retry_after"},
		{"rules:\n  - name: a\n    action: block\n", "needs a condition"},
		{"rules:\n  - name: a\n    ips: [300.1.1.1]\n    action: block\n", "neither a CIDR"},
		{"rules:\n  - name: a\n    header: X\n    action: block\n", "header and pattern go together"},
		{"rules:\n  - name: a\n    header: X\n    pattern: '('\n    action: block\n", "pattern"},
		{"rules:\n  - name: a\n    act_ids: [x]\n    action: limit\n", "limit.per_sec"},
		{"rules:\n  - name: a\n    act_ids: [x]\n    action: block\n    limit: {per_sec: 1, burst: 1}\n", "takes no limit"},
		{"rules:\n  - name: a\n    act_ids: [x]\n    action: drop\n", "want block or limit"},
		{"rules:\n  - name: a\n    act_ids: [x]\n    action: limit\n    limit: {per_sec: 1, burst: 1, by: phone}\n", "limit.by"},
		{"rules:\n  - name: a\n    act_ids: [x]\n    action: block\n  - name: a\n    act_ids: [y]\n    action: block\n", "taken by an earlier rule"},
		{"rules:\n  - name: Bad Name\n    act_ids: [x]\n    action: block\n", "name must be"},
		{"rules:\n  - name: a\n    routes: [nope]\n    action: block\n", `unknown route "nope"`},
		{"rulez: []\n", "not a valid rules file"},
		{"rules:\n  - name: a\n    act_ids: ['']\n    action: block\n", "act_ids"},
		{"rules:\n  - name: a\n    act_ids: [bob, 'a b']\n    action: block\n", `act_ids: "a b"`},
	} {
		_, err := Parse([]byte(c.file), routeNames, newCount)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.file, err, c.want)
		}
	}
}

// The first rule that matches decides; every condition of a rule must hold;
// a limit rule counts by address or act_id; the degrade switch comes first.
func TestCheckOrder(t *testing.T) {
	tab, err := Parse([]byte(`
admit: {detail: 0}
rules:
  - name: net-and-ua
    ips: [10.0.0.0/8]
    header: User-Agent
    pattern: bot
    action: block
  - name: per-act
    routes: [open]
    action: limit
    limit: {per_sec: 1, burst: 1, by: act_id}
`), routeNames, newCount)
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(v string) func(string) []byte { return func(string) []byte { return []byte(v) } }
	in, out := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("192.0.2.1")
	for i, c := range []struct {
		q     Request
		want  Verdict
		rule  string
		retry int
	}{
		{Request{Route: 3, IP: in, Header: hdr("a bot")}, Blocked, "net-and-ua", 0},
		{Request{Route: 3, IP: out, Header: hdr("a bot")}, Pass, "", 0}, // address does not match
		{Request{Route: 3, IP: in, Header: hdr("browser")}, Pass, "", 0},
		{Request{Route: 2, IP: out, Header: hdr("")}, Degraded, "", 5},
		{Request{Route: 1, IP: out, ActID: "a", Header: hdr("")}, Pass, "", 0}, // the bucket's one token
		{Request{Route: 1, IP: out, ActID: "a", Header: hdr("")}, Limited, "per-act", 2},
		{Request{Route: 1, IP: out, ActID: "", Header: hdr("")}, Pass, "", 0}, // nothing to count by
	} {
		v, rule, retry := tab.Check(&c.q)
		if v != c.want || rule != c.rule || retry != c.retry {
			t.Errorf("case %d: %v %q %d, want %v %q %d", i, v, rule, retry, c.want, c.rule, c.retry)
		}
	}
	if tab.Idle() {
		t.Fatal("a table with rules is not idle")
	}
	if !Empty(4).Idle() {
		t.Fatal("the empty table is idle")
	}
	s := tab.Summary(routeNames)
	if s.Admit["detail"] != 0 || len(s.Admit) != 1 || s.Degraded["detail"] != 1 || s.Rules[0].Refused != 1 || s.Rules[1].Refused != 1 {
		t.Fatalf("summary: %+v", s)
	}
}

// A limit by act_id does not match a request without one: the rules after
// it still decide (it once passed such a request unseen by them). An
// IPv4-mapped address or prefix in ips matches the IPv4 client it maps.
func TestCheckActLimitWithoutActAndMappedIPs(t *testing.T) {
	tab, err := Parse([]byte(`
rules:
  - name: per-act
    routes: [open, account]
    action: limit
    limit: {per_sec: 1, burst: 1, by: act_id}
  - name: bad-net
    ips: ["::ffff:203.0.113.0/120", "::ffff:198.51.100.7"]
    action: block
`), routeNames, newCount)
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(string) []byte { return nil }
	bad, bad2, good := netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("192.0.2.1")
	for i, c := range []struct {
		q    Request
		want Verdict
		rule string
	}{
		{Request{Route: 1, IP: bad, Header: hdr}, Blocked, "bad-net"}, // no act_id: per-act does not decide
		{Request{Route: 2, IP: bad2, Header: hdr}, Blocked, "bad-net"},
		{Request{Route: 1, IP: good, Header: hdr}, Pass, ""},
		{Request{Route: 1, IP: bad, ActID: "a", Header: hdr}, Pass, ""}, // per-act's one token decides
		{Request{Route: 1, IP: bad, ActID: "a", Header: hdr}, Limited, "per-act"},
	} {
		if v, rule, _ := tab.Check(&c.q); v != c.want || rule != c.rule {
			t.Errorf("case %d: %v %q, want %v %q", i, v, rule, c.want, c.rule)
		}
	}
}

// A file of comments only (make run's template) is the empty table; one that
// does not parse keeps the table in force and says why.
func TestSourceReload(t *testing.T) {
	path := t.TempDir() + "/rules.yaml"
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("# admit:\n#   open: 0\n\n")
	src, err := Open(path, routeNames, newCount, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || !src.Table().Idle() {
		t.Fatalf("comments only: %v, idle %v", err, err == nil && src.Table().Idle())
	}
	write("admit:\n  open: 0\n")
	if changed, err := src.Reload(); !changed || err != nil || src.Table().Idle() {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if changed, err := src.Reload(); changed || err != nil {
		t.Fatalf("the same content again: changed %v, %v", changed, err)
	}
	write("admit: [")
	if _, err := src.Reload(); err == nil || src.LastError() == "" || src.Table().Idle() {
		t.Fatalf("a bad file: %v, last error %q, table %+v", err, src.LastError(), src.Table().Summary(routeNames))
	}
	if _, err := Open(path, routeNames, newCount, slog.Default()); err == nil {
		t.Fatal("Open of a bad file succeeded")
	}
	write("admit:\n  open: 0\n")
	if _, err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(path)
	if _, err := src.Reload(); err == nil || src.Table().Idle() || !strings.Contains(src.LastError(), "gone") {
		t.Fatalf("a removed file must keep the rules in force: %v, idle %v", err, src.Table().Idle())
	}
	write("")
	if _, err := src.Reload(); err != nil || !src.Table().Idle() {
		t.Fatalf("an empty file lifts them: %v", err)
	}
}
