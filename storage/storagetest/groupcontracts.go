package storagetest

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractGroupMatchesSingle", contractGroupMatchesSingle)
	register("ContractGroupOpFailures", contractGroupOpFailures)
	register("ContractGroupSameKey", contractGroupSameKey)
	register("ContractGroupCreditsAfterOtherOps", contractGroupCreditsAfterOtherOps)
	register("ContractGroupCreditsCountedPerOp", contractGroupCreditsCountedPerOp)
	register("ContractGroupEmpty", contractGroupEmpty)
	register("ContractGroupReplay", contractGroupReplay)
	register("ContractGroupCommitFault", contractGroupCommitFault)
	register("ContractGroupRefund", contractGroupRefund)
	register("ContractGroupWithdraw", contractGroupWithdraw)
	register("ContractGroupMoney", func(t *testing.T, newStore func(t *testing.T) Harness) {
		GroupMoney(t, newStore(t), newStore(t), GroupMoneyConfig{Ops: 600, Seed: GroupSeed(2), AuditEvery: 10})
	})
}

// A group of deposits, sends, opens and credits on different keys answers
// every op as its single-op method does, and writes the same rows.
func contractGroupMatchesSingle(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	p.commit("deposits", depositOp(sA, "ann", "d1", 1000), depositOp(sB, "bob", "d1", 500), depositOp(sC, "cy", "d1", 700))
	p.g.check(books{deposits: 2200, balances: 2200})
	id1, p1 := p.packetID(sA)
	id2, p2 := p.packetID(sC)
	ops := p.commit("sends", sendOp(sA, sendReq("ann", "s1", 300, 3), id1, exp),
		depositOp(sB, "bob", "d2", 25),
		sendOp(sC, model.SendRequest{Sender: "cy", Amount: 200, Count: 2, Kind: model.KindFixed, OrderNo: "s1"}, id2, exp))
	if ops[0].Packet.ID != id1 || ops[0].Repeat || ops[2].Packet.ID != id2 || ops[1].Deposit.Balance != 525 {
		t.Fatalf("sends answered %+v and %+v, deposit %+v", ops[0].Packet, ops[2].Packet, ops[1].Deposit)
	}
	p.g.check(books{deposits: 2225, balances: 1725, open: 500, sends: 500, packets: 2})
	p.advanceMS(10)
	id3, _ := p.packetID(sB)
	ops = p.commit("opens", openOp(p1, 1, opener("bob", sB), opener("dan", sC)),
		sendOp(sB, sendReq("bob", "s1", 100, 1), id3, exp),
		openOp(p2, 2, opener("ann", sA)),
		depositOp(sA, "ann", "d2", 5))
	wantResults(t, "open of p1", ops[0], []string{"", ""}, []bool{false, false})
	wantResults(t, "open of p2", ops[2], []string{""}, []bool{false})
	if ops[2].Results[0].Claim.Amount != 100 || ops[2].Packet.RemainingCount != 1 {
		t.Fatalf("open of a fixed packet: %s, packet %+v", describe(ops[2].Results), ops[2].Packet)
	}
	claimed := ops[0].Results[0].Claim.Amount + ops[0].Results[1].Claim.Amount + 100
	p.g.check(books{deposits: 2230, balances: 1630, open: 600 - claimed, inFlight: claimed, sends: 600, packets: 3, claims: 3})
	p.advanceMS(10)
	c12, c56 := p.g.owed(12, 100), p.g.owed(56, 100)
	want12 := []model.Credit{creditOf(ops[0].Results[0].Claim, sB), creditOf(ops[0].Results[1].Claim, sC)}
	if want56 := []model.Credit{creditOf(ops[2].Results[0].Claim, sA)}; !slices.Equal(c12, want12) || !slices.Equal(c56, want56) {
		t.Fatalf("claims after: %+v in db 12, %+v in db 56; want %+v and %+v", c12, c56, want12, want56)
	}
	ops = p.commit("credits", creditsOp(c12...), depositOp(sC, "cy", "d2", 1), creditsOp(c56...))
	if ops[0].Applied != 2 || ops[2].Applied != 1 {
		t.Fatalf("credits applied %d and %d, want 2 and 1", ops[0].Applied, ops[2].Applied)
	}
	p.g.check(books{deposits: 2231, balances: 1631 + claimed, open: 600 - claimed, sends: 600, packets: 3, claims: 3, credits: 3})
}

