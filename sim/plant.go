package sim

import (
	"context"

	"redcell/model"
	"redcell/storage"
)

// creditTwice is the planted bug PlantCreditTwice: a store whose credit
// ops (storage.CreditsOp), for every credit whose order number "claim:<id>" was booked
// before, books it again in a neighbouring shard of the same store, where
// that order number was never seen — a credit applied without its
// idempotency key. The claimant's cell is paid twice for one claim.
type creditTwice struct {
	storage.Store
	owns func(model.ShardID) bool
}

// CommitGroup is ApplyCredits's bug for the credits of a group's credit ops.
func (s *creditTwice) CommitGroup(ctx context.Context, list []storage.Op) error {
	ops := moneyOps(list)
	var credits []model.Credit
	for _, op := range ops {
		if c, ok := op.(*storage.CreditsOp); ok {
			credits = append(credits, c.Credits...)
		}
	}
	before := map[string]model.Credit{}
	if len(credits) > 0 {
		var err error
		if before, err = storage.CreditsOf(ctx, s.Store, credits); err != nil {
			return err
		}
	}
	if err := s.Store.CommitGroup(ctx, list); err != nil {
		return err
	}
	var again []model.Credit
	for _, c := range credits {
		if _, booked := before[c.ClaimID]; booked {
			c.Shard = s.neighbour(c.Shard)
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		if _, _, err := storage.ApplyCredits(ctx, s.Store, again); err != nil {
			return err
		}
	}
	return nil
}

// neighbour is another shard this store owns, next to s.
func (s *creditTwice) neighbour(sh model.ShardID) model.ShardID {
	if n := sh + 1; n.Valid() && s.owns(n) {
		return n
	}
	return sh - 1
}

// FailNextCommit passes the fault hook through.
func (s *creditTwice) FailNextCommit(lostAnswer bool) {
	s.Store.(commitFailer).FailNextCommit(lostAnswer)
}
