package storagetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractSendDebitsAndCreates", contractSendDebitsAndCreates)
	register("ContractSendIdempotent", contractSendIdempotent)
	register("ContractSendInsufficientBalance", contractSendInsufficientBalance)
	register("ContractNotFound", contractNotFound)
	register("ContractOpenOneClaimPerUser", contractOpenOneClaimPerUser)
	register("ContractOpenSoldOut", contractOpenSoldOut)
	register("ContractOpenExpired", contractOpenExpired)
	register("ContractOpenConcurrent", contractOpenConcurrent)
	register("ContractRefundRemainderOnce", contractRefundRemainderOnce)
	register("ContractExpiredIn", contractExpiredIn)
}

// Send debits the sender by the amount and creates the packet, open with
// every share left, created at the store's clock, in one step.
func contractSendDebitsAndCreates(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	req := model.SendRequest{Sender: "ann", Amount: 600, Count: 3, Kind: model.KindFixed, Greeting: "恭喜发财", OrderNo: "s1"}
	p, ref := f.send(sA, req, time.Hour)
	want := model.Packet{ID: ref.ID, Sender: "ann", OrderNo: "s1", Kind: model.KindFixed, Greeting: "恭喜发财", Amount: 600, Count: 3,
		RemainingAmount: 600, RemainingCount: 3, Status: model.StatusOpen, CreatedMS: f.nowMS(), ExpiresMS: f.nowMS() + time.Hour.Milliseconds()}
	if p != want {
		t.Fatalf("send answered %+v, want %+v", p, want)
	}
	if got := f.packet(ref); got != want {
		t.Fatalf("packet reads %+v, want %+v", got, want)
	}
	if ref.Shard != sA || ref.Day != 14 {
		t.Fatalf("packet %s in shard %d day %d", ref.ID, ref.Shard, ref.Day)
	}
	if b := f.balance(sA, "ann"); b != 400 {
		t.Fatalf("sender's balance %d, want 400", b)
	}
	f.check(books{deposits: 1000, balances: 400, open: 600, sends: 600, packets: 1})
}

// A send repeated under its order number answers the first packet (as it is
// now) with repeat set, whatever packet ID and expiry the retry carries, and
// moves no money; the same order number with any other kind, amount, count or
// greeting is ORDER_CONFLICT.
func contractSendIdempotent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	req := sendReq("ann", "s1", 500, 5)
	first, ref := f.send(sA, req, time.Hour)
	f.open(ref, 1, opener("bob", sB))
	now := f.packet(ref)
	f.h.Clock.Advance(time.Second)
	again, repeat, err := storage.Send(f.ctx, f.s, sA, req, model.NewPacketID(sA, f.h.Clock.Now()), f.nowMS()+5000)
	if err != nil || !repeat || again != now || again.ID != first.ID {
		t.Fatalf("repeat: %+v repeat %v %v; want %+v", again, repeat, err, now)
	}
	for _, other := range []model.SendRequest{
		{Sender: "ann", Amount: 501, Count: 5, Kind: model.KindRandom, Greeting: "hi", OrderNo: "s1"},
		{Sender: "ann", Amount: 500, Count: 4, Kind: model.KindRandom, Greeting: "hi", OrderNo: "s1"},
		{Sender: "ann", Amount: 500, Count: 5, Kind: model.KindFixed, Greeting: "hi", OrderNo: "s1"},
		{Sender: "ann", Amount: 500, Count: 5, Kind: model.KindRandom, Greeting: "ho", OrderNo: "s1"},
	} {
		_, _, err := storage.Send(f.ctx, f.s, sA, other, model.NewPacketID(sA, f.h.Clock.Now()), f.nowMS()+5000)
		wantCode(t, fmt.Sprintf("send %+v under a used order number", other), err, model.ErrOrderConflict)
	}
	if b := f.balance(sA, "ann"); b != 500 {
		t.Fatalf("sender's balance %d, want 500", b)
	}
	f.check(books{deposits: 1000, balances: 500, open: now.RemainingAmount, inFlight: 500 - now.RemainingAmount,
		sends: 500, packets: 1, claims: 1})
}

