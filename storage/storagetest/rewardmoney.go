package storagetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractRewardMoney", func(t *testing.T, newStore func(t *testing.T) Harness) {
		RewardMoney(t, newStore(t), RewardMoneyConfig{Ops: 600, Seed: RewardSeed(1), CheckEvery: 100})
	})
}

// RewardMoneyConfig sets a RewardMoney run.
type RewardMoneyConfig struct {
	// Ops is how many ops to run (a retry after an injected fault is part
	// of its op).
	Ops int
	// Seed draws everything: the ops, their people, stages and amounts, the
	// injected faults.
	Seed uint64
	// CheckEvery runs the full check (every person's wallet, sums, rewards
	// and flows, the lease sums, the Ledger through the audits) after every
	// CheckEvery-th op; 0 only at the end. Every op's own answers, and the
	// wallet and sums of the person it touched (two of them, for a booking
	// that touched more), are checked after each op whatever it is.
	CheckEvery int
}

// RewardSeed is the seed a test passes to RewardMoney: def, or the value of
// REDCELL_REWARD_SEED when set (to replay a failed run, whose seed
// RewardMoney prints).
func RewardSeed(def uint64) uint64 { return envSeed("REDCELL_REWARD_SEED", def) }

// RewardMoney is the money test of the reward wallet: cfg.Ops seeded random
// ops over a few people in four shards of two databases (WorkShards) and all
// three stages, as cells make them: rewards issued (cash of random amounts,
// coupon kinds) under model.RewardOrderNo, retried exactly (a repeat that
// answers the stored reward) and with another amount or activity
// (ORDER_CONFLICT); deposits; withdrawals, each after the forced booking a
// cell does first (PendingRewardsOf, then BookRewards), some above the
// balance (INSUFFICIENT_BALANCE, the order number left free), some retried
// (a repeat) or reusing an order number (ORDER_CONFLICT); the booker's
// TakeRewards of either database and BookRewards of random subsets of what
// it took, with other rewards, booked ones and duplicates mixed in, some
// booked twice; the clock jumping past the 30 s after which a processing
// reward is taken again; and COMMIT faults (h.FailNextCommit) on
// BookRewards and Withdraw, whose answers are held to the contract
// (a failed COMMIT wrote nothing and its retry applies once; a lost answer
// applied, and its retry applies nothing more).
//
// An oracle keeps what the store must hold: every reward, field for field
// (status, taken and booked times), every person's official balance, the
// deposit and withdraw flows, and what each budget lease spent. After every
// op it checks the op's answers against the oracle, and the touched person's
// balance and per-stage sums (two people's, of a booking that touched more); every cfg.CheckEvery ops and at the end,
// everything: balances; RewardSums (booked, pending, income per stage);
// every reward through RewardsOf, paged, each order number once; pending
// rewards; FlowsOf, paged: the deposits and withdrawals once each, no reward
// flow; the reward flows each person's balance holds (its balance less the
// flows FlowsOf lists, which the Ledger's own check ties to the flow rows)
// equal to its booked official cash, so no reward was booked twice and no
// test or gray money reached a wallet; LeaseSpent per lease; and the Ledger
// through model.AuditCell, the store's CellAudit and model.Audit with a
// zero difference and the exact totals. At the end every reward is booked
// and checked once more. h must be a fresh harness. On failure it prints
// the seed.
func RewardMoney(t *testing.T, h Harness, cfg RewardMoneyConfig) {
	t.Helper()
	logSeedOnFailure(t, "RewardMoney", "REDCELL_REWARD_SEED", cfg.Seed)
	m := newRewardMoney(t, newFixture(t, func(*testing.T) Harness { return h }), cfg.Seed)
	for op := 1; op <= cfg.Ops; op++ {
		m.op = op
		m.step()
		if cfg.CheckEvery > 0 && op%cfg.CheckEvery == 0 {
			m.checkAll(fmt.Sprintf("after op %d", op))
		}
	}
	m.checkAll("at the end")
	m.bookAll()
	m.checkAll("with everything booked")
	if cfg.Ops >= 500 {
		for _, what := range []string{"issued", "repeat", "order conflict", "deposit", "withdrawn", "withdraw repeat",
			"withdraw conflict", "insufficient balance", "forced booking", "taken", "taken again", "booked", "booked before",
			"fault: failed", "fault: lost", "stale"} {
			if m.stats[what] == 0 {
				t.Fatalf("the run never did %q: %v", what, m.stats)
			}
		}
	}
	t.Logf("seed %d: %d ops: %v; %d rewards", cfg.Seed, cfg.Ops, m.stats, len(m.rewards))
}

