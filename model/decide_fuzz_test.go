package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// The fuzz targets of the money decisions. Each drives a decision directly,
// keeps the books the decision's outcomes imply (the rows a store would write)
// and asserts the money rules on them after every call, not only that nothing
// panicked.

// fuzzPacket turns fuzz input into a packet Send accepts (amount 1..100,000,
// count 1..min(amount, 300), a fixed amount divisible by its count), sent
// from a balance of exactly its amount.
func fuzzPacket(t *testing.T, amount, count int64, fixed bool, expiresMS int64) Packet {
	amount = 1 + abs64(amount)%100_000
	count = 1 + abs64(count)%min(amount, 300)
	kind := KindRandom
	if fixed {
		kind = KindFixed
		amount -= amount % count
	}
	req := SendRequest{Sender: "sender", Amount: Cents(amount), Count: count, Kind: kind, OrderNo: "snd"}
	out, err := Send(SendInput{Req: req, ID: testPacketID, Balance: Cents(amount), NowMS: 0, ExpiresMS: expiresMS})
	if err != nil || out.Balance != 0 {
		t.Fatalf("send of %d in %d from a balance of %d: %+v %v", amount, count, amount, out, err)
	}
	return out.Packet
}

func abs64(v int64) int64 {
	if v < 0 {
		if v == math.MinInt64 {
			return math.MaxInt64
		}
		return -v
	}
	return v
}

// openBooks is what a store holds of one packet: the row and its claims.
type openBooks struct {
	p      Packet
	claims map[string]Claim // by act_id
}

// open runs one batch against the books, checks every answer against them
// and applies the outcome as a store would.
func (b *openBooks) open(t *testing.T, batch []OpenRequest, nowMS int64, r *rand.Rand) OpenOutcome {
	before := b.p
	out := Open(OpenInput{Packet: b.p, Found: true, Earlier: b.claims, Reqs: batch, NowMS: nowMS, Rand: r})
	expired := before.Status == StatusRefunded || nowMS >= before.ExpiresMS
	fresh := 0
	firstOf := map[string]int{}
	for i, rq := range batch {
		res := out.Results[i]
		held, had := b.claims[rq.ActID]
		j, dup := firstOf[rq.ActID]
		switch {
		case had:
			if !res.Repeat || res.Claim != held || res.Err != nil {
				t.Fatalf("user %s holding %+v got %+v", rq.ActID, held, res)
			}
		case dup:
			if res.Claim != out.Results[j].Claim || res.Err != out.Results[j].Err || res.Repeat != (res.Err == nil) {
				t.Fatalf("user %s listed twice: %+v then %+v", rq.ActID, out.Results[j], res)
			}
		case res.Err != nil:
			left := before.RemainingCount - int64(fresh)
			soldOut := left == 0 && before.Status != StatusRefunded
			if soldOut && !errors.Is(res.Err, ErrSoldOut) || !soldOut && (!expired || !errors.Is(res.Err, ErrExpired)) {
				t.Fatalf("user %s refused with %v (left %d, expired %v)", rq.ActID, res.Err, left, expired)
			}
		default:
			fresh++
			c := res.Claim
			if res.Repeat || c.ActID != rq.ActID || c.Amount < 1 || c.CreatedMS != nowMS || expired {
				t.Fatalf("user %s new claim %+v (expired %v)", rq.ActID, res, expired)
			}
		}
		if !dup {
			firstOf[rq.ActID] = i
		}
	}
	if len(out.Fresh) != fresh || len(out.Credits) != fresh {
		t.Fatalf("%d new answers, %d fresh claims, %d credits", fresh, len(out.Fresh), len(out.Credits))
	}
	for i, c := range out.Fresh {
		if _, dup := b.claims[c.ActID]; dup {
			t.Fatalf("second claim for %s", c.ActID)
		}
		if cr := out.Credits[i]; cr.ActID != c.ActID || cr.Amount != c.Amount || cr.ClaimID != c.ID || cr.Shard != batch[firstOf[c.ActID]].Shard {
			t.Fatalf("credit %+v of claim %+v", cr, c)
		}
		b.claims[c.ActID] = c
	}
	if fresh == 0 && out.Packet != before {
		t.Fatalf("a batch with no new claim changed the packet: %+v -> %+v", before, out.Packet)
	}
	b.p = out.Packet
	b.check(t)
	return out
}

