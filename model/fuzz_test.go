package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The fuzz targets of model. `go test` runs their f.Add seeds and the files under
// testdata/fuzz/<target>/ as ordinary tests; `go test -fuzz` explores further
// (docs/testing.md). Each asserts properties, not only the absence of a panic.

// FuzzParsePacketID: a packet ID that parses is exactly 27 characters of digits
// and lowercase hex, names a shard 0..999 and a real date from the year 2000,
// and formats back to itself from what was parsed; anything else is
// ErrInvalidArgument. The ID is used to build table names, so "parses" must mean
// "harmless".
func FuzzParsePacketID(f *testing.F) {
	for _, seed := range []string{
		"20261129417a3f9c0e1b2d4c5e60",   // one too long
		"20261129417a3f9c0e1b2d4c5e6",    // valid
		"20000101000000000000000000",     // one too short
		"200001010000000000000000000",    // valid, smallest date and shard
		"999912319990123456789abcdef",    // valid, largest
		"20261129417A3F9C0E1B2D4C5E6",    // uppercase hex
		"202602304170000000000000000",    // Feb 30
		"202402294170000000000000000",    // Feb 29 of a leap year
		"202302294170000000000000000",    // Feb 29 of another year
		"202613014170000000000000000",    // month 13
		"202600014170000000000000000",    // month 0
		"199912314170000000000000000",    // before 2000
		"20261129-170000000000000000",    // a sign where the shard is
		"2026112941'; DROP TABLE x;-",    // SQL, 27 characters
		"20261129417../../etc/passwd",    // a path, 27 characters
		"20261129417/000000000000000",    // a slash
		"2026112941700000000000000\x000", // NUL
		"２026112941700000000000000",      // a full-width digit (3 bytes)
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := ParsePacketID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParsePacketID(%q): %v is not ErrInvalidArgument", s, err)
			}
			if len(s) == PacketIDLen && packetIDShape.MatchString(s) && validDate(s) {
				t.Fatalf("ParsePacketID(%q) refused a well-formed ID: %v", s, err)
			}
			return
		}
		if len(s) != PacketIDLen || !packetIDShape.MatchString(s) {
			t.Fatalf("ParsePacketID(%q) accepted a malformed ID", s)
		}
		if !ref.Shard.Valid() || ref.Shard.DB() > 99 || ref.Shard.Table() > 9 || ref.Day < 1 || ref.Day > 31 || ref.Year < 2000 {
			t.Fatalf("ParsePacketID(%q) = %+v: out of range", s, ref)
		}
		d := time.Date(ref.Year, ref.Month, ref.Day, 0, 0, 0, 0, time.UTC)
		if d.Year() != ref.Year || d.Month() != ref.Month || d.Day() != ref.Day {
			t.Fatalf("ParsePacketID(%q) = %+v: not a real date", s, ref)
		}
		back := fmt.Sprintf("%04d%02d%02d%03d", ref.Year, int(ref.Month), ref.Day, int(ref.Shard)) + s[11:]
		if back != s || string(ref.ID) != s {
			t.Fatalf("ParsePacketID(%q) = %+v formats back as %q", s, ref, back)
		}
		for _, seq := range []int64{1, 9, 10, MaxShares} {
			cref, got, err := ParseClaimID(ClaimID(ref.ID, seq))
			if err != nil || got != seq || cref != ref {
				t.Fatalf("claim %d of %q: %+v %d %v", seq, s, cref, got, err)
			}
		}
	})
}

// packetIDShape is the form of a packet ID, written independently of the parser.
var packetIDShape = regexp.MustCompile(`^[0-9]{11}[0-9a-f]{16}$`)

// validDate reports whether the first 8 digits of s are a date from 2000 on.
func validDate(s string) bool {
	d, err := time.Parse("20060102", s[:8])
	return err == nil && d.Year() >= 2000
}

// FuzzNewPacketID: an ID made for any shard 0..999 at any time from 2000 to
// 9999 (UTC) parses back to that shard and that UTC day.
func FuzzNewPacketID(f *testing.F) {
	f.Add(uint16(417), int64(1_796_000_000))
	f.Add(uint16(0), int64(946_684_800))    // 2000-01-01T00:00:00Z
	f.Add(uint16(999), int64(253402300799)) // 9999-12-31T23:59:59Z
	f.Add(uint16(5), int64(1_709_164_800))  // 2024-02-29
	f.Add(uint16(1000), int64(0))           // out of range: skipped
	f.Fuzz(func(t *testing.T, shard uint16, unixSec int64) {
		at := time.Unix(unixSec, 0).UTC()
		if shard >= ShardCount || at.Year() < 2000 || at.Year() > 9999 {
			return // NewPacketID is only called with a valid shard and the clock
		}
		id := NewPacketID(ShardID(shard), at)
		ref, err := ParsePacketID(string(id))
		if err != nil {
			t.Fatalf("NewPacketID(%d, %s) = %q does not parse: %v", shard, at, id, err)
		}
		if ref.Shard != ShardID(shard) || ref.Year != at.Year() || ref.Month != at.Month() || ref.Day != at.Day() || ref.ID != id {
			t.Fatalf("NewPacketID(%d, %s) = %q parses as %+v", shard, at, id, ref)
		}
	})
}

