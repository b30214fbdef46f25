package rewardtoken

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/model"
)

var now = time.Date(2027, 1, 31, 20, 30, 0, 0, time.UTC)

// seed is a fixed 32-byte seed in hex: every byte b.
func seed(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 32) }

func keyLine(id string, state KeyState, seedHex string) string {
	return fmt.Sprintf("  - {id: %s, state: %s, seed: %q}\n", id, state, seedHex)
}

func mustRing(t testing.TB, lines ...string) *Ring {
	t.Helper()
	r, err := ParseRing([]byte("keys:\n" + strings.Join(lines, "")))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// twoKeys: k1 verifies (signed before a rotation), k2 signs.
func twoKeys(t testing.TB) *Ring {
	return mustRing(t, keyLine("k1", StateVerify, seed(1)), keyLine("k2", StateActive, seed(2)))
}

func cashClaims() Claims {
	return Claims{App: "douyin", ActID: "act-00042", Parent: "fest", Stage: "official", Scene: "rain", Rain: "r3",
		AwardType: model.AwardCash, Amount: 888, OrderNo: "act-00042_rain_r3_cash_official",
		IssuedMS: now.Add(-time.Minute).UnixMilli(), Status: StatusIssued}
}

func mustSign(t testing.TB, r *Ring, c Claims) string {
	t.Helper()
	tok, err := r.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if Reason(err) != reason {
		t.Errorf("%s: reason %q (%v), want %s", what, Reason(err), err, reason)
	}
}

// Every field comes back as signed, at the edges too.
func TestRoundTrip(t *testing.T) {
	r := twoKeys(t)
	coupon := cashClaims()
	coupon.AwardType, coupon.TemplateID, coupon.Amount = "coupon", "spring-10off", 3
	huge := cashClaims()
	huge.Amount, huge.IssuedMS = math.MaxInt64, math.MaxInt64
	low := cashClaims()
	low.Amount, low.IssuedMS = math.MinInt64, math.MinInt64
	long := cashClaims()
	long.ActID = strings.Repeat("a", model.MaxIDLen)
	long.Parent, long.Scene, long.Rain, long.TemplateID = strings.Repeat("p", 32), strings.Repeat("s", 32), strings.Repeat("r", 32), strings.Repeat("t", 32)
	long.OrderNo = model.RewardOrderNo(long.ActID, long.Scene, long.Rain, strings.Repeat("w", 32), strings.Repeat("g", 32))
	long.AwardType, long.Stage, long.App = strings.Repeat("w", 32), strings.Repeat("g", 32), strings.Repeat("x", 64)
	for name, c := range map[string]Claims{"cash": cashClaims(), "coupon": coupon, "huge": huge, "low": low,
		"longest": long, "empty": {}, "binary": {ActID: "a\x00b", Status: "\xff"}} {
		tok := mustSign(t, r, c)
		if !strings.HasPrefix(tok, "v1.k2.") || len(tok) > MaxTokenLen {
			t.Errorf("%s: token %q (%d bytes)", name, tok, len(tok))
		}
		got, err := r.Verify(tok, now, 0)
		if err != nil || got != c {
			t.Errorf("%s: got %+v, %v; want %+v", name, got, err, c)
		}
		if again := mustSign(t, r, c); again != tok {
			t.Errorf("%s: signing twice gave two tokens", name)
		}
	}
	if n := len(mustSign(t, r, long)); n > 900 {
		t.Errorf("the longest claims the reward path makes take %d bytes, close to MaxTokenLen", n)
	}
}

// The format is pinned: a client may hand back a token signed long ago, so a
// change of field order or encoding must fail here, not in the field. The
// golden token was made apart from this package: the payload encoded by hand
// in Python, signed with Python's cryptography Ed25519.
func TestGoldenToken(t *testing.T) {
	r := mustRing(t, keyLine("k1", StateActive, seed(1)))
	c := Claims{App: "douyin", ActID: "act-1", Parent: "fest", Stage: "official", Scene: "rain", Rain: "r1",
		AwardType: "coupon", TemplateID: "t-9", Amount: 300, OrderNo: "act-1_rain_r1_coupon_official",
		IssuedMS: 1801483200000, Status: StatusIssued}
	const golden = "v1.k1.BmRvdXlpbgVhY3QtMQRmZXN0CG9mZmljaWFsBHJhaW4CcjEGY291cG9uA3QtOdgEHWFjdC0xX3JhaW5fcjFfY291cG9uX29mZmljaWFsgJihjO5oBmlzc3VlZA." +
		"ihy7IuwCgUZvcvHEKn_NEPeBwqoWzC7NN9mAasePFapPhINtp9Z18-98JNBTA9D7Jje4N0PsBrrIqYCxJLDmCA"
	tok := mustSign(t, r, c)
	payload, _, _ := strings.Cut(strings.TrimPrefix(golden, "v1.k1."), ".")
	if got, _, _ := strings.Cut(strings.TrimPrefix(tok, "v1.k1."), "."); got != payload {
		t.Errorf("payload changed:\n got %s\nwant %s", got, payload)
	}
	if tok != golden {
		t.Errorf("token changed:\n got %s\nwant %s", tok, golden)
	}
}

func TestFromRewardMatches(t *testing.T) {
	rw := model.Reward{OrderNo: "a_rain_r1_cash_official", ActID: "a", Shard: 7, App: "douyin", Parent: "fest",
		Child: "fest-official", Stage: "official", Scene: "rain", Rain: "r1", AwardType: "cash", Amount: 520,
		LeaseID: "l1", Status: model.RewardPending, CreatedMS: 1801483200123}
	c := FromReward(rw)
	want := Claims{App: "douyin", ActID: "a", Parent: "fest", Stage: "official", Scene: "rain", Rain: "r1",
		AwardType: "cash", Amount: 520, OrderNo: "a_rain_r1_cash_official", IssuedMS: 1801483200123, Status: "issued"}
	if c != want {
		t.Fatalf("FromReward: %+v, want %+v", c, want)
	}
	booked := rw
	booked.Status, booked.BookedMS, booked.Token = model.RewardBooked, 1801483209999, "v1.x"
	if !c.Matches(rw) || !c.Matches(booked) {
		t.Error("claims do not match their reward (booked or not)")
	}
	for name, change := range map[string]func(*model.Reward){
		"app": func(r *model.Reward) { r.App = "other" }, "act": func(r *model.Reward) { r.ActID = "b" },
		"parent": func(r *model.Reward) { r.Parent = "p" }, "stage": func(r *model.Reward) { r.Stage = "gray" },
		"scene": func(r *model.Reward) { r.Scene = "card" }, "rain": func(r *model.Reward) { r.Rain = "r2" },
		"award": func(r *model.Reward) { r.AwardType = "coupon" }, "template": func(r *model.Reward) { r.TemplateID = "t" },
		"amount": func(r *model.Reward) { r.Amount = 521 }, "order": func(r *model.Reward) { r.OrderNo += "x" },
		"created": func(r *model.Reward) { r.CreatedMS++ },
	} {
		other := rw
		change(&other)
		if c.Matches(other) {
			t.Errorf("%s changed: still matches", name)
		}
	}
}

// replacePart returns tok with part i (0 version, 1 key ID, 2 payload, 3
// signature) replaced.
func replacePart(tok string, i int, s string) string {
	parts := strings.Split(tok, ".")
	parts[i] = s
	return strings.Join(parts, ".")
}

func flipByte(t *testing.T, part string, at int) string {
	b, err := b64.DecodeString(part)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x01
	return b64.EncodeToString(b)
}

func TestAltered(t *testing.T) {
	r := twoKeys(t)
	tok := mustSign(t, r, cashClaims())
	parts := strings.Split(tok, ".")
	for _, tc := range []struct {
		name, tok, reason string
	}{
		{"payload byte flipped", replacePart(tok, 2, flipByte(t, parts[2], 12)), "TOKEN_BAD_SIGNATURE"},
		{"last payload byte flipped", replacePart(tok, 2, flipByte(t, parts[2], len(parts[2])*3/4-1)), "TOKEN_BAD_SIGNATURE"},
		{"signature byte flipped", replacePart(tok, 3, flipByte(t, parts[3], 0)), "TOKEN_BAD_SIGNATURE"},
		{"signature's last byte flipped", replacePart(tok, 3, flipByte(t, parts[3], 63)), "TOKEN_BAD_SIGNATURE"},
		{"key ID swapped to another key", replacePart(tok, 1, "k1"), "TOKEN_BAD_SIGNATURE"},
		{"key ID swapped to no key", replacePart(tok, 1, "k3"), "TOKEN_UNKNOWN_KEY"},
		{"another token's signature", replacePart(tok, 3, strings.Split(mustSign(t, r, Claims{}), ".")[3]), "TOKEN_BAD_SIGNATURE"},
	} {
		c, err := r.Verify(tc.tok, now, 0)
		wantReason(t, tc.name, err, tc.reason)
		if c != (Claims{}) {
			t.Errorf("%s: claims %+v returned with an error", tc.name, c)
		}
	}
	// Any one character changed, anywhere, is refused.
	const alphabet = "ABCabc019-_.="
	for i := range len(tok) {
		for _, ch := range alphabet {
			if byte(ch) == tok[i] {
				continue
			}
			bad := tok[:i] + string(ch) + tok[i+1:]
			if _, err := r.Verify(bad, now, 0); err == nil {
				t.Fatalf("accepted %q (char %d changed to %c)", bad, i, ch)
			}
		}
	}
}

func TestForged(t *testing.T) {
	r := twoKeys(t)
	outsider := mustRing(t, keyLine("k9", StateActive, seed(9)))
	_, err := r.Verify(mustSign(t, outsider, cashClaims()), now, 0)
	wantReason(t, "forged with an unknown key", err, "TOKEN_UNKNOWN_KEY")
	impostor := mustRing(t, keyLine("k2", StateActive, seed(9)))
	_, err = r.Verify(mustSign(t, impostor, cashClaims()), now, 0)
	wantReason(t, "forged under the active key's ID", err, "TOKEN_BAD_SIGNATURE")
	if !errors.Is(err, ErrBadSignature) || errors.Is(err, ErrUnknownKey) {
		t.Errorf("errors.Is: %v", err)
	}
}

func TestExpired(t *testing.T) {
	r := twoKeys(t)
	c := cashClaims()
	c.IssuedMS = now.Add(-10 * time.Minute).UnixMilli()
	tok := mustSign(t, r, c)
	for _, tc := range []struct {
		ttl    time.Duration
		reason string
	}{
		{0, ""},
		{10 * time.Minute, ""}, // exactly the TTL old: still valid
		{10*time.Minute - time.Millisecond, "TOKEN_EXPIRED"},
		{time.Minute, "TOKEN_EXPIRED"},
		{time.Duration(math.MaxInt64), ""},
	} {
		_, err := r.Verify(tok, now, tc.ttl)
		wantReason(t, fmt.Sprintf("ttl %v", tc.ttl), err, tc.reason)
	}
	c.IssuedMS = now.Add(time.Hour).UnixMilli() // a cell's clock ahead of this one
	if _, err := r.Verify(mustSign(t, r, c), now, time.Minute); err != nil {
		t.Errorf("a token from the future: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a negative ttl did not panic")
		}
	}()
	r.Verify(tok, now, -time.Second)
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reward-keys.yaml")
	if err := NewKeyFile(path, "k1"); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, path); m != 0o600 {
		t.Errorf("new key file mode %v", m)
	}
	before, _ := os.ReadFile(path)
	if err := NewKeyFile(path, "k9"); err == nil {
		t.Error("NewKeyFile overwrote a key file")
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a refused NewKeyFile changed the file")
	}
	r1, err := LoadRing(path)
	if err != nil || r1.ActiveID() != "k1" {
		t.Fatalf("load: %v", err)
	}
	old := mustSign(t, r1, cashClaims())

	if err := Rotate(path, "k2"); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, path); m != 0o600 {
		t.Errorf("rotated key file mode %v", m)
	}
	r2, err := LoadRing(path)
	if err != nil || r2.ActiveID() != "k2" || r2.keys["k1"].state != StateVerify {
		t.Fatalf("after rotate: %v", err)
	}
	if !r2.keys["k1"].pub.Equal(r1.keys["k1"].pub) {
		t.Error("rotate changed the old key's seed")
	}
	fresh := mustSign(t, r2, cashClaims())
	if !strings.HasPrefix(fresh, "v1.k2.") {
		t.Errorf("new token %q not signed by k2", fresh)
	}
	for _, tok := range []string{old, fresh} {
		if c, err := r2.Verify(tok, now, 0); err != nil || c != cashClaims() {
			t.Errorf("after rotate %q: %v", tok[:6], err)
		}
	}
	_, err = r1.Verify(fresh, now, 0)
	wantReason(t, "a ring not yet reloaded, new key", err, "TOKEN_UNKNOWN_KEY")

	// The operator retires k1 by hand; the reload refuses its tokens.
	b, _ := os.ReadFile(path)
	if n := strings.Count(string(b), "state: verify"); n != 1 {
		t.Fatalf("want one verify key in\n%s", b)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), "state: verify", "state: retired", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	r3, err := LoadRing(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r3.Verify(old, now, 0)
	wantReason(t, "retired key", err, "TOKEN_RETIRED_KEY")
	if _, err := r3.Verify(fresh, now, 0); err != nil {
		t.Errorf("active key after retiring k1: %v", err)
	}

	for _, id := range []string{"k1", "k2", "bad.id", ""} {
		if err := Rotate(path, id); err == nil {
			t.Errorf("rotate to %q accepted", id)
		}
	}
	if err := Rotate(path, "k3"); err != nil {
		t.Fatal(err)
	}
	r4, err := LoadRing(path)
	if err != nil || r4.ActiveID() != "k3" || r4.keys["k2"].state != StateVerify || r4.keys["k1"].state != StateRetired {
		t.Errorf("second rotate: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	if err := Rotate(filepath.Join(t.TempDir(), "none.yaml"), "k2"); err == nil {
		t.Error("rotated a missing file")
	}
}

func TestMalformed(t *testing.T) {
	r := twoKeys(t)
	tok := mustSign(t, r, cashClaims())
	parts := strings.Split(tok, ".")
	for name, bad := range map[string]string{
		"empty":              "",
		"one part":           "v1",
		"three parts":        strings.Join(parts[:3], "."),
		"five parts":         tok + ".AA",
		"empty payload":      replacePart(tok, 2, ""),
		"empty signature":    replacePart(tok, 3, ""),
		"version 2":          replacePart(tok, 0, "v2"),
		"key ID with '_'":    replacePart(tok, 1, "k_2"),
		"key ID too long":    replacePart(tok, 1, strings.Repeat("k", KeyIDMax+1)),
		"empty key ID":       replacePart(tok, 1, ""),
		"huge":               tok + strings.Repeat("A", MaxTokenLen),
		"one byte too long":  replacePart(tok, 2, parts[2]+strings.Repeat("A", MaxTokenLen+1-len(tok))),
		"padded signature":   tok + "==",
		"std base64":         replacePart(tok, 3, strings.NewReplacer("-", "+", "_", "/").Replace(parts[3])+"+/"),
		"newline in sig":     replacePart(tok, 3, parts[3][:10]+"\n"+parts[3][10:]),
		"short signature":    replacePart(tok, 3, parts[3][:84]),
		"sig trailing bits":  replacePart(tok, 3, parts[3][:85]+string(b64Next(parts[3][85]))),
		"not base64 payload": replacePart(tok, 2, "!!!!"),
	} {
		_, err := r.Verify(bad, now, 0)
		wantReason(t, name, err, "TOKEN_MALFORMED")
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: not ErrMalformed: %v", name, err)
		}
	}
	// Signed payloads that do not decode (only a signer's bug makes them).
	good := cashClaims().appendPayload(nil)
	for name, payload := range map[string][]byte{
		"empty":          {},
		"truncated":      good[:len(good)-1],
		"trailing byte":  append(append([]byte{}, good...), 0),
		"length too big": {0x7f, 'a'},
		"overlong varint": func() []byte {
			b := []byte{0x80, 0x00} // 0 in two bytes
			return append(b, good[1:]...)
		}(),
	} {
		_, err := r.Verify(signRaw(r.active, payload), now, 0)
		wantReason(t, "signed payload "+name, err, "TOKEN_MALFORMED")
	}
}

