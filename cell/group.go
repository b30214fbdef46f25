package cell

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"redcell/cell/groupcommit"
	"redcell/model"
	"redcell/storage"
)

// The cell's side of group commit (every write; opens under strategy
// grouped) is the writer: which lane an op joins,
// how a lane's group reaches its space's store, and the requests that go
// through the committer instead of a transaction of their own.

// writer writes the cell's money: every write goes through it, as an op in
// its commit lane's group (groupcommit.Committer), but the opens of the
// strategies that do not group (openAlone). It holds only what a write
// needs: the committer, the spaces' stores, the ownership (a group writes
// only shards the cell serves), the open path's counters (dbOps) and
// strategy (its GroupMax splits credit batches). Safe for concurrent use;
// built by Server.initOpenPath, stopped by Serve (groups.Stop) after
// everything that writes through it.
type writer struct {
	groups   *groupcommit.Committer
	spaces   [2]*space
	own      *ownership
	stats    *stats
	lanes    int           // Config.CommitLanes
	strategy *openStrategy // read for GroupMax at each credit batch
	// afterOpen is Server.afterOpen: a grouped batch whose group still
	// commits when its submitter gives up hands its claims over with it
	// when the group ends (openGrouped).
	afterOpen func(sp *space, p model.Packet, results []model.OpenResult) bool
}

// laneQueueMax bounds the requests one commit lane holds queued (a hot
// packet's batch counts its opens): 64 full groups at the largest GroupMax,
// far beyond what the bounded packet queues and the connections of one cell
// put there; past it a request is shed (OVERLOADED).
const laneQueueMax = 64 * 4096

// commitGroup is the committer's CommitFunc: the group goes to the store of
// the lane's space.
//
// A group is work a freeze of any database its ops write waits for
// (ownership.enterDB), and it commits only the ops whose shards the cell
// still serves: an op whose submitter gave up waiting (its deadline passed)
// may reach its group after a freeze began, and answers ErrMoving then, with
// nothing written.
//
// The opens' same-cell claimants are credited in the group's own
// transaction (storage.OpenOp.CreditHere): their databases are entered with
// the group's, so a freeze of one waits for the group, and the check of a
// claimant's shard is made inside the transaction, after the entry.
func (w *writer) commitGroup(ctx context.Context, ln groupcommit.Lane, ops []storage.MoneyOp) error {
	var dbs []int
	for _, op := range ops {
		dbs = opDBs(dbs, op)
		if o, ok := op.(*storage.OpenOp); ok {
			dbs = claimantDBs(dbs, o)
		}
	}
	leave := w.own.enterDBs(dbs)
	defer leave()
	sp := w.spaces[ln.Space]
	keep := ops[:0:0]
	for _, op := range ops {
		if err := w.opServed(op); err != nil {
			op.Fail(err)
			continue
		}
		if o, ok := op.(*storage.OpenOp); ok {
			o.CreditHere = w.creditHere(sp)
		}
		keep = append(keep, op)
	}
	if len(keep) == 0 {
		return nil
	}
	if err := w.spaces[ln.Space].store.CommitGroup(ctx, storage.Ops(keep)); err != nil {
		return err
	}
	for _, op := range keep {
		if sh := op.Shards(); len(sh) > 0 {
			w.stats.dbOps[sh[0].DB()].Add(1)
		}
	}
	return nil
}

// opDBs appends the databases of the shards op writes (those opServed
// checks) to dbs.
func opDBs(dbs []int, op storage.MoneyOp) []int {
	for _, sh := range op.Shards() {
		dbs = append(dbs, sh.DB())
	}
	return dbs
}

// claimantDBs appends the databases of op's openers' shards to dbs: where
// their credits go when the group books them (creditHere).
func claimantDBs(dbs []int, op *storage.OpenOp) []int {
	for _, r := range op.Reqs {
		dbs = append(dbs, r.Shard.DB())
	}
	return dbs
}

// creditHere is an open's storage.OpenOp.CreditHere in space sp: a
// claimant's shard the cell serves now (owned, its database not frozen),
// whose database the caller entered (claimantDBs); nil, crediting nothing
// in the open's transaction, while the relay is switched off (its degrade
// switch holds every credit back).
func (w *writer) creditHere(sp *space) func(model.ShardID) bool {
	if sp.relay != nil && sp.relay.Off() {
		return nil
	}
	return func(sh model.ShardID) bool { return w.own.check(sh) == nil }
}