// FuzzParseClaimID: a claim ID that parses is a valid packet ID, "c" and a
// sequence number 1..MaxShares without sign or leading zero, and ClaimID
// rebuilds exactly the same string from the parts (one claim, one spelling: it
// is an order number on the credited side).
func FuzzParseClaimID(f *testing.F) {
	const p = "20261129417a3f9c0e1b2d4c5e6"
	for _, seed := range []string{
		p + "c1", p + "c12", p + "c99999999", // valid
		p + "c100000000", // 9 digits: above MaxShares
		p + "c0", p + "c01", p + "c-1", p + "c+1", p + "c", p + "c1 ", p + "c１",
		p + "x1", p + "C1", p[:26] + "c1", "20261129417A3F9C0E1B2D4C5E6c1",
		"202602304170000000000000000c1", // Feb 30
		p + "c9223372036854775807", p + "c9223372036854775808",
		"", "c1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, seq, err := ParseClaimID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParseClaimID(%q): %v is not ErrInvalidArgument", s, err)
			}
			if wellFormedClaim(s) {
				t.Fatalf("ParseClaimID(%q) refused a well-formed claim ID: %v", s, err)
			}
			return
		}
		if seq < 1 || seq > MaxShares {
			t.Fatalf("ParseClaimID(%q): seq %d out of 1..%d", s, seq, MaxShares)
		}
		if again, perr := ParsePacketID(string(ref.ID)); perr != nil || again != ref {
			t.Fatalf("ParseClaimID(%q): packet %+v does not parse back: %v", s, ref, perr)
		}
		if back := ClaimID(ref.ID, seq); back != s {
			t.Fatalf("ParseClaimID(%q) = %s, %d, which formats as %q", s, ref.ID, seq, back)
		}
	})
}

// wellFormedClaim is the claim-ID rule written independently of the parser.
func wellFormedClaim(s string) bool {
	if len(s) < PacketIDLen+1 || s[PacketIDLen] != 'c' {
		return false
	}
	id, seq := s[:PacketIDLen], s[PacketIDLen+1:]
	return packetIDShape.MatchString(id) && validDate(id) && claimSeqShape.MatchString(seq)
}

// claimSeqShape is a claim's sequence number: 1..99,999,999 (MaxShares).
var claimSeqShape = regexp.MustCompile(`^[1-9][0-9]{0,7}$`)

// FuzzValidateActID: act_ids and order numbers accept exactly 1..64 bytes of
// [A-Za-z0-9_-] (an independent regexp is the oracle), so nothing that passes
// can carry SQL, a path, whitespace, a ':' (internal order numbers) or non-ASCII.
func FuzzValidateActID(f *testing.F) {
	for _, seed := range []string{
		"u1", "A_b-9", strings.Repeat("z", 64), strings.Repeat("z", 65), "",
		"a b", "a/b", "../etc", "a\\b", "a'b", `a"b`, "a;b", "a%00", "a\x00", "a:b", "a.b",
		"ü", "\xff", "u1'; DROP TABLE t_flow_0;--", "claim:x", "a\nb", "a\tb",
	} {
		f.Add(seed)
	}
	actIDShape := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	f.Fuzz(func(t *testing.T, s string) {
		want := actIDShape.MatchString(s)
		for name, validate := range map[string]func(string) error{"act_id": ValidateActID, "order_no": ValidateOrderNo} {
			err := validate(s)
			if (err == nil) != want {
				t.Fatalf("%s %q: error %v, want accepted=%v", name, s, err, want)
			}
			if err != nil && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("%s %q: %v is not ErrInvalidArgument", name, s, err)
			}
		}
	})
}

// splitFuzzLimits are the widest limits Limits.Validate allows for amounts
// (MaxInt64/4: SplitNext doubles the remainder), with counts kept to what one
// fuzz run draws quickly; drawing cost, not correctness, grows with the count.
var splitFuzzLimits = Limits{MaxAmount: math.MaxInt64 / 4, MaxCount: 20_000, MaxGreeting: 64}

