package memstore

import (
	"context"
	"reflect"
	"testing"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage/storagetest"
)

func harness() (storagetest.Harness, *Store) {
	clk := clock.NewManual(storagetest.Start)
	s := New(clk)
	return storagetest.Harness{Store: s, Clock: clk, FailNextCommit: s.FailNextCommit, CommitFaults: s.CommitFaults, HoldWallet: s.HoldWallet}, s
}

// TestWorkloadDeterministicAndConserved: the same seed gives the same answers
// and the same rows, bit for bit, and the books balance at the end of a run
// with faults, retries, expiries and committed groups; another seed gives
// other answers (the transcript sees them).
func TestWorkloadDeterministicAndConserved(t *testing.T) {
	const steps = 10_000
	run := func(seed uint64) (uint64, model.Ledger, *Store) {
		h, s := harness()
		w := storagetest.NewWorkload(h, seed, true, true)
		w.Groups = true
		for range steps {
			w.Step()
		}
		if w.GroupsCommitted() == 0 {
			t.Fatal("the workload committed no group")
		}
		l, err := s.Ledger(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		return w.Transcript(), l, s
	}
	ha, la, s := run(42)
	hb, lb, _ := run(42)
	if ha != hb || !reflect.DeepEqual(la, lb) {
		t.Fatalf("same seed, different runs: transcripts %x and %x, ledgers equal %v", ha, hb, reflect.DeepEqual(la, lb))
	}
	r := model.Audit([]model.Ledger{la})
	if !r.OK() || r.Deposits == 0 || r.ClaimsCount == 0 || r.CreditsCount == 0 || la.RefundFlows == 0 || s.CommitFaults() == 0 {
		t.Fatalf("after %d steps: audit %+v, refunds %d, faults %d", steps, r, la.RefundFlows, s.CommitFaults())
	}
	if hc, _, _ := run(43); hc == ha {
		t.Fatal("another seed gave the same transcript")
	}
	t.Logf("%d steps: %d packets, %d claims, %d credits, %d faults, %d cents in flight", steps, r.Packets, r.ClaimsCount, r.CreditsCount, s.CommitFaults(), r.InFlight)
}

// BenchmarkWorkload measures store calls per second of the workload mix on
// one goroutine (the simulation's use), without faults or the transcript.
func BenchmarkWorkload(b *testing.B) {
	h, _ := harness()
	w := storagetest.NewWorkload(h, 7, false, false)
	for b.Loop() {
		w.Step()
	}
	b.ReportMetric(float64(w.Calls())/b.Elapsed().Seconds(), "calls/s")
}
