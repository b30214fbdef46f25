package api

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"redcell/model"
)

// The path matching that api's table replaced, kept here as references:
// Match must agree with both on every path made of the segments they know.

// oldCellRoute is cell/handlers.go's routeOf before the table: RouteOther for
// an unknown path and for a known path with another method.
func oldCellRoute(method string, parts []string) RouteID {
	v1 := len(parts) >= 2 && parts[0] == "v1"
	internal := len(parts) == 2 && parts[0] == "internal"
	switch {
	case v1 && len(parts) == 3 && parts[1] == "accounts" && method == http.MethodGet:
		return RouteAccount
	case v1 && len(parts) == 4 && parts[1] == "accounts" && parts[3] == "deposit" && method == http.MethodPost:
		return RouteDeposit
	case v1 && len(parts) == 2 && parts[1] == "packets" && method == http.MethodPost:
		return RouteSend
	case v1 && len(parts) == 3 && parts[1] == "packets" && method == http.MethodGet:
		return RouteDetail
	case v1 && len(parts) == 4 && parts[1] == "packets" && parts[3] == "grab" && method == http.MethodPost:
		return RouteGrab
	case v1 && len(parts) == 4 && parts[1] == "packets" && parts[3] == "open" && method == http.MethodPost:
		return RouteOpen
	case v1 && len(parts) == 3 && parts[1] == "noop" && method == http.MethodPost:
		return RouteNoop
	case internal && parts[1] == "credits" && method == http.MethodPost:
		return RouteCredits
	case internal && parts[1] == "recon" && method == http.MethodPost:
		return RouteRecon
	}
	return RouteOther
}

// oldRouterRoute is router/router.go's routeOf before the table: the route
// and key, with ErrNotFound or ErrMethodNotAllowed (the route set with the latter).
func oldRouterRoute(method string, parts []string) (RouteID, string, error) {
	notFound := model.Errorf(model.ErrNotFound, "no route for /%s", strings.Join(parts, "/"))
	if len(parts) < 2 || parts[0] != "v1" {
		return RouteOther, "", notFound
	}
	var id RouteID
	key := ""
	want := http.MethodPost
	switch {
	case parts[1] == "accounts" && len(parts) == 3:
		id, key, want = RouteAccount, parts[2], http.MethodGet
	case parts[1] == "accounts" && len(parts) == 4 && parts[3] == "deposit":
		id, key = RouteDeposit, parts[2]
	case parts[1] == "noop" && len(parts) == 3:
		id, key = RouteNoop, parts[2]
	case parts[1] == "packets" && len(parts) == 2:
		id = RouteSend
	case parts[1] == "packets" && len(parts) == 3:
		id, key, want = RouteDetail, parts[2], http.MethodGet
	case parts[1] == "packets" && len(parts) == 4 && parts[3] == "grab":
		id, key = RouteGrab, parts[2]
	case parts[1] == "packets" && len(parts) == 4 && parts[3] == "open":
		id, key = RouteOpen, parts[2]
	default:
		return RouteOther, "", notFound
	}
	if method != want {
		return id, key, model.ErrMethodNotAllowed
	}
	return id, key, nil
}

// TestMatchAgreesWithTheOldMatchers: every path of up to 4 segments drawn
// from the routes' words (and a stranger), with every method.
func TestMatchAgreesWithTheOldMatchers(t *testing.T) {
	words := []string{"v1", "internal", "accounts", "packets", "noop", "credits", "recon", "deposit", "grab", "open", "admin", "x", ""}
	methods := []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}
	n := 0
	var walk func(parts []string)
	walk = func(parts []string) {
		for _, m := range methods {
			n++
			// The cell: a match without error is the old route; anything else was RouteOther.
			r, _, err := Match(m, parts)
			got := r.ID
			if err != nil {
				got = RouteOther
			}
			if want := oldCellRoute(m, parts); got != want {
				t.Fatalf("cell %s /%s: %s, the old matcher %s", m, strings.Join(parts, "/"), routes[got].Label, routes[want].Label)
			}
			// The router: the same route, key, error kind and message.
			r, p, err := MatchPublic(m, parts)
			wantID, wantKey, wantErr := oldRouterRoute(m, parts)
			if r.ID != wantID || (err == nil) != (wantErr == nil) {
				t.Fatalf("router %s /%s: %s %v, the old matcher %s %v", m, strings.Join(parts, "/"), r.Label, err, routes[wantID].Label, wantErr)
			}
			if err == nil || errors.Is(err, model.ErrMethodNotAllowed) {
				if p.Key != wantKey {
					t.Fatalf("router %s /%s: key %q, the old matcher %q", m, strings.Join(parts, "/"), p.Key, wantKey)
				}
			}
			if err != nil {
				c1, m1 := model.CodeOf(err)
				c2, m2 := model.CodeOf(wantErr)
				if c1 != c2 || m1 != m2 {
					t.Fatalf("router %s /%s: %s %q, the old matcher %s %q", m, strings.Join(parts, "/"), c1, m1, c2, m2)
				}
			}
		}
		if len(parts) == 4 {
			return
		}
		for _, w := range words {
			walk(append(parts[:len(parts):len(parts)], w))
		}
	}
	walk(nil)
	if n < 100_000 {
		t.Fatalf("only %d requests compared", n)
	}
}
