package memstore

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

var _ storage.Grouper = (*Store)(nil)

// CommitGroup implements storage.Grouper. Under the store's lock it decides
// the ops in list order — credit batches after every other op, in their
// list order among themselves — the row ops by storage.Decide, with the
// group as its storage.GroupState, the others with the pure function of
// their kind (model.ApplyCredit, the ops' Replay), against the rows as the
// ops before it in the group left them (a staged view: the store's rows under
// what the group has decided so far); then it commits once: every op's
// writes, in list order, or none of them when the armed commit fault says the
// COMMIT failed. An op's own error (its storage.Outcome, or an OpenResult.Err of one
// request) stages nothing of it and never fails the others. The clock is read
// once: every row the group writes carries that time.
//
// An op answers what the single-op function of its kind would answer, called in
// the op's place in that order: a send or deposit whose (act_id, order number)
// was applied before, by an earlier call or an earlier op of the group, is a
// repeat (Repeat set, the first result) or ErrOrderConflict; an open's Packet
// is the packet as that op left it; a credit is deferred only while its
// wallet is held (HoldWallet). The answers of every op are reset
// first, so a retry may pass the same ops again.
//
// Errors: ctx's error (nothing decided), or one matching
// storage.ErrCommitUnknown when the armed commit fault fires (see
// FailNextCommit). An empty list returns nil at once and never meets the
// fault.
//
// A wallet held by HoldWallet is what a row lock of another transaction is
// to MariaDB: a group that deposits to it, withdraws from it, sends from
// it or refunds to it waits for its release before deciding anything (or
// answers ctx's error when ctx ends first, having written nothing), and a
// credit to it is deferred (storage.CreditsOp.Deferred).
func (s *Store) CommitGroup(ctx context.Context, list []storage.Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ops, typed, err := storage.SplitOps(list)
	if err != nil {
		return err
	}
	if typed != nil {
		return storage.Dispatch(ctx, typed, s.couponOps, s.budgetOps, s.rewardOps, s.bookOps, s.archiveOps)
	}
	if len(ops) == 0 {
		return nil
	}
	if err := s.lockUnheld(ctx, ops); err != nil {
		return err
	}
	defer s.mu.Unlock()
	g := &group{
		s:        s,
		now:      s.nowMS(),
		accounts: map[acctKey]model.Cents{},
		flows:    map[flowKey]*model.Flow{},
		packets:  map[model.PacketID]*staged{},
	}
	storage.BeginGroup(ops)
	storage.ResetAnswers(ops)
	for _, op := range ops {
		decided, err := storage.Decide(g, op)
		invariant.That(err == nil, "a decision against the store's complete claims failed the group")
		if decided {
			continue
		}
		switch op := op.(type) {
		case *storage.CreditsOp, *storage.BookOp: // after the others, below
		case *storage.IssueOp:
			g.issue(op)
		case *storage.AcceptOp:
			g.accept(op)
		default:
			op.Fail(model.Invalidf("group op %T of no known kind", op))
		}
	}
	for _, op := range ops { // the opens' same-cell credits (OpenOp.CreditHere), before the credit batches
		if o, ok := op.(*storage.OpenOp); ok && len(o.Here()) > 0 {
			c := &storage.CreditsOp{Credits: o.Here()}
			g.credits(c)
			o.MarkCredited(c.Deferred)
		}
	}
	for _, op := range ops {
		if c, ok := op.(*storage.CreditsOp); ok {
			g.credits(c)
		}
	}
	g.bookings(ops)
	write, err := s.commitLocked(fmt.Sprintf("group of %d ops", len(ops)))
	if write {
		for _, w := range g.writes {
			w()
		}
	}
	return err
}

// bookings runs the group's BookOps, in list order, after its other ops: a
// take picks the rewards due (none an earlier op of the group books), the
// others book the rewards given; the bookings are written with the group.
// s.mu must be held.
func (g *group) bookings(ops []storage.MoneyOp) {
	s := g.s
	booking := map[string]bool{} // rewards an earlier op of the group books
	for _, o := range ops {
		op, ok := o.(*storage.BookOp)
		if !ok {
			continue
		}
		var book []*model.Reward
		if op.Take != nil {
			book = s.toTakeLocked(*op.Take, booking)
			op.Rewards = make([]model.Reward, len(book))
			for i, r := range book {
				op.Rewards[i] = *r
				op.Rewards[i].Status, op.Rewards[i].BookedMS = model.RewardBooked, g.now
			}
		} else {
			book = s.toBookLocked(op.Rewards, booking)
		}
		op.Applied = len(book)
		now := g.now
		g.writes = append(g.writes, func() { s.bookLocked(book, now) })
	}
}

