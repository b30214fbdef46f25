package cell_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// moneyRows is what a refused call must leave as it was, in both spaces (real
// and shadow): the balances and flow rows of some accounts, the packets they
// sent, and the claims (with where their credits went) and remainders of
// some packets. A table that does not exist counts -1, so creating it shows
// as a change too.
type moneyRows map[string]int64

// rowDays are the days of month whose packet tables readMoneyRows counts:
// the day the tests started and the next.
var rowDays = [2]int{time.Now().UTC().Day(), time.Now().UTC().Add(24 * time.Hour).Day()}

func readMoneyRows(t *testing.T, db *sql.DB, acts, packetIDs []string) moneyRows {
	t.Helper()
	rows := moneyRows{}
	for _, space := range []string{"", "shadow_"} {
		for _, act := range acts {
			sh := sharding.ShardOfAct(act)
			at := fmt.Sprintf("%sdb_%02d.", space, sh.DB())
			rows[space+act+" balance"] = count(t, db, "SELECT COALESCE(SUM(balance), 0) FROM "+at+fmt.Sprintf("t_account_%d WHERE act_id = ?", sh.Table()), act)
			rows[space+act+" flows"] = count(t, db, "SELECT COUNT(*) FROM "+at+fmt.Sprintf("t_flow_%d WHERE act_id = ?", sh.Table()), act)
			for _, day := range rowDays { // both, so that a run across midnight compares the same tables
				rows[fmt.Sprintf("%s%s packets on day %d", space, act, day)] = count(t, db, "SELECT COUNT(*) FROM "+at+fmt.Sprintf("t_packet_%d_%02d WHERE sender = ?", sh.Table(), day), act)
			}
		}
		for _, id := range packetIDs {
			ref, err := model.ParsePacketID(id)
			if err != nil {
				t.Fatal(err)
			}
			at := fmt.Sprintf("%sdb_%02d.", space, ref.Shard.DB())
			rows[space+id+" claims"] = count(t, db, "SELECT COUNT(*) FROM "+at+fmt.Sprintf("t_claim_%d_%02d WHERE packet_id = ?", ref.Shard.Table(), ref.Day), id)
			rows[space+id+" remaining"] = count(t, db, "SELECT COALESCE(SUM(remaining_amount), 0) FROM "+at+fmt.Sprintf("t_packet_%d_%02d WHERE packet_id = ?", ref.Shard.Table(), ref.Day), id)
			rows[space+id+" claims sent"] = count(t, db, "SELECT COUNT(*) FROM "+at+fmt.Sprintf("t_claim_%d_%02d WHERE packet_id = ? AND dest <> ''", ref.Shard.Table(), ref.Day), id)
		}
	}
	return rows
}

// count runs a query of one number; -1 when its table does not exist.
func count(t *testing.T, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	err := db.QueryRow(q, args...).Scan(&n)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && (me.Number == 1146 || me.Number == 1049): // no such table or database
		return -1
	case err != nil:
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// forgeries are the ways a request can fail its signature check, each applied
// to a request built with the honest body; tampered is another body for it,
// otherPath another path ("" when the route has no other to take).
var forgeries = []struct {
	name  string
	forge func(req *fasthttp.Request, tampered []byte, otherURL string)
}{
	{"no signature", func(*fasthttp.Request, []byte, string) {}},
	{"signed with another secret", func(req *fasthttp.Request, _ []byte, _ string) {
		api.NewSigner("another-cluster-secret-0123").SignRequest(req, time.Now())
	}},
	{"body changed after signing", func(req *fasthttp.Request, tampered []byte, _ string) {
		signer.SignRequest(req, time.Now())
		req.SetBody(tampered)
	}},
	{"path changed after signing", func(req *fasthttp.Request, _ []byte, otherURL string) {
		signer.SignRequest(req, time.Now())
		req.SetRequestURI(otherURL)
	}},
	{"replayed after the window", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now().Add(-api.SignatureWindow-time.Second))
	}},
	{"timestamp in the future", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now().Add(api.SignatureWindow+time.Second))
	}},
	{"timestamp changed after signing", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now().Add(-time.Second))
		req.Header.Set(api.HeaderTimestamp, fmt.Sprint(time.Now().UnixMilli()))
	}},
	{"stress signature sent as real", func(req *fasthttp.Request, _ []byte, _ string) {
		req.Header.Set(api.HeaderStress, "1")
		signer.SignRequest(req, time.Now())
		req.Header.Del(api.HeaderStress)
	}},
	{"real signature sent as stress", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now())
		req.Header.Set(api.HeaderStress, "1")
	}},
	{"replayed under another app", func(req *fasthttp.Request, _ []byte, _ string) {
		req.Header.Set(api.HeaderApp, "chat")
		signer.SignRequest(req, time.Now())
		req.Header.Set(api.HeaderApp, "shop")
	}},
	{"app added after signing", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now())
		req.Header.Set(api.HeaderApp, "shop")
	}},
	{"partial flag added after signing", func(req *fasthttp.Request, _ []byte, _ string) {
		signer.SignRequest(req, time.Now())
		req.Header.Set(api.HeaderPartial, "1")
	}},
}

