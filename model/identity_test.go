package model

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestParsePhone: every spelling of a number is one E.164 number (the
// spellings of issue 27 among them: E.164, spaced, national, after the
// international prefix "00"), read in the default region unless it starts
// with '+'; the legacy forms are those bindings stored before numbers were
// parsed hold for it; what is no valid number is INVALID_ARGUMENT, and the
// error never repeats it.
func TestParsePhone(t *testing.T) {
	for _, c := range []struct {
		in, region, e164 string
		legacy           []string // some of the forms Legacy must hold
	}{
		{"+8613800138111", "CN", "+8613800138111", []string{"13800138111", "008613800138111", "8613800138111"}},
		{"+86 138 0013 8111", "CN", "+8613800138111", []string{"13800138111"}},
		{"13800138111", "CN", "+8613800138111", []string{"13800138111", "008613800138111"}},
		{"008613800138111", "CN", "+8613800138111", []string{"13800138111", "008613800138111"}},
		{"8613800138111", "CN", "+8613800138111", []string{"8613800138111"}},
		{"(010) 6552-9988", "CN", "+861065529988", []string{"01065529988", "1065529988"}},
		{"+86 138-0013-8111", "DE", "+8613800138111", []string{"13800138111"}},
		{"030 12345678", "DE", "+493012345678", []string{"03012345678"}},
		{"+1 650-253-0000", "CN", "+16502530000", []string{"16502530000", "6502530000"}},
		{"(650) 253-0000", "US", "+16502530000", []string{"6502530000"}},
	} {
		p, err := ParsePhone(c.in, c.region)
		if err != nil || p.E164 != c.e164 {
			t.Errorf("ParsePhone(%q, %s) = %+v, %v; want %s", c.in, c.region, p, err, c.e164)
			continue
		}
		for _, f := range c.legacy {
			if !slices.Contains(p.Legacy, f) {
				t.Errorf("ParsePhone(%q, %s): legacy forms %q lack %q", c.in, c.region, p.Legacy, f)
			}
		}
		if slices.Contains(p.Legacy, p.E164) {
			t.Errorf("ParsePhone(%q, %s): legacy forms %q hold the E.164 one", c.in, c.region, p.Legacy)
		}
	}
	for _, bad := range []string{"", "+", "12345", "call me", "+86 138", "138001381112", "+86 138 0013 800a",
		"+0 138 0013 8111", "1234567890123456", "138 0013 8111 x", "138 0013 8111 ext. 5", "1-800-FLOWERS", "86+13800138111", "+8613800138111" + strings.Repeat(" ", 60), "00 1 000 000 0000"} {
		_, err := ParsePhone(bad, "CN")
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParsePhone(%q): %v, want INVALID_ARGUMENT", bad, err)
			continue
		}
		if digits := strings.Trim(bad, "+ "); len(digits) >= 6 && strings.Contains(err.Error(), digits) {
			t.Errorf("ParsePhone(%q): the error repeats the number: %v", bad, err)
		}
	}
	for region, ok := range map[string]bool{"CN": true, "DE": true, "US": true, "": false, "cn": false, "XX": false, "CHN": false} {
		if err := ValidPhoneRegion(region); (err == nil) != ok {
			t.Errorf("ValidPhoneRegion(%q): %v", region, err)
		}
	}
}

