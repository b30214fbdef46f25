package cell

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
)

// The fuzz targets of the request decoders. `go test` runs their f.Add seeds and
// the files under testdata/fuzz/<target>/ as ordinary tests; `go test -fuzz`
// explores further (docs/testing.md). Each target runs a body through the same
// decode and validation a handler runs and, when the body is accepted, checks the
// result against the validation rules and the body against an oracle written
// apart from the decoder (strictJSON); a refused body must be INVALID_ARGUMENT.

// badBodies are bodies every decoder must refuse: one per class of bad input.
var badBodies = []string{
	``, ` `, `null`, `[]`, `"x"`, `1`, `{`, `}`, `{"amount":}`, `{"amount":1,}`, // malformed
	`{} {}`, `{}x`, `{}]`, // trailing data
	`{"extra":1}`, `{"Amount":1}`, `{"AMOUNT":1}`, `{"amount":1,"amount":2}`, // unknown, case, twice
	"{\"amount\":1,\"order_no\":\"a\xff\"}", "\xef\xbb\xbf{}", // invalid UTF-8, a BOM
	`{"greeting":"\ud800"}`, `{"greeting":"\udc00x"}`, `{"greeting":"\ud800\u0041"}`, // lone surrogates
	`{"amount":"100"}`, `{"amount":18.98}`, `{"amount":0.1}`, `{"amount":1.005}`, `{"amount":1e3}`, `{"amount":1E2}`,
	`{"amount":-0.0}`, `{"amount":true}`, `{"amount":[1]}`, `{"amount":{"v":1}}`,
	`{"amount":99999999999999999999}`, `{"amount":9223372036854775808}`, `{"amount":-9223372036854775809}`,
	`{"count":"3"}`, `{"count":2.5}`, `{"count":99999999999999999999}`,
	`{"act_id":1}`, `{"act_id":null,"x":1}`, `{"credits":{}}`, `{"credits":[{"Amount":1}]}`, `{"credits":[{"amount":1,"amount":2}]}`,
}

// TestDecodeStrictRefusesBadBodies: every bad body is refused by decodeStrict
// itself, whatever the request type, before any validation rule runs.
func TestDecodeStrictRefusesBadBodies(t *testing.T) {
	for _, body := range badBodies {
		for _, v := range []any{&api.DepositRequest{}, &api.SendRequest{}, &api.ActRequest{}, &api.CreditsRequest{}} {
			if err := decodeStrict([]byte(body), v); !errors.Is(err, model.ErrInvalidArgument) {
				t.Errorf("decodeStrict(%q) into %T: %v", body, v, err)
			}
		}
	}
	// Escapes that are not lone surrogates still decode.
	for body, want := range map[string]string{
		`{"act_id":"\u0061"}`:       "a",
		`{"act_id":"\ud83e\udde7"}`: "🧧",
		`{"act_id":"\\ud800"}`:      `\ud800`,
		`{"act_id":"\ufffd"}`:       "\ufffd",
		"{\"act_id\":\"x\"}\r\n\t ": "x",
	} {
		var r api.ActRequest
		if err := decodeStrict([]byte(body), &r); err != nil || r.ActID != want {
			t.Errorf("decodeStrict(%q) = %q, %v; want %q", body, r.ActID, err, want)
		}
	}
}

func addSeeds(f *testing.F, seeds ...[]string) {
	for _, list := range seeds {
		for _, s := range list {
			f.Add([]byte(s))
		}
	}
}

