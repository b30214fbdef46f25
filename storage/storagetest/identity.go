package storagetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractIdentityBinding", contractIdentityBinding)
	register("ContractIdentityConcurrentFirst", contractIdentityConcurrentFirst)
	register("ContractIdentityLegacyRows", contractIdentityLegacyRows)
}

// identityKey is the key the contract's bindings are made under.
var identityKey = []byte("contract-identity-key-0123456789")

// A first binding is stored and answered as new; the same phone again, or no
// phone, answers it as a repeat (its first time); another phone, or a phone
// for an account bound without one, is IDENTITY_CONFLICT and changes
// nothing; the same app user ID on another app, or one that differs only in
// case, is another account; no money moves.
func contractIdentityBinding(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	bind := func(s model.ShardID, app, user, phone string, at int64) (model.IdentityBinding, bool, error) {
		t.Helper()
		return storage.BindIdentity(f.ctx, f.s, s, model.NewBinding(identityKey, app, user, phone, at))
	}
	first, repeat, err := bind(sA, "chat", "u1", "+8613800000001", now)
	want := model.IdentityBinding{App: "chat", AppUserID: "u1", ActID: model.PhoneActID(identityKey, "+8613800000001"),
		PhoneHash: model.PhoneHash(identityKey, "+8613800000001"), CreatedMS: now}
	if err != nil || repeat || first != want {
		t.Fatalf("first binding: %+v, repeat %v, %v; want %+v, new", first, repeat, err, want)
	}
	for _, phone := range []string{"+8613800000001", ""} {
		got, repeat, err := bind(sA, "chat", "u1", phone, now+1000)
		if err != nil || !repeat || got != want {
			t.Errorf("again with phone %q: %+v, repeat %v, %v; want the first binding as a repeat", phone, got, repeat, err)
		}
	}
	if _, _, err := bind(sA, "chat", "u1", "+8613800000002", now); !errors.Is(err, model.ErrIdentityConflict) {
		t.Errorf("another phone: %v, want IDENTITY_CONFLICT", err)
	}
	// The same phone on another app: the same person.
	other, repeat, err := bind(sB, "video", "v9", "+8613800000001", now)
	if err != nil || repeat || other.ActID != want.ActID || other.App != "video" {
		t.Errorf("the phone on another app: %+v, repeat %v, %v; want a new binding to %s", other, repeat, err, want.ActID)
	}
	// Without a phone: an actID of the app account's own, kept.
	bare, repeat, err := bind(sA, "chat", "u2", "", now)
	if err != nil || repeat || bare.ActID != model.AppAccountActID(identityKey, "chat", "u2") || bare.PhoneHash != "" {
		t.Fatalf("binding without a phone: %+v, repeat %v, %v", bare, repeat, err)
	}
	if _, _, err := bind(sA, "chat", "u2", "+8613800000003", now); !errors.Is(err, model.ErrIdentityConflict) {
		t.Errorf("a phone after binding without one: %v, want IDENTITY_CONFLICT", err)
	}
	if got, repeat, err := bind(sA, "chat", "u2", "", now+5); err != nil || !repeat || got != bare {
		t.Errorf("without a phone again: %+v, repeat %v, %v; want %+v", got, repeat, err, bare)
	}
	// The same user ID on another app is another account, and so is a user
	// ID that differs only in case (app and user IDs compare byte for byte).
	if got, repeat, err := bind(sA, "shop", "u2", "", now); err != nil || repeat || got.ActID == bare.ActID {
		t.Errorf("u2 of another app: %+v, repeat %v, %v; want a new actID", got, repeat, err)
	}
	if got, repeat, err := bind(sA, "chat", "U2", "", now); err != nil || repeat || got.ActID == bare.ActID || got.AppUserID != "U2" {
		t.Errorf("U2 beside u2: %+v, repeat %v, %v; want an account of its own", got, repeat, err)
	}
	if got, repeat, err := bind(sA, "Chat", "u1", "+8613800000009", now); err != nil || repeat || got.ActID == want.ActID {
		t.Errorf("u1 of app Chat beside chat: %+v, repeat %v, %v; want an account of its own", got, repeat, err)
	}
	f.check(books{})
}

