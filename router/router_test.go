package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"redcell/api"
	"redcell/model"
)

func TestRoute(t *testing.T) {
	id := "20261129417a3f9c0e1b2d4c5e6f"
	id = id[:model.PacketIDLen-1] + "0"
	cases := []struct {
		method, path, body string
		shard              model.ShardID
		route              api.RouteID
		user               string // "body": read from the body when needed
		err                error
	}{
		{"GET", "/v1/accounts/u1", "", 663, api.RouteAccount, "u1", nil},
		{"POST", "/v1/accounts/u1/deposit", `{"amount":1}`, 663, api.RouteDeposit, "u1", nil},
		{"POST", "/v1/noop/u1", "", 663, api.RouteNoop, "u1", nil},
		{"POST", "/v1/packets", `{"sender":"u2","amount":1}`, 851, api.RouteSend, "u2", nil},
		{"GET", "/v1/packets/" + id, "", 417, api.RouteDetail, "", nil},
		{"POST", "/v1/packets/" + id + "/open", "", 417, api.RouteOpen, "body", nil},
		{"POST", "/v1/packets/" + id + "/grab", "", 417, api.RouteGrab, "body", nil},
		{"POST", "/v1/accounts/u1", "", 0, api.RouteAccount, "", model.ErrMethodNotAllowed},
		{"GET", "/v1/packets", "", 0, api.RouteSend, "", model.ErrMethodNotAllowed},
		{"GET", "/v1/packets/" + id + "/open", "", 0, api.RouteOpen, "", model.ErrMethodNotAllowed},
		{"POST", "/v1/packets", `{"sender":"bad sender"}`, 0, api.RouteSend, "", model.ErrInvalidArgument},
		{"POST", "/v1/packets", `{`, 0, api.RouteSend, "", model.ErrInvalidArgument},
		{"GET", "/v1/packets/../../etc/passwd", "", 0, api.RouteOther, "", model.ErrNotFound},
		{"GET", "/v1/accounts/a%2Fb", "", 0, api.RouteAccount, "", model.ErrInvalidArgument},
		{"GET", "/v1/accounts/%zz", "", 0, api.RouteOther, "", model.ErrNotFound}, // a malformed escape
		{"GET", "/v1/accounts/u%31", "", 663, api.RouteAccount, "u1", nil},        // an escaped letter is the letter
		{"GET", "/v1/accounts/u1/", "", 663, api.RouteAccount, "u1", nil},
		{"GET", "/v1/packets/x", "", 0, api.RouteDetail, "", model.ErrInvalidArgument},
		{"GET", "/v1/accounts/" + string(make([]byte, 65)), "", 0, api.RouteAccount, "", model.ErrInvalidArgument},
		{"GET", "/v1/nothing", "", 0, api.RouteOther, "", model.ErrNotFound},
		{"GET", "/", "", 0, api.RouteOther, "", model.ErrNotFound},
	}
	for _, c := range cases {
		tg, err := route(c.method, c.path, []byte(c.body))
		if tg.route.ID != c.route {
			t.Errorf("%s %s: route %s, want %s", c.method, c.path, tg.route.Label, api.RouteOf(c.route).Label)
		}
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%s %s: %v, want %v", c.method, c.path, err, c.err)
			}
			continue
		}
		user := tg.user
		if tg.route.UserInBody {
			user = "body"
		}
		if err != nil || tg.shard != c.shard || user != c.user {
			t.Errorf("%s %s: shard %d user %q err %v, want %d %q", c.method, c.path, tg.shard, user, err, c.shard, c.user)
		}
	}
}

func TestBodyActID(t *testing.T) {
	for body, want := range map[string]string{
		`{"act_id":"bob"}`:          "bob",
		` { "act_id" : "bob" } `:    "bob",
		`{"act_id":"b\u006fb"}`:     "bob", // escapes: the slow path, as the cell decodes them
		`{"act_id":"bob","x":1}`:    "bob", // the cell refuses it; counting it is harmless
		`{"act_id":`:                "",
		`[]`:                        "",
		``:                          "",
		`{"act_id":"a","act_id":1}`: "",
		// Only a valid act_id keys a bucket: a long one would pin its bytes
		// in the router's maps, one with a space is no memcached key.
		`{"act_id":"` + strings.Repeat("a", 65) + `"}`:       "",
		`{"act_id":"` + strings.Repeat("a", 65) + `","x":1}`: "",
		`{"act_id":"` + strings.Repeat("a", 64) + `"}`:       strings.Repeat("a", 64),
		`{"act_id":"a b"}`:      "",
		`{"act_id":"a\u0001b"}`: "",
		`{"act_id":""}`:         "",
	} {
		if got := bodyActID([]byte(body)); got != want {
			t.Errorf("bodyActID(%s) = %q, want %q", body, got, want)
		}
	}
}

func BenchmarkRouteOpen(b *testing.B) {
	path := "/v1/packets/" + pktID + "/open"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := route("POST", path, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// pathSegments splits every path as api.PathSegments does, in place or not.
func TestPathSegmentsAsAPI(t *testing.T) {
	for _, p := range []string{"", "/", "//", "/v1/noop/u1", "/v1/noop/u1/", "v1/noop/u1", "/v1//noop", "/v1/accounts/u%31",
		"/v1/accounts/a%2Fb", "/v1/accounts/%zz", "/v1/./x", "/v1/../x", "/a/b/c/d/e/f", "/a/b/c/d/e/f/g", "/a/b/c/d/e/f/g/h/i",
		"/a/b/c/d/e/./f/g", "///a///", "/v1/packets/" + pktID + "/open"} {
		var segs [pathSegmentsMax]string
		got, ok := pathSegments([]byte(p), &segs)
		want, wantOK := api.PathSegments([]byte(p))
		if ok != wantOK || fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
			t.Errorf("%q: %q %v, api.PathSegments %q %v", p, got, ok, want, wantOK)
		}
	}
}