// FuzzDecodeDeposit: an accepted deposit body has amount 1..MaxDeposit and a
// valid order_no, and is exactly the strict JSON it claims to be.
func FuzzDecodeDeposit(f *testing.F) {
	addSeeds(f, badBodies, []string{
		`{"amount":100,"order_no":"dep-1"}`, ` { "order_no" : "d" , "amount" : 1 } `,
		`{"amount":10000000000,"order_no":"d"}`, `{"amount":10000000001,"order_no":"d"}`, // MaxDeposit and above
		`{"amount":0,"order_no":"d"}`, `{"amount":-1,"order_no":"d"}`, `{"amount":9223372036854775807,"order_no":"d"}`,
		`{"amount":null,"order_no":"d"}`, `{"amount":100,"order_no":"d e"}`, `{"amount":100,"order_no":"d/../e"}`,
		`{"amount":100,"order_no":"` + strings.Repeat("o", 65) + `"}`, `{"amount":100}`, `{"amount":100,"order_no":"\u0064"}`,
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.DepositRequest
		err := decodeStrict(body, &req)
		if err == nil {
			err = validateDeposit(req)
		}
		if err != nil {
			requireInvalid(t, body, err)
			return
		}
		if req.Amount < 1 || model.Cents(req.Amount) > MaxDeposit || !tokenShape.MatchString(req.OrderNo) {
			t.Fatalf("body %q accepted as %+v", body, req)
		}
		strictJSON(t, body, fieldsOf(req), nil)
		requireInts(t, body, map[string]int64{"amount": req.Amount})
	})
}

// FuzzDecodeSend: an accepted send body satisfies every send rule (amount,
// count, kind, greeting, sender, order_no; docs/api.md), is routed to the
// sender's shard, and is exactly the strict JSON it claims to be. Greetings keep
// what was sent: no invalid text is silently replaced by U+FFFD.
func FuzzDecodeSend(f *testing.F) {
	ok := func(fields string) string {
		return `{"sender":"u1","order_no":"s1",` + fields + `}`
	}
	addSeeds(f, badBodies, []string{
		ok(`"amount":1000,"count":10,"kind":"random","greeting":"恭喜发财"`),
		ok(`"amount":1000,"count":10`), ok(`"amount":999,"count":3,"kind":"fixed"`), ok(`"amount":1000,"count":3,"kind":"fixed"`),
		ok(`"amount":1,"count":1`), ok(`"amount":10000000,"count":10000000`), // the default maxima
		ok(`"amount":10000001,"count":1`), ok(`"amount":10000000,"count":10000001`), // above them
		ok(`"amount":0,"count":1`), ok(`"amount":-100,"count":1`), ok(`"amount":100,"count":0`), ok(`"amount":100,"count":-1`),
		ok(`"amount":5,"count":6`), ok(`"amount":"18.98","count":1`), ok(`"amount":18.98,"count":1`), ok(`"amount":0.1,"count":1`),
		ok(`"amount":1.234,"count":1`), ok(`"amount":100,"count":1.0`), ok(`"amount":9223372036854775807,"count":1`),
		ok(`"amount":100,"count":1,"kind":"lucky"`), ok(`"amount":100,"count":1,"kind":"Fixed"`), ok(`"amount":100,"count":1,"kind":null`),
		ok(`"amount":100,"count":1,"greeting":"` + strings.Repeat("福", 64) + `"`),
		ok(`"amount":100,"count":1,"greeting":"` + strings.Repeat("福", 65) + `"`),
		ok(`"amount":100,"count":1,"greeting":"\ud83e\udde7"`), ok(`"amount":100,"count":1,"greeting":"\ufffd"`),
		ok("\"amount\":100,\"count\":1,\"greeting\":\"\xff\xfe\""), ok("\"amount\":100,\"count\":1,\"greeting\":\"\xed\xa0\x80\""),
		ok(`"amount":100,"count":1,"greeting":"\ud800"`), ok(`"amount":100,"count":1,"greeting":"\\ud800"`),
		`{"sender":"u1'; DROP TABLE t_flow_0;--","order_no":"s1","amount":100,"count":1}`,
		`{"sender":"../u1","order_no":"s1","amount":100,"count":1}`, `{"sender":"u1","order_no":"claim:1","amount":100,"count":1}`,
	})
	lim := model.DefaultLimits()
	f.Fuzz(func(t *testing.T, body []byte) {
		var r api.SendRequest
		err := decodeStrict(body, &r)
		var req model.SendRequest
		var sh model.ShardID
		if err == nil {
			req, sh, err = validateSend(r, lim)
		}
		if err != nil {
			requireInvalid(t, body, err)
			return
		}
		bad := func(rule string) { t.Fatalf("body %q accepted as %+v: %s", body, r, rule) }
		if lim.CheckShares(req.Amount, req.Count) != nil || req.Amount < 1 || req.Amount > lim.MaxAmount || req.Count < 1 || req.Count > lim.MaxCount || req.Count > int64(req.Amount) {
			bad("amount and count out of range")
		}
		if req.Kind != model.KindRandom && (req.Kind != model.KindFixed || int64(req.Amount)%req.Count != 0) {
			bad("kind")
		}
		if !utf8.ValidString(req.Greeting) || utf8.RuneCountInString(req.Greeting) > lim.MaxGreeting {
			bad("greeting")
		}
		if strings.ContainsRune(req.Greeting, utf8.RuneError) && !bytes.Contains(body, []byte("\xef\xbf\xbd")) && !bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
			bad("greeting holds U+FFFD the body did not send")
		}
		if !tokenShape.MatchString(req.Sender) || !tokenShape.MatchString(req.OrderNo) {
			bad("sender or order_no")
		}
		if sh != sharding.ShardOfAct(req.Sender) || !sh.Valid() {
			bad("shard")
		}
		if int64(req.Amount) != r.Amount || req.Count != r.Count || req.Greeting != r.Greeting || req.Sender != r.Sender || req.OrderNo != r.OrderNo {
			bad("the request differs from the body")
		}
		strictJSON(t, body, fieldsOf(r), nil)
		requireInts(t, body, map[string]int64{"amount": r.Amount, "count": r.Count})
	})
}