// Bindings stored before phone numbers were parsed (the act_id and hash of
// the digits as sent: "13800138111" apart from "+8613800138111") keep their
// act_id: a later binding of the same number in any spelling is a repeat of
// the row, which is re-keyed to the E.164 hash, so that the E.164 hash alone
// finds it afterwards; another number is still a conflict; a row stored from
// an E.164 spelling already has the E.164 act_id and hash.
func contractIdentityLegacyRows(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	now := f.nowMS()
	legacyRow := func(user, form string) model.IdentityBinding {
		t.Helper()
		old := model.IdentityBinding{App: "chat", AppUserID: user, ActID: model.PhoneActID(identityKey, form), PhoneHash: model.PhoneHash(identityKey, form), CreatedMS: now}
		if b, repeat, err := storage.BindIdentity(f.ctx, f.s, sA, old); err != nil || repeat || b != old {
			t.Fatalf("the legacy row %s: %+v, repeat %v, %v", user, b, repeat, err)
		}
		return old
	}
	bind := func(user, spelling string, legacy bool) (model.IdentityBinding, bool, error) {
		t.Helper()
		p, err := model.ParsePhone(spelling, "CN")
		if err != nil {
			t.Fatal(err)
		}
		var hashes []string
		if legacy {
			hashes = model.LegacyPhoneHashes(identityKey, p)
		}
		return storage.BindIdentity(f.ctx, f.s, sA, model.NewBinding(identityKey, "chat", user, p.E164, now+1000), hashes...)
	}
	e164Hash := model.PhoneHash(identityKey, "+8613800138111")
	for _, c := range []struct{ user, stored, spelling string }{
		{"national", "13800138111", "+86 138 0013 8111"},
		{"idd", "008613800138111", "138 0013 8111"},
		{"cc", "8613800138111", "008613800138111"},
	} {
		old := legacyRow(c.user, c.stored)
		got, repeat, err := bind(c.user, c.spelling, true)
		if err != nil || !repeat || got.ActID != old.ActID || got.CreatedMS != old.CreatedMS || got.PhoneHash != e164Hash {
			t.Errorf("%s stored as %s, bound as %q: %+v, repeat %v, %v; want a repeat with act_id %s, re-keyed", c.user, c.stored, c.spelling, got, repeat, err, old.ActID)
		}
		// Re-keyed: the E.164 hash alone finds the row now.
		if got, repeat, err := bind(c.user, "+8613800138111", false); err != nil || !repeat || got.ActID != old.ActID || got.PhoneHash != e164Hash {
			t.Errorf("%s after its re-key: %+v, repeat %v, %v; want a repeat with act_id %s", c.user, got, repeat, err, old.ActID)
		}
		if _, _, err := bind(c.user, "13800138112", true); !errors.Is(err, model.ErrIdentityConflict) {
			t.Errorf("%s, another number: %v, want IDENTITY_CONFLICT", c.user, err)
		}
	}
	// A legacy row not yet re-keyed, asked without its legacy hashes: a
	// conflict, as before (the caller passes them; this proves they count).
	legacyRow("unkeyed", "13800138111")
	if _, _, err := bind("unkeyed", "13800138111", false); !errors.Is(err, model.ErrIdentityConflict) {
		t.Errorf("a legacy row without the legacy hashes: %v, want IDENTITY_CONFLICT", err)
	}
	old := legacyRow("e164", "+8613800138111")
	if got, repeat, err := bind("e164", "138-0013-8111", true); err != nil || !repeat || got != old || old.ActID != model.PhoneActID(identityKey, "+8613800138111") {
		t.Errorf("a row stored from E.164: %+v, repeat %v, %v; want %+v", got, repeat, err, old)
	}
	f.check(books{})
}

// Concurrent first bindings of one account: one is stored, every other is
// decided against it (the same phone: a repeat of it; another phone: a
// conflict), and all answer the one actID that holds.
func contractIdentityConcurrentFirst(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	const n = 8
	type answer struct {
		b      model.IdentityBinding
		repeat bool
		err    error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			b, repeat, err := storage.BindIdentity(f.ctx, f.s, sC, model.NewBinding(identityKey, "chat", "race", phoneOf(i), f.nowMS()))
			answers[i] = answer{b, repeat, err}
		})
	}
	wg.Wait()
	news, holds := 0, ""
	for i, a := range answers {
		if a.err == nil && !a.repeat {
			news++
			holds = a.b.ActID
		}
		if a.err != nil && !errors.Is(a.err, model.ErrIdentityConflict) {
			t.Errorf("binding %d: %v", i, a.err)
		}
	}
	if news != 1 {
		t.Fatalf("%d first bindings stored, want 1: %+v", news, answers)
	}
	for i, a := range answers {
		if a.err == nil && a.b.ActID != holds {
			t.Errorf("binding %d answers %s, the stored one is %s", i, a.b.ActID, holds)
		}
		// A loser with the stored phone is a repeat of it; with another, a conflict.
		samePhone := model.NewBinding(identityKey, "chat", "race", phoneOf(i), 0).ActID == holds
		if a.err == nil && !a.repeat && a.b.ActID == holds {
			continue // the one stored
		}
		if samePhone && (a.err != nil || !a.repeat) || !samePhone && !errors.Is(a.err, model.ErrIdentityConflict) {
			t.Errorf("binding %d (same phone as the stored one: %v): repeat %v, %v", i, samePhone, a.repeat, a.err)
		}
	}
	f.check(books{})
}

// phoneOf is the phone binding i of the concurrent test asks for: one phone
// for the even ones, one each for the odd.
func phoneOf(i int) string {
	if i%2 == 1 {
		return fmt.Sprintf("+491510000010%d", i)
	}
	return "+4915100000001"
}
