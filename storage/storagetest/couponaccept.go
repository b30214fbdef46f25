package storagetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

// A group stores coupon requests (storage.AcceptOp) as AcceptCoupon does: a new
// serial is stored accepted; the same serial again — stored before, or by an
// earlier op of the same group — answers the stored request as a repeat, or
// ORDER_CONFLICT for another person, writing nothing; a bad request answers
// INVALID_ARGUMENT without failing the others; a group whose COMMIT answer
// is lost is settled, and its retry is a repeat. Accepts share a group with
// other kinds of op.
func contractGroupAccept(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	pre := f.accept(couponReq(sB, "pat", "p1", "demo-batch"))
	f.h.Clock.Advance(time.Second)
	green := couponReq(sC, "cy", "g2", "demo-batch")
	green.Green, green.DeviceID = true, "dev-9"
	reqs := []model.CouponRequest{
		couponReq(sA, "ann", "g1", "demo-batch"),
		couponReq(sA, "ann", "g1", "demo-batch"),
		couponReq(sA, "bob", "g1", "demo-batch"),
		green,
		couponReq(sB, "pat", "p1", "demo-batch"),
		couponReq(sA, "dan", "bad serial", "demo-batch"),
	}
	dep := &storage.DepositOp{Shard: sA, ActID: "eve", OrderNo: "dep-1", Amount: 100}
	var ops []*storage.AcceptOp
	for _, r := range reqs {
		ops = append(ops, &storage.AcceptOp{Coupon: r})
	}
	if err := f.s.CommitGroup(f.ctx, append([]storage.Op{dep}, storage.Ops(ops)...)); err != nil {
		t.Fatal(err)
	}
	if dep.Err != nil || dep.Deposit.Balance != 100 {
		t.Fatalf("the deposit beside the accepts: %+v %v", dep.Deposit, dep.Err)
	}
	now := f.nowMS()
	want := []struct {
		act      string
		accepted int64
		repeat   bool
		err      error
	}{{"ann", now, false, nil}, {"ann", now, true, nil}, {"", 0, false, model.ErrOrderConflict}, {"cy", now, false, nil},
		{"pat", pre.AcceptedMS, true, nil}, {"", 0, false, model.ErrInvalidArgument}}
	for i, w := range want {
		op := ops[i]
		if w.err != nil {
			if !errors.Is(op.Err, w.err) {
				t.Fatalf("accept %d: %v, want %v", i, op.Err, w.err)
			}
			continue
		}
		if op.Err != nil || op.Accepted.ActID != w.act || op.Accepted.AcceptedMS != w.accepted || op.Repeat != w.repeat || op.Accepted.State != model.CouponAccepted {
			t.Fatalf("accept %d: %+v repeat %v err %v; want %s at %d repeat %v", i, op.Accepted, op.Repeat, op.Err, w.act, w.accepted, w.repeat)
		}
	}
	if r, err := storage.CouponRequestOf(f.ctx, c, sC, "pay", "g2"); err != nil || r.ActID != "cy" || !r.Green || r.DeviceID != "dev-9" || r.State != model.CouponAccepted {
		t.Fatalf("the green request as stored: %+v %v", r, err)
	}
	if _, err := storage.CouponRequestOf(f.ctx, c, sA, "pay", "bad serial"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("the bad request was stored: %v", err)
	}
	got := takenNames(t, f, c, uniqueDBs(sA, sB, sC), -1, 10)
	if !slices.Equal(got, []string{"ann/g1", "cy/g2", "pat/p1"}) {
		t.Fatalf("taken after the group: %v, want ann/g1, cy/g2, pat/p1", got)
	}
	// A group of new serials only, in three databases, stores each.
	checkGroupAcceptNew(t, f, c, now)
	// A lost answer: the group is settled (or answers ErrCommitUnknown), and
	// its retry finds the request.
	checkGroupAcceptLost(t, f)
}

// checkGroupAcceptNew checks that a group of new serials only, in three
// databases, stores each, accepted at now.
func checkGroupAcceptNew(t *testing.T, f *fixture, c couponStore, now int64) {
	var fresh []*storage.AcceptOp
	for i, s := range []model.ShardID{sA, sC, sB, sC} {
		fresh = append(fresh, &storage.AcceptOp{Coupon: couponReq(s, fmt.Sprintf("new%d", i), fmt.Sprintf("n%d", i), "demo-batch")})
	}
	if err := f.s.CommitGroup(f.ctx, storage.Ops(fresh)); err != nil {
		t.Fatal(err)
	}
	for i, op := range fresh {
		r, err := storage.CouponRequestOf(f.ctx, c, op.Coupon.Shard, "pay", op.Coupon.Serial)
		if op.Err != nil || op.Repeat || op.Accepted.AcceptedMS != now || err != nil || r.ActID != fmt.Sprintf("new%d", i) || r.State != model.CouponAccepted {
			t.Fatalf("new accept %d: %+v repeat %v %v; stored %+v %v", i, op.Accepted, op.Repeat, op.Err, r, err)
		}
	}
}

