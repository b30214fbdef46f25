package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"redcell/model"
)

// creditRowsMax is the most credits one statement list (creditAll) or one
// shard's bulk statement books: the relay's batches (500) fit in one, and a
// 10,000-credit call (creditsPerCallMax of the cell) becomes ten lists of
// about 1 MB each, well under max_allowed_packet. (A shard whose credits
// straddle two lists is counted in creditPaths.Bulk once per list.)
const creditRowsMax = 1000

// creditPaths counts, since the store was opened, the shards' credit groups
// of two or more credits booked by each path of applyCreditsTx: Bulk in two
// statements (in the batch's one round trip or in the shard's own),
// OneByOne credit by credit after the bulk statements could not be written
// whole. (A lone credit of a shard that falls back goes straight to
// creditOne.) Fallback counts the batches (of up to creditRowsMax credits)
// that could not be booked in one round trip.
type creditPaths struct {
	Bulk, OneByOne, Fallback atomic.Int64
}

// applyCreditsTx books credits inside tx, the caller's transaction, under
// the contract of ApplyCredits: applied counts the credits booked
// now, deferred names (by claim ID, once each) those whose flow index or
// wallet row another transaction holds, with nothing written for them; every
// other credit had been booked before (or is listed twice: booked once).
// Credits may come in any order and may repeat; it sorts its own copy into
// the lock order (shard, act_id, claim ID). now is the flow rows' created_ms
// and the accounts' updated_ms (Unix ms). The shards' tables must exist
// (EnsureShard, before the transaction: DDL would commit it).
//
// First, up to creditRowsMax credits at a time, in one round trip
// (creditAll): a SAVEPOINT, then per shard (one flow table, one account
// table), in lock order, one multi-row flow INSERT and one multi-row account
// upsert adding each wallet's sum, each without waiting for a lock (noWait).
// That is the common case: credits never booked, wallets nobody else holds,
// and most shards with one credit of the batch (1,000 shards), where a round
// trip per shard was most of a credit's cost. When any statement meets a
// lock or a credit booked before (a duplicate order number), the batch is
// rolled back to the savepoint and booked shard by shard: per shard the same
// two statements with ON DUPLICATE KEY UPDATE id = id on the flow INSERT (a
// credit booked before is an unchanged row, 0 rows affected) after a
// SAVEPOINT; when the INSERT shows credits booked before (fewer rows
// affected than credits), or either statement meets a lock, the shard's
// bulk part is rolled back to the savepoint and its credits are booked one
// by one (creditOne), which defers just the locked ones. So a flow row never
// stays without its balance change, nor the reverse.
//
// An error leaves tx unusable for money: the caller rolls it back. A lock
// wait timeout needs innodb_rollback_on_timeout=OFF (MariaDB's default);
// with it ON the call fails (stillInTx).
//
// fresh says the transaction runs for the first time (bulkRetry): the
// first bulk list then goes without its SAVEPOINT (one statement less), and
// when it cannot be written whole the call answers errBulkUnfit, which ends
// the transaction, whatever it wrote before the call; its caller rolls it
// back and runs it again, whole, with fresh false.
func (m *MySQL) applyCreditsTx(ctx context.Context, tx *sql.Tx, credits []model.Credit, now int64, fresh bool) (applied int, deferred []string, err error) {
	return m.bookCredits(ctx, tx, credits, now, fresh, noWait)
}

// creditsHereTx is applyCreditsTx for the credits of an open's same-cell
// claimants, in the open's own transaction (OpenOp.CreditHere): no statement
// waits for a table's metadata lock either (noWaitAny), so a wallet table
// held by a LOCK TABLES or a DDL defers the credit to the relay instead of
// holding the open.
func (m *MySQL) creditsHereTx(ctx context.Context, tx *sql.Tx, credits []model.Credit, now int64, fresh bool) (applied int, deferred []string, err error) {
	return m.bookCredits(ctx, tx, credits, now, fresh, noWaitAny)
}

// bookCredits is applyCreditsTx with nw, the prefix each statement runs
// under (noWait, noWaitAny).
func (m *MySQL) bookCredits(ctx context.Context, tx *sql.Tx, credits []model.Credit, now int64, fresh bool, nw string) (applied int, deferred []string, err error) {
	credits, deferred, err = m.dropExported(ctx, tx, credits, nw)
	if err != nil {
		return 0, nil, err
	}
	sorted := lockOrder(credits)
	for len(sorted) > 0 {
		chunk := sorted[:min(len(sorted), creditRowsMax)]
		sorted = sorted[len(chunk):]
		ok, err := m.creditAll(ctx, tx, chunk, now, fresh, nw)
		fresh = false
		if err != nil {
			return 0, nil, err
		}
		if ok {
			applied += len(chunk)
			continue
		}
		m.bulk.Fallback.Add(1)
		a, d, err := m.creditShards(ctx, tx, chunk, now, nw)
		if err != nil {
			return 0, nil, err
		}
		applied, deferred = applied+a, append(deferred, d...)
	}
	return applied, deferred, nil
}

