package storage

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"redcell/model"
)

// groupRead takes the group's locks and reads its rows: one statement
// creating the wallets the group debits or credits (so they can be locked),
// then one multi-statement query of locking reads and, with readClaims, the
// openers' earlier claims.
func (m *MySQL) groupRead(ctx context.Context, tx *sql.Tx, ops []MoneyOp, readClaims bool) (*groupState, error) {
	st := &groupState{
		packets: map[model.PacketID]*model.Packet{},
		claims:  map[model.PacketID]map[string]model.Claim{},
		wallets: map[walletKey]model.Cents{},
		flows:   map[groupFlowKey]model.Flow{},
	}
	g := m.groupRowsOf(st, ops)
	packetsByTable, walletsByShard, flowsByShard, shards := g.packetsByTable, g.walletsByShard, g.flowsByShard, g.shards

	// Packet rows are locked first (a refund's order: packet, then wallet).
	// When the group also locks wallets, whose rows are created (and so
	// locked) by a write, the packets are read on their own before it.
	packetsFirst := len(packetsByTable) > 0 && len(shards) > 0
	if packetsFirst {
		if err := m.lockPackets(ctx, tx, st, packetsByTable); err != nil {
			return nil, err
		}
	}
	// Wallet rows must exist to be locked: create the missing ones.
	var b sqlBatch
	now := m.nowMS()
	for _, s := range shards {
		acts := sortedKeys(walletsByShard[s])
		b.add("INSERT INTO "+m.accountTable(s)+" (act_id, balance, updated_ms) VALUES "+rowsOf(len(acts), 3)+
			" ON DUPLICATE KEY UPDATE act_id = act_id", walletRows(acts, now)...)
	}
	if q, args := b.sql(); q != "" {
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return nil, fmt.Errorf("storage: create accounts: %w", err)
		}
	}

	// The reads, in lock order, one UNION ALL per kind of row (each part
	// takes its locks in turn); result sets come back in this order.
	var readers []groupReader
	var r sqlBatch
	if len(packetsByTable) > 0 && !packetsFirst {
		r.addUnion(packetLocks(packetsByTable))
		readers = append(readers, st.readPacket)
	}
	if len(shards) > 0 {
		var wallets, flows union
		for _, s := range shards {
			acts := sortedKeys(walletsByShard[s])
			wallets.add("SELECT "+strconv.Itoa(int(s))+", act_id, balance FROM "+m.accountTable(s)+
				" WHERE act_id IN ("+placeholders(len(acts))+") ORDER BY act_id FOR UPDATE", anys(acts)...)
			pairs := flowsByShard[s]
			conds := make([]string, 0, len(pairs))
			args := make([]any, 0, 2*len(pairs))
			for p := range pairs {
				conds = append(conds, "(act_id = ? AND order_no = ?)")
				args = append(args, p[0], p[1])
			}
			flows.add("SELECT "+strconv.Itoa(int(s))+", act_id, order_no, kind, amount, balance_after, ref, req_hash, created_ms FROM "+
				m.flowTable(s)+" WHERE "+strings.Join(conds, " OR ")+" LOCK IN SHARE MODE", args...)
		}
		r.addUnion(wallets)
		readers = append(readers, st.readWallet)
		r.addUnion(flows)
		readers = append(readers, st.readFlow)
	}
	// The claims are read after every lock is held (a consistent read: its
	// snapshot starts here, so it sees every claim committed before the
	// packets were locked).
	if u := m.claimsUnion(ops); readClaims && len(u.parts) > 0 {
		r.addUnion(u)
		readers = append(readers, st.readClaim)
	}
	if len(readers) == 0 {
		return st, nil
	}
	if err := queryGroupReads(ctx, tx, &r, readers); err != nil {
		return nil, err
	}
	return st, nil
}

// groupReader reads a row of one of groupRead's result sets into its state.
type groupReader func(*sql.Rows) error

// groupRows is what a group's locking read covers, gathered from its ops.
type groupRows struct {
	packetsByTable map[string][]string // packet table → IDs
	walletsByShard map[model.ShardID]map[string]bool
	flowsByShard   map[model.ShardID]map[[2]string]bool // (act_id, order_no) pairs
	shards         []model.ShardID                      // walletsByShard's, ascending
}

