package api

import (
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	secret := []byte("s3cret")
	now := time.UnixMilli(1_800_000_000_000)
	body := []byte(`{"credits":[]}`)
	sig := Sign(secret, "POST", "/internal/credits", false, now.UnixMilli(), body)
	ts := "1800000000000"
	if !Verify(secret, "POST", "/internal/credits", false, ts, sig, body, now.Add(time.Second)) {
		t.Fatal("a fresh, correct signature was refused")
	}
	for name, ok := range map[string]bool{
		"other body":      Verify(secret, "POST", "/internal/credits", false, ts, sig, []byte(`{"credits":[1]}`), now),
		"other path":      Verify(secret, "POST", "/internal/other", false, ts, sig, body, now),
		"other method":    Verify(secret, "PUT", "/internal/credits", false, ts, sig, body, now),
		"other secret":    Verify([]byte("x"), "POST", "/internal/credits", false, ts, sig, body, now),
		"no secret":       Verify(nil, "POST", "/internal/credits", false, ts, sig, body, now),
		"replayed later":  Verify(secret, "POST", "/internal/credits", false, ts, sig, body, now.Add(SignatureWindow+time.Second)),
		"from the future": Verify(secret, "POST", "/internal/credits", false, ts, sig, body, now.Add(-SignatureWindow-time.Second)),
		"no timestamp":    Verify(secret, "POST", "/internal/credits", false, "", sig, body, now),
		"no signature":    Verify(secret, "POST", "/internal/credits", false, ts, "", body, now),
	} {
		if ok {
			t.Errorf("%s: accepted", name)
		}
	}
}
