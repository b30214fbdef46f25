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
//     error codes), the state a packet shows and the final error of a closed
//     one (model.StatusAt, model.FinalErr), the answers to opens of a closed
//     packet (model.ClosedResults), the day slots an expiry pass scans
//     (model.ExpiryDays, model.AllDays); routing: the router's rule, request
//     by request — method and path from api's path builders (and a send's
//     JSON body), api.MatchPublic (api.Match at a cell) in api's route table,
//     api.Locate for the key the route names (path act_id, body sender, path
//     packet ID) and its shard, then the owner in a sharding.Map built with
//     sharding.ParseRanges and sharding.NewMap from three cells' ranges as
//     cmd/redcell's config does; the relay's pure rules, from cell/relay: the
//     credits an open batch owes (relay.NewCredits), their split into local
//     and per-owner-cell groups (sharding.Map.GroupByOwner, which the relay's
//     dispatch and recon's checkCredits use too), the batch and page bounds
//     and the linger (relay.BatchMax, relay.ScanPagesMax, relay.Linger,
//     relay.LingerFlow, relay.LingerMax), how
//     often positions are saved and how far behind now they stay
//     (relay.PositionEvery, relay.Slack), the split of a receiver's deferred
//     IDs (relay.SplitDeferred) and a deferred credit's backoff
//     (relay.DeferralBackoff); the wire types of package api
//     (requests and their Validate, answers with api.NewSendResponse and
//     api.NewGrabResponse, the error envelope and its retryable flag through
//     api.ErrorJSON); and each cell's store, storage/memstore, reached only
//     through the storage.Store interface: it passes the contract suite the
//     MariaDB store passes and decides with model's pure money decisions
//     (model.Open, model.Send, model.ApplyDeposit, model.Refund,
//     model.ApplyCredit); the simulator holds no money rule of its own.
//   - The simulator's model of a cell, calling the pieces above: the request
//     handlers (validate, check the shard is owned, call the store, answer;
//     an open's answer is built as cell/open.go's writeOpen writes it), the
//     per-packet batching of opens (a 2 ms linger, batches of 32: the
//     strategy's settings, not its code) and the closed set (its bound copies
//     cell/open.go's closedSetMax); with Config.Grouped, the commit lanes of
//     strategy grouped (a lane per database, a 3 ms linger, at most 64 ops
//     per storage.Grouper.CommitGroup, one batch of a packet in a lane at a
//     time; the committer's settings and rules, not its code); the relay's
//     control flow (cell/relay runs goroutines, lanes and a clock; the model
//     is one event loop's timers: the fresh claims of the open batches held
//     in memory until a delivery is acknowledged, a lane per destination
//     cell, delivery, deferred credits tried again; every interval the saved
//     positions of the databases not loaded yet read (storage.RelayPositionsQuery),
//     the claims past them read and delivered (storage.ClaimsAfterQuery: after a
//     start, and a database's last relay.Slack after an open batch whose
//     commit's outcome is unknown, as cell/open.go's MarkDB), what no lane
//     holds offered again after two intervals, and every relay.PositionEvery
//     the positions saved (storage.SetRelayPositions) of the databases whose
//     claims came or went, never past a held claim; a delivery to another
//     cell is given up after 1 s, not the relay's 5 s, and a failed one is
//     offered again at the next interval instead of pausing its lane; no
//     HeldMax bound, no Redrive: the simulated relays hold little and the
//     model has no reconciliation)
//     and expiry (what cell/expiry.go does: ExpiredIn, then Refund at the
//     simulated time; a full scan every tenth pass instead of every ten
//     minutes). The router is modelled as the stateless forwarder it is; its
//     view of which cells are down is the simulator's stand-in for
//     sharding/membership: CELL_UNAVAILABLE for a cell that is down.
//   - Stand-ins: packet IDs are made as model.NewPacketID makes them but with
//     their 64 random bits from the cell's seeded stream (NewPacketID reads
//     crypto/rand); lockedRows defers some credits in ApplyCredits and in
//     CommitGroup's credit ops as the MariaDB store does when a wallet row
//     is locked, which memstore never is; the planted bug of PlantCreditTwice is a store wrapper.
//   - The simulator's own: the event loop, the clock (a clock.Manual moved only
//     by the loop; nothing reads the wall clock), the network (latency, drops,
//     duplicates, reordering, cut links), cell crashes and restarts (the store
//     survives, everything volatile is lost: the relay's held claims too,
//     read again past the saved positions by the next life), the workload
//     with its retries under the same order number, and the checkers (the
//     drain ends when every relay holds nothing and has nothing left to
//     read, and every claim in the rows is then credited).
//
// Determinism: one goroutine; randomness comes from math/rand/v2 PCG sources
// seeded from Config.Seed, one stream per component; no Go map is iterated
// where its order could reach the run.
package sim