// A sender short of the amount gets INSUFFICIENT_BALANCE and nothing is
// written: no packet, no flow; the order number stays free, so the same
// order succeeds once the money is there.
func contractSendInsufficientBalance(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	id := model.NewPacketID(sA, f.h.Clock.Now())
	ref, _ := model.ParsePacketID(string(id))
	_, _, err := storage.Send(f.ctx, f.s, sA, sendReq("ann", "s1", 100, 1), id, f.nowMS()+1000)
	wantCode(t, "send from an untouched account", err, model.ErrInsufficientBalance)
	f.deposit(sA, "ann", "d1", 99)
	_, _, err = storage.Send(f.ctx, f.s, sA, sendReq("ann", "s1", 100, 1), id, f.nowMS()+1000)
	wantCode(t, "send of 100 from 99", err, model.ErrInsufficientBalance)
	_, err = storage.Packet(f.ctx, f.s, ref)
	wantCode(t, "packet of a refused send", err, model.ErrNotFound)
	f.check(books{deposits: 99, balances: 99})
	f.deposit(sA, "ann", "d2", 1)
	p, repeat, err := storage.Send(f.ctx, f.s, sA, sendReq("ann", "s1", 100, 1), id, f.nowMS()+1000)
	if err != nil || repeat || p.ID != id || p.Amount != 100 {
		t.Fatalf("send once the money is there: %+v repeat %v %v", p, repeat, err)
	}
	if b := f.balance(sA, "ann"); b != 0 {
		t.Fatalf("balance %d after sending it all", b)
	}
	f.check(books{deposits: 100, open: 100, sends: 100, packets: 1})
}

// Reads of a packet that does not exist are NOT_FOUND (Packet, Refund, each
// request of OpenBatch), or empty (Claims, ClaimsOf), in a day whose tables
// exist and in one whose do not.
func contractNotFound(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 10)
	f.send(sA, sendReq("ann", "s1", 10, 1), time.Hour) // day 14 exists now
	for _, day := range []time.Time{Start, Start.AddDate(0, 0, 3)} {
		id := model.NewPacketID(sA, day)
		ref, err := model.ParsePacketID(string(id))
		if err != nil {
			t.Fatal(err)
		}
		_, err = storage.Packet(f.ctx, f.s, ref)
		wantCode(t, "packet", err, model.ErrNotFound)
		_, err = storage.Refund(f.ctx, f.s, ref)
		wantCode(t, "refund", err, model.ErrNotFound)
		res, p, err := storage.OpenBatch(f.ctx, f.s, ref, []model.OpenRequest{opener("bob", sB), opener("cy", sC)}, rand.New(rand.NewPCG(1, 1)))
		if err != nil || len(res) != 2 || p != (model.Packet{}) {
			t.Fatalf("open of a missing packet: %s packet %+v, %v", describe(res), p, err)
		}
		for i, r := range res {
			wantCode(t, fmt.Sprintf("open %d of a missing packet", i), r.Err, model.ErrNotFound)
		}
		cs, err := storage.Claims(f.ctx, f.s, ref, 0, 10)
		if err != nil || len(cs) != 0 {
			t.Fatalf("claims of a missing packet: %v, %v", cs, err)
		}
		held, err := storage.ClaimsOf(f.ctx, f.s, ref, []model.OpenRequest{opener("bob", sB)})
		if err != nil || len(held) != 0 {
			t.Fatalf("claims-of of a missing packet: %v, %v", held, err)
		}
	}
	f.check(books{deposits: 10, open: 10, sends: 10, packets: 1})
}