// creditShards books cs (lock order, no repeats) shard by shard
// (creditShard): the path of a batch that could not be booked in one round
// trip.
func (m *MySQL) creditShards(ctx context.Context, tx *sql.Tx, cs []model.Credit, now int64, nw string) (applied int, deferred []string, err error) {
	for len(cs) > 0 {
		n := 1
		for n < len(cs) && cs[n].Shard == cs[0].Shard {
			n++
		}
		a, d, err := m.creditShard(ctx, tx, cs[:n], now, nw)
		if err != nil {
			return 0, nil, err
		}
		applied, deferred = applied+a, append(deferred, d...)
		cs = cs[n:]
	}
	return applied, deferred, nil
}

// lockOrder returns a sorted copy of credits in the lock order (shard,
// act_id, claim ID), with each (shard, act_id, claim ID) once: the flow row
// a credit books is unique by it, so a later listing could only repeat it.
func lockOrder(credits []model.Credit) []model.Credit {
	sorted := slices.Clone(credits)
	slices.SortStableFunc(sorted, func(a, b model.Credit) int {
		return cmp.Or(cmp.Compare(a.Shard, b.Shard), cmp.Compare(a.ActID, b.ActID), cmp.Compare(a.ClaimID, b.ClaimID))
	})
	return slices.CompactFunc(sorted, func(a, b model.Credit) bool {
		return a.Shard == b.Shard && a.ActID == b.ActID && a.ClaimID == b.ClaimID
	})
}

// creditSavepoint marks where a shard's bulk statements begin. The name is
// reused: each SAVEPOINT replaces the one before, which is done with.
const creditSavepoint = "credits_bulk"

// creditShard books cs (one shard, lock order, no repeats, at most
// creditRowsMax) in bulk, or one by one when the bulk cannot be written as a
// whole (see applyCreditsTx). A lone credit is booked by creditOne at once:
// the same two statements as the bulk's, without the savepoint.
func (m *MySQL) creditShard(ctx context.Context, tx *sql.Tx, cs []model.Credit, now int64, nw string) (applied int, deferred []string, err error) {
	if len(cs) > 1 { // one credit alone: its two statements, without a savepoint
		ok, err := m.creditBulk(ctx, tx, cs, now, nw)
		if err != nil {
			return 0, nil, err
		}
		if ok {
			m.bulk.Bulk.Add(1)
			return len(cs), nil, nil
		}
		m.bulk.OneByOne.Add(1)
	}
	for _, c := range cs {
		outcome, err := m.creditOne(ctx, tx, c, now, nw)
		if err != nil {
			return 0, nil, err
		}
		switch outcome {
		case creditApplied:
			applied++
		case creditDeferred:
			deferred = append(deferred, c.ClaimID)
		}
	}
	return applied, deferred, nil
}

