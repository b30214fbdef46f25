package api

import (
	"encoding/json"
	"errors"
	"strings"

	"redcell/model"
	"redcell/sharding"
)

// Locate finds the shard a request of public route rt goes to from the key
// its route names (Route.Key): the act_id of the path (pathKey, as Match
// returned it in Params.Key), the "sender" of a send's JSON body, or the
// packet ID of the path, whose shard is part of the ID, or the app account of
// the path, hashed like an act_id (sharding.ShardOfIdentity). For a KeyActQuery
// route pathKey is the query's act_id. user is the act_id the
// router's per-user limit counts for KeyActPath, KeyActQuery and KeySenderBody routes, ""
// for packet routes (their user is in the body: see ScanActID). It is the
// router's routing rule, pure: it reads only its arguments. Errors:
// model.ErrInvalidArgument for a bad act_id, sender or packet ID, or a body
// that is no JSON object. It panics for a route without a key (not public).
func Locate(rt Route, pathKey string, body []byte) (shard model.ShardID, user string, err error) {
	switch rt.Key {
	case KeyActPath, KeyActQuery:
		if err := model.ValidateActID(pathKey); err != nil {
			return 0, "", err
		}
		return sharding.ShardOfAct(pathKey), pathKey, nil
	case KeySenderBody:
		sender, err := SenderOf(body)
		if err != nil {
			return 0, "", err
		}
		return sharding.ShardOfAct(sender), sender, nil
	case KeyPacketPath:
		ref, err := model.ParsePacketID(pathKey)
		if err != nil {
			return 0, "", err
		}
		return ref.Shard, "", nil
	case KeyActBody:
		act, err := ActIDOf(body)
		if err != nil {
			return 0, "", err
		}
		return sharding.ShardOfAct(act), act, nil
	case KeyActivityPath:
		if err := model.ValidateActID(pathKey); err != nil {
			return 0, "", model.Invalidf("parent_activity_id must be 1..64 of [A-Za-z0-9_-]")
		}
		return sharding.ShardOfAct(pathKey), "", nil
	case KeyIdentityPath:
		app, user, err := SplitIdentityKey(pathKey)
		if err != nil {
			return 0, "", err
		}
		return sharding.ShardOfIdentity(app, user), "", nil
	default:
		panic("api: Locate of a route without a key: " + rt.Label)
	}
}

// SenderOf reads and validates the sender of a send's JSON body without
// decoding the rest (the cell decodes the whole body strictly), with messages
// in the API's terms. Errors: model.ErrInvalidArgument.
func SenderOf(body []byte) (string, error) {
	var b struct {
		Sender string `json:"sender"`
	}
	if err := decodeKey(body, &b, "sender"); err != nil {
		return "", err
	}
	if err := model.ValidateActID(b.Sender); err != nil {
		_, msg := model.CodeOf(err)
		return "", model.Invalidf("sender: %s", msg)
	}
	return b.Sender, nil
}

// ActIDOf reads and validates the "act_id" of a JSON body (a reward issue)
// without decoding the rest. Errors: model.ErrInvalidArgument.
func ActIDOf(body []byte) (string, error) {
	var b struct {
		ActID string `json:"act_id"`
	}
	if err := decodeKey(body, &b, "act_id"); err != nil {
		return "", err
	}
	if err := model.ValidateActID(b.ActID); err != nil {
		return "", err
	}
	return b.ActID, nil
}

// decodeKey decodes a JSON body into v, a struct of the one string field,
// named field in the JSON, that SenderOf or ActIDOf reads. Errors, in the
// API's terms (model.ErrInvalidArgument): the field is not a string, the
// body is not a JSON object, or it is not JSON.
func decodeKey(body []byte, v any, field string) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field == field:
		return model.Invalidf("%s must be a string", field)
	case errors.As(err, &te):
		return model.Invalidf("the body must be a JSON object")
	}
	return model.Invalidf("malformed JSON body")
}

// SplitIdentityKey splits the key of an identity route ("{app}/{app_user_id}",
// Params.Key) and validates both. Errors: model.ErrInvalidArgument.
func SplitIdentityKey(key string) (app, appUserID string, err error) {
	app, appUserID, _ = strings.Cut(key, "/")
	if err := model.ValidateApp(app); err != nil {
		return "", "", err
	}
	if err := model.ValidateAppUserID(appUserID); err != nil {
		return "", "", err
	}
	return app, appUserID, nil
}
