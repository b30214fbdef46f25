// Package apikey authenticates the apps that call redcell's public API. Each
// calling app (an app backend) holds one or more API keys; each key has an ID,
// the app it belongs to and the scopes it grants. A key is a high-entropy
// random string shown once, when it is made; only its SHA-256 is kept, in the
// key file that every router reads (File). A router checks a key on each
// request with one SHA-256 and a constant-time comparison: no slow password
// hash is needed for a key with 256 random bits, and none sits on the hot path.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"redcell/model"
)

// Scope is what a key allows its app to do. A request needs the scope of its
// route (router.ScopeOf): a key without it is refused with 403 PERMISSION_DENIED.
type Scope string

// The scopes.
const (
	ScopeRead    Scope = "read"    // GET accounts and packets, and the no-op route
	ScopeDeposit Scope = "deposit" // POST /v1/accounts/{act_id}/deposit
	ScopeSend    Scope = "send"    // POST /v1/packets
	ScopeOpen    Scope = "open"    // grab and open a packet
	// ScopeIdentity binds app accounts to actIDs (PUT /v1/identities/...):
	// for a trusted caller such as the account center, it binds users of any
	// app, not only the key's own.
	ScopeIdentity Scope = "identity"
	ScopeReward   Scope = "reward"   // POST /v1/rewards and the client's token copies
	ScopeWithdraw Scope = "withdraw" // POST /v1/accounts/{act_id}/withdraw
	ScopeCoupon   Scope = "coupon"   // POST /v1/coupons/issue
)

// scopes lists every scope with its bit in a key's grant mask (new scopes go
// last: a mask keeps its meaning).
var scopes = []Scope{ScopeRead, ScopeDeposit, ScopeSend, ScopeOpen, ScopeIdentity, ScopeReward, ScopeWithdraw, ScopeCoupon}

// Scopes returns every scope, in a fixed order.
func Scopes() []Scope { return append([]Scope(nil), scopes...) }

func scopeBit(s Scope) (uint32, bool) {
	for i, k := range scopes {
		if k == s {
			return 1 << i, true
		}
	}
	return 0, false
}

// ParseScopes reads a comma-separated list of scopes ("read,deposit"); "all"
// stands for every scope. Errors: an unknown or repeated scope, an empty list.
func ParseScopes(list string) ([]Scope, error) {
	if strings.TrimSpace(list) == "all" {
		return Scopes(), nil
	}
	var out []Scope
	seen := map[Scope]bool{}
	for _, p := range strings.Split(list, ",") {
		s := Scope(strings.TrimSpace(p))
		if _, ok := scopeBit(s); !ok {
			return nil, fmt.Errorf("apikey: unknown scope %q (scopes: %s, or all)", s, joinScopes(scopes))
		}
		if seen[s] {
			return nil, fmt.Errorf("apikey: scope %q given twice", s)
		}
		seen[s] = true
		out = append(out, s)
	}
	return out, nil
}

func joinScopes(ss []Scope) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ",")
}

// Key is one entry of the key file: everything about a key but the key.
type Key struct {
	// ID names the key (12 lowercase hex digits); it is also the key's second
	// part, so a router finds the entry without searching.
	ID string `yaml:"id" json:"id"`
	// App is the calling app the key belongs to, 1..64 of [A-Za-z0-9_-].
	App string `yaml:"app" json:"app"`
	// SHA256 is the hex SHA-256 of the whole key string.
	SHA256 string `yaml:"sha256" json:"-"`
	// Scopes the key grants, at least one.
	Scopes    []Scope    `yaml:"scopes" json:"scopes"`
	CreatedAt time.Time  `yaml:"created_at" json:"created_at"`
	RevokedAt *time.Time `yaml:"revoked_at,omitempty" json:"revoked_at,omitempty"` // set: refused from then on
}

// Key strings look like "rck_" + ID + "_" + 43 base64url characters (32
// random bytes): the prefix makes a leaked key easy to recognise in a log or a
// repository, and the ID lets a router find its entry directly.
const (
	tokenPrefix  = "rck_"
	idLen        = 12
	secretBytes  = 32
	secretLen    = 43 // base64url of 32 bytes, unpadded
	tokenLen     = len(tokenPrefix) + idLen + 1 + secretLen
	appLenMax    = 64
	hexSHA256Len = 2 * sha256.Size
)

// Generate makes a new key for app with scopes at time now. It returns the key
// string, to hand to the app once, and the entry to store, which holds only the
// key's hash. Errors: an invalid app name or scope list.
func Generate(app string, scopes []Scope, now time.Time) (key string, k Key, err error) {
	if err := validateGrant("a new key", app, scopes); err != nil {
		return "", Key{}, err
	}
	var raw [idLen/2 + secretBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", Key{}, fmt.Errorf("apikey: random: %w", err)
	}
	k = Key{ID: hex.EncodeToString(raw[:idLen/2]), App: app, Scopes: scopes, CreatedAt: now.UTC().Truncate(time.Second)}
	key = tokenPrefix + k.ID + "_" + base64.RawURLEncoding.EncodeToString(raw[idLen/2:])
	sum := sha256.Sum256([]byte(key))
	k.SHA256 = hex.EncodeToString(sum[:])
	return key, k, k.validate()
}

