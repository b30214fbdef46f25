package cell_test

import (
	"net/http"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
)

// adminCall sends method /admin/strategy to a cell's admin port with the
// Authorization header auth ("" for none), unsigned unless signed: the admin
// port knows the admin token only, never the cluster secret.
func adminCall(t *testing.T, c *testCell, method, auth, body string, signed bool, out any) (int, string) {
	t.Helper()
	var raw []byte
	if body != "" {
		raw = []byte(body)
	}
	var headers map[string]string
	if auth != "" {
		headers = map[string]string{"Authorization": auth}
	}
	req := newRequest(headers, method, c.adminURL+"/admin/strategy", raw)
	if signed {
		signer.SignRequest(req, time.Now())
	}
	return exchange(t, req, out)
}

// cellStrategy reads the strategy a cell runs from its /healthz.
func cellStrategy(t *testing.T, c *testCell) string {
	t.Helper()
	var h struct{ Strategy string }
	if st, code := exchange(t, newRequest(nil, "GET", c.url+"/healthz", nil), &h); st != 200 {
		t.Fatalf("/healthz: %d %s", st, code)
	}
	return h.Strategy
}

// TestAdminRefuses: the admin port refuses a request without the token, with
// a wrong one or with only a cluster signature (401 UNAUTHENTICATED), and
// everything when no token is configured (403 ADMIN_DISABLED); the strategy
// stays as it was. The right token switches it.
func TestAdminRefuses(t *testing.T) {
	admin := freeAddr(t)
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken, cfg.OpenStrategy = admin, "right-admin-token", cell.StrategyBatched
	})
	waitFor(t, 5*time.Second, func() bool { _, err := http.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	for _, auth := range []struct {
		name, header string
		signed       bool
	}{
		{"no token", "", false},
		{"wrong token", "Bearer wrong-admin-token", false},
		{"token with a suffix", "Bearer right-admin-token-x", false},
		{"token without Bearer", "right-admin-token", false},
		{"cluster signature, no token", "", true},
	} {
		for _, method := range []string{"GET", "PUT"} {
			if st, code := adminCall(t, c, method, auth.header, `{"strategy":"naive"}`, auth.signed, nil); st != 401 || code != "UNAUTHENTICATED" {
				t.Errorf("%s %s: %d %s, want 401 UNAUTHENTICATED", method, auth.name, st, code)
			}
		}
	}
	if got := cellStrategy(t, c); got != cell.StrategyBatched {
		t.Fatalf("strategy %q after refused switches, want batched", got)
	}
	var st api.StrategySetting
	if code, _ := adminCall(t, c, "PUT", "Bearer right-admin-token", `{"strategy":"serial"}`, false, &st); code != 200 || st.Strategy != "serial" {
		t.Fatalf("switch with the right token: %d %+v", code, st)
	}
	if got := cellStrategy(t, c); got != cell.StrategySerial {
		t.Fatalf("strategy %q after the switch, want serial", got)
	}

	// Without a configured token nothing gets through, whatever is sent.
	closed := oneCell(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken = freeAddr(t), "" })
	waitFor(t, 5*time.Second, func() bool { _, err := http.Get(closed.adminURL + "/metrics"); return err == nil }, "admin port up")
	for _, header := range []string{"", "Bearer ", "Bearer anything"} {
		for _, method := range []string{"GET", "PUT"} {
			if st, code := adminCall(t, closed, method, header, `{"strategy":"naive"}`, true, nil); st != 403 || code != "ADMIN_DISABLED" {
				t.Errorf("%s with %q and no token configured: %d %s, want 403 ADMIN_DISABLED", method, header, st, code)
			}
		}
	}
	if got, want := cellStrategy(t, closed), cell.DefaultConfig().OpenStrategy; got != want {
		t.Fatalf("strategy %q on the cell without an admin token, want the default %s", got, want)
	}
}