// check asserts the packet's books: conservation, seq numbering 1..n, one
// claim per user, shares of at least a cent, a status that fits.
func (b *openBooks) check(t *testing.T) {
	p := b.p
	var paid Cents
	seqs := make(map[int64]bool, len(b.claims))
	for act, c := range b.claims {
		if c.ActID != act || c.Amount < 1 || c.Seq < 1 || c.Seq > int64(len(b.claims)) || seqs[c.Seq] || c.ID != ClaimID(p.ID, c.Seq) {
			t.Fatalf("claim %+v of %d claims", c, len(b.claims))
		}
		seqs[c.Seq] = true
		paid += c.Amount
	}
	if paid+p.RefundAmount+p.RemainingAmount != p.Amount {
		t.Fatalf("claims %d + refund %d + remaining %d != amount %d", paid, p.RefundAmount, p.RemainingAmount, p.Amount)
	}
	if int64(len(b.claims))+p.RemainingCount != p.Count {
		t.Fatalf("%d claims + %d left != count %d", len(b.claims), p.RemainingCount, p.Count)
	}
	if p.Kind == KindFixed {
		for _, c := range b.claims {
			if c.Amount != p.Amount/Cents(p.Count) {
				t.Fatalf("fixed packet %d/%d gave %d", p.Amount, p.Count, c.Amount)
			}
		}
	}
	if (p.RemainingCount == 0) != (p.Status == StatusSoldOut) && p.Status != StatusRefunded {
		t.Fatalf("status %v with %d shares left", p.Status, p.RemainingCount)
	}
}

// FuzzOpen opens a packet over random batches (users drawn from a small set,
// so repeats and duplicates are common), refunds it if the clock passes its
// expiry, and otherwise opens it to sold out with new users; the books are
// checked after every batch and at the end.
func FuzzOpen(f *testing.F) {
	f.Add(uint64(1), int64(1000), int64(10), false, []byte{1, 2, 3, 1, 2, 4, 0, 5, 6, 7, 8, 9, 10}, uint8(0))
	f.Add(uint64(2), int64(3), int64(3), true, []byte{0, 0, 0}, uint8(2))
	f.Add(uint64(3), int64(99_999), int64(299), false, []byte{200, 17, 4, 4, 4, 90}, uint8(255))
	f.Add(uint64(4), int64(1), int64(1), false, []byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, seed uint64, amount, count int64, fixed bool, script []byte, expireAfter uint8) {
		const expiresMS = 1_000_000
		b := openBooks{p: fuzzPacket(t, amount, count, fixed, expiresMS), claims: map[string]Claim{}}
		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		now := int64(0)
		// Each script byte is one request; a byte with its top bit set also ends the batch.
		var batch []OpenRequest
		batches := 0
		for _, c := range script {
			batch = append(batch, OpenRequest{ActID: "u" + string(rune('a'+c%40)), Shard: ShardID(c) % ShardCount})
			if c&0x80 == 0 && len(batch) < 16 {
				continue
			}
			batches++
			if expireAfter > 0 && batches == int(expireAfter) {
				now = expiresMS // the clock reaches the expiry
			}
			b.open(t, batch, now, r)
			batch = batch[:0]
		}
		if len(batch) > 0 {
			b.open(t, batch, now, r)
		}
		if now >= expiresMS {
			left := b.p
			out := Refund(b.p, now)
			if out.Due != (left.Status == StatusOpen) || out.Amount != left.RemainingAmount {
				t.Fatalf("refund of %+v: %+v", left, out)
			}
			b.p = out.Packet
			b.check(t)
			if again := Refund(b.p, now+1); again.Due {
				t.Fatalf("refunded twice: %+v", again)
			}
			if res := b.open(t, []OpenRequest{{ActID: "late"}}, now, r).Results[0]; res.Err == nil {
				t.Fatalf("an expired packet paid out %+v", res)
			}
			return
		}
		// Sell it out with new users, a batch of up to 7 at a time.
		for i := 0; b.p.Status == StatusOpen; i++ {
			var more []OpenRequest
			for k := 0; k < 1+i%7; k++ {
				more = append(more, OpenRequest{ActID: "n" + string(rune('a'+i%26)) + string(rune('a'+k)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676)), Shard: ShardID(i)})
			}
			b.open(t, more, now, r)
		}
		if b.p.Status != StatusSoldOut || b.p.RemainingAmount != 0 || int64(len(b.claims)) != b.p.Count {
			t.Fatalf("not sold out: %+v with %d claims", b.p, len(b.claims))
		}
		if out := Refund(b.p, expiresMS); out.Due {
			t.Fatalf("a sold-out packet refunded: %+v", out)
		}
	})
}

