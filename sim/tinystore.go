package sim

// THROWAWAY: a minimal in-memory storage.Store used only until
// storage/memstore lands; it is deleted then.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

func newStore(w *world) storage.Store { return newTiny(w.clk) }

type tinyFlow struct {
	kind    string
	amount  model.Cents
	balance model.Cents
	ref     string
	hash    string
}

type acctKey struct {
	s   model.ShardID
	act string
}

type flowKey struct {
	s          model.ShardID
	act, order string
}

type tiny struct {
	clk      clock.Clock
	accounts map[acctKey]model.Cents
	flows    map[flowKey]tinyFlow
	flowList []flowKey
	packets  map[model.PacketID]*model.Packet
	pktList  []model.PacketID
	claims   map[model.PacketID][]model.Claim
	outbox   map[string]*model.OutboxRow
	outList  []string
	pending  map[int][]string // by db, undelivered (compacted on read)
	credits  map[string]model.Credit
	failNext int // 0 none, 1 fail, 2 lost answer
}

func newTiny(c clock.Clock) *tiny {
	return &tiny{clk: c, accounts: map[acctKey]model.Cents{}, flows: map[flowKey]tinyFlow{}, packets: map[model.PacketID]*model.Packet{},
		claims: map[model.PacketID][]model.Claim{}, outbox: map[string]*model.OutboxRow{}, credits: map[string]model.Credit{}, pending: map[int][]string{}}
}

var errTinyCommit = errors.New("tiny: commit failed")

func (t *tiny) FailNextCommit(lost bool) {
	t.failNext = 1
	if lost {
		t.failNext = 2
	}
}

func (t *tiny) commit(apply func()) error {
	f := t.failNext
	t.failNext = 0
	switch f {
	case 1:
		return errTinyCommit
	case 2:
		apply()
		return errTinyCommit
	}
	apply()
	return nil
}

func (t *tiny) nowMS() int64 { return t.clk.Now().UnixMilli() }

func (t *tiny) addFlow(k flowKey, f tinyFlow) {
	t.flows[k] = f
	t.flowList = append(t.flowList, k)
	t.accounts[acctKey{k.s, k.act}] += f.amount
}

func (t *tiny) Deposit(_ context.Context, s model.ShardID, act, order string, amount model.Cents) (model.Deposit, error) {
	k := flowKey{s, act, order}
	out := model.Deposit{ActID: act, OrderNo: order, Amount: amount}
	if f, ok := t.flows[k]; ok {
		if f.kind != "deposit" || f.amount != amount {
			return model.Deposit{}, model.Errorf(model.ErrOrderConflict, "order %s", order)
		}
		out.Balance, out.Repeat = f.balance, true
		return out, nil
	}
	bal := t.accounts[acctKey{s, act}] + amount
	err := t.commit(func() { t.addFlow(k, tinyFlow{kind: "deposit", amount: amount, balance: bal}) })
	out.Balance = bal
	return out, err
}

func (t *tiny) Account(_ context.Context, s model.ShardID, act string) (model.Account, error) {
	return model.Account{ActID: act, Shard: s, Balance: t.accounts[acctKey{s, act}]}, nil
}

