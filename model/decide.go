package model

import (
	"math"
	"math/rand/v2"

	"redcell/internal/invariant"
)

// The money decisions. Each is a pure function of the state a store read
// (under its locks) to the state and rows the store must write: no I/O, no
// clock, no global. A store is "lock the rows, decide, write what the decision
// returned"; the in-memory store and the simulation call the same functions,
// so every store answers alike. Each decision asserts its preconditions (the
// state it was given is one the rules can reach) and its postconditions
// (conservation of the packet, one claim per user, shares of at least a cent,
// refund = exact remainder, no balance below zero) with invariant.That.

// OpenInput is what an open decision needs: the packet row as locked, the
// claims the batch's users already hold on it, the batch, the time and the
// random source of the split.
type OpenInput struct {
	// Packet is the packet row. When Found is false only Packet.ID is read
	// (it names the packet in the ErrNotFound answers).
	Packet Packet
	Found  bool
	// Earlier maps act_id to the claim that user already holds on the packet;
	// it may hold users not in Reqs. Claims' ActID must equal their key.
	Earlier map[string]Claim
	Reqs    []OpenRequest
	NowMS   int64      // Unix ms: the packet is expired when NowMS >= ExpiresMS
	Rand    *rand.Rand // draws random shares; not used for fixed packets
}

// OpenOutcome is what an open decision returns.
type OpenOutcome struct {
	Results []OpenResult // one per request, in order
	Packet  Packet       // the packet after the batch; zero when not found
	Fresh   []Claim      // the new claims, in seq order; the store inserts them
	// Credits are the outbox rows of Fresh: Credits[i] is Fresh[i] owed to
	// its claimant, with the claimant's shard from the request (the first
	// request of that user in the batch). Its creation time is Fresh[i].CreatedMS.
	Credits []Credit
}

// Open decides a batch of opens of one packet, in order:
//   - packet not found: ErrNotFound for every request;
//   - a user who already holds a claim gets it back with Repeat set;
//   - a user listed twice gets one claim; the later answers repeat the first
//     (with Repeat set when it was a claim);
//   - no share left: ErrSoldOut (checked before expiry: a sold-out packet is
//     sold out whatever the time);
//   - refunded, or NowMS >= ExpiresMS: ErrExpired;
//   - otherwise a new claim: the next seq (1..Count), its share drawn by
//     SplitNext (random) or FixedShare (fixed), created at NowMS.
//
// The packet's status becomes StatusSoldOut when its last share is taken.
// Nothing changes when no claim is new (Fresh is empty: nothing to write).
func Open(in OpenInput) OpenOutcome {
	out := OpenOutcome{Results: make([]OpenResult, len(in.Reqs))}
	if !in.Found {
		for i := range out.Results {
			out.Results[i] = OpenResult{Err: Errorf(ErrNotFound, "red packet %s not found", in.Packet.ID)}
		}
		return out
	}
	checkPacket(in.Packet)
	for act, c := range in.Earlier {
		invariant.That(c.ActID == act && c.PacketID == in.Packet.ID && c.Amount >= 1, "earlier claim does not match its packet and user")
	}
	p := in.Packet
	expired := p.Status == StatusRefunded || in.NowMS >= p.ExpiresMS
	first := make(map[string]int, len(in.Reqs)) // act_id -> index of its first request
	for i, rq := range in.Reqs {
		if j, dup := first[rq.ActID]; dup {
			out.Results[i] = out.Results[j]
			if out.Results[i].Err == nil {
				out.Results[i].Repeat = true
			}
			continue
		}
		first[rq.ActID] = i
		switch c, ok := in.Earlier[rq.ActID]; {
		case ok:
			out.Results[i] = OpenResult{Claim: c, Repeat: true}
		case p.RemainingCount == 0 && p.Status != StatusRefunded:
			out.Results[i] = OpenResult{Err: ErrSoldOut}
		case expired:
			out.Results[i] = OpenResult{Err: ErrExpired}
		default:
			c := takeShare(&p, rq.ActID, in.NowMS, in.Rand)
			out.Fresh = append(out.Fresh, c)
			out.Credits = append(out.Credits, Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: rq.Shard, Amount: c.Amount, CreatedMS: c.CreatedMS})
			out.Results[i] = OpenResult{Claim: c}
		}
	}
	if len(out.Fresh) > 0 && p.RemainingCount == 0 {
		invariant.That(p.RemainingAmount == 0, "sold-out packet kept money")
		p.Status = StatusSoldOut
	}
	out.Packet = p
	checkOpen(in, out)
	return out
}

