package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"redcell/internal/invariant"
	"redcell/model"
)

// CommitGroup runs a group of ops in one transaction (Grouper). In a few
// round trips however many ops: one locking read of every row the group
// touches (packet rows FOR UPDATE, wallet rows FOR UPDATE, the send and
// deposit order numbers LOCK IN SHARE MODE, then the openers' earlier
// claims), each kind of row one UNION ALL, sent as one multi-statement query
// (the packets on their own, first, when the group also creates wallets); the
// decisions in memory, in list order; one multi-statement write of every
// flow, balance, packet and claim row. Credit batches follow, after
// every other op whatever their place in the list, each with its own no-wait
// statements (applyCreditsTx), then COMMIT.
//
// Lock order: packet rows by (table, ID), then wallet rows by (table,
// act_id), the order a refund takes them; the wallets of the group's
// refunds' senders, known only once their packets are read, come last, in
// a locking read of their own (lockRefundWallets). A deadlock victim all
// the same is run again by inTx (three tries), and a group that still fails
// wrote nothing.
//
// Opens are decided without reading the openers' earlier claims: a new
// claim is inserted at once, and the claim table's unique key on (packet,
// act_id) refuses a user's second one. When it does (a repeat), the
// transaction is rolled back and the group run again with the claims read
// after the locks: a repeat costs a second transaction, a fresh open no
// read. When an open's answer would be SOLD_OUT or EXPIRED (decided first
// on copies, refusalAhead), the claims are read in the same transaction
// before the decisions, for a user who claimed earlier gets the claim
// instead: one statement more.
//
// A COMMIT without an answer is settled by re-reading the first row the
// group wrote (a send's or deposit's flow row, or a new claim), compared
// with what this attempt wrote (time, amounts, seq): the group is atomic, so
// that row tells for all of it. A group that wrote no such row (credits and
// repeats only) answers ErrCommitUnknown; its retry settles it.
func (m *MySQL) CommitGroup(ctx context.Context, list []Op) error {
	ops, typed, err := SplitOps(list)
	if err != nil || typed != nil {
		if err != nil {
			return err
		}
		return Dispatch(ctx, typed, m.couponOps, m.budgetOps, m.rewardOps, m.bookOps, m.archiveOps)
	}
	if len(ops) == 0 {
		return nil
	}
	if err := m.ensureGroup(ctx, ops); err != nil {
		return err
	}
	if alone, err := m.storeAlone(ctx, ops); alone {
		return err
	}
	// Each open's seed, taken once: every run of the transaction draws the
	// same shares (model.DrawSeed).
	BeginGroup(ops)
	// A group that locks packet or wallet rows runs its bulk lists without
	// savepoints only while such groups have not had to run again lately
	// (unfitQuiet): where unfit lists are routine (credits delivered again
	// after an outage, say), each would cost the whole group twice.
	locks := false
	for _, op := range ops {
		switch op.(type) {
		case *OpenOp, *SendOp, *DepositOp, *WithdrawOp, *RefundOp:
			locks = true
		}
	}
	freshFirst := !locks || m.nowMS()-m.unfitMS.Load() >= unfitQuiet.Milliseconds()
	var probe func() (bool, error)
	readClaims := false // optimistic: uk_claim refuses a repeat (groupTx)
	hereSaved := false  // the opens' same-cell credits behind a savepoint (groupTx)
	err = bulkRetry(func(fresh bool) error {
		if !fresh && locks {
			m.unfitMS.Store(m.nowMS()) // bulkRetry's second run: a list was unfit
		}
		fresh = fresh && freshFirst
		for {
			err := m.inTx(ctx, func(tx *sql.Tx) error {
				var err error
				probe, err = m.groupTx(ctx, tx, ops, fresh, readClaims, hereSaved)
				return err
			})
			if errors.Is(err, errHereUnfit) && !hereSaved {
				hereSaved = true
				continue
			}
			if !errors.Is(err, errClaimsNeeded) || readClaims {
				return err
			}
			m.claimRereads.Add(1)
			readClaims = true
		}
	})
	// A booker's take left rewards whose wallet tables were not made sure
	// of (takeAndBookTx): make them now, outside the transaction. A failure
	// here answers nothing: the group's outcome is err's, and those rewards
	// stay as they are for a later pass, which tries again.
	var shards []model.ShardID
	for _, op := range ops {
		if b, ok := op.(*BookOp); ok {
			shards = append(shards, b.tablesFirst...)
			b.tablesFirst = nil
		}
	}
	if len(shards) > 0 {
		_ = m.EnsureShards(ctx, shards)
	}
	if errors.Is(err, errCommitUnknown) && probe != nil {
		if ok, known := m.settleCommit(ctx, probe); known && ok {
			return nil // applied by this group's own COMMIT
		}
	}
	if err != nil {
		return fmt.Errorf("storage: group of %d: %w", len(ops), err)
	}
	return nil
}