// FuzzDecodeCredits: every credit of an accepted /internal/credits body (the
// relay's, signed) carries a well-formed claim ID of its packet, a valid act_id
// of its shard and an amount >= 1, and the body is strict JSON at every level:
// the nested credit objects too.
func FuzzDecodeCredits(f *testing.F) {
	const claim = `"claim_id":"20261129417a3f9c0e1b2d4c5e6c1","packet_id":"20261129417a3f9c0e1b2d4c5e6"`
	addSeeds(f, badBodies, []string{
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":51}]}`,
		`{"credits":[]}`, `{"credits":null}`, `{}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":0}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":28,"amount":1}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":1027,"amount":1}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":-973,"amount":1}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":1.5}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":51,"AMOUNT":5000}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":51,"amount":5000}]}`,
		`{"credits":[{` + claim + `,"act_id":"bob","shard":27,"amount":51,"extra":1}]}`,
		`{"credits":[{"claim_id":"20261129417a3f9c0e1b2d4c5e6c1","packet_id":"20261129417a3f9c0e1b2d4c5e7","act_id":"bob","shard":27,"amount":1}]}`,
		`{"credits":[{"claim_id":"20261129417a3f9c0e1b2d4c5e6c01","packet_id":"20261129417a3f9c0e1b2d4c5e6","act_id":"bob","shard":27,"amount":1}]}`,
	})
	o := newOwnership("fuzz", sharding.Ranges{{From: 0, To: model.ShardCount - 1}}, 1)
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CreditsRequest
		err := decodeStrict(body, &req)
		for i := 0; err == nil && i < len(req.Credits); i++ {
			err = o.validCredit(req.Credits[i])
		}
		if err != nil {
			requireInvalid(t, body, err)
			return
		}
		for _, c := range req.Credits {
			ref, seq, err := model.ParseClaimID(c.ClaimID)
			if err != nil || ref.ID != c.PacketID || model.ClaimID(c.PacketID, seq) != c.ClaimID {
				t.Fatalf("body %q: credit %+v has a bad claim ID", body, c)
			}
			if !tokenShape.MatchString(c.ActID) || c.Shard != sharding.ShardOfAct(c.ActID) || !c.Shard.Valid() || c.Amount < 1 {
				t.Fatalf("body %q: credit %+v accepted", body, c)
			}
		}
		strictJSON(t, body, fieldsOf(req), fieldsOf(model.Credit{}))
		var raw struct{ Credits []json.RawMessage }
		if err := json.Unmarshal(body, &raw); err != nil || len(raw.Credits) != len(req.Credits) {
			t.Fatalf("body %q: %v", body, err)
		}
		for i, c := range raw.Credits {
			requireInts(t, c, map[string]int64{"amount": int64(req.Credits[i].Amount), "shard": int64(req.Credits[i].Shard)})
		}
	})
}

