package model

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nyaruka/phonenumbers"
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

// phoneDigitsMin and phoneDigitsMax bound a phone number's digits in the
// form bindings stored before numbers were parsed (legacyPhoneForm).
const (
	phoneDigitsMin = 6
	phoneDigitsMax = 15
)

// phoneInputMax bounds the text of a phone number a request may send: a
// number with its spaces, dashes and an international prefix fits easily, and
// the parser's work stays small.
const phoneInputMax = 64

// ValidateApp checks an app ID: 1..64 characters of [A-Za-z0-9_-].
// Errors: ErrInvalidArgument.
func ValidateApp(s string) error { return validateToken("app", s) }

// ValidateAppUserID checks an app's user ID: 1..64 characters of
// [A-Za-z0-9_-]. Errors: ErrInvalidArgument.
func ValidateAppUserID(s string) error { return validateToken("app_user_id", s) }

// Phone is a phone number as identity binding reads it (ParsePhone).
type Phone struct {
	// E164 is the number in E.164 ("+8613800138111"): what a binding is
	// keyed on (PhoneActID, PhoneHash), whatever the spelling sent.
	E164 string
	// Legacy are the forms a binding stored before numbers were parsed may
	// hold for this number (digits and a leading '+' as sent, see
	// legacyPhoneForm): the spelling sent and the number's usual spellings
	// (national, with the country code but no '+', after "00"). E164 is not
	// among them. A binding with one of their hashes is this number's.
	Legacy []string
}

// ParsePhone reads a phone number with github.com/nyaruka/phonenumbers
// (Google's libphonenumber metadata): a number that starts with '+' is read
// as international, any other in region (ISO 3166-1 alpha-2, e.g. "CN"; the
// cluster's identity_default_region), where a national number
// ("138 0013 8111"), one with the international prefix ("00 86 138 0013
// 8111") and one in E.164 ("+8613800138111") are one number. Spaces,
// dashes, dots and parentheses may separate digits; anything else (letters,
// an extension, a second '+') is refused, though the parser would read some
// of it leniently. It refuses a number the metadata does not know as valid
// (too short or long for its country, an unassigned range). The error never
// repeats the number. Errors: ErrInvalidArgument.
func ParsePhone(s, region string) (Phone, error) {
	if len(s) > phoneInputMax {
		return Phone{}, Invalidf("phone must be at most %d characters", phoneInputMax)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c == ' ' || c == '-' || c == '.' || c == '(' || c == ')':
		case c == '+' && strings.TrimLeft(s[:i], " (") == "":
		default:
			return Phone{}, errPhoneChars
		}
	}
	n, err := phonenumbers.Parse(s, region)
	if err != nil || !phonenumbers.IsValidNumber(n) {
		return Phone{}, Invalidf("phone is not a valid number (read in region %s unless it starts with '+')", region)
	}
	p := Phone{E164: phonenumbers.Format(n, phonenumbers.E164)}
	cc, nsn := strconv.Itoa(int(n.GetCountryCode())), phonenumbers.GetNationalSignificantNumber(n)
	forms := []string{cc + nsn, "00" + cc + nsn, nsn}
	if national, err := legacyPhoneForm(phonenumbers.Format(n, phonenumbers.NATIONAL)); err == nil {
		forms = append(forms, national) // with a trunk prefix where the country dials one ("010 1234 5678")
	}
	if sent, err := legacyPhoneForm(s); err == nil {
		forms = append(forms, sent)
	}
	for _, f := range forms {
		if f != p.E164 && !slices.Contains(p.Legacy, f) {
			p.Legacy = append(p.Legacy, f)
		}
	}
	return p, nil
}

var errPhoneChars = Invalidf("phone may hold only digits, a leading '+', spaces and - . ( )")

