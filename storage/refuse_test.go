package storage

import (
	"context"
	"fmt"
	"testing"

	"redcell/model"
)

// Refusals and releases are one statement per database and app, all in one
// round trip between BEGIN and COMMIT however many requests and databases;
// each moves only the rows in the states it may move.
func TestRefuseInOneRoundTrip(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	shards := []model.ShardID{31, 310, 311, 777} // databases 3, 31 (twice) and 77
	var reqs []model.CouponRequest
	for i, s := range shards {
		for _, app := range []string{"pay", "shop"} {
			r := model.CouponRequest{App: app, Serial: fmt.Sprintf("r%d", i), ActID: fmt.Sprintf("a%d", i), Shard: s, Batch: "b1"}
			got, repeat, err := AcceptCoupon(ctx, m, r)
			if err != nil || repeat {
				t.Fatalf("accept %+v: %+v %v %v", r, got, repeat, err)
			}
			reqs = append(reqs, got)
		}
	}
	// One of them is refused first: a later refusal leaves its reason.
	if err := RefuseCoupons(ctx, m, reqs[:1], model.ReasonRisk); err != nil {
		t.Fatal(err)
	}
	before := m.RoundTrips()
	if err := RefuseCoupons(ctx, m, append(reqs, reqs[3]), model.ReasonSoldOut); err != nil { // one listed twice
		t.Fatal(err)
	}
	if got := m.RoundTrips() - before; got != 3 {
		t.Errorf("refusing %d requests of 3 databases and 2 apps: %d round trips, want 3 (BEGIN, the list, COMMIT)", len(reqs)+1, got)
	}
	for i, r := range reqs {
		got, err := CouponRequestOf(ctx, m, r.Shard, r.App, r.Serial)
		want := model.ReasonSoldOut
		if i == 0 {
			want = model.ReasonRisk
		}
		if err != nil || got.State != model.CouponRefused || got.Reason != want || got.DecidedMS == 0 {
			t.Errorf("%s/%s: %+v %v, want refused %s", r.App, r.Serial, got, err, want)
		}
	}
	// A release moves deciding requests only: refused ones stay refused.
	before = m.RoundTrips()
	if err := ReleaseCouponRequests(ctx, m, reqs); err != nil {
		t.Fatal(err)
	}
	if got := m.RoundTrips() - before; got != 3 {
		t.Errorf("releasing: %d round trips, want 3", got)
	}
	if got, _ := CouponRequestOf(ctx, m, reqs[5].Shard, reqs[5].App, reqs[5].Serial); got.State != model.CouponRefused {
		t.Errorf("a refused request after a release: %+v", got)
	}
	if err := RefuseCoupons(ctx, m, nil, model.ReasonRisk); err != nil {
		t.Errorf("refusing nothing: %v", err)
	}

	// Deciding requests of two databases and two apps, released in one
	// call: accepted again, taken again; refused beside them, they are
	// refused with the reason given, once.
	var more []model.CouponRequest
	for i, s := range shards {
		for _, app := range []string{"pay", "shop"} {
			got, _, err := AcceptCoupon(ctx, m, model.CouponRequest{App: app, Serial: fmt.Sprintf("d%d", i), ActID: fmt.Sprintf("a%d", i), Shard: s, Batch: "b1"})
			if err != nil {
				t.Fatal(err)
			}
			more = append(more, got)
		}
	}
	dbs := []int{3, 31, 77}
	taken, err := TakeCouponRequests(ctx, m, dbs, -1, 100)
	if err != nil || len(taken) != len(more) {
		t.Fatalf("take: %d of %d, %v", len(taken), len(more), err)
	}
	if err := ReleaseCouponRequests(ctx, m, taken[:5]); err != nil {
		t.Fatal(err)
	}
	again, err := TakeCouponRequests(ctx, m, dbs, -1, 100)
	if err != nil || len(again) != 5 {
		t.Fatalf("after releasing 5: took %d again, %v", len(again), err)
	}
	if err := RefuseCoupons(ctx, m, append(again, taken[5:]...), model.ReasonRisk); err != nil {
		t.Fatal(err)
	}
	for _, r := range more {
		if got, err := CouponRequestOf(ctx, m, r.Shard, r.App, r.Serial); err != nil || got.State != model.CouponRefused || got.Reason != model.ReasonRisk {
			t.Errorf("%s/%s after the release and refusal: %+v %v", r.App, r.Serial, got, err)
		}
	}
}
