package strictjson

import (
	"reflect"
	"testing"
)

type inner struct {
	ID    string `json:"id"`
	Count int64  `json:"count"`
}

type outer struct {
	ActID  string   `json:"act_id"`
	Amount int64    `json:"amount"`
	Green  bool     `json:"green,omitempty"`
	Tokens []string `json:"tokens"`
	One    *inner   `json:"one"`
	Many   []inner  `json:"many"`
}

// bodies is a corpus of bodies for outer: the common ones plainKeys must
// take (fast), and ones it must leave to exactKeys.
var bodies = []struct {
	body string
	fast bool // plainKeys answers true
}{
	{`{"act_id":"u1","amount":5}`, true},
	{` { "act_id" : "u\"1\\" , "amount" : -5e2 , "green" : true } `, true},
	{`{}`, true},
	{`{"tokens":["a","b]}"],"one":{"id":"x","count":1},"many":[{"id":"y"},{"count":2}]}`, true},
	{`{"act_id":"u1","amount":5} trailing`, true}, // the decoder refuses the trailing data
	{`{"act_id":"u1","amount":tru}`, true},        // the decoder refuses the literal, as exactKeys does
	{`{"act_id":"u1","amount":1-2}`, true},
	{`{"act_id":"u1","act_id":"u2"}`, false},
	{`{"Act_ID":"u1"}`, false},
	{`{"\u0061ct_id":"u1"}`, false},
	{`{"act_id":"u1","extra":1}`, false},
	{`{"one":{"id":"x","ID":"y"}}`, false},
	{`{"many":[{"id":"x"},{"nope":1}]}`, false},
	{`{"one":{"id":"x","id":"y"}}`, false},
	{`["act_id"]`, false},
	{`{"act_id":"u1",}`, false},
	{`{"act_id" "u1"}`, false},
	{`{"act_id":"u1"`, false},
	{`{"act_id":}`, false},
	{``, false},
	{`{"a`, false},
}

func TestPlainKeysAgreesWithExactKeys(t *testing.T) {
	typ := reflect.TypeFor[outer]()
	for _, c := range bodies {
		fast := plainKeys([]byte(c.body), typ)
		if fast != c.fast {
			t.Errorf("plainKeys(%s) = %v, want %v", c.body, fast, c.fast)
		}
		sameAnswers(t, c.body)
	}
	// Decode's answers through the fast path.
	var o outer
	if err := Decode([]byte(`{"act_id":"u1","amount":5,"many":[{"id":"y","count":3}]}`), &o); err != nil || o.ActID != "u1" || o.Amount != 5 || len(o.Many) != 1 || o.Many[0].Count != 3 {
		t.Fatalf("decode: %+v %v", o, err)
	}
	for body, want := range map[string]string{
		`{"act_id":"u1","amount":5} x`:   "INVALID_ARGUMENT: trailing data after the JSON body",
		`{"act_id":"u1","amount":tru}`:   "INVALID_ARGUMENT: malformed JSON body",
		`{"act_id":"u1","amount":"5"}`:   `INVALID_ARGUMENT: field "amount" must be an integer`,
		`{"act_id":"u1","act_id":"u2"}`:  `INVALID_ARGUMENT: field "act_id" appears twice`,
		`{"act_id":"u1","Amount":5}`:     `INVALID_ARGUMENT: unknown field "Amount"`,
		`{"one":{"id":"x","idd":1}}`:     `INVALID_ARGUMENT: unknown field "idd"`,
		`{"act_id":"u1","amount":5.5}`:   `INVALID_ARGUMENT: field "amount" must be an integer`,
		`{"act_id":"u1","amount":5,}`:    "INVALID_ARGUMENT: malformed JSON body",
		`{"act_id":"u1","amount":5 "x"}`: "INVALID_ARGUMENT: malformed JSON body",
	} {
		var o outer
		if err := Decode([]byte(body), &o); err == nil || err.Error() != want {
			t.Errorf("Decode(%s) = %v, want %s", body, err, want)
		}
	}
}

// sameAnswers asserts Decode answers body as it does without plainKeys:
// the same error, or the same value.
func sameAnswers(t *testing.T, body string) {
	t.Helper()
	var a, b outer
	ea, eb := decode([]byte(body), &a, true), decode([]byte(body), &b, false)
	if (ea == nil) != (eb == nil) || ea != nil && ea.Error() != eb.Error() || !reflect.DeepEqual(a, b) {
		t.Fatalf("%q: with plainKeys %v %+v, without %v %+v", body, ea, a, eb, b)
	}
}

// FuzzPlainKeys: whatever the body, Decode answers as without plainKeys.
func FuzzPlainKeys(f *testing.F) {
	for _, c := range bodies {
		f.Add(c.body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		sameAnswers(t, body)
	})
}

func BenchmarkKeys(b *testing.B) {
	body := []byte(`{"parent_activity_id":"demo-festival","scene_id":"rain","rain_id":"bmx3t-1234","act_id":"bmx3t-u-48213","award_type":"cash","amount":517}`)
	type req struct {
		Parent string `json:"parent_activity_id"`
		Scene  string `json:"scene_id"`
		Rain   string `json:"rain_id"`
		ActID  string `json:"act_id"`
		Award  string `json:"award_type"`
		Amount int64  `json:"amount"`
		Stage  string `json:"stage"`
	}
	typ := reflect.TypeFor[req]()
	b.Run("plainKeys", func(b *testing.B) {
		for b.Loop() {
			if !plainKeys(body, typ) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("exactKeys", func(b *testing.B) {
		for b.Loop() {
			if err := exactKeys(body, typ); err != nil {
				b.Fatal(err)
			}
		}
	})
}