// group is a group's staged view of the store: what its ops decided so far,
// over the store's rows, and the writes that make it so, in decision order.
// The store's rows are untouched until the writes run.
type group struct {
	s        *Store
	now      int64
	accounts map[acctKey]model.Cents               // balances the group changed
	flows    map[flowKey]*model.Flow               // flow rows the group made
	packets  map[model.PacketID]*staged            // packets the group made or opened
	writes   []func()                              // run in order at COMMIT, s.mu held
	issued   map[string]*model.Reward              // rewards the group stores, by order number
	accepted map[couponReqKey]*model.CouponRequest // coupon requests the group stores
}

// staged is a packet as the group left it so far.
type staged struct {
	p     model.Packet
	inDB  *packet                // the store's packet; nil for one a send of the group made
	fresh map[string]model.Claim // claims the group made, by act_id
}

func (g *group) balance(a acctKey) model.Cents {
	if b, ok := g.accounts[a]; ok {
		return b
	}
	return g.s.accounts[a]
}

func (g *group) flow(k flowKey) (*model.Flow, bool) {
	if f, ok := g.flows[k]; ok {
		return f, true
	}
	f, ok := g.s.flows[k]
	return f, ok
}

// packet returns the staged view of packet id, made from the store's row on
// first use; nil when neither the store nor the group holds it.
func (g *group) packet(id model.PacketID) *staged {
	if sp, ok := g.packets[id]; ok {
		return sp
	}
	pk, ok := g.s.packets[id]
	if !ok {
		return nil
	}
	sp := &staged{p: pk.p, inDB: pk, fresh: map[string]model.Claim{}}
	g.packets[id] = sp
	return sp
}

// addFlow stages a flow row and its balance change; its write is added by
// the caller (writeFlowLocked, or writeSendLocked for a send).
func (g *group) addFlow(sh model.ShardID, f model.Flow) {
	k := flowKey{sh, f.ActID, f.OrderNo}
	_, dup := g.flow(k)
	invariant.That(!dup, "flow staged twice under one order number")
	g.flows[k] = &f
	a := acctKey{sh, f.ActID}
	g.accounts[a] = g.balance(a) + f.Amount
	invariant.That(g.accounts[a] >= 0, "staged balance below zero")
}

var _ storage.GroupState = (*group)(nil)

func (g *group) NowMS() int64 { return g.now }

func (g *group) Packet(id model.PacketID) (model.Packet, bool) {
	if sp := g.packet(id); sp != nil {
		return sp.p, true
	}
	return model.Packet{}, false
}

func (g *group) Claims(id model.PacketID, reqs []model.OpenRequest) (map[string]model.Claim, bool) {
	return g.packet(id).claimsOf(reqs), true
}

func (g *group) Balance(sh model.ShardID, actID string) model.Cents {
	return g.balance(acctKey{sh, actID})
}

func (g *group) Flow(sh model.ShardID, actID, orderNo string) (model.Flow, bool) {
	if f, ok := g.flow(flowKey{sh, actID, orderNo}); ok {
		return *f, true
	}
	return model.Flow{}, false
}

func (g *group) Opened(ref model.PacketRef, out model.OpenOutcome) {
	sp, id := g.packet(ref.ID), ref.ID
	sp.p = out.Packet
	for _, c := range out.Fresh {
		sp.fresh[c.ActID] = c
	}
	g.writes = append(g.writes, func() { g.s.writeOpenLocked(g.s.packets[id], out) })
}

func (g *group) Sent(sh model.ShardID, out model.SendOutcome) {
	ref, err := model.ParsePacketID(string(out.Packet.ID))
	invariant.That(err == nil && ref.Shard == sh, "send with a packet ID of another shard")
	g.addFlow(sh, out.Flow)
	g.packets[ref.ID] = &staged{p: out.Packet, fresh: map[string]model.Claim{}}
	g.writes = append(g.writes, func() { g.s.writeSendLocked(ref, out) })
}

func (g *group) Moved(sh model.ShardID, f model.Flow) {
	invariant.That(sh.Valid(), "shard out of range")
	g.addFlow(sh, f)
	g.writes = append(g.writes, func() { g.s.writeFlowLocked(sh, f) })
}

func (g *group) Refunded(ref model.PacketRef, out model.RefundOutcome) {
	id := ref.ID
	g.addFlow(ref.Shard, out.Flow)
	g.packet(id).p = out.Packet
	g.writes = append(g.writes, func() { g.s.writeRefundLocked(g.s.packets[id], out) })
}