// validate checks an entry as read from the key file.
func (k Key) validate() error {
	if len(k.ID) != idLen || !isLowerHex(k.ID) {
		return fmt.Errorf("apikey: key id %q must be %d lowercase hex digits", k.ID, idLen)
	}
	if len(k.SHA256) != hexSHA256Len || !isLowerHex(k.SHA256) {
		return fmt.Errorf("apikey: key %s: sha256 must be %d lowercase hex digits", k.ID, hexSHA256Len)
	}
	return validateGrant("key "+k.ID, k.App, k.Scopes)
}

// validateGrant checks the app name and scopes of a key (what names it).
// Errors are model.ErrInvalidArgument: an admin request asking for a bad key
// is answered 400 with the reason.
func validateGrant(what, app string, scopes []Scope) error {
	if model.ValidateActID(app) != nil {
		return model.Invalidf("%s: app %q must be 1..%d of [A-Za-z0-9_-]", what, app, appLenMax)
	}
	if len(scopes) == 0 {
		return model.Invalidf("%s grants no scope (scopes: %s)", what, joinScopes(Scopes()))
	}
	seen := map[Scope]bool{}
	for _, s := range scopes {
		if _, ok := scopeBit(s); !ok {
			return model.Invalidf("%s: unknown scope %q (scopes: %s)", what, s, joinScopes(Scopes()))
		}
		if seen[s] {
			return model.Invalidf("%s: scope %q given twice", what, s)
		}
		seen[s] = true
	}
	return nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Set is an immutable set of usable (not revoked) keys, by ID. Safe for
// concurrent use.
type Set struct {
	byID map[string]entry
}

type entry struct {
	sum    [sha256.Size]byte
	app    string
	grants uint32 // scope bits
}

// NewSet builds a set from key file entries; revoked ones are left out.
// Errors: an invalid entry, or two entries with one ID.
func NewSet(keys []Key) (*Set, error) {
	s := &Set{byID: make(map[string]entry, len(keys))}
	seen := map[string]bool{}
	for _, k := range keys {
		if err := k.validate(); err != nil {
			return nil, err
		}
		if seen[k.ID] {
			return nil, fmt.Errorf("apikey: key id %s appears twice", k.ID)
		}
		seen[k.ID] = true
		if k.RevokedAt != nil {
			continue
		}
		e := entry{app: k.App}
		if _, err := hex.Decode(e.sum[:], []byte(k.SHA256)); err != nil {
			return nil, fmt.Errorf("apikey: key %s: %w", k.ID, err)
		}
		for _, sc := range k.Scopes {
			bit, _ := scopeBit(sc)
			e.grants |= bit
		}
		s.byID[k.ID] = e
	}
	return s, nil
}

// Len returns how many usable keys the set holds.
func (s *Set) Len() int { return len(s.byID) }

// The refusals of Check; they render as 401 UNAUTHENTICATED and 403
// PERMISSION_DENIED with these messages.
var (
	ErrNoKey = model.Errorf(model.ErrUnauthenticated,
		"an API key is required: send it as Authorization: Bearer <key>")
	ErrUnknownKey = model.Errorf(model.ErrUnauthenticated, "unknown or revoked API key")
)

// Check authenticates key (the bearer token as sent) and checks it grants
// scope. It returns the key's app. Errors: ErrUnknownKey (malformed, unknown,
// revoked, or not matching its entry's hash: 401) and model.ErrPermissionDenied
// (the key does not grant scope: 403). The hash comparison takes constant
// time; Check does not allocate unless it refuses.
func (s *Set) Check(key []byte, scope Scope) (app string, err error) {
	if len(key) != tokenLen || string(key[:len(tokenPrefix)]) != tokenPrefix || key[len(tokenPrefix)+idLen] != '_' {
		return "", ErrUnknownKey
	}
	e, ok := s.byID[string(key[len(tokenPrefix):len(tokenPrefix)+idLen])]
	if !ok {
		return "", ErrUnknownKey
	}
	sum := sha256.Sum256(key)
	if subtle.ConstantTimeCompare(sum[:], e.sum[:]) != 1 {
		return "", ErrUnknownKey
	}
	bit, known := scopeBit(scope)
	if !known || e.grants&bit == 0 {
		return e.app, model.Errorf(model.ErrPermissionDenied, "the API key of app %s does not grant scope %q", e.app, scope)
	}
	return e.app, nil
}