// TestUnsignedCallsRefused: deposit, send, open and relayed credits that are
// unsigned, signed with another secret, changed after signing, replayed after
// the window, dated in the future, moved to the other money space or given
// another app or the partial flag after signing are
// refused with 401 UNAUTHENTICATED, and no row changes in either cell; the
// same calls signed properly then succeed, so it was the signature that
// stopped them. Every call is one the cluster could make, so the rows stay
// ones the audit accepts: the credit is that of a real claim, held by the
// relay while the claimant's cell looks unreachable to it.
func TestUnsignedCallsRefused(t *testing.T) {
	a, b, join := twoCellsApart(t)
	pre := testenv.Prefix()
	sender, other := actIn(t, pre+"-s", a.cfg.Shards), actIn(t, pre+"-x", a.cfg.Shards)
	opener, claimant := actIn(t, pre+"-o", a.cfg.Shards), actIn(t, pre+"-c", b.cfg.Shards)
	a.deposit(t, sender, 1000)
	id := a.send(t, sender, 500, 2, "snd-1")
	id2 := a.send(t, sender, 300, 2, "snd-2")
	var claim api.OpenResponse
	if st, code := call(t, "POST", a.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: claimant}, &claim); st != 200 {
		t.Fatalf("open by the claimant: %d %s", st, code)
	}
	credit := func(amount int64) api.CreditsRequest {
		return api.CreditsRequest{Credits: []model.Credit{{ClaimID: claim.ClaimID, PacketID: model.PacketID(id), ActID: claimant,
			Shard: sharding.ShardOfAct(claimant), Amount: model.Cents(amount)}}}
	}
	calls := []struct {
		name      string
		to        *testCell
		path      string
		otherPath string // where a forger would move the call
		body      any
		tampered  any // what a forger would change the body to
	}{
		{"deposit", a, "/v1/accounts/" + sender + "/deposit", "/v1/accounts/" + other + "/deposit",
			api.DepositRequest{Amount: 100, OrderNo: "dep-x"}, api.DepositRequest{Amount: 1_000_000, OrderNo: "dep-x"}},
		{"send", a, "/v1/packets", "/v1/packets?x=1",
			api.SendRequest{Sender: sender, Amount: 100, Count: 1, OrderNo: "snd-x"}, api.SendRequest{Sender: sender, Amount: 400, Count: 1, OrderNo: "snd-x"}},
		{"open", a, "/v1/packets/" + id2 + "/open", "/v1/packets/" + id + "/open",
			api.ActRequest{ActID: opener}, api.ActRequest{ActID: other}},
		{"credits", b, "/internal/credits", "/internal/credits?x=1", credit(claim.Amount), credit(1_000_000)},
	}
	snapshot := func() [2]moneyRows {
		return [2]moneyRows{readMoneyRows(t, a.db, []string{sender, other, opener}, []string{id, id2}), readMoneyRows(t, b.db, []string{claimant}, nil)}
	}
	before := snapshot()
	for _, c := range calls {
		body, _ := json.Marshal(c.body)
		tampered, _ := json.Marshal(c.tampered)
		for _, f := range forgeries {
			req := newRequest(nil, "POST", c.to.url+c.path, body)
			f.forge(req, tampered, c.to.url+c.otherPath)
			if st, code := exchange(t, req, nil); st != 401 || code != "UNAUTHENTICATED" {
				t.Errorf("%s, %s: %d %s, want 401 UNAUTHENTICATED", c.name, f.name, st, code)
			}
		}
	}
	if after := snapshot(); !maps.Equal(before[0], after[0]) || !maps.Equal(before[1], after[1]) {
		t.Fatalf("refused calls changed rows:\nbefore %v\nafter  %v", before, after)
	}
	for _, c := range calls {
		if st, code := call(t, "POST", c.to.url+c.path, c.body, nil); st != 200 {
			t.Errorf("%s, signed: %d %s", c.name, st, code)
		}
	}
	after := snapshot()
	for i := range after {
		if maps.Equal(before[i], after[i]) {
			t.Errorf("cell %d: the signed calls changed nothing, so the refusals proved nothing", i)
		}
	}
	if got := b.balance(t, claimant); got != claim.Amount {
		t.Fatalf("claimant balance %d, want the claim's %d", got, claim.Amount)
	}
	// The relay holds the claim until a delivery of its own is acknowledged:
	// it finds the claimant's cell again, and its redelivery changes nothing.
	if held := creditsPending(t, a, "real"); held < 1 {
		t.Fatalf("%v credits held by the relay while the claimant's cell is unreachable, want at least 1", held)
	}
	join()
	waitFor(t, 10*time.Second, func() bool { return creditsPending(t, a, "real") == 0 }, "the relay's redelivery acknowledged and the credit let go")
	if got := b.balance(t, claimant); got != claim.Amount {
		t.Fatalf("claimant balance %d after the relay, want %d", got, claim.Amount)
	}
}