// checkGroupAcceptLost checks an accept whose group's COMMIT answer is
// lost: the group is settled (or answers ErrCommitUnknown), and its retry
// finds the request.
func checkGroupAcceptLost(t *testing.T, f *fixture) {
	f.h.Clock.Advance(time.Second)
	lost := couponReq(sA, "fay", "l1", "demo-batch")
	fired := f.arm(true)
	op := &storage.AcceptOp{Coupon: lost}
	err := f.s.CommitGroup(f.ctx, []storage.Op{op})
	fired()
	if lostAnswer(t, "group accept", err) && (op.Accepted.ActID != "fay" || op.Repeat) {
		t.Fatalf("settled accept: %+v repeat %v", op.Accepted, op.Repeat)
	}
	f.h.Clock.Advance(time.Second)
	retry := &storage.AcceptOp{Coupon: lost}
	if err := f.s.CommitGroup(f.ctx, []storage.Op{retry}); err != nil || !retry.Repeat || retry.Accepted.AcceptedMS != f.nowMS()-1000 {
		t.Fatalf("retry after a lost answer: %+v repeat %v %v", retry.Accepted, retry.Repeat, err)
	}
}

// A request refused at its accept (model.RefusedAtAccept: the local copy
// of the batch's stock showed nothing left) is stored refused SOLD_OUT,
// decided when accepted, alone or in a group (in one round trip, and when a
// stored serial sends the group one statement at a time); a repeat answers
// it as stored, whatever the repeat asks; no take finds it; and a request
// stored accepted before stays accepted when a repeat comes refused.
func contractCouponRefusedAtAccept(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	got, repeat, err := storage.AcceptCoupon(f.ctx, c, model.RefusedAtAccept(couponReq(sA, "ann", "r1", "gone")))
	if err != nil || repeat {
		t.Fatal(repeat, err)
	}
	now := f.nowMS()
	wantRefused := func(what string, r model.CouponRequest, accepted int64) {
		t.Helper()
		if r.State != model.CouponRefused || r.Reason != model.ReasonSoldOut || r.AcceptedMS != accepted || r.DecidedMS != accepted || r.CouponID != "" || r.TakenMS != 0 {
			t.Fatalf("%s: %+v; want refused SOLD_OUT, accepted and decided at %d", what, r, accepted)
		}
	}
	wantRefused("answered", got, now)
	stored, err := storage.CouponRequestOf(f.ctx, c, sA, "pay", "r1")
	if err != nil {
		t.Fatal(err)
	}
	wantRefused("stored", stored, now)
	f.h.Clock.Advance(time.Second)
	again, repeat, err := storage.AcceptCoupon(f.ctx, c, couponReq(sA, "ann", "r1", "gone"))
	if err != nil || !repeat {
		t.Fatalf("repeat: %v %v", repeat, err)
	}
	wantRefused("a repeat asking to be accepted", again, now)
	// Accepted first, then a repeat refused at its accept: the stored one.
	f.accept(couponReq(sA, "bob", "r2", "gone"))
	again, repeat, err = storage.AcceptCoupon(f.ctx, c, model.RefusedAtAccept(couponReq(sA, "bob", "r2", "gone")))
	if err != nil || !repeat || again.State != model.CouponAccepted || again.Reason != "" || again.DecidedMS != 0 {
		t.Fatalf("a refused repeat of an accepted request: %+v repeat %v %v", again, repeat, err)
	}
	// In groups: new serials only (one round trip), then with a stored one.
	f.h.Clock.Advance(time.Second)
	groupNow := f.nowMS()
	for i, serials := range [][]string{{"g1", "g2"}, {"g3", "r1"}} {
		var ops []*storage.AcceptOp
		for _, sr := range serials {
			ops = append(ops, &storage.AcceptOp{Coupon: model.RefusedAtAccept(couponReq(sA, "ann", sr, "gone"))})
		}
		ops = append(ops, &storage.AcceptOp{Coupon: couponReq(sC, "cy", fmt.Sprintf("a%d", i), "gone")})
		if err := f.s.CommitGroup(f.ctx, storage.Ops(ops)); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops[:2] {
			if op.Err != nil {
				t.Fatalf("group %d, %s: %v", i, op.Coupon.Serial, op.Err)
			}
			if op.Coupon.Serial == "r1" {
				if !op.Repeat {
					t.Fatalf("group %d: r1 not a repeat", i)
				}
				wantRefused("r1 in a group", op.Accepted, now)
				continue
			}
			if op.Repeat {
				t.Fatalf("group %d, %s: a repeat", i, op.Coupon.Serial)
			}
			wantRefused("in a group", op.Accepted, groupNow)
			st, err := storage.CouponRequestOf(f.ctx, c, sA, "pay", op.Coupon.Serial)
			if err != nil {
				t.Fatal(err)
			}
			wantRefused("stored by a group", st, groupNow)
		}
		if a := ops[2]; a.Err != nil || a.Repeat || a.Accepted.State != model.CouponAccepted || a.Accepted.Reason != "" {
			t.Fatalf("group %d: the accepted request beside them: %+v %v", i, a.Accepted, a.Err)
		}
	}
	names := takenNames(t, f, c, uniqueDBs(sA, sC), 0, 20)
	if !slices.Equal(names, []string{"bob/r2", "cy/a0", "cy/a1"}) {
		t.Fatalf("taken %v; want only the accepted requests", names)
	}
}

// takenNames takes the coupon requests of databases dbs
// (TakeCouponRequests with staleMS and limit) and returns them as
// "act/serial", sorted; an error fails t.
func takenNames(t *testing.T, f *fixture, c couponStore, dbs []int, staleMS int64, limit int) []string {
	t.Helper()
	taken, err := storage.TakeCouponRequests(f.ctx, c, dbs, staleMS, limit)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range taken {
		names = append(names, r.ActID+"/"+r.Serial)
	}
	slices.Sort(names)
	return names
}
