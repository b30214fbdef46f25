package cell

import (
	"context"

	"redcell/model"
	"redcell/storage"
)

// The reward wallet's files (rewards.go, wallet.go) write through these
// Server methods, which hand the write to the writer (group.go). They are
// here only until those files move to a package of their own and take the
// writer themselves (issue 30): nothing else calls them.

// submit is writer.submit.
func (s *Server) submit(ctx context.Context, sp *space, db int, op storage.MoneyOp) error {
	return s.writer.submit(ctx, sp, db, op)
}

// submitStore is writer.submitStore.
func (s *Server) submitStore(ctx context.Context, sp *space, db int, op storage.MoneyOp) error {
	return s.writer.submitStore(ctx, sp, db, op)
}

// withdrawGrouped is writer.withdrawGrouped.
func (s *Server) withdrawGrouped(ctx context.Context, sp *space, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error) {
	return s.writer.withdrawGrouped(ctx, sp, sh, actID, orderNo, amount)
}
