package model

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// FlowKind names what changed a balance. The values are stored in the flow
// rows (t_flow_Y.kind) and never change meaning.
type FlowKind string

const (
	FlowDeposit FlowKind = "deposit" // money in from outside, under the caller's order number
	FlowSend    FlowKind = "send"    // a packet's amount out of its sender's wallet (Amount < 0)
	FlowRefund  FlowKind = "refund"  // an expired packet's remainder back to its sender
	FlowCredit  FlowKind = "credit"  // a claim booked into the claimant's wallet
)

// Flow is one balance change, as a store writes it: the row keyed by the
// UNIQUE pair (ActID, OrderNo) that makes every change happen at most once.
// Amount is signed cents (a send is negative). BalanceAfter is the balance the
// change left, known only where the decision read the balance (deposit, send);
// refunds and credits are booked as "balance + Amount" without reading it, so
// their rows hold no balance (NULL) and BalanceKnown is false.
type Flow struct {
	ActID        string
	OrderNo      string
	Kind         FlowKind
	Amount       Cents
	BalanceAfter Cents
	BalanceKnown bool
	Ref          string // the packet ID of a send, refund or credit; "" for a deposit
	ReqHash      string // RequestHash of the request (deposit, send); "" for internal orders
	CreatedMS    int64  // Unix ms
	// Seq is the row's place in its flow table, increasing with each row
	// (the listing's tie-break: FlowItemID); 0 where a store did not read it.
	Seq int64
}

// FlowItemID is a flow row's ID in a person's flow listing (FlowCursor):
// "f:" and Seq in 20 digits, so that IDs order as their Seqs do.
func FlowItemID(seq int64) string { return "f:" + fmt.Sprintf("%020d", seq) }

// RefundOrderNo is the order number of a packet's refund flow: one packet is
// refunded at most once. It holds ':' so it can never be a caller's order number.
func RefundOrderNo(id PacketID) string { return "refund:" + string(id) }

// CreditOrderNo is the order number of a claim's credit flow on the claimant's
// side: one claim is credited at most once.
func CreditOrderNo(claimID string) string { return "claim:" + claimID }

// RequestHash fingerprints the parts of a request that must match when a
// caller retries it under the same order number: 32 hex digits (the first 16
// bytes of SHA-256 over the parts joined by NUL). Every store computes it here
// so their answers to a retry agree.
func RequestHash(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:16])
}

// SendHash is the fingerprint of a send: kind, amount, count and greeting.
// The sender and order number are the flow row's key, so they are not in it.
func SendHash(req SendRequest) string {
	return RequestHash(string(FlowSend), string(req.Kind), strconv.FormatInt(int64(req.Amount), 10),
		strconv.FormatInt(req.Count, 10), req.Greeting)
}

// DepositHash is the fingerprint of a deposit of amount cents.
func DepositHash(amount Cents) string {
	return RequestHash(string(FlowDeposit), strconv.FormatInt(int64(amount), 10))
}

// ReplayOrder decides a request whose order number already has a flow row,
// prior: nil when prior was made by the same kind of request with the same
// fingerprint (the caller answers with the first result and changes nothing),
// else ErrOrderConflict. It never says "apply again".
func ReplayOrder(prior Flow, kind FlowKind, hash string) error {
	if prior.Kind != kind || prior.ReqHash != hash {
		return Errorf(ErrOrderConflict, "order_no %s was used with a different request", prior.OrderNo)
	}
	return nil
}
