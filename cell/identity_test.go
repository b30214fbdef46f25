package cell_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

const testIdentityKey = "test-identity-key-0123456789"

// TestBindIdentity drives PUT /v1/identities/{app}/{app_user_id} on a cell
// with the real store: the same phone on two apps is one actID, a repeat
// answers the first binding, another phone is IDENTITY_CONFLICT, an account
// without a phone gets an actID of its own, bad input is refused — and the
// phone is in no row and no log line, only its keyed hash.
func TestBindIdentity(t *testing.T) {
	logs := &testenv.Buffer{}
	// With peers: a cell's relay works every 200 ms and reads the map for
	// the claims it reads again (nil peers would fail the first pass).
	peers := &staticPeers{}
	c := startCellLog(t, "cell-i", "0-999", 1, peers, func(cfg *cell.Config) { cfg.IdentityKey = testIdentityKey },
		slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	m, _ := sharding.NewMap([]sharding.Cell{{Name: c.name, Addr: c.addr, Shards: c.cfg.Shards}})
	peers.m.Store(m)
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	app1, app2 := pre+"chat", pre+"video"
	const phone, digits = "+86 138-0000-0001", "13800000001"
	put := func(app, user string, body any, out *api.IdentityResponse) (int, string) {
		t.Helper()
		if out == nil {
			return call(t, "PUT", c.url+api.IdentityPath(app, user), body, nil)
		}
		return call(t, "PUT", c.url+api.IdentityPath(app, user), body, out)
	}
	key := []byte(testIdentityKey)
	wantAct := model.PhoneActID(key, "+8613800000001")

	var first api.IdentityResponse
	if st, code := put(app1, "u1", map[string]string{"phone": phone}, &first); st != 200 {
		t.Fatalf("first binding: %d %s", st, code)
	}
	if first.ActID != wantAct || first.Repeat || !first.PhoneBound || first.App != app1 || first.AppUserID != "u1" || first.CreatedMS == 0 {
		t.Fatalf("first binding: %+v, want act_id %s, new, phone bound", first, wantAct)
	}
	var again api.IdentityResponse
	if st, code := put(app1, "u1", map[string]string{"phone": "+8613800000001"}, &again); st != 200 || !again.Repeat || again.ActID != wantAct || again.CreatedMS != first.CreatedMS {
		t.Errorf("the same phone again: %d %s %+v; want a repeat of the first", st, code, again)
	}
	var other api.IdentityResponse
	if st, code := put(app2, "v7", map[string]string{"phone": "+86 (138) 0000.0001"}, &other); st != 200 || other.Repeat || other.ActID != wantAct {
		t.Errorf("the phone on another app: %d %s %+v; want a new binding to %s", st, code, other, wantAct)
	}
	if st, code := put(app1, "u1", map[string]string{"phone": "+8613800000002"}, nil); st != 409 || code != model.ErrIdentityConflict.Code {
		t.Errorf("another phone: %d %s, want 409 IDENTITY_CONFLICT", st, code)
	}

	// Without a phone: no body, {} and {"phone": null} alike.
	var bare api.IdentityResponse
	if st, code := put(app1, "u2", nil, &bare); st != 200 || bare.Repeat || bare.PhoneBound || bare.ActID != model.AppAccountActID(key, app1, "u2") {
		t.Errorf("without a phone: %d %s %+v", st, code, bare)
	}
	for _, raw := range []string{`{}`, `{"phone":null}`} {
		var r api.IdentityResponse
		if st, code := callRaw(t, nil, "PUT", c.url+api.IdentityPath(app1, "u2"), []byte(raw), &r); st != 200 || !r.Repeat || r.ActID != bare.ActID {
			t.Errorf("%s again: %d %s %+v", raw, st, code, r)
		}
	}
	if st, code := put(app1, "u2", map[string]string{"phone": "+8613800000003"}, nil); st != 409 || code != model.ErrIdentityConflict.Code {
		t.Errorf("a phone after binding without one: %d %s, want 409 IDENTITY_CONFLICT", st, code)
	}

	for _, b := range []struct {
		app, user, body string
	}{
		{"bad.app", "u1", `{}`},
		{app1, strings.Repeat("u", 65), `{}`},
		{app1, "u3", `{"phone":"call me"}`},
		{app1, "u3", `{"phone":"+86 138"}`},
		{app1, "u3", `{"phone":8613800000001}`},
		{app1, "u3", `{"phone":"+8613800000001","name":"x"}`},
		{app1, "u3", `{"Phone":"+8613800000001"}`},
		{app1, "u3", `[]`},
	} {
		if st, code := callRaw(t, nil, "PUT", c.url+api.IdentityPath(b.app, b.user), []byte(b.body), nil); st != 400 || code != model.ErrInvalidArgument.Code {
			t.Errorf("PUT %s/%s %s: %d %s, want 400 INVALID_ARGUMENT", b.app, b.user, b.body, st, code)
		}
	}
	var u3 api.IdentityResponse
	if st, code := put(app1, "u3", nil, &u3); st != 200 || u3.Repeat {
		t.Errorf("u3 after its refused bindings: %d %s, want it still unbound", st, code)
	}

	// The rows: the actID and the keyed hash, never the phone.
	for _, acct := range [][2]string{{app1, "u1"}, {app2, "v7"}, {app1, "u2"}} {
		s := sharding.ShardOfIdentity(acct[0], acct[1])
		var act, hash, row string
		err := c.db.QueryRow(fmt.Sprintf("SELECT act_id, phone_hash, CONCAT_WS('|', app, app_user_id, act_id, phone_hash, created_ms) FROM db_%02d.t_identity_%d WHERE app = ? AND app_user_id = ?",
			s.DB(), s.Table()), acct[0], acct[1]).Scan(&act, &hash, &row)
		if err != nil {
			t.Fatalf("the row of %s/%s: %v", acct[0], acct[1], err)
		}
		if strings.Contains(row, digits) {
			t.Errorf("the row of %s/%s holds the phone: %s", acct[0], acct[1], row)
		}
		wantHash := model.PhoneHash(key, "+8613800000001")
		if acct[1] == "u2" {
			wantHash = ""
		}
		if hash != wantHash || (acct[1] != "u2" && act != wantAct) {
			t.Errorf("the row of %s/%s: act_id %s, phone_hash %q", acct[0], acct[1], act, hash)
		}
	}
	// No phone in any log line, in any of the forms sent: the log's digits
	// alone, searched for each number's digits.
	logDigits := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, logs.String())
	for _, p := range []string{"8613800000001", "8613800000002", "8613800000003"} {
		if strings.Contains(logDigits, p) {
			t.Errorf("the cell logged phone digits %s:\n%s", p, logs.String())
		}
	}
}

// TestBindIdentityDisabled: a cell without identity_key answers 501
// IDENTITY_DISABLED and stores nothing.
func TestBindIdentityDisabled(t *testing.T) {
	c := oneCell(t, nil)
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	if st, code := call(t, "PUT", c.url+api.IdentityPath(pre+"chat", "u1"), map[string]string{"phone": "+8613800000001"}, nil); st != 501 || code != model.ErrIdentityDisabled.Code {
		t.Errorf("without identity_key: %d %s, want 501 IDENTITY_DISABLED", st, code)
	}
	s := sharding.ShardOfIdentity(pre+"chat", "u1")
	var n int
	err := c.db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		fmt.Sprintf("db_%02d", s.DB()), fmt.Sprintf("t_identity_%d", s.Table())).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n == 1 { // another test may have made the table: then no row of this app
		if err := c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_identity_%d WHERE app = ?", s.DB(), s.Table()), pre+"chat").Scan(&n); err != nil || n != 0 {
			t.Errorf("%d rows stored while disabled (%v)", n, err)
		}
	}
}
