package api

import (
	"unicode/utf8"

	"redcell/model"
)

// MaxDeposit bounds one deposit, cents (100 million CNY), far from int64 overflow.
const MaxDeposit model.Cents = 10_000_000_000

// Validate checks a deposit body: amount 1..MaxDeposit cents and an order
// number of model.ValidateOrderNo's shape. Errors: model.ErrInvalidArgument.
func (r DepositRequest) Validate() error {
	if r.Amount < 1 || model.Cents(r.Amount) > MaxDeposit {
		return model.Invalidf("amount must be 1..%d cents", MaxDeposit)
	}
	return model.ValidateOrderNo(r.OrderNo)
}

// Validate checks a send body against the packet limits and returns the
// domain request (kind "" becomes random): the sender's act_id and the order
// number well formed, amount and count within lim (every share at least a
// cent), a fixed packet's amount a multiple of its count, and the greeting
// valid UTF-8 of at most lim.MaxGreeting characters. Errors:
// model.ErrInvalidArgument, with the field in the message.
func (r SendRequest) Validate(lim model.Limits) (model.SendRequest, error) {
	if err := model.ValidateActID(r.Sender); err != nil {
		_, msg := model.CodeOf(err)
		return model.SendRequest{}, model.Invalidf("sender: %s", msg)
	}
	if err := model.ValidateOrderNo(r.OrderNo); err != nil {
		return model.SendRequest{}, err
	}
	if err := lim.CheckShares(model.Cents(r.Amount), r.Count); err != nil {
		return model.SendRequest{}, err
	}
	kind := model.PacketKind(r.Kind)
	switch kind {
	case "":
		kind = model.KindRandom
	case model.KindRandom:
	case model.KindFixed:
		if r.Amount%r.Count != 0 {
			return model.SendRequest{}, model.Invalidf("a fixed packet's amount must be a multiple of its count")
		}
	default:
		return model.SendRequest{}, model.Invalidf("kind must be random or fixed")
	}
	if !utf8.ValidString(r.Greeting) || utf8.RuneCountInString(r.Greeting) > lim.MaxGreeting {
		return model.SendRequest{}, model.Invalidf("greeting must be valid UTF-8 of at most %d characters", lim.MaxGreeting)
	}
	return model.SendRequest{Sender: r.Sender, Amount: model.Cents(r.Amount), Count: r.Count, Kind: kind, Greeting: r.Greeting, OrderNo: r.OrderNo}, nil
}