// rmPerson is one person of the run: act_id and home shard.
type rmPerson struct {
	act   string
	shard model.ShardID
}

// rmOrder is an applied deposit or withdrawal: what a retry must answer.
type rmOrder struct {
	p       rmPerson
	orderNo string
	amount  model.Cents // > 0
	balance model.Cents // right after it
}

// rewardMoney is RewardMoney's oracle and random source.
type rewardMoney struct {
	t       *testing.T
	f       *fixture
	r       *rand.Rand
	op      int
	people  []rmPerson
	rewards map[string]*model.Reward // every reward issued, by order number, as the store must hold it
	issued  []string                 // order numbers, in issue order
	rains   map[string][]string      // rain IDs a person's rewards used
	balance map[string]model.Cents   // official wallet by act_id
	flows   map[string][]model.Flow  // deposits and withdrawals by act_id, oldest first
	spent   map[string]model.Cents   // by lease ID
	deps    []rmOrder
	wds     []rmOrder
	free    []rmOrder // withdrawals refused INSUFFICIENT_BALANCE: their order numbers are free
	seq     int
	stats   map[string]int
}

func newRewardMoney(t *testing.T, f *fixture, seed uint64) *rewardMoney {
	m := &rewardMoney{t: t, f: f, r: rand.New(rand.NewPCG(seed, 17)), rewards: map[string]*model.Reward{}, rains: map[string][]string{},
		balance: map[string]model.Cents{}, flows: map[string][]model.Flow{}, spent: map[string]model.Cents{}, stats: map[string]int{}}
	// An act_id may hold '_': the order number still parses from the right.
	for i, act := range []string{"ann", "bo_b", "cy", "dee", "ed_1_x", "flo", "gus", "hal"} {
		m.people = append(m.people, rmPerson{act: act, shard: WorkShards[i%len(WorkShards)]})
	}
	return m
}

func (m *rewardMoney) nowMS() int64 { return m.f.nowMS() }

func (m *rewardMoney) person() rmPerson { return m.people[m.r.IntN(len(m.people))] }

func (m *rewardMoney) next(prefix string) string {
	m.seq++
	return prefix + strconv.Itoa(m.seq)
}

func (m *rewardMoney) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("op %d: "+format, append([]any{m.op}, args...)...)
}

// step runs one random op, checks its answers, and then the touched
// person's wallet and sums.
func (m *rewardMoney) step() {
	m.f.h.Clock.Advance(time.Duration(m.r.IntN(3)) * time.Millisecond)
	var touched []rmPerson
	switch x := m.r.IntN(100); {
	case x < 30:
		touched = m.issue()
	case x < 38:
		touched = m.retry()
	case x < 43:
		touched = m.conflict()
	case x < 51:
		touched = m.deposit()
	case x < 65:
		touched = m.withdraw()
	case x < 85:
		touched = m.takeAndBook()
	case x < 90:
		touched = m.bookSome()
	case x < 95:
		m.f.h.Clock.Advance(31 * time.Second) // past bookerStale: processing rewards are taken again
		m.stats["stale"]++
	default:
		p := m.person()
		m.checkPending(p)
		touched = []rmPerson{p}
	}
	// Two of the people a booking touched are enough here: the full check
	// reads every one of them, and on MariaDB each costs two queries.
	m.r.Shuffle(len(touched), func(i, j int) { touched[i], touched[j] = touched[j], touched[i] })
	for _, p := range touched[:min(2, len(touched))] {
		m.checkPerson(p)
	}
}