// OpenBatch gives each user at most one claim on a packet: a user listed
// twice in a batch gets one claim (the later answer repeats it), a user who
// claimed before gets the earlier claim back with Repeat set. New claims take
// seq 1, 2, ... in request order, each share the next double-mean draw from
// the batch's seed taken from r (model.TakeDrawSeed), created at the store's clock; each new claim is owed to the shard its
// request named (ClaimsAfter, the Ledger's ActShard), and no answer carries
// that shard or a Dest.
func contractOpenOneClaimPerUser(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	_, ref := f.send(sA, sendReq("ann", "s1", 1000, 4), time.Hour)
	f.h.Clock.Advance(time.Millisecond)
	res, p := f.open(ref, 7, opener("bob", sB), opener("cy", sC), opener("bob", sB))
	share := draws(1000, 4, 7, 2)
	bob := model.Claim{ID: model.ClaimID(ref.ID, 1), PacketID: ref.ID, Seq: 1, ActID: "bob", Amount: share[0], CreatedMS: f.nowMS()}
	cy := model.Claim{ID: model.ClaimID(ref.ID, 2), PacketID: ref.ID, Seq: 2, ActID: "cy", Amount: share[1], CreatedMS: f.nowMS()}
	if res[0] != (model.OpenResult{Claim: bob}) || res[1] != (model.OpenResult{Claim: cy}) || res[2] != (model.OpenResult{Claim: bob, Repeat: true}) {
		t.Fatalf("first batch: %s; want bob %+v, cy %+v", describe(res), bob, cy)
	}
	left := 1000 - share[0] - share[1]
	if p.RemainingAmount != left || p.RemainingCount != 2 || p.Status != model.StatusOpen || p != f.packet(ref) {
		t.Fatalf("packet after the batch %+v, reads %+v; want %d in 2", p, f.packet(ref), left)
	}
	f.check(books{deposits: 1000, open: left, inFlight: 1000 - left, sends: 1000, packets: 1, claims: 2})

	f.h.Clock.Advance(time.Millisecond)
	res, p = f.open(ref, 8, opener("cy", sC), opener("dee", sA))
	dee := model.Claim{ID: model.ClaimID(ref.ID, 3), PacketID: ref.ID, Seq: 3, ActID: "dee", Amount: draws(left, 2, 8, 1)[0], CreatedMS: f.nowMS()}
	if res[0] != (model.OpenResult{Claim: cy, Repeat: true}) || res[1] != (model.OpenResult{Claim: dee}) {
		t.Fatalf("second batch: %s; want cy again, dee %+v", describe(res), dee)
	}
	left -= dee.Amount
	if p.RemainingAmount != left || p.RemainingCount != 1 {
		t.Fatalf("packet after the second batch: %+v", p)
	}

	all, err := storage.Claims(f.ctx, f.s, ref, 0, 10)
	if err != nil || !slices.Equal(all, []model.Claim{bob, cy, dee}) {
		t.Fatalf("claims: %+v, %v", all, err)
	}
	page, err := storage.Claims(f.ctx, f.s, ref, 1, 1)
	if err != nil || !slices.Equal(page, []model.Claim{cy}) {
		t.Fatalf("claims after seq 1, limit 1: %+v, %v", page, err)
	}
	held, err := storage.ClaimsOf(f.ctx, f.s, ref, []model.OpenRequest{opener("dee", sA), opener("zed", sA), opener("bob", sB)})
	if err != nil || len(held) != 2 || held["dee"] != dee || held["bob"] != bob {
		t.Fatalf("claims-of: %+v, %v", held, err)
	}
	l := f.check(books{deposits: 1000, open: left, inFlight: 1000 - left, sends: 1000, packets: 1, claims: 3})
	if got, want := f.owed(sA.DB(), 10), []model.Credit{creditOf(bob, sB), creditOf(cy, sC), creditOf(dee, sA)}; !slices.Equal(got, want) {
		t.Fatalf("claims after: %+v, want %+v", got, want)
	}
	for _, c := range []struct {
		claim model.Claim
		shard model.ShardID
	}{{bob, sB}, {cy, sC}, {dee, sA}} {
		lc := l.Claims[c.claim.ID]
		if lc.ID != c.claim.ID || lc.PacketID != ref.ID || lc.Seq != c.claim.Seq || lc.ActID != c.claim.ActID || lc.Amount != c.claim.Amount ||
			lc.ActShard != c.shard || lc.Dest != "" {
			t.Fatalf("ledger claim %+v, want %+v", lc, c.claim)
		}
	}
}

// A packet whose last share is taken is sold out: later new users get
// SOLD_OUT (before and after its expiry), earlier claimants their claim, and
// it is never refunded.
func contractOpenSoldOut(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 300)
	_, ref := f.send(sA, model.SendRequest{Sender: "ann", Amount: 300, Count: 3, Kind: model.KindFixed, OrderNo: "s1"}, time.Minute)
	res, p := f.open(ref, 1, opener("b1", sB), opener("b2", sB), opener("b3", sC), opener("b4", sC))
	for i := 0; i < 3; i++ {
		if res[i].Err != nil || res[i].Claim.Amount != 100 || res[i].Claim.Seq != int64(i+1) || res[i].Repeat {
			t.Fatalf("fixed share %d: %s", i, describe(res))
		}
	}
	wantCode(t, "fourth open of three shares", res[3].Err, model.ErrSoldOut)
	if p.Status != model.StatusSoldOut || p.RemainingAmount != 0 || p.RemainingCount != 0 || f.packet(ref) != p {
		t.Fatalf("sold-out packet: %+v", p)
	}
	for _, at := range []time.Duration{0, time.Hour} {
		f.h.Clock.Advance(at)
		res, _ = f.open(ref, 1, opener("b5", sA), opener("b2", sB))
		wantCode(t, "open of a sold-out packet", res[0].Err, model.ErrSoldOut)
		if res[1].Err != nil || !res[1].Repeat || res[1].Claim.Seq != 2 {
			t.Fatalf("earlier claimant of a sold-out packet: %s", describe(res))
		}
	}
	if c := f.refund(ref); c != 0 {
		t.Fatalf("refund of a sold-out packet: %d", c)
	}
	if p := f.packet(ref); p.Status != model.StatusSoldOut || p.RefundAmount != 0 {
		t.Fatalf("after refund: %+v", p)
	}
	f.check(books{deposits: 300, inFlight: 300, sends: 300, packets: 1, claims: 3})
}

