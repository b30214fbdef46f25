package storage

import (
	"context"

	"redcell/model"
)

// The budget and identity ops and queries (op.go).
//
// Budgets: reward scenes' budgets and the leases cells take of them
// (model.Budget, model.Lease; the approach is described in model/budget.go).
// A budget lives in its home shard s (sharding.BudgetShard of its key): its
// row in db_XX.t_budget and its leases in db_XX.t_budget_lease of s's
// database. Amounts are in the budget's unit (cents or pieces); times are
// Unix ms. The sum of the leases never passes the total: Granted − Returned
// <= Total always.
//
// Identities: the bindings of app accounts to actIDs.

// SetBudgetTotal creates Key's budget in shard Shard with Total, or changes
// its total, and answers the row in Budget. Errors: ErrInvalidArgument for a
// malformed key, a total below 0, or a total below what is already issued
// or held by leases (Granted − Returned; nothing changes).
type SetBudgetTotal struct {
	Shard model.ShardID
	Key   string
	Total int64

	Budget model.Budget // the answer
}

// GrantBudgetLease grants Holder an open lease of Key's budget in shard
// Shard of min(Want, Total − (Granted − Returned) − Reserve), expiring at
// ExpiresMS, with a new random ID, in one transaction with the budget row
// locked: concurrent grants never take more than Total − Reserve between
// them. The lease is answered in Lease. Errors: ErrNotFound (no budget
// Key), ErrBudgetExhausted (nothing left above Reserve), ErrInvalidArgument
// (Want < 1, Reserve < 0, a malformed key or holder), ErrCommitUnknown (the
// lease may exist: the holder finds it with HolderLeasesQuery and settles
// it).
type GrantBudgetLease struct {
	Shard                    model.ShardID
	Key, Holder              string
	Want, Reserve, ExpiresMS int64

	Lease model.Lease // the answer
}

// ReturnBudgetLease turns the open or expired lease LeaseID of shard
// Shard's database returned with Unspent = Unspent and adds Unspent to its
// budget's Returned, once: a lease returned before is answered as it is and
// nothing changes, whatever Unspent says. The lease is answered in Lease.
// Errors: ErrNotFound (no such lease in Shard's database),
// ErrInvalidArgument (Unspent outside 0..Amount, a malformed ID),
// ErrCommitUnknown (a retry settles it).
type ReturnBudgetLease struct {
	Shard   model.ShardID
	LeaseID string
	Unspent int64

	Lease model.Lease // the answer
}

// ExpireBudgetLeases turns Key's open leases (budget homed in shard Shard)
// with ExpiresMS <= NowMS expired and counts them in Expired. An expired
// lease keeps its whole Amount outstanding (its holder may have spent any of
// it): the budget never over-issues, and ReturnBudgetLease still takes the
// unspent part back. Errors: ErrInvalidArgument for a malformed key.
type ExpireBudgetLeases struct {
	Shard model.ShardID
	Key   string
	NowMS int64

	Expired int // the answer
}

// BindAccount stores Want (model.NewBinding) in shard Shard, the home of its
// app account (sharding.ShardOfIdentity), unless the account is bound
// already: then model.Bind decides against the binding there. It answers
// the binding that holds in Binding and, in Repeat, whether it was bound
// before. Legacy are the hashes of Want's phone in the forms of bindings
// stored before numbers were parsed (model.LegacyPhoneHashes): a row
// holding one is the same phone, answered as a repeat with its actID, and
// re-keyed to Want.PhoneHash (the only write of a repeat), so that every
// spelling of the number finds it from then on. Concurrent first bindings
// of one account store one; the others are decided against it. Errors:
// model.ErrIdentityConflict.
type BindAccount struct {
	Shard  model.ShardID
	Want   model.IdentityBinding
	Legacy []string

	Binding model.IdentityBinding // the answer
	Repeat  bool
}

// BudgetQuery reads Key's row (budget homed in shard Shard) into Budget and
// every one of its leases, oldest first ((CreatedMS, ID)), into Leases, in
// one consistent read. Errors: ErrNotFound, ErrInvalidArgument for a
// malformed key.
type BudgetQuery struct {
	Shard model.ShardID
	Key   string

	Budget model.Budget // the answer
	Leases []model.Lease
}

// BudgetLevelQuery reads Key's row (budget homed in shard Shard) into Budget
// and, into Held, the sum of the amounts of its open and expired leases
// (units that may still come back), in one consistent read that does not
// list the leases: cheap enough for a copy of a coupon batch's stock
// refreshed every half second (cell/couponq). Errors: ErrNotFound,
// ErrInvalidArgument for a malformed key.
type BudgetLevelQuery struct {
	Shard model.ShardID
	Key   string

	Budget model.Budget // the answer
	Held   int64
}

// HolderLeasesQuery lists into Leases the open and expired leases Holder
// has in shard Shard's database (of every budget homed there), oldest first:
// what a restarted holder must settle (cell/budget.Settle). Errors:
// ErrInvalidArgument for a malformed holder.
type HolderLeasesQuery struct {
	Shard  model.ShardID
	Holder string

	Leases []model.Lease // the answer
}