// newReward is a reward of p not issued before: a stage, a cash scene or a
// coupon kind, and a rain ID, now and then one p used in another stage or
// scene (a reward of its own: the order number differs).
func (m *rewardMoney) newReward(p rmPerson) model.Reward {
	stage := []string{"test", "gray", model.StageOfficial}[m.r.IntN(3)]
	scene, award, tpl, amount := "rain", model.AwardCash, "", model.Cents(1+m.r.IntN(888))
	switch m.r.IntN(10) {
	case 0, 1:
		scene, award, tpl, amount = "card", "coupon", "tpl-1", model.Cents(1+m.r.IntN(3))
	case 2:
		scene, award, tpl, amount = "box", "gift", "tpl-2", 1
	}
	rain := m.next("r")
	if used := m.rains[p.act]; len(used) > 0 && m.r.IntN(3) == 0 {
		rain = used[m.r.IntN(len(used))]
	}
	order := model.RewardOrderNo(p.act, scene, rain, award, stage)
	if _, taken := m.rewards[order]; taken {
		rain = m.next("r")
		order = model.RewardOrderNo(p.act, scene, rain, award, stage)
	}
	r := model.Reward{OrderNo: order, ActID: p.act, Shard: p.shard, App: "chat", Parent: "fest", Child: "fest-" + stage, Stage: stage,
		Scene: scene, Rain: rain, AwardType: award, TemplateID: tpl, Amount: amount, Token: "tok-" + m.next("t")}
	if award == model.AwardCash {
		r.LeaseID = "L" + strconv.Itoa(m.r.IntN(3))
	}
	if m.r.IntN(2) == 0 { // the cell's time, a little behind the store's; else the store's now
		r.CreatedMS = m.nowMS() - int64(m.r.IntN(50))
	}
	return r
}

// issue issues a new reward: stored pending, answered as stored.
func (m *rewardMoney) issue() []rmPerson {
	p := m.person()
	r := m.newReward(p)
	got, repeat, err := storage.IssueReward(m.f.ctx, m.f.s, r)
	want := r
	if want.CreatedMS == 0 {
		want.CreatedMS = m.nowMS()
	}
	want.Status = model.RewardPending
	if err != nil || repeat || got != want {
		m.fatalf("issue %s: %+v repeat %v, %v; want %+v", r.OrderNo, got, repeat, err, want)
	}
	m.rewards[r.OrderNo] = &want
	m.issued = append(m.issued, r.OrderNo)
	m.rains[p.act] = append(m.rains[p.act], r.Rain)
	if r.LeaseID != "" {
		m.spent[r.LeaseID] += r.Amount
	}
	m.stats["issued"]++
	return []rmPerson{p}
}

func (m *rewardMoney) anyReward() (*model.Reward, bool) {
	if len(m.issued) == 0 {
		return nil, false
	}
	return m.rewards[m.issued[m.r.IntN(len(m.issued))]], true
}

func personOf(r *model.Reward) rmPerson { return rmPerson{act: r.ActID, shard: r.Shard} }

// retry issues a stored reward again as a cell's retry would: another
// token, another time, maybe another lease. It is a repeat answering the
// stored reward as it is now (booked or not), and nothing changes.
func (m *rewardMoney) retry() []rmPerson {
	prior, ok := m.anyReward()
	if !ok {
		return m.issue()
	}
	again := *prior
	again.Token, again.CreatedMS, again.Status, again.ClaimedMS, again.BookedMS = "tok-retry", m.nowMS(), model.RewardPending, 0, 0
	if m.r.IntN(2) == 0 {
		again.LeaseID = "L-retry"
	}
	got, repeat, err := storage.IssueReward(m.f.ctx, m.f.s, again)
	if err != nil || !repeat || got != *prior {
		m.fatalf("exact retry of %s: %+v repeat %v, %v; want the stored %+v as a repeat", prior.OrderNo, got, repeat, err, *prior)
	}
	m.stats["repeat"]++
	return []rmPerson{personOf(prior)}
}

