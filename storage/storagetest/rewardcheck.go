package storagetest

import (
	"reflect"
	"slices"
	"sort"

	"redcell/model"
	"redcell/storage"
)

// rewardsOf is p's rewards in the oracle, in the order of keep's listing:
// newest first for RewardsOf, oldest first for PendingRewardsOf.
func (m *rewardMoney) rewardsOf(p rmPerson, newestFirst bool, keep func(*model.Reward) bool) []model.Reward {
	var out []model.Reward
	for _, r := range m.rewards {
		if r.ActID == p.act && keep(r) {
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		older := a.CreatedMS < b.CreatedMS || a.CreatedMS == b.CreatedMS && a.OrderNo < b.OrderNo
		return older != newestFirst
	})
	return out
}

// sumsOf is p's RewardSums by the oracle: cash only in cents, pending
// counting every award type, stages sorted, a stage without a reward absent.
func (m *rewardMoney) sumsOf(p rmPerson) []model.StageSums {
	by := map[string]*model.StageSums{}
	for _, r := range m.rewards {
		if r.ActID != p.act {
			continue
		}
		s := by[r.Stage]
		if s == nil {
			s = &model.StageSums{Stage: r.Stage}
			by[r.Stage] = s
		}
		booked := r.Status == model.RewardBooked
		if !booked {
			s.PendingCount++
		}
		if r.AwardType != model.AwardCash {
			continue
		}
		s.Income += r.Amount
		if booked {
			s.Booked += r.Amount
		} else {
			s.Pending += r.Amount
		}
	}
	out := []model.StageSums{}
	for _, st := range []string{"gray", model.StageOfficial, "test"} { // sorted by name
		if s := by[st]; s != nil {
			out = append(out, *s)
		}
	}
	return out
}

// walletCash is the official cash of p's booked rewards: what p's reward
// flows must add up to.
func (m *rewardMoney) walletCash(p rmPerson) model.Cents {
	var sum model.Cents
	for _, r := range m.rewards {
		if r.ActID == p.act && r.Status == model.RewardBooked && r.IntoWallet() {
			sum += r.Amount
		}
	}
	return sum
}

// checkPerson checks p's balance and per-stage sums.
func (m *rewardMoney) checkPerson(p rmPerson) {
	m.t.Helper()
	if b := m.f.balance(p.shard, p.act); b != m.balance[p.act] {
		m.fatalf("balance of %s: %d, want %d", p.act, b, m.balance[p.act])
	}
	sums, err := storage.RewardSums(m.f.ctx, m.f.s, p.shard, p.act)
	if want := m.sumsOf(p); err != nil || !reflect.DeepEqual(append([]model.StageSums{}, sums...), want) {
		m.fatalf("reward sums of %s: %+v %v, want %+v", p.act, sums, err, want)
	}
}

// checkPending checks PendingRewardsOf against the oracle and answers it.
func (m *rewardMoney) checkPending(p rmPerson) []model.Reward {
	m.t.Helper()
	pend, err := storage.PendingRewardsOf(m.f.ctx, m.f.s, p.shard, p.act, 1000)
	want := m.rewardsOf(p, false, func(r *model.Reward) bool { return r.Status != model.RewardBooked })
	if err != nil || len(pend) != len(want) || len(want) > 0 && !reflect.DeepEqual(pend, want) {
		m.fatalf("pending rewards of %s: %d %v, want %d:\n%+v\nwant\n%+v", p.act, len(pend), err, len(want), pend, want)
	}
	return pend
}

// checkReward reads one reward and compares it with the oracle's.
func (m *rewardMoney) checkReward(orderNo string) {
	m.t.Helper()
	o := m.rewards[orderNo]
	r, err := storage.Reward(m.f.ctx, m.f.s, o.Shard, orderNo)
	if err != nil || r != *o {
		m.fatalf("reward %s: %+v %v, want %+v", orderNo, r, err, *o)
	}
}

