package relay

import (
	"strings"
	"testing"
	"time"

	"redcell/model"
)

// The held count's invariants fire on states only a bug can make. (A file of
// its own: the relay's other tests are being reworked elsewhere.)

func wantHeldPanic(t *testing.T, name, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		msg, _ := recover().(string)
		if !strings.Contains(msg, want) {
			t.Errorf("%s: panic %q, want one holding %q", name, msg, want)
		}
	}()
	f()
}

// heldRelay is a relay holding one credit of database db, with held as the
// count, built by hand: no lane, no store.
func heldRelay(held int) (*Relay, model.Credit) {
	id := model.NewPacketID(model.ShardID(7), time.Unix(1_700_000_000, 0))
	c := model.Credit{ClaimID: model.ClaimID(id, 1), PacketID: id, ActID: "ann", Shard: 7, Amount: 5}
	ref, _ := model.ParsePacketID(string(id))
	r := &Relay{cfg: Config{Interval: time.Second}, dbs: map[int]*dbTrack{}, held: held, heldMax: 4}
	r.trackLocked(ref.Shard.DB()).pending[c.ClaimID] = &tracked{c: c}
	return r, c
}

func TestHeldInvariantsFire(t *testing.T) {
	wantHeldPanic(t, "forgotten twice", "credits held outside 0..HeldMax", func() {
		r, c := heldRelay(0) // the credit is pending but not counted
		r.acked([]model.Credit{c})
	})
	wantHeldPanic(t, "past HeldMax", "credits held outside 0..HeldMax", func() {
		r, _ := heldRelay(5)
		r.hold(nil, time.Time{}, false)
	})
	wantHeldPanic(t, "a database dropped twice", "credits held outside 0..HeldMax", func() {
		r, _ := heldRelay(0)
		r.cfg.DBs = func() []int { return nil }
		r.follow()
	})
	wantHeldPanic(t, "count off", "the held count differs from the credits pending", func() {
		r, _ := heldRelay(2)
		r.reoffer(time.Unix(1_700_000_100, 0))
	})
	r, c := heldRelay(1)
	r.acked([]model.Credit{c})
	if r.held != 0 {
		t.Fatalf("held %d after the one credit was acknowledged", r.held)
	}
}