// conflict issues a stored reward's order number with another amount,
// activity or coupon template: ORDER_CONFLICT, and nothing changes.
func (m *rewardMoney) conflict() []rmPerson {
	prior, ok := m.anyReward()
	if !ok {
		return m.issue()
	}
	bad := *prior
	bad.Token = "tok-conflict"
	switch m.r.IntN(4) {
	case 0:
		bad.Parent = "other"
	case 1:
		bad.Child = "fest-other"
	case 2:
		bad.TemplateID += "x"
	default:
		bad.Amount += model.Cents(1 + m.r.IntN(5))
	}
	_, _, err := storage.IssueReward(m.f.ctx, m.f.s, bad)
	if !errors.Is(err, model.ErrOrderConflict) {
		m.fatalf("conflicting retry of %s (%+v): %v, want ORDER_CONFLICT", prior.OrderNo, bad, err)
	}
	m.stats["order conflict"]++
	return []rmPerson{personOf(prior)}
}

// deposit puts money into a wallet under a new order number, or repeats an
// earlier deposit (answered its first result).
func (m *rewardMoney) deposit() []rmPerson {
	if len(m.deps) > 0 && m.r.IntN(8) == 0 {
		d := m.deps[m.r.IntN(len(m.deps))]
		got, err := storage.Deposit(m.f.ctx, m.f.s, d.p.shard, d.p.act, d.orderNo, d.amount)
		if err != nil || !got.Repeat || got.Balance != d.balance {
			m.fatalf("deposit %s again: %+v %v; want a repeat at %d", d.orderNo, got, err, d.balance)
		}
		m.stats["deposit repeat"]++
		return []rmPerson{d.p}
	}
	p := m.person()
	d := rmOrder{p: p, orderNo: m.next("d"), amount: model.Cents(100 + m.r.IntN(5000))}
	d.balance = m.balance[p.act] + d.amount
	got, err := storage.Deposit(m.f.ctx, m.f.s, p.shard, p.act, d.orderNo, d.amount)
	if err != nil || got.Repeat || got.Balance != d.balance {
		m.fatalf("deposit %s of %d to %s: %+v %v; want balance %d", d.orderNo, d.amount, p.act, got, err, d.balance)
	}
	m.balance[p.act] = d.balance
	m.flows[p.act] = append(m.flows[p.act], model.Flow{ActID: p.act, OrderNo: d.orderNo, Kind: model.FlowDeposit, Amount: d.amount,
		BalanceAfter: d.balance, BalanceKnown: true, CreatedMS: m.nowMS()})
	m.deps = append(m.deps, d)
	m.stats["deposit"]++
	return []rmPerson{p}
}

// forcedBooking books p's rewards that are not booked, as a withdrawal does
// first: PendingRewardsOf (checked against the oracle), then BookRewards.
func (m *rewardMoney) forcedBooking(p rmPerson) {
	pend := m.checkPending(p)
	if len(pend) > 0 {
		m.book("forced booking of "+p.act, pend)
		m.stats["forced booking"]++
	}
}

