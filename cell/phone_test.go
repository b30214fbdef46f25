package cell_test

import (
	"fmt"
	"strings"
	"testing"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestBindIdentityPhoneSpellings: one phone is one person whatever its
// spelling. The four spellings of issue 27 (E.164, spaced, national, after
// "00"), each bound on an app of its own, give one act_id, that of the E.164
// form, and each row holds its hash; what is no valid number is 400
// INVALID_ARGUMENT and stores nothing.
func TestBindIdentityPhoneSpellings(t *testing.T) {
	c := oneCell(t, func(cfg *cell.Config) { cfg.IdentityKey = testIdentityKey })
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	key := []byte(testIdentityKey)
	wantAct, wantHash := model.PhoneActID(key, "+8613800138111"), model.PhoneHash(key, "+8613800138111")
	for i, spelling := range []string{"+8613800138111", "+86 138 0013 8111", "13800138111", "008613800138111"} {
		app := fmt.Sprintf("%sapp%d", pre, i)
		var r api.IdentityResponse
		if st, code := call(t, "PUT", c.url+api.IdentityPath(app, "u1"), map[string]string{"phone": spelling}, &r); st != 200 || r.Repeat || r.ActID != wantAct {
			t.Errorf("%q on %s: %d %s %+v, want a new binding to %s", spelling, app, st, code, r, wantAct)
		}
		if act, hash := identityRow(t, c, app, "u1"); act != wantAct || hash != wantHash {
			t.Errorf("the row of %q: act_id %s, phone_hash %s; want the E.164 form's", spelling, act, hash)
		}
	}
	for _, bad := range []string{"12345678901", "+86 138 0013 811", "+0 138 0013 8111", "0086 999 0013 8111", "138 0013 8111 x", "+86 138 0013 8111 0000"} {
		if st, code := call(t, "PUT", c.url+api.IdentityPath(pre+"bad", "u1"), map[string]string{"phone": bad}, nil); st != 400 || code != model.ErrInvalidArgument.Code {
			t.Errorf("%q: %d %s, want 400 INVALID_ARGUMENT", bad, st, code)
		}
	}
	var bare api.IdentityResponse
	if st, code := call(t, "PUT", c.url+api.IdentityPath(pre+"bad", "u1"), nil, &bare); st != 200 || bare.Repeat {
		t.Errorf("the account after its refused numbers: %d %s %+v, want it still unbound", st, code, bare)
	}
}

// TestBindIdentityRegion: a cell reading numbers in region DE reads a
// national number as a German one; a number with '+' is read as sent.
func TestBindIdentityRegion(t *testing.T) {
	de := oneCell(t, func(cfg *cell.Config) { cfg.IdentityKey, cfg.IdentityDefaultRegion = testIdentityKey, "DE" })
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	key := []byte(testIdentityKey)
	var r api.IdentityResponse
	if st, code := call(t, "PUT", de.url+api.IdentityPath(pre+"de", "u1"), map[string]string{"phone": "030 12345678"}, &r); st != 200 || r.ActID != model.PhoneActID(key, "+493012345678") {
		t.Errorf("a national number in region DE: %d %s %+v, want the act_id of +493012345678", st, code, r)
	}
	if st, code := call(t, "PUT", de.url+api.IdentityPath(pre+"de", "u2"), map[string]string{"phone": "+86 138 0013 8111"}, &r); st != 200 || r.ActID != model.PhoneActID(key, "+8613800138111") {
		t.Errorf("a number with '+' in region DE: %d %s %+v, want the act_id of +8613800138111", st, code, r)
	}
}

// TestBindIdentityLegacyRows: bindings stored before phone numbers were
// parsed — rows in MariaDB with the act_id and hash of the digits as sent,
// "13800138111" apart from "+8613800138111" — keep their act_id: the same
// number bound again in another spelling is a repeat of the row, not a
// conflict, and the row is re-keyed to the E.164 hash with its act_id and
// created_ms unchanged. Another number is still a conflict.
func TestBindIdentityLegacyRows(t *testing.T) {
	c := oneCell(t, func(cfg *cell.Config) { cfg.IdentityKey = testIdentityKey })
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	app := pre + "chat"
	key := []byte(testIdentityKey)
	for _, old := range []struct{ user, form, spelling string }{
		{"national", "13800138111", "+86 138 0013 8111"},
		{"idd", "008613800138111", "13800138111"},
		{"spaced", "+8613800138111", "0086 138 0013 8111"}, // the E.164 form's row: its act_id was already the E.164 one
	} {
		// The account's row as a cell before this version wrote it: made by
		// a binding without a phone (which creates the table), then given
		// the legacy act_id and hash.
		if st, code := call(t, "PUT", c.url+api.IdentityPath(app, old.user), nil, nil); st != 200 {
			t.Fatalf("%s: %d %s", old.user, st, code)
		}
		legacyAct := model.PhoneActID(key, old.form)
		s := sharding.ShardOfIdentity(app, old.user)
		if _, err := c.db.Exec(fmt.Sprintf("UPDATE db_%02d.t_identity_%d SET act_id = ?, phone_hash = ?, created_ms = 1700000000000 WHERE app = ? AND app_user_id = ?", s.DB(), s.Table()),
			legacyAct, model.PhoneHash(key, old.form), app, old.user); err != nil {
			t.Fatal(err)
		}
		var r api.IdentityResponse
		if st, code := call(t, "PUT", c.url+api.IdentityPath(app, old.user), map[string]string{"phone": old.spelling}, &r); st != 200 || !r.Repeat || r.ActID != legacyAct || r.CreatedMS != 1700000000000 {
			t.Errorf("%s stored as %s, bound as %q: %d %s %+v; want a repeat with act_id %s", old.user, old.form, old.spelling, st, code, r, legacyAct)
		}
		if act, hash := identityRow(t, c, app, old.user); act != legacyAct || hash != model.PhoneHash(key, "+8613800138111") {
			t.Errorf("%s after the binding: act_id %s, phone_hash %s; want act_id %s, the E.164 hash", old.user, act, hash, legacyAct)
		}
		if st, code := call(t, "PUT", c.url+api.IdentityPath(app, old.user), map[string]string{"phone": "+8613800138112"}, nil); st != 409 || code != model.ErrIdentityConflict.Code {
			t.Errorf("%s, another number: %d %s, want 409 IDENTITY_CONFLICT", old.user, st, code)
		}
	}
}

// identityRow reads the act_id and phone_hash of an app account's row.
func identityRow(t *testing.T, c *testCell, app, user string) (act, hash string) {
	t.Helper()
	s := sharding.ShardOfIdentity(app, user)
	err := c.db.QueryRow(fmt.Sprintf("SELECT act_id, phone_hash FROM db_%02d.t_identity_%d WHERE app = ? AND app_user_id = ?", s.DB(), s.Table()), app, user).Scan(&act, &hash)
	if err != nil {
		t.Fatalf("the row of %s/%s: %v", app, user, err)
	}
	return act, hash
}