// A packet is expired from its ExpiresMS on (now >= ExpiresMS): one
// millisecond before, a new user still claims; at it, new users get EXPIRED
// while earlier claimants get their claim.
func contractOpenExpired(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 100)
	p, ref := f.send(sA, sendReq("ann", "s1", 100, 10), time.Hour)
	f.h.Clock.Set(time.UnixMilli(p.ExpiresMS - 1))
	res, _ := f.open(ref, 3, opener("bob", sB))
	if res[0].Err != nil || res[0].Claim.CreatedMS != p.ExpiresMS-1 {
		t.Fatalf("open a millisecond before expiry: %s", describe(res))
	}
	f.h.Clock.Advance(time.Millisecond)
	res, after := f.open(ref, 3, opener("cy", sC), opener("bob", sB))
	wantCode(t, "open at expiry", res[0].Err, model.ErrExpired)
	if res[1].Err != nil || !res[1].Repeat || res[1].Claim.ActID != "bob" {
		t.Fatalf("earlier claimant after expiry: %s", describe(res))
	}
	if after.RemainingCount != 9 || after.Status != model.StatusOpen {
		t.Fatalf("expired, not yet refunded packet: %+v", after)
	}
	bob := res[1].Claim.Amount
	f.check(books{deposits: 100, open: 100 - bob, inFlight: bob, sends: 100, packets: 1, claims: 1})
}

// Concurrent batches on one packet never give out more shares or cents than
// it holds: of 12 users in 4 concurrent batches on 5 shares, exactly 5 get a
// claim, the others SOLD_OUT, and the claims sum to the amount.
func contractOpenConcurrent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 500)
	_, ref := f.send(sA, sendReq("ann", "s1", 500, 5), time.Hour)
	var mu sync.Mutex
	var got []model.OpenResult
	var wg sync.WaitGroup
	for b := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var reqs []model.OpenRequest
			for u := range 3 {
				reqs = append(reqs, opener(fmt.Sprintf("u%d-%d", b, u), sB))
			}
			res, _, err := storage.OpenBatch(f.ctx, f.s, ref, reqs, rand.New(rand.NewPCG(uint64(b), 9)))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, res...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var paid model.Cents
	claimed, soldOut := 0, 0
	seqs := map[int64]bool{}
	for _, r := range got {
		switch {
		case r.Err == nil && !r.Repeat && !seqs[r.Claim.Seq]:
			claimed++
			paid += r.Claim.Amount
			seqs[r.Claim.Seq] = true
		case errors.Is(r.Err, model.ErrSoldOut):
			soldOut++
		default:
			t.Fatalf("unexpected answer %+v", r)
		}
	}
	if claimed != 5 || soldOut != 7 || paid != 500 {
		t.Fatalf("%d claims of %d cents, %d sold out; want 5 of 500, 7", claimed, paid, soldOut)
	}
	f.check(books{deposits: 500, inFlight: 500, sends: 500, packets: 1, claims: 5})
}