// FuzzSend: a send succeeds exactly when the balance covers the amount, then
// moves exactly the amount from the balance into an open packet holding every
// share; otherwise it writes nothing.
func FuzzSend(f *testing.F) {
	f.Add(int64(1000), int64(1000), int64(10), false)
	f.Add(int64(999), int64(1000), int64(10), true)
	f.Add(int64(0), int64(1), int64(1), false)
	f.Add(int64(math.MaxInt64), int64(10_000_000), int64(10_000_000), true)
	f.Fuzz(func(t *testing.T, balance, amount, count int64, fixed bool) {
		lim := DefaultLimits()
		amount = 1 + abs64(amount)%int64(lim.MaxAmount)
		count = 1 + abs64(count)%min(amount, lim.MaxCount)
		kind := KindRandom
		if fixed {
			kind = KindFixed
			amount -= amount % count
		}
		if err := lim.CheckShares(Cents(amount), count); err != nil {
			t.Fatalf("fuzz input mapping made an invalid send: %v", err)
		}
		balance = abs64(balance)
		req := SendRequest{Sender: "s", Amount: Cents(amount), Count: count, Kind: kind, OrderNo: "o"}
		out, err := Send(SendInput{Req: req, ID: testPacketID, Balance: Cents(balance), NowMS: 7, ExpiresMS: 8})
		if balance < amount {
			if !errors.Is(err, ErrInsufficientBalance) || out != (SendOutcome{}) {
				t.Fatalf("balance %d, amount %d: %+v %v", balance, amount, out, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("balance %d, amount %d: %v", balance, amount, err)
		}
		p := out.Packet
		if out.Balance != Cents(balance-amount) || out.Balance < 0 || out.Flow.Amount != -Cents(amount) || out.Flow.BalanceAfter != out.Balance ||
			out.Flow.Kind != FlowSend || out.Flow.Ref != string(p.ID) || out.Flow.ReqHash != SendHash(req) {
			t.Fatalf("balance %d: %+v", balance, out)
		}
		if p.Amount != Cents(amount) || p.RemainingAmount != p.Amount || p.RemainingCount != count || p.Count != count ||
			p.RefundAmount != 0 || p.Status != StatusOpen || p.Kind != kind {
			t.Fatalf("packet %+v", p)
		}
		// A retry of the same send replays; the same order number for another send conflicts.
		if err := ReplayOrder(out.Flow, FlowSend, SendHash(req)); err != nil {
			t.Fatalf("replay: %v", err)
		}
		other := req
		other.Count = count%int64(amount) + 1
		if other.Count != count && !errors.Is(ReplayOrder(out.Flow, FlowSend, SendHash(other)), ErrOrderConflict) {
			t.Fatal("a different send under the same order number was taken as a retry")
		}
	})
}

// FuzzDeposit runs a series of deposits (the script's bytes pick the order
// number and amount) against one wallet, replaying any order number seen
// before as a store does: the balance is always the sum of the distinct
// orders applied, every flow's BalanceAfter is the running balance, and a
// repeat with another amount conflicts.
func FuzzDeposit(f *testing.F) {
	f.Add(int64(0), []byte{1, 2, 3, 1, 1, 4})
	f.Add(int64(math.MaxInt64-5), []byte{9})
	f.Add(int64(100), []byte{0, 0, 255, 128, 7})
	f.Fuzz(func(t *testing.T, start int64, script []byte) {
		balance := Cents(abs64(start))
		orders := map[string]Flow{}
		var flows Cents
		for i := 0; i+1 < len(script); i += 2 {
			order := "d" + string(rune('a'+script[i]%8))
			amount := Cents(1 + int64(script[i+1])*1_000_003)
			if prior, seen := orders[order]; seen {
				err := ReplayOrder(prior, FlowDeposit, DepositHash(amount))
				if (err == nil) != (prior.Amount == amount) || err != nil && !errors.Is(err, ErrOrderConflict) {
					t.Fatalf("order %s of %d replayed for %d: %v", order, prior.Amount, amount, err)
				}
				continue
			}
			out, err := ApplyDeposit(DepositInput{ActID: "a", OrderNo: order, Amount: amount, Balance: balance, NowMS: int64(i)})
			if balance > math.MaxInt64-amount {
				if !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("balance %d + %d overflowed: %+v %v", balance, amount, out, err)
				}
				continue
			}
			if err != nil || out.Deposit.Balance != balance+amount || out.Flow.BalanceAfter != out.Deposit.Balance ||
				out.Flow.Amount != amount || out.Flow.Kind != FlowDeposit || out.Flow.OrderNo != order || out.Deposit.Repeat {
				t.Fatalf("deposit %d onto %d: %+v %v", amount, balance, out, err)
			}
			balance = out.Deposit.Balance
			flows += amount
			orders[order] = out.Flow
		}
		if balance != Cents(abs64(start))+flows || balance < 0 {
			t.Fatalf("balance %d after %d of flows from %d", balance, flows, abs64(start))
		}
	})
}

// FuzzRefund claims part of a packet, then refunds it at a random time: due
// exactly when the packet is open and expired, then it returns the exact
// remainder, conserving the packet, and never again.
func FuzzRefund(f *testing.F) {
	f.Add(uint64(1), int64(1000), int64(10), false, uint8(3), int64(1_000_000))
	f.Add(uint64(2), int64(50), int64(5), true, uint8(5), int64(2_000_000))
	f.Add(uint64(3), int64(7), int64(7), false, uint8(0), int64(999_999))
	f.Fuzz(func(t *testing.T, seed uint64, amount, count int64, fixed bool, claims uint8, nowMS int64) {
		const expiresMS = 1_000_000
		b := openBooks{p: fuzzPacket(t, amount, count, fixed, expiresMS), claims: map[string]Claim{}}
		r := rand.New(rand.NewPCG(seed, 1))
		for i := 0; i < int(claims) && b.p.Status == StatusOpen; i++ {
			b.open(t, []OpenRequest{{ActID: "c" + string(rune('a'+i%26)) + string(rune('a'+i/26))}}, 0, r)
		}
		before := b.p
		out := Refund(b.p, nowMS)
		due := before.Status == StatusOpen && nowMS >= expiresMS
		if out.Due != due {
			t.Fatalf("refund of %+v at %d: due %v", before, nowMS, out.Due)
		}
		if !due {
			if out.Packet != before || out.Amount != 0 {
				t.Fatalf("refund not due changed %+v into %+v", before, out)
			}
			return
		}
		if out.Amount != before.RemainingAmount || out.Amount < 1 || out.Flow.Amount != out.Amount || out.Flow.ActID != before.Sender ||
			out.Flow.OrderNo != RefundOrderNo(before.ID) || out.Flow.Kind != FlowRefund || out.Packet.RemainingCount != before.RemainingCount {
			t.Fatalf("refund of %+v: %+v", before, out)
		}
		b.p = out.Packet
		b.check(t)
		if again := Refund(b.p, nowMS); again.Due || again.Amount != 0 {
			t.Fatalf("refunded twice: %+v", again)
		}
	})
}

// FuzzCredit delivers a stream of credits with repeats (the script picks the
// claim) to one wallet, deciding each with the set of order numbers booked
// so far: every claim is booked exactly once, so the balance is the sum of
// the distinct claims delivered.
func FuzzCredit(f *testing.F) {
	f.Add([]byte{1, 2, 1, 1, 3, 2})
	f.Add([]byte{0})
	f.Add([]byte{255, 254, 255, 0, 0, 0, 17})
	f.Fuzz(func(t *testing.T, script []byte) {
		booked := map[string]bool{}
		var balance, want Cents
		delivered := map[int64]bool{}
		for _, c := range script {
			seq := int64(c%32) + 1
			cr := Credit{ClaimID: ClaimID(testPacketID, seq), PacketID: testPacketID, ActID: "w", Shard: 3, Amount: Cents(seq * 7)}
			out := ApplyCredit(CreditInput{Credit: cr, Booked: booked[CreditOrderNo(cr.ClaimID)], NowMS: int64(c)})
			if out.Applied == delivered[seq] {
				t.Fatalf("claim %d delivered before: %v, applied now: %v", seq, delivered[seq], out.Applied)
			}
			if !out.Applied {
				continue
			}
			f := out.Flow
			if f.OrderNo != CreditOrderNo(cr.ClaimID) || f.Amount != cr.Amount || f.ActID != "w" || f.Kind != FlowCredit || f.BalanceKnown || f.Ref != string(testPacketID) {
				t.Fatalf("credit flow %+v of %+v", f, cr)
			}
			booked[f.OrderNo] = true
			balance += f.Amount
			delivered[seq] = true
			want += cr.Amount
		}
		if balance != want || len(booked) != len(delivered) {
			t.Fatalf("balance %d from %d booked, want %d from %d claims", balance, len(booked), want, len(delivered))
		}
	})
}
