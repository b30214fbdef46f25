package cell_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// badInputLimits are the per-packet limits of the cell under TestBadInput, set
// below the defaults so that "above the configured maximum" is tested against
// the configuration, not against a constant.
var badInputLimits = model.Limits{MaxAmount: 50_000, MaxCount: 100, MaxGreeting: 8}

// badCase is one row of TestBadInput: a request and the error it must get.
type badCase struct {
	name         string
	method, path string // path relative to the cell's URL, sent as written
	body         string
	signed       bool // an internal call: signed with the cluster secret when sent
	status       int
	code         string
}

// TestBadInput sends every kind of bad input of the bad-input issue to a real
// cell on real MariaDB, over HTTP. Each must get its 4xx status with a stable
// code and the body {"error":{"code","message"}}, and write nothing: the
// sender's balance, the flow, account, packet and claim rows of the
// sender's shard and the open packet's remainder are the same after each one.
// The table is in docs/testing.md.
func TestBadInput(t *testing.T) {
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.Limits = badInputLimits
		// No background writes while rows are compared: no relay or expiry pass
		// (the full expiry scan starts after 30 s, longer than this test).
		cfg.RelayInterval, cfg.ExpiryInterval = time.Hour, time.Hour
	})
	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 100_000) // order_no "dep-<sender>"
	packet := c.send(t, sender, 1000, 10, "snd-1")
	before := takeSnapshot(t, c.db, sender, packet)
	if before.balance != 99_000 || before.packetRemaining != 1000 {
		t.Fatalf("fixture: %+v", before)
	}

	cases := badInputCases(sender, packet)
	for _, bc := range cases {
		t.Run(bc.name, func(t *testing.T) {
			// Signed as the router signs: the refusal must come from the
			// input, not from a missing signature.
			header := signedHeader(bc.method, bc.path, bc.body)
			status, body := sendRequest(t, bc.method, c.url+bc.path, header, strings.NewReader(bc.body))
			if after := takeSnapshot(t, c.db, sender, packet); after != before {
				t.Errorf("rows changed:\n before %+v\n after  %+v", before, after)
				before = after // so that the next case is judged on its own
			}
			checkErrorAnswer(t, status, body, bc.status, bc.code)
		})
	}

	// Bodies above the cell's limit (1 MiB): a 413 answer, read by a client
	// still writing the body, with a length or chunked (three tries each: a
	// reset, before the drain in api.ProtocolError, came most of the time but
	// not always); at the limit exactly, the body is read and refused for what
	// it says.
	const limit = 1 << 20
	for _, size := range []int{limit + 1, 4 * limit, 8 * limit} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("body of %d bytes, chunked %v", size, chunked), func(t *testing.T) {
				for range 3 {
					var body io.Reader = bytes.NewReader(paddedBody(sender, size))
					if chunked {
						body = io.MultiReader(body) // hides the length: sent chunked
					}
					status, answer := sendRequest(t, "POST", c.url+"/v1/packets", nil, body)
					checkErrorAnswer(t, status, answer, http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE")
				}
				if after := takeSnapshot(t, c.db, sender, packet); after != before {
					t.Errorf("rows changed:\n before %+v\n after  %+v", before, after)
				}
			})
		}
	}
	t.Run("body of exactly the limit", func(t *testing.T) {
		body := paddedBody(sender, limit)
		status, answer := sendRequest(t, "POST", c.url+"/v1/packets", signedHeader("POST", "/v1/packets", string(body)), bytes.NewReader(body))
		checkErrorAnswer(t, status, answer, http.StatusBadRequest, "INVALID_ARGUMENT")
	})

	// The same requests, well-formed, still work: the refusals left no state.
	if st, code := call(t, "POST", c.url+"/v1/accounts/"+sender+"/deposit", api.DepositRequest{Amount: 100_000, OrderNo: "dep-" + sender}, nil); st != 200 {
		t.Fatalf("deposit retry after the bad input: %d %s", st, code)
	}
	var open api.OpenResponse
	if st, code := call(t, "POST", c.url+"/v1/packets/"+packet+"/open", api.ActRequest{ActID: pre + "-u"}, &open); st != 200 || open.Amount < 1 {
		t.Fatalf("open after the bad input: %d %s %+v", st, code, open)
	}
}

