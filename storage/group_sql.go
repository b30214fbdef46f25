package storage

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"redcell/model"
)

// groupWrites gathers a group's rows by table, for one multi-statement write.
type groupWrites struct {
	flows      map[model.ShardID][]any // flowArgs rows
	flowN      map[model.ShardID]int
	balances   map[walletKey]groupBalance
	newPackets map[dayKey][]any // packet table → rows of packetCols
	newN       map[dayKey]int
	claims     map[dayKey][]any // claim table → rows
	claimN     map[dayKey]int
	dest       func(model.ShardID) string     // a new claim's dest (MySQL.creditDest)
	packets    map[model.PacketID]groupPacket // packets opened: their final state
}

// dayKey names a shard's packet and claim tables of one day of month.
type dayKey struct {
	shard model.ShardID
	day   int
}

func sortedDays[V any](m map[dayKey]V) []dayKey {
	return slices.SortedFunc(maps.Keys(m), func(a, b dayKey) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.day, b.day))
	})
}

type groupBalance struct {
	balance model.Cents
	ms      int64
}

type groupPacket struct {
	ref model.PacketRef
	p   model.Packet
}

func (w *groupWrites) flow(s model.ShardID, f model.Flow, balance model.Cents) {
	if w.flows == nil {
		w.flows, w.flowN, w.balances = map[model.ShardID][]any{}, map[model.ShardID]int{}, map[walletKey]groupBalance{}
	}
	w.flows[s] = append(w.flows[s], flowArgs(f)...)
	w.flowN[s]++
	w.balances[walletKey{s, f.ActID}] = groupBalance{balance, f.CreatedMS}
}

func (w *groupWrites) newPacket(s model.ShardID, q model.Packet) {
	if w.newPackets == nil {
		w.newPackets, w.newN = map[dayKey][]any{}, map[dayKey]int{}
	}
	ref, _ := model.ParsePacketID(string(q.ID)) // checked by ensureGroup
	t := dayKey{s, ref.Day}
	w.newPackets[t] = append(w.newPackets[t], string(q.ID), q.Sender, q.OrderNo, string(q.Kind), q.Greeting, q.Amount, q.Count,
		q.RemainingAmount, q.RemainingCount, q.RefundAmount, q.Status, q.CreatedMS, q.ExpiresMS)
	w.newN[t]++
}

func (w *groupWrites) open(ref model.PacketRef, out model.OpenOutcome) {
	if w.claims == nil {
		w.claims, w.claimN = map[dayKey][]any{}, map[dayKey]int{}
	}
	if w.packets == nil {
		w.packets = map[model.PacketID]groupPacket{}
	}
	t := dayKey{ref.Shard, ref.Day}
	for i, c := range out.Fresh {
		cr := out.Credits[i]
		w.claims[t] = append(w.claims[t], string(ref.ID), c.Seq, c.ActID, c.Amount, c.CreatedMS, int(cr.Shard), w.dest(cr.Shard))
		w.claimN[t]++
	}
	w.packets[ref.ID] = groupPacket{ref, out.Packet}
}

// packetState records a packet's state after an op other than an open (a
// refund): written by the same UPDATE as an opened packet's.
func (w *groupWrites) packetState(ref model.PacketRef, p model.Packet) {
	if w.packets == nil {
		w.packets = map[model.PacketID]groupPacket{}
	}
	w.packets[ref.ID] = groupPacket{ref, p}
}

// sql is the group's write: every INSERT and UPDATE, in a fixed order.
func (w *groupWrites) sql(m *MySQL) (string, []any) {
	var b sqlBatch
	for _, s := range sortedKeys(w.flows) {
		b.add("INSERT INTO "+m.flowTable(s)+" (act_id, order_no, kind, amount, balance_after, ref, req_hash, created_ms) VALUES "+
			rowsOf(w.flowN[s], 8), w.flows[s]...)
	}
	for _, k := range sortedWallets(w.balances) {
		v := w.balances[k]
		b.add("UPDATE "+m.accountTable(k.shard)+" SET balance = ?, updated_ms = ? WHERE act_id = ?", v.balance, v.ms, k.act)
	}
	for _, t := range sortedDays(w.newPackets) {
		b.add("INSERT INTO "+m.packetTable(t.shard, t.day)+" ("+packetCols+") VALUES "+rowsOf(w.newN[t], 13), w.newPackets[t]...)
	}
	for _, t := range sortedDays(w.claims) {
		b.add("INSERT INTO "+m.claimTable(t.shard, t.day)+" (packet_id, seq, act_id, amount, created_ms, act_shard, dest) VALUES "+rowsOf(w.claimN[t], 7), w.claims[t]...)
	}
	for _, id := range sortedKeys(w.packets) {
		gp := w.packets[id]
		q := gp.p
		b.add("UPDATE "+m.packetTable(gp.ref.Shard, gp.ref.Day)+" SET remaining_amount = ?, remaining_count = ?, status = ?, refund_amount = ? WHERE packet_id = ?",
			q.RemainingAmount, q.RemainingCount, q.Status, q.RefundAmount, string(id))
	}
	return b.sql()
}

// sqlBatch joins statements into one multi-statement string (the pool's
// connections allow it; parameters are interpolated client-side).
type sqlBatch struct {
	parts []string
	args  []any
}

func (b *sqlBatch) add(q string, args ...any) {
	b.parts = append(b.parts, q)
	b.args = append(b.args, args...)
}

func (b *sqlBatch) addUnion(u union) {
	q, args := u.sql()
	b.add(q, args...)
}

func (b *sqlBatch) sql() (string, []any) { return strings.Join(b.parts, ";\n"), b.args }

// union joins SELECTs of one shape into one UNION ALL, each in parentheses
// (so each keeps its own ORDER BY and locking clause).
type union struct {
	parts []string
	args  []any
}

func (u *union) add(q string, args ...any) {
	u.parts = append(u.parts, "("+q+")")
	u.args = append(u.args, args...)
}

func (u *union) sql() (string, []any) { return strings.Join(u.parts, " UNION ALL "), u.args }

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K { return slices.Sorted(maps.Keys(m)) }

func sortedWallets(m map[walletKey]groupBalance) []walletKey {
	return slices.SortedFunc(maps.Keys(m), func(a, b walletKey) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.act, b.act))
	})
}

func walletRows(acts []string, now int64) []any {
	out := make([]any, 0, 3*len(acts))
	for _, a := range acts {
		out = append(out, a, 0, now)
	}
	return out
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
