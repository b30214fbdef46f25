package api

import (
	"errors"
	"strings"
	"testing"
	"time"

	"redcell/model"
	"redcell/sharding"
)

func TestLocate(t *testing.T) {
	pid := string(model.PacketIDFrom(663, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), 0xabc))
	for _, c := range []struct {
		method, path, body string
		shard              model.ShardID
		user               string
		errHas             string // "": no error
	}{
		{"GET", AccountPath("alice"), "", 289, "alice", ""}, // golden shards of sharding's tests
		{"POST", DepositPath("bob"), `{"amount":1}`, 27, "bob", ""},
		{"POST", NoopPathOf("u1"), "", 663, "u1", ""},
		{"POST", SendPath, `{"sender":"sender-42","amount":100}`, 925, "sender-42", ""},
		{"POST", OpenPath(pid), `{"act_id":"x"}`, 663, "", ""},
		{"GET", AccountSubPath("alice", "coupons"), "", 289, "alice", ""},
		{"POST", GrabPath(pid), "", 663, "", ""},
		{"GET", PacketPath(pid), "", 663, "", ""},
		{"GET", AccountPath("bad*id"), "", 0, "", "act_id"},
		{"POST", SendPath, `{"sender":7}`, 0, "", "sender must be a string"},
		{"POST", SendPath, `[1]`, 0, "", "the body must be a JSON object"},
		{"POST", SendPath, `{"sender":`, 0, "", "malformed JSON body"},
		{"POST", SendPath, `{}`, 0, "", "sender: "},
		{"POST", OpenPath("20261130663zz"), "", 0, "", "packet"},
		{"POST", CouponIssuePath, `{"act_id":"alice","batch_id":"b"}`, 289, "alice", ""},
		{"POST", CouponIssuePath, `{"batch_id":"b"}`, 0, "", "act_id"},
	} {
		parts, ok := PathSegments([]byte(c.path))
		if !ok {
			t.Fatalf("PathSegments(%s) failed", c.path)
		}
		rt, p, err := MatchPublic(c.method, parts)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		shard, user, err := Locate(rt, p.Key, []byte(c.body))
		if rt.Key == KeyActQuery {
			t.Fatalf("%s: a query-keyed route in the path table", c.path)
		}
		if c.errHas != "" {
			_, msg := model.CodeOf(err)
			if !errors.Is(err, model.ErrInvalidArgument) || !strings.Contains(msg, c.errHas) || shard != 0 || user != "" {
				t.Errorf("%s %s %s: shard %d user %q err %v, want INVALID_ARGUMENT with %q", c.method, c.path, c.body, shard, user, err, c.errHas)
			}
			continue
		}
		if err != nil || shard != c.shard || user != c.user {
			t.Errorf("%s %s %s: shard %d user %q err %v, want %d %q", c.method, c.path, c.body, shard, user, err, c.shard, c.user)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Locate of an internal route did not panic")
		}
	}()
	Locate(RouteOf(RouteCredits), "", nil)
}

// TestSplitIdentityKey: the identity route's key splits into a valid app
// and user ID, or is refused; an escaped slash inside a segment is refused.
func TestSplitIdentityKey(t *testing.T) {
	if app, user, err := SplitIdentityKey("chat/u-1_x"); err != nil || app != "chat" || user != "u-1_x" {
		t.Errorf("chat/u-1_x: %q %q %v", app, user, err)
	}
	for _, bad := range []string{"", "chat", "chat/", "/u1", "chat/x/u1", "ch.at/u1", "chat/u 1"} {
		if _, _, err := SplitIdentityKey(bad); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("%q: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	rt := RouteOf(RouteIdentity)
	s, user, err := Locate(rt, "chat/u1", nil)
	if err != nil || user != "" || s != sharding.ShardOfIdentity("chat", "u1") || s != sharding.ShardOfAct("chat/u1") {
		t.Errorf("Locate: shard %d, user %q, %v", s, user, err)
	}
}

// TestLocateActQuery: a coupon request's state is routed by the act_id of
// its query, which the caller passes as the key.
func TestLocateActQuery(t *testing.T) {
	rt := RouteOf(RouteCouponState)
	if sh, user, err := Locate(rt, "alice", nil); err != nil || sh != 289 || user != "alice" {
		t.Fatalf("Locate(alice) = %d %q %v", sh, user, err)
	}
	if _, _, err := Locate(rt, "", nil); !errors.Is(err, model.ErrInvalidArgument) {
		t.Fatalf("Locate without an act_id: %v", err)
	}
}
