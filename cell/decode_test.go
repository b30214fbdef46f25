package cell

import (
	"errors"
	"strings"
	"testing"

	"redcell/api"
	"redcell/model"
)

func TestDecodeStrictRejects(t *testing.T) {
	for _, body := range []string{
		`{"amount": "100", "order_no": "a"}`,                // amount as a string
		`{"amount": 18.98, "order_no": "a"}`,                // a float
		`{"amount": 0.1, "order_no": "a"}`,                  // a float below a cent
		`{"amount": 1e3, "order_no": "a"}`,                  // exponent form
		`{"amount": 99999999999999999999, "order_no": "a"}`, // int64 overflow
		`{"amount": 100, "order_no": "a", "extra": 1}`,      // unknown field
		`{"amount": 100, "order_no": "a"} {}`,               // trailing data
		`{"amount": 100,`,                                   // malformed
		``,                                                  // empty
	} {
		var req api.DepositRequest
		if err := decodeStrict([]byte(body), &req); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("body %s: %v", body, err)
		}
	}
	var req api.DepositRequest
	if err := decodeStrict([]byte(`{"amount": 100, "order_no": "a"}`), &req); err != nil || req.Amount != 100 {
		t.Fatalf("valid body: %v %+v", err, req)
	}
}

func TestValidateSend(t *testing.T) {
	lim := model.DefaultLimits()
	ok := api.SendRequest{Sender: "u1", Amount: 1000, Count: 10, Kind: "random", Greeting: "恭喜发财", OrderNo: "s1"}
	if r, sh, err := validateSend(ok, lim); err != nil || r.Kind != model.KindRandom || sh != 663 {
		t.Fatalf("%+v %d %v", r, sh, err)
	}
	noKind := ok
	noKind.Kind = ""
	if r, _, err := validateSend(noKind, lim); err != nil || r.Kind != model.KindRandom {
		t.Fatalf("default kind: %+v %v", r, err)
	}
	bad := map[string]func(r *api.SendRequest){
		"count above amount":    func(r *api.SendRequest) { r.Count = 1001 },
		"zero amount":           func(r *api.SendRequest) { r.Amount = 0 },
		"negative amount":       func(r *api.SendRequest) { r.Amount = -5 },
		"amount above max":      func(r *api.SendRequest) { r.Amount = int64(lim.MaxAmount) + 1 },
		"zero count":            func(r *api.SendRequest) { r.Count = 0 },
		"negative count":        func(r *api.SendRequest) { r.Count = -1 },
		"count above max":       func(r *api.SendRequest) { r.Amount, r.Count = int64(lim.MaxAmount), lim.MaxCount+1 },
		"fixed not divisible":   func(r *api.SendRequest) { r.Kind, r.Amount, r.Count = "fixed", 1000, 3 },
		"unknown kind":          func(r *api.SendRequest) { r.Kind = "lucky" },
		"long greeting":         func(r *api.SendRequest) { r.Greeting = strings.Repeat("福", lim.MaxGreeting+1) },
		"invalid UTF-8":         func(r *api.SendRequest) { r.Greeting = "\xff\xfe" },
		"bad sender":            func(r *api.SendRequest) { r.Sender = "u1'; DROP TABLE x" },
		"empty order_no":        func(r *api.SendRequest) { r.OrderNo = "" },
		"order_no with a colon": func(r *api.SendRequest) { r.OrderNo = "claim:x" },
	}
	for name, mutate := range bad {
		r := ok
		mutate(&r)
		if _, _, err := validateSend(r, lim); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	fixed := ok
	fixed.Kind, fixed.Amount, fixed.Count = "fixed", 999, 3
	if _, _, err := validateSend(fixed, lim); err != nil {
		t.Fatalf("fixed 999/3: %v", err)
	}
}

func TestDecodeActIDMatchesStrictDecoder(t *testing.T) {
	for _, body := range []string{
		`{"act_id":"u1"}`, ` { "act_id" : "u-2_x" } `, "{\n\t\"act_id\":\"u3\"\r\n}",
		`{"act_id":"u\u0031"}`, `{"act_id":"u1","x":1}`, `{"act_id":"u1"}x`, `{"ACT_ID":"u1"}`,
		`{"act_id":1}`, `{"act_id":"u1"`, `{}`, `[]`, ``, `{"act_id":"a\"b"}`, `{"act_id":"u1","act_id":"u2"}`,
	} {
		got, err := decodeActID([]byte(body))
		var want api.ActRequest
		werr := decodeStrict([]byte(body), &want)
		if (err == nil) != (werr == nil) || err == nil && got != want.ActID {
			t.Errorf("body %q: fast path (%q, %v), strict decoder (%q, %v)", body, got, err, want.ActID, werr)
		}
	}
}

// FuzzDecodeActID: the reflection-free path of grab and open bodies agrees with
// the strict decoder on every body; what grab and open accept (decodeActID, then
// ValidateActID) is a valid act_id sent as strict JSON with that one key.
func FuzzDecodeActID(f *testing.F) {
	for _, seed := range []string{`{"act_id":"u1"}`, ` {"act_id" : "x"} `, `{"act_id":"\u0041"}`, `{"act_id":"a","b":1}`, `{`} {
		f.Add([]byte(seed))
	}
	addSeeds(f, badBodies, []string{
		`{"act_id":""}`, `{"act_id":"` + strings.Repeat("a", 64) + `"}`, `{"act_id":"` + strings.Repeat("a", 65) + `"}`,
		`{"act_id":"a b"}`, `{"act_id":"../x"}`, `{"act_id":"u1'--"}`, `{"act_id":"a\/b"}`, `{"act_id":"\u00fc"}`,
		"{\"act_id\":\"\xff\"}", `{"act_id":null}`, `{"act_id":"u1"}` + "\n",
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := decodeActID(body)
		var want api.ActRequest
		werr := decodeStrict(body, &want)
		if (err == nil) != (werr == nil) || err == nil && got != want.ActID {
			t.Fatalf("body %q: fast path (%q, %v), strict decoder (%q, %v)", body, got, err, want.ActID, werr)
		}
		if err == nil {
			err = model.ValidateActID(got)
		}
		if err != nil {
			requireInvalid(t, body, err)
			return
		}
		if !tokenShape.MatchString(got) {
			t.Fatalf("body %q accepted with act_id %q", body, got)
		}
		strictJSON(t, body, map[string]bool{"act_id": true}, nil)
	})
}

func BenchmarkDecodeActID(b *testing.B) {
	body := []byte(`{"act_id":"user-000123"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := decodeActID(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeStrictAct(b *testing.B) {
	body := []byte(`{"act_id":"user-000123"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var req api.ActRequest
		if err := decodeStrict(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}
