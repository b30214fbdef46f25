package sim

import (
	"redcell/storage"
	"redcell/storage/memstore"
)

// newStore is a cell's durable store: storage/memstore, the in-memory store
// that passes the same contract suite as the MariaDB store, reading the
// simulated clock.
func newStore(w *world) storage.Store { return memstore.New(w.clk) }

var _ commitFailer = (*memstore.Store)(nil)
