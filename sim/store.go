package sim

import (
	"context"

	"redcell/model"
	"redcell/storage"
	"redcell/storage/memstore"
)

// newStore is a cell's durable store: storage/memstore, the in-memory store
// that passes the same contract suite as the MariaDB store, reading the
// simulated clock, behind lockedRows.
func newStore(w *world) storage.Store { return &lockedRows{Store: memstore.New(w.clk), w: w} }

// lockedRows models the wallet rows other transactions hold in a MariaDB
// store, which the in-memory store never has (one lock, one call at a time):
// a group's credit op (storage.CreditsOp) leaves each credit, with probability
// Faults.Defer, for a later group, listed in the op's Deferred with nothing
// written for it, as storage.MySQL
// does with a credit whose row is locked. Everything else is memstore's.
type lockedRows struct {
	storage.Store
	w *world
}

// CommitGroup leaves credits of the group's credit ops for a later call as
// ApplyCredits does; the rest of the group is memstore's.
func (s *lockedRows) CommitGroup(ctx context.Context, list []storage.Op) error {
	ops := moneyOps(list)
	p := s.w.faults.Defer
	if p == 0 {
		return s.Store.CommitGroup(ctx, list)
	}
	type held struct {
		op    *storage.CreditsOp
		all   []model.Credit
		later []string
	}
	var hs []held
	for _, o := range ops {
		op, ok := o.(*storage.CreditsOp)
		if !ok {
			continue
		}
		h := held{op: op, all: op.Credits}
		var now []model.Credit
		for _, c := range op.Credits {
			if s.w.rngFault.Float64() < p {
				h.later = append(h.later, c.ClaimID)
			} else {
				now = append(now, c)
			}
		}
		op.Credits = now
		hs = append(hs, h)
	}
	err := s.Store.CommitGroup(ctx, list)
	for _, h := range hs {
		h.op.Credits = h.all
		h.op.Deferred = append(h.op.Deferred, h.later...)
	}
	return err
}

// FailNextCommit passes the fault hook through.
func (s *lockedRows) FailNextCommit(lostAnswer bool) {
	s.Store.(commitFailer).FailNextCommit(lostAnswer)
}

var _ commitFailer = (*memstore.Store)(nil)

// moneyOps are the money ops of list (the kinds these wrappers look at).
func moneyOps(list []storage.Op) []storage.MoneyOp {
	var ops []storage.MoneyOp
	for _, op := range list {
		if g, ok := op.(storage.MoneyOp); ok {
			ops = append(ops, g)
		}
	}
	return ops
}