// Refunds in a group answer as Refund does, in list order with the ops
// around them: the exact remainder of an expired packet to its sender's
// wallet once (a second refund of it in the group, one of a packet not
// expired and one of a sold-out packet refund nothing), NOT_FOUND for a
// packet that does not exist, an open of the expired packet EXPIRED, and
// the sender's deposits before and after see the balance in that order.
func contractGroupRefund(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	p.commit("setup", depositOp(sA, "ann", "d1", 1000))
	id1, p1 := p.packetID(sA)
	id2, p2 := p.packetID(sA)
	id3, p3 := p.packetID(sA)
	now := p.nowMS()
	p.commit("sends", sendOp(sA, sendReq("ann", "s1", 300, 3), id1, now+100), sendOp(sA, sendReq("ann", "s2", 200, 2), id2, now+3_600_000),
		sendOp(sA, model.SendRequest{Sender: "ann", Amount: 10, Count: 1, Kind: model.KindFixed, OrderNo: "s3"}, id3, now+100))
	opened := p.commit("opens", openOp(p1, 1, opener("bob", sB)), openOp(p3, 2, opener("cy", sC)))
	left := 300 - opened[0].Results[0].Claim.Amount
	p.advanceMS(200)
	_, missing := p.packetID(sB)
	ops := p.commit("refunds",
		depositOp(sA, "ann", "d2", 5),    // 0: 1000 - 510 + 5
		openOp(p1, 3, opener("dan", sC)), // 1: EXPIRED
		refundOp(p1),                     // 2: the remainder
		refundOp(p1),                     // 3: refunded before: nothing
		refundOp(p2),                     // 4: not expired: nothing
		refundOp(p3),                     // 5: sold out: nothing
		refundOp(missing),                // 6: NOT_FOUND
		depositOp(sA, "ann", "d3", 1),    // 7: sees the refund
	)
	wantResults(t, "open of the expired packet", ops[1], []string{model.ErrExpired.Code}, []bool{false})
	if q := ops[2].Packet; ops[2].Refunded != left || q.Status != model.StatusRefunded || q.RefundAmount != left || q.RemainingAmount != 0 {
		t.Fatalf("refund of the expired packet: %d cents, packet %+v; want %d", ops[2].Refunded, q, left)
	}
	for i, what := range map[int]string{3: "a second refund", 4: "a packet not expired", 5: "a sold-out packet"} {
		if ops[i].Err != nil || ops[i].Refunded != 0 {
			t.Fatalf("refund of %s: %d cents, %v; want nothing", what, ops[i].Refunded, ops[i].Err)
		}
	}
	wantOp(t, "refund of a missing packet", ops[6], model.ErrNotFound)
	if ops[0].Deposit.Balance != 495 || ops[7].Deposit.Balance != 496+left {
		t.Fatalf("deposits around the refund: balances %d and %d, want 495 and %d", ops[0].Deposit.Balance, ops[7].Deposit.Balance, 496+left)
	}
	claimed := 300 - left + 10
	p.g.check(books{deposits: 1006, balances: 1006 - 510 + left, open: 200, inFlight: claimed, sends: 510, refunds: left, packets: 3, claims: 2})
}

