package model

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestDecideCoupon(t *testing.T) {
	a := CouponRule{Batch: "a", Limit: 2, Group: "g"}
	b := CouponRule{Batch: "b", Limit: 1, Group: "g"}
	c := CouponRule{Batch: "c", Limit: 1}
	var h CouponHolding
	for _, step := range []struct {
		rule CouponRule
		want CouponReason
	}{
		{a, ""}, {b, ReasonGroup}, {a, ""}, {a, ReasonLimit}, {c, ""}, {c, ReasonLimit}, {b, ReasonGroup},
	} {
		if got := DecideCoupon(step.rule, h); got != step.want {
			t.Fatalf("%s with %+v: %q, want %q", step.rule.Batch, h, got, step.want)
		}
		if step.want == "" {
			h.add(step.rule)
		}
	}
	if h.ByBatch["a"] != 2 || h.ByBatch["c"] != 1 || h.Groups["g"] != "a" || len(h.Groups) != 1 {
		t.Fatalf("holding: %+v", h)
	}
}

func TestGrantStock(t *testing.T) {
	for _, c := range []struct{ left, want, got int64 }{{10, 3, 3}, {3, 10, 3}, {0, 5, 0}, {5, 0, 0}, {-2, 4, 0}} {
		if g := GrantStock(c.left, c.want); g != c.got {
			t.Errorf("GrantStock(%d, %d) = %d, want %d", c.left, c.want, g, c.got)
		}
	}
}

func TestAssignCoupons(t *testing.T) {
	a := CouponRule{Batch: "a", Limit: 1, Group: "g"}
	asks := []CouponAsk{
		{"s1", "p1", a},
		{"s2", "p1", a}, // the same person twice in one merge: the limit holds
		{"s3", "p2", a}, // p2 holds batch b of the group already
		{"s4", "p3", a},
		{"s5", "p4", a}, // no unit left: s1 and s4 took the two
	}
	holdings := map[string]*CouponHolding{"p2": {ByBatch: map[string]int{"b": 1}, Groups: map[string]string{"g": "b"}}}
	out, unused := AssignCoupons(2, asks, holdings)
	want := []CouponDecision{{Serial: "s1", Issued: true}, {Serial: "s2", Reason: ReasonLimit}, {Serial: "s3", Reason: ReasonGroup},
		{Serial: "s4", Issued: true}, {Serial: "s5", Reason: ReasonSoldOut}}
	if !reflect.DeepEqual(out, want) || unused != 0 {
		t.Fatalf("got %+v unused %d\nwant %+v unused 0", out, unused, want)
	}
	if holdings["p1"].ByBatch["a"] != 1 || holdings["p3"].ByBatch["a"] != 1 || holdings["p4"] == nil || holdings["p4"].ByBatch["a"] != 0 {
		t.Fatalf("holdings: %+v %+v %+v", holdings["p1"], holdings["p3"], holdings["p4"])
	}
	// Everything granted, every ask fails its re-check: all of it unused.
	out, unused = AssignCoupons(2, asks[1:3], holdings)
	if unused != 2 || out[0].Reason != ReasonLimit || out[1].Reason != ReasonGroup {
		t.Fatalf("all refused: %+v unused %d", out, unused)
	}
}

func TestMergeAsks(t *testing.T) {
	r := func(b string) CouponRule { return CouponRule{Batch: b, Limit: 1} }
	asks := []CouponAsk{{"1", "p", r("x")}, {"2", "p", r("y")}, {"3", "q", r("x")}, {"4", "q", r("z")}, {"5", "r", r("y")}}
	got := MergeAsks(asks)
	var serials [][]string
	for _, g := range got {
		var s []string
		for _, a := range g {
			s = append(s, a.Serial)
		}
		serials = append(serials, s)
	}
	if want := [][]string{{"1", "3"}, {"2", "5"}, {"4"}}; !reflect.DeepEqual(serials, want) {
		t.Fatalf("groups %v, want %v", serials, want)
	}
}

