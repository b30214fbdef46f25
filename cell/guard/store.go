package guard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"redcell/model"
	"redcell/storage"
)

// Store is a storage.Store behind a Breaker. While the breaker is open every
// call returns ErrDBOpen at once, without calling the inner store. A call
// that fails with an infrastructure error other than a deadline is answered
// as model.ErrDBUnavailable wrapping that error (a retryable 503, not an
// INTERNAL 500); deadlines stay context.DeadlineExceeded (504 TIMEOUT).
// Business errors pass through unchanged. Safe for concurrent use.
type Store struct {
	inner storage.Store
	b     *Breaker
	// isFailure adds the store's own infrastructure errors (the MySQL driver's)
	// to the generic ones of Infrastructure; nil adds none.
	isFailure func(error) bool
}

var _ storage.Store = (*Store)(nil)

// ErrDBOpen is what a Store answers while its breaker refuses calls. It
// matches model.ErrDBUnavailable under errors.Is.
var ErrDBOpen = model.Errorf(model.ErrDBUnavailable, "the database circuit breaker is open after repeated failures; retry later")

// NewStore returns inner behind b. Several stores may share one breaker (the
// real and the shadow store of one server do: they fail together).
func NewStore(inner storage.Store, b *Breaker, isFailure func(error) bool) *Store {
	return &Store{inner: inner, b: b, isFailure: isFailure}
}

func (s *Store) judge(err error, took time.Duration) error {
	if err == nil {
		return nil
	}
	if verdict, ok := s.b.judgeContext(err, took); ok {
		return verdict
	}
	if Infrastructure(err) || s.isFailure != nil && s.isFailure(err) {
		return errFailure
	}
	return nil // the server answered: business errors and bugs alike
}

// call runs f behind the breaker and translates its error (see Store).
func (s *Store) call(f func() error) error {
	err, refused := s.b.do(f, s.judge)
	switch {
	case refused:
		return ErrDBOpen
	case err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return err
	case s.judge(err, 0) == errFailure:
		return fmt.Errorf("%w: %w", model.ErrDBUnavailable, err)
	}
	return err
}

// Deposit implements storage.Store.
func (s *Store) Deposit(ctx context.Context, sh model.ShardID, actID, orderNo string, amount model.Cents) (d model.Deposit, err error) {
	err = s.call(func() (err error) { d, err = s.inner.Deposit(ctx, sh, actID, orderNo, amount); return err })
	return d, err
}

// Account implements storage.Store.
func (s *Store) Account(ctx context.Context, sh model.ShardID, actID string) (a model.Account, err error) {
	err = s.call(func() (err error) { a, err = s.inner.Account(ctx, sh, actID); return err })
	return a, err
}

// BindIdentity implements storage.Store.
func (s *Store) BindIdentity(ctx context.Context, sh model.ShardID, want model.IdentityBinding, legacy ...string) (b model.IdentityBinding, repeat bool, err error) {
	err = s.call(func() (err error) { b, repeat, err = s.inner.BindIdentity(ctx, sh, want, legacy...); return err })
	return b, repeat, err
}

// ApplyCredits implements storage.Store.
func (s *Store) ApplyCredits(ctx context.Context, credits []model.Credit) (applied int, deferred []string, err error) {
	err = s.call(func() (err error) { applied, deferred, err = s.inner.ApplyCredits(ctx, credits); return err })
	return applied, deferred, err
}

// Send implements storage.Store.
func (s *Store) Send(ctx context.Context, sh model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (p model.Packet, repeat bool, err error) {
	err = s.call(func() (err error) { p, repeat, err = s.inner.Send(ctx, sh, req, id, expiresMS); return err })
	return p, repeat, err
}

// CommitGroup implements storage.Store: the whole group is one call behind
// the breaker.
func (s *Store) CommitGroup(ctx context.Context, ops []*storage.GroupOp) error {
	return s.call(func() error { return s.inner.CommitGroup(ctx, ops) })
}

// Packet implements storage.Store.
func (s *Store) Packet(ctx context.Context, ref model.PacketRef) (p model.Packet, err error) {
	err = s.call(func() (err error) { p, err = s.inner.Packet(ctx, ref); return err })
	return p, err
}

// Claims implements storage.Store.
func (s *Store) Claims(ctx context.Context, ref model.PacketRef, afterSeq int64, limit int) (cs []model.Claim, err error) {
	err = s.call(func() (err error) { cs, err = s.inner.Claims(ctx, ref, afterSeq, limit); return err })
	return cs, err
}

// OpenBatch implements storage.Store.
func (s *Store) OpenBatch(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest, r *rand.Rand) (res []model.OpenResult, p model.Packet, err error) {
	err = s.call(func() (err error) { res, p, err = s.inner.OpenBatch(ctx, ref, reqs, r); return err })
	return res, p, err
}

// ClaimsOf implements storage.Store.
func (s *Store) ClaimsOf(ctx context.Context, ref model.PacketRef, reqs []model.OpenRequest) (m map[string]model.Claim, err error) {
	err = s.call(func() (err error) { m, err = s.inner.ClaimsOf(ctx, ref, reqs); return err })
	return m, err
}

// ExpiredIn implements storage.Store.
func (s *Store) ExpiredIn(ctx context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) (ids []model.PacketID, err error) {
	err = s.call(func() (err error) { ids, err = s.inner.ExpiredIn(ctx, shards, days, nowMS, limit); return err })
	return ids, err
}

// Refund implements storage.Store.
func (s *Store) Refund(ctx context.Context, ref model.PacketRef) (c model.Cents, err error) {
	err = s.call(func() (err error) { c, err = s.inner.Refund(ctx, ref); return err })
	return c, err
}

// PendingCredits implements storage.Store.
func (s *Store) PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) (cs []model.Credit, next model.OutboxPos, err error) {
	err = s.call(func() (err error) {
		cs, next, err = s.inner.PendingCredits(ctx, db, beforeMS, afterMS, afterID, limit)
		return err
	})
	return cs, next, err
}

