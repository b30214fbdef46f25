package router

import (
	"bytes"
	"encoding/json"
	"strings"

	"redcell/api"
	"redcell/model"
)

// target is what the router learns from a request before forwarding it.
type target struct {
	route api.Route
	key   string // the act_id or packet ID of the path, not yet validated; "" for a send
	shard model.ShardID
	// user is the act_id the per-user limit counts ("" when the route has
	// none); for grab and open it is in the body, read only when needed.
	user string
}

// routeOf finds the public route of a request from its method and path
// segments (api.PathSegments) in api's table. The route is set even with an
// error when the path names one. Errors: ErrNotFound, ErrMethodNotAllowed.
func routeOf(method string, parts []string) (target, error) {
	rt, p, err := api.MatchPublic(method, parts)
	return target{route: rt, key: p.Key}, err
}

// pathSegmentsMax is the most segments pathSegments splits in place; every
// public route has fewer.
const pathSegmentsMax = 6

// pathSegments is api.PathSegments, splitting into segs (no allocation but
// the path's one string) when the path needs no decoding and has at most
// pathSegmentsMax segments; any other path goes to api.PathSegments.
func pathSegments(raw []byte, segs *[pathSegmentsMax]string) ([]string, bool) {
	if bytes.IndexByte(raw, '%') >= 0 || bytes.Count(raw, slash) > pathSegmentsMax+1 {
		return api.PathSegments(raw)
	}
	s := strings.Trim(string(raw), "/")
	if s == "" {
		return nil, true
	}
	n := 0
	for {
		seg, rest, more := strings.Cut(s, "/")
		if n == pathSegmentsMax || seg == "." || seg == ".." {
			return api.PathSegments(raw) // too long for segs, or refused there
		}
		segs[n] = seg
		n++
		if !more {
			return segs[:n], true
		}
		s = rest
	}
}

var slash = []byte{'/'}

// locate validates the key of a request — the act_id or packet ID of its path,
// or a send's sender in body — and sets its shard and user, by api.Locate.
// Errors: ErrInvalidArgument.
func (t *target) locate(body []byte) (err error) {
	t.shard, t.user, err = api.Locate(t.route, t.key, body)
	return err
}

// route is routeOf then locate, for a path as sent on the request line.
func route(method string, rawPath string, body []byte) (target, error) {
	var segs [pathSegmentsMax]string
	parts, ok := pathSegments([]byte(rawPath), &segs)
	if !ok {
		return target{}, model.Errorf(model.ErrNotFound, "no route for %s", rawPath)
	}
	t, err := routeOf(method, parts)
	if err != nil {
		return t, err
	}
	return t, t.locate(body)
}

// bodyActID returns the act_id of a grab or open body, or "" when the body or
// the act_id is not valid (the cell refuses it then, without touching its
// store). Only a valid act_id (model.ValidateActID: at most 64 bytes of
// [A-Za-z0-9_-]) keys the per-user buckets, the rules' and memcached's: a
// body's act_id may be as long as the body, and kept as a map key it let a
// client pin 64 KiB per request in the router's memory.
func bodyActID(body []byte) string {
	id, ok := api.ScanActID(body)
	if !ok {
		var b api.ActRequest
		if json.Unmarshal(body, &b) != nil {
			return ""
		}
		id = b.ActID
	}
	if model.ValidateActID(id) != nil {
		return ""
	}
	return id
}
