package storagetest

import (
	"context"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"

	"redcell/model"
	"redcell/storage"
)

// Workload drives a store with a seeded random mix of the calls a cell makes:
// deposits, sends, batched opens of recent packets, the credit relay
// (ClaimsAfter → ApplyCredits → SaveRelayPositions, and now and then a
// restart from RelayPositions that delivers claims again), expiry and refunds, order
// numbers used again (repeats and conflicts), clock steps across midnight and,
// when asked, injected commit faults. It folds every answer into a
// transcript hash (codes, not message texts, for errors), so two stores given
// the same seed can be compared answer for answer, and one store run twice
// proves itself deterministic. With Groups set, some steps commit a group of
// those calls through storage.Grouper instead.
type Workload struct {
	// Groups makes one step in twenty commit a group of 2 to 8 mixed ops
	// (deposits, sends, opens, and last a credit batch of the relay's)
	// through CommitGroup; h's store must implement storage.Grouper. Off,
	// the workload draws exactly as it did before groups existed.
	Groups bool

	h      Harness
	r      *rand.Rand
	ctx    context.Context
	faults bool
	sum    hash.Hash64 // nil: answers are not recorded
	users  []string
	refs   []model.PacketRef // packets sent, newest last
	ops    int
	calls  int
	groups int // groups committed
	// The relay's state per database (12, 56): it reads the claims created
	// from relayFrom (its saved position when it last restarted) after
	// relayAt (the last claim it delivered since).
	relayFrom map[int]int64
	relayAt   map[int]model.ClaimPos
}

// WorkShards are the shards the workload's users live in: two in database
// 12, two in database 56.
var WorkShards = []model.ShardID{123, 125, 567, 568}

// NewWorkload returns a workload over h (fresh, its clock at Start) drawing
// from seed; it moves the clock to 23:00 so the run crosses midnight (day
// tables 14 and 15). With faults it arms h.FailNextCommit now and then. With
// record it keeps the transcript hash.
func NewWorkload(h Harness, seed uint64, faults, record bool) *Workload {
	w := &Workload{h: h, r: rand.New(rand.NewPCG(seed, 1)), ctx: context.Background(), faults: faults,
		relayFrom: map[int]int64{}, relayAt: map[int]model.ClaimPos{}}
	if record {
		w.sum = fnv.New64a()
	}
	for i := range 64 {
		w.users = append(w.users, fmt.Sprintf("u%02d", i))
	}
	h.Clock.Set(Start.Add(13 * time.Hour))
	return w
}

// Transcript is the hash of every answer so far (0 when not recording).
func (w *Workload) Transcript() uint64 {
	if w.sum == nil {
		return 0
	}
	return w.sum.Sum64()
}

// Ops is how many steps ran.
func (w *Workload) Ops() int { return w.ops }

// GroupsCommitted is how many groups CommitGroup committed.
func (w *Workload) GroupsCommitted() int { return w.groups }

// Calls is how many store calls the steps made.
func (w *Workload) Calls() int { return w.calls }

func (w *Workload) shardOf(act string) model.ShardID {
	return WorkShards[int(act[2]-'0')%len(WorkShards)]
}

func (w *Workload) record(v ...any) {
	if w.sum != nil {
		fmt.Fprintln(w.sum, v...)
	}
}

// code is the stable code of err ("" for nil): message texts differ between
// stores, codes must not.
func code(err error) string {
	if err == nil {
		return ""
	}
	c, _ := model.CodeOf(err)
	return c
}

// packetID is model.NewPacketID with its random part drawn from w.r.
func (w *Workload) packetID(s model.ShardID) model.PacketID {
	t := w.h.Clock.Now().UTC()
	return model.PacketID(fmt.Sprintf("%04d%02d%02d%03d%016x", t.Year(), int(t.Month()), t.Day(), int(s), w.r.Uint64()))
}

// call counts one store call and returns the store to make it on.
func (w *Workload) call(s storage.Store) storage.Store {
	w.calls++
	return s
}

