package model

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPacketIDRoundTrip(t *testing.T) {
	now := time.Date(2026, 2, 28, 23, 59, 0, 0, time.UTC)
	id := NewPacketID(417, now)
	if len(id) != PacketIDLen || !strings.HasPrefix(string(id), "20260228417") {
		t.Fatalf("id %q", id)
	}
	ref, err := ParsePacketID(string(id))
	if err != nil {
		t.Fatal(err)
	}
	if ref.Shard != 417 || ref.Day != 28 || ref.Month != 2 || ref.Year != 2026 || ref.ID != id {
		t.Fatalf("ref %+v", ref)
	}
	if NewPacketID(417, now) == id {
		t.Fatal("two packet IDs collided")
	}
	c := ClaimID(id, 12)
	cref, seq, err := ParseClaimID(c)
	if err != nil || seq != 12 || cref.ID != id {
		t.Fatalf("claim %q -> %+v %d %v", c, cref, seq, err)
	}
}

func TestParsePacketIDRejects(t *testing.T) {
	bad := []string{
		"",
		"20261129417",                    // too short
		"20261129417a3f9c0e1b2d4c5e6f77", // too long
		"20261129417A3F9C0E1B2D4C5E6F",   // uppercase hex
		"2026113041700000000000000000",   // wrong length
		"202602304170000000000000000",    // Feb 30
		"202613014170000000000000000",    // month 13
		"199901014170000000000000000",    // before 2000
		"2026112941'; DROP TABLE x;--aa", // SQL
		"20261129417../../etc/passwd00",  // path
		"2026112941700000000000000g0",    // non-hex
		"2026112941 0000000000000000a",   // space
	}
	for _, s := range bad {
		if _, err := ParsePacketID(s); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParsePacketID(%q) = %v, want ErrInvalidArgument", s, err)
		}
	}
	for _, s := range []string{"x", "20261129417000000000000000c", "202611294170000000000000000c0", "202611294170000000000000000c01", "202611294170000000000000000x1"} {
		if _, _, err := ParseClaimID(s); err == nil {
			t.Errorf("ParseClaimID(%q) accepted", s)
		}
	}
}

func TestValidateActID(t *testing.T) {
	for _, ok := range []string{"u1", "A_b-9", strings.Repeat("z", 64)} {
		if err := ValidateActID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("z", 65), "a b", "a/b", "a'b", "ü", "a:b", "a.b", "a\x00"} {
		if err := ValidateActID(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCodeOf(t *testing.T) {
	code, msg := CodeOf(Errorf(ErrSoldOut, "packet %s", "p"))
	if code != "SOLD_OUT" || msg != "packet p" {
		t.Fatalf("%s %s", code, msg)
	}
	if code, _ := CodeOf(errors.New("boom")); code != "INTERNAL" {
		t.Fatalf("plain error code %s", code)
	}
	if !errors.Is(Invalidf("x"), ErrInvalidArgument) {
		t.Fatal("Invalidf does not match ErrInvalidArgument")
	}
}

func BenchmarkParsePacketID(b *testing.B) {
	id := string(NewPacketID(417, time.Now()))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := ParsePacketID(id); err != nil {
			b.Fatal(err)
		}
	}
}