// FuzzSplit: Limits.CheckShares accepts exactly the packets with
// 1 <= count <= amount within the limits, and refuses the rest with
// ErrInvalidArgument. Every accepted packet, random or (when divisible) fixed,
// draws count shares of at least 1 cent, none above twice the remaining mean,
// that sum to exactly the amount. SplitNext on a packet that cannot give every
// share a cent panics with its invariant, never with a runtime error.
func FuzzSplit(f *testing.F) {
	for _, seed := range []struct {
		amount, count int64
		fixed         bool
	}{
		{1000, 10, false}, {1000, 10, true}, {1, 1, false}, {7, 7, false}, {999, 9, true},
		{math.MaxInt64 / 4, 2, false}, {math.MaxInt64 / 4, 20_000, false}, // the widest amounts
		{0, 1, false}, {-5, 1, false}, {10, 0, false}, {10, -1, false}, // zero and negative
		{3, 4, false},                                              // a share below a cent
		{math.MaxInt64/4 + 1, 1, false}, {math.MaxInt64, 1, false}, // above the limit
		{math.MinInt64, math.MinInt64, false}, {100_000, 20_001, false}, // count above the limit
	} {
		f.Add(seed.amount, seed.count, uint64(1), seed.fixed)
	}
	f.Fuzz(func(t *testing.T, amount, count int64, seed uint64, fixed bool) {
		lim := splitFuzzLimits
		if err := lim.Validate(); err != nil {
			t.Fatal(err)
		}
		err := lim.CheckShares(Cents(amount), count)
		inRange := amount >= 1 && amount <= int64(lim.MaxAmount) && count >= 1 && count <= lim.MaxCount && count <= amount
		if (err == nil) != inRange {
			t.Fatalf("CheckShares(%d, %d) = %v, want accepted=%v", amount, count, err, inRange)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("CheckShares(%d, %d): %v is not ErrInvalidArgument", amount, count, err)
			}
			if count < 1 || count > amount {
				requireInvariantPanic(t, amount, count)
			}
			return
		}
		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		if fixed && amount%count == 0 {
			for i, s := range Split(KindFixed, Cents(amount), count, r) {
				if int64(s) != amount/count {
					t.Fatalf("fixed %d/%d: share %d is %d", amount, count, i, s)
				}
			}
			return
		}
		checkRandomDraws(t, Cents(amount), count, r)
	})
}

// checkRandomDraws draws every share of a random packet one by one, as the
// cell does, and checks each draw and the total.
func checkRandomDraws(t *testing.T, amount Cents, count int64, r *rand.Rand) {
	t.Helper()
	remaining, sum := amount, Cents(0)
	for left := count; left > 0; left-- {
		s := SplitNext(remaining, left, r)
		if s < 1 || s > remaining-Cents(left-1) {
			t.Fatalf("packet %d/%d: share %d with %d left for %d shares", amount, count, s, remaining, left)
		}
		if left > 1 && s > 2*remaining/Cents(left) {
			t.Fatalf("packet %d/%d: share %d above twice the mean of %d over %d", amount, count, s, remaining, left)
		}
		if left == 1 && s != remaining {
			t.Fatalf("packet %d/%d: last share %d, remainder %d", amount, count, s, remaining)
		}
		remaining -= s
		sum += s
	}
	if sum != amount || remaining != 0 {
		t.Fatalf("packet %d/%d: shares sum to %d", amount, count, sum)
	}
}

// requireInvariantPanic checks that SplitNext refuses an impossible packet with
// its invariant panic (a bug upstream), not with a runtime error or a share.
func requireInvariantPanic(t *testing.T, amount, count int64) {
	t.Helper()
	share, recovered := splitRecover(Cents(amount), count)
	if msg, _ := recovered.(string); !strings.HasPrefix(msg, "invariant violated: ") {
		t.Fatalf("SplitNext(%d, %d) = %d, panic %v; want an invariant panic", amount, count, share, recovered)
	}
}

func splitRecover(amount Cents, count int64) (share Cents, recovered any) {
	defer func() { recovered = recover() }()
	return SplitNext(amount, count, rand.New(rand.NewPCG(1, 1))), nil
}

func TestClaimOracleAgrees(t *testing.T) {
	// The oracles of the fuzz targets must themselves accept what the code makes.
	id := string(NewPacketID(417, time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)))
	if !packetIDShape.MatchString(id) || !validDate(id) || !wellFormedClaim(ClaimID(PacketID(id), 12)) {
		t.Fatalf("oracle refuses %q", id)
	}
	if wellFormedClaim(id+"c0") || wellFormedClaim(id+"c"+strconv.Itoa(MaxShares+1)) {
		t.Fatal("oracle accepts seq 0 or above MaxShares")
	}
}