func (w *Workload) user() string { return w.users[w.r.IntN(len(w.users))] }

// Step makes one random call (the relay step: one round per database).
func (w *Workload) Step() {
	w.ops++
	s := w.h.Store
	now := w.h.Clock.Now()
	switch k := w.r.IntN(100); {
	case k < 15:
		u := w.user()
		d, err := storage.Deposit(w.ctx, w.call(s), w.shardOf(u), u, fmt.Sprintf("d%d", w.r.IntN(w.ops+1)), model.Cents(1+w.r.IntN(5)*100))
		w.record("deposit", d, code(err))
	case k < 30:
		u := w.user()
		sh := w.shardOf(u)
		req := model.SendRequest{Sender: u, Amount: model.Cents(10 + w.r.IntN(500)), Count: int64(1 + w.r.IntN(8)), Kind: model.KindRandom,
			OrderNo: fmt.Sprintf("s%d", w.r.IntN(w.ops+1))}
		if w.r.IntN(4) == 0 {
			req.Kind, req.Amount = model.KindFixed, model.Cents(req.Count*int64(1+w.r.IntN(50)))
		}
		p, rep, err := storage.Send(w.ctx, w.call(s), sh, req, w.packetID(sh), now.Add(time.Duration(1+w.r.IntN(3000))*time.Millisecond).UnixMilli())
		w.record("send", p, rep, code(err))
		if err == nil && !rep {
			ref, _ := model.ParsePacketID(string(p.ID))
			w.refs = append(w.refs, ref)
		}
	case k < 75 && len(w.refs) > 0:
		ref := w.refs[len(w.refs)-1-w.r.IntN(min(len(w.refs), 20))]
		reqs := make([]model.OpenRequest, 1+w.r.IntN(4))
		for i := range reqs {
			u := w.user()
			reqs[i] = model.OpenRequest{ActID: u, Shard: w.shardOf(u)}
		}
		res, p, err := storage.OpenBatch(w.ctx, w.call(s), ref, reqs, w.r)
		w.record("open", p, code(err))
		for _, r := range res {
			w.record(" ", r.Claim, r.Repeat, code(r.Err))
		}
	case k < 85:
		if w.r.IntN(8) == 0 {
			w.restartRelay()
		}
		for _, db := range []int{12, 56} {
			cs, next, err := w.claimsAfter(db, 50)
			n, deferred, aerr := storage.ApplyCredits(w.ctx, w.call(s), cs)
			w.record("relay", n, deferred, code(aerr))
			if err == nil && aerr == nil && len(deferred) == 0 {
				w.delivered(db, next, len(cs))
			}
		}
	case k < 90:
		ids, err := storage.ExpiredIn(w.ctx, w.call(s), WorkShards, []int{14, 15}, now.UnixMilli(), 1000)
		slices.Sort(ids) // the order is not promised
		w.record("expired", ids, code(err))
		for _, id := range ids {
			ref, _ := model.ParsePacketID(string(id))
			c, err := storage.Refund(w.ctx, w.call(s), ref)
			w.record("refund", c, code(err))
		}
	case k < 92 && w.faults:
		w.h.FailNextCommit(w.r.IntN(2) == 0)
	case k >= 92 && k < 97 && w.Groups:
		w.group()
	default:
		w.h.Clock.Advance(time.Duration(w.r.IntN(200)) * time.Millisecond)
	}
}

