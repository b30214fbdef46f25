// Package rewardtoken signs and verifies reward tokens: the signed copy of a
// reward that the issuing service answers at once, before the money behind
// it is booked, and that the client keeps and can hand back later, as
// Douyin's Spring Festival reward wallet kept a signed copy on each side.
//
// A token is
//
//	v1.<keyID>.<base64url-nopad(payload)>.<base64url-nopad(signature)>
//
// where the payload is the Claims in a fixed order (strings as a uvarint
// length and the bytes, integers as zigzag varints; no JSON) and the
// signature is Ed25519 over the bytes "v1.<keyID>.<payload-b64>", so the key
// ID cannot be swapped. A token is at most MaxTokenLen bytes.
//
// Keys live in a Ring loaded from a YAML key file (LoadRing); rotation
// (Rotate) turns the active key into a verify-only key and adds a new active
// one, so tokens the clients already hold keep verifying until the operator
// retires the old key. A Ring is immutable once loaded: a reload builds a
// new Ring and the caller swaps the pointer whole.
package rewardtoken

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"redcell/model"
)

// Version is the first part of every token; a new payload layout gets a new
// version, and this one stays readable.
const Version = "v1"

// MaxTokenLen bounds a token, bytes. The largest claims the reward path
// makes (a 196-byte order number, a 64-byte actID, IDs of at most 32) come to
// about 800; Verify refuses a longer input before decoding anything.
const MaxTokenLen = 1024

// StatusIssued is the Status of a token the issuing service answers: the
// reward is issued and will be booked behind it.
const StatusIssued = "issued"

// StatusIssuedStress is the Status of a token issued to stress traffic
// (the shadow tables): a cell takes it back only from stress traffic, so a
// stress token never restores a reward into real money.
const StatusIssuedStress = "issued-stress"

// Claims are the reward's fields a token carries. Every string is carried as
// is (any bytes); only the token's total length is bounded.
type Claims struct {
	App        string // the calling app that issued the reward, "" when not known
	ActID      string // the person
	Parent     string // the parent activity
	Stage      string // test, gray or official
	Scene      string
	Rain       string
	AwardType  string // model.AwardCash or a coupon kind
	TemplateID string // coupon kinds: the coupon template; "" for cash
	Amount     int64  // cents for cash, pieces for coupon kinds
	OrderNo    string // model.RewardOrderNo
	IssuedMS   int64  // Unix ms of the issue (model.Reward.CreatedMS); TTLs count from it
	Status     string // StatusIssued
}

// FromReward is the claims of an issued reward: its fields, Status
// StatusIssued and IssuedMS r.CreatedMS.
func FromReward(r model.Reward) Claims {
	return Claims{App: r.App, ActID: r.ActID, Parent: r.Parent, Stage: r.Stage, Scene: r.Scene, Rain: r.Rain,
		AwardType: r.AwardType, TemplateID: r.TemplateID, Amount: int64(r.Amount), OrderNo: r.OrderNo,
		IssuedMS: r.CreatedMS, Status: StatusIssued}
}

// Matches reports whether c describes r: every field equal (IssuedMS to
// r.CreatedMS) except Status, which a token fixes at issue while the row's
// booking state moves on.
func (c Claims) Matches(r model.Reward) bool {
	return c.App == r.App && c.ActID == r.ActID && c.Parent == r.Parent && c.Stage == r.Stage &&
		c.Scene == r.Scene && c.Rain == r.Rain && c.AwardType == r.AwardType && c.TemplateID == r.TemplateID &&
		c.Amount == int64(r.Amount) && c.OrderNo == r.OrderNo && c.IssuedMS == r.CreatedMS
}

// Error is a refusal of Verify with a stable reason code (Reason). The codes
// are part of the API (each refused token's reason) and never change meaning.
type Error struct {
	Reason  string
	Message string
}

func (e *Error) Error() string { return "rewardtoken: " + e.Message }