// sendRequest is the one place that builds and sends TestBadInput's requests:
// when /v1 calls must be signed, the signing header goes here. It returns the
// status and the body of the answer; a transport error (a reset) fails the test.
func sendRequest(t *testing.T, method, url string, header map[string]string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, b := testenv.Do(t, badInputClient, req)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	return resp.StatusCode, b
}

// checkErrorAnswer checks the status and that the body is exactly
// {"error":{"code":code,"message":"..."}}: no other field, a message, and no
// "retryable" (bad input is never retryable).
func checkErrorAnswer(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d; body %s", status, wantStatus, body)
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(body, &outer); err != nil || len(outer) != 1 || outer["error"] == nil {
		t.Fatalf("body %s is not {\"error\":{...}}", body)
	}
	dec := json.NewDecoder(bytes.NewReader(outer["error"]))
	dec.DisallowUnknownFields()
	var e struct{ Code, Message string }
	if err := dec.Decode(&e); err != nil || e.Code != wantCode || e.Message == "" {
		t.Fatalf("error %s, want code %s and a message (%v)", outer["error"], wantCode, err)
	}
}

// paddedBody is a send body of exactly size bytes: valid but for an unknown
// field that pads it.
func paddedBody(sender string, size int) []byte {
	head := fmt.Sprintf(`{"sender":%q,"amount":100,"count":1,"order_no":"big","pad":"`, sender)
	return []byte(head + strings.Repeat("x", size-len(head)-2) + `"}`)
}

