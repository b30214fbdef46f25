package api

import (
	"errors"
	"testing"

	"redcell/model"
)

// TestMatch pins the route table: each path the router and the cells serve,
// the route and key it names, and the 404/405 of what they do not.
func TestMatch(t *testing.T) {
	cases := []struct {
		method, path string
		route        RouteID
		key          string
		err          *model.Error // nil: matched
		public       RouteID      // MatchPublic's route, when it differs (internal routes)
		publicErr    *model.Error
	}{
		{method: "GET", path: "/v1/accounts/bob", route: RouteAccount, key: "bob"},
		{method: "POST", path: "/v1/accounts/bob", route: RouteAccount, key: "bob", err: model.ErrMethodNotAllowed},
		{method: "POST", path: "/v1/accounts/bob/deposit", route: RouteDeposit, key: "bob"},
		{method: "GET", path: "/v1/accounts/bob/deposit", route: RouteDeposit, key: "bob", err: model.ErrMethodNotAllowed},
		{method: "POST", path: "/v1/accounts//deposit", route: RouteDeposit, key: ""}, // the act_id check refuses it (400)
		{method: "POST", path: "/v1/packets", route: RouteSend},
		{method: "POST", path: "/v1/packets/", route: RouteSend},
		{method: "GET", path: "/v1/packets", route: RouteSend, err: model.ErrMethodNotAllowed},
		{method: "GET", path: "/v1/packets/20260101123abc", route: RouteDetail, key: "20260101123abc"},
		{method: "POST", path: "/v1/packets/p1/grab", route: RouteGrab, key: "p1"},
		{method: "POST", path: "/v1/packets/p1/open", route: RouteOpen, key: "p1"},
		{method: "GET", path: "/v1/packets/p1/open", route: RouteOpen, key: "p1", err: model.ErrMethodNotAllowed},
		{method: "POST", path: "/v1/noop/bob", route: RouteNoop, key: "bob"},
		{method: "GET", path: "/v1/noop/bob", route: RouteNoop, key: "bob", err: model.ErrMethodNotAllowed},
		{method: "POST", path: "/v1/accounts/a%2Fb/deposit", route: RouteDeposit, key: "a/b"},
		{method: "PUT", path: "/v1/identities/chat/u1", route: RouteIdentity, key: "chat/u1"},
		{method: "POST", path: "/v1/identities/chat/u1", route: RouteIdentity, key: "chat/u1", err: model.ErrMethodNotAllowed},
		{method: "PUT", path: "/v1/identities/chat%2Fx/u1", route: RouteIdentity, key: "chat/x/u1"}, // SplitIdentityKey refuses it (400)
		{method: "PUT", path: "/v1/identities/chat", route: RouteOther, err: model.ErrNotFound},
		{method: "PUT", path: "/v1/identities/chat/u1/x", route: RouteOther, err: model.ErrNotFound},
		{method: "POST", path: "/v1/coupons/issue", route: RouteCouponIssue},
		{method: "GET", path: "/v1/coupons/issue", route: RouteCouponIssue, err: model.ErrMethodNotAllowed},
		{method: "GET", path: "/v1/coupons/issue/s-1", route: RouteCouponState, key: "s-1"},
		{method: "POST", path: "/v1/coupons/issue/s-1", route: RouteCouponState, key: "s-1", err: model.ErrMethodNotAllowed},
		{method: "GET", path: "/v1/accounts/bob/coupons", route: RouteCoupons, key: "bob"},
		{method: "POST", path: "/internal/credits", route: RouteCredits, publicErr: model.ErrNotFound},
		{method: "POST", path: "/internal/recon", route: RouteRecon, publicErr: model.ErrNotFound},
		{method: "GET", path: "/internal/recon", route: RouteRecon, err: model.ErrMethodNotAllowed, publicErr: model.ErrNotFound},
		{method: "GET", path: "/", route: RouteOther, err: model.ErrNotFound},
		{method: "GET", path: "/v1", route: RouteOther, err: model.ErrNotFound},
		{method: "GET", path: "/v2/accounts/bob", route: RouteOther, err: model.ErrNotFound},
		{method: "POST", path: "/v1/packets/p1/close", route: RouteOther, err: model.ErrNotFound},
		{method: "GET", path: "/v1/accounts/bob/deposit/x", route: RouteOther, err: model.ErrNotFound},
		{method: "GET", path: "/internal", route: RouteOther, err: model.ErrNotFound},
		{method: "GET", path: "/admin/strategy", route: RouteOther, err: model.ErrNotFound}, // admin port only
		{method: "GET", path: "/metrics", route: RouteOther, err: model.ErrNotFound},
	}
	check := func(what string, r Route, p Params, err error, wantRoute RouteID, wantKey string, wantErr *model.Error) {
		t.Helper()
		if r.ID != wantRoute || (wantErr == nil) != (err == nil) || (wantErr != nil && !errors.Is(err, wantErr)) {
			t.Errorf("%s: route %s, err %v; want %s, %v", what, r.Label, err, routes[wantRoute].Label, wantErr)
		}
		if err == nil || errors.Is(err, model.ErrMethodNotAllowed) {
			if p.Key != wantKey {
				t.Errorf("%s: key %q, want %q", what, p.Key, wantKey)
			}
		}
	}
	for _, c := range cases {
		parts, ok := PathSegments([]byte(c.path))
		if !ok {
			t.Fatalf("%s: PathSegments refused it", c.path)
		}
		r, p, err := Match(c.method, parts)
		check("Match "+c.method+" "+c.path, r, p, err, c.route, c.key, c.err)
		wantPub, wantPubErr := c.route, c.err
		if c.publicErr != nil {
			wantPub, wantPubErr = RouteOther, c.publicErr
		}
		r, p, err = MatchPublic(c.method, parts)
		check("MatchPublic "+c.method+" "+c.path, r, p, err, wantPub, c.key, wantPubErr)
		if errors.Is(err, model.ErrNotFound) {
			if _, msg := model.CodeOf(err); msg != "no route for "+trimTrailing(c.path) {
				t.Errorf("%s: message %q", c.path, msg)
			}
		}
	}
}