// MarkDelivered implements storage.Store.
func (s *Store) MarkDelivered(ctx context.Context, credits []model.Credit) (skipped int, err error) {
	err = s.call(func() (err error) { skipped, err = s.inner.MarkDelivered(ctx, credits); return err })
	return skipped, err
}

// SendTo implements storage.Store.
func (s *Store) SendTo(ctx context.Context, credits []model.Credit, dest string) error {
	return s.call(func() error { return s.inner.SendTo(ctx, credits, dest) })
}

// OutboxLag implements storage.Store.
func (s *Store) OutboxLag(ctx context.Context, db int) (pending, oldestMS int64, err error) {
	err = s.call(func() (err error) { pending, oldestMS, err = s.inner.OutboxLag(ctx, db); return err })
	return pending, oldestMS, err
}

// EnsureShard implements storage.Store.
func (s *Store) EnsureShard(ctx context.Context, sh model.ShardID) error {
	return s.call(func() error { return s.inner.EnsureShard(ctx, sh) })
}

// EnsureDays implements storage.Store. The warm-up it serves may run for minutes,
// so it is never the breaker's probe (a half-open breaker would refuse every
// other call meanwhile) and its outcome is not counted: it runs only while the
// breaker is closed, and otherwise returns ErrDBOpen (the warm-up retries).
func (s *Store) EnsureDays(ctx context.Context, shards []model.ShardID, days []int, parallel int, progress func(done, total int)) error {
	if s.b.State() != StateClosed {
		s.b.rejected.Add(1)
		return ErrDBOpen
	}
	return s.inner.EnsureDays(ctx, shards, days, parallel, progress)
}

// ReconWindow implements storage.Store.
func (s *Store) ReconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (w model.ReconWindow, err error) {
	err = s.call(func() (err error) {
		w, err = s.inner.ReconWindow(ctx, db, shards, days, fromMS, toMS, limit)
		return err
	})
	return w, err
}

// CreditsOf implements storage.Store.
func (s *Store) CreditsOf(ctx context.Context, credits []model.Credit) (m map[string]model.Credit, err error) {
	err = s.call(func() (err error) { m, err = s.inner.CreditsOf(ctx, credits); return err })
	return m, err
}

// ReconPositions implements storage.Store.
func (s *Store) ReconPositions(ctx context.Context) (pos map[int]int64, err error) {
	err = s.call(func() (err error) { pos, err = s.inner.ReconPositions(ctx); return err })
	return pos, err
}

// SaveReconPositions implements storage.Store.
func (s *Store) SaveReconPositions(ctx context.Context, pos map[int]int64) error {
	return s.call(func() error { return s.inner.SaveReconPositions(ctx, pos) })
}

// CellAudit implements storage.Store. Like Ledger it runs only while the
// breaker is closed, is never its probe and is not counted.
func (s *Store) CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error) {
	if s.b.State() != StateClosed {
		s.b.rejected.Add(1)
		return model.CellAudit{}, ErrDBOpen
	}
	return s.inner.CellAudit(ctx, cell, owns)
}

// Archive runs the inner store's archive pass (storage.MySQL.Archive).
// Like CellAudit it may read many tables, so it runs only while the breaker
// is closed, is never its probe and is not counted. Errors: ErrDBOpen,
// storage.ErrNoArchive when the inner store keeps no day tables, and the
// inner store's.
func (s *Store) Archive(ctx context.Context, owns func(model.ShardID) bool, beforeMS int64) (storage.ArchiveResult, error) {
	a, ok := s.inner.(interface {
		Archive(context.Context, func(model.ShardID) bool, int64) (storage.ArchiveResult, error)
	})
	if !ok {
		return storage.ArchiveResult{}, storage.ErrNoArchive
	}
	if s.b.State() != StateClosed {
		s.b.rejected.Add(1)
		return storage.ArchiveResult{}, ErrDBOpen
	}
	return a.Archive(ctx, owns, beforeMS)
}

// Ledger implements storage.Store. Like EnsureDays it may run for minutes (it
// reads every money row), so it runs only while the breaker is closed, is
// never its probe and is not counted.
func (s *Store) Ledger(ctx context.Context, cell string) (model.Ledger, error) {
	if s.b.State() != StateClosed {
		s.b.rejected.Add(1)
		return model.Ledger{}, ErrDBOpen
	}
	return s.inner.Ledger(ctx, cell)
}

// Ping implements storage.Store: while the breaker is open the cell's /healthz
// reads db_unreachable without waiting on the server.
func (s *Store) Ping(ctx context.Context) error {
	return s.call(func() error { return s.inner.Ping(ctx) })
}
