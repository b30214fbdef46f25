package router

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"redcell/internal/testenv"
	"redcell/sharding"
)

// TestBadIDsNeverForwarded: over HTTP, the router refuses malformed act_ids and
// packet IDs (too long, SQL or path characters, a shard outside 0..999, a bad
// date), a send without a valid sender, and bodies above its limit, each with
// its 4xx JSON error, and forwards none of them to a cell. Well-formed requests
// around them are forwarded, so the cell was reachable throughout. The cells'
// own checks are in cell.TestBadInput.
func TestBadIDsNeverForwarded(t *testing.T) {
	var hits atomic.Int64
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: fakeCell(t, 200, `{}`, &hits), Shards: all}})
	routes.m.Store(m)
	url := startRouter(t, routes)

	const bad, invalid = http.StatusBadRequest, "INVALID_ARGUMENT"
	type badCase struct{ method, path, body, code string }
	var cases []badCase
	for _, act := range []string{
		strings.Repeat("a", 65), "a'%3B%20DROP%20TABLE%20x%3B--", "a'b", "a%20b", "a.b", "%C3%BC", "a%00b", "a:b", "a%5Cb", "a%25b",
	} {
		cases = append(cases,
			badCase{"GET", "/v1/accounts/" + act, "", invalid},
			badCase{"POST", "/v1/accounts/" + act + "/deposit", `{"amount":1,"order_no":"o"}`, invalid},
			badCase{"POST", "/v1/noop/" + act, "", invalid})
	}
	for _, id := range []string{
		pktID[:26], pktID + "0", "x", pktID[:11] + strings.ToUpper(pktID[11:]),
		"20260230417" + pktID[11:], "20261301417" + pktID[11:], "19991231417" + pktID[11:],
		pktID[:8] + "1000" + pktID[11:], pktID[:8] + "-01" + pktID[11:], // shard above 999, below 0
		pktID[:11] + "'%20OR%20'1'='1'--aa", pktID[:26] + "'", pktID[:24] + "%5C..", pktID[:26] + "%25", pktID[:26] + "%20",
		pktID[:26] + "g", pktID + "c1",
	} {
		cases = append(cases,
			badCase{"GET", "/v1/packets/" + id, "", invalid},
			badCase{"POST", "/v1/packets/" + id + "/grab", `{"act_id":"u1"}`, invalid},
			badCase{"POST", "/v1/packets/" + id + "/open", `{"act_id":"u1"}`, invalid})
	}
	for _, body := range []string{
		`{"sender":"","amount":1}`, `{"sender":"a'; DROP TABLE x;--"}`, `{"sender":"../../etc"}`, `{"sender":1}`, `{"amount":1}`,
		`{"sender":"` + strings.Repeat("s", 65) + `"}`, `{"sender":`, ``, `[]`,
	} {
		cases = append(cases, badCase{"POST", "/v1/packets", body, invalid})
	}
	cases = append(cases,
		badCase{"POST", "/v1/accounts/a%2Fb/deposit", `{}`, invalid}, // an escaped slash stays in its act_id
		badCase{"GET", "/v1/accounts/a%2Fb", ``, invalid},
		badCase{"POST", "/v1/noop/a%2f..%2fb", ``, invalid},
		badCase{"POST", "/v1/packets/" + pktID[:20] + "%2F/open", `{"act_id":"u1"}`, invalid},
		badCase{"POST", "/v1/packets/../../open", `{}`, "NOT_FOUND"}, // dot segments name no route
		badCase{"GET", "/v1/packets/" + pktID + "/../../../internal/credits", ``, "NOT_FOUND"},
		badCase{"POST", "/internal/credits", `{"credits":[]}`, "NOT_FOUND"}, // never forwarded
	)

	status := map[string]int{invalid: bad, "NOT_FOUND": http.StatusNotFound}
	for _, c := range cases {
		st, body := routerRequest(t, c.method, url+c.path, strings.NewReader(c.body))
		checkRouterError(t, c.method+" "+c.path, st, body, status[c.code], c.code)
	}
	for _, size := range []int{64<<10 + 1, 1 << 20, 8 << 20} {
		for _, chunked := range []bool{false, true} {
			for range 3 {
				var body io.Reader = bytes.NewReader(bytes.Repeat([]byte(" "), size))
				if chunked {
					body = io.MultiReader(body) // hides the length: sent chunked
				}
				st, answer := routerRequest(t, "POST", url+"/v1/packets", body)
				checkRouterError(t, "a body of "+strconv.Itoa(size)+" bytes", st, answer, http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE")
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d bad requests reached the cell", n)
	}
	for _, path := range []string{"/v1/accounts/u1", "/v1/packets/" + pktID} {
		if st, body := routerRequest(t, "GET", url+path, nil); st != 200 {
			t.Fatalf("GET %s: %d %s", path, st, body)
		}
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d well-formed requests reached the cell, want 2", n)
	}
}

// routerRequest is the one place that sends TestBadIDsNeverForwarded's
// requests; a transport error (a reset) fails the test.
func routerRequest(t *testing.T, method, url string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, b := testenv.Do(t, nil, req)
	return resp.StatusCode, b
}

// checkRouterError checks the status and that body is exactly
// {"error":{"code":code,"message":"..."}}.
func checkRouterError(t *testing.T, what string, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	var outer map[string]json.RawMessage
	var e struct{ Code, Message string }
	dec := json.NewDecoder(bytes.NewReader(nil))
	if json.Unmarshal(body, &outer) == nil && len(outer) == 1 && outer["error"] != nil {
		dec = json.NewDecoder(bytes.NewReader(outer["error"]))
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&e); err != nil || status != wantStatus || e.Code != wantCode || e.Message == "" {
		t.Errorf("%s: %d %s, want %d {\"error\":{\"code\":%q,\"message\":...}}", what, status, body, wantStatus, wantCode)
	}
}
