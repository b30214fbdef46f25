package storage

import (
	"context"
	"errors"

	"redcell/model"
)

// The store contract. A cell's money lives behind these interfaces; two stores
// implement them: MySQL (MariaDB, what cells run on) and memstore.Store (in
// memory, for the simulation and fast unit tests). Both pass one contract
// suite, storage/storagetest, which states each promise below as a test.
//
// Common to every method: amounts are int64 cents (model.Cents), times are
// Unix milliseconds read from the store's clock, a shard is 0..999 and a
// database index 0..99 (shard/10). Errors with a code are model sentinels,
// matched with errors.Is; any other error is an infrastructure failure.
// Every call is safe for concurrent use.
//
// Every balance change is a flow row keyed by the UNIQUE pair (act_id, order
// number), written in the same transaction as the change, so nothing applies
// twice: caller order numbers for deposits and sends, "refund:"+packet ID for
// a refund, "claim:"+claim ID for a credit (model.RefundOrderNo,
// model.CreditOrderNo).

// ErrCommitUnknown: a call that writes money could not learn whether its
// COMMIT applied (the connection or server failed at COMMIT, or the answer
// was lost). The call answers it only after failing to settle the outcome;
// a retry with the same order number (packet, claim) settles it, never
// applying twice. Match with errors.Is.
var ErrCommitUnknown = errors.New("storage: commit outcome unknown")

// Books is what the audits read (reconciliation reads through Read:
// ReconWindowQuery, CreditsOfQuery, ReconPositionsQuery; ops_books.go).
type Books interface {
	// CellAudit checks this store's books as model.AuditCell checks its
	// Ledger, with the same result (for MariaDB within the bounds
	// MySQL.CellAudit gives), but with memory bounded whatever the number of
	// rows: sums and joins run where the rows are, and only problem rows come
	// back (counted whole, named by the few claim IDs a problem line shows).
	// Its Cell is cell; owns says which shards are the cell's.
	CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error)
	// Ledger reads every money row in one snapshot, as sums (deposits,
	// balances, sends, packet totals, remainders, refunds) and as rows
	// (claims, with their Dest, and credits, by claim ID), and lists row-level
	// problems (a balance that is not the sum of its flows, a packet whose
	// claims, refund and remainder do not add up, a claim credited twice).
	// Its Cell is cell. model.AuditCell and model.Audit check it.
	Ledger(ctx context.Context, cell string) (model.Ledger, error)
}

// Schema creates tables ahead of need. A store without tables (memstore)
// answers nil.
type Schema interface {
	// EnsureShard makes the shard's wallet and flow tables, and its
	// database's relay position table, exist.
	EnsureShard(ctx context.Context, s model.ShardID) error
	// EnsureDays makes the packet and claim tables of every shard for each of
	// days exist, with up to parallel workers, calling progress (if not nil,
	// never concurrently) after each shard with done counting up to total.
	EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error
}

// Store is everything a cell needs from its database.
type Store interface {
	Schema
	Books
	Grouper
	Reader
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}