// checkListing pages through p's rewards (RewardsOf, every stage, a page of
// 7) and flows (FlowsOf, a page of 5) and compares both with the oracle:
// every reward once, field for field; the deposits and withdrawals once,
// newest first, and no reward flow. It answers the flows' sum.
func (m *rewardMoney) checkListing(p rmPerson) model.Cents {
	m.t.Helper()
	var got []model.Reward
	seen := map[string]bool{}
	for cur := (model.FlowCursor{}); ; {
		page, err := storage.RewardsOf(m.f.ctx, m.f.s, p.shard, p.act, "", cur, 7)
		if err != nil {
			m.fatalf("rewards of %s: %v", p.act, err)
		}
		for _, r := range page {
			if seen[r.OrderNo] {
				m.fatalf("rewards of %s list %s twice", p.act, r.OrderNo)
			}
			seen[r.OrderNo] = true
		}
		got = append(got, page...)
		if len(page) < 7 || len(got) > len(m.rewards) {
			break
		}
		cur = model.FlowCursor{CreatedMS: page[6].CreatedMS, ID: page[6].OrderNo}
	}
	want := m.rewardsOf(p, true, func(*model.Reward) bool { return true })
	if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(got, want) {
		m.fatalf("rewards of %s: %d listed, want %d:\n%+v\nwant\n%+v", p.act, len(got), len(want), got, want)
	}
	var flows []model.Flow
	var sum model.Cents
	for cur := (model.FlowCursor{}); ; {
		page, err := storage.FlowsOf(m.f.ctx, m.f.s, p.shard, p.act, cur, 5)
		if err != nil {
			m.fatalf("flows of %s: %v", p.act, err)
		}
		for _, f := range page {
			sum += f.Amount
			flows = append(flows, model.Flow{ActID: f.ActID, OrderNo: f.OrderNo, Kind: f.Kind, Amount: f.Amount,
				BalanceAfter: f.BalanceAfter, BalanceKnown: f.BalanceKnown, CreatedMS: f.CreatedMS})
		}
		if len(page) < 5 || len(flows) > len(m.flows[p.act]) {
			break
		}
		cur = model.FlowCursor{CreatedMS: page[4].CreatedMS, ID: model.FlowItemID(page[4].Seq)}
	}
	wantFlows := slices.Clone(m.flows[p.act])
	slices.Reverse(wantFlows)
	if len(flows) != len(wantFlows) || len(wantFlows) > 0 && !reflect.DeepEqual(flows, wantFlows) {
		m.fatalf("flows of %s: %d listed, want %d (deposits and withdrawals, once each, no reward flow):\n%+v\nwant\n%+v",
			p.act, len(flows), len(wantFlows), flows, wantFlows)
	}
	return sum
}

// checkAll checks everything against the oracle; see RewardMoney.
func (m *rewardMoney) checkAll(when string) {
	m.t.Helper()
	var bk books
	for _, p := range m.people {
		m.checkPerson(p)
		m.checkPending(p)
		listed := m.checkListing(p)
		// The Ledger's check (below) ties a balance to all of its flow
		// rows; FlowsOf listed all but the reward ones. What is left is
		// the reward flows: each booked official cash reward once.
		if held, want := m.balance[p.act]-listed, m.walletCash(p); held != want {
			m.fatalf("%s: %s's wallet holds %d cents of reward flows, want %d (its booked official cash)", when, p.act, held, want)
		}
		bk.rewards += m.walletCash(p)
		bk.balances += m.balance[p.act]
		for _, f := range m.flows[p.act] {
			if f.Kind == model.FlowDeposit {
				bk.deposits += f.Amount
			} else {
				bk.withdrawals -= f.Amount
			}
		}
	}
	for range min(10, len(m.issued)) {
		m.checkReward(m.issued[m.r.IntN(len(m.issued))])
	}
	dbs := []int{WorkShards[0].DB(), WorkShards[2].DB()}
	for _, lease := range []string{"L0", "L1", "L2", "L-retry"} {
		if n, err := storage.LeaseSpent(m.f.ctx, m.f.s, dbs, lease); err != nil || model.Cents(n) != m.spent[lease] {
			m.fatalf("%s: lease %s spent %d, %v; want %d", when, lease, n, err, m.spent[lease])
		}
	}
	m.f.check(bk)
}