// tokenShape is the act_id and order_no rule, written apart from model.
var tokenShape = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// requireInvalid checks that a refused body got INVALID_ARGUMENT.
func requireInvalid(t *testing.T, body []byte, err error) {
	t.Helper()
	if !errors.Is(err, model.ErrInvalidArgument) {
		t.Fatalf("body %q: %v is not INVALID_ARGUMENT", body, err)
	}
}

// fieldsOf returns the JSON names of struct v's fields.
func fieldsOf(v any) map[string]bool {
	b, _ := json.Marshal(v)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// strictJSON is the oracle for an accepted body: valid UTF-8, exactly one JSON
// value, an object whose keys are in top, each once, spelled exactly; objects
// nested inside (at any depth) hold only keys of nested, each once.
func strictJSON(t *testing.T, body []byte, top, nested map[string]bool) {
	t.Helper()
	if !utf8.Valid(body) || !json.Valid(body) {
		t.Fatalf("accepted body %q is not valid UTF-8 JSON", body)
	}
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		t.Fatalf("accepted body %q is not an object", body)
	}
	objects, err := jsonObjects(body)
	if err != nil {
		t.Fatalf("accepted body %q: %v", body, err)
	}
	for _, o := range objects {
		allowed := nested
		if o.depth == 0 {
			allowed = top
		}
		seen := map[string]bool{}
		for _, k := range o.keys {
			if !allowed[k] || seen[k] {
				t.Fatalf("accepted body %q has key %q unknown or repeated at depth %d", body, k, o.depth)
			}
			seen[k] = true
		}
	}
}

type jsonObject struct {
	depth int
	keys  []string
}

// jsonObjects lists every object of body with its keys in order, duplicates
// kept (encoding/json's maps would drop them).
func jsonObjects(body []byte) ([]jsonObject, error) {
	type frame struct {
		object, wantKey bool
		keys            []string
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var stack []*frame
	var out []jsonObject
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			top := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				out = append(out, jsonObject{depth: len(stack), keys: top.keys})
				valueDone()
				continue
			}
			key, _ := tok.(string)
			top.keys, top.wantKey = append(top.keys, key), false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// intLiteral is a JSON integer: no fraction, no exponent, no quotes.
var intLiteral = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// requireInts checks that each integer field of an accepted object was sent as
// an integer literal of exactly the decoded value, or left out (or null) and 0.
func requireInts(t *testing.T, object []byte, want map[string]int64) {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(object, &raw); err != nil {
		t.Fatalf("accepted object %q: %v", object, err)
	}
	for field, v := range want {
		lit, ok := raw[field]
		if !ok || string(lit) == "null" {
			if v != 0 {
				t.Fatalf("accepted object %q: %s absent but decoded as %d", object, field, v)
			}
			continue
		}
		n, err := strconv.ParseInt(string(lit), 10, 64)
		if !intLiteral.Match(lit) || err != nil || n != v {
			t.Fatalf("accepted object %q: %s sent as %s, decoded as %d", object, field, lit, v)
		}
	}
}
