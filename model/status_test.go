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
