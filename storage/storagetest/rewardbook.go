package storagetest

import (
	"errors"
	"fmt"
	"slices"

	"redcell/model"
	"redcell/storage"
)

// book books rs through BookRewards, now and then under a COMMIT fault, and
// holds the answers to the contract: it books each listed reward that is
// not booked yet, once, however often it is listed.
func (m *rewardMoney) book(what string, rs []model.Reward) {
	want := m.unbooked(rs)
	if len(want) > 0 && m.r.IntN(10) == 0 {
		if m.r.IntN(2) == 0 {
			fired := m.f.arm(false)
			_, err := storage.BookRewards(m.f.ctx, m.f.s, rs)
			fired()
			if !errors.Is(err, storage.ErrCommitUnknown) {
				m.fatalf("%s: booking whose COMMIT failed: %v, want storage.ErrCommitUnknown", what, err)
			}
			for _, o := range want {
				m.checkReward(o) // still as before: nothing booked
			}
			m.stats["fault: failed"]++
		} else {
			fired := m.f.arm(true)
			n, err := storage.BookRewards(m.f.ctx, m.f.s, rs)
			fired()
			if err != nil && !errors.Is(err, storage.ErrCommitUnknown) || err == nil && n != len(want) {
				m.fatalf("%s: booking whose COMMIT answer was lost: %d %v; want %d or storage.ErrCommitUnknown", what, n, err, len(want))
			}
			m.booked(want)
			m.stats["fault: lost"]++
			want = nil // the retry below books nothing more
		}
	}
	n, err := storage.BookRewards(m.f.ctx, m.f.s, rs)
	if err != nil || n != len(want) {
		m.fatalf("%s: book %d rewards: %d booked, %v; want %d (those not booked before: %v)", what, len(rs), n, err, len(want), want)
	}
	m.booked(want)
	m.stats["booked"] += n
	if len(want) < len(rs) {
		m.stats["booked before"]++
	}
}

// unbooked is the order numbers of rs the oracle holds not booked, each once.
func (m *rewardMoney) unbooked(rs []model.Reward) []string {
	var out []string
	for _, r := range rs {
		if o := m.rewards[r.OrderNo]; o != nil && o.Status != model.RewardBooked && !slices.Contains(out, r.OrderNo) {
			out = append(out, r.OrderNo)
		}
	}
	return out
}

// booked records the rewards of orders booked now: official cash into the
// wallet.
func (m *rewardMoney) booked(orders []string) {
	for _, o := range orders {
		r := m.rewards[o]
		r.Status, r.BookedMS = model.RewardBooked, m.nowMS()
		if r.IntoWallet() {
			m.balance[r.ActID] += r.Amount
		}
	}
}

// takeAndBook is a booker's pass over one database: TakeRewards (the
// oldest pending ones and the stale processing ones, marked processing),
// then BookRewards of some of them, maybe with others mixed in, maybe
// twice; what it leaves processing is taken again once stale.
func (m *rewardMoney) takeAndBook() []rmPerson {
	db := []int{WorkShards[0].DB(), WorkShards[2].DB()}[m.r.IntN(2)]
	staleMS := m.nowMS() - 30_000
	if m.r.IntN(5) == 0 {
		staleMS = m.nowMS() // every processing reward is stale
	}
	limit := 1 + m.r.IntN(15)
	if m.r.IntN(3) == 0 {
		return m.takeInGroup(db, staleMS, limit)
	}
	taken := m.take(db, staleMS, limit)
	var touched []rmPerson
	for _, r := range taken {
		if p := personOf(&r); !slices.Contains(touched, p) {
			touched = append(touched, p)
		}
	}
	var list []model.Reward
	switch x := m.r.IntN(4); {
	case x < 2:
		list = taken
	case x < 3:
		for _, r := range taken {
			if m.r.IntN(2) == 0 {
				list = append(list, r)
			}
		}
	default:
		list = slices.Clone(taken)
		for range 1 + m.r.IntN(3) {
			if o, ok := m.anyReward(); ok {
				list = append(list, *o)
				touched = append(touched, personOf(o))
			}
		}
		if len(list) > 0 {
			list = append(list, list[m.r.IntN(len(list))]) // listed twice
		}
	}
	m.book(fmt.Sprintf("booking %d of %d taken from db %d", len(list), len(taken), db), list)
	if len(list) > 0 && m.r.IntN(6) == 0 {
		m.book("the same booking again", list)
	}
	return touched
}

