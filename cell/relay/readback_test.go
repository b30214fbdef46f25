package relay

import (
	"testing"
	"testing/synctest"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
)

// TestReadBackAskedDuringAPage: a read-back asked for (MarkDB) while a
// page of an earlier one is being read, its snapshot taken before the
// unknown commit landed, is not swallowed by that earlier ask: one more
// reading follows, and the late claim is delivered.
func TestReadBackAskedDuringAPage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, t0 := seededStore(10 * time.Second)
		existing := claimIn(10, 10, 0, t0.Add(-5*time.Second))
		store.addClaims(existing)
		gap := make(chan struct{})
		store.readGap = gap
		rig := newRig(t, rigOpts{store: store, prep: func(r *Relay) {
			r.MarkDB(1, t0.Add(-4*time.Second)) // an earlier unknown commit: again = F1
		}})
		testenv.Advance(250 * time.Millisecond) // the first tick's read of db 1 is blocked in the gap (snapshot taken)
		// Another unknown commit lands now (after the snapshot), then MarkDB.
		late := claimIn(10, 10, 1, time.Now().Add(-time.Second))
		store.addClaims(late)
		rig.r.MarkDB(1, time.Now().Add(-2*time.Second))
		store.mu.Lock()
		store.readGap = nil
		store.mu.Unlock()
		close(gap)
		testenv.Advance(5 * time.Second)
		store.mu.Lock()
		froms := store.froms[1]
		store.mu.Unlock()
		t.Logf("db 1 read from %v (late at %d)", froms, late.CreatedMS)
		if n := store.count(store.applied, late.ClaimID); n == 0 {
			t.Errorf("late claim never delivered (applied %d)", n)
		}
	})
}

// TestRedriveAtHeldMaxSaves: a claim reconciliation re-drives while the
// relay holds HeldMax credits is left to a read-back, and Redrive still
// saves the database's position below it before it returns.
func TestRedriveAtHeldMaxSaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, t0 := seededStore(10 * time.Second)
		h := hungC()
		rig := newRig(t, rigOpts{store: store, net: &fakeNet{answer: h.answer}, prep: func(r *Relay) { r.heldMax = 1 }})
		testenv.Advance(300 * time.Millisecond)
		// One credit for cell-c (hung) fills HeldMax; it is of database 2.
		rig.r.Enqueue([]model.Credit{claimIn(20, 800, 0, time.Now())})
		testenv.Advance(time.Second)
		old := claimIn(10, 10, 1, t0.Add(-20*time.Second)) // database 1, below its saved position
		rig.r.Redrive([]model.Credit{old})
		store.mu.Lock()
		p := store.positions[1]
		store.mu.Unlock()
		t.Logf("db 1 position %d, redriven claim at %d", p, old.CreatedMS)
		if p > old.CreatedMS {
			t.Errorf("Redrive returned with database 1's saved position (%d) past the claim it was handed (%d)", p, old.CreatedMS)
		}
		h.releaseC()
	})
}