// takeShare draws the next share of the open packet p for actID and takes it
// out of p.
func takeShare(p *Packet, actID string, nowMS int64, r *rand.Rand) Claim {
	var share Cents
	if p.Kind == KindFixed {
		share = FixedShare(p.Amount, p.Count)
	} else {
		share = SplitNext(p.RemainingAmount, p.RemainingCount, r)
	}
	seq := p.Count - p.RemainingCount + 1
	p.RemainingAmount -= share
	p.RemainingCount--
	invariant.That(p.RemainingAmount >= Cents(p.RemainingCount), "packet remainder below a cent per share")
	return Claim{ID: ClaimID(p.ID, seq), PacketID: p.ID, Seq: seq, ActID: actID, Amount: share, CreatedMS: nowMS}
}

// checkPacket asserts that p is a packet row the rules can reach: counts and
// amounts in range, claimed money (Amount - RefundAmount - RemainingAmount)
// never negative, and a status that agrees with what is left.
func checkPacket(p Packet) {
	invariant.That(p.Amount >= 1 && p.Count >= 1 && Cents(p.Count) <= p.Amount, "packet amount or count out of range")
	invariant.That(p.RemainingCount >= 0 && p.RemainingCount <= p.Count, "packet remaining count out of range")
	invariant.That(p.RemainingAmount >= 0 && p.RefundAmount >= 0 && p.RemainingAmount+p.RefundAmount <= p.Amount,
		"packet remaining or refund out of range")
	invariant.That(p.Kind == KindRandom || p.Kind == KindFixed, "packet of unknown kind")
	switch p.Status {
	case StatusOpen:
		invariant.That(p.RemainingCount >= 1 && p.RemainingAmount >= Cents(p.RemainingCount) && p.RefundAmount == 0,
			"open packet without a cent per share left")
	case StatusSoldOut:
		invariant.That(p.RemainingCount == 0 && p.RemainingAmount == 0 && p.RefundAmount == 0, "sold-out packet with money left")
	case StatusRefunded:
		invariant.That(p.RemainingAmount == 0, "refunded packet with money left")
	default:
		invariant.That(false, "packet of unknown status")
	}
}

// checkOpen asserts Open's postconditions.
func checkOpen(in OpenInput, out OpenOutcome) {
	before, after := in.Packet, out.Packet
	checkPacket(after)
	invariant.That(len(out.Results) == len(in.Reqs) && len(out.Credits) == len(out.Fresh), "open answered another number of requests")
	var paid Cents
	seen := make(map[string]bool, len(out.Fresh))
	for i, c := range out.Fresh {
		invariant.That(c.Amount >= 1, "share below a cent")
		invariant.That(c.Seq == before.Count-before.RemainingCount+int64(i)+1, "claims out of seq order")
		_, held := in.Earlier[c.ActID]
		invariant.That(!held && !seen[c.ActID], "a second claim for one user")
		seen[c.ActID] = true
		cr := out.Credits[i]
		invariant.That(cr.ClaimID == c.ID && cr.ActID == c.ActID && cr.Amount == c.Amount, "credit differs from its claim")
		paid += c.Amount
	}
	// The packet is conserved: what the new claims took left the remainder,
	// and nothing else moved.
	invariant.That(before.RemainingAmount-paid == after.RemainingAmount, "open must conserve the packet total")
	invariant.That(before.RemainingCount-int64(len(out.Fresh)) == after.RemainingCount, "open lost count of its shares")
	invariant.That(after.Amount == before.Amount && after.RefundAmount == before.RefundAmount, "open changed the packet's total or refund")
	for i, r := range out.Results {
		invariant.That((r.Err == nil) == (r.Claim.ID != ""), "open answer with neither or both of a claim and an error")
		invariant.That(r.Err != nil || r.Claim.ActID == in.Reqs[i].ActID, "open answered with another user's claim")
	}
}

