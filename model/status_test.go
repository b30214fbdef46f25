package model

import (
	"errors"
	"testing"
)

func TestStatusAt(t *testing.T) {
	const exp = 1_000
	for _, c := range []struct {
		st        PacketStatus
		remaining int64
		now       int64
		want      string
	}{
		{StatusOpen, 3, exp - 1, "open"},
		{StatusOpen, 3, exp, "expired"}, // at the expiry instant already
		{StatusOpen, 0, exp - 1, "sold_out"},
		{StatusOpen, 0, exp + 5, "expired"}, // expiry first: nothing is left to refund, but the API says expired
		{StatusSoldOut, 0, exp + 5, "sold_out"},
		{StatusRefunded, 2, exp + 5, "refunded"},
		{StatusRefunded, 2, exp - 1, "refunded"},
	} {
		if got := StatusAt(c.st, c.remaining, exp, c.now); got != c.want {
			t.Errorf("StatusAt(%v, %d, %d, %d) = %s, want %s", c.st, c.remaining, exp, c.now, got, c.want)
		}
	}
}

func TestFinalErr(t *testing.T) {
	open := Packet{ID: "p", Status: StatusOpen, RemainingCount: 2, ExpiresMS: 1_000}
	soldOut, noShare, refunded := open, open, open
	soldOut.Status, soldOut.RemainingCount = StatusSoldOut, 0
	noShare.RemainingCount = 0
	refunded.Status = StatusRefunded
	for _, c := range []struct {
		name string
		p    Packet
		now  int64
		want error
	}{
		{"open", open, 999, nil},
		{"open at expiry", open, 1_000, ErrExpired},
		{"sold out", soldOut, 10, ErrSoldOut},
		{"no share left", noShare, 10, ErrSoldOut},
		{"no share left after expiry", noShare, 2_000, ErrSoldOut},
		{"refunded", refunded, 10, ErrExpired},
		{"no packet", Packet{}, 2_000, nil},
	} {
		if got := FinalErr(c.p, c.now); !errors.Is(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%s: FinalErr = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestClosedResults(t *testing.T) {
	reqs := []OpenRequest{{ActID: "alice"}, {ActID: "bob"}, {ActID: "alice"}}
	earlier := map[string]Claim{"alice": {ID: "c1", ActID: "alice", Amount: 12, Seq: 3}}
	got := ClosedResults(reqs, earlier, ErrSoldOut)
	if len(got) != 3 {
		t.Fatalf("%d results for 3 requests", len(got))
	}
	for _, i := range []int{0, 2} {
		if r := got[i]; r.Err != nil || !r.Repeat || r.Claim != earlier["alice"] {
			t.Errorf("result %d = %+v, want alice's claim c1 as a repeat", i, r)
		}
	}
	if r := got[1]; !errors.Is(r.Err, ErrSoldOut) || r.Repeat || r.Claim.ID != "" {
		t.Errorf("result 1 = %+v, want ErrSoldOut", r)
	}
}
