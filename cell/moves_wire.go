package cell

import (
	"context"
	"log/slog"

	"redcell/cell/moves"
	"redcell/internal/clock"
	"redcell/sharding"
)

// MoveStore keeps what a cell owns across restarts, and its copies of the
// databases it handed over (cell/moves.Store; storage.MySQL).
type MoveStore = moves.Store

// newMoves makes the cell's steps of database moves (cell/moves) over its
// ownership, peers and metrics m; store nil: moves answer NOT_FOUND.
func newMoves(cfg Config, store MoveStore, own movesOwnership, peers Peers, m *metrics, clk clock.Clock, log *slog.Logger) *moves.Steps {
	var ms moves.Store
	if store != nil { // a typed nil would not be nil in moves.Config
		ms = store
	}
	return moves.New(moves.Config{Cell: cfg.Name, Grace: cfg.MoveGrace, Store: ms, Own: own, Peers: peers,
		Metrics: moves.Metrics{Steps: m.moveSteps, Drain: m.moveDrain, CopiesDropped: m.moveCopiesDropped,
			CopyChanged: m.moveCopyChanged, Passes: m.movePasses},
		Clock: clk, Log: log})
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