// groupRowsOf gathers the packets the group's opens and refunds touch (each
// gets an empty claim map in st) and the wallets and order numbers of its
// sends, deposits and withdrawals.
func (m *MySQL) groupRowsOf(st *groupState, ops []MoneyOp) groupRows {
	packetsByTable := map[string][]string{} // packet table → IDs
	walletsByShard := map[model.ShardID]map[string]bool{}
	flowsByShard := map[model.ShardID]map[[2]string]bool{}
	packet := func(ref model.PacketRef) {
		if _, ok := st.claims[ref.ID]; !ok {
			st.claims[ref.ID] = map[string]model.Claim{}
			t := m.packetTable(ref.Shard, ref.Day)
			packetsByTable[t] = append(packetsByTable[t], string(ref.ID))
		}
	}
	wallet := func(sh model.ShardID, act, order string) {
		if walletsByShard[sh] == nil {
			walletsByShard[sh] = map[string]bool{}
			flowsByShard[sh] = map[[2]string]bool{}
		}
		walletsByShard[sh][act] = true
		flowsByShard[sh][[2]string{act, order}] = true
	}
	for _, op := range ops {
		switch op := op.(type) {
		case *OpenOp:
			packet(op.Ref)
		case *RefundOp:
			packet(op.Ref)
		case *SendOp:
			wallet(op.Shard, op.Req.Sender, op.Req.OrderNo)
		case *DepositOp:
			wallet(op.Shard, op.ActID, op.OrderNo)
		case *WithdrawOp:
			wallet(op.Shard, op.ActID, op.OrderNo)
		}
	}
	shards := make([]model.ShardID, 0, len(walletsByShard))
	for s := range walletsByShard {
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	return groupRows{packetsByTable, walletsByShard, flowsByShard, shards}
}

// queryGroupReads sends groupRead's reads (r) as one multi-statement query
// and reads result set i with readers[i]. Errors: the database's, a missing
// result set, a reader's; each as "storage: group read".
func queryGroupReads(ctx context.Context, tx *sql.Tx, r *sqlBatch, readers []groupReader) error {
	q, args := r.sql()
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("storage: group read: %w", err)
	}
	defer rows.Close()
	for i, read := range readers {
		if i > 0 && !rows.NextResultSet() {
			if err := rows.Err(); err != nil {
				return fmt.Errorf("storage: group read: %w", err)
			}
			return fmt.Errorf("storage: group read: %d result sets, want %d", i, len(readers))
		}
		for rows.Next() {
			if err := read(rows); err != nil {
				return fmt.Errorf("storage: group read: %w", err)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("storage: group read: %w", err)
		}
	}
	return rows.Close()
}

// readFlow reads a row of groupRead's flow read into st.flows.
func (st *groupState) readFlow(rows *sql.Rows) error {
	var s model.ShardID
	var f model.Flow
	var after sql.NullInt64
	if err := rows.Scan(&s, &f.ActID, &f.OrderNo, &f.Kind, &f.Amount, &after, &f.Ref, &f.ReqHash, &f.CreatedMS); err != nil {
		return err
	}
	f.BalanceAfter, f.BalanceKnown = model.Cents(after.Int64), after.Valid
	st.flows[groupFlowKey{s, f.ActID, f.OrderNo}] = f
	return nil
}

// readWallet reads one row of a wallets' locking read: shard, act_id, balance.
func (st *groupState) readWallet(rows *sql.Rows) error {
	var k walletKey
	var bal model.Cents
	err := rows.Scan(&k.shard, &k.act, &bal)
	st.wallets[k] = bal
	return err
}

// claimsUnion is the read of the openers' earlier claims: per claim table
// one part, per packet its requests' act_ids.
func (m *MySQL) claimsUnion(ops []MoneyOp) union {
	byTable := map[string]map[model.PacketID][]string{}
	for _, o := range ops {
		op, ok := o.(*OpenOp)
		if !ok {
			continue
		}
		t := m.claimTable(op.Ref.Shard, op.Ref.Day)
		if byTable[t] == nil {
			byTable[t] = map[model.PacketID][]string{}
		}
		for _, r := range op.Reqs {
			byTable[t][op.Ref.ID] = append(byTable[t][op.Ref.ID], r.ActID)
		}
	}
	var u union
	for _, t := range sortedKeys(byTable) {
		byPacket := byTable[t]
		var conds []string
		var args []any
		for _, id := range sortedKeys(byPacket) {
			acts := byPacket[id]
			conds = append(conds, "(packet_id = ? AND act_id IN ("+placeholders(len(acts))+"))")
			args = append(args, string(id))
			args = append(args, anys(acts)...)
		}
		u.add("SELECT packet_id, seq, act_id, amount, created_ms FROM "+t+" WHERE "+strings.Join(conds, " OR "), args...)
	}
	return u
}

// readClaim keeps a claim row of claimsUnion's read.
func (st *groupState) readClaim(rows *sql.Rows) error {
	var c model.Claim
	if err := rows.Scan(&c.PacketID, &c.Seq, &c.ActID, &c.Amount, &c.CreatedMS); err != nil {
		return err
	}
	c.ID = model.ClaimID(c.PacketID, c.Seq)
	if held := st.claims[c.PacketID]; held != nil {
		held[c.ActID] = c
	}
	return nil
}

// readClaims reads the openers' earlier claims in a statement of their own,
// after the group's locks (groupTx, when an answer will be a refusal).
func (m *MySQL) readClaims(ctx context.Context, tx *sql.Tx, st *groupState, ops []MoneyOp) error {
	u := m.claimsUnion(ops)
	if len(u.parts) == 0 {
		return nil
	}
	return queryUnion(ctx, tx, u, st.readClaim, "read claims")
}

// queryUnion runs u in tx as a statement of its own and hands each row to
// read; errors name what.
func queryUnion(ctx context.Context, tx *sql.Tx, u union, read func(*sql.Rows) error, what string) error {
	q, args := u.sql()
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("storage: %s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := read(rows); err != nil {
			return fmt.Errorf("storage: %s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("storage: %s: %w", what, err)
	}
	return rows.Close()
}

// refusalAhead tells whether deciding the group's opens as if no opener held
// a claim would refuse one (SOLD_OUT, EXPIRED): then the claims must be read
// first, for a user who claimed before gets the claim, not the refusal. It
// decides on copies of the packets, in list order, with each op's own seed
// (the group's decisions draw the same shares again).
func refusalAhead(st *groupState, ops []MoneyOp, now int64) bool {
	after := map[model.PacketID]model.Packet{}
	for _, o := range ops {
		op, ok := o.(*OpenOp)
		if !ok || st.packets[op.Ref.ID] == nil {
			continue
		}
		p, ok := after[op.Ref.ID]
		if !ok {
			p = *st.packets[op.Ref.ID]
		}
		out := model.Open(model.OpenInput{Packet: p, Found: true, Reqs: op.Reqs, NowMS: now, Rand: op.seed.Rand()})
		if refusedAny(out.Results) {
			return true
		}
		after[op.Ref.ID] = out.Packet
	}
	return false
}

// packetLocks is the locking read of the group's packet rows, by table and ID.
func packetLocks(byTable map[string][]string) union {
	var u union
	for _, t := range sortedKeys(byTable) {
		ids := byTable[t]
		sort.Strings(ids)
		u.add("SELECT "+packetCols+" FROM "+t+" WHERE packet_id IN ("+placeholders(len(ids))+") ORDER BY packet_id FOR UPDATE", anys(ids)...)
	}
	return u
}

func (st *groupState) readPacket(rows *sql.Rows) error {
	p, err := scanPacket(rows)
	if err == nil {
		st.packets[p.ID] = &p
	}
	return err
}

// lockPackets locks and reads the group's packet rows in a statement of
// their own.
func (m *MySQL) lockPackets(ctx context.Context, tx *sql.Tx, st *groupState, byTable map[string][]string) error {
	return queryUnion(ctx, tx, packetLocks(byTable), st.readPacket, "lock packets")
}

// lockRefundWallets locks, after the packets' locks (a refund's order:
// packet, then wallet), the wallets of the senders the group's refunds may
// pay (packets open and past their expiry as read) that the group's reads
// did not lock, and reads their balances: one statement when there are any,
// and one more creating a wallet row that is missing (the sender's wallet
// exists once it sent, unless the row went with a hand-made repair).
func (m *MySQL) lockRefundWallets(ctx context.Context, tx *sql.Tx, st *groupState, ops []MoneyOp, now int64) error {
	byShard := map[model.ShardID]map[string]bool{}
	for _, o := range ops {
		op, ok := o.(*RefundOp)
		if !ok {
			continue
		}
		p := st.packets[op.Ref.ID]
		if p == nil || p.Status != model.StatusOpen || now < p.ExpiresMS {
			continue
		}
		if _, ok := st.wallets[walletKey{op.Ref.Shard, p.Sender}]; ok {
			continue
		}
		if byShard[op.Ref.Shard] == nil {
			byShard[op.Ref.Shard] = map[string]bool{}
		}
		byShard[op.Ref.Shard][p.Sender] = true
	}
	if len(byShard) == 0 {
		return nil
	}
	var u union
	for _, s := range sortedKeys(byShard) {
		acts := sortedKeys(byShard[s])
		u.add("SELECT "+strconv.Itoa(int(s))+", act_id, balance FROM "+m.accountTable(s)+
			" WHERE act_id IN ("+placeholders(len(acts))+") ORDER BY act_id FOR UPDATE", anys(acts)...)
	}
	if err := queryUnion(ctx, tx, u, st.readWallet, "lock refund wallets"); err != nil {
		return err
	}
	var b sqlBatch
	for _, s := range sortedKeys(byShard) {
		var missing []string
		for _, a := range sortedKeys(byShard[s]) {
			if _, ok := st.wallets[walletKey{s, a}]; !ok {
				missing = append(missing, a)
				st.wallets[walletKey{s, a}] = 0
			}
		}
		if len(missing) > 0 {
			b.add("INSERT INTO "+m.accountTable(s)+" (act_id, balance, updated_ms) VALUES "+rowsOf(len(missing), 3), walletRows(missing, now)...)
		}
	}
	if q, args := b.sql(); q != "" {
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("storage: create refund wallets: %w", err)
		}
	}
	return nil
}