func TestCouponHoldingProblems(t *testing.T) {
	a := CouponRule{Batch: "a", Limit: 1, Group: "g"}
	b := CouponRule{Batch: "b", Limit: 2, Group: "g"}
	ok := []HeldCoupon{{"p1", a}, {"p2", b}, {"p2", b}, {"p3", CouponRule{Batch: "c", Limit: 1}}}
	if ps := CouponHoldingProblems(ok); len(ps) != 0 {
		t.Fatalf("clean holdings: %v", ps)
	}
	bad := append(ok, HeldCoupon{"p1", a}, HeldCoupon{"p2", a})
	want := []string{"p1 holds 2 coupons of batch a, over its limit of 1", "p2 holds batches [a b] of group g"}
	if ps := CouponHoldingProblems(bad); !reflect.DeepEqual(ps, want) {
		t.Fatalf("problems %q, want %q", ps, want)
	}
}

// TestCouponDropProperty drives random drops through the pure decisions:
// persons ask again and again for batches that share groups and stock,
// merged in random slices, some deductions losing their answer (written
// off). Whatever the order, no batch issues more than its stock, no person
// passes a limit or holds two batches of a group, every ask is decided, and
// each batch's books close: issued + left + written off = stock.
func TestCouponDropProperty(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		rules := []CouponRule{
			{Batch: "a", Limit: 1 + rng.IntN(3), Group: "g"},
			{Batch: "b", Limit: 1, Group: "g"},
			{Batch: "c", Limit: 1 + rng.IntN(2)},
		}
		stock := map[string]int64{"a": int64(rng.IntN(30)), "b": int64(rng.IntN(10)), "c": int64(1 + rng.IntN(40))}
		left := map[string]int64{}
		for k, v := range stock {
			left[k] = v
		}
		writtenOff := map[string]int64{}
		holdings := map[string]*CouponHolding{}
		var held []HeldCoupon
		decided := map[string]bool{}
		persons := 1 + rng.IntN(25)
		asks := make([]CouponAsk, 50+rng.IntN(150))
		for i := range asks {
			asks[i] = CouponAsk{Serial: fmt.Sprintf("s%d", i), ActID: fmt.Sprintf("p%d", rng.IntN(persons)), Rule: rules[rng.IntN(len(rules))]}
		}
		for rest := asks; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(12)) // what one pass of layer 2 takes
			for _, group := range MergeAsks(rest[:n]) {
				batch := group[0].Rule.Batch
				g := GrantStock(left[batch], int64(len(group)))
				left[batch] -= g
				if rng.IntN(10) == 0 { // the deduction's answer is lost: conservative, written off
					writtenOff[batch] += g
					for _, a := range group {
						decided[a.Serial] = true
					}
					continue
				}
				out, unused := AssignCoupons(g, group, holdings)
				left[batch] += unused
				for i, d := range out {
					if d.Serial != group[i].Serial || d.Issued == (d.Reason != "") {
						t.Fatalf("seed %d: decision %+v for %+v", seed, d, group[i])
					}
					decided[d.Serial] = true
					if d.Issued {
						held = append(held, HeldCoupon{group[i].ActID, group[i].Rule})
					}
				}
			}
			rest = rest[n:]
		}
		if len(decided) != len(asks) {
			t.Fatalf("seed %d: %d of %d asks decided", seed, len(decided), len(asks))
		}
		if ps := CouponHoldingProblems(held); len(ps) > 0 {
			t.Fatalf("seed %d: %v", seed, ps)
		}
		issued := map[string]int64{}
		for _, h := range held {
			issued[h.Rule.Batch]++
		}
		for _, r := range rules {
			books := CouponBatchBooks{Batch: r.Batch, Stock: stock[r.Batch], Issued: issued[r.Batch], Left: left[r.Batch], WrittenOff: writtenOff[r.Batch]}
			if books.Difference() != 0 || books.Left < 0 || books.Issued > books.Stock {
				t.Fatalf("seed %d: books of %s %+v, difference %d", seed, r.Batch, books, books.Difference())
			}
		}
	}
}
