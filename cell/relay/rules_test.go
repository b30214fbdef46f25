package relay

import (
	"fmt"
	"testing"
	"time"

	"redcell/model"
)

func TestDeferralBackoff(t *testing.T) {
	want := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
	for n, w := range want { // n = 0 is taken as 1
		if got := DeferralBackoff(n); got != w {
			t.Errorf("DeferralBackoff(%d) = %v, want %v", n, got, w)
		}
	}
	if got := DeferralBackoff(1 << 20); got != 5*time.Second {
		t.Fatalf("DeferralBackoff(huge) = %v, want 5s (no overflow)", got)
	}
}

func TestSplitDeferred(t *testing.T) {
	cs := []model.Credit{{ClaimID: "a"}, {ClaimID: "b"}, {ClaimID: "c"}, {ClaimID: "d"}}
	ids := func(cs []model.Credit) string {
		out := ""
		for _, c := range cs {
			out += c.ClaimID
		}
		return out
	}
	rest, deferred := SplitDeferred(cs, []string{"d", "zz", "b"})
	if ids(rest) != "ac" || ids(deferred) != "bd" {
		t.Fatalf("rest %s deferred %s, want ac bd", ids(rest), ids(deferred))
	}
	rest, deferred = SplitDeferred(cs, nil)
	if fmt.Sprint(rest) != fmt.Sprint(cs) || deferred != nil {
		t.Fatalf("no ids: rest %v deferred %v", rest, deferred)
	}
}

func TestNewCredits(t *testing.T) {
	claim := func(id, act string, cents model.Cents) model.Claim {
		return model.Claim{ID: id, PacketID: "p", ActID: act, Amount: cents}
	}
	results := []model.OpenResult{
		{Claim: claim("c1", "alice", 10)},
		{Claim: claim("c1", "alice", 10)}, // alice listed twice in the batch: one result, one credit
		{Err: model.ErrSoldOut},
		{Claim: claim("c0", "bob", 7), Repeat: true}, // claimed before: its credit was owed then
		{Claim: claim("c2", "u1", 5)},
	}
	got := NewCredits(results)
	want := []model.Credit{
		{ClaimID: "c1", PacketID: "p", ActID: "alice", Shard: 289, Amount: 10}, // golden shards of sharding's tests
		{ClaimID: "c2", PacketID: "p", ActID: "u1", Shard: 663, Amount: 5},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("NewCredits = %+v, want %+v", got, want)
	}
	if NewCredits(nil) != nil {
		t.Fatal("NewCredits(nil) is not empty")
	}
}