// ValidPhoneRegion checks a default region for ParsePhone: a region the
// phone metadata knows ("CN", "DE", "US", ...). Errors: ErrInvalidArgument.
func ValidPhoneRegion(region string) error {
	if !phonenumbers.GetSupportedRegions()[region] {
		return Invalidf("phone region %q is no ISO 3166-1 alpha-2 region the phone metadata knows (e.g. CN)", region)
	}
	return nil
}

// legacyPhoneForm is how bindings read a phone before numbers were parsed:
// the digits, with the leading '+' of an international number kept, spaces,
// '-', '.', '(' and ')' dropped. Such a binding's act_id and hash are of this
// form: "13800138111" and "+8613800138111" were two people. Kept, unchanged,
// only to find those bindings (Phone.Legacy).
func legacyPhoneForm(s string) (string, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			out = append(out, c)
		case c == '+' && len(out) == 0:
			out = append(out, c)
		case c == ' ' || c == '-' || c == '.' || c == '(' || c == ')':
		default:
			return "", errPhoneChars
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

// PhoneActID is the actID of the person with this phone (Phone.E164; a
// binding stored before numbers were parsed has that of a legacy form): "p"
// and 30 hex digits of a keyed hash.
func PhoneActID(key []byte, phone string) string {
	return "p" + hex.EncodeToString(identityMAC(key, "redcell actid phone", phone))[:actIDHexLen]
}

// AppAccountActID is the actID of an app account bound without a phone: "a"
// and 30 hex digits of a keyed hash of the app and its user ID.
func AppAccountActID(key []byte, app, appUserID string) string {
	return "a" + hex.EncodeToString(identityMAC(key, "redcell actid app", app, appUserID))[:actIDHexLen]
}

// PhoneHash is what a binding stores of a phone (Phone.E164): 64 hex digits
// of a keyed hash under a label of its own, so the stored value is not the
// actID's hash.
func PhoneHash(key []byte, phone string) string {
	return hex.EncodeToString(identityMAC(key, "redcell phone hash", phone))
}

// NewBinding is the binding a request asks for: app account (app,
// appUserID), with phone (Phone.E164; "" for none), at nowMS, under the
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

// LegacyPhoneHashes are the PhoneHash of each of p's legacy forms: what a
// binding stored before numbers were parsed holds when it is p's.
func LegacyPhoneHashes(key []byte, p Phone) []string {
	out := make([]string, len(p.Legacy))
	for i, f := range p.Legacy {
		out[i] = PhoneHash(key, f)
	}
	return out
}

// Bind decides a binding request against the account's binding, if any
// (have nil: none); legacy are the hashes of want's phone in the forms a
// binding stored before numbers were parsed may hold (LegacyPhoneHashes). It
// answers the binding that holds and whether it was there before (repeat):
//   - none before: want, new;
//   - a request without a phone: the binding there, whatever it has (a
//     caller that knows no phone learns the account's actID);
//   - the same phone again: the binding there; when have holds a legacy
//     hash of it, the binding there with PhoneHash want's (re-keyed: the
//     caller stores that), its actID kept;
//   - another phone, or a phone for an account bound without one:
//     ErrIdentityConflict, nothing changes (money may already hang on the
//     actID it has).
func Bind(have *IdentityBinding, want IdentityBinding, legacy ...string) (IdentityBinding, bool, error) {
	switch {
	case have == nil:
		return want, false, nil
	case want.PhoneHash == "" || want.PhoneHash == have.PhoneHash:
		return *have, true, nil
	case have.PhoneHash != "" && slices.Contains(legacy, have.PhoneHash):
		b := *have
		b.PhoneHash = want.PhoneHash
		return b, true, nil
	case have.PhoneHash == "":
		return IdentityBinding{}, false, Errorf(ErrIdentityConflict,
			"%s user %s is bound without a phone, to act_id %s", have.App, have.AppUserID, have.ActID)
	}
	return IdentityBinding{}, false, Errorf(ErrIdentityConflict, "%s user %s is bound to another phone", have.App, have.AppUserID)
}
