package cell

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"

	"redcell/cell/api"
	"redcell/model"
	"redcell/sharding"
)

// decodeStrict decodes one JSON object into v: unknown fields, trailing data,
// strings or floats where integers belong, and int64 overflow are all
// ErrInvalidArgument.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return model.Invalidf("field %q must be %s", te.Field, te.Type.String())
		}
		return model.Invalidf("malformed JSON body: %v", err)
	}
	if dec.More() {
		return model.Invalidf("trailing data after the JSON body")
	}
	return nil
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
	if r.Amount < 1 || model.Cents(r.Amount) > lim.MaxAmount {
		return model.SendRequest{}, 0, model.Invalidf("amount must be 1..%d cents", lim.MaxAmount)
	}
	if r.Count < 1 || r.Count > lim.MaxCount {
		return model.SendRequest{}, 0, model.Invalidf("count must be 1..%d", lim.MaxCount)
	}
	if r.Count > r.Amount {
		return model.SendRequest{}, 0, model.Invalidf("count %d is above amount %d: every share needs at least 1 cent", r.Count, r.Amount)
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