// opServed checks that the cell serves every shard op writes: nil, or the
// first shard's ErrMoving or ErrWrongCell.
func (w *writer) opServed(op storage.MoneyOp) error {
	for _, sh := range op.Shards() {
		if err := w.own.check(sh); err != nil {
			return err
		}
	}
	return nil
}

// laneOf names the commit lane of work in database db of space sp: the
// database itself, or db % CommitLanes when lanes are shared.
func (w *writer) laneOf(sp *space, db int) groupcommit.Lane {
	id := db
	if n := w.lanes; n > 0 {
		id = db % n
	}
	return groupcommit.Lane{Space: sp.index(), ID: id}
}

// submit runs op in its lane's group and returns the op's own error when the
// group committed, else the group's (groupcommit.Committer.Submit).
func (w *writer) submit(ctx context.Context, sp *space, db int, op storage.MoneyOp) error {
	if err := w.groups.Submit(ctx, w.laneOf(sp, db), op); err != nil {
		return err
	}
	return op.Failed()
}

// submitStore is submit for an op that stores one row under an
// idempotency key (a reward's order number, a coupon request's serial): a
// group still committing when ctx ends leaves the outcome unknown, as a
// lost COMMIT answer does (storage.ErrCommitUnknown: a retry with the key
// settles it).
func (w *writer) submitStore(ctx context.Context, sp *space, db int, op storage.MoneyOp) error {
	err := w.submit(ctx, sp, db, op)
	if errors.Is(err, groupcommit.ErrInFlight) {
		return fmt.Errorf("%w: %w", storage.ErrCommitUnknown, err)
	}
	return err
}

// openGrouped commits one packet's batch of opens in its lane's group:
// storage.OpenBatch's answers. r must not be reused when the error
// wraps groupcommit.ErrInFlight (the group still draws from it).
//
// A batch whose group was still committing when ctx ended has its claims
// handed to the relay when the group ends (afterOpen, from a goroutine of
// its own that lives as long as the group): no answer carries them, and
// their retries are repeats, which hand the relay nothing. When that
// group's outcome is unknown, the relay reads the database's claims back
// from since instead (relay.Relay.MarkDB).
func (w *writer) openGrouped(ctx context.Context, sp *space, ref model.PacketRef, reqs []model.OpenRequest, r *mrand.Rand, since time.Time) ([]model.OpenResult, model.Packet, error) {
	op := &storage.OpenOp{Ref: ref, Reqs: reqs, Rand: r}
	if err := w.submit(ctx, sp, ref.Shard.DB(), op); err != nil {
		if wait, ok := groupcommit.InFlight(err); ok {
			go func() {
				switch gerr := wait(); {
				case gerr == nil:
					w.afterOpen(sp, op.Packet, op.Results)
				case errors.Is(gerr, storage.ErrCommitUnknown):
					sp.relay.MarkDB(ref.Shard.DB(), since)
				}
			}()
		}
		return nil, model.Packet{}, err
	}
	return op.Results, op.Packet, nil
}

// refundGrouped is storage.Refund through the packet's lane (storage.RefundOp):
// the cents refunded and the packet as the refund left it. Errors:
// ErrNotFound, ErrMoving or ErrWrongCell (the cell no longer serves the
// packet's shard; nothing written), the committer's.
func (w *writer) refundGrouped(ctx context.Context, sp *space, ref model.PacketRef) (model.Cents, model.Packet, error) {
	op := &storage.RefundOp{Ref: ref}
	if err := w.submitStore(ctx, sp, ref.Shard.DB(), op); err != nil {
		return 0, model.Packet{}, err
	}
	return op.Refunded, op.Packet, nil
}

// openAlone commits one packet's batch of opens in a transaction of its own
// (the strategies that do not group: naive, serial, batched): a group of one
// op (storage.OpenOp) on the space's store, not through the committer. Its
// answers are storage.OpenBatch's. The caller entered the packet's
// database; the claimants' are entered here, for their credits in the same
// transaction (creditHere).
func (w *writer) openAlone(ctx context.Context, sp *space, ref model.PacketRef, reqs []model.OpenRequest, r *mrand.Rand) ([]model.OpenResult, model.Packet, error) {
	op := &storage.OpenOp{Ref: ref, Reqs: reqs, Rand: r}
	leave := w.own.enterDBs(claimantDBs(nil, op))
	defer leave()
	op.CreditHere = w.creditHere(sp)
	if err := sp.store.CommitGroup(ctx, []storage.Op{op}); err != nil {
		return nil, model.Packet{}, fmt.Errorf("open %s: %w", ref.ID, err)
	}
	return op.Results, op.Packet, nil
}

