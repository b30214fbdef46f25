package storage

import (
	"context"

	"redcell/internal/invariant"
	"redcell/model"
)

type walletKey struct {
	shard model.ShardID
	act   string
}

type groupFlowKey struct {
	shard model.ShardID
	act   string
	order string
}

// groupState is what a group's decisions read and change, keyed as the rows
// (GroupState): the rows groupRead locked, the decisions' writes, gathered
// for one multi-statement write, and the probe of the first row written.
type groupState struct {
	m          *MySQL
	ctx        context.Context
	now        int64
	claimsRead bool                                      // the openers' earlier claims are in claims
	packets    map[model.PacketID]*model.Packet          // locked rows and the group's new ones; nil entry: not found
	claims     map[model.PacketID]map[string]model.Claim // openers' claims, earlier and new
	wallets    map[walletKey]model.Cents
	flows      map[groupFlowKey]model.Flow // send and deposit order numbers seen
	w          groupWrites
	probe      func() (bool, error) // the first row written, as this attempt wrote it
	repeats    []sentBefore         // sends answered by an earlier packet, read after the writes
}

type sentBefore struct {
	id   model.PacketID
	into *model.Packet
}

var _ GroupState = (*groupState)(nil)

func (st *groupState) NowMS() int64 { return st.now }

func (st *groupState) Packet(id model.PacketID) (model.Packet, bool) {
	if p := st.packets[id]; p != nil {
		return *p, true
	}
	return model.Packet{}, false
}

func (st *groupState) Claims(id model.PacketID, _ []model.OpenRequest) (map[string]model.Claim, bool) {
	return st.claims[id], st.claimsRead
}

func (st *groupState) Balance(sh model.ShardID, actID string) model.Cents {
	return st.wallets[walletKey{sh, actID}]
}

func (st *groupState) Flow(sh model.ShardID, actID, orderNo string) (model.Flow, bool) {
	f, ok := st.flows[groupFlowKey{sh, actID, orderNo}]
	return f, ok
}

func (st *groupState) Opened(ref model.PacketRef, out model.OpenOutcome) {
	*st.packets[ref.ID] = out.Packet
	held := st.claims[ref.ID]
	for _, c := range out.Fresh {
		held[c.ActID] = c
	}
	st.w.open(ref, out)
	if st.probe == nil {
		first := out.Fresh[0]
		reqs := []model.OpenRequest{{ActID: first.ActID}}
		m, ctx := st.m, st.ctx
		st.probe = func() (bool, error) {
			// This attempt's claim: its seq, share and time, not only
			// a claim of this user (another writer's would be one).
			got, err := m.claimsOfPacket(ctx, ref, reqs)
			c := got[first.ActID]
			return err == nil && c.Seq == first.Seq && c.Amount == first.Amount && c.CreatedMS == first.CreatedMS, err
		}
	}
}

func (st *groupState) Sent(sh model.ShardID, out model.SendOutcome) {
	f := out.Flow
	fk := groupFlowKey{sh, f.ActID, f.OrderNo}
	st.wallets[walletKey{sh, f.ActID}], st.flows[fk] = out.Balance, f
	p := out.Packet
	st.packets[p.ID], st.claims[p.ID] = &p, map[string]model.Claim{}
	st.w.flow(sh, f, out.Balance)
	st.w.newPacket(sh, out.Packet)
	st.probeFlow(fk, f)
}

func (st *groupState) Moved(sh model.ShardID, f model.Flow) {
	fk := groupFlowKey{sh, f.ActID, f.OrderNo}
	st.wallets[walletKey{sh, f.ActID}], st.flows[fk] = f.BalanceAfter, f
	st.w.flow(sh, f, f.BalanceAfter)
	st.probeFlow(fk, f)
}

func (st *groupState) Refunded(ref model.PacketRef, out model.RefundOutcome) {
	k := walletKey{ref.Shard, out.Flow.ActID}
	bal, ok := st.wallets[k]
	invariant.That(ok, "a refund's wallet was not locked")
	st.wallets[k], *st.packets[ref.ID] = bal+out.Amount, out.Packet
	st.w.flow(ref.Shard, out.Flow, st.wallets[k])
	st.w.packetState(ref, out.Packet)
	st.probeFlow(groupFlowKey{ref.Shard, out.Flow.ActID, out.Flow.OrderNo}, out.Flow)
}

func (st *groupState) SentBefore(id model.PacketID, into *model.Packet) {
	st.repeats = append(st.repeats, sentBefore{id, into})
}

func (st *groupState) probeFlow(fk groupFlowKey, f model.Flow) {
	if st.probe == nil {
		st.probe = st.m.flowProbe(st.ctx, fk, f)
	}
}