// Withdrawals in a group answer as Withdraw does, in list order with the
// ops on the same wallet: a debit and the balance after it, a withdrawal
// above the balance refused with its order number left free, a repeat
// answering the first result, the order number with another amount or
// used by a deposit ORDER_CONFLICT.
func contractGroupWithdraw(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	p.commit("setup", depositOp(sA, "ann", "d1", 1000), depositOp(sB, "bob", "d1", 50))
	p.advanceMS(1)
	ops := p.commit("withdrawals",
		withdrawOp(sA, "ann", "w1", 300), // 0: 700
		withdrawOp(sA, "ann", "w2", 701), // 1: insufficient
		depositOp(sA, "ann", "d2", 1),    // 2: 701
		withdrawOp(sA, "ann", "w2", 701), // 3: 0, the order number stayed free
		withdrawOp(sA, "ann", "w1", 300), // 4: repeat of 0
		withdrawOp(sA, "ann", "w1", 299), // 5: conflict: another amount
		depositOp(sA, "ann", "w2", 5),    // 6: conflict: a withdrawal's order number
		withdrawOp(sA, "ann", "d1", 1),   // 7: conflict: a deposit's
		withdrawOp(sB, "bob", "w1", 50),  // 8: 0, another wallet with the same order number
	)
	if w := ops[0].Withdrawal; w.Balance != 700 || w.Amount != 300 || w.Repeat {
		t.Fatalf("withdrawal: %+v", w)
	}
	wantOp(t, "withdrawal above the balance", ops[1], model.ErrInsufficientBalance)
	if w := ops[3].Withdrawal; w.Balance != 0 || w.Repeat || ops[2].Deposit.Balance != 701 {
		t.Fatalf("withdrawal after a deposit: %+v (deposit %+v)", w, ops[2].Deposit)
	}
	if w := ops[4].Withdrawal; w.Balance != 700 || !w.Repeat {
		t.Fatalf("withdrawal repeated: %+v, want the first result", w)
	}
	wantOp(t, "withdrawal with another amount", ops[5], model.ErrOrderConflict)
	wantOp(t, "deposit under a withdrawal's order number", ops[6], model.ErrOrderConflict)
	wantOp(t, "withdrawal under a deposit's order number", ops[7], model.ErrOrderConflict)
	if w := ops[8].Withdrawal; w.Balance != 0 || w.Repeat {
		t.Fatalf("bob's withdrawal: %+v", w)
	}
	p.g.check(books{deposits: 1051, withdrawals: 1051, balances: 0})
}

// One op's failure answers that op and never fails the others: an
// insufficient balance, an order number reused with another request, a
// sold-out packet, a packet that does not exist, in one group with ops that
// succeed.
func contractGroupOpFailures(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	id1, p1 := p.packetID(sA)
	id0, p0 := p.packetID(sA)
	p.commit("setup", depositOp(sA, "ann", "d1", 1000), depositOp(sB, "bob", "d1", 50),
		sendOp(sA, model.SendRequest{Sender: "ann", Amount: 10, Count: 1, Kind: model.KindFixed, OrderNo: "s1"}, id1, exp),
		sendOp(sA, sendReq("ann", "s0", 100, 2), id0, exp))
	p.commit("sell out", openOp(p1, 1, opener("cy", sC)))
	p.advanceMS(5)
	_, missing := p.packetID(sB)
	id2, _ := p.packetID(sA)
	ops := p.commit("failures",
		depositOp(sA, "ann", "d2", 5), // 0 ok
		sendOp(sB, sendReq("bob", "s1", 51, 1), model.NewPacketID(sB, p.g.h.Clock.Now()), exp), // 1 insufficient
		openOp(p1, 2, opener("dan", sC)),                                                      // 2 sold out
		depositOp(sA, "ann", "d1", 999),                                                       // 3 conflict: other amount
		openOp(missing, 3, opener("dan", sC), opener("eve", sB)),                              // 4 not found
		sendOp(sA, sendReq("ann", "s2", 100, 2), id2, exp),                                    // 5 ok
		depositOp(sA, "ann", "s1", 10),                                                        // 6 conflict: a send's order number
		sendOp(sA, sendReq("ann", "d2", 5, 1), model.NewPacketID(sA, p.g.h.Clock.Now()), exp), // 7 conflict: a deposit's
		openOp(p0, 4, opener("bob", sB), opener("dan", sC)),                                   // 8 ok
		depositOp(sB, "bob", "d2", 1),                                                         // 9 ok
	)
	wantOp(t, "deposit", ops[0], nil)
	wantOp(t, "send above the balance", ops[1], model.ErrInsufficientBalance)
	wantResults(t, "open of a sold-out packet", ops[2], []string{model.ErrSoldOut.Code}, []bool{false})
	wantOp(t, "deposit under a used order number with another amount", ops[3], model.ErrOrderConflict)
	wantResults(t, "open of a missing packet", ops[4], []string{model.ErrNotFound.Code, model.ErrNotFound.Code}, []bool{false, false})
	wantOp(t, "send", ops[5], nil)
	wantOp(t, "deposit under a send's order number", ops[6], model.ErrOrderConflict)
	wantOp(t, "send under a deposit's order number", ops[7], model.ErrOrderConflict)
	wantResults(t, "open", ops[8], []string{"", ""}, []bool{false, false})
	wantOp(t, "deposit", ops[9], nil)
	if ops[0].Deposit.Balance != 895 || ops[9].Deposit.Balance != 51 || ops[5].Packet.ID != id2 || ops[8].Packet.RemainingCount != 0 {
		t.Fatalf("the ops that succeed: deposits %+v %+v, send %+v, open's packet %+v", ops[0].Deposit, ops[9].Deposit, ops[5].Packet, ops[8].Packet)
	}
	// bob's refused send left its order number free.
	p.advanceMS(5)
	ops = p.commit("retry", sendOp(sB, sendReq("bob", "s1", 51, 1), model.NewPacketID(sB, p.g.h.Clock.Now()), exp))
	wantOp(t, "send after a deposit", ops[0], nil)
	p.g.check(books{deposits: 1056, balances: 1056 - 261, open: 151, inFlight: 110, sends: 261, packets: 4, claims: 3})
}

