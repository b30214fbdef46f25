package memstore

import (
	"context"
	"sort"

	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

// Rewards in memory: by order number (it holds the actID, so it is unique
// across shards), as db_XX.t_reward keys them. Queries scan every reward and
// sort: the store serves tests and the simulation, not volume.

func (s *Store) rewardList(keep func(*model.Reward) bool) []*model.Reward {
	var out []*model.Reward
	for _, r := range s.rewards {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// reward answers storage.RewardQuery.
func (s *Store) reward(ctx context.Context, sh model.ShardID, orderNo string) (model.Reward, error) {
	if err := ctx.Err(); err != nil {
		return model.Reward{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rewards[orderNo]
	if !ok || r.Shard.DB() != sh.DB() {
		return model.Reward{}, model.Errorf(model.ErrNotFound, "no reward %s", orderNo)
	}
	return *r, nil
}

// rewardsOf answers storage.RewardsOfQuery.
func (s *Store) rewardsOf(ctx context.Context, sh model.ShardID, actID, stage string, after model.FlowCursor, limit int) ([]model.Reward, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.rewardList(func(r *model.Reward) bool {
		return r.ActID == actID && r.Shard.DB() == sh.DB() && (stage == "" || r.Stage == stage) && after.Before(r.CreatedMS, r.OrderNo)
	})
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].CreatedMS != rs[j].CreatedMS {
			return rs[i].CreatedMS > rs[j].CreatedMS
		}
		return rs[i].OrderNo > rs[j].OrderNo
	})
	return copyRewards(rs, limit), nil
}

func copyRewards(rs []*model.Reward, limit int) []model.Reward {
	if len(rs) > limit {
		rs = rs[:limit]
	}
	var out []model.Reward
	for _, r := range rs {
		out = append(out, *r)
	}
	return out
}

// rewardSums answers storage.RewardSumsQuery.
func (s *Store) rewardSums(ctx context.Context, sh model.ShardID, actID string) ([]model.StageSums, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.rewardList(func(r *model.Reward) bool { return r.ActID == actID && r.Shard.DB() == sh.DB() })
	return model.SumRewards(copyRewards(rs, len(rs))), nil
}

// byAge orders rewards oldest first, then by order number.
func byAge(rs []*model.Reward) {
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].CreatedMS != rs[j].CreatedMS {
			return rs[i].CreatedMS < rs[j].CreatedMS
		}
		return rs[i].OrderNo < rs[j].OrderNo
	})
}

// pendingRewardsOf answers storage.PendingRewardsOfQuery.
func (s *Store) pendingRewardsOf(ctx context.Context, sh model.ShardID, actID string, limit int) ([]model.Reward, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.rewardList(func(r *model.Reward) bool {
		return r.ActID == actID && r.Shard.DB() == sh.DB() && r.Status != model.RewardBooked
	})
	byAge(rs)
	return copyRewards(rs, limit), nil
}

// takeRewards runs storage.TakeRewardsOp.
func (s *Store) takeRewards(ctx context.Context, db int, staleMS int64, limit int) ([]model.Reward, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.rewardList(func(r *model.Reward) bool {
		return r.Shard.DB() == db && (r.Status == model.RewardPending || r.Status == model.RewardProcessing && r.ClaimedMS <= staleMS)
	})
	byAge(rs)
	if len(rs) > limit {
		rs = rs[:limit]
	}
	now := s.nowMS()
	write, err := s.commitLocked("take rewards")
	if write {
		for _, r := range rs {
			r.Status, r.ClaimedMS = model.RewardProcessing, now
		}
	}
	if err != nil {
		return nil, err
	}
	return copyRewards(rs, len(rs)), nil
}

// toBookLocked picks the rewards of rs that booking books: stored, not
// booked, not listed before (seen, which it adds to). s.mu must be held.
func (s *Store) toBookLocked(rs []model.Reward, seen map[string]bool) []*model.Reward {
	var book []*model.Reward
	for _, want := range rs {
		r, ok := s.rewards[want.OrderNo]
		if !ok || seen[want.OrderNo] || r.Shard.DB() != want.Shard.DB() || r.Status == model.RewardBooked {
			continue
		}
		seen[want.OrderNo] = true
		book = append(book, r)
	}
	return book
}

// rewardsDue answers storage.RewardsDueQuery.
func (s *Store) rewardsDue(ctx context.Context, db int, staleMS int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rewards {
		if r.Shard.DB() == db && (r.Status == model.RewardPending || r.Status == model.RewardProcessing && r.ClaimedMS <= staleMS) {
			return true, nil
		}
	}
	return false, nil
}

// toTakeLocked picks the rewards a booker's take tk books (storage.RewardTake):
// of its database, issued by tk.IssuedByMS, pending or processing since tk.StaleMS, not listed
// before (seen, which it adds to), oldest first, at most tk.Limit. s.mu
// must be held.
func (s *Store) toTakeLocked(tk storage.RewardTake, seen map[string]bool) []*model.Reward {
	rs := s.rewardList(func(r *model.Reward) bool {
		return r.Shard.DB() == tk.DB && !seen[r.OrderNo] && r.CreatedMS <= tk.IssuedByMS &&
			(r.Status == model.RewardPending || r.Status == model.RewardProcessing && r.ClaimedMS <= tk.StaleMS)
	})
	byAge(rs)
	if len(rs) > tk.Limit {
		rs = rs[:tk.Limit]
	}
	for _, r := range rs {
		seen[r.OrderNo] = true
	}
	return rs
}