// TestLegacyPhoneForm: the form bindings were keyed on before numbers were
// parsed, kept as it was so that those bindings are found.
func TestLegacyPhoneForm(t *testing.T) {
	for in, want := range map[string]string{
		"+86 138-0013-8000": "+8613800138000",
		"(030) 1234.5678":   "03012345678",
		"+1 (415) 555-0100": "+14155550100",
		"123456":            "123456",
	} {
		if got, err := legacyPhoneForm(in); err != nil || got != want {
			t.Errorf("legacyPhoneForm(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "+", "12345", "1234567890123456", "+86 138 0013 800a", "86+13800138000", "+86\t13800138000", "++8613800138000"} {
		if _, err := legacyPhoneForm(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("legacyPhoneForm(%q): %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}

// TestBindLegacy: a binding stored under a legacy form of the phone asked
// for is a repeat that keeps its actID and is re-keyed to the E.164 hash;
// one of another phone is still a conflict.
func TestBindLegacy(t *testing.T) {
	key := []byte("key-one-0123456789abcdef")
	old := IdentityBinding{App: "chat", AppUserID: "u1", ActID: PhoneActID(key, "13800138111"), PhoneHash: PhoneHash(key, "13800138111"), CreatedMS: 5}
	p, err := ParsePhone("+86 138 0013 8111", "CN")
	if err != nil {
		t.Fatal(err)
	}
	want := NewBinding(key, "chat", "u1", p.E164, 9)
	b, repeat, err := Bind(&old, want, LegacyPhoneHashes(key, p)...)
	if err != nil || !repeat || b.ActID != old.ActID || b.CreatedMS != 5 || b.PhoneHash != PhoneHash(key, "+8613800138111") {
		t.Errorf("legacy row: %+v, repeat %v, %v; want its act_id, re-keyed", b, repeat, err)
	}
	if _, _, err := Bind(&old, want); !errors.Is(err, ErrIdentityConflict) {
		t.Errorf("legacy row without the legacy hashes: %v, want IDENTITY_CONFLICT", err)
	}
	q, _ := ParsePhone("13800138112", "CN")
	if _, _, err := Bind(&old, NewBinding(key, "chat", "u1", q.E164, 9), LegacyPhoneHashes(key, q)...); !errors.Is(err, ErrIdentityConflict) {
		t.Errorf("legacy row, another phone: %v, want IDENTITY_CONFLICT", err)
	}
}

// The actIDs are valid act_ids, the same for the same input and key, apart
// for another phone, another app account or another key, and neither they
// nor the stored hash hold the phone's digits.
func TestIdentityActIDs(t *testing.T) {
	k1, k2 := []byte("key-one-0123456789abcdef"), []byte("key-two-0123456789abcdef")
	phone := "+8613800138000"
	ids := map[string]string{
		"phone k1":        PhoneActID(k1, phone),
		"phone k2":        PhoneActID(k2, phone),
		"other phone":     PhoneActID(k1, "+8613800138001"),
		"app account":     AppAccountActID(k1, "chat", "u1"),
		"other app":       AppAccountActID(k1, "chats", "u1"),
		"shifted account": AppAccountActID(k1, "chat", "su1"),
	}
	seen := map[string]string{}
	for name, id := range ids {
		if err := ValidateActID(id); err != nil || len(id) != 1+actIDHexLen {
			t.Errorf("%s: %q is no act_id of %d characters: %v", name, id, 1+actIDHexLen, err)
		}
		if strings.Contains(id, "13800138000") {
			t.Errorf("%s: %q holds the phone", name, id)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share actID %s", name, other, id)
		}
		seen[id] = name
	}
	if PhoneActID(k1, phone) != ids["phone k1"] || AppAccountActID(k1, "chat", "u1") != ids["app account"] {
		t.Error("actIDs are not stable")
	}
	if !strings.HasPrefix(ids["phone k1"], "p") || !strings.HasPrefix(ids["app account"], "a") {
		t.Errorf("prefixes: %s, %s", ids["phone k1"], ids["app account"])
	}
	h := PhoneHash(k1, phone)
	if len(h) != 64 || strings.Contains(h, ids["phone k1"][1:]) || h == PhoneHash(k2, phone) {
		t.Errorf("phone hash %q: want 64 hex digits under its own label and key", h)
	}
}

func TestBind(t *testing.T) {
	key := []byte("key-one-0123456789abcdef")
	withPhone := NewBinding(key, "chat", "u1", "+8613800138000", 1000)
	bare := NewBinding(key, "chat", "u1", "", 1000)
	if withPhone.PhoneHash == "" || bare.PhoneHash != "" || bare.ActID != AppAccountActID(key, "chat", "u1") {
		t.Fatalf("NewBinding: %+v, %+v", withPhone, bare)
	}
	later := func(b IdentityBinding) IdentityBinding { b.CreatedMS = 9999; return b }
	cases := []struct {
		name   string
		have   *IdentityBinding
		want   IdentityBinding
		answer IdentityBinding
		repeat bool
		err    error
	}{
		{"new with phone", nil, withPhone, withPhone, false, nil},
		{"new without", nil, bare, bare, false, nil},
		{"same phone again", &withPhone, later(withPhone), withPhone, true, nil},
		{"no phone, bound with one", &withPhone, later(bare), withPhone, true, nil},
		{"no phone again", &bare, later(bare), bare, true, nil},
		{"another phone", &withPhone, NewBinding(key, "chat", "u1", "+8613800138001", 5), IdentityBinding{}, false, ErrIdentityConflict},
		{"a phone, bound without", &bare, withPhone, IdentityBinding{}, false, ErrIdentityConflict},
	}
	for _, c := range cases {
		got, repeat, err := Bind(c.have, c.want)
		if got != c.answer || repeat != c.repeat || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: %+v, repeat %v, %v; want %+v, %v, %v", c.name, got, repeat, err, c.answer, c.repeat, c.err)
		}
		if err != nil && strings.Contains(err.Error(), "13800138") {
			t.Errorf("%s: the error repeats the phone: %v", c.name, err)
		}
	}
}
