package storage

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// TestCommitGroupMixed runs one group holding every kind of op, with
// failures and ops on one key, and checks each answer and the rows.
func TestCommitGroupMixed(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m, failNext, _ := ContractMySQL(t, clock.NewManual(now))
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	shardOf := sharding.ShardOfAct

	// A packet made the ordinary way, to open in the group.
	if _, err := Deposit(ctx, m, shardOf("s1"), "s1", "d0", 1000); err != nil {
		t.Fatal(err)
	}
	p1ID := model.NewPacketID(shardOf("s1"), now)
	p1, _, err := Send(ctx, m, shardOf("s1"), model.SendRequest{Sender: "s1", Amount: 300, Count: 3, Kind: model.KindFixed, OrderNo: "o1"}, p1ID, now.Add(time.Hour).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	ref1, _ := model.ParsePacketID(string(p1.ID))
	// u1 claims before the group: the group answers it as a repeat.
	if res, _, err := OpenBatch(ctx, m, ref1, []model.OpenRequest{{ActID: "u1", Shard: shardOf("u1")}}, r); err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	missing, _ := model.ParsePacketID(string(model.NewPacketID(shardOf("nobody"), now)))
	p2ID := model.NewPacketID(shardOf("a"), now)
	d1 := &DepositOp{Shard: shardOf("a"), ActID: "a", OrderNo: "d1", Amount: 500}
	d2 := &DepositOp{Shard: shardOf("a"), ActID: "a", OrderNo: "d2", Amount: 250}
	// Spends both deposits above: FIFO per wallet inside the group.
	s1 := &SendOp{Shard: shardOf("a"), Req: model.SendRequest{Sender: "a", Amount: 700, Count: 2, Kind: model.KindRandom, OrderNo: "s1"},
		PacketID: p2ID, ExpiresMS: now.Add(time.Hour).UnixMilli()}
	sb := &SendOp{Shard: shardOf("b"), Req: model.SendRequest{Sender: "b", Amount: 1, Count: 1, Kind: model.KindRandom, OrderNo: "s1"},
		PacketID: model.NewPacketID(shardOf("b"), now), ExpiresMS: now.Add(time.Hour).UnixMilli()} // insufficient
	d0 := &DepositOp{Shard: shardOf("s1"), ActID: "s1", OrderNo: "d0", Amount: 1000} // repeat
	do1 := &DepositOp{Shard: shardOf("s1"), ActID: "s1", OrderNo: "o1", Amount: 5}   // an order a send used
	o1 := &OpenOp{Ref: ref1, Reqs: []model.OpenRequest{{ActID: "u1", Shard: shardOf("u1")}, {ActID: "u2", Shard: shardOf("u2")}}, Rand: r}
	o2 := &OpenOp{Ref: missing, Reqs: []model.OpenRequest{{ActID: "u3", Shard: shardOf("u3")}}, Rand: r}
	o3 := &OpenOp{Ref: ref1, Reqs: []model.OpenRequest{{ActID: "u3", Shard: shardOf("u3")}, {ActID: "u4", Shard: shardOf("u4")}}, Rand: r}
	cr := &CreditsOp{Credits: []model.Credit{{ClaimID: model.ClaimID(ref1.ID, 1), PacketID: ref1.ID, ActID: "u1", Shard: shardOf("u1"), Amount: 100}}}
	ops := []MoneyOp{d1, d2, s1, sb, d0, do1, o1, o2, o3, cr}
	if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		err     error
		balance model.Cents
	}{{nil, 500}, {nil, 750}, {nil, 0}, {model.ErrInsufficientBalance, 0}, {nil, 1000}, {model.ErrOrderConflict, 0}}
	for i, w := range want {
		d, isDeposit := ops[i].(*DepositOp)
		if !errors.Is(ops[i].Failed(), w.err) || (w.err == nil && isDeposit && d.Deposit.Balance != w.balance) {
			t.Errorf("op %d: err %v, %+v; want %v, balance %d", i, ops[i].Failed(), ops[i], w.err, w.balance)
		}
	}
	if !d0.Deposit.Repeat || d1.Deposit.Repeat {
		t.Errorf("repeat flags: %+v %+v", d1.Deposit, d0.Deposit)
	}
	if s1.Packet.ID != p2ID || s1.Packet.RemainingAmount != 700 {
		t.Errorf("send answered %+v", s1.Packet)
	}
	if got := balance(t, m, "a"); got != 50 {
		t.Errorf("a's balance %d, want 50", got)
	}
	r1, r2, r3 := o1.Results, o2.Results, o3.Results
	if !r1[0].Repeat || r1[1].Err != nil || r1[1].Claim.Seq != 2 || !errors.Is(r2[0].Err, model.ErrNotFound) ||
		r3[0].Err != nil || r3[0].Claim.Seq != 3 || !errors.Is(r3[1].Err, model.ErrSoldOut) {
		t.Errorf("opens answered %+v / %+v / %+v", r1, r2, r3)
	}
	if o3.Packet.RemainingCount != 0 || o3.Packet.Status != model.StatusSoldOut {
		t.Errorf("packet after the group %+v", o3.Packet)
	}
	if cr.Applied != 1 || len(cr.Deferred) != 0 {
		t.Errorf("credits applied %d deferred %v", cr.Applied, cr.Deferred)
	}
	if got := balance(t, m, "u1"); got != 100 {
		t.Errorf("u1's balance %d, want 100", got)
	}

	// The same group again moves nothing.
	ad := &DepositOp{Shard: shardOf("a"), ActID: "a", OrderNo: "d1", Amount: 500}
	as := &SendOp{Shard: shardOf("a"), Req: s1.Req, PacketID: model.NewPacketID(shardOf("a"), now), ExpiresMS: 1}
	ac := &CreditsOp{Credits: cr.Credits}
	if err := m.CommitGroup(ctx, []Op{ad, as, ac}); err != nil {
		t.Fatal(err)
	}
	if !ad.Deposit.Repeat || ad.Deposit.Balance != 500 || !as.Repeat || as.Packet.ID != p2ID || ac.Applied != 0 {
		t.Errorf("replayed group answered %+v / %+v / %+v", ad.Deposit, as, ac)
	}
	if got := balance(t, m, "a"); got != 50 {
		t.Errorf("a's balance %d after the replay, want 50", got)
	}

	// A lost COMMIT answer is settled by the re-read.
	failNext(true)
	lost := &DepositOp{Shard: shardOf("c"), ActID: "c", OrderNo: "d1", Amount: 9}
	if err := m.CommitGroup(ctx, []Op{lost}); err != nil || lost.Deposit.Balance != 9 {
		t.Fatalf("lost answer: %v %+v", err, lost.Deposit)
	}
	failNext(false)
	cut := &DepositOp{Shard: shardOf("c"), ActID: "c", OrderNo: "d2", Amount: 9}
	if err := m.CommitGroup(ctx, []Op{cut}); !errors.Is(err, ErrCommitUnknown) {
		t.Fatalf("cut COMMIT answered %v", err)
	}
	if got := balance(t, m, "c"); got != 9 {
		t.Errorf("c's balance %d, want 9", got)
	}

	l, err := m.Ledger(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	if a := model.AuditCell(l, func(model.ShardID) bool { return true }); len(a.Problems) > 0 {
		t.Errorf("audit: %v", a.Problems)
	}
}

// BenchmarkColdOpens compares opens of many packets one transaction each
// (OpenBatch, as the naive and batched strategies run a cold packet) with the
// same opens 16 to a group (CommitGroup). Each op is one open of a packet
// no open has touched before in the run.
//
//	deploy/local/testenv.sh go test -run '^$' -bench ColdOpens ./storage/
func BenchmarkColdOpens(b *testing.B) {
	for _, group := range []int{1, 16} {
		b.Run(map[int]string{1: "single", 16: "group16"}[group], func(b *testing.B) {
			now := time.Now()
			m, _, _ := ContractMySQL(b, nil)
			ctx := context.Background()
			r := rand.New(rand.NewPCG(1, 2))
			senders := 64
			for i := 0; i < senders; i++ {
				act := "s" + string(rune('A'+i%26)) + string(rune('a'+i/26))
				if _, err := Deposit(ctx, m, sharding.ShardOfAct(act), act, "d", 1<<40); err != nil {
					b.Fatal(err)
				}
			}
			refs := make([]model.PacketRef, b.N)
			for i := range refs {
				act := "s" + string(rune('A'+i%senders%26)) + string(rune('a'+i%senders/26))
				s := sharding.ShardOfAct(act)
				id := model.NewPacketID(s, now)
				if _, _, err := Send(ctx, m, s, model.SendRequest{Sender: act, Amount: 1000, Count: 10, Kind: model.KindRandom, OrderNo: "o" + string(id)}, id, now.Add(time.Hour).UnixMilli()); err != nil {
					b.Fatal(err)
				}
				refs[i], _ = model.ParsePacketID(string(id))
			}
			b.ResetTimer()
			for i := 0; i < b.N; i += group {
				end := min(i+group, b.N)
				if group == 1 {
					if _, _, err := OpenBatch(ctx, m, refs[i], []model.OpenRequest{{ActID: "u", Shard: 1}}, r); err != nil {
						b.Fatal(err)
					}
					continue
				}
				ops := make([]*OpenOp, 0, group)
				for _, ref := range refs[i:end] {
					ops = append(ops, &OpenOp{Ref: ref, Reqs: []model.OpenRequest{{ActID: "u", Shard: 1}}, Rand: r})
				}
				if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCommitGroupWaitsForALockedPacket: the group's locking read of a
// packet row (a FOR UPDATE inside a UNION ALL part) waits while another
// transaction holds the row, and the open commits once it is released, with
// the state the other transaction left.
func TestCommitGroupWaitsForALockedPacket(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m, _, _ := ContractMySQL(t, clock.NewManual(now))
	ctx := context.Background()
	s := sharding.ShardOfAct("lk")
	if _, err := Deposit(ctx, m, s, "lk", "d", 100); err != nil {
		t.Fatal(err)
	}
	id := model.NewPacketID(s, now)
	if _, _, err := Send(ctx, m, s, model.SendRequest{Sender: "lk", Amount: 100, Count: 2, Kind: model.KindFixed, OrderNo: "o"}, id, now.Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ref, _ := model.ParsePacketID(string(id))
	release := hold(t, m, sql.LevelRepeatableRead, "SELECT packet_id FROM "+m.packetTable(ref.Shard, ref.Day)+" WHERE packet_id = ? FOR UPDATE", string(id))
	op := &OpenOp{Ref: ref, Reqs: []model.OpenRequest{{ActID: "u", Shard: sharding.ShardOfAct("u")}}, Rand: rand.New(rand.NewPCG(1, 1))}
	done := make(chan error, 1)
	go func() { done <- m.CommitGroup(ctx, []Op{op}) }()
	if !lockWaitedOn(m, m.packetTable(ref.Shard, ref.Day)) {
		t.Fatal("the group's read of the packet row never waited for the other transaction's lock")
	}
	select {
	case err := <-done:
		t.Fatalf("the group committed (%v) while another transaction held the packet row", err)
	default:
	}
	release()
	select {
	case err := <-done:
		if err != nil || op.Results[0].Err != nil || op.Results[0].Claim.Amount != 50 || op.Packet.RemainingCount != 1 {
			t.Fatalf("after the release: %v, %+v, packet %+v", err, op.Results, op.Packet)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the group did not commit after the packet row was released")
	}
}

// TestOpenWithoutClaimsRead: an open reads no claims when every opener gets
// a new one (one SELECT, the packet's locking read, counted on the store's
// only connection); a repeat, caught by uk_claim, runs the group again with
// the claims read; a refusal (a user who claimed before must get the claim,
// not SOLD_OUT) reads the claims in the same transaction.
func TestOpenWithoutClaimsRead(t *testing.T) {
	m, err := Open(testenv.MySQLDSN(t, 1), 1) // one connection: its session counters are the store's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx := context.Background()
	if _, err := Deposit(ctx, m, sharding.ShardOfAct("ow"), "ow", "d-"+testenv.Prefix(), 400); err != nil {
		t.Fatal(err)
	}
	ref := send(t, m, "ow", 400, 4, time.Hour)
	selects := func() int64 { t.Helper(); return sessionCount(t, m.db, "Com_select") }
	r := rand.New(rand.NewPCG(3, 4))
	reqs := func(acts ...string) []model.OpenRequest {
		out := make([]model.OpenRequest, len(acts))
		for i, a := range acts {
			out[i] = model.OpenRequest{ActID: a, Shard: sharding.ShardOfAct(a)}
		}
		return out
	}
	base := selects()
	base = selects() - base // what reading the counter itself adds
	s0, re0 := selects(), m.claimRereads.Load()
	fresh, _, err := OpenBatch(ctx, m, ref, reqs("u1", "u2"), r)
	if err != nil || fresh[0].Err != nil || fresh[1].Err != nil || fresh[0].Claim.Seq != 1 || fresh[1].Claim.Seq != 2 {
		t.Fatalf("fresh opens: %v %+v", err, fresh)
	}
	if got := selects() - s0 - base; got != 1 {
		t.Errorf("fresh opens ran %d SELECTs, want 1 (the packet's locking read)", got)
	}
	if got := m.claimRereads.Load() - re0; got != 0 {
		t.Errorf("fresh opens re-read the claims %d times", got)
	}

	// u1 again beside a new opener: the unique key refuses u1's second
	// claim, and the group runs again with the claims read.
	again, p, err := OpenBatch(ctx, m, ref, reqs("u1", "u3"), r)
	if err != nil || !again[0].Repeat || again[0].Claim != fresh[0].Claim || again[1].Err != nil || again[1].Claim.Seq != 3 {
		t.Fatalf("repeat beside a fresh open: %v %+v (first %+v)", err, again, fresh[0])
	}
	if p.RemainingCount != 1 {
		t.Errorf("packet after three shares: %+v", p)
	}
	if got := m.claimRereads.Load() - re0; got != 1 {
		t.Errorf("re-reads after a repeat: %d, want 1", got)
	}
	// The last share: u2 holds a claim and gets it back, u4 takes the share
	// and u5 is refused. Decided as if no one held a claim, u5's answer
	// would be SOLD_OUT: foreseen, so the claims are read in the same
	// transaction, and u2 gets the claim, not a share.
	s1 := selects()
	closed, p, err := OpenBatch(ctx, m, ref, reqs("u2", "u4", "u5"), r)
	if err != nil || !closed[0].Repeat || closed[0].Claim != fresh[1].Claim || closed[1].Err != nil || closed[1].Claim.Seq != 4 ||
		!errors.Is(closed[2].Err, model.ErrSoldOut) {
		t.Fatalf("opens of the last share: %v %+v", err, closed)
	}
	if p.RemainingCount != 0 || p.Status != model.StatusSoldOut {
		t.Errorf("packet after the last share: %+v", p)
	}
	if got := selects() - s1 - base; got != 2 {
		t.Errorf("opens of the last share ran %d SELECTs, want 2 (the lock, the claims)", got)
	}
	if got := m.claimRereads.Load() - re0; got != 1 {
		t.Errorf("re-reads after a refusal: %d, want still 1", got)
	}
	sum, n, users := rowsOfPacket(t, m, ref)
	if sum != 400 || n != 4 || users["u1"] != 1 || users["u2"] != 1 || users["u3"] != 1 || users["u4"] != 1 || users["u5"] != 0 {
		t.Errorf("claim rows: sum %d, %d rows, users %v", sum, n, users)
	}
}

// TestGroupOfOpensAndCreditsWithoutSavepoint: a group's credit list goes
// without a SAVEPOINT after the group's open wrote (its first run); when
// the list cannot be written whole (a credit booked before) the whole group
// runs again with savepoints, and the open is still applied once, the
// booked credit not again, the others once; the next such group, within
// unfitQuiet, takes its savepoints at once.
func TestGroupOfOpensAndCreditsWithoutSavepoint(t *testing.T) {
	m, err := Open(testenv.MySQLDSN(t, 1), 1) // one connection: its session counters are the store's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.ns = "rg" + testenv.Prefix()[1:] + "_"
	m.clock = clock.NewManual(time.Now()) // still: the third group comes within unfitQuiet of the second
	t.Cleanup(func() { dropNamespace(t, m) })
	ctx := context.Background()
	pre := testenv.Prefix()
	deposit(t, m, pre+"-s", 300)
	ref := send(t, m, pre+"-s", 300, 3, time.Hour)
	savepoints := func() int64 { t.Helper(); return sessionCount(t, m.db, "Com_savepoint") }
	r := rand.New(rand.NewPCG(5, 6))
	opener := func(act string) *OpenOp {
		return &OpenOp{Ref: ref, Reqs: []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, Rand: r}
	}
	cs := synthCredits(t, m, pre+"a", []model.ShardID{3, 17}, 1, 1)
	s0 := savepoints()
	first, firstC := opener("u1"), &CreditsOp{Credits: cs}
	if err := m.CommitGroup(ctx, []Op{first, firstC}); err != nil || first.Results[0].Err != nil || firstC.Applied != len(cs) {
		t.Fatalf("open and credits: %v, %+v, applied %d", err, first.Results, firstC.Applied)
	}
	if got := savepoints() - s0; got != 0 {
		t.Errorf("open and credits: %d savepoints, want 0", got)
	}
	more := synthCredits(t, m, pre+"b", []model.ShardID{3, 250}, 1, 1)
	s1 := savepoints()
	second, secondC := opener("u2"), &CreditsOp{Credits: append(slices.Clone(cs[:1]), more...)}
	if err := m.CommitGroup(ctx, []Op{second, secondC}); err != nil || second.Results[0].Err != nil || second.Results[0].Claim.Seq != 2 || secondC.Applied != len(more) {
		t.Fatalf("open and credits, one booked before: %v, %+v, applied %d", err, second.Results, secondC.Applied)
	}
	if got := savepoints() - s1; got < 2 {
		t.Errorf("the group over a booked credit ran with %d savepoints, want its second run's (the list's, then the one-by-one path's)", got)
	}
	// Within unfitQuiet of that, a group that locks rows keeps its savepoints.
	s2 := savepoints()
	third, thirdC := opener("u3"), &CreditsOp{Credits: synthCredits(t, m, pre+"c", []model.ShardID{5}, 1, 1)}
	if err := m.CommitGroup(ctx, []Op{third, thirdC}); err != nil || third.Results[0].Err != nil || thirdC.Applied != 1 {
		t.Fatalf("the group after: %v, %+v, applied %d", err, third.Results, thirdC.Applied)
	}
	if got := savepoints() - s2; got != 1 {
		t.Errorf("the group right after an unfit one: %d savepoints, want 1", got)
	}
	checkCreditRows(t, m, append(slices.Clone(cs), more...), func(model.Credit) bool { return true })
	paid := first.Results[0].Claim.Amount + second.Results[0].Claim.Amount + third.Results[0].Claim.Amount
	if sum, n, users := rowsOfPacket(t, m, ref); n != 3 || sum != paid || users["u1"] != 1 || users["u2"] != 1 || users["u3"] != 1 {
		t.Errorf("claims: %d rows, sum %d, users %v", n, sum, users)
	}
}

// TestOpenRerunDrawsTheSameShares: a batch run again because it held a
// repeat draws the shares a batch of its fresh openers alone draws, from the
// same source: packets a and b alike (amount, count, first claim), a opened
// by a repeat and two new users, b by the two new users, each with a source
// seeded alike.
func TestOpenRerunDrawsTheSameShares(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	deposit(t, m, pre+"-s", 2000)
	a, b := send(t, m, pre+"-s", 1000, 5, time.Hour), send(t, m, pre+"-s", 1000, 5, time.Hour)
	reqs := func(acts ...string) []model.OpenRequest {
		out := make([]model.OpenRequest, len(acts))
		for i, act := range acts {
			out[i] = model.OpenRequest{ActID: act, Shard: sharding.ShardOfAct(act)}
		}
		return out
	}
	for _, ref := range []model.PacketRef{a, b} {
		if res, _, err := OpenBatch(ctx, m, ref, reqs("u0"), rand.New(rand.NewPCG(1, 1))); err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
	}
	re0 := m.claimRereads.Load()
	ra, _, err := OpenBatch(ctx, m, a, reqs("u0", "u1", "u2"), rand.New(rand.NewPCG(9, 9)))
	if err != nil || !ra[0].Repeat || m.claimRereads.Load()-re0 != 1 {
		t.Fatalf("a: %v %+v, %d re-reads", err, ra, m.claimRereads.Load()-re0)
	}
	rb, _, err := OpenBatch(ctx, m, b, reqs("u1", "u2"), rand.New(rand.NewPCG(9, 9)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if ra[i+1].Claim.Amount != rb[i].Claim.Amount || ra[i+1].Claim.Seq != rb[i].Claim.Seq {
			t.Errorf("opener %d: %+v on a (run again), %+v on b", i+1, ra[i+1].Claim, rb[i].Claim)
		}
	}
}

// TestCreditHereHeldRow: an open's same-cell credit that meets a held
// wallet row defers that credit alone (the others of the group are
// credited in it) and leaves the groups after without savepoints: the
// group runs once more with its credits behind one, and unfitMS, which
// would make the next second's groups keep theirs, is not set.
func TestCreditHereHeldRow(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	deposit(t, m, pre+"-s", 300)
	ref := send(t, m, pre+"-s", 300, 3, time.Hour)
	x, y := pre+"-x", pre+"-y"
	deposit(t, m, x, 1) // their wallet rows and tables, made by this process
	deposit(t, m, y, 1)
	sy := sharding.ShardOfAct(y)
	release := hold(t, m, sql.LevelRepeatableRead, "SELECT balance FROM "+m.accountTable(sy)+" WHERE act_id = ? FOR UPDATE", y)
	unfit := m.unfitMS.Load()
	op := &OpenOp{Ref: ref, Rand: rand.New(rand.NewPCG(7, 8)), CreditHere: func(model.ShardID) bool { return true },
		Reqs: []model.OpenRequest{{ActID: x, Shard: sharding.ShardOfAct(x)}, {ActID: y, Shard: sy}}}
	if err := m.CommitGroup(ctx, []Op{op}); err != nil || op.Err != nil {
		t.Fatal(err, op.Err)
	}
	release()
	rx, ry := op.Results[0], op.Results[1]
	if rx.Err != nil || ry.Err != nil || !rx.Credited || ry.Credited {
		t.Fatalf("results %+v / %+v; want x credited in the open, y (held) not", rx, ry)
	}
	if got := balance(t, m, x); got != 1+rx.Claim.Amount {
		t.Errorf("x's balance %d, want %d", got, 1+rx.Claim.Amount)
	}
	if got := balance(t, m, y); got != 1 {
		t.Errorf("y's balance %d while held, want 1", got)
	}
	if m.unfitMS.Load() != unfit {
		t.Errorf("a held row met by an open's same-cell credit set unfitMS: the groups after would keep their savepoints")
	}
	cy := model.Credit{ClaimID: ry.Claim.ID, PacketID: ref.ID, ActID: y, Shard: sy, Amount: ry.Claim.Amount}
	cx := model.Credit{ClaimID: rx.Claim.ID, PacketID: ref.ID, ActID: x, Shard: sharding.ShardOfAct(x), Amount: rx.Claim.Amount}
	if n, deferred, err := ApplyCredits(ctx, m, []model.Credit{cx, cy}); err != nil || n != 1 || len(deferred) != 0 {
		t.Fatalf("the relay's delivery after: applied %d, deferred %v, %v; want y's alone", n, deferred, err)
	}
	if got := balance(t, m, y); got != 1+ry.Claim.Amount {
		t.Errorf("y's balance %d after the delivery, want %d", got, 1+ry.Claim.Amount)
	}
}
