package memstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/model"
)

// workload drives a store with a seeded random mix of the calls a cell makes
// (deposits, sends, batched opens, credit relay, expiry, retries of used
// order numbers, injected commit faults) and folds every answer into a hash.
type workload struct {
	s     *Store
	clk   *clock.Manual
	r     *rand.Rand
	ctx   context.Context
	sum   interface{ Write([]byte) (int, error) }
	users []string
	ids   []model.PacketRef // packets sent, newest last
	ops   int
}

var workShards = []model.ShardID{123, 125, 567, 568}

func newWorkload(seed uint64) *workload {
	clk := clock.NewManual(time.Date(2026, 3, 14, 23, 0, 0, 0, time.UTC)) // crosses midnight: two day tables
	w := &workload{s: New(clk), clk: clk, r: rand.New(rand.NewPCG(seed, 1)), ctx: context.Background(), sum: fnv.New64a()}
	for i := range 64 {
		w.users = append(w.users, fmt.Sprintf("u%02d", i))
	}
	return w
}

func (w *workload) shardOf(act string) model.ShardID {
	return workShards[int(act[2]-'0')%len(workShards)]
}

// record folds an answer into the transcript hash.
func (w *workload) record(v ...any) {
	if w.sum != nil {
		fmt.Fprintln(w.sum, v...)
	}
}

// packetID is model.NewPacketID with its random part drawn from w.r.
func (w *workload) packetID(s model.ShardID) model.PacketID {
	t := w.clk.Now().UTC()
	return model.PacketID(fmt.Sprintf("%04d%02d%02d%03d%016x", t.Year(), int(t.Month()), t.Day(), int(s), w.r.Uint64()))
}

func (w *workload) step() {
	w.ops++
	switch k := w.r.IntN(100); {
	case k < 15:
		u := w.users[w.r.IntN(len(w.users))]
		d, err := w.s.Deposit(w.ctx, w.shardOf(u), u, fmt.Sprintf("d%d", w.r.IntN(w.ops+1)), model.Cents(1+w.r.IntN(5)*100))
		w.record("deposit", d, err)
	case k < 30:
		u := w.users[w.r.IntN(len(w.users))]
		s := w.shardOf(u)
		amount := model.Cents(10 + w.r.IntN(500))
		req := model.SendRequest{Sender: u, Amount: amount, Count: int64(1 + w.r.IntN(8)), Kind: model.KindRandom, OrderNo: fmt.Sprintf("s%d", w.r.IntN(w.ops+1))}
		id := w.packetID(s)
		p, rep, err := w.s.Send(w.ctx, s, req, id, w.clk.Now().Add(time.Duration(1+w.r.IntN(3000))*time.Millisecond).UnixMilli())
		w.record("send", p, rep, err)
		if err == nil && !rep {
			ref, _ := model.ParsePacketID(string(p.ID))
			w.ids = append(w.ids, ref)
		}
	case k < 75 && len(w.ids) > 0:
		ref := w.ids[len(w.ids)-1-w.r.IntN(min(len(w.ids), 20))]
		reqs := make([]model.OpenRequest, 1+w.r.IntN(4))
		for i := range reqs {
			u := w.users[w.r.IntN(len(w.users))]
			reqs[i] = model.OpenRequest{ActID: u, Shard: w.shardOf(u)}
		}
		res, p, err := w.s.OpenBatch(w.ctx, ref, reqs, w.r)
		w.record("open", res, p, err)
	case k < 85:
		for _, db := range []int{12, 56} {
			cs, next, err := w.s.PendingCredits(w.ctx, db, w.clk.Now().UnixMilli(), 0, "", 50)
			n, deferred, aerr := w.s.ApplyCredits(w.ctx, cs)
			w.record("relay", cs, next, err, n, deferred, aerr)
			if aerr == nil {
				skipped, merr := w.s.MarkDelivered(w.ctx, cs)
				w.record("mark", skipped, merr)
			}
		}
	case k < 90:
		ids, err := w.s.ExpiredIn(w.ctx, workShards, []int{14, 15}, w.clk.Now().UnixMilli(), 20)
		w.record("expired", ids, err)
		for _, id := range ids {
			ref, _ := model.ParsePacketID(string(id))
			c, err := w.s.Refund(w.ctx, ref)
			w.record("refund", c, err)
		}
	case k < 92:
		w.s.FailNextCommit(w.r.IntN(2) == 0)
	default:
		w.clk.Advance(time.Duration(w.r.IntN(200)) * time.Millisecond)
	}
}

// TestWorkloadDeterministicAndConserved: the same seed gives the same answers
// and the same rows, bit for bit, and the books balance at the end of a run
// with faults, retries and expiries.
func TestWorkloadDeterministicAndConserved(t *testing.T) {
	const steps = 20_000
	a, b := newWorkload(42), newWorkload(42)
	for range steps {
		a.step()
		b.step()
	}
	ha, hb := a.sum.(interface{ Sum64() uint64 }).Sum64(), b.sum.(interface{ Sum64() uint64 }).Sum64()
	if ha != hb {
		t.Fatalf("same seed, different answers: %x vs %x", ha, hb)
	}
	la, err := a.s.Ledger(a.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := b.s.Ledger(b.ctx, "a")
	if !reflect.DeepEqual(la, lb) {
		t.Fatal("same seed, different ledgers")
	}
	r := model.Audit([]model.Ledger{la})
	if !r.OK() || r.Deposits == 0 || r.ClaimsCount == 0 || r.CreditsCount == 0 || la.RefundFlows == 0 || a.s.CommitFaults() == 0 {
		t.Fatalf("after %d steps: audit %+v, refunds %d, faults %d", steps, r, la.RefundFlows, a.s.CommitFaults())
	}
	if c := newWorkload(43); func() uint64 {
		for range steps {
			c.step()
		}
		return c.sum.(interface{ Sum64() uint64 }).Sum64()
	}() == ha {
		t.Fatal("another seed gave the same answers: the transcript hash sees nothing")
	}
	t.Logf("%d steps: %d packets, %d claims, %d credits, %d faults, in flight %d", steps, r.Packets, r.ClaimsCount, r.CreditsCount, a.s.CommitFaults(), r.InFlight)
}

// BenchmarkWorkload measures store calls per second of the workload mix,
// single goroutine (the simulation's use).
func BenchmarkWorkload(b *testing.B) {
	w := newWorkload(7)
	w.sum = nil // measure the store, not the transcript
	for b.Loop() {
		w.step()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