func (*SetBudgetTotal) isOp()       {}
func (*GrantBudgetLease) isOp()     {}
func (*ReturnBudgetLease) isOp()    {}
func (*ExpireBudgetLeases) isOp()   {}
func (*BindAccount) isOp()          {}
func (*BudgetQuery) isQuery()       {}
func (*BudgetLevelQuery) isQuery()  {}
func (*HolderLeasesQuery) isQuery() {}

// budgetOps runs the budget and identity ops of CommitGroup.
func (m *MySQL) budgetOps(ctx context.Context, op Op) (bool, error) {
	var err error
	switch o := op.(type) {
	case *SetBudgetTotal:
		o.Budget, err = m.setBudget(ctx, o.Shard, o.Key, o.Total)
	case *GrantBudgetLease:
		o.Lease, err = m.grantLease(ctx, o.Shard, o.Key, o.Holder, o.Want, o.Reserve, o.ExpiresMS)
	case *ReturnBudgetLease:
		o.Lease, err = m.returnLease(ctx, o.Shard, o.LeaseID, o.Unspent)
	case *ExpireBudgetLeases:
		o.Expired, err = m.expireLeases(ctx, o.Shard, o.Key, o.NowMS)
	case *BindAccount:
		o.Binding, o.Repeat, err = m.bindIdentity(ctx, o.Shard, o.Want, o.Legacy...)
	default:
		return false, nil
	}
	return true, err
}

// budgetReads answers the budget and identity queries of Read.
func (m *MySQL) budgetReads(ctx context.Context, q Query) (bool, error) {
	var err error
	switch o := q.(type) {
	case *BudgetQuery:
		o.Budget, o.Leases, err = m.budget(ctx, o.Shard, o.Key)
	case *BudgetLevelQuery:
		o.Budget, o.Held, err = m.budgetLevel(ctx, o.Shard, o.Key)
	case *HolderLeasesQuery:
		o.Leases, err = m.leasesOf(ctx, o.Shard, o.Holder)
	default:
		return false, nil
	}
	return true, err
}

// SetBudget runs SetBudgetTotal on g and answers the row.
func SetBudget(ctx context.Context, g Grouper, s model.ShardID, key string, total int64) (model.Budget, error) {
	op := &SetBudgetTotal{Shard: s, Key: key, Total: total}
	err := g.CommitGroup(ctx, []Op{op})
	return op.Budget, err
}

// GrantLease runs GrantBudgetLease on g and answers the lease.
func GrantLease(ctx context.Context, g Grouper, s model.ShardID, key, holder string, want, reserve, expiresMS int64) (model.Lease, error) {
	op := &GrantBudgetLease{Shard: s, Key: key, Holder: holder, Want: want, Reserve: reserve, ExpiresMS: expiresMS}
	err := g.CommitGroup(ctx, []Op{op})
	return op.Lease, err
}

// ReturnLease runs ReturnBudgetLease on g and answers the lease.
func ReturnLease(ctx context.Context, g Grouper, s model.ShardID, leaseID string, unspent int64) (model.Lease, error) {
	op := &ReturnBudgetLease{Shard: s, LeaseID: leaseID, Unspent: unspent}
	err := g.CommitGroup(ctx, []Op{op})
	return op.Lease, err
}

// ExpireLeases runs ExpireBudgetLeases on g and answers how many leases it
// expired.
func ExpireLeases(ctx context.Context, g Grouper, s model.ShardID, key string, nowMS int64) (int, error) {
	op := &ExpireBudgetLeases{Shard: s, Key: key, NowMS: nowMS}
	err := g.CommitGroup(ctx, []Op{op})
	return op.Expired, err
}

// BindIdentity runs BindAccount on g and answers the binding that holds and
// whether it was bound before.
func BindIdentity(ctx context.Context, g Grouper, s model.ShardID, want model.IdentityBinding, legacy ...string) (model.IdentityBinding, bool, error) {
	op := &BindAccount{Shard: s, Want: want, Legacy: legacy}
	err := g.CommitGroup(ctx, []Op{op})
	return op.Binding, op.Repeat, err
}

// Budget reads BudgetQuery from r: key's row and its leases, oldest first.
func Budget(ctx context.Context, r Reader, s model.ShardID, key string) (model.Budget, []model.Lease, error) {
	q := &BudgetQuery{Shard: s, Key: key}
	err := r.Read(ctx, q)
	return q.Budget, q.Leases, err
}

// BudgetLevel reads BudgetLevelQuery from r: key's row and the amount its
// open and expired leases hold.
func BudgetLevel(ctx context.Context, r Reader, s model.ShardID, key string) (b model.Budget, held int64, err error) {
	q := &BudgetLevelQuery{Shard: s, Key: key}
	err = r.Read(ctx, q)
	return q.Budget, q.Held, err
}

// LeasesOf reads HolderLeasesQuery from r: holder's open and expired leases
// in s's database, oldest first.
func LeasesOf(ctx context.Context, r Reader, s model.ShardID, holder string) ([]model.Lease, error) {
	q := &HolderLeasesQuery{Shard: s, Holder: holder}
	err := r.Read(ctx, q)
	return q.Leases, err
}