// bookLocked books rewards toBookLocked picked. s.mu must be held.
func (s *Store) bookLocked(book []*model.Reward, now int64) {
	for _, r := range book {
		if f, ok := model.RewardFlow(*r, now); ok {
			s.writeFlowLocked(r.Shard, f)
		}
		r.Status, r.BookedMS = model.RewardBooked, now
	}
}

// leaseSpent answers storage.LeaseSpentQuery.
func (s *Store) leaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	in := map[int]bool{}
	for _, db := range dbs {
		in[db] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	for _, r := range s.rewards {
		if r.LeaseID == leaseID && in[r.Shard.DB()] {
			total += int64(r.Amount)
		}
	}
	return total, nil
}

// flowsOf answers storage.FlowsOfQuery.
func (s *Store) flowsOf(ctx context.Context, sh model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Flow, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	below := after.FlowSeqBelow()
	var fs []model.Flow
	for k, f := range s.flows {
		if k.shard != sh || k.act != actID || f.Kind == model.FlowReward {
			continue
		}
		if after != (model.FlowCursor{}) && !(f.CreatedMS < after.CreatedMS || f.CreatedMS == after.CreatedMS && f.Seq < below) {
			continue
		}
		fs = append(fs, *f)
	}
	sort.Slice(fs, func(i, j int) bool {
		if fs[i].CreatedMS != fs[j].CreatedMS {
			return fs[i].CreatedMS > fs[j].CreatedMS
		}
		return fs[i].Seq > fs[j].Seq
	})
	if len(fs) > limit {
		fs = fs[:limit]
	}
	return fs, nil
}

// rewardRecon answers storage.RewardReconQuery.
func (s *Store) rewardRecon(ctx context.Context, db int, fromMS, toMS, staleMS int64, countFlows bool) (model.RewardRecon, error) {
	if err := ctx.Err(); err != nil {
		return model.RewardRecon{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := model.RewardRecon{DB: db, FromMS: fromMS, ToMS: toMS, FlowsCounted: countFlows}
	var orders []string
	for _, r := range s.rewards {
		if r.Shard.DB() != db {
			continue
		}
		if r.Status != model.RewardBooked {
			out.Pending++
		}
		if r.Status != model.RewardBooked && r.CreatedMS < staleMS {
			out.StalePending++
			if out.OldestPendingMS == 0 || r.CreatedMS < out.OldestPendingMS {
				out.OldestPendingMS = r.CreatedMS
			}
		}
		if r.Status != model.RewardBooked || !r.IntoWallet() || r.BookedMS < fromMS || r.BookedMS >= toMS {
			continue
		}
		out.Booked++
		out.BookedCents += r.Amount
		if _, ok := s.flows[flowKey{r.Shard, r.ActID, model.RewardFlowOrderNo(r.OrderNo)}]; !ok {
			orders = append(orders, r.OrderNo)
		}
	}
	for k, f := range s.flows {
		if countFlows && k.shard.DB() == db && f.Kind == model.FlowReward && f.CreatedMS >= fromMS && f.CreatedMS < toMS {
			out.Flows++
			out.FlowCents += f.Amount
		}
	}
	sort.Strings(orders)
	if len(orders) > 20 {
		orders = orders[:20]
	}
	out.Missing = orders
	return out, nil
}

// issue stages a group's IssueOp: a reward stored before (or by an earlier
// op of the group) decides it by model.ReplayReward, as IssueReward does.
func (g *group) issue(op *storage.IssueOp) {
	if op.Reward.CreatedMS == 0 {
		op.Reward.CreatedMS = g.now
	}
	r := op.Reward
	invariant.That(r.Shard.Valid(), "group issue without a shard")
	prior, ok := g.s.rewards[r.OrderNo]
	if !ok && g.issued != nil {
		prior, ok = g.issued[r.OrderNo]
	}
	if ok {
		op.Replay(*prior)
		return
	}
	r.Status, r.ClaimedMS, r.BookedMS = model.RewardPending, 0, 0
	c := r
	if g.issued == nil {
		g.issued = map[string]*model.Reward{}
	}
	g.issued[r.OrderNo] = &c
	op.Issued = r
	g.writes = append(g.writes, func() { g.s.rewards[c.OrderNo] = &c })
}

// withdrawalOf answers storage.WithdrawalQuery.
func (s *Store) withdrawalOf(ctx context.Context, sh model.ShardID, actID, orderNo string) (model.Withdrawal, bool, error) {
	if err := ctx.Err(); err != nil {
		return model.Withdrawal{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.flows[flowKey{sh, actID, orderNo}]
	if !ok || f.Kind != model.FlowWithdraw {
		return model.Withdrawal{}, false, nil
	}
	return model.Withdrawal{ActID: actID, OrderNo: orderNo, Amount: -f.Amount, Balance: f.BalanceAfter, Repeat: true}, true, nil
}