// TestSignatureCoversQueryAndRoutes: the detail page's query string is signed
// (a changed page is refused); an unsigned call to an unknown route is refused
// like any other, not answered 404; GET /healthz needs no signature.
func TestSignatureCoversQueryAndRoutes(t *testing.T) {
	c := oneCell(t, nil)
	pre := testenv.Prefix()
	c.deposit(t, pre+"-s", 100)
	id := c.send(t, pre+"-s", 100, 2, "snd-1")
	var detail api.PacketResponse
	if st, code := call(t, "GET", c.url+"/v1/packets/"+id+"?after=0&limit=1", nil, &detail); st != 200 || detail.PacketID != id {
		t.Fatalf("signed detail: %d %s", st, code)
	}
	req := newRequest(nil, "GET", c.url+"/v1/packets/"+id+"?after=0&limit=1", nil)
	signer.SignRequest(req, time.Now())
	req.SetRequestURI(c.url + "/v1/packets/" + id + "?after=0&limit=100")
	if st, code := exchange(t, req, nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("detail with its query changed after signing: %d %s", st, code)
	}
	if st, code := exchange(t, newRequest(nil, "GET", c.url+"/v1/accounts/"+pre+"-s", nil), nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("unsigned account read: %d %s", st, code)
	}
	if st, code := exchange(t, newRequest(nil, "GET", c.url+"/nowhere", nil), nil); st != 401 || code != "UNAUTHENTICATED" {
		t.Fatalf("unsigned call to an unknown route: %d %s", st, code)
	}
	if st, code := call(t, "GET", c.url+"/nowhere", nil, nil); st != 404 || code != "NOT_FOUND" {
		t.Fatalf("signed call to an unknown route: %d %s", st, code)
	}
	if st, code := exchange(t, newRequest(nil, "GET", c.url+"/healthz", nil), nil); st != 200 {
		t.Fatalf("unsigned /healthz: %d %s", st, code)
	}
}

// TestConfigNeedsClusterSecret: a cell without a cluster secret (or with one
// too short to be a key) does not start; it could check no call.
func TestConfigNeedsClusterSecret(t *testing.T) {
	for _, secret := range []string{"", "short-secret"} {
		cfg := cell.DefaultConfig()
		cfg.ClusterSecret = secret
		if err := cfg.Validate(); err == nil {
			t.Errorf("cluster secret %q accepted", secret)
		}
	}
	cfg := cell.DefaultConfig()
	cfg.ClusterSecret = testSecret
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}
