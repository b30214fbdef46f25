package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

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
	m.ensureTakenShards(ctx, ops)
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

// ensureTakenShards makes, outside the transaction, the wallet tables a
// booker's take left rewards for without having made sure of them
// (takeAndBookTx), and clears BookOp.tablesFirst. A failure answers
// nothing: the group's outcome is its transaction's, and those rewards stay
// as they are for a later pass, which tries again.
func (m *MySQL) ensureTakenShards(ctx context.Context, ops []MoneyOp) {
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
	later, err := groupDecide(st, ops, now)
	if err != nil {
		return nil, err
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
	if err := m.groupCreditsHere(ctx, tx, ops, now, fresh, hereSaved); err != nil {
		return nil, err
	}
	probe, err = m.groupLaterTx(ctx, tx, ops, later, probe, now, fresh)
	if err != nil {
		return nil, err
	}
	if err := m.readRepeatedSends(ctx, tx, st); err != nil {
		return nil, err
	}
	return probe, nil
}

// groupLater holds the ops of a group that Decide leaves to statements of
// their own, by kind, each in list order.
type groupLater struct {
	creditOps []*CreditsOp
	bookOps   []*BookOp
	issueOps  []*IssueOp
	acceptOps []*AcceptOp
}

// groupDecide runs Decide on every op of the group, in list order, on st
// (an issue without a creation time gets now), and returns the ops left to
// statements of their own. Errors: Decide's (errClaimsNeeded).
func groupDecide(st *groupState, ops []MoneyOp, now int64) (groupLater, error) {
	var l groupLater
	for _, op := range ops {
		decided, err := Decide(st, op)
		if err != nil {
			return l, err // errClaimsNeeded: refusalAhead foresees every refusal; should one come all the same, the group runs again with the claims read
		}
		if decided {
			continue
		}
		switch op := op.(type) {
		case *CreditsOp:
			l.creditOps = append(l.creditOps, op)
		case *BookOp:
			l.bookOps = append(l.bookOps, op)
		case *IssueOp:
			if op.Reward.CreatedMS == 0 {
				op.Reward.CreatedMS = now
			}
			l.issueOps = append(l.issueOps, op)
		case *AcceptOp:
			l.acceptOps = append(l.acceptOps, op)
		}
	}
	return l, nil
}

// groupCreditsHere stores the group's opens' same-cell credits
// (OpenOp.CreditHere), before the credit batches: one bulk list for all, no
// wait for a held wallet or table. Only to shards whose wallet tables this
// process made sure of: no DDL on an open's path (the relay's delivery makes
// them). Errors: errHereUnfit (a held row: run again with a savepoint),
// the database's.
func (m *MySQL) groupCreditsHere(ctx context.Context, tx *sql.Tx, ops []MoneyOp, now int64, fresh, hereSaved bool) error {
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
			return errHereUnfit
		}
		if err != nil {
			return err
		}
		for _, op := range ops {
			if o, ok := op.(*OpenOp); ok && len(o.Here()) > 0 {
				o.MarkCredited(deferred)
			}
		}
	}
	return nil
}

// groupLaterTx runs in tx the ops groupDecide left (l): the credit
// batches, each on its own, the bookers' takes, the issues, the accepts,
// then the bookings of given rewards. It returns probe, or, when it is nil
// and the group is only issues or only accepts, their probe. Errors: the
// database's.
func (m *MySQL) groupLaterTx(ctx context.Context, tx *sql.Tx, ops []MoneyOp, l groupLater, probe func() (bool, error), now int64, fresh bool) (func() (bool, error), error) {
	for _, op := range l.creditOps { // each op's credits on their own, so each is counted on its own
		var err error
		op.Applied, op.Deferred, err = m.applyCreditsTx(ctx, tx, op.Credits, now, fresh)
		if err != nil {
			return nil, err
		}
	}
	// A booker's batch books rewards stored before this group, never its
	// own issues (as memstore: the rows a group stores are not there for
	// its take), so it goes before them.
	for _, op := range l.bookOps {
		if op.Take == nil {
			continue
		}
		booked, left, shards, err := m.takeAndBookTx(ctx, tx, *op.Take, now)
		if err != nil {
			return nil, err
		}
		op.Rewards, op.Applied, op.Deferred, op.tablesFirst = booked, len(booked), left, shards
	}
	if len(l.issueOps) > 0 {
		p, err := m.issueRewardsTx(ctx, tx, l.issueOps, fresh)
		if err != nil {
			return nil, err
		}
		// As an accept's (below): another group's copy of a reward looks
		// like this one's, so the probe settles a group of issues alone.
		if probe == nil && len(l.issueOps) == len(ops) {
			probe = p
		}
	}
	if len(l.acceptOps) > 0 {
		p, err := m.acceptCouponsTx(ctx, tx, l.acceptOps, now, fresh)
		if err != nil {
			return nil, err
		}
		// An accept's probe could take another group's row for this one's
		// (acceptCouponsTx): it settles only a group of accepts alone, never
		// the other ops of a mixed group.
		if probe == nil && len(l.acceptOps) == len(ops) {
			probe = p
		}
	}
	for _, op := range l.bookOps {
		if op.Take != nil {
			continue // booked before the issues (above)
		}
		booked, err := m.bookRewardsTx(ctx, tx, op.Rewards, now)
		if err != nil {
			return nil, err
		}
		op.Applied = len(booked)
	}
	return probe, nil
}

// readRepeatedSends reads, for each repeated send of the group
// (st.repeats), the packet its order made first, from its day table or, once
// archived, from the archive. Errors: a bad packet ID in the flow row, the
// database's.
func (m *MySQL) readRepeatedSends(ctx context.Context, tx *sql.Tx, st *groupState) error {
	for _, r := range st.repeats {
		first, err := model.ParsePacketID(string(r.id))
		if err != nil {
			return fmt.Errorf("storage: flow row holds bad packet id %q: %w", r.id, err)
		}
		p, err := scanPacket(tx.QueryRowContext(ctx, "SELECT "+packetCols+" FROM "+m.packetTable(first.Shard, first.Day)+
			" WHERE packet_id = ?", string(first.ID)))
		if archived(err) { // an order repeated after its packet was archived
			p, err = scanPacket(tx.QueryRowContext(ctx, "SELECT "+packetCols+" FROM "+m.packetTable(first.Shard, ArchiveDay)+
				" WHERE packet_id = ?", string(first.ID)))
		}
		if err != nil {
			return fmt.Errorf("storage: read the first packet %s of a send's order: %w", r.id, err)
		}
		*r.into = p
	}
	return nil
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