// b64Next is another base64url character whose top 2 bits (of its 6) are
// those of c: a last character of a 64-byte signature carries 2 bits.
func b64Next(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return alphabet[i&^0xf|(i+1)&0xf]
}

// signRaw signs any payload bytes as a v1 token of k.
func signRaw(k *key, payload []byte) string {
	signed := Version + "." + k.id + "." + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(ed25519.Sign(k.priv, []byte(signed)))
}

func TestSignTooLong(t *testing.T) {
	r := twoKeys(t)
	c := cashClaims()
	c.OrderNo = strings.Repeat("o", MaxTokenLen)
	if tok, err := r.Sign(c); !errors.Is(err, ErrClaimsTooLong) || tok != "" {
		t.Errorf("Sign of %d-byte claims: %q, %v", MaxTokenLen, tok, err)
	}
	// The largest claims that fit give a token of exactly MaxTokenLen.
	c.OrderNo = ""
	for {
		c.OrderNo += "o"
		tok, err := r.Sign(c)
		if err != nil {
			break
		}
		if _, err := r.Verify(tok, now, 0); err != nil {
			t.Fatalf("a %d-byte token Sign made: %v", len(tok), err)
		}
		if len(tok) > MaxTokenLen {
			t.Fatalf("Sign made a %d-byte token", len(tok))
		}
	}
}