// Read implements Reader.
func (m *MySQL) Read(ctx context.Context, q Query) error {
	return Dispatch(ctx, q, m.couponReads, m.budgetReads, m.rewardReads, m.bookReads)
}

// ensureGroup makes the tables the ops touch exist, outside the transaction
// (DDL would commit it).
func (m *MySQL) ensureGroup(ctx context.Context, ops []MoneyOp) error {
	for _, op := range ops {
		var err error
		switch op := op.(type) {
		case *OpenOp:
			err = m.EnsureDay(ctx, op.Ref.Shard, op.Ref.Day)
		case *SendOp:
			ref, perr := model.ParsePacketID(string(op.PacketID))
			if perr != nil || ref.Shard != op.Shard {
				return fmt.Errorf("storage: group send with packet ID %q of another shard", op.PacketID)
			}
			err = m.EnsureDay(ctx, op.Shard, ref.Day)
		case *DepositOp:
			err = m.EnsureShard(ctx, op.Shard)
		case *WithdrawOp:
			err = m.EnsureShard(ctx, op.Shard)
		case *CreditsOp:
			err = m.EnsureShards(ctx, op.Shards())
		case *BookOp:
			_, err = m.ensureRewardBooking(ctx, op.Rewards)
		case *IssueOp:
			if !op.Reward.Shard.Valid() {
				return fmt.Errorf("storage: group issue of reward %q without a shard", op.Reward.OrderNo)
			}
			err = m.ensureRewards(ctx, op.Reward.Shard.DB())
			if err == nil && op.Reward.IntoWallet() {
				// Its booking's wallet tables, made now: a booker's take
				// runs in a transaction, where DDL cannot (takeAndBookTx).
				err = m.EnsureShard(ctx, op.Reward.Shard)
			}
		case *AcceptOp:
			if op.Coupon.Shard.Valid() { // else the op answers ErrInvalidArgument
				err = m.ensureCoupons(ctx, op.Coupon.Shard.DB())
			}
		case *RefundOp:
			// The packet's tables, and its shard's, where its sender's wallet is.
			if err = m.EnsureShard(ctx, op.Ref.Shard); err == nil {
				err = m.EnsureDay(ctx, op.Ref.Shard, op.Ref.Day)
			}
		default:
			return fmt.Errorf("storage: group op %T of no known kind", op)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

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

// groupTx locks, decides, writes. It returns a probe that tells, after a
// COMMIT without an answer, whether the group was applied (nil when the
// group wrote nothing a probe can find). It may run more than once (inTx).
//
// fresh: the first run of the group: its bulk lists (credits, issues,
// accepts) go without a SAVEPOINT, wherever they come in the transaction,
// and one that cannot be written whole answers errBulkUnfit, which rolls
// the whole group back to run again with savepoints (bulkRetry). A group's
// rare unfit list costs a second run; every other group a statement less
// per list.
//
// readClaims: the openers' earlier claims are read with the locks. Without
// it, they are read after the locks only when an open's answer would be a
// refusal (refusalAhead), and groupTx answers errClaimsNeeded (having
// written nothing that stays: the caller rolls back) when the unique key
// refuses a new claim.
//
// hereSaved: the opens' same-cell credits (OpenOp.CreditHere) go behind a
// savepoint, so a held row (a wallet, or the gap of a flow index another
// group's order-number read locks) defers its credit to the relay alone.
// Without it they go without one, and a held row answers errHereUnfit: the
// group runs again with hereSaved. One run more, for that group only: the
// groups after keep their lists without savepoints (unfitMS is not set, as
// it is for an unfit credit batch).
func (m *MySQL) groupTx(ctx context.Context, tx *sql.Tx, ops []MoneyOp, fresh, readClaims, hereSaved bool) (func() (bool, error), error) {
	ResetAnswers(ops) // answers of an earlier run of this transaction
	st, err := m.groupRead(ctx, tx, ops, readClaims)
	if err != nil {
		return nil, err
	}
	now := m.nowMS()
	st.m, st.ctx, st.now, st.claimsRead, st.w.dest = m, ctx, now, readClaims, m.creditDest
	if !readClaims && refusalAhead(st, ops, now) {
		// A refusal ahead: read the claims now, in this transaction.
		if err := m.readClaims(ctx, tx, st, ops); err != nil {
			return nil, err
		}
		st.claimsRead = true
	}
	if err := m.lockRefundWallets(ctx, tx, st, ops, now); err != nil {
		return nil, err
	}
	var (
		creditOps []*CreditsOp
		bookOps   []*BookOp
		issueOps  []*IssueOp
		acceptOps []*AcceptOp
	)
	for _, op := range ops {
		decided, err := Decide(st, op)
		if err != nil {
			return nil, err // errClaimsNeeded: refusalAhead foresees every refusal; should one come all the same, the group runs again with the claims read
		}
		if decided {
			continue
		}
		switch op := op.(type) {
		case *CreditsOp:
			creditOps = append(creditOps, op)
		case *BookOp:
			bookOps = append(bookOps, op)
		case *IssueOp:
			if op.Reward.CreatedMS == 0 {
				op.Reward.CreatedMS = now
			}
			issueOps = append(issueOps, op)
		case *AcceptOp:
			acceptOps = append(acceptOps, op)
		}
	}
	if q, args := st.w.sql(m); q != "" {
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			if !st.claimsRead && isMySQLErr(err, errDupEntry) && strings.Contains(err.Error(), "'uk_claim'") {
				// uk_claim refused a repeat; any other key's duplicate
				// is an error of the group.
				return nil, errClaimsNeeded
			}
			return nil, err
		}
	}
	probe := st.probe
	// The opens' same-cell credits (OpenOp.CreditHere), before the credit
	// batches: one bulk list for all, no wait for a held wallet or table.
	// Only to shards whose wallet tables this process made sure of: no DDL
	// on an open's path (the relay's delivery makes them).
	var here []model.Credit
	for _, op := range ops {
		if o, ok := op.(*OpenOp); ok && len(o.here) > 0 {
			o.here = slices.DeleteFunc(o.here, func(c model.Credit) bool { return !m.ensuredOK(ensureKey{shard: c.Shard}) })
			here = append(here, o.here...)
		}
	}
	if len(here) > 0 {
		_, deferred, err := m.creditsHereTx(ctx, tx, here, now, fresh && !hereSaved)
		if errors.Is(err, errBulkUnfit) {
			return nil, errHereUnfit
		}
		if err != nil {
			return nil, err
		}
		for _, op := range ops {
			if o, ok := op.(*OpenOp); ok && len(o.Here()) > 0 {
				o.MarkCredited(deferred)
			}
		}
	}
	for _, op := range creditOps { // each op's credits on their own, so each is counted on its own
		var err error
		op.Applied, op.Deferred, err = m.applyCreditsTx(ctx, tx, op.Credits, now, fresh)
		if err != nil {
			return nil, err
		}
	}
	// A booker's batch books rewards stored before this group, never its
	// own issues (as memstore: the rows a group stores are not there for
	// its take), so it goes before them.
	for _, op := range bookOps {
		if op.Take == nil {
			continue
		}
		booked, left, shards, err := m.takeAndBookTx(ctx, tx, *op.Take, now)
		if err != nil {
			return nil, err
		}
		op.Rewards, op.Applied, op.Deferred, op.tablesFirst = booked, len(booked), left, shards
	}
	if len(issueOps) > 0 {
		p, err := m.issueRewardsTx(ctx, tx, issueOps, fresh)
		if err != nil {
			return nil, err
		}
		// As an accept's (below): another group's copy of a reward looks
		// like this one's, so the probe settles a group of issues alone.
		if probe == nil && len(issueOps) == len(ops) {
			probe = p
		}
	}
	if len(acceptOps) > 0 {
		p, err := m.acceptCouponsTx(ctx, tx, acceptOps, now, fresh)
		if err != nil {
			return nil, err
		}
		// An accept's probe could take another group's row for this one's
		// (acceptCouponsTx): it settles only a group of accepts alone, never
		// the other ops of a mixed group.
		if probe == nil && len(acceptOps) == len(ops) {
			probe = p
		}
	}
	for _, op := range bookOps {
		if op.Take != nil {
			continue // booked before the issues (above)
		}
		booked, err := m.bookRewardsTx(ctx, tx, op.Rewards, now)
		if err != nil {
			return nil, err
		}
		op.Applied = len(booked)
	}
	for _, r := range st.repeats {
		first, err := model.ParsePacketID(string(r.id))
		if err != nil {
			return nil, fmt.Errorf("storage: flow row holds bad packet id %q: %w", r.id, err)
		}
		p, err := scanPacket(tx.QueryRowContext(ctx, "SELECT "+packetCols+" FROM "+m.packetTable(first.Shard, first.Day)+
			" WHERE packet_id = ?", string(first.ID)))
		if archived(err) { // an order repeated after its packet was archived
			p, err = scanPacket(tx.QueryRowContext(ctx, "SELECT "+packetCols+" FROM "+m.packetTable(first.Shard, ArchiveDay)+
				" WHERE packet_id = ?", string(first.ID)))
		}
		if err != nil {
			return nil, fmt.Errorf("storage: read the first packet %s of a send's order: %w", r.id, err)
		}
		*r.into = p
	}
	return probe, nil
}

// flowProbe tells whether flow row want, as this attempt wrote it (its
// amount, balance after and time, not only its order number: a retry of the
// order through another writer would have the same key), is in the table.
func (m *MySQL) flowProbe(ctx context.Context, fk groupFlowKey, want model.Flow) func() (bool, error) {
	return func() (bool, error) {
		f, ok, err := m.findFlow(ctx, m.db, fk.shard, fk.act, fk.order)
		return ok && f == want, err
	}
}

// unfitQuiet is how long after a group that locks rows had to run again for
// an unfit bulk list such groups keep their savepoints (CommitGroup).
const unfitQuiet = time.Second

// errHereUnfit: an open's same-cell credits, without a savepoint, met a
// held row (groupTx); the transaction is rolled back and run again with
// them behind one.
var errHereUnfit = errors.New("storage: an open's same-cell credits met a held row; run again with a savepoint")

// errClaimsNeeded: a group decided without the openers' earlier claims must
// run again with them (groupTx); the transaction is rolled back.
var errClaimsNeeded = errors.New("storage: the openers' earlier claims are needed")

// refusedAny tells whether an open's answers hold an error (SOLD_OUT,
// EXPIRED), which a user's earlier claim would have replaced.
func refusedAny(rs []model.OpenResult) bool {
	for _, r := range rs {
		if r.Err != nil {
			return true
		}
	}
	return false
}

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
	type reader func(*sql.Rows) error
	var readers []reader
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
		readers = append(readers, func(rows *sql.Rows) error {
			var s model.ShardID
			var f model.Flow
			var after sql.NullInt64
			if err := rows.Scan(&s, &f.ActID, &f.OrderNo, &f.Kind, &f.Amount, &after, &f.Ref, &f.ReqHash, &f.CreatedMS); err != nil {
				return err
			}
			f.BalanceAfter, f.BalanceKnown = model.Cents(after.Int64), after.Valid
			st.flows[groupFlowKey{s, f.ActID, f.OrderNo}] = f
			return nil
		})
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
	q, args := r.sql()
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: group read: %w", err)
	}
	defer rows.Close()
	for i, read := range readers {
		if i > 0 && !rows.NextResultSet() {
			if err := rows.Err(); err != nil {
				return nil, fmt.Errorf("storage: group read: %w", err)
			}
			return nil, fmt.Errorf("storage: group read: %d result sets, want %d", i, len(readers))
		}
		for rows.Next() {
			if err := read(rows); err != nil {
				return nil, fmt.Errorf("storage: group read: %w", err)
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("storage: group read: %w", err)
		}
	}
	return st, rows.Close()
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
