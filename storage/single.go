package storage

import (
	"context"
	"math/rand/v2"

	"redcell/model"
)

// The single-operation writes: each is a group of one MoneyOp of its type
// through Grouper.CommitGroup, in a transaction of its own, with the answers
// unpacked. A cell's writes go through its group committer instead (a naive
// open is a group of one); the contract suite checks every group op against
// these, and tools that seed data (the bench's limits probe) use them. An
// op's own error (MoneyOp.Failed) is returned as the error.

// commitOne commits op as a group of its own: the group's error, or else
// the op's own.
func commitOne(ctx context.Context, g Grouper, op MoneyOp) error {
	if err := g.CommitGroup(ctx, []Op{op}); err != nil {
		return err
	}
	return op.Failed()
}

// Deposit credits amount (> 0, checked by the caller) to actID's wallet
// in shard s under the caller's order number and answers the balance
// right after it (DepositOp). The same (actID, orderNo) again with the same
// amount answers that first result with Repeat set and writes nothing; with
// another amount, or an order number a send used, it is ErrOrderConflict.
// Concurrent calls with one new order number apply it once.
// Errors: ErrOrderConflict, ErrInvalidArgument (the balance would pass
// the largest int64; nothing written), ErrCommitUnknown.
func Deposit(ctx context.Context, g Grouper, s model.ShardID, actID, orderNo string, amount model.Cents) (model.Deposit, error) {
	op := &DepositOp{Shard: s, ActID: actID, OrderNo: orderNo, Amount: amount}
	if err := commitOne(ctx, g, op); err != nil {
		return model.Deposit{}, err
	}
	return op.Deposit, nil
}

// ApplyCredits books claims into the claimants' wallets (credit.Shard,
// credit.ActID), each at most once under "claim:"+ClaimID, in one
// transaction (CreditsOp). applied counts the credits booked now; a credit
// booked before (or listed twice) changes nothing. It never waits for a
// wallet row another transaction holds: such credits are named, by claim ID,
// in deferred, with nothing written for them, for a later call; the rest
// had been booked before. Errors: ErrCommitUnknown.
func ApplyCredits(ctx context.Context, g Grouper, credits []model.Credit) (applied int, deferred []string, err error) {
	op := &CreditsOp{Credits: credits}
	if err := commitOne(ctx, g, op); err != nil {
		return 0, nil, err
	}
	return op.Applied, op.Deferred, nil
}