// group commits one group of mixed ops and records every answer.
func (w *Workload) group() {
	g, ok := w.h.Store.(storage.Grouper)
	if !ok {
		panic(fmt.Sprintf("storagetest: Workload.Groups over a store without CommitGroup (%T)", w.h.Store))
	}
	now := w.h.Clock.Now()
	var ops []storage.MoneyOp
	for n := 2 + w.r.IntN(7); len(ops) < n; {
		u := w.user()
		sh := w.shardOf(u)
		switch k := w.r.IntN(10); {
		case k < 3:
			ops = append(ops, &storage.DepositOp{Shard: sh, ActID: u,
				OrderNo: fmt.Sprintf("d%d", w.r.IntN(w.ops+1)), Amount: model.Cents(1 + w.r.IntN(5)*100)})
		case k < 5:
			req := model.SendRequest{Sender: u, Amount: model.Cents(10 + w.r.IntN(500)), Count: int64(1 + w.r.IntN(8)), Kind: model.KindRandom,
				OrderNo: fmt.Sprintf("s%d", w.r.IntN(w.ops+1))}
			ops = append(ops, &storage.SendOp{Shard: sh, Req: req, PacketID: w.packetID(sh),
				ExpiresMS: now.Add(time.Duration(1+w.r.IntN(3000)) * time.Millisecond).UnixMilli()})
		case len(w.refs) > 0:
			ref := w.refs[len(w.refs)-1-w.r.IntN(min(len(w.refs), 20))]
			reqs := make([]model.OpenRequest, 1+w.r.IntN(4))
			for i := range reqs {
				v := w.user()
				reqs[i] = model.OpenRequest{ActID: v, Shard: w.shardOf(v)}
			}
			ops = append(ops, &storage.OpenOp{Ref: ref, Reqs: reqs,
				Rand: rand.New(rand.NewPCG(w.r.Uint64(), w.r.Uint64()))})
		}
	}
	db := []int{12, 56}[w.r.IntN(2)]
	cs, next, err := w.claimsAfter(db, 20)
	if err == nil && len(cs) > 0 {
		ops = append(ops, &storage.CreditsOp{Credits: cs})
	}
	w.calls++
	err = g.CommitGroup(w.ctx, storage.Ops(ops))
	w.record("group", len(ops), code(err))
	if err != nil {
		return
	}
	w.groups++
	for _, o := range ops {
		op := answeredOf(o)
		w.record(" ", op.Kind, op.Packet, op.Repeat, op.Deposit, op.Applied, op.Deferred, code(op.Err))
		for _, r := range op.Results {
			w.record("  ", r.Claim, r.Repeat, code(r.Err))
		}
		switch {
		case op.Kind == storage.OpSend && op.Err == nil && !op.Repeat:
			ref, _ := model.ParsePacketID(string(op.Packet.ID))
			w.refs = append(w.refs, ref)
		case op.Kind == storage.OpCredits && len(op.Deferred) == 0:
			w.delivered(db, next, len(cs))
		}
	}
}

// claimsAfter is the relay's next read of database db: up to limit claims
// past its position, created before the current millisecond (every claim
// of an earlier millisecond is committed, so none can land behind the
// position later).
func (w *Workload) claimsAfter(db, limit int) ([]model.Credit, model.ClaimPos, error) {
	cs, next, err := storage.ClaimsAfter(w.ctx, w.call(w.h.Store), db, w.relayFrom[db], w.relayAt[db], w.h.Clock.Now().UnixMilli()-1, limit)
	w.record("claims after", db, cs, next, code(err))
	return cs, next, err
}

// delivered moves the relay of db past the n claims up to next, all
// credited, and saves its position: every claim created before next's
// millisecond is credited.
func (w *Workload) delivered(db int, next model.ClaimPos, n int) {
	if n == 0 {
		return
	}
	w.relayAt[db] = next
	err := storage.SaveRelayPositions(w.ctx, w.call(w.h.Store), map[int]int64{db: next.CreatedMS})
	w.record("save relay position", db, next.CreatedMS, code(err))
}

// restartRelay is the relay starting over: it forgets where it was and
// reads again from the positions it saved, delivering again the claims of
// those milliseconds (credited once all the same).
func (w *Workload) restartRelay() {
	pos, err := storage.RelayPositions(w.ctx, w.call(w.h.Store), []int{12, 56})
	w.record("relay positions", pos[12], pos[56], len(pos), code(err))
	if err != nil {
		return
	}
	for _, db := range []int{12, 56} {
		w.relayFrom[db], w.relayAt[db] = pos[db], model.ClaimPos{}
	}
}
