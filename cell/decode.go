package cell

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"redcell/cell/api"
	"redcell/model"
	"redcell/sharding"
)

// decodeStrict decodes one JSON object into v (a pointer to a struct with json
// tags): unknown fields, keys in another case or given twice, trailing data,
// strings or floats where integers belong, and int64 overflow are all
// ErrInvalidArgument. encoding/json alone would match keys without regard to
// case and let a repeated key win silently, so keys are checked first.
func decodeStrict(body []byte, v any) error {
	if err := exactKeys(body, jsonFields(reflect.TypeOf(v).Elem())); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return model.Invalidf("field %q must be %s", te.Field, kindName(te.Type.Kind()))
		}
		return model.Invalidf("malformed JSON body")
	}
	if dec.More() {
		return model.Invalidf("trailing data after the JSON body")
	}
	return nil
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.Int64, reflect.Int, reflect.Int32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "an array"
	case reflect.Struct:
		return "an object"
	}
	return "of another type"
}

// exactKeys checks that body is a JSON object whose keys are all in allowed,
// spelled exactly, each at most once.
func exactKeys(body []byte, allowed map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return model.Invalidf("malformed JSON body")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return model.Invalidf("the body must be a JSON object")
	}
	seen := make(map[string]bool, len(allowed))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return model.Invalidf("malformed JSON body")
		}
		key, _ := tok.(string)
		if !allowed[key] {
			return model.Invalidf("unknown field %q", key)
		}
		if seen[key] {
			return model.Invalidf("field %q appears twice", key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return model.Invalidf("malformed JSON body")
		}
	}
	return nil
}

var fieldsByType sync.Map // reflect.Type -> map[string]bool

// jsonFields returns the JSON names of struct type t's fields.
func jsonFields(t reflect.Type) map[string]bool {
	if f, ok := fieldsByType.Load(t); ok {
		return f.(map[string]bool)
	}
	f := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			f[name] = true
		}
	}
	fieldsByType.Store(t, f)
	return f
}

// MaxDeposit bounds one deposit, cents (100 million CNY), far from int64 overflow.
const MaxDeposit model.Cents = 10_000_000_000

func validateDeposit(r api.DepositRequest) error {
	if r.Amount < 1 || model.Cents(r.Amount) > MaxDeposit {
		return model.Invalidf("amount must be 1..%d cents", MaxDeposit)
	}
	return model.ValidateOrderNo(r.OrderNo)
}

// validateSend checks a send against the packet limits and returns the domain request.
func validateSend(r api.SendRequest, lim model.Limits) (model.SendRequest, model.ShardID, error) {
	if err := model.ValidateActID(r.Sender); err != nil {
		_, msg := model.CodeOf(err)
		return model.SendRequest{}, 0, model.Invalidf("sender: %s", msg)
	}
	if err := model.ValidateOrderNo(r.OrderNo); err != nil {
		return model.SendRequest{}, 0, err
	}
	if err := lim.CheckShares(model.Cents(r.Amount), r.Count); err != nil {
		return model.SendRequest{}, 0, err
	}
	kind := model.PacketKind(r.Kind)
	switch kind {
	case "":
		kind = model.KindRandom
	case model.KindRandom:
	case model.KindFixed:
		if r.Amount%r.Count != 0 {
			return model.SendRequest{}, 0, model.Invalidf("a fixed packet's amount must be a multiple of its count")
		}
	default:
		return model.SendRequest{}, 0, model.Invalidf("kind must be random or fixed")
	}
	if !utf8.ValidString(r.Greeting) || utf8.RuneCountInString(r.Greeting) > lim.MaxGreeting {
		return model.SendRequest{}, 0, model.Invalidf("greeting must be valid UTF-8 of at most %d characters", lim.MaxGreeting)
	}
	req := model.SendRequest{Sender: r.Sender, Amount: model.Cents(r.Amount), Count: r.Count, Kind: kind, Greeting: r.Greeting, OrderNo: r.OrderNo}
	return req, sharding.ShardOfAct(r.Sender), nil
}

// decodeActID reads the body of grab and open, {"act_id": "..."}, without
// reflection: it is on the hot path. Anything but that exact shape (other keys,
// escapes, trailing data) goes through decodeStrict, which accepts the same
// language and gives the precise error.
func decodeActID(body []byte) (string, error) {
	if id, ok := api.ScanActID(body); ok {
		return id, nil
	}
	var req api.ActRequest
	if err := decodeStrict(body, &req); err != nil {
		return "", err
	}
	return req.ActID, nil
}
