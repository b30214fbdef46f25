package cell

import (
	"unicode/utf8"

	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
)

// decodeStrict is strictjson.Decode: one JSON object into v, or
// ErrInvalidArgument.
func decodeStrict(body []byte, v any) error { return strictjson.Decode(body, v) }

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