func (t *tiny) ApplyCredits(_ context.Context, credits []model.Credit) (int, []string, error) {
	var fresh []model.Credit
	seen := map[string]bool{}
	for _, c := range credits {
		if _, ok := t.flows[flowKey{c.Shard, c.ActID, "claim:" + c.ClaimID}]; !ok && !seen[c.ClaimID] {
			seen[c.ClaimID] = true
			fresh = append(fresh, c)
		}
	}
	err := t.commit(func() {
		for _, c := range fresh {
			t.addFlow(flowKey{c.Shard, c.ActID, "claim:" + c.ClaimID}, tinyFlow{kind: "credit", amount: c.Amount, ref: string(c.PacketID)})
			if prev, dup := t.credits[c.ClaimID]; dup {
				c.Amount += prev.Amount
			}
			t.credits[c.ClaimID] = c
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return len(fresh), nil, nil
}

func (t *tiny) Send(_ context.Context, s model.ShardID, req model.SendRequest, id model.PacketID, expiresMS int64) (model.Packet, bool, error) {
	k := flowKey{s, req.Sender, req.OrderNo}
	hash := fmt.Sprint(req.Kind, req.Amount, req.Count, req.Greeting)
	if f, ok := t.flows[k]; ok {
		if f.kind != "send" || f.hash != hash {
			return model.Packet{}, false, model.Errorf(model.ErrOrderConflict, "order %s", req.OrderNo)
		}
		return *t.packets[model.PacketID(f.ref)], true, nil
	}
	bal := t.accounts[acctKey{s, req.Sender}]
	if bal < req.Amount {
		return model.Packet{}, false, model.Errorf(model.ErrInsufficientBalance, "balance %d", bal)
	}
	p := model.Packet{ID: id, Sender: req.Sender, OrderNo: req.OrderNo, Kind: req.Kind, Greeting: req.Greeting, Amount: req.Amount,
		Count: req.Count, RemainingAmount: req.Amount, RemainingCount: req.Count, CreatedMS: t.nowMS(), ExpiresMS: expiresMS}
	err := t.commit(func() {
		t.addFlow(k, tinyFlow{kind: "send", amount: -req.Amount, balance: bal - req.Amount, ref: string(id), hash: hash})
		t.packets[id] = &p
		t.pktList = append(t.pktList, id)
	})
	return p, false, err
}

func (t *tiny) Packet(_ context.Context, ref model.PacketRef) (model.Packet, error) {
	p, ok := t.packets[ref.ID]
	if !ok {
		return model.Packet{}, model.Errorf(model.ErrNotFound, "packet %s", ref.ID)
	}
	return *p, nil
}

func (t *tiny) Claims(_ context.Context, ref model.PacketRef, after int64, limit int) ([]model.Claim, error) {
	var out []model.Claim
	for _, c := range t.claims[ref.ID] {
		if c.Seq > after && len(out) < limit {
			out = append(out, c)
		}
	}
	return out, nil
}

func (t *tiny) OpenBatch(_ context.Context, ref model.PacketRef, reqs []model.OpenRequest, r *rand.Rand) ([]model.OpenResult, model.Packet, error) {
	pp, ok := t.packets[ref.ID]
	results := make([]model.OpenResult, len(reqs))
	if !ok {
		for i := range results {
			results[i].Err = model.ErrNotFound
		}
		return results, model.Packet{}, nil
	}
	p := *pp
	earlier, _ := t.ClaimsOf(nil, ref, reqs)
	now := t.nowMS()
	expired := p.Status == model.StatusRefunded || now >= p.ExpiresMS
	var fresh []model.Claim
	var shards []model.ShardID
	first := map[string]int{}
	for i, rq := range reqs {
		if j, dup := first[rq.ActID]; dup {
			results[i] = results[j]
			if results[i].Err == nil {
				results[i].Repeat = true
			}
			continue
		}
		first[rq.ActID] = i
		switch c, ok := earlier[rq.ActID]; {
		case ok:
			results[i] = model.OpenResult{Claim: c, Repeat: true}
		case p.RemainingCount == 0 && p.Status != model.StatusRefunded:
			results[i].Err = model.ErrSoldOut
		case expired:
			results[i].Err = model.ErrExpired
		default:
			var share model.Cents
			if p.Kind == model.KindFixed {
				share = model.FixedShare(p.Amount, p.Count)
			} else {
				share = model.SplitNext(p.RemainingAmount, p.RemainingCount, r)
			}
			seq := p.Count - p.RemainingCount + 1
			p.RemainingAmount -= share
			p.RemainingCount--
			c := model.Claim{ID: model.ClaimID(ref.ID, seq), PacketID: ref.ID, Seq: seq, ActID: rq.ActID, Amount: share, CreatedMS: now}
			fresh = append(fresh, c)
			shards = append(shards, rq.Shard)
			results[i] = model.OpenResult{Claim: c}
		}
	}
	if len(fresh) == 0 {
		return results, p, nil
	}
	if p.RemainingCount == 0 {
		p.Status = model.StatusSoldOut
	}
	err := t.commit(func() {
		*pp = p
		t.claims[ref.ID] = append(t.claims[ref.ID], fresh...)
		for i, c := range fresh {
			t.outbox[c.ID] = &model.OutboxRow{ClaimID: c.ID, ActID: c.ActID, Shard: shards[i], Amount: c.Amount, CreatedMS: now}
			t.outList = append(t.outList, c.ID)
			t.pending[ref.Shard.DB()] = append(t.pending[ref.Shard.DB()], c.ID)
		}
	})
	if err != nil {
		return nil, model.Packet{}, err
	}
	return results, p, nil
}

func (t *tiny) ClaimsOf(_ context.Context, ref model.PacketRef, reqs []model.OpenRequest) (map[string]model.Claim, error) {
	out := map[string]model.Claim{}
	want := map[string]bool{}
	for _, r := range reqs {
		want[r.ActID] = true
	}
	for _, c := range t.claims[ref.ID] {
		if want[c.ActID] {
			out[c.ActID] = c
		}
	}
	return out, nil
}

func (t *tiny) ExpiredIn(_ context.Context, shards []model.ShardID, days []int, nowMS int64, limit int) ([]model.PacketID, error) {
	sh, dy := map[model.ShardID]bool{}, map[int]bool{}
	for _, s := range shards {
		sh[s] = true
	}
	for _, d := range days {
		dy[d] = true
	}
	var out []model.PacketID
	for _, id := range t.pktList {
		p := t.packets[id]
		ref, _ := model.ParsePacketID(string(id))
		if p.Status == model.StatusOpen && p.ExpiresMS <= nowMS && sh[ref.Shard] && dy[ref.Day] && len(out) < limit {
			out = append(out, id)
		}
	}
	return out, nil
}

func (t *tiny) Refund(_ context.Context, ref model.PacketRef) (model.Cents, error) {
	pp, ok := t.packets[ref.ID]
	if !ok {
		return 0, model.ErrNotFound
	}
	if pp.Status != model.StatusOpen || t.nowMS() < pp.ExpiresMS {
		return 0, nil
	}
	cents := pp.RemainingAmount
	err := t.commit(func() {
		t.addFlow(flowKey{ref.Shard, pp.Sender, "refund:" + string(ref.ID)}, tinyFlow{kind: "refund", amount: cents})
		pp.Status, pp.RefundAmount, pp.RemainingAmount = model.StatusRefunded, cents, 0
	})
	if err != nil {
		return 0, err
	}
	return cents, nil
}

func (t *tiny) PendingCredits(_ context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) ([]model.Credit, model.OutboxPos, error) {
	var rows []*model.OutboxRow
	kept := t.pending[db][:0]
	for _, id := range t.pending[db] {
		if !t.outbox[id].Delivered {
			kept = append(kept, id)
		}
	}
	t.pending[db] = kept
	for _, id := range kept {
		o := t.outbox[id]
		if o.CreatedMS <= beforeMS && (o.CreatedMS > afterMS || o.CreatedMS == afterMS && id > afterID) {
			rows = append(rows, o)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].CreatedMS != rows[j].CreatedMS {
			return rows[i].CreatedMS < rows[j].CreatedMS
		}
		return rows[i].ClaimID < rows[j].ClaimID
	})
	var out []model.Credit
	var next model.OutboxPos
	for _, o := range rows {
		if len(out) == limit {
			break
		}
		ref, _, _ := model.ParseClaimID(o.ClaimID)
		out = append(out, model.Credit{ClaimID: o.ClaimID, PacketID: ref.ID, ActID: o.ActID, Shard: o.Shard, Amount: o.Amount})
		next = model.OutboxPos{CreatedMS: o.CreatedMS, ClaimID: o.ClaimID}
	}
	return out, next, nil
}

func (t *tiny) MarkDelivered(_ context.Context, credits []model.Credit) (int, error) {
	return 0, t.commit(func() {
		for _, c := range credits {
			if o, ok := t.outbox[c.ClaimID]; ok {
				o.Delivered = true
			}
		}
	})
}

func (t *tiny) OutboxLag(_ context.Context, db int) (int64, int64, error) {
	var n int64
	for _, id := range t.pending[db] {
		if !t.outbox[id].Delivered {
			n++
		}
	}
	return n, 0, nil
}

func (t *tiny) ReconWindow(context.Context, int, []model.ShardID, []int, int64, int64, int) (model.ReconWindow, error) {
	panic("tiny: ReconWindow")
}

func (t *tiny) CreditsOf(_ context.Context, credits []model.Credit) (map[string]model.Credit, error) {
	out := map[string]model.Credit{}
	for _, c := range credits {
		if f, ok := t.flows[flowKey{c.Shard, c.ActID, "claim:" + c.ClaimID}]; ok {
			out[c.ClaimID] = model.Credit{ClaimID: c.ClaimID, PacketID: model.PacketID(f.ref), ActID: c.ActID, Shard: c.Shard, Amount: f.amount}
		}
	}
	return out, nil
}

func (t *tiny) Ledger(_ context.Context, cell string) (model.Ledger, error) {
	l := model.NewLedger(cell)
	for _, k := range t.flowList {
		f := t.flows[k]
		switch f.kind {
		case "deposit":
			l.Deposits += f.amount
		case "send":
			l.Sends -= f.amount
		case "refund":
			l.RefundFlows += f.amount
		case "credit":
			id := k.order[len("claim:"):]
			if prev, dup := l.Credits[id]; dup {
				l.Problems = append(l.Problems, fmt.Sprintf("claim %s credited twice (to %s and %s)", id, prev.ActID, k.act))
			}
			l.Credits[id] = model.Credit{ClaimID: id, ActID: k.act, Amount: f.amount}
		}
	}
	for _, b := range t.accounts {
		l.Balances += b
	}
	for _, id := range t.pktList {
		p := t.packets[id]
		l.Packets++
		l.PacketTotals += p.Amount
		l.OpenRemaining += p.RemainingAmount
		l.RefundAmounts += p.RefundAmount
		for _, c := range t.claims[id] {
			l.Claims[c.ID] = c
		}
	}
	for id, o := range t.outbox {
		l.Outbox[id] = *o
	}
	return l, nil
}

func (t *tiny) EnsureShard(context.Context, model.ShardID) error { return nil }
func (t *tiny) EnsureDays(context.Context, []model.ShardID, []int, int, func(int, int)) error {
	return nil
}
func (t *tiny) Ping(context.Context) error { return nil }