// badInputCases lists the bad input of the issue, route by route. sender has a
// balance and sent packet (1000 cents, 10 shares) with order_no "snd-1"; its
// deposit used order_no "dep-<sender>".
func badInputCases(sender, packet string) []badCase {
	const bad, invalid = http.StatusBadRequest, "INVALID_ARGUMENT"
	var cases []badCase
	add := func(name, method, path, body string, status int, code string) {
		cases = append(cases, badCase{name: name, method: method, path: path, body: body, status: status, code: code})
	}
	deposit := "/v1/accounts/" + sender + "/deposit"
	depositWith := func(amount string) string { return `{"amount":` + amount + `,"order_no":"dep-new"}` }
	for name, amount := range map[string]string{
		"string": `"100"`, "string with decimals": `"18.98"`, "float": `18.98`, "float below a cent": `0.1`,
		"three decimals": `1.005`, "float with zero fraction": `100.0`, "exponent": `1e3`, "zero": `0`, "negative": `-100`,
		"above MaxDeposit": strconv.FormatInt(int64(cell.MaxDeposit)+1, 10), "above int64": `9223372036854775808`,
		"below int64": `-9223372036854775809`, "twenty digits": `99999999999999999999`, "null": `null`, "bool": `true`,
	} {
		add("deposit amount "+name, "POST", deposit, depositWith(amount), bad, invalid)
	}
	for name, body := range map[string]string{
		"unknown field":          `{"amount":100,"order_no":"dep-new","note":"x"}`,
		"key in another case":    `{"Amount":100,"order_no":"dep-new"}`,
		"key twice":              `{"amount":1,"amount":100,"order_no":"dep-new"}`,
		"malformed JSON":         `{"amount":100,"order_no":"dep-new"`,
		"empty body":             ``,
		"array body":             `[{"amount":100,"order_no":"dep-new"}]`,
		"trailing data":          `{"amount":100,"order_no":"dep-new"} {}`,
		"trailing bracket":       `{"amount":100,"order_no":"dep-new"}]`,
		"order_no missing":       `{"amount":100}`,
		"order_no too long":      `{"amount":100,"order_no":"` + strings.Repeat("o", 65) + `"}`,
		"order_no with SQL":      `{"amount":100,"order_no":"x'; DELETE FROM t_flow_0;--"}`,
		"order_no with a path":   `{"amount":100,"order_no":"../../x"}`,
		"order_no with a colon":  `{"amount":100,"order_no":"claim:x"}`,
		"order_no invalid UTF-8": "{\"amount\":100,\"order_no\":\"d\xff\"}",
	} {
		add("deposit "+name, "POST", deposit, body, bad, invalid)
	}
	add("deposit same order_no, other amount", "POST", deposit, `{"amount":99,"order_no":"dep-`+sender+`"}`, http.StatusConflict, "ORDER_CONFLICT")
	add("deposit with a send's order_no", "POST", deposit, `{"amount":1000,"order_no":"snd-1"}`, http.StatusConflict, "ORDER_CONFLICT")

	sendWith := func(fields string) string { return `{"sender":"` + sender + `","order_no":"snd-new",` + fields + `}` }
	for name, fields := range map[string]string{
		"amount string":                 `"amount":"100","count":1`,
		"amount string with decimals":   `"amount":"18.98","count":1`,
		"amount float":                  `"amount":18.98,"count":1`,
		"amount float below a cent":     `"amount":0.1,"count":1`,
		"amount with three decimals":    `"amount":1.005,"count":1`,
		"amount zero":                   `"amount":0,"count":1`,
		"amount negative":               `"amount":-100,"count":1`,
		"amount above the max":          `"amount":50001,"count":1`,
		"amount above int64":            `"amount":9223372036854775808,"count":1`,
		"count zero":                    `"amount":100,"count":0`,
		"count negative":                `"amount":100,"count":-1`,
		"count above amount":            `"amount":5,"count":6`,
		"count above the max":           `"amount":50000,"count":101`,
		"count float":                   `"amount":100,"count":2.5`,
		"count string":                  `"amount":100,"count":"2"`,
		"count above int64":             `"amount":100,"count":9223372036854775808`,
		"fixed not divisible":           `"amount":100,"count":3,"kind":"fixed"`,
		"unknown kind":                  `"amount":100,"count":1,"kind":"lucky"`,
		"greeting too long":             `"amount":100,"count":1,"greeting":"` + strings.Repeat("福", badInputLimits.MaxGreeting+1) + `"`,
		"greeting invalid UTF-8":        "\"amount\":100,\"count\":1,\"greeting\":\"\xff\xfe\"",
		"greeting UTF-8 of a surrogate": "\"amount\":100,\"count\":1,\"greeting\":\"\xed\xa0\x80\"",
		"greeting lone surrogate":       `"amount":100,"count":1,"greeting":"\ud800"`,
		"unknown field":                 `"amount":100,"count":1,"note":"x"`,
		"key twice":                     `"amount":100,"count":1,"count":2`,
	} {
		add("send "+name, "POST", "/v1/packets", sendWith(fields), bad, invalid)
	}
	for name, s := range map[string]string{
		"empty": "", "too long": strings.Repeat("s", 65), "with SQL": "s'; DROP TABLE t_flow_0;--",
		"with a path": "../../etc/passwd", "with a slash": "a/b", "non-ASCII": "ü", "with a NUL": `a\u0000`,
	} {
		add("send sender "+name, "POST", "/v1/packets", `{"sender":"`+s+`","order_no":"snd-new","amount":100,"count":1}`, bad, invalid)
	}
	add("send malformed JSON", "POST", "/v1/packets", sendWith(`"amount":100,"count":1`)[:30], bad, invalid)
	add("send empty body", "POST", "/v1/packets", ``, bad, invalid)
	add("send same order_no, other body", "POST", "/v1/packets", `{"sender":"`+sender+`","order_no":"snd-1","amount":999,"count":10}`, http.StatusConflict, "ORDER_CONFLICT")
	add("send with a deposit's order_no", "POST", "/v1/packets", `{"sender":"`+sender+`","order_no":"dep-`+sender+`","amount":100,"count":1}`, http.StatusConflict, "ORDER_CONFLICT")

	// act_ids in the path. Go's client sends the path as written; the cell
	// splits it first and decodes each segment on its own, so an escaped slash
	// stays inside its act_id (400), and a dot segment names no route (404).
	for name, act := range map[string]string{
		"too long": strings.Repeat("a", 65), "with SQL": "a'%3B%20DROP%20TABLE%20x%3B--", "with a quote": "a'b",
		"with a space": "a%20b", "with a dot": "a.b", "non-ASCII": "%C3%BC", "with a NUL": "a%00b", "with a colon": "a:b",
		"with a backslash": "a%5Cb", "with a percent": "a%25b",
	} {
		add("account act_id "+name, "GET", "/v1/accounts/"+act, "", bad, invalid)
		add("deposit act_id "+name, "POST", "/v1/accounts/"+act+"/deposit", `{"amount":100,"order_no":"dep-new"}`, bad, invalid)
	}
	add("deposit act_id with an escaped slash", "POST", "/v1/accounts/a%2Fb/deposit", `{"amount":100,"order_no":"dep-new"}`, bad, invalid)
	add("account act_id with an escaped slash", "GET", "/v1/accounts/"+sender+"%2F..", "", bad, invalid)
	add("deposit act_id ..", "POST", "/v1/accounts/../deposit", `{"amount":100,"order_no":"dep-new"}`, http.StatusNotFound, "NOT_FOUND")

	// Packet IDs in the path, for detail, grab and open. A 27-character ID
	// holds a 3-digit shard, so a shard above 999 or below 0 makes it too long
	// or not digits.
	for name, id := range map[string]string{
		"too short": packet[:26], "too long": packet + "0", "empty-ish": "x",
		"uppercase hex":               packet[:11] + strings.ToUpper(packet[11:]),
		"Feb 30":                      "20260230417" + packet[11:],
		"month 13":                    "20261301417" + packet[11:],
		"before 2000":                 "19991231417" + packet[11:],
		"shard 1000":                  packet[:8] + "1000" + packet[11:],
		"shard -1":                    packet[:8] + "-01" + packet[11:],
		"with SQL":                    packet[:11] + "'%20OR%20'1'='1'--aa",
		"with a quote":                packet[:26] + "'",
		"with a backslash":            packet[:24] + "%5C..",
		"with a percent":              packet[:26] + "%25",
		"with a space":                packet[:26] + "%20",
		"non-hex tail":                packet[:26] + "g",
		"a claim ID, not a packet ID": packet + "c1",
	} {
		add("detail packet_id "+name, "GET", "/v1/packets/"+id, "", bad, invalid)
		add("grab packet_id "+name, "POST", "/v1/packets/"+id+"/grab", `{"act_id":"u1"}`, bad, invalid)
		add("open packet_id "+name, "POST", "/v1/packets/"+id+"/open", `{"act_id":"u1"}`, bad, invalid)
	}
	add("open packet_id with an escaped slash", "POST", "/v1/packets/"+packet[:13]+"%2F"+packet[14:]+"/open", `{"act_id":"u1"}`, bad, invalid) // the slash stays in the ID
	add("open packet_id ../..", "POST", "/v1/packets/../../open", `{"act_id":"u1"}`, http.StatusNotFound, "NOT_FOUND")
	add("open unknown packet", "POST", "/v1/packets/"+otherPacket(packet)+"/open", `{"act_id":"u1"}`, http.StatusNotFound, "NOT_FOUND")
	for name, q := range map[string]string{"after negative": "after=-1", "after not a number": "after=x", "limit 0": "limit=0", "limit 101": "limit=101", "limit float": "limit=1.5"} {
		add("detail "+name, "GET", "/v1/packets/"+packet+"?"+q, "", bad, invalid)
	}

	// act_ids in the body of grab and open, on the real packet.
	for name, body := range map[string]string{
		"act_id empty": `{"act_id":""}`, "act_id too long": `{"act_id":"` + strings.Repeat("a", 65) + `"}`,
		"act_id with SQL": `{"act_id":"a'; DROP TABLE t_claim_0_01;--"}`, "act_id with a path": `{"act_id":"../../etc"}`,
		"act_id non-ASCII": `{"act_id":"\u00fc"}`, "act_id invalid UTF-8": "{\"act_id\":\"\xff\"}",
		"act_id a number": `{"act_id":42}`, "act_id missing": `{}`, "unknown field": `{"act_id":"u1","amount":100}`,
		"key in another case": `{"Act_ID":"u1"}`, "key twice": `{"act_id":"u1","act_id":"u2"}`,
		"malformed JSON": `{"act_id":"u1"`, "trailing data": `{"act_id":"u1"}x`, "empty body": ``,
	} {
		add("grab "+name, "POST", "/v1/packets/"+packet+"/grab", body, bad, invalid)
		add("open "+name, "POST", "/v1/packets/"+packet+"/open", body, bad, invalid)
	}

	cases = append(cases, badCreditCases(sender, packet)...)
	return cases
}

