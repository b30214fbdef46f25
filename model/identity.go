package model

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// One account across apps. An app's user (app, app_user_id) is bound to the
// person's actID, which rewards, packets and the wallet key on. The same
// phone on any app gives the same actID; without a phone, each app account
// gets one of its own. Both are keyed hashes (HMAC-SHA256 under the
// cluster's identity key), so any cell derives the same actID without asking
// another, and the phone number itself is never stored: a binding keeps only
// the keyed hash of it (PhoneHash), under another label than the actID's.

// IdentityBinding is one app account's binding. PhoneHash is "" when the
// account was bound without a phone. CreatedMS is when it was first bound
// (Unix ms).
type IdentityBinding struct {
	App       string
	AppUserID string
	ActID     string
	PhoneHash string
	CreatedMS int64
}

// IdentityKeyMin is the shortest identity key, in bytes.
const IdentityKeyMin = 16

// phoneDigitsMin and phoneDigitsMax bound a phone number's digits (E.164
// numbers have at most 15; a few national plans use as few as 6).
const (
	phoneDigitsMin = 6
	phoneDigitsMax = 15
)

// ValidateApp checks an app ID: 1..64 characters of [A-Za-z0-9_-].
// Errors: ErrInvalidArgument.
func ValidateApp(s string) error { return validateToken("app", s) }

// ValidateAppUserID checks an app's user ID: 1..64 characters of
// [A-Za-z0-9_-]. Errors: ErrInvalidArgument.
func ValidateAppUserID(s string) error { return validateToken("app_user_id", s) }

// NormalizePhone returns the phone number as digits, with the leading '+' of
// an international number kept: spaces, '-', '.', '(' and ')' are dropped.
// Callers should send E.164 ("+8613800138000"): the same line written with
// and without its country code is two numbers here. The error never repeats
// the number. Errors: ErrInvalidArgument.
func NormalizePhone(s string) (string, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			out = append(out, c)
		case c == '+' && len(out) == 0:
			out = append(out, c)
		case c == ' ' || c == '-' || c == '.' || c == '(' || c == ')':
		default:
			return "", Invalidf("phone may hold only digits, a leading '+', spaces and - . ( )")
		}
	}
	digits := len(out)
	if digits > 0 && out[0] == '+' {
		digits--
	}
	if digits < phoneDigitsMin || digits > phoneDigitsMax {
		return "", Invalidf("phone must have %d..%d digits", phoneDigitsMin, phoneDigitsMax)
	}
	return string(out), nil
}

// identityMAC is HMAC-SHA256 under key of label and parts, each part's
// length first so that no two lists of parts share an input.
func identityMAC(key []byte, label string, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	for _, p := range parts {
		fmt.Fprintf(m, "\x00%d:%s", len(p), p)
	}
	return m.Sum(nil)
}

// actIDHexLen is the hex digits of an actID's hash: 120 bits, so two people
// of a festival's billion never share one.
const actIDHexLen = 30

// PhoneActID is the actID of the person with this phone (normalized by
// NormalizePhone): "p" and 30 hex digits of a keyed hash.
func PhoneActID(key []byte, phone string) string {
	return "p" + hex.EncodeToString(identityMAC(key, "redcell actid phone", phone))[:actIDHexLen]
}

// AppAccountActID is the actID of an app account bound without a phone: "a"
// and 30 hex digits of a keyed hash of the app and its user ID.
func AppAccountActID(key []byte, app, appUserID string) string {
	return "a" + hex.EncodeToString(identityMAC(key, "redcell actid app", app, appUserID))[:actIDHexLen]
}

// PhoneHash is what a binding stores of a phone (normalized): 64 hex digits
// of a keyed hash under a label of its own, so the stored value is not the
// actID's hash.
func PhoneHash(key []byte, phone string) string {
	return hex.EncodeToString(identityMAC(key, "redcell phone hash", phone))
}

// NewBinding is the binding a request asks for: app account (app,
// appUserID), with phone (normalized; "" for none), at nowMS, under the
// identity key.
func NewBinding(key []byte, app, appUserID, phone string, nowMS int64) IdentityBinding {
	b := IdentityBinding{App: app, AppUserID: appUserID, CreatedMS: nowMS}
	if phone != "" {
		b.ActID, b.PhoneHash = PhoneActID(key, phone), PhoneHash(key, phone)
	} else {
		b.ActID = AppAccountActID(key, app, appUserID)
	}
	return b
}

// Bind decides a binding request against the account's binding, if any
// (have nil: none). It answers the binding that holds and whether it was
// there before (repeat):
//   - none before: want, new;
//   - a request without a phone: the binding there, whatever it has (a
//     caller that knows no phone learns the account's actID);
//   - the same phone again: the binding there;
//   - another phone, or a phone for an account bound without one:
//     ErrIdentityConflict, nothing changes (money may already hang on the
//     actID it has).
func Bind(have *IdentityBinding, want IdentityBinding) (IdentityBinding, bool, error) {
	switch {
	case have == nil:
		return want, false, nil
	case want.PhoneHash == "" || want.PhoneHash == have.PhoneHash:
		return *have, true, nil
	case have.PhoneHash == "":
		return IdentityBinding{}, false, Errorf(ErrIdentityConflict,
			"%s user %s is bound without a phone, to act_id %s", have.App, have.AppUserID, have.ActID)
	}
	return IdentityBinding{}, false, Errorf(ErrIdentityConflict, "%s user %s is bound to another phone", have.App, have.AppUserID)
}
