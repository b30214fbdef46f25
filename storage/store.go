package storage

import (
	"context"
	"math/rand/v2"

	"redcell/model"
)

// Wallets is the part of the store that holds balances. Every change is a flow
// row keyed by a UNIQUE order number, written in the balance's transaction.
type Wallets interface {
	// Deposit: see MySQL.Deposit. Errors: ErrOrderConflict.
	Deposit(ctx context.Context, s model.ShardID, actID, orderNo string, amount model.Cents) (model.Deposit, error)
	Account(ctx context.Context, s model.ShardID, actID string) (model.Account, error)
	// ApplyCredits books claims into wallets at most once each, without waiting
	// for a wallet row another transaction holds: applied counts the credits
	// booked now, deferred names (by claim ID) those left for a later call
	// because a row they need was locked; the rest had been booked before.
	ApplyCredits(ctx context.Context, credits []model.Credit) (applied int, deferred []string, err error)
}

// Packets is the part of the store that holds red packets and their claims.
type Packets interface {
	// Send debits the sender and creates the packet in one transaction.
	// Errors: ErrInsufficientBalance, ErrOrderConflict.
	Send(ctx context.Context, s model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (model.Packet, bool, error)
	// Packet reads one packet. Errors: ErrNotFound.
	Packet(ctx context.Context, ref model.PacketRef) (model.Packet, error)
	Claims(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) ([]model.Claim, error)
	// OpenBatch opens the packet for each request in one transaction and returns
	// the packet as it left it.
	OpenBatch(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest, r *rand.Rand) ([]model.OpenResult, model.Packet, error)
	// ClaimsOf reads, without locks, the claims the requests' users hold on the packet.
	ClaimsOf(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error)
}

// Expiry finds and refunds expired packets.
type Expiry interface {
	// ExpiredIn lists up to limit open, expired packets of the shards' tables of
	// the given days of month.
	ExpiredIn(ctx context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error)
	Refund(ctx context.Context, ref model.PacketRef) (model.Cents, error)
}

// Outbox is the claims waiting to be credited in the claimants' cells.
type Outbox interface {
	// PendingCredits pages through undelivered rows of database db created at or
	// before beforeMS, after position (afterMS, afterID); next is the last row's position.
	PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) (credits []model.Credit, next model.OutboxPos, err error)
	// MarkDelivered marks delivered credits' rows without waiting for a row
	// another transaction holds: skipped counts the rows left pending.
	MarkDelivered(ctx context.Context, credits []model.Credit) (skipped int, err error)
	// OutboxLag counts the undelivered rows of database db and the age of the
	// oldest in ms (0 when none); read for the metrics only.
	OutboxLag(ctx context.Context, db int) (pending int64, oldestMS int64, err error)
}

// Books is what reconciliation and the cell's own audit read.
type Books interface {
	// ReconWindow reads, in one consistent read, the claims created in
	// [fromMS, toMS) in the claim tables of shards (all of database db) for the
	// given days of month, and db's outbox rows of the same window; it may cut
	// the window short after limit outbox rows (see MySQL.ReconWindow).
	ReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error)
	// CreditsOf returns the credit flows booked here for the given claims, by
	// claim ID, as they are. At most 10,000 credits per call.
	CreditsOf(ctx context.Context, credits []model.Credit) (map[string]model.Credit, error)
	// Ledger reads every money row in one snapshot (MySQL.Ledger).
	Ledger(ctx context.Context, cell string) (model.Ledger, error)
}

// Schema creates tables ahead of need.
type Schema interface {
	EnsureShard(ctx context.Context, s model.ShardID) error
	EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error
}

// Store is everything a cell needs from its database.
type Store interface {
	Wallets
	Packets
	Expiry
	Outbox
	Schema
	Books
	Ping(ctx context.Context) error
}