// badCreditCases: relayed credits (signed, cell to cell) that are malformed.
// Each targets the sender's wallet, so the rows compared would show a credit.
func badCreditCases(sender, packet string) []badCase {
	shard := int(sharding.ShardOfAct(sender))
	credit := func(claim, pkt, act string, shard int, amount string) string {
		return fmt.Sprintf(`{"credits":[{"claim_id":%q,"packet_id":%q,"act_id":%q,"shard":%d,"amount":%s}]}`, claim, pkt, act, shard, amount)
	}
	claim := packet + "c1"
	var cases []badCase
	for name, body := range map[string]string{
		"shard 1000":                 credit(claim, packet, sender, shard+1000, "5"),
		"shard -1":                   credit(claim, packet, sender, -1, "5"),
		"shard of another act":       credit(claim, packet, sender, (shard+1)%model.ShardCount, "5"),
		"amount 0":                   credit(claim, packet, sender, shard, "0"),
		"amount negative":            credit(claim, packet, sender, shard, "-5"),
		"amount float":               credit(claim, packet, sender, shard, "5.5"),
		"claim of another packet":    credit(otherPacket(packet)+"c1", packet, sender, shard, "5"),
		"claim seq 0":                credit(packet+"c0", packet, sender, shard, "5"),
		"claim seq with a zero":      credit(packet+"c01", packet, sender, shard, "5"),
		"claim ID with SQL":          credit(packet+"c1'--", packet, sender, shard, "5"),
		"act_id with SQL":            credit(claim, packet, "a';--", shard, "5"),
		"key in another case inside": strings.Replace(credit(claim, packet, sender, shard, "5"), `"amount":5`, `"amount":5,"AMOUNT":5000`, 1),
		"key twice inside":           strings.Replace(credit(claim, packet, sender, shard, "5"), `"amount":5`, `"amount":5,"amount":5000`, 1),
		"unknown field inside":       strings.Replace(credit(claim, packet, sender, shard, "5"), `"amount":5`, `"amount":5,"bonus":1`, 1),
	} {
		cases = append(cases, badCase{name: "credits " + name, method: "POST", path: "/internal/credits", body: body,
			signed: true, status: http.StatusBadRequest, code: "INVALID_ARGUMENT"})
	}
	return cases
}