// Ops on one key in one group see each other in list order: deposits and
// sends of one wallet, a credit then a send from the credited wallet, opens
// of one packet, one order number twice.
func contractGroupSameKey(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	p.commit("setup", depositOp(sA, "ann", "d1", 100))
	id1, p1 := p.packetID(sA)
	id2, p2 := p.packetID(sA)
	p.advanceMS(1)
	ops := p.commit("one wallet",
		depositOp(sA, "ann", "d2", 50),                     // 0 150
		sendOp(sA, sendReq("ann", "s1", 120, 2), id1, exp), // 1 30
		sendOp(sA, model.SendRequest{Sender: "ann", Amount: 50, Count: 1, Kind: model.KindFixed, OrderNo: "s2"}, id2, exp), // 2 insufficient
		depositOp(sA, "ann", "d3", 30), // 3 60
		sendOp(sA, model.SendRequest{Sender: "ann", Amount: 50, Count: 1, Kind: model.KindFixed, OrderNo: "s2"}, id2, exp), // 4 10: the order number stayed free
		depositOp(sA, "ann", "d2", 50), // 5 repeat: 150
		sendOp(sA, sendReq("ann", "s1", 120, 2), model.NewPacketID(sA, p.g.h.Clock.Now()), exp), // 6 repeat: p1
		depositOp(sA, "ann", "s2", 50), // 7 conflict
	)
	wantOp(t, "refused send", ops[2], model.ErrInsufficientBalance)
	wantOp(t, "deposit under the send's order number", ops[7], model.ErrOrderConflict)
	if d := ops[0].Deposit; d.Balance != 150 || d.Repeat {
		t.Fatalf("first deposit: %+v", d)
	}
	if d := ops[3].Deposit; d.Balance != 60 || d.Repeat {
		t.Fatalf("deposit after a send: %+v", d)
	}
	if d := ops[5].Deposit; d.Balance != 150 || !d.Repeat {
		t.Fatalf("deposit repeated in its group: %+v", d)
	}
	if ops[4].Err != nil || ops[4].Repeat || ops[4].Packet.ID != id2 || !ops[6].Repeat || ops[6].Packet.ID != id1 || ops[1].Packet.ID != id1 {
		t.Fatalf("sends: %+v, %+v, %+v", ops[1], ops[4], ops[6])
	}
	if b := p.g.balance(sA, "ann"); b != 10 {
		t.Fatalf("ann's balance %d, want 10", b)
	}
	p.g.check(books{deposits: 180, balances: 10, open: 170, sends: 170, packets: 2})

	p.advanceMS(1)
	ops = p.commit("one packet",
		openOp(p1, 1, opener("bob", sB), opener("cy", sC)),  // 0 the two shares
		openOp(p1, 2, opener("cy", sC), opener("dan", sB)),  // 1 cy again, dan too late
		openOp(p2, 3, opener("eve", sB)),                    // 2
		openOp(p2, 4, opener("fay", sC), opener("eve", sB)), // 3 sold out; eve's claim
	)
	wantResults(t, "first open", ops[0], []string{"", ""}, []bool{false, false})
	wantResults(t, "second open", ops[1], []string{"", model.ErrSoldOut.Code}, []bool{true, false})
	wantResults(t, "first open of p2", ops[2], []string{""}, []bool{false})
	wantResults(t, "second open of p2", ops[3], []string{model.ErrSoldOut.Code, ""}, []bool{false, true})
	if ops[1].Results[0].Claim != ops[0].Results[1].Claim || ops[3].Results[1].Claim != ops[2].Results[0].Claim {
		t.Fatalf("repeats answered other claims: %s / %s", describe(ops[1].Results), describe(ops[3].Results))
	}
	if ops[0].Packet.RemainingCount != 0 || ops[0].Packet.Status != model.StatusSoldOut || ops[1].Packet != ops[0].Packet {
		t.Fatalf("packet after the opens: %+v, %+v", ops[0].Packet, ops[1].Packet)
	}
	if ops[0].Results[0].Claim.Seq != 1 || ops[0].Results[1].Claim.Seq != 2 {
		t.Fatalf("seqs: %s", describe(ops[0].Results))
	}
	p.g.check(books{deposits: 180, balances: 10, inFlight: 170, sends: 170, packets: 2, claims: 3})

	// bob's credit, listed twice and again in a second op, is booked once.
	p.advanceMS(1)
	bob := creditOf(ops[0].Results[0].Claim, sB)
	ops = p.commit("one credit", creditsOp(bob, bob), creditsOp(bob))
	if ops[0].Applied != 1 || ops[1].Applied != 0 {
		t.Fatalf("credits applied %d then %d, want 1 then 0", ops[0].Applied, ops[1].Applied)
	}
	if b := p.g.balance(sB, "bob"); b != bob.Amount {
		t.Fatalf("bob's balance %d, want %d", b, bob.Amount)
	}
	p.g.check(books{deposits: 180, balances: 10 + bob.Amount, inFlight: 170 - bob.Amount, sends: 170, packets: 2, claims: 3, credits: 1})
}