// withdraw is a withdrawal after its forced booking: a new one within the
// balance (now and then under a COMMIT fault), one above it
// (INSUFFICIENT_BALANCE; its order number stays free and is used again
// later), a retry of an applied one (a repeat), or an order number of an
// applied withdrawal with another amount or of a deposit (ORDER_CONFLICT).
func (m *rewardMoney) withdraw() []rmPerson {
	x := m.r.IntN(100)
	if x < 12 && len(m.wds) > 0 {
		w := m.wds[m.r.IntN(len(m.wds))]
		m.forcedBooking(w.p)
		got, err := storage.Withdraw(m.f.ctx, m.f.s, w.p.shard, w.p.act, w.orderNo, w.amount)
		if err != nil || !got.Repeat || got.Balance != w.balance || got.Amount != w.amount || got.OrderNo != w.orderNo {
			m.fatalf("withdrawal %s again: %+v %v; want a repeat at %d", w.orderNo, got, err, w.balance)
		}
		m.stats["withdraw repeat"]++
		return []rmPerson{w.p}
	}
	if x < 20 && len(m.wds)+len(m.deps) > 0 {
		o := m.orderToReuse()
		_, err := storage.Withdraw(m.f.ctx, m.f.s, o.p.shard, o.p.act, o.orderNo, o.amount+model.Cents(1+m.r.IntN(3)))
		if !errors.Is(err, model.ErrOrderConflict) {
			m.fatalf("withdrawal under the used order number %s: %v, want ORDER_CONFLICT", o.orderNo, err)
		}
		m.stats["withdraw conflict"]++
		return []rmPerson{o.p}
	}
	p, order := m.person(), m.next("w")
	if len(m.free) > 0 && m.r.IntN(2) == 0 {
		i := m.r.IntN(len(m.free))
		p, order = m.free[i].p, m.free[i].orderNo
		m.free = slices.Delete(m.free, i, i+1)
	}
	m.forcedBooking(p)
	bal := m.balance[p.act]
	if bal == 0 || m.r.IntN(5) == 0 {
		amount := bal + model.Cents(1+m.r.IntN(100))
		_, err := storage.Withdraw(m.f.ctx, m.f.s, p.shard, p.act, order, amount)
		if !errors.Is(err, model.ErrInsufficientBalance) {
			m.fatalf("withdrawal %s of %d from a balance of %d: %v, want INSUFFICIENT_BALANCE", order, amount, bal, err)
		}
		m.free = append(m.free, rmOrder{p: p, orderNo: order, amount: amount})
		m.stats["insufficient balance"]++
		return []rmPerson{p}
	}
	w := rmOrder{p: p, orderNo: order, amount: model.Cents(1 + m.r.IntN(int(bal)))}
	w.balance = bal - w.amount
	m.withdrawOnce(w)
	m.balance[p.act] = w.balance
	m.flows[p.act] = append(m.flows[p.act], model.Flow{ActID: p.act, OrderNo: order, Kind: model.FlowWithdraw, Amount: -w.amount,
		BalanceAfter: w.balance, BalanceKnown: true, CreatedMS: m.nowMS()})
	m.wds = append(m.wds, w)
	m.stats["withdrawn"]++
	return []rmPerson{p}
}

// orderToReuse is an applied withdrawal or deposit.
func (m *rewardMoney) orderToReuse() rmOrder {
	if n := m.r.IntN(len(m.wds) + len(m.deps)); n < len(m.wds) {
		return m.wds[n]
	} else {
		return m.deps[n-len(m.wds)]
	}
}

// withdrawOnce applies w, which the balance covers, now and then under a
// COMMIT fault: a failed COMMIT changes nothing and the retry applies it; a
// lost answer applied it, and the retry is a repeat.
func (m *rewardMoney) withdrawOnce(w rmOrder) {
	p := w.p
	want := model.Withdrawal{ActID: p.act, OrderNo: w.orderNo, Amount: w.amount, Balance: w.balance}
	switch m.r.IntN(12) {
	case 0:
		fired := m.f.arm(false)
		_, err := storage.Withdraw(m.f.ctx, m.f.s, p.shard, p.act, w.orderNo, w.amount)
		fired()
		if !errors.Is(err, storage.ErrCommitUnknown) {
			m.fatalf("withdrawal %s whose COMMIT failed: %v, want storage.ErrCommitUnknown", w.orderNo, err)
		}
		if b := m.f.balance(p.shard, p.act); b != w.balance+w.amount {
			m.fatalf("balance of %s after a withdrawal whose COMMIT failed: %d, want %d", p.act, b, w.balance+w.amount)
		}
		m.stats["fault: failed"]++
	case 1:
		fired := m.f.arm(true)
		got, err := storage.Withdraw(m.f.ctx, m.f.s, p.shard, p.act, w.orderNo, w.amount)
		fired()
		if err != nil && !errors.Is(err, storage.ErrCommitUnknown) || err == nil && got != want {
			m.fatalf("withdrawal %s whose COMMIT answer was lost: %+v %v; want %+v or storage.ErrCommitUnknown", w.orderNo, got, err, want)
		}
		want.Repeat = true
		m.stats["fault: lost"]++
	}
	got, err := storage.Withdraw(m.f.ctx, m.f.s, p.shard, p.act, w.orderNo, w.amount)
	if err != nil || got != want {
		m.fatalf("withdrawal %s of %d from %s: %+v %v; want %+v", w.orderNo, w.amount, p.act, got, err, want)
	}
}
