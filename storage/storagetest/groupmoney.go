package storagetest

import (
	"context"
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

// GroupMoneyConfig sets a GroupMoney run.
type GroupMoneyConfig struct {
	// Ops is how many ops to commit in groups (a failed group's retry is
	// not counted again).
	Ops int
	// Seed draws everything: the groups, their ops, the injected failures.
	Seed uint64
	// AuditEvery compares the two stores' ledgers (audits, sums, claims,
	// credits) after every AuditEvery-th group; 0 only at the
	// end. Every group is compared answer by answer whatever it is.
	AuditEvery int
}

// GroupSeed is the seed a test passes to GroupMoney: def, or the value of
// REDCELL_GROUP_SEED when set (to replay a failed run, whose seed
// GroupMoney prints).
func GroupSeed(def uint64) uint64 { return envSeed("REDCELL_GROUP_SEED", def) }

// msDuration is ms milliseconds.
func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// GroupMoney is the money test of group commit: cfg.Ops mixed ops (deposits,
// withdrawals, sends, opens of one to four users, refunds of packets mostly
// past their expiry, credit batches of claims not credited yet) committed through h's
// CommitGroup in seeded random groups of 2 to 12 ops, each group carrying one injected failure: a duplicate order number (a
// repeat or ORDER_CONFLICT), a send above the balance, an open past a
// packet's last share, a COMMIT whose connection is killed before it
// reaches the database (the group must fail, write nothing, and its retry
// apply every op once), a deposit whose wallet another transaction holds
// locked (h.HoldWallet; the group must wait for it: released, the group
// commits as if nothing had held it; or its context ended while it waits,
// the group fails, writes nothing, and its retry applies every op once,
// the two in turn), these five in turn, and in one group of 64
// instead a COMMIT that applied but whose answer was lost (the group
// answers success or storage.ErrCommitUnknown; its retry applies nothing
// twice). A group's credit batch, at most one,
// comes last in it, as a relay's batch joins a group after the requests
// (ContractGroupCreditsAfterOtherOps and ContractGroupCreditsCountedPerOp
// check credits elsewhere in a group).
//
// oracle, a fresh store fed the same ops one by one through the single-op
// methods, is the model: every answer of every group must be the oracle's,
// code for code and cent for cent, and at the end (and every
// cfg.AuditEvery groups) both stores' ledgers pass their audits and hold
// the same rows, so nothing was applied twice and every cent is conserved.
// h and oracle must be fresh harnesses (empty, clocks at Start); h's store
// must implement storage.Grouper. The run crosses midnight (day tables 14
// and 15). On failure it prints the seed.
func GroupMoney(t *testing.T, h, oracle Harness, cfg GroupMoneyConfig) {
	t.Helper()
	if h.HoldWallet == nil {
		t.Fatal("GroupMoney: the harness has no HoldWallet")
	}
	logSeedOnFailure(t, "GroupMoney", "REDCELL_GROUP_SEED", cfg.Seed)
	p := newPair(t, newFixture(t, func(*testing.T) Harness { return h }), newFixture(t, func(*testing.T) Harness { return oracle }))
	p.advanceMS(14*time.Hour.Milliseconds() - 5000) // 23:59:55
	m := &money{t: t, p: p, r: rand.New(rand.NewPCG(cfg.Seed, 9)), stats: map[string]int{}}
	for i := range 40 {
		m.users = append(m.users, fmt.Sprintf("g%02d", i))
	}
	groups := 0
	for ops := 0; ops < cfg.Ops; groups++ {
		ops += m.group(groups)
		if cfg.AuditEvery > 0 && groups%cfg.AuditEvery == 0 {
			p.sameBooks(fmt.Sprintf("after group %d", groups))
		}
		p.advanceMS(int64(m.r.IntN(20)))
	}
	r := p.sameBooks("at the end")
	for k := range injectKinds {
		if cfg.Ops >= 200 && m.injected[k] == 0 {
			t.Fatalf("no group carried the failure %q", injectNames[k])
		}
	}
	if cfg.Ops >= 200 && (r.ClaimsCount == 0 || r.CreditsCount == 0 || m.stats["sold out"] == 0 || m.stats["insufficient balance"] == 0 ||
		m.stats["order conflict"] == 0 || m.stats["repeat"] == 0 || m.stats["refund"] == 0 || m.stats["withdraw"] == 0) {
		t.Fatalf("the run did too little: %+v, answers %v", r, m.stats)
	}
	t.Logf("seed %d: %d ops in %d groups, injected %v; answers %v; %d packets, %d claims, %d credits, %d cents in flight",
		cfg.Seed, m.ops, groups, m.injected, m.stats, r.Packets, r.ClaimsCount, r.CreditsCount, r.InFlight)
}

// money is GroupMoney's state: what it knows of the books, from the
// oracle's answers.
type money struct {
	t        *testing.T
	p        *pair
	r        *rand.Rand
	users    []string
	done     []spec            // deposits and sends applied (not repeats), for order numbers used again
	refs     []model.PacketRef // packets sent, newest last
	orders   int               // order numbers made
	ops      int
	injected [injectKinds]int
	stats    map[string]int
}

func (m *money) shardOf(act string) model.ShardID {
	n, _ := strconv.Atoi(act[1:])
	return WorkShards[n%len(WorkShards)]
}

func (m *money) user() string { return m.users[m.r.IntN(len(m.users))] }

func (m *money) order(prefix string) string {
	m.orders++
	return fmt.Sprintf("%s%d", prefix, m.orders)
}

// packetID is model.NewPacketID with its random part drawn from m.r.
func (m *money) packetID(s model.ShardID) model.PacketID {
	t := m.p.g.h.Clock.Now().UTC()
	return model.PacketID(fmt.Sprintf("%04d%02d%02d%03d%016x", t.Year(), int(t.Month()), t.Day(), int(s), m.r.Uint64()))
}

func (m *money) deposit(u string) spec {
	return depositOp(m.shardOf(u), u, m.order("d"), model.Cents(100+m.r.IntN(20)*100))
}

// withdraw is a withdrawal of up to about the user's balance as the oracle
// holds it (above it now and then: refused, its order number left free).
func (m *money) withdraw(u string) spec {
	s := m.shardOf(u)
	amount := 1 + m.p.o.balance(s, u)*model.Cents(m.r.IntN(11))/10
	return withdrawOp(s, u, m.order("w"), amount)
}

func (m *money) send() spec {
	u := m.user()
	s := m.shardOf(u)
	req := model.SendRequest{Sender: u, Amount: model.Cents(10 + m.r.IntN(500)), Count: int64(1 + m.r.IntN(8)), Kind: model.KindRandom,
		Greeting: "gm", OrderNo: m.order("s")}
	if m.r.IntN(4) == 0 {
		req.Kind, req.Amount = model.KindFixed, model.Cents(req.Count*int64(1+m.r.IntN(50)))
	}
	ttl := time.Hour.Milliseconds()
	if m.r.IntN(10) == 0 {
		ttl = int64(1 + m.r.IntN(300)) // some packets expire during the run
	}
	return sendOp(s, req, m.packetID(s), m.p.nowMS()+ttl)
}

func (m *money) open() (spec, bool) {
	if len(m.refs) == 0 {
		return spec{}, false
	}
	ref := m.refs[len(m.refs)-1-m.r.IntN(min(len(m.refs), 10))]
	reqs := make([]model.OpenRequest, 1+m.r.IntN(4))
	for i := range reqs {
		u := m.user()
		reqs[i] = opener(u, m.shardOf(u))
	}
	return openOp(ref, m.r.Uint64(), reqs...), true
}

// pending is the claims of WorkShards' databases not credited yet, as the
// oracle's ledger shows them, each as the credit it owes, by claim ID.
func (m *money) pending() []model.Credit {
	l, err := m.p.o.s.Ledger(m.p.o.ctx, m.p.o.cell)
	if err != nil {
		m.t.Fatalf("the oracle's ledger: %v", err)
	}
	var all []model.Credit
	for _, id := range claimIDs(l.Claims) {
		c := l.Claims[id]
		ref, _, err := model.ParseClaimID(id)
		if err != nil {
			m.t.Fatalf("the oracle's ledger: claim %s: %v", id, err)
		}
		if c.ActShard != m.shardOf(c.ActID) {
			m.t.Fatalf("the oracle's ledger: claim %s of %s owed to shard %d, the claimant's is %d", id, c.ActID, c.ActShard, m.shardOf(c.ActID))
		}
		if _, credited := l.Credits[id]; !credited && slices.ContainsFunc(WorkShards, func(s model.ShardID) bool { return s.DB() == ref.Shard.DB() }) {
			all = append(all, model.CreditOf(c))
		}
	}
	return all
}

// refund is a refund of a recent packet, one past its expiry when there is
// one (else one not expired, which refunds nothing).
func (m *money) refund() (spec, bool) {
	if len(m.refs) == 0 {
		return spec{}, false
	}
	now := m.p.nowMS()
	ref := m.refs[len(m.refs)-1-m.r.IntN(min(len(m.refs), 10))]
	for _, i := range m.r.Perm(len(m.refs)) {
		if p := m.p.o.packet(m.refs[i]); p.Status == model.StatusOpen && now >= p.ExpiresMS {
			ref = m.refs[i]
			break
		}
	}
	sp := refundOp(ref)
	sp.sender = m.p.o.packet(ref).Sender
	return sp, true
}

func (m *money) credits(pool []model.Credit) (spec, bool) {
	if len(pool) == 0 {
		return spec{}, false
	}
	cs := make([]model.Credit, 1+m.r.IntN(min(len(pool), 20)))
	for i := range cs {
		cs[i] = pool[m.r.IntN(len(pool))]
	}
	return creditsOp(cs...), true
}

// touched reports whether an op of specs changes act's balance.
func touched(specs []spec, act string, s model.ShardID) bool {
	for _, sp := range specs {
		switch in := sp.in.(type) {
		case *storage.DepositOp:
			if in.ActID == act && in.Shard == s {
				return true
			}
		case *storage.WithdrawOp:
			if in.ActID == act && in.Shard == s {
				return true
			}
		case *storage.SendOp:
			if in.Req.Sender == act && in.Shard == s {
				return true
			}
		case *storage.CreditsOp:
			for _, c := range in.Credits {
				if c.ActID == act && c.Shard == s {
					return true
				}
			}
		case *storage.RefundOp:
			if sp.sender == act && in.Ref.Shard == s {
				return true
			}
		}
	}
	return false
}

// opened reports whether an op of specs opens ref.
func opened(specs []spec, ref model.PacketRef) bool {
	for _, sp := range specs {
		if o, ok := sp.in.(*storage.OpenOp); ok && o.Ref.ID == ref.ID {
			return true
		}
	}
	return false
}

// group makes, commits and checks group number gi; it returns its ops.
func (m *money) group(gi int) int {
	specs, batch := m.randomSpecs()
	inj, sp := m.chooseInjection(gi, specs, batch)
	inj.at = m.r.IntN(len(specs) + 1)
	specs = append(slices.Insert(specs, inj.at, sp), batch...)
	m.injected[inj.kind]++
	m.ops += len(specs)

	what := fmt.Sprintf("group %d (%d ops, %s at op %d)", gi, len(specs), injectNames[inj.kind], inj.at)
	ops := opsOf(specs)
	if inj.kind == injectKill {
		fired := m.p.g.arm(false)
		err := m.p.cg.CommitGroup(m.p.g.ctx, storage.Ops(ops))
		fired()
		if err == nil {
			m.t.Fatalf("%s: the group whose connection was killed before COMMIT answered success", what)
		}
		ops = opsOf(specs) // the retry: the same ops, answered again
	}
	if inj.kind == injectLost {
		// The group applied; its answers, when it found that out, are the
		// oracle's. The retry is then answered as the oracle answers the
		// same ops again: repeats, and whatever the first pass made
		// possible (a send the group's own deposit now covers).
		fired := m.p.g.arm(true)
		err := m.p.cg.CommitGroup(m.p.g.ctx, storage.Ops(ops))
		fired()
		first := m.p.oracle(specs)
		if err == nil {
			m.p.compare(what, ops, first)
		} else if !errors.Is(err, storage.ErrCommitUnknown) {
			m.t.Fatalf("%s: the group whose COMMIT answer was lost: %v, want success or storage.ErrCommitUnknown", what, err)
		}
		m.learn(specs, first)
		ops = opsOf(specs)
	}
	if inj.kind == injectLocked {
		if m.injected[injectLocked]%2 == 0 {
			m.held(what, ops, sp.in.(*storage.DepositOp), true) // fails, writes nothing
			ops = opsOf(specs)                                  // the retry, below
		} else {
			m.held(what, ops, sp.in.(*storage.DepositOp), false) // commits: answered below
		}
	}
	if inj.kind != injectLocked || m.injected[injectLocked]%2 == 0 {
		if err := m.p.cg.CommitGroup(m.p.g.ctx, storage.Ops(ops)); err != nil {
			m.t.Fatalf("%s: %v", what, err)
		}
	}
	want := m.p.oracle(specs)
	m.p.compare(what, ops, want)
	m.check(what, inj, ops[inj.at])
	m.learn(specs, want)
	return len(specs)
}

// randomSpecs draws a group's ops, 1 to 11 of them plus at most one credit
// batch (batch: it goes last).
func (m *money) randomSpecs() (specs, batch []spec) {
	for n := 1 + m.r.IntN(11); len(specs)+len(batch) < n; {
		var sp spec
		ok := true
		switch x := m.r.IntN(100); {
		case x < 22:
			sp = m.deposit(m.user())
		case x < 25:
			sp = m.withdraw(m.user())
		case x < 45:
			sp = m.send()
		case x < 80:
			sp, ok = m.open()
		case x < 85:
			sp, ok = m.refund()
		case len(batch) == 0:
			if sp, ok = m.credits(m.pending()); ok {
				batch = append(batch, sp)
			}
			continue
		default:
			continue
		}
		if ok {
			specs = append(specs, sp)
		}
	}
	return specs, batch
}

// chooseInjection picks the failure group gi carries (the kinds in turn,
// injectLost once in 64 groups; injectInsufficient when the kind finds no op
// to make) and the op that carries it.
func (m *money) chooseInjection(gi int, specs, batch []spec) (injection, spec) {
	inj := injection{kind: gi % injectLost}
	if gi%64 == 63 {
		inj.kind = injectLost // fewer: settling a lost answer costs MariaDB a re-read and a new connection
	}
	var sp spec
	ok := false
	for !ok {
		switch inj.kind {
		case injectDup:
			sp, inj.repeat, ok = m.duplicate()
		case injectInsufficient:
			sp, ok = m.insufficient(specs), true
		case injectSoldOut:
			sp, ok = m.soldOut(specs)
		case injectKill, injectLost:
			sp, ok = m.deposit(m.user()), true // something to write, so there is a COMMIT to cut
		case injectLocked:
			sp, ok = m.deposit(m.uncredited(batch)), true
		}
		if !ok {
			inj.kind = injectInsufficient
		}
	}
	return inj, sp
}

// uncredited is a user whom no credit of batch (a credit batch or
// nothing) credits: a credit to a held wallet is deferred, which the
// oracle, holding nothing, would not do.
func (m *money) uncredited(batch []spec) string {
	for {
		u := m.user()
		if !touched(batch, u, m.shardOf(u)) {
			return u
		}
	}
}

// held commits ops while the wallet of in, the group's injected deposit,
// is held by another transaction (Harness.HoldWallet). Once the group waits
// for it, either its context ends (end: the group must answer an error;
// nothing may be written, which the retry's answers, the oracle's, show)
// or the hold is released (the group must commit, answered by the caller).
func (m *money) held(what string, ops []storage.MoneyOp, in *storage.DepositOp, end bool) {
	m.t.Helper()
	waiters, release := m.p.g.h.HoldWallet(in.Shard, in.ActID)
	defer release()
	ctx, cancel := context.WithCancel(m.p.g.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.p.cg.CommitGroup(ctx, storage.Ops(ops)) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	giveUp := time.Now().Add(30 * time.Second) // it waits within milliseconds
	for waiters() == 0 {
		select {
		case err := <-done:
			m.t.Fatalf("%s: the group answered (%v) without waiting for the wallet of %s, held by another transaction", what, err, in.ActID)
		case <-tick.C:
		}
		if time.Now().After(giveUp) {
			m.t.Fatalf("%s: the group did not wait for the held wallet of %s within 30 s", what, in.ActID)
		}
	}
	if end {
		cancel()
	} else {
		release()
	}
	err := <-done
	switch {
	case end && err == nil:
		m.t.Fatalf("%s: the group whose context ended while it waited for a held wallet answered success", what)
	case !end && err != nil:
		m.t.Fatalf("%s: the group that waited for a held wallet, then released: %v", what, err)
	}
	m.stats["waited for a held wallet"]++
}

// learn records what the oracle's answers applied.
func (m *money) learn(specs []spec, ops []storage.MoneyOp) {
	for i, o := range ops {
		a, op := answerOf(o), answeredOf(o)
		if a.Err != "" {
			m.stats[errName(a.Err)]++
			continue
		}
		switch op.Kind {
		case storage.OpDeposit:
			if op.Deposit.Repeat {
				m.stats["repeat"]++
				continue
			}
			m.stats["deposit"]++
			m.done = append(m.done, specs[i])
		case storage.OpSend:
			if op.Repeat {
				m.stats["repeat"]++
				continue
			}
			m.stats["send"]++
			m.done = append(m.done, specs[i])
			ref, _ := model.ParsePacketID(string(op.Packet.ID))
			m.refs = append(m.refs, ref)
		case storage.OpOpen:
			for _, r := range a.Results {
				switch {
				case r.Err != "":
					m.stats[errName(r.Err)]++
				case r.Repeat:
					m.stats["repeat claim"]++
				default:
					m.stats["claim"]++
				}
			}
		case storage.OpRefund:
			if op.Refunded > 0 {
				m.stats["refund"]++
			}
		case storage.OpWithdraw:
			if op.Withdrawal.Repeat {
				m.stats["repeat"]++
				continue
			}
			m.stats["withdraw"]++
		case storage.OpCredits:
			m.stats["credited"] += op.Applied
		}
	}
}