// take calls TakeRewards and checks it took the oldest eligible rewards
// (pending, or processing and taken at or before staleMS), as many as limit
// allows, oldest first, each once, now processing.
func (m *rewardMoney) take(db int, staleMS int64, limit int) []model.Reward {
	var eligible []*model.Reward
	for _, r := range m.rewards {
		if r.Shard.DB() == db && (r.Status == model.RewardPending || r.Status == model.RewardProcessing && r.ClaimedMS <= staleMS) {
			eligible = append(eligible, r)
		}
	}
	taken, err := storage.TakeRewards(m.f.ctx, m.f.s, db, staleMS, limit)
	if err != nil || len(taken) != min(limit, len(eligible)) {
		m.fatalf("take from db %d (limit %d): %d rewards, %v; want %d of %d eligible", db, limit, len(taken), err, min(limit, len(eligible)), len(eligible))
	}
	now, seen, newest := m.nowMS(), map[string]bool{}, int64(0)
	for i, r := range taken {
		o := m.rewards[r.OrderNo]
		if o == nil || seen[r.OrderNo] || o.Shard.DB() != db || !slices.Contains(eligible, o) {
			m.fatalf("take from db %d answered %s: not eligible, or twice", db, r.OrderNo)
		}
		seen[r.OrderNo] = true
		if i > 0 && r.CreatedMS < taken[i-1].CreatedMS {
			m.fatalf("take from db %d: %s (created %d) after %s (created %d): not oldest first", db, r.OrderNo, r.CreatedMS, taken[i-1].OrderNo, taken[i-1].CreatedMS)
		}
		newest = max(newest, r.CreatedMS)
		if o.Status == model.RewardProcessing {
			m.stats["taken again"]++
		}
		o.Status, o.ClaimedMS = model.RewardProcessing, now
		if r != *o {
			m.fatalf("take from db %d answered %+v, want %+v", db, r, *o)
		}
	}
	for _, o := range eligible {
		if !seen[o.OrderNo] && o.CreatedMS < newest {
			m.fatalf("take from db %d left %s (created %d) and took one created at %d: not the oldest", db, o.OrderNo, o.CreatedMS, newest)
		}
	}
	m.stats["taken"] += len(taken)
	return taken
}

// takeInGroup is a booker's pass as cells make it: RewardsDueQuery (true
// exactly when a reward is eligible), then one group op
// (BookOp with a RewardTake) that finds the oldest eligible rewards of
// db, as take does, and books them in the same transaction. It checks the
// op booked as many as limit allows of the eligible ones, oldest first,
// each once, and answered them as booked now.
func (m *rewardMoney) takeInGroup(db int, staleMS int64, limit int) []rmPerson {
	var eligible []*model.Reward
	for _, r := range m.rewards {
		if r.Shard.DB() == db && (r.Status == model.RewardPending || r.Status == model.RewardProcessing && r.ClaimedMS <= staleMS) {
			eligible = append(eligible, r)
		}
	}
	due := &storage.RewardsDueQuery{DB: db, StaleMS: staleMS}
	if err := m.f.s.Read(m.f.ctx, due); err != nil || due.Due != (len(eligible) > 0) {
		m.fatalf("rewards due in db %d: %v, %v; want %v (%d eligible)", db, due.Due, err, len(eligible) > 0, len(eligible))
	}
	op := &storage.BookOp{Take: &storage.RewardTake{DB: db, StaleMS: staleMS, IssuedByMS: m.nowMS(), Limit: limit}}
	err := m.f.s.CommitGroup(m.f.ctx, []storage.Op{op})
	if err != nil || op.Err != nil || op.Applied != min(limit, len(eligible)) || len(op.Rewards) != op.Applied {
		m.fatalf("take and book in a group, db %d (limit %d): %d booked, %d answered, %v %v; want %d of %d eligible",
			db, limit, op.Applied, len(op.Rewards), err, op.Err, min(limit, len(eligible)), len(eligible))
	}
	now, seen, newest := m.nowMS(), map[string]bool{}, int64(0)
	var touched []rmPerson
	var orders []string
	for i, r := range op.Rewards {
		o := m.rewards[r.OrderNo]
		if o == nil || seen[r.OrderNo] || !slices.Contains(eligible, o) {
			m.fatalf("take and book in a group, db %d, answered %s: not eligible, or twice", db, r.OrderNo)
		}
		seen[r.OrderNo] = true
		if i > 0 && r.CreatedMS < op.Rewards[i-1].CreatedMS {
			m.fatalf("take and book in a group, db %d: not oldest first", db)
		}
		newest = max(newest, r.CreatedMS)
		orders = append(orders, r.OrderNo)
		if p := personOf(o); !slices.Contains(touched, p) {
			touched = append(touched, p)
		}
	}
	for _, o := range eligible {
		if !seen[o.OrderNo] && o.CreatedMS < newest {
			m.fatalf("take and book in a group, db %d, left %s (created %d) and booked one created at %d: not the oldest", db, o.OrderNo, o.CreatedMS, newest)
		}
	}
	m.booked(orders)
	for _, r := range op.Rewards {
		if o := m.rewards[r.OrderNo]; r != *o || r.BookedMS != now {
			m.fatalf("take and book in a group answered %+v, want %+v", r, *o)
		}
	}
	m.stats["taken and booked in a group"] += len(op.Rewards)
	return touched
}

// bookSome books a few rewards taken or not, booked or not, one listed
// twice: book_now, a restored token, a booker that lost its answer.
func (m *rewardMoney) bookSome() []rmPerson {
	var list []model.Reward
	var touched []rmPerson
	for range 1 + m.r.IntN(5) {
		if o, ok := m.anyReward(); ok {
			list = append(list, *o)
			touched = append(touched, personOf(o))
		}
	}
	if len(list) == 0 {
		return nil
	}
	list = append(list, list[0])
	m.book("booking some", list)
	return touched
}

// bookAll takes and books every reward not booked, database by database.
func (m *rewardMoney) bookAll() {
	for _, db := range []int{WorkShards[0].DB(), WorkShards[2].DB()} {
		for round := 0; ; round++ {
			if round == 100 {
				m.fatalf("db %d still has rewards to take after 100 rounds", db)
			}
			taken := m.take(db, m.nowMS(), 500)
			if len(taken) == 0 {
				break
			}
			m.book("booking everything", taken)
		}
	}
	for _, r := range m.rewards {
		if r.Status != model.RewardBooked {
			m.fatalf("reward %s left %v after booking everything", r.OrderNo, r.Status)
		}
	}
}
