package api

import (
	"time"

	"redcell/model"
)

// NewSendResponse is the answer to a send that stored packet p now, or
// before when repeat (the order number was seen before): p's fields, its
// expiry as Unix ms and as RFC 3339 in UTC with the milliseconds.
func NewSendResponse(p model.Packet, repeat bool) SendResponse {
	return SendResponse{PacketID: string(p.ID), Sender: p.Sender, Amount: int64(p.Amount), Count: p.Count, Kind: string(p.Kind),
		ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC().Format(time.RFC3339Nano), ExpiresMS: p.ExpiresMS, Repeat: repeat}
}

// NewGrabResponse is the answer to a grab of packet id whose state is status
// (model.StatusAt) with remaining shares left as read from source ("cache",
// "local" or "db"): an expired or refunded packet shows no share left, and a
// share is available only while the packet is open with one left.
func NewGrabResponse(id, status string, remaining int64, source string) GrabResponse {
	if status == "expired" || status == "refunded" {
		remaining = 0
	}
	return GrabResponse{PacketID: id, Available: status == model.StatusOpen.String() && remaining > 0, Remaining: remaining,
		Status: status, Source: source}
}