func trimTrailing(p string) string {
	for len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p
}

// TestMatchAdmin: the admin ports' routes, each on its own port.
func TestMatchAdmin(t *testing.T) {
	cases := []struct {
		port         Port
		method, path string
		route        RouteID
		key          string
		err          *model.Error
	}{
		{PortCellAdmin, "GET", "/metrics", RouteMetrics, "", nil},
		{PortRouterAdmin, "GET", "/metrics", RouteMetrics, "", nil},
		{PortRouterAdmin, "POST", "/metrics", RouteMetrics, "", model.ErrMethodNotAllowed},
		{PortCellAdmin, "PUT", "/admin/strategy", RouteStrategyPut, "", nil},
		{PortCellAdmin, "GET", "/admin/strategy", RouteStrategyGet, "", nil},
		{PortCellAdmin, "DELETE", "/admin/strategy", RouteStrategyGet, "", model.ErrMethodNotAllowed},
		{PortCellAdmin, "PUT", "/admin/degrade", RouteDegradePut, "", nil},
		{PortCellAdmin, "POST", "/admin/audit", RouteAudit, "", nil},
		{PortCellAdmin, "GET", "/admin/shards", RouteShards, "", nil},
		{PortCellAdmin, "GET", "/admin/coupons", RouteCouponBatches, "", nil},
		{PortCellAdmin, "POST", "/admin/coupons/reload", RouteCouponsReload, "", nil},
		{PortCellAdmin, "PUT", "/admin/coupons", RouteCouponsPut, "", nil},
		{PortRouterAdmin, "GET", "/admin/coupons", RouteOther, "", model.ErrNotFound},
		{PortCellAdmin, "GET", "/admin/keys", RouteOther, "", model.ErrNotFound},
		{PortRouterAdmin, "GET", "/admin/keys", RouteKeysList, "", nil},
		{PortRouterAdmin, "POST", "/admin/keys", RouteKeysAdd, "", nil},
		{PortRouterAdmin, "DELETE", "/admin/keys/k-12", RouteKeysRevoke, "k-12", nil},
		{PortRouterAdmin, "GET", "/admin/strategy", RouteOther, "", model.ErrNotFound},
		{PortRouterAdmin, "GET", "/v1/accounts/bob", RouteOther, "", model.ErrNotFound},
	}
	for _, c := range cases {
		parts, _ := PathSegments([]byte(c.path))
		r, p, err := MatchAdmin(c.port, c.method, parts)
		if r.ID != c.route || p.Key != c.key || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("port %d %s %s: route %s key %q err %v", c.port, c.method, c.path, r.Label, p.Key, err)
		}
		if err == nil && r.Port != c.port {
			t.Errorf("%s: port %d, want %d", c.path, r.Port, c.port)
		}
	}
}

// TestRouteTable: the properties the router and cells rely on.
func TestRouteTable(t *testing.T) {
	if got := Labels(RouteCredits); len(got) != 20 || got[0] != "other" || got[8] != "identity" || got[15] != "issued" || got[16] != "book" ||
		got[17] != "coupon_issue" || got[18] != "coupon_state" || got[19] != "coupons" {
		t.Errorf("router labels %v", got)
	}
	if got := Labels(RouteMetrics); len(got) != 26 || got[20] != "credits" || got[21] != "recon" || got[23] != "budget_return" || got[24] != "budget_leases" ||
		got[25] != "coupon_stock" {
		t.Errorf("cell labels %v", got)
	}
	for _, r := range Routes() {
		switch {
		case r.Public():
			if r.Scope == "" || r.Key == KeyNone || r.Internal || r.Port != PortMain {
				t.Errorf("public route %+v", r)
			}
		case r.ID == RouteOther:
		default:
			if r.Scope != "" || r.Key != KeyNone {
				t.Errorf("non-public route %s has a scope or key", r.Label)
			}
		}
	}
	// The path builders name the routes they say.
	for path, want := range map[string]RouteID{
		AccountPath("bob"): RouteAccount, DepositPath("bob"): RouteDeposit, SendPath: RouteSend,
		PacketPath("p"): RouteDetail, GrabPath("p"): RouteGrab, OpenPath("p"): RouteOpen, NoopPathOf("bob"): RouteNoop,
		CreditsPath: RouteCredits, ReconPath: RouteRecon,
	} {
		parts, _ := PathSegments([]byte(path))
		if r, _, err := Match(RouteOf(want).Method, parts); err != nil || r.ID != want {
			t.Errorf("%s: %s %v, want %s", path, r.Label, err, RouteOf(want).Label)
		}
	}
}

// TestMatchAllocatesNothing: the router matches every request.
func TestMatchAllocatesNothing(t *testing.T) {
	parts := []string{"v1", "packets", "p1", "open"}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = MatchPublic("POST", parts) }); n != 0 {
		t.Errorf("MatchPublic allocates %v times", n)
	}
}