// Send debits req.Sender (shard s) by req.Amount and creates packet id
// (from model.NewPacketID for shard s; day from it), open with every
// share left, created now and expiring at expiresMS, in one transaction
// (SendOp). req is validated by the caller (Limits.CheckShares). The same
// (sender, order number) again with the same kind, amount, count and
// greeting answers the first packet as it is now with repeat set, whatever
// id and expiresMS the retry carries, and moves nothing; a different
// request, or an order number a deposit used, is ErrOrderConflict.
// Errors: ErrInsufficientBalance (nothing written; the order number stays
// free), ErrOrderConflict, ErrCommitUnknown.
func Send(ctx context.Context, g Grouper, s model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (model.Packet, bool, error) {
	op := &SendOp{Shard: s, Req: req, PacketID: id, ExpiresMS: expiresMS}
	if err := commitOne(ctx, g, op); err != nil {
		return model.Packet{}, false, err
	}
	return op.Packet, op.Repeat, nil
}

// OpenBatch opens the packet once per request, in order, in one
// transaction (OpenOp), by the rules of model.Open: a user gets at most one
// claim per packet (an earlier claim comes back with Repeat set; a user
// listed twice gets one claim, the later answer repeating it); a new claim
// takes the next seq, its share drawn from the batch's seed, which it takes
// from r (model.TakeDrawSeed; double-mean, or the fixed share), created now,
// its credit owed to the request's shard.
// Per-request errors (in OpenResult.Err): ErrNotFound, ErrSoldOut (no
// share left, whatever the time), ErrExpired (refunded, or now >=
// ExpiresMS). It returns the packet as the batch left it (zero if not
// found). An error for the whole batch means nothing was written:
// ErrCommitUnknown (a retry finds the claims if they were), or a failure.
// r must not be shared with other goroutines.
func OpenBatch(ctx context.Context, g Grouper, ref model.PacketRef, reqs []model.OpenRequest, r *rand.Rand) ([]model.OpenResult, model.Packet, error) {
	op := &OpenOp{Ref: ref, Reqs: reqs, Rand: r}
	if err := commitOne(ctx, g, op); err != nil {
		return nil, model.Packet{}, err
	}
	return op.Results, op.Packet, nil
}

// Refund gives an open packet expired at the store's clock (now >=
// ExpiresMS) its exact remainder back to the sender, once ("refund:"+ID),
// in one transaction (RefundOp): the packet becomes refunded (RefundAmount =
// the remainder, RemainingAmount 0, RemainingCount unchanged). It answers
// the cents refunded: 0 when nothing was due (not expired, sold out,
// refunded before). Errors: ErrNotFound, ErrCommitUnknown.
func Refund(ctx context.Context, g Grouper, ref model.PacketRef) (model.Cents, error) {
	op := &RefundOp{Ref: ref}
	if err := commitOne(ctx, g, op); err != nil {
		return 0, err
	}
	return op.Refunded, nil
}

// AcceptCoupon stores r as accepted (AcceptedMS now when 0), or
// refused SOLD_OUT and decided at once when r is
// model.RefusedAtAccept (model.AcceptedForm), unless its app and
// serial are stored: then model.ReplayCouponRequest decides
// against the stored request, which is answered with repeat set
// (AcceptOp). Errors: ErrInvalidArgument (model.ValidateCouponRequest),
// ErrOrderConflict, ErrCommitUnknown.
func AcceptCoupon(ctx context.Context, g Grouper, r model.CouponRequest) (model.CouponRequest, bool, error) {
	op := &AcceptOp{Coupon: r}
	if err := commitOne(ctx, g, op); err != nil {
		return model.CouponRequest{}, false, err
	}
	return op.Accepted, op.Repeat, nil
}

// IssueReward stores r as pending (r.Shard, r.OrderNo, and every field
// set by the caller; CreatedMS now when 0) unless its order number is
// stored (IssueOp): then model.ReplayReward decides against the stored one,
// which is answered with repeat set and nothing written. Concurrent issues
// of one order number store one. Errors: ErrOrderConflict,
// ErrCommitUnknown.
func IssueReward(ctx context.Context, g Grouper, r model.Reward) (model.Reward, bool, error) {
	op := &IssueOp{Reward: r}
	if err := commitOne(ctx, g, op); err != nil {
		return model.Reward{}, false, err
	}
	return op.Issued, op.Repeat, nil
}

// BookRewards books each reward (found by Shard and OrderNo) that is not
// booked yet, in one transaction (BookOp): official-stage cash
// (Reward.IntoWallet) is credited to the wallet with a FlowReward flow
// under model.RewardFlowOrderNo, and every one becomes booked (BookedMS
// now). booked counts the rewards booked by this call; one booked before,
// listed twice or not found changes nothing. Errors: ErrCommitUnknown (a
// retry settles it).
func BookRewards(ctx context.Context, g Grouper, rs []model.Reward) (booked int, err error) {
	op := &BookOp{Rewards: rs}
	if err := commitOne(ctx, g, op); err != nil {
		return 0, err
	}
	return op.Applied, nil
}

// Withdraw debits amount (> 0) from actID's wallet in shard s under the
// caller's order number, with a FlowWithdraw flow, and answers the
// balance right after (WithdrawOp). The same order number again with the
// same amount answers the first result with Repeat set; with another
// amount, or an order number of a deposit or send, it is ErrOrderConflict.
// Errors: ErrInvalidArgument (amount below a cent), ErrInsufficientBalance
// (nothing written), ErrOrderConflict, ErrCommitUnknown.
func Withdraw(ctx context.Context, g Grouper, s model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error) {
	if amount < 1 { // model.ApplyWithdraw asserts it: the caller's check
		return model.Withdrawal{}, model.Invalidf("withdrawal amount %d: must be at least 1 cent", amount)
	}
	op := &WithdrawOp{Shard: s, ActID: actID, OrderNo: orderNo, Amount: amount}
	if err := commitOne(ctx, g, op); err != nil {
		return model.Withdrawal{}, err
	}
	return op.Withdrawal, nil
}