// sendGrouped is storage.Send through the sender's lane.
func (w *writer) sendGrouped(ctx context.Context, sp *space, sh model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (model.Packet, bool, error) {
	op := &storage.SendOp{Shard: sh, Req: req, PacketID: id, ExpiresMS: expiresMS}
	if err := w.submit(ctx, sp, sh.DB(), op); err != nil {
		return model.Packet{}, false, err
	}
	return op.Packet, op.Repeat, nil
}

// depositGrouped is storage.Deposit through the depositor's lane.
func (w *writer) depositGrouped(ctx context.Context, sp *space, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Deposit, error) {
	op := &storage.DepositOp{Shard: sh, ActID: actID, OrderNo: orderNo, Amount: amount}
	if err := w.submit(ctx, sp, sh.DB(), op); err != nil {
		return model.Deposit{}, err
	}
	return op.Deposit, nil
}

// withdrawGrouped is storage.Withdraw through the account's lane
// (storage.WithdrawOp).
func (w *writer) withdrawGrouped(ctx context.Context, sp *space, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error) {
	op := &storage.WithdrawOp{Shard: sh, ActID: actID, OrderNo: orderNo, Amount: amount}
	if err := w.submitStore(ctx, sp, sh.DB(), op); err != nil {
		return model.Withdrawal{}, err
	}
	return op.Withdrawal, nil
}

// relayStore is the relay's view of a space's store: the credits the relay
// books in this cell (its own claimants) go through the committer, as the
// credits other cells deliver do.
type relayStore struct {
	storage.Store
	w  *writer
	sp *space
}

// ApplyCredits implements relay.Store.
// The relay's local lane calls it after keeping only the credits of shards
// the cell serves (relay.Config.Owns) inside relay.Config.Enter.
func (r relayStore) ApplyCredits(ctx context.Context, credits []model.Credit) (int, []string, error) {
	return r.w.applyCreditsGrouped(ctx, r.sp, credits)
}

// applyCreditsGrouped is storage.ApplyCredits through the committer:
// the credits are split by the claimant's lane (so no transaction spans two
// lanes) into ops of at most GroupMax credits. Lanes commit in parallel; the
// ops of one lane are submitted one after another. applied and deferred sum
// every op that committed; the error is the first failed op's (what committed
// stays booked: a retry of the whole batch books the rest, each credit once).
func (w *writer) applyCreditsGrouped(ctx context.Context, sp *space, credits []model.Credit) (applied int, deferred []string, err error) {
	type laneWork struct {
		lane     groupcommit.Lane
		credits  []model.Credit
		applied  int
		deferred []string
		err      error
	}
	var lanes []*laneWork
	byLane := map[groupcommit.Lane]*laneWork{}
	for _, c := range credits {
		ln := w.laneOf(sp, c.Shard.DB())
		lw := byLane[ln]
		if lw == nil {
			lw = &laneWork{lane: ln}
			byLane[ln] = lw
			lanes = append(lanes, lw)
		}
		lw.credits = append(lw.credits, c)
	}
	chunk := max(1, w.strategy.Strategy().GroupMax)
	var wg sync.WaitGroup
	for _, lw := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cs := lw.credits; len(cs) > 0 && lw.err == nil; {
				n := min(chunk, len(cs))
				op := &storage.CreditsOp{Credits: cs[:n:n]}
				if lw.err = w.groups.Submit(ctx, lw.lane, op); lw.err == nil {
					lw.err = op.Err
				}
				if lw.err == nil {
					lw.applied += op.Applied
					lw.deferred = append(lw.deferred, op.Deferred...)
				}
				cs = cs[n:]
			}
		}()
	}
	wg.Wait()
	for _, lw := range lanes {
		applied += lw.applied
		deferred = append(deferred, lw.deferred...)
		if lw.err != nil && err == nil {
			err = lw.err
		}
	}
	return applied, deferred, err
}