// Errors of Verify. Check them with errors.Is; Reason gives the code.
var (
	// ErrMalformed: not a token: empty, longer than MaxTokenLen, not four
	// parts, another version, a bad key ID, bad base64, or a payload that
	// does not decode.
	ErrMalformed = &Error{"TOKEN_MALFORMED", "malformed token"}
	// ErrUnknownKey: the key ID names no key of the ring.
	ErrUnknownKey = &Error{"TOKEN_UNKNOWN_KEY", "token signed by an unknown key"}
	// ErrBadSignature: the signature does not match: the token was altered,
	// its key ID swapped, or it was forged.
	ErrBadSignature = &Error{"TOKEN_BAD_SIGNATURE", "token signature does not match"}
	// ErrRetiredKey: the token is genuine but its key is retired.
	ErrRetiredKey = &Error{"TOKEN_RETIRED_KEY", "token signed by a retired key"}
	// ErrExpired: now − IssuedMS is above the TTL given to Verify.
	ErrExpired = &Error{"TOKEN_EXPIRED", "token expired"}
)

// ErrClaimsTooLong is returned by Sign when the claims would make a token
// longer than MaxTokenLen.
var ErrClaimsTooLong = errors.New("rewardtoken: claims too long for a token")

// Reason is the stable code of a Verify error ("TOKEN_MALFORMED", ...), ""
// for nil or an error that is none of them.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// refuse wraps a sentinel with the token-specific detail.
func refuse(base *Error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", base, fmt.Sprintf(format, args...))
}

var b64 = base64.RawURLEncoding

// Sign returns the token of c, signed by the ring's active key. Ed25519 is
// deterministic: the same claims and key give the same token. Errors:
// ErrClaimsTooLong. Safe for concurrent use.
func (r *Ring) Sign(c Claims) (string, error) {
	return signWith(r.active, c)
}

func signWith(k *key, c Claims) (string, error) {
	payload := c.appendPayload(nil)
	signedLen := len(Version) + 1 + len(k.id) + 1 + b64.EncodedLen(len(payload))
	if signedLen+1+b64.EncodedLen(ed25519.SignatureSize) > MaxTokenLen {
		return "", fmt.Errorf("%w: %d bytes of payload", ErrClaimsTooLong, len(payload))
	}
	buf := make([]byte, 0, MaxTokenLen)
	buf = append(buf, Version...)
	buf = append(buf, '.')
	buf = append(buf, k.id...)
	buf = append(buf, '.')
	buf = b64.AppendEncode(buf, payload)
	sig := ed25519.Sign(k.priv, buf)
	buf = append(buf, '.')
	buf = b64.AppendEncode(buf, sig)
	return string(buf), nil
}

// Verify checks token and returns its claims. now is the time to judge the
// TTL by; ttl 0 means the token never expires (ttl < 0 panics: a misuse).
// A token issued after now (clock skew) is not expired. Errors, checked in
// this order: ErrMalformed (shape, base64), ErrUnknownKey, ErrBadSignature,
// ErrRetiredKey (a retired key's token is refused only once its signature
// holds), ErrMalformed (a signed payload that does not decode), ErrExpired.
// The claims are returned only with a nil error. Safe for concurrent use.
func (r *Ring) Verify(token string, now time.Time, ttl time.Duration) (Claims, error) {
	if ttl < 0 {
		panic("rewardtoken: Verify with a negative ttl")
	}
	if len(token) > MaxTokenLen {
		return Claims{}, refuse(ErrMalformed, "%d bytes, above %d", len(token), MaxTokenLen)
	}
	keyID, payloadB64, sigB64, ok := split(token)
	if !ok {
		return Claims{}, refuse(ErrMalformed, "not v1.<key>.<payload>.<signature>")
	}
	payload, err := decodeB64(payloadB64)
	if err != nil {
		return Claims{}, refuse(ErrMalformed, "payload: %v", err)
	}
	sig, err := decodeB64(sigB64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return Claims{}, refuse(ErrMalformed, "signature is not %d bytes of base64url", ed25519.SignatureSize)
	}
	k := r.keys[keyID]
	if k == nil {
		return Claims{}, refuse(ErrUnknownKey, "key %q", keyID)
	}
	signed := token[:len(Version)+1+len(keyID)+1+len(payloadB64)]
	if !ed25519.Verify(k.pub, []byte(signed), sig) {
		return Claims{}, refuse(ErrBadSignature, "key %q", keyID)
	}
	if k.state == StateRetired {
		return Claims{}, refuse(ErrRetiredKey, "key %q", keyID)
	}
	c, err := decodePayload(payload)
	if err != nil {
		// Only a signer's bug gets here: the payload is parsed once signed.
		return Claims{}, refuse(ErrMalformed, "signed payload: %v", err)
	}
	if ttl > 0 && c.IssuedMS < now.UnixMilli()-ttl.Milliseconds() {
		return Claims{}, refuse(ErrExpired, "issued at %d ms, %v ago, ttl %v", c.IssuedMS,
			time.Duration(now.UnixMilli()-c.IssuedMS)*time.Millisecond, ttl)
	}
	return c, nil
}