func TestKeyFileErrors(t *testing.T) {
	secret := seed(7)
	for _, tc := range []struct{ name, file, want string }{
		{"empty", "", "empty"},
		{"no keys", "keys: []\n", "no key"},
		{"no active", "keys:\n" + keyLine("k1", StateVerify, seed(1)), "no active key"},
		{"two active", "keys:\n" + keyLine("k1", StateActive, seed(1)) + keyLine("k2", StateActive, seed(2)), "2 active keys (k1, k2)"},
		{"short seed", "keys:\n" + keyLine("k1", StateActive, secret[:62]), "keys[0].seed: not 64 hex digits"},
		{"non-hex seed", "keys:\n" + keyLine("k1", StateActive, "zz"+secret[2:]), "keys[0].seed"},
		{"no seed", "keys:\n  - {id: k1, state: active}\n", "keys[0].seed"},
		{"duplicate ID", "keys:\n" + keyLine("k1", StateActive, seed(1)) + keyLine("k1", StateVerify, seed(2)), `keys[1].id: "k1" twice`},
		{"unknown state", "keys:\n" + keyLine("k1", StateActive, seed(1)) + keyLine("k2", "old", seed(2)), `unknown state "old"`},
		{"bad ID", "keys:\n" + keyLine("k.1", StateActive, seed(1)), "keys[0].id"},
		{"long ID", "keys:\n" + keyLine("k12345678901234567", StateActive, seed(1)), "1..16 characters"},
		{"unknown field", "keys:\n  - {id: k1, state: active, seed: \"" + seed(1) + "\", note: x}\n", "field note not found"},
		{"unknown top key", "keys:\n" + keyLine("k1", StateActive, seed(1)) + "extra: 1\n", "field extra not found"},
		{"two documents", "keys:\n" + keyLine("k1", StateActive, seed(1)) + "---\nkeys: []\n", "more than one YAML document"},
		{"too many keys", "keys:\n" + strings.Repeat(keyLine("k", StateRetired, seed(1)), KeysMax) + keyLine("a", StateActive, seed(1)), "above 64"},
	} {
		r, err := ParseRing([]byte(tc.file))
		if err == nil || r != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		} else if strings.Contains(err.Error(), secret[2:40]) {
			t.Errorf("%s: the error quotes the seed: %v", tc.name, err)
		}
	}
	path := filepath.Join(t.TempDir(), "k.yaml")
	if _, err := LoadRing(path); err == nil {
		t.Error("loaded a missing file")
	}
	os.WriteFile(path, []byte("keys:\n"+keyLine("k1", StateVerify, seed(1))), 0o600)
	if _, err := LoadRing(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a load error does not name the file: %v", err)
	}
	if err := NewKeyFile(filepath.Join(t.TempDir(), "k.yaml"), "k_1"); err == nil {
		t.Error("NewKeyFile took a bad ID")
	}
	upper := "keys:\n" + keyLine("K-1", StateActive, strings.ToUpper(seed(0xab)))
	if r, err := ParseRing([]byte(upper)); err != nil || r.ActiveID() != "K-1" {
		t.Errorf("upper-case hex seed: %v", err)
	}
}