// A group's credit batches are booked after every other op of the group,
// whatever their place in the list: a send or deposit of the claimant's
// wallet, before or after the batch in the list, sees the wallet without the
// credit, and the balance after the group holds it.
func contractGroupCreditsAfterOtherOps(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	id1, p1 := p.packetID(sA)
	p.commit("setup", depositOp(sA, "ann", "d1", 100),
		sendOp(sA, model.SendRequest{Sender: "ann", Amount: 100, Count: 1, Kind: model.KindFixed, OrderNo: "s1"}, id1, exp))
	ops := p.commit("open", openOp(p1, 1, opener("bob", sB)))
	c := creditOf(ops[0].Results[0].Claim, sB)
	p.advanceMS(1)
	id2, _ := p.packetID(sB)
	send := sendOp(sB, model.SendRequest{Sender: "bob", Amount: 100, Count: 1, Kind: model.KindFixed, OrderNo: "s1"}, id2, exp)
	ops = p.commit("credit among bob's ops", send, depositOp(sB, "bob", "d1", 5), creditsOp(c), depositOp(sB, "bob", "d2", 5), send)
	wantOp(t, "send before the credit", ops[0], model.ErrInsufficientBalance)
	wantOp(t, "send after the credit in the list", ops[4], model.ErrInsufficientBalance)
	if ops[1].Deposit.Balance != 5 || ops[2].Applied != 1 || ops[3].Deposit.Balance != 10 {
		t.Fatalf("deposit before the credit %+v, credit applied %d, deposit after %+v", ops[1].Deposit, ops[2].Applied, ops[3].Deposit)
	}
	if b := p.g.balance(sB, "bob"); b != 110 {
		t.Fatalf("bob's balance after the group %d, want 110", b)
	}
	p.g.check(books{deposits: 110, balances: 110, sends: 100, packets: 1, claims: 1, credits: 1})
}