// SendInput is what a send decision needs: the validated request (amount
// 1..MaxAmount, count 1..amount, a fixed amount divisible by count: the
// caller checks with Limits.CheckShares), the new packet's ID, the sender's
// balance as locked, and the times in Unix ms.
type SendInput struct {
	Req       SendRequest
	ID        PacketID
	Balance   Cents
	NowMS     int64
	ExpiresMS int64
}

// SendOutcome is what a send writes: the new packet row, the sender's flow
// row (Amount = -Req.Amount) and the sender's balance after.
type SendOutcome struct {
	Packet  Packet
	Flow    Flow
	Balance Cents
}

// Send debits the sender and creates the packet, open, with every share left.
// Errors: ErrInsufficientBalance when the balance is below the amount
// (nothing is to be written). A repeated order number is decided before, by
// ReplayOrder.
func Send(in SendInput) (SendOutcome, error) {
	r := in.Req
	invariant.That(r.Amount >= 1 && r.Count >= 1 && Cents(r.Count) <= r.Amount, "send of an unchecked amount or count")
	invariant.That(r.Kind == KindRandom || r.Kind == KindFixed && int64(r.Amount)%r.Count == 0, "send of an unchecked kind")
	invariant.That(in.Balance >= 0, "negative balance")
	if in.Balance < r.Amount {
		return SendOutcome{}, Errorf(ErrInsufficientBalance, "balance %d is below amount %d", in.Balance, r.Amount)
	}
	out := SendOutcome{
		Packet: Packet{ID: in.ID, Sender: r.Sender, OrderNo: r.OrderNo, Kind: r.Kind, Greeting: r.Greeting,
			Amount: r.Amount, Count: r.Count, RemainingAmount: r.Amount, RemainingCount: r.Count,
			Status: StatusOpen, CreatedMS: in.NowMS, ExpiresMS: in.ExpiresMS},
		Balance: in.Balance - r.Amount,
	}
	out.Flow = Flow{ActID: r.Sender, OrderNo: r.OrderNo, Kind: FlowSend, Amount: -r.Amount, BalanceAfter: out.Balance,
		BalanceKnown: true, Ref: string(in.ID), ReqHash: SendHash(r), CreatedMS: in.NowMS}
	invariant.That(out.Balance >= 0 && out.Balance+r.Amount == in.Balance, "send must move exactly its amount")
	checkPacket(out.Packet)
	return out, nil
}

// DepositInput is a validated deposit (Amount >= 1) into ActID's wallet,
// whose balance the store locked.
type DepositInput struct {
	ActID   string
	OrderNo string
	Amount  Cents
	Balance Cents
	NowMS   int64
}

// DepositOutcome is what a deposit writes: its flow row and the answer (the
// balance after; Repeat false: a repeat is decided before, by ReplayOrder).
type DepositOutcome struct {
	Deposit Deposit
	Flow    Flow
}

// ApplyDeposit credits a deposit to a wallet. (Deposit names the answer type,
// so the decision is ApplyDeposit.) Errors: ErrInvalidArgument when the
// balance would pass the largest amount a wallet can hold (math.MaxInt64).
func ApplyDeposit(in DepositInput) (DepositOutcome, error) {
	invariant.That(in.Amount >= 1, "deposit of an unchecked amount")
	invariant.That(in.Balance >= 0, "negative balance")
	if in.Balance > Cents(math.MaxInt64)-in.Amount {
		return DepositOutcome{}, Invalidf("a deposit of %d would pass the largest balance", in.Amount)
	}
	after := in.Balance + in.Amount
	out := DepositOutcome{
		Deposit: Deposit{ActID: in.ActID, OrderNo: in.OrderNo, Amount: in.Amount, Balance: after},
		Flow: Flow{ActID: in.ActID, OrderNo: in.OrderNo, Kind: FlowDeposit, Amount: in.Amount, BalanceAfter: after,
			BalanceKnown: true, ReqHash: DepositHash(in.Amount), CreatedMS: in.NowMS},
	}
	invariant.That(after > in.Balance, "deposit must raise the balance")
	return out, nil
}