// creditBulk tries to book all of cs (one shard, lock order, no repeats)
// with one flow INSERT and one account upsert. ok is false when it could not
// (some were booked before, or a row was locked): then nothing of cs is
// written (rolled back to the savepoint). An error fails the transaction.
func (m *MySQL) creditBulk(ctx context.Context, tx *sql.Tx, cs []model.Credit, now int64, nw string) (ok bool, err error) {
	s := cs[0].Shard
	flowArgsAll, acctArgs, acts := creditRows(cs, now)
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+creditSavepoint); err != nil {
		return false, fmt.Errorf("storage: credits savepoint: %w", err)
	}
	res, err := tx.ExecContext(ctx, nw+m.flowInsertRows(s, len(cs))+" ON DUPLICATE KEY UPDATE id = id", flowArgsAll...)
	if isMySQLErr(err, errLockWait) {
		return false, m.undoBulk(ctx, tx)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n != int64(len(cs)) { // some were booked before: sort them out one by one
		return false, m.undoBulk(ctx, tx)
	}
	_, err = tx.ExecContext(ctx, nw+m.accountUpsertRows(s, acts), acctArgs...)
	if isMySQLErr(err, errLockWait) {
		return false, m.undoBulk(ctx, tx)
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// creditRows are the values of the flow rows of cs (one shard, lock order,
// no repeats: 8 per credit) and of its account upsert (3 per wallet, acts
// wallets, each with the sum of its credits).
func creditRows(cs []model.Credit, now int64) (flows, accts []any, acts int) {
	flows = make([]any, 0, len(cs)*8)
	for i, c := range cs {
		out := model.ApplyCredit(model.CreditInput{Credit: c, NowMS: now})
		flows = append(flows, flowArgs(out.Flow)...)
		if i > 0 && cs[i-1].ActID == c.ActID { // one upsert row per wallet, with the sum
			accts[len(accts)-2] = accts[len(accts)-2].(model.Cents) + c.Amount
			continue
		}
		accts = append(accts, c.ActID, c.Amount, now)
		acts++
	}
	return flows, accts, acts
}

// flowInsertRows is the INSERT of n flow rows of shard s.
func (m *MySQL) flowInsertRows(s model.ShardID, n int) string {
	return "INSERT INTO " + m.flowTable(s) +
		" (act_id, order_no, kind, amount, balance_after, ref, req_hash, created_ms) VALUES " + rowsOf(n, 8)
}

// accountUpsertRows is the upsert adding to n wallets of shard s.
func (m *MySQL) accountUpsertRows(s model.ShardID, n int) string {
	return "INSERT INTO " + m.accountTable(s) + " (act_id, balance, updated_ms) VALUES " + rowsOf(n, 3) +
		" ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), updated_ms = VALUES(updated_ms)"
}

// creditAll tries to book all of cs (lock order, no repeats, at most
// creditRowsMax) in one round trip: one statement list of a SAVEPOINT and,
// per shard, the flow INSERT (without ON DUPLICATE KEY: a credit booked
// before fails it with a duplicate key) and the account upsert, each
// without waiting for a lock. ok is false when a statement met a lock or a
// duplicate: the server stops the list there, and the transaction goes back
// to the savepoint, so nothing of cs is written. An error fails the
// transaction. Fresh (applyCreditsTx): no SAVEPOINT, and errBulkUnfit
// instead of going back to it.
func (m *MySQL) creditAll(ctx context.Context, tx *sql.Tx, cs []model.Credit, now int64, fresh bool, nw string) (ok bool, err error) {
	var q strings.Builder
	if !fresh {
		q.WriteString("SAVEPOINT " + creditSavepoint + ";")
	}
	args := make([]any, 0, len(cs)*11)
	var shards []int // the sizes of the shard runs of two or more credits
	for rest := cs; len(rest) > 0; {
		n := 1
		for n < len(rest) && rest[n].Shard == rest[0].Shard {
			n++
		}
		flows, accts, acts := creditRows(rest[:n], now)
		if len(args) > 0 {
			q.WriteString(";")
		}
		q.WriteString(nw + m.flowInsertRows(rest[0].Shard, n))
		q.WriteString(";" + nw + m.accountUpsertRows(rest[0].Shard, acts))
		args = append(append(args, flows...), accts...)
		if n > 1 {
			shards = append(shards, n)
		}
		rest = rest[n:]
	}
	_, err = tx.ExecContext(ctx, q.String(), args...)
	if isMySQLErr(err, errLockWait) || isMySQLErr(err, errDupEntry) {
		if fresh {
			return false, errBulkUnfit
		}
		return false, m.undoBulk(ctx, tx)
	}
	if err != nil {
		return false, err
	}
	m.bulk.Bulk.Add(int64(len(shards)))
	return true, nil
}

// errBulkUnfit: a bulk statement list run first in its transaction without
// a SAVEPOINT (fresh) could not be written whole; the transaction is to be
// rolled back and run again with savepoints (bulkRetry).
var errBulkUnfit = errors.New("storage: the bulk list could not be written whole; run again with a savepoint")

// bulkRetry runs run(true) (its first bulk list without a SAVEPOINT, fresh)
// and, when that answers errBulkUnfit, run(false): the common case saves a
// statement per transaction, the rare one pays a rolled-back attempt.
func bulkRetry(run func(fresh bool) error) error {
	err := run(true)
	if errors.Is(err, errBulkUnfit) {
		err = run(false)
	}
	return err
}

// undoBulk takes a shard's bulk statements back after a lock wait or a
// short count: the transaction must still be open (stillInTx), and rolling
// back to the savepoint removes the flow rows just inserted. Row locks the
// statements took stay held until the transaction ends (InnoDB keeps them);
// they are on rows of this batch's own credits.
func (m *MySQL) undoBulk(ctx context.Context, tx *sql.Tx) error {
	return undoTo(ctx, tx, creditSavepoint)
}

// undoTo rolls tx back to the savepoint name after a statement list that
// stopped at a lock wait or a duplicate key; tx must still be open.
func undoTo(ctx context.Context, tx *sql.Tx, name string) error {
	if err := stillInTx(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
		return fmt.Errorf("storage: back to savepoint %s: %w", name, err)
	}
	return nil
}
