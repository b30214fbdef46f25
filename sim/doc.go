// Package sim is a deterministic simulation of a whole redcell cluster: one
// router and three cells in one goroutine, on in-memory stores, a simulated
// clock and a simulated network, under a random workload. A run is a pure
// function of its Config (above all its seed): the same seed replays the same
// run bit for bit, and Result.Hash (a hash of the event log) proves it.
//
// What is production code and what is the simulator's model:
//
//   - Production code: the money rules and IDs of package model (the split, the
//     audit, model.Audit and model.AuditCell, claim IDs, packet ID parsing, the
//     error codes), routing (sharding.ShardOfAct, sharding.ParseRanges,
//     sharding.NewMap and Map.Owner, built from three cells' ranges as
//     cmd/redcell's config does), the wire types of package api (requests,
//     answers, the error envelope and its retryable flag through
//     api.ErrorJSON), and each cell's store, storage/memstore, reached only
//     through the storage.Store interface: it passes the contract suite the
//     MariaDB store passes and decides with model's pure money decisions
//     (model.Open, model.Send, model.ApplyDeposit, model.Refund,
//     model.ApplyCredit); the simulator holds no money rule of its own.
//   - The simulator's model of a cell: the request handlers (validate, route
//     by shard, call the store, answer), the per-packet batching of opens and
//     the set of closed packets whose opens are answered from ClaimsOf, the
//     relay (what cell/relay.go does: fresh claims and a periodic outbox scan
//     through PendingCredits, credits sent to the claimant's cell, ApplyCredits
//     there, the answer, MarkDelivered, deferred credits tried again after a
//     backoff) and expiry (what cell/expiry.go does: ExpiredIn, then Refund at
//     the simulated time). The router is modelled as the stateless forwarder it
//     is: key → shard → owner, CELL_UNAVAILABLE for a cell that is down.
//   - Stand-ins: packet IDs are made as model.NewPacketID makes them but with
//     their 64 random bits from the cell's seeded stream (NewPacketID reads
//     crypto/rand); lockedRows defers some credits in ApplyCredits as the
//     MariaDB store does when a wallet row is locked, which memstore never
//     is; the planted bug of PlantCreditTwice is a store wrapper.
//   - The simulator's own: the event loop, the clock (a clock.Manual moved only
//     by the loop; nothing reads the wall clock), the network (latency, drops,
//     duplicates, reordering, cut links), cell crashes and restarts (the store
//     survives, everything volatile is lost), the workload with its retries
//     under the same order number, and the checkers.
//
// Determinism: one goroutine; randomness comes from math/rand/v2 PCG sources
// seeded from Config.Seed, one stream per component; no Go map is iterated
// where its order could reach the run.
package sim