// RefundOutcome is what a refund writes when Due: the packet after (status
// refunded, RefundAmount = the remainder it held, RemainingAmount 0,
// RemainingCount unchanged: those shares were never claimed) and the sender's
// flow row under RefundOrderNo. Amount is the cents going back (0 when not due).
type RefundOutcome struct {
	Due    bool
	Amount Cents
	Packet Packet
	Flow   Flow
}

// Refund decides the refund of packet p at nowMS: due only when p is open and
// expired (nowMS >= ExpiresMS); then its exact remainder goes back to its
// sender. A packet sold out or already refunded is never refunded (again):
// the outcome is not Due and Packet is p unchanged.
func Refund(p Packet, nowMS int64) RefundOutcome {
	checkPacket(p)
	if p.Status != StatusOpen || nowMS < p.ExpiresMS {
		return RefundOutcome{Packet: p}
	}
	after := p
	after.RefundAmount, after.RemainingAmount, after.Status = p.RemainingAmount, 0, StatusRefunded
	out := RefundOutcome{Due: true, Amount: p.RemainingAmount, Packet: after,
		Flow: Flow{ActID: p.Sender, OrderNo: RefundOrderNo(p.ID), Kind: FlowRefund, Amount: p.RemainingAmount,
			Ref: string(p.ID), CreatedMS: nowMS}}
	checkPacket(after)
	invariant.That(out.Amount >= 1 && out.Amount == p.RemainingAmount, "refund must be the exact remainder")
	invariant.That(after.Amount-after.RefundAmount-after.RemainingAmount == p.Amount-p.RemainingAmount,
		"refund changed what was claimed")
	return out
}

// CreditInput is a claim to book into its claimant's wallet; Booked tells
// whether a flow under CreditOrderNo(ClaimID) already exists in that wallet.
// (The MySQL store learns it from its INSERT: the UNIQUE order number makes
// the insert a no-op.)
type CreditInput struct {
	Credit Credit
	Booked bool
	NowMS  int64
}

// CreditOutcome: Applied when the credit is to be booked now, with its flow
// row (Amount = the claim's amount, added to the balance without reading it).
type CreditOutcome struct {
	Applied bool
	Flow    Flow
}

// ApplyCredit books a claim at most once under CreditOrderNo(claim ID): a
// booked credit changes nothing. (Credit names the row type, so the decision
// is ApplyCredit.) It asserts a claimant and at least a cent before, and
// after (checkCredit) that it books exactly when not booked, the claim's
// cents and nothing else.
func ApplyCredit(in CreditInput) CreditOutcome {
	c := in.Credit
	invariant.That(c.Amount >= 1 && c.ActID != "" && c.ClaimID != "", "credit without claimant or amount")
	if in.Booked {
		return CreditOutcome{}
	}
	out := CreditOutcome{Applied: true, Flow: Flow{ActID: c.ActID, OrderNo: CreditOrderNo(c.ClaimID), Kind: FlowCredit,
		Amount: c.Amount, Ref: string(c.PacketID), CreatedMS: in.NowMS}}
	checkCredit(in, out)
	return out
}

// checkCredit asserts ApplyCredit's postconditions: a credit is booked once
// (applied only when no flow holds it yet: CreditInput.Booked), and what it
// books is the claim's cents, into the claimant's wallet.
func checkCredit(in CreditInput, out CreditOutcome) {
	invariant.That(out.Applied != in.Booked, "a credit booked twice or not at all (a claim is booked once: CreditInput.Booked)")
	invariant.That(out.Flow.Kind == FlowCredit && out.Flow.Amount == in.Credit.Amount && out.Flow.ActID == in.Credit.ActID,
		"credit flow must book exactly its claim's cents to its claimant (ApplyCredit)")
}
