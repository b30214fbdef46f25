package cell

import (
	"context"

	"redcell/cell/moves"
	"redcell/sharding"
)

// MoveStore keeps what a cell owns across restarts, and its copies of the
// databases it handed over (cell/moves.Store; storage.MySQL).
type MoveStore = moves.Store

// newMoves makes the cell's steps of database moves (cell/moves) over its
// ownership, peers and metrics; store nil: moves answer NOT_FOUND.
func (s *Server) newMoves(store MoveStore, peers Peers) *moves.Steps {
	var ms moves.Store
	if store != nil { // a typed nil would not be nil in moves.Config
		ms = store
	}
	return moves.New(moves.Config{Cell: s.cfg.Name, Grace: s.cfg.MoveGrace, Store: ms, Own: movesOwnership{s.own}, Peers: peers,
		Metrics: moves.Metrics{Steps: s.metrics.moveSteps, Drain: s.metrics.moveDrain, CopiesDropped: s.metrics.moveCopiesDropped,
			CopyChanged: s.metrics.moveCopyChanged, Passes: s.metrics.movePasses},
		Clock: s.clock, Log: s.log})
}

// Holds reports whether the cell owns database db, frozen or not.
func (s *Server) Holds(db int) bool { return s.own.holdsDB(db) }

// movesOwnership is the cell's ownership as cell/moves changes it.
type movesOwnership struct{ o *ownership }

func (m movesOwnership) HoldsDB(db int) bool                     { return m.o.holdsDB(db) }
func (m movesOwnership) Held() []int                             { return m.o.held() }
func (m movesOwnership) FrozenDBs() []int                        { return m.o.frozenDBs() }
func (m movesOwnership) Ranges() (sharding.Ranges, int64)        { return m.o.ranges() }
func (m movesOwnership) SetFrozen(db int, frozen bool) error     { return m.o.setFrozen(db, frozen) }
func (m movesOwnership) Drain(ctx context.Context, db int) error { return m.o.drain(ctx, db) }
func (m movesOwnership) Set(dbs []int, version int64) (sharding.Ranges, error) {
	return m.o.set(dbs, version)
}