func (g *group) SentBefore(id model.PacketID, into *model.Packet) {
	first := g.packet(id)
	invariant.That(first != nil, "send flow without its packet")
	*into = first.p
}

// claimsOf returns the claims the requests' users hold on the packet, in the
// store or made by the group.
func (sp *staged) claimsOf(reqs []model.OpenRequest) map[string]model.Claim {
	held := map[string]model.Claim{}
	if sp.inDB != nil {
		held = sp.inDB.claimsOfLocked(reqs)
	}
	for _, rq := range reqs {
		if c, ok := sp.fresh[rq.ActID]; ok {
			held[rq.ActID] = c
		}
	}
	return held
}

func (g *group) credits(op *storage.CreditsOp) {
	for _, c := range op.Credits {
		invariant.That(c.Shard.Valid(), "credit to a shard out of range")
		if _, held := g.s.held[acctKey{c.Shard, c.ActID}]; held {
			if !slices.Contains(op.Deferred, c.ClaimID) {
				op.Deferred = append(op.Deferred, c.ClaimID)
			}
			continue
		}
		_, booked := g.flow(flowKey{c.Shard, c.ActID, model.CreditOrderNo(c.ClaimID)})
		out := model.ApplyCredit(model.CreditInput{Credit: c, Booked: booked, NowMS: g.now})
		if !out.Applied {
			continue
		}
		sh := c.Shard
		g.addFlow(sh, out.Flow)
		g.writes = append(g.writes, func() { g.s.writeFlowLocked(sh, out.Flow) })
		op.Applied++
	}
}

// HoldWallet holds the wallet of actID in shard s as another transaction's
// row lock would (see CommitGroup), for the contract suite's fault of a
// lock held (storagetest.Harness.HoldWallet): waiters counts the groups
// waiting for any held wallet; release ends the hold (again: a no-op).
func (s *Store) HoldWallet(sh model.ShardID, actID string) (waiters func() int, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := acctKey{sh, actID}
	invariant.That(s.held[k] == nil, "wallet held twice")
	if s.held == nil {
		s.held = map[acctKey]chan struct{}{}
	}
	ch := make(chan struct{})
	s.held[k] = ch
	var once sync.Once
	waiters = func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.waiting
	}
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.held, k)
			s.mu.Unlock()
			close(ch)
		})
	}
	return waiters, release
}

// archiveOps answers the archive and export steps (storage.ArchivePass,
// storage.ExportPass): this store keeps no day tables and no export files,
// so storage.ErrNoArchive.
func (s *Store) archiveOps(_ context.Context, op storage.Op) (bool, error) {
	switch op.(type) {
	case *storage.ArchivePass, *storage.ExportPass:
		return true, storage.ErrNoArchive
	}
	return false, nil
}

// Read implements storage.Reader.
func (s *Store) Read(ctx context.Context, q storage.Query) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return storage.Dispatch(ctx, q, s.couponReads, s.budgetReads, s.rewardReads, s.bookReads)
}

// lockUnheld takes s.mu once no wallet that ops write is held (HoldWallet),
// waiting for each hold's release as a transaction waits for a row lock.
// When ctx ends first it returns ctx's error with s.mu not held.
func (s *Store) lockUnheld(ctx context.Context, ops []storage.MoneyOp) error {
	for {
		s.mu.Lock()
		ch := s.heldByLocked(ops)
		if ch == nil {
			return nil
		}
		s.waiting++
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// heldByLocked is the release channel of a held wallet that one of ops
// deposits to, withdraws from, sends from or refunds to (a packet the
// store holds); nil when none is held. s.mu must be held.
func (s *Store) heldByLocked(ops []storage.MoneyOp) chan struct{} {
	if len(s.held) == 0 {
		return nil
	}
	for _, op := range ops {
		var k acctKey
		switch op := op.(type) {
		case *storage.DepositOp:
			k = acctKey{op.Shard, op.ActID}
		case *storage.WithdrawOp:
			k = acctKey{op.Shard, op.ActID}
		case *storage.SendOp:
			k = acctKey{op.Shard, op.Req.Sender}
		case *storage.RefundOp:
			p, ok := s.packets[op.Ref.ID]
			if !ok {
				continue
			}
			k = acctKey{op.Ref.Shard, p.p.Sender}
		default:
			continue
		}
		if ch, ok := s.held[k]; ok {
			return ch
		}
	}
	return nil
}
