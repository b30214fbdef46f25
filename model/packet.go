package model

// PacketStatus is the life-cycle state of a red packet row.
type PacketStatus int8

const (
	// StatusOpen: shares are left and the packet has not been refunded.
	StatusOpen PacketStatus = 0
	// StatusSoldOut: every share was claimed.
	StatusSoldOut PacketStatus = 1
	// StatusRefunded: expired; the exact remainder went back to the sender.
	StatusRefunded PacketStatus = 2
)

// String names the status as the API shows it.
func (s PacketStatus) String() string {
	switch s {
	case StatusOpen:
		return "open"
	case StatusSoldOut:
		return "sold_out"
	case StatusRefunded:
		return "refunded"
	}
	return "unknown"
}

// Packet is a red packet row. Amounts are cents; times are Unix milliseconds.
// Invariant (checked in storage and by the audit):
// sum(claims) + RefundAmount + RemainingAmount == Amount, and while the packet is
// open RemainingAmount >= RemainingCount >= 1.
type Packet struct {
	ID              PacketID     `json:"packet_id"`
	Sender          string       `json:"sender"`
	OrderNo         string       `json:"order_no"`
	Kind            PacketKind   `json:"kind"`
	Greeting        string       `json:"greeting"`
	Amount          Cents        `json:"amount"`
	Count           int64        `json:"count"`
	RemainingAmount Cents        `json:"remaining_amount"`
	RemainingCount  int64        `json:"remaining_count"`
	RefundAmount    Cents        `json:"refund_amount"`
	Status          PacketStatus `json:"-"`
	CreatedMS       int64        `json:"created_at_ms"`
	ExpiresMS       int64        `json:"expires_at_ms"`
}

// SendRequest asks to debit Sender by Amount and create a packet of Count shares.
type SendRequest struct {
	Sender   string
	Amount   Cents
	Count    int64
	Kind     PacketKind
	Greeting string
	OrderNo  string
}

// Claim is one share of a packet taken by one account. ID is ClaimID(PacketID, Seq).
type Claim struct {
	ID        string   `json:"claim_id"`
	PacketID  PacketID `json:"packet_id"`
	Seq       int64    `json:"seq"`
	ActID     string   `json:"act_id"`
	Amount    Cents    `json:"amount"`
	CreatedMS int64    `json:"created_at_ms"`
	// ActShard is the claimant's shard as the claim's row records it (the
	// credit's Credit.Shard), and Dest the cell its credit was sent to or
	// may have been applied at (Credit.Dest; "" when not known). The books
	// read both; answers never carry them (0 and "" in a claim answered).
	ActShard ShardID `json:"-"`
	Dest     string  `json:"-"`
}

// CreditOf is the credit claim c owes its claimant: its ActShard, CreatedMS
// and Dest carried over.
func CreditOf(c Claim) Credit {
	return Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: c.ActShard, Amount: c.Amount, CreatedMS: c.CreatedMS, Dest: c.Dest}
}

// OpenResult is the answer to one open in a batch: a claim (new, or the earlier
// one when Repeat) or an error (ErrSoldOut, ErrExpired, ErrNotFound, ...).
type OpenResult struct {
	Claim  Claim
	Repeat bool
	Err    error
	// Credited: the claim, new, was credited to its claimant's wallet in
	// the open's own transaction (a claimant of the same cell whose wallet
	// row was free), so no relay delivers it.
	Credited bool
}

// Credit moves a claim's amount into the claimant's wallet. It is applied at
// most once: the claim ID is the order number on the receiving side.
type Credit struct {
	ClaimID  string   `json:"claim_id"`
	PacketID PacketID `json:"packet_id"`
	ActID    string   `json:"act_id"`
	Shard    ShardID  `json:"shard"` // the claimant's shard
	Amount   Cents    `json:"amount"`
	// CreatedMS is when the claim was made (its created_ms, Unix ms), for the
	// relay's credit-lag metric; 0 when unknown. It is not sent between cells
	// (a cell refuses unknown fields, so an older receiver would refuse it),
	// and the receiving side never uses it.
	CreatedMS int64 `json:"-"`
	// Dest is the cell the credit was sent to or may have been applied at,
	// as its claim's row records it: where the claimant's shard was owned
	// when the claim was made, then where the relay sent it when that
	// changed (SendTo). "" when not known (rows made before the record).
	// The relay asks Dest before it delivers the credit to any other cell.
	// Not sent between cells, like CreatedMS.
	Dest string `json:"-"`
}

// ClaimPos is a position among a database's claims, ordered by
// (CreatedMS, PacketID, Seq): the order the relay pages them in. The zero
// ClaimPos is before every claim.
type ClaimPos struct {
	CreatedMS int64
	PacketID  PacketID
	Seq       int64
}

// Account is a wallet: the balance in cents.
type Account struct {
	ActID   string  `json:"act_id"`
	Shard   ShardID `json:"shard"`
	Balance Cents   `json:"balance"`
}

// Deposit is the result of a deposit: the balance right after it was applied.
type Deposit struct {
	ActID   string `json:"act_id"`
	OrderNo string `json:"order_no"`
	Amount  Cents  `json:"amount"`
	Balance Cents  `json:"balance"`
	Repeat  bool   `json:"repeat"`
}

// OpenRequest is one open waiting in a packet's queue: who opens, and the shard
// of their wallet (where the claim will be credited).
type OpenRequest struct {
	ActID string
	Shard ShardID
}

// StatusAt names a packet's state as the API shows it at nowMS (Unix ms),
// from its stored status, shares left and expiry (Unix ms): "expired" for an
// open packet past its expiry, until the refund turns it "refunded";
// "sold_out" for an open packet with no share left; else st.String().
func StatusAt(st PacketStatus, remaining, expiresMS, nowMS int64) string {
	if st == StatusOpen && nowMS >= expiresMS {
		return "expired"
	}
	if st == StatusOpen && remaining == 0 {
		return StatusSoldOut.String()
	}
	return st.String()
}

// FinalErr is the error every later open of p gets once p can pay out no
// more share, judged at nowMS (Unix ms): ErrExpired for a refunded packet or
// one past its expiry, ErrSoldOut for one with no share left; nil while p is
// open, and for the zero Packet (an open batch that read no packet).
func FinalErr(p Packet, nowMS int64) error {
	switch {
	case p.ID == "":
		return nil
	case p.Status == StatusRefunded:
		return ErrExpired
	case p.Status == StatusSoldOut || p.RemainingCount == 0:
		return ErrSoldOut
	case nowMS >= p.ExpiresMS:
		return ErrExpired
	}
	return nil
}

// ClosedResults answers opens reqs of a packet that can pay out no more
// share (final: its FinalErr) from earlier, the claims its users made before
// (by act_id, as Store.ClaimsOf returns them): a user who claimed gets the
// claim back as a repeat, the others get final. One result per request, in
// reqs' order.
func ClosedResults(reqs []OpenRequest, earlier map[string]Claim, final error) []OpenResult {
	out := make([]OpenResult, len(reqs))
	for i, rq := range reqs {
		if c, ok := earlier[rq.ActID]; ok {
			out[i] = OpenResult{Claim: c, Repeat: true}
		} else {
			out[i] = OpenResult{Err: final}
		}
	}
	return out
}