func TestReason(t *testing.T) {
	wrapped := fmt.Errorf("cell: token 3: %w", refuse(ErrExpired, "x"))
	for err, want := range map[error]string{nil: "", errors.New("x"): "", ErrRetiredKey: "TOKEN_RETIRED_KEY", wrapped: "TOKEN_EXPIRED"} {
		if got := Reason(err); got != want {
			t.Errorf("Reason(%v) = %q, want %q", err, got, want)
		}
	}
	if !errors.Is(wrapped, ErrExpired) || !strings.HasPrefix(wrapped.Error(), "cell: token 3: rewardtoken: token expired: x") {
		t.Errorf("wrapped: %v", wrapped)
	}
}

// Verify and Sign from many goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	r := twoKeys(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			c := cashClaims()
			c.Rain = fmt.Sprint("r", g)
			for range 50 {
				tok, err := r.Sign(c)
				if err == nil {
					var got Claims
					got, err = r.Verify(tok, now, time.Hour)
					if err == nil && got != c {
						err = fmt.Errorf("got %+v", got)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// FuzzVerify: Verify never panics, every refusal has a reason, and a token
// it accepts is exactly what Sign made from the claims it returns with the
// key the token names (Ed25519 signs deterministically).
func FuzzVerify(f *testing.F) {
	r := mustRing(f, keyLine("k1", StateVerify, seed(1)), keyLine("k2", StateActive, seed(2)), keyLine("k3", StateRetired, seed(3)))
	tok := mustSign(f, r, cashClaims())
	f.Add(tok)
	f.Add(mustSign(f, r, Claims{}))
	f.Add(signRaw(r.keys["k1"], cashClaims().appendPayload(nil)))
	f.Add(signRaw(r.keys["k3"], cashClaims().appendPayload(nil)))
	f.Add(signRaw(r.keys["k2"], []byte{0x80, 0x00}))
	f.Add(replacePart(tok, 1, "k1"))
	f.Add("v1.k2..")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := r.Verify(token, now, time.Hour)
		if err != nil {
			if Reason(err) == "" || c != (Claims{}) {
				t.Fatalf("refusal %v: reason %q, claims %+v", err, Reason(err), c)
			}
			return
		}
		keyID := strings.Split(token, ".")[1]
		k := r.keys[keyID]
		if k.state == StateRetired {
			t.Fatalf("accepted a retired key's token %q", token)
		}
		if again, err := signWith(k, c); err != nil || again != token {
			t.Fatalf("accepted %q, which Sign did not make (it makes %q, %v)", token, again, err)
		}
	})
}

func BenchmarkSign(b *testing.B) {
	r := twoKeys(b)
	c := cashClaims()
	for b.Loop() {
		if _, err := r.Sign(c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	r := twoKeys(b)
	tok := mustSign(b, r, cashClaims())
	for b.Loop() {
		if _, err := r.Verify(tok, now, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