// signedHeader signs an internal call with the test cells' cluster secret, now.
func signedHeader(method, path, body string) map[string]string {
	ts := time.Now().UnixMilli()
	return map[string]string{
		api.HeaderTimestamp: strconv.FormatInt(ts, 10),
		api.HeaderSignature: api.Sign([]byte(testSecret), method, path, api.Covered{}, ts, []byte(body)),
	}
}

// otherPacket is a well-formed packet ID that differs from packet in its last digit.
func otherPacket(packet string) string {
	if packet[26] == '0' {
		return packet[:26] + "1"
	}
	return packet[:26] + "0"
}

// snapshot is what bad input must not change.
type snapshot struct {
	balance                               int64
	accounts, flows, packets, claims      int
	senderFlows, senderPackets            int
	packetRemaining, packetRemainingCount int64
}

// takeSnapshot reads the rows of sender's shard straight from the database:
// the tables of its wallet and of the day its packet was made.
func takeSnapshot(t *testing.T, db *sql.DB, sender, packet string) snapshot {
	t.Helper()
	ref, err := model.ParsePacketID(packet)
	if err != nil {
		t.Fatal(err)
	}
	sh := sharding.ShardOfAct(sender)
	dbName := fmt.Sprintf("db_%02d", sh.DB())
	var s snapshot
	for _, q := range []struct {
		dest  any
		query string
		args  []any
	}{
		{&s.balance, fmt.Sprintf("SELECT balance FROM %s.t_account_%d WHERE act_id = ?", dbName, sh.Table()), []any{sender}},
		{&s.accounts, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_account_%d", dbName, sh.Table()), nil},
		{&s.flows, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_flow_%d", dbName, sh.Table()), nil},
		{&s.senderFlows, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_flow_%d WHERE act_id = ?", dbName, sh.Table()), []any{sender}},
		{&s.packets, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_packet_%d_%02d", dbName, sh.Table(), ref.Day), nil},
		{&s.senderPackets, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_packet_%d_%02d WHERE sender = ?", dbName, sh.Table(), ref.Day), []any{sender}},
		{&s.claims, fmt.Sprintf("SELECT COUNT(*) FROM %s.t_claim_%d_%02d", dbName, sh.Table(), ref.Day), nil},
	} {
		if err := db.QueryRow(q.query, q.args...).Scan(q.dest); err != nil {
			t.Fatalf("%s: %v", q.query, err)
		}
	}
	s.packetRemaining, s.packetRemainingCount, _, _ = packetRow(t, db, packet)
	return s
}

// badInputClient is net/http's client: it can send a body chunked or with a
// length and keeps writing while the cell answers, which fasthttp's cannot.
var badInputClient = &http.Client{Timeout: 30 * time.Second}