// split cuts token into its four parts; ok is false for any other shape,
// another version or a key ID that ValidateKeyID refuses.
func split(token string) (keyID, payloadB64, sigB64 string, ok bool) {
	version, rest, ok1 := strings.Cut(token, ".")
	keyID, rest, ok2 := strings.Cut(rest, ".")
	payloadB64, sigB64, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || version != Version || ValidateKeyID(keyID) != nil ||
		strings.Contains(sigB64, ".") || payloadB64 == "" || sigB64 == "" {
		return "", "", "", false
	}
	return keyID, payloadB64, sigB64, true
}

// decodeB64 decodes unpadded base64url and accepts only the one canonical
// spelling of the bytes: the decoder would skip '\r' and '\n' and ignore
// nonzero trailing bits, which would let one signature be written many ways.
func decodeB64(s string) ([]byte, error) {
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, err
	}
	if b64.EncodeToString(b) != s {
		return nil, errors.New("not canonical base64url")
	}
	return b, nil
}

// appendPayload appends c's payload: App, ActID, Parent, Stage, Scene, Rain,
// AwardType, TemplateID, Amount, OrderNo, IssuedMS, Status. The order is the
// format: changing it breaks every token a client holds (TestGoldenToken).
func (c Claims) appendPayload(b []byte) []byte {
	for _, s := range []string{c.App, c.ActID, c.Parent, c.Stage, c.Scene, c.Rain, c.AwardType, c.TemplateID} {
		b = appendString(b, s)
	}
	b = binary.AppendVarint(b, c.Amount)
	b = appendString(b, c.OrderNo)
	b = binary.AppendVarint(b, c.IssuedMS)
	return appendString(b, c.Status)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodePayload reads what appendPayload wrote, and only that: no trailing
// bytes, no overlong varint.
func decodePayload(b []byte) (Claims, error) {
	d := decoder{b: b}
	var c Claims
	for _, s := range []*string{&c.App, &c.ActID, &c.Parent, &c.Stage, &c.Scene, &c.Rain, &c.AwardType, &c.TemplateID} {
		*s = d.string()
	}
	c.Amount = d.varint()
	c.OrderNo = d.string()
	c.IssuedMS = d.varint()
	c.Status = d.string()
	if d.bad {
		return Claims{}, errors.New("truncated or bad varint")
	}
	if len(d.b) != 0 {
		return Claims{}, fmt.Errorf("%d bytes after the last field", len(d.b))
	}
	if !bytes.Equal(c.appendPayload(nil), b) {
		return Claims{}, errors.New("not the canonical encoding")
	}
	return c, nil
}

// decoder reads fields off b; after the first error bad is set and every read
// returns the zero value.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) string() string {
	n, w := binary.Uvarint(d.b)
	if d.bad || w <= 0 || n > uint64(len(d.b)-w) {
		d.bad = true
		return ""
	}
	s := string(d.b[w : w+int(n)])
	d.b = d.b[w+int(n):]
	return s
}

func (d *decoder) varint() int64 {
	v, w := binary.Varint(d.b)
	if d.bad || w <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[w:]
	return v
}