// Refund gives an expired, open packet's exact remainder back to its sender,
// once: before expiry it does nothing (0), at expiry it moves the remainder
// and marks the packet refunded (RefundAmount = remainder, RemainingAmount 0,
// RemainingCount as it was), and every later call answers 0.
func contractRefundRemainderOnce(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	p, ref := f.send(sA, sendReq("ann", "s1", 1000, 5), time.Hour)
	res, _ := f.open(ref, 5, opener("bob", sB), opener("cy", sC))
	claimed := res[0].Claim.Amount + res[1].Claim.Amount
	left := 1000 - claimed
	f.h.Clock.Set(time.UnixMilli(p.ExpiresMS - 1))
	if c := f.refund(ref); c != 0 {
		t.Fatalf("refund before expiry: %d", c)
	}
	f.check(books{deposits: 1000, open: left, inFlight: claimed, sends: 1000, packets: 1, claims: 2})
	f.h.Clock.Advance(time.Millisecond)
	if c := f.refund(ref); c != left {
		t.Fatalf("refund at expiry: %d, want the remainder %d", c, left)
	}
	want := p
	want.RemainingAmount, want.RemainingCount, want.RefundAmount, want.Status = 0, 3, left, model.StatusRefunded
	if got := f.packet(ref); got != want {
		t.Fatalf("refunded packet %+v, want %+v", got, want)
	}
	if b := f.balance(sA, "ann"); b != left {
		t.Fatalf("sender's balance %d, want %d", b, left)
	}
	f.check(books{deposits: 1000, balances: left, inFlight: claimed, sends: 1000, refunds: left, packets: 1, claims: 2})
	f.h.Clock.Advance(time.Hour)
	if c := f.refund(ref); c != 0 {
		t.Fatalf("second refund: %d", c)
	}
	res, _ = f.open(ref, 5, opener("dee", sA))
	wantCode(t, "open of a refunded packet", res[0].Err, model.ErrExpired)
	f.check(books{deposits: 1000, balances: left, inFlight: claimed, sends: 1000, refunds: left, packets: 1, claims: 2})
}

// ExpiredIn lists the open packets with ExpiresMS <= nowMS of exactly the
// shards and days asked, at most limit of them (in no promised order); sold
// out and refunded packets are not listed.
func contractExpiredIn(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	f.deposit(sA, "ann", "d1", 1000)
	f.deposit(sB, "bob", "d1", 1000)
	_, a14 := f.send(sA, sendReq("ann", "s1", 10, 2), time.Hour)   // day 14, expires 11:00
	_, b14 := f.send(sB, sendReq("bob", "s1", 10, 2), 2*time.Hour) // day 14, expires 12:00
	_, sold := f.send(sA, sendReq("ann", "s2", 10, 1), time.Hour)  // sold out below
	f.open(sold, 1, opener("cy", sC))
	f.h.Clock.Advance(24 * time.Hour)
	_, a15 := f.send(sA, sendReq("ann", "s3", 10, 2), time.Hour) // day 15, expires 11:00 next day
	_, gone := f.send(sA, sendReq("ann", "s4", 10, 2), time.Minute)
	f.h.Clock.Advance(time.Minute)
	if c := f.refund(gone); c != 10 {
		t.Fatalf("refund: %d", c)
	}
	both := []model.ShardID{sA, sB}
	for _, c := range []struct {
		shards []model.ShardID
		days   []int
		now    time.Time
		want   []model.PacketID
	}{
		{both, []int{14, 15}, Start.Add(time.Hour - time.Millisecond), nil},
		{both, []int{14, 15}, Start.Add(time.Hour), []model.PacketID{a14.ID}},
		{both, []int{14, 15}, Start.Add(2 * time.Hour), []model.PacketID{a14.ID, b14.ID}},
		{[]model.ShardID{sB}, []int{14, 15}, Start.Add(48 * time.Hour), []model.PacketID{b14.ID}},
		{both, []int{15}, Start.Add(48 * time.Hour), []model.PacketID{a15.ID}},
		{both, []int{14, 15}, Start.Add(48 * time.Hour), []model.PacketID{a14.ID, b14.ID, a15.ID}},
		{[]model.ShardID{sC}, []int{14, 15}, Start.Add(48 * time.Hour), nil},
		{both, []int{16}, Start.Add(48 * time.Hour), nil},
	} {
		got, err := storage.ExpiredIn(f.ctx, f.s, c.shards, c.days, c.now.UnixMilli(), 100)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Fatalf("expired in shards %v days %v at %v: %v, want %v", c.shards, c.days, c.now, got, c.want)
		}
	}
	got, err := storage.ExpiredIn(f.ctx, f.s, both, []int{14, 15}, Start.Add(48*time.Hour).UnixMilli(), 2)
	if err != nil || len(got) != 2 {
		t.Fatalf("limit 2 of 3: %v, %v", got, err)
	}
	for _, id := range got {
		if id != a14.ID && id != b14.ID && id != a15.ID {
			t.Fatalf("limit 2 listed %s", id)
		}
	}
	f.check(books{deposits: 2000, balances: 1960, open: 30, inFlight: 10, sends: 50, refunds: 10, packets: 5, claims: 1})
}