// Each credit batch of a group answers the credits it booked itself: not
// those booked before, by an earlier call or an earlier op of the group.
func contractGroupCreditsCountedPerOp(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	id1, p1 := p.packetID(sA)
	p.commit("setup", depositOp(sA, "ann", "d1", 300), sendOp(sA, sendReq("ann", "s1", 300, 3), id1, p.nowMS()+3_600_000))
	ops := p.commit("open", openOp(p1, 1, opener("bob", sB), opener("cy", sC), opener("dan", sB)))
	c1, c2, c3 := creditOf(ops[0].Results[0].Claim, sB), creditOf(ops[0].Results[1].Claim, sC), creditOf(ops[0].Results[2].Claim, sB)
	p.advanceMS(1)
	p.commit("bob's credit", creditsOp(c1))
	ops = p.commit("two batches", creditsOp(c1, c2), creditsOp(c3), creditsOp(c2))
	if ops[0].Applied != 1 || ops[1].Applied != 1 || ops[2].Applied != 0 {
		t.Fatalf("batches applied %d, %d, %d; want 1, 1, 0", ops[0].Applied, ops[1].Applied, ops[2].Applied)
	}
	p.g.check(books{deposits: 300, balances: 300, sends: 300, packets: 1, claims: 3, credits: 3})
}

// An empty group is a no-op: nothing written, no transaction, and an armed
// commit fault is left for the next call that commits.
func contractGroupEmpty(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	g := grouperOf(t, f.h)
	f.deposit(sA, "ann", "d1", 10)
	for _, ops := range [][]storage.MoneyOp{nil, {}} {
		if err := g.CommitGroup(f.ctx, storage.Ops(ops)); err != nil {
			t.Fatalf("empty group: %v", err)
		}
	}
	f.check(books{deposits: 10, balances: 10})
	before := f.h.CommitFaults()
	f.h.FailNextCommit(false)
	if err := g.CommitGroup(f.ctx, nil); err != nil {
		t.Fatalf("empty group with a fault armed: %v", err)
	}
	if n := f.h.CommitFaults() - before; n != 0 {
		t.Fatalf("an empty group met the armed commit fault (%d fired)", n)
	}
	_, err := storage.Deposit(f.ctx, f.s, sA, "ann", "d2", 5)
	if n := f.h.CommitFaults() - before; n != 1 {
		t.Fatalf("the commit fault fired %d times on the deposit after the empty group, want 1", n)
	}
	failedCommit(t, "deposit after the empty group", err)
	f.check(books{deposits: 10, balances: 10})
}

// A group committed again, whole, moves nothing: its deposits and sends are
// repeats answering the first results (a send's retry carries a new packet
// ID, as a caller's would), its opens answer the claims made, its credits
// are booked already.
func contractGroupReplay(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	id1, p1 := p.packetID(sA)
	p.commit("setup", depositOp(sA, "ann", "d1", 1000), sendOp(sA, sendReq("ann", "s1", 300, 3), id1, exp))
	p.commit("open", openOp(p1, 1, opener("bob", sB), opener("cy", sC)))
	p.advanceMS(1)
	credits := p.g.owed(12, 10)
	id2, _ := p.packetID(sA)
	group := func(id model.PacketID) []spec {
		return []spec{depositOp(sA, "ann", "d2", 7), sendOp(sA, sendReq("ann", "s2", 200, 2), id, exp),
			openOp(p1, 2, opener("bob", sB), opener("dan", sC)), depositOp(sC, "cy", "d1", 3), creditsOp(credits...)}
	}
	first := p.commit("group", group(id2)...)
	want := p.sameBooks("group")
	p.advanceMS(1)
	id3, _ := p.packetID(sA)
	again := p.commit("the group again", group(id3)...)
	if got := p.sameBooks("the group again"); !reflect.DeepEqual(got, want) {
		t.Fatalf("the group again moved money: %+v, before %+v", got, want)
	}
	if d := again[0].Deposit; !d.Repeat || d.Balance != first[0].Deposit.Balance {
		t.Fatalf("deposit again: %+v, first %+v", d, first[0].Deposit)
	}
	if !again[1].Repeat || again[1].Packet.ID != id2 {
		t.Fatalf("send again: %+v, want a repeat of %s", again[1].Packet, id2)
	}
	wantResults(t, "open again", again[2], []string{"", ""}, []bool{true, true})
	if again[2].Results[1].Claim != first[2].Results[1].Claim {
		t.Fatalf("open again answered %s, first %s", describe(again[2].Results), describe(first[2].Results))
	}
	if first[4].Applied != 2 || again[4].Applied != 0 || !again[3].Deposit.Repeat {
		t.Fatalf("credits applied %d then %d; deposit again %+v", first[4].Applied, again[4].Applied, again[3].Deposit)
	}
}

