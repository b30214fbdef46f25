package api

import (
	"testing"

	"redcell/model"
)

func TestNewSendResponse(t *testing.T) {
	p := model.Packet{ID: "20261130663abc", Sender: "alice", Amount: 1234, Count: 5, Kind: model.KindFixed, ExpiresMS: 1_796_040_000_123}
	got := NewSendResponse(p, true)
	want := SendResponse{PacketID: "20261130663abc", Sender: "alice", Amount: 1234, Count: 5, Kind: string(model.KindFixed),
		ExpiresAt: "2026-11-30T12:00:00.123Z", ExpiresMS: 1_796_040_000_123, Repeat: true}
	if got != want {
		t.Fatalf("NewSendResponse = %+v, want %+v", got, want)
	}
}

func TestNewGrabResponse(t *testing.T) {
	for _, c := range []struct {
		status    string
		remaining int64
		want      GrabResponse
	}{
		{"open", 3, GrabResponse{PacketID: "p", Available: true, Remaining: 3, Status: "open", Source: "db"}},
		{"open", 0, GrabResponse{PacketID: "p", Available: false, Remaining: 0, Status: "open", Source: "db"}},
		{"sold_out", 0, GrabResponse{PacketID: "p", Status: "sold_out", Source: "db"}},
		{"expired", 4, GrabResponse{PacketID: "p", Status: "expired", Source: "db"}},
		{"refunded", 4, GrabResponse{PacketID: "p", Status: "refunded", Source: "db"}},
	} {
		if got := NewGrabResponse("p", c.status, c.remaining, "db"); got != c.want {
			t.Errorf("NewGrabResponse(%s, %d) = %+v, want %+v", c.status, c.remaining, got, c.want)
		}
	}
}
