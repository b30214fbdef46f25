package model

import (
	"errors"
	"strings"
	"testing"
)

func TestNormalizePhone(t *testing.T) {
	for in, want := range map[string]string{
		"+86 138-0013-8000": "+8613800138000",
		"(030) 1234.5678":   "03012345678",
		"+1 (415) 555-0100": "+14155550100",
		"123456":            "123456",
	} {
		if got, err := NormalizePhone(in); err != nil || got != want {
			t.Errorf("NormalizePhone(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "+", "12345", "1234567890123456", "+86 138 0013 800a", "86+13800138000", "+86\t13800138000", "++8613800138000"} {
		_, err := NormalizePhone(bad)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NormalizePhone(%q): %v, want INVALID_ARGUMENT", bad, err)
			continue
		}
		if digits := strings.Trim(bad, "+ "); len(digits) >= 6 && strings.Contains(err.Error(), digits) {
			t.Errorf("NormalizePhone(%q): the error repeats the number: %v", bad, err)
		}
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
