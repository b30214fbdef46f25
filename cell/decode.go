package cell

import (
	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
)

// decodeStrict is strictjson.Decode: one JSON object into v, or
// ErrInvalidArgument.
func decodeStrict(body []byte, v any) error { return strictjson.Decode(body, v) }

// MaxDeposit bounds one deposit, cents (api.MaxDeposit).
const MaxDeposit = api.MaxDeposit

func validateDeposit(r api.DepositRequest) error { return r.Validate() }

// validateSend checks a send against the packet limits (api.SendRequest.Validate)
// and returns the domain request and the sender's shard.
func validateSend(r api.SendRequest, lim model.Limits) (model.SendRequest, model.ShardID, error) {
	req, err := r.Validate(lim)
	if err != nil {
		return model.SendRequest{}, 0, err
	}
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
