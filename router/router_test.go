package router

import (
	"errors"
	"testing"

	"redcell/model"
)

func TestRoute(t *testing.T) {
	id := "20261129417a3f9c0e1b2d4c5e6f"
	id = id[:model.PacketIDLen-1] + "0"
	cases := []struct {
		method, path, body string
		shard              model.ShardID
		err                error
	}{
		{"GET", "/v1/accounts/u1", "", 663, nil},
		{"POST", "/v1/accounts/u1/deposit", `{"amount":1}`, 663, nil},
		{"POST", "/v1/noop/u1", "", 663, nil},
		{"POST", "/v1/packets", `{"sender":"u2","amount":1}`, 851, nil},
		{"GET", "/v1/packets/" + id, "", 417, nil},
		{"POST", "/v1/packets/" + id + "/open", "", 417, nil},
		{"POST", "/v1/packets/" + id + "/grab", "", 417, nil},
		{"POST", "/v1/accounts/u1", "", 0, model.ErrMethodNotAllowed},
		{"GET", "/v1/packets", "", 0, model.ErrMethodNotAllowed},
		{"GET", "/v1/packets/" + id + "/open", "", 0, model.ErrMethodNotAllowed},
		{"POST", "/v1/packets", `{"sender":"bad sender"}`, 0, model.ErrInvalidArgument},
		{"POST", "/v1/packets", `{`, 0, model.ErrInvalidArgument},
		{"GET", "/v1/packets/../../etc/passwd", "", 0, model.ErrNotFound},
		{"GET", "/v1/packets/x", "", 0, model.ErrInvalidArgument},
		{"GET", "/v1/accounts/" + string(make([]byte, 65)), "", 0, model.ErrInvalidArgument},
		{"GET", "/v1/nothing", "", 0, model.ErrNotFound},
		{"GET", "/", "", 0, model.ErrNotFound},
	}
	for _, c := range cases {
		shard, err := route(c.method, c.path, []byte(c.body))
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%s %s: %v, want %v", c.method, c.path, err, c.err)
			}
			continue
		}
		if err != nil || shard != c.shard {
			t.Errorf("%s %s: shard %d err %v, want %d", c.method, c.path, shard, err, c.shard)
		}
	}
}

func BenchmarkRouteOpen(b *testing.B) {
	path := "/v1/packets/20261129417a3f9c0e1b2d4c5e6f0/open"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := route("POST", path, nil); err != nil {
			b.Fatal(err)
		}
	}
}