// A group whose COMMIT fails writes nothing, and its retry applies every op
// once; a group whose COMMIT answer is lost wrote everything (or answers as
// if it had been committed, having found out), and its retry is answered as
// repeats and moves nothing.
func contractGroupCommitFault(t *testing.T, newStore func(t *testing.T) Harness) {
	p := newStorePair(t, newStore)
	exp := p.nowMS() + 3_600_000
	id1, p1 := p.packetID(sA)
	p.commit("setup", depositOp(sA, "ann", "d1", 1000), depositOp(sB, "bob", "d1", 100), sendOp(sA, sendReq("ann", "s1", 300, 3), id1, exp))
	p.commit("open", openOp(p1, 1, opener("bob", sB)))
	p.advanceMS(1)
	c12 := p.g.owed(12, 10)
	id2, p2 := p.packetID(sB)
	groupA := []spec{depositOp(sA, "ann", "d2", 5), sendOp(sB, sendReq("bob", "s1", 60, 2), id2, exp),
		openOp(p1, 2, opener("cy", sC), opener("dan", sA)), creditsOp(c12...), sendOp(sA, sendReq("ann", "s2", 5000, 1), model.NewPacketID(sA, p.g.h.Clock.Now()), exp)}
	before := p.sameBooks("before")

	fired := p.g.arm(false)
	ops := opsOf(groupA)
	err := p.cg.CommitGroup(p.g.ctx, storage.Ops(ops))
	fired()
	if err == nil {
		t.Fatal("a group whose COMMIT failed answered success")
	}
	if got := model.Audit([]model.Ledger{p.g.ledger()}); !reflect.DeepEqual(got, before) {
		t.Fatalf("a group whose COMMIT failed (%v) wrote: %+v, before %+v", err, got, before)
	}
	if _, err := storage.Packet(p.g.ctx, p.g.s, p2); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("the packet of a send whose group failed: %v", err)
	}
	got := p.commit("retry of the failed group", groupA...)
	wantOp(t, "send above the balance", got[4], model.ErrInsufficientBalance)
	if got[0].Deposit.Repeat || got[1].Repeat || got[3].Applied != 1 {
		t.Fatalf("retry of a failed group found it applied: %+v %+v %d", got[0].Deposit, got[1].Packet, got[3].Applied)
	}

	p.advanceMS(1)
	c := p.g.owed(12, 10)
	id3, _ := p.packetID(sC)
	groupB := []spec{depositOp(sC, "cy", "d1", 9), creditsOp(c...), openOp(p2, 3, opener("ann", sA), opener("eve", sB)),
		sendOp(sC, sendReq("cy", "s1", 9, 3), id3, exp), depositOp(sA, "ann", "d2", 5)}
	fired = p.g.arm(true)
	ops = opsOf(groupB)
	err = p.cg.CommitGroup(p.g.ctx, storage.Ops(ops))
	fired()
	answered := lostAnswer(t, "group", err)
	first := p.oracle(groupB)
	if answered {
		p.compare("group whose COMMIT answer was lost", ops, first)
	}
	p.sameBooks("group whose COMMIT answer was lost")
	p.advanceMS(1)
	got = p.commit("retry of the group whose answer was lost", groupB...)
	if !got[0].Deposit.Repeat || got[1].Applied != 0 || !got[3].Repeat || got[3].Packet.ID != id3 {
		t.Fatalf("retry after a lost answer applied again: %+v, %d credits, send %+v", got[0].Deposit, got[1].Applied, got[3].Packet)
	}
	wantResults(t, "open after a lost answer", got[2], []string{"", ""}, []bool{true, true})
}
