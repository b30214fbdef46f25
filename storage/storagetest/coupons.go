package storagetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"redcell/model"
	"redcell/storage"
)

func init() {
	register("ContractCouponAccept", contractCouponAccept)
	register("ContractCouponTake", contractCouponTake)
	register("ContractCouponIssue", contractCouponIssue)
	register("ContractCouponIssueCommitFault", contractCouponIssueCommitFault)
	register("ContractCouponIssueConcurrent", contractCouponIssueConcurrent)
	register("ContractCouponIssueTwiceInOne", contractCouponIssueTwiceInOne)
	register("ContractGroupAccept", contractGroupAccept)
	register("ContractCouponRefusedAtAccept", contractCouponRefusedAtAccept)
}

// A request given twice to one issue is decided once: one coupon, the
// request issued, the second copy taking no unit.
func contractCouponIssueTwiceInOne(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	a := model.CouponRule{Batch: "a", Limit: 1}
	r := f.accept(couponReq(sA, "ann", "x1", "a"))
	o := f.accept(couponReq(sB, "bea", "x2", "a"))
	ds, unused, err := storage.IssueCoupons(f.ctx, c, a, "lease-d", 3, []model.CouponRequest{r, o, r})
	if err != nil {
		t.Fatal(err)
	}
	want := []model.CouponDecision{{Serial: "x1", Issued: true, App: "pay"}, {Serial: "x2", Issued: true, App: "pay"}}
	if !reflect.DeepEqual(ds, want) || unused != 1 {
		t.Fatalf("decisions %+v unused %d; want %+v, 1 unused", ds, unused, want)
	}
	if got, _ := storage.CouponRequestOf(f.ctx, c, sA, "pay", "x1"); got.State != model.CouponIssued || got.CouponID != model.CouponID("pay", "x1", "ann") {
		t.Fatalf("x1 as stored: %+v", got)
	}
	if n, _ := storage.CouponLeaseSpent(f.ctx, c, uniqueDBs(sA, sB), "lease-d"); n != 2 {
		t.Fatalf("lease-d spent %d, want 2", n)
	}
	// One serial of one app for persons of two databases: two requests (a
	// serial is seen again only within a database), two coupons, two IDs.
	if sA.DB() == sC.DB() {
		t.Fatal("the fixture's shards sA and sC must be in two databases")
	}
	p := f.accept(couponReq(sA, "pia", "same", "a"))
	q := f.accept(couponReq(sC, "quy", "same", "a"))
	ds, unused, err = storage.IssueCoupons(f.ctx, c, a, "lease-e", 2, []model.CouponRequest{p, q})
	if err != nil || len(ds) != 2 || !ds[0].Issued || !ds[1].Issued || unused != 0 {
		t.Fatalf("one serial in two databases: %+v unused %d %v", ds, unused, err)
	}
	cp, _ := storage.CouponsOf(f.ctx, c, sA, "pia", model.FlowCursor{}, 10)
	cq, _ := storage.CouponsOf(f.ctx, c, sC, "quy", model.FlowCursor{}, 10)
	if len(cp) != 1 || len(cq) != 1 || cp[0].ID == cq[0].ID || cp[0].ID != model.CouponID("pay", "same", "pia") {
		t.Fatalf("coupons of pia %+v and quy %+v: want one each, with their own IDs", cp, cq)
	}
}

// couponStore runs the coupon ops and queries (storage.CouponTake ...)
// and the accept (storage.AcceptCoupon, through CommitGroup).
type couponStore interface {
	storage.Grouper
	storage.Reader
}

// coupons is the store as a couponStore.
func (f *fixture) coupons() couponStore {
	f.t.Helper()
	c, ok := f.s.(couponStore)
	if !ok {
		f.t.Fatalf("%T does not implement couponStore", f.s)
	}
	return c
}

// couponReq is a request of act (shard s) for batch under app "pay".
func couponReq(s model.ShardID, act, serial, batch string) model.CouponRequest {
	return model.CouponRequest{App: "pay", Serial: serial, ActID: act, Shard: s, Batch: batch}
}

func (f *fixture) accept(r model.CouponRequest) model.CouponRequest {
	f.t.Helper()
	got, repeat, err := storage.AcceptCoupon(f.ctx, f.coupons(), r)
	if err != nil || repeat {
		f.t.Fatalf("accept %s: %+v repeat %v %v", r.Serial, got, repeat, err)
	}
	return got
}

// A request is stored once per app and serial: the same again answers the
// stored one (repeat), another person or batch under the serial is
// ORDER_CONFLICT, another app may use the serial; bad fields are refused.
func contractCouponAccept(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	r := couponReq(sA, "ann", "s1", "demo-batch")
	r.Green, r.DeviceID, r.ClientIP = true, "dev-1", "10.0.0.7"
	got := f.accept(r)
	if got.State != model.CouponAccepted || got.AcceptedMS != f.nowMS() || !got.Green || got.ClientIP != "10.0.0.7" {
		t.Fatalf("accepted: %+v", got)
	}
	f.h.Clock.Advance(time.Second)
	again, repeat, err := storage.AcceptCoupon(f.ctx, c, couponReq(sA, "ann", "s1", "demo-batch"))
	if err != nil || !repeat || again.AcceptedMS != got.AcceptedMS || !again.Green {
		t.Fatalf("the same serial again: %+v repeat %v %v; want the first, repeat", again, repeat, err)
	}
	for _, other := range []model.CouponRequest{couponReq(sA, "bob", "s1", "demo-batch"), couponReq(sA, "ann", "s1", "batch-2")} {
		if _, _, err := storage.AcceptCoupon(f.ctx, c, other); !errors.Is(err, model.ErrOrderConflict) {
			t.Fatalf("serial s1 for %s/%s: %v, want ORDER_CONFLICT", other.ActID, other.Batch, err)
		}
	}
	otherApp := couponReq(sA, "bob", "s1", "demo-batch")
	otherApp.App = "chat"
	f.accept(otherApp)
	if r, err := storage.CouponRequestOf(f.ctx, c, sB, "chat", "s1"); err != nil || r.ActID != "bob" {
		t.Fatalf("read back by app and serial (sB shares sA's database): %+v %v", r, err)
	}
	if _, err := storage.CouponRequestOf(f.ctx, c, sC, "chat", "s1"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("another database: %v, want NOT_FOUND", err)
	}
	bad := couponReq(sA, "cy", "s 2", "demo-batch")
	badIP := couponReq(sA, "cy", "s2", "demo-batch")
	badIP.ClientIP = "10.0.0.07"
	for _, b := range []model.CouponRequest{bad, badIP} {
		if _, _, err := storage.AcceptCoupon(f.ctx, c, b); !errors.Is(err, model.ErrInvalidArgument) {
			t.Fatalf("%+v: %v, want INVALID_ARGUMENT", b, err)
		}
	}
}

// Takers move accepted requests to deciding, oldest first, and take a
// deciding one again only once it is stale; final ones never.
func contractCouponTake(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	for i := range 5 {
		f.accept(couponReq(sA, fmt.Sprintf("p%d", i), fmt.Sprintf("t%d", i), "demo-batch"))
		f.h.Clock.Advance(time.Millisecond)
	}
	f.accept(couponReq(sC, "q", "other-db", "demo-batch"))
	db := sA.DB()
	first, err := storage.TakeCouponRequests(f.ctx, c, []int{db}, 0, 3)
	if err != nil || len(first) != 3 || first[0].Serial != "t0" || first[2].Serial != "t2" || first[0].State != model.CouponDeciding || first[0].TakenMS != f.nowMS() {
		t.Fatalf("first take: %+v %v", first, err)
	}
	takenAt := f.nowMS()
	f.h.Clock.Advance(time.Second)
	rest, err := storage.TakeCouponRequests(f.ctx, c, []int{db}, takenAt-1, 10)
	if err != nil || len(rest) != 2 || rest[0].Serial != "t3" || rest[1].Serial != "t4" {
		t.Fatalf("second take (none stale): %+v %v", rest, err)
	}
	if err := storage.RefuseCoupons(f.ctx, c, first[:1], model.ReasonRisk); err != nil {
		t.Fatal(err)
	}
	if none, err := storage.TakeCouponRequests(f.ctx, c, []int{db}, -1, 10); err != nil || len(none) != 0 {
		t.Fatalf("a take of accepted requests only (staleMS -1): %+v %v", none, err)
	}
	stale, err := storage.TakeCouponRequests(f.ctx, c, []int{db}, takenAt, 10)
	if err != nil || len(stale) != 2 || stale[0].Serial != "t1" || stale[1].Serial != "t2" {
		t.Fatalf("the stale ones again (t0 refused): %+v %v", stale, err)
	}
	if r, err := storage.CouponRequestOf(f.ctx, c, sA, "pay", "t0"); err != nil || r.State != model.CouponRefused || r.Reason != model.ReasonRisk || r.DecidedMS != f.nowMS() {
		t.Fatalf("refused: %+v %v", r, err)
	}
	if err := storage.RefuseCoupons(f.ctx, c, first[:1], model.ReasonSoldOut); err != nil {
		t.Fatal(err)
	}
	if r, _ := storage.CouponRequestOf(f.ctx, c, sA, "pay", "t0"); r.Reason != model.ReasonRisk {
		t.Fatalf("a final request refused again: %+v", r)
	}
	if other, err := storage.TakeCouponRequests(f.ctx, c, []int{sC.DB()}, 0, 10); err != nil || len(other) != 1 || other[0].Serial != "other-db" {
		t.Fatalf("database 56: %+v %v", other, err)
	}
	// Released (a drain): deciding ones are accepted again and taken at
	// once, whatever staleMS; a final one stays final.
	if err := storage.ReleaseCouponRequests(f.ctx, c, append(rest, first[0])); err != nil {
		t.Fatal(err)
	}
	again, err := storage.TakeCouponRequests(f.ctx, c, []int{db}, 0, 10)
	if err != nil || len(again) != 2 || again[0].Serial != "t3" || again[1].Serial != "t4" {
		t.Fatalf("after the release: %+v %v", again, err)
	}
	if r, _ := storage.CouponRequestOf(f.ctx, c, sA, "pay", "t0"); r.State != model.CouponRefused {
		t.Fatalf("a refused request released: %+v", r)
	}
	// One take over two databases answers both, oldest accepted first.
	f.h.Clock.Advance(time.Millisecond)
	late := f.accept(couponReq(sC, "q2", "m1", "demo-batch"))
	f.h.Clock.Advance(time.Millisecond)
	f.accept(couponReq(sA, "p9", "m2", "demo-batch"))
	both, err := storage.TakeCouponRequests(f.ctx, c, []int{db, sC.DB()}, -1, 10)
	if err != nil || len(both) != 2 || both[0].Serial != "m1" || both[1].Serial != "m2" || both[0].AcceptedMS != late.AcceptedMS {
		t.Fatalf("a take over two databases: %+v %v", both, err)
	}
}

// Issuing decides merged requests in order against the persons' holdings:
// the limit and the group hold across requests of one person in one merge
// and across calls; units beyond what was issued come back as unused; a
// request decided before is left out and takes no unit.
func contractCouponIssue(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	a := model.CouponRule{Batch: "a", Limit: 2, Group: "g"}
	b := model.CouponRule{Batch: "b", Limit: 1, Group: "g"}
	var reqs []model.CouponRequest
	for i, p := range []struct {
		s   model.ShardID
		act string
	}{{sA, "ann"}, {sA, "ann"}, {sA, "ann"}, {sC, "cy"}, {sB, "bea"}} {
		reqs = append(reqs, f.accept(couponReq(p.s, p.act, fmt.Sprintf("a%d", i), "a")))
	}
	taken, err := storage.TakeCouponRequests(f.ctx, c, []int{sA.DB()}, 0, 10)
	if err != nil || len(taken) != 4 {
		t.Fatalf("take: %+v %v", taken, err)
	}
	ds, unused, err := storage.IssueCoupons(f.ctx, c, a, "lease-1", 3, reqs) // five asks, three units
	if err != nil {
		t.Fatal(err)
	}
	want := []model.CouponDecision{{Serial: "a0", Issued: true, Reason: "", App: "pay"}, {Serial: "a1", Issued: true, Reason: "", App: "pay"}, {Serial: "a2", Issued: false, Reason: model.ReasonLimit, App: "pay"}, {Serial: "a3", Issued: true, Reason: "", App: "pay"}, {Serial: "a4", Issued: false, Reason: model.ReasonSoldOut, App: "pay"}}
	if !reflect.DeepEqual(ds, want) || unused != 0 {
		t.Fatalf("decisions %+v unused %d\nwant %+v unused 0", ds, unused, want)
	}
	now := f.nowMS()
	if r, _ := storage.CouponRequestOf(f.ctx, c, sA, "pay", "a0"); r.State != model.CouponIssued || r.CouponID != model.CouponID("pay", "a0", "ann") || r.DecidedMS != now {
		t.Fatalf("a0 as stored: %+v", r)
	}
	if r, _ := storage.CouponRequestOf(f.ctx, c, sB, "pay", "a4"); r.State != model.CouponRefused || r.Reason != model.ReasonSoldOut {
		t.Fatalf("a4 as stored: %+v", r)
	}
	h, err := storage.HoldingOf(f.ctx, c, sA, "ann")
	if err != nil || h.ByBatch["a"] != 2 || h.Groups["g"] != "a" {
		t.Fatalf("ann's holding: %+v %v", h, err)
	}
	checkCouponPages(t, f, c, now)
	cs, err := storage.CouponsOf(f.ctx, c, sC, "cy", model.FlowCursor{}, 10)
	if err != nil || len(cs) != 1 || cs[0].ID != model.CouponID("pay", "a3", "cy") || cs[0].Batch != "a" || cs[0].Group != "g" || cs[0].LeaseID != "lease-1" || cs[0].IssuedMS != now {
		t.Fatalf("cy's coupons: %+v %v", cs, err)
	}
	if n, err := storage.CouponLeaseSpent(f.ctx, c, []int{sA.DB(), sC.DB()}, "lease-1"); err != nil || n != 3 {
		t.Fatalf("lease-1 spent %d %v, want 3", n, err)
	}
	if n, err := storage.CouponLeaseSpent(f.ctx, c, []int{sC.DB()}, "lease-1"); err != nil || n != 1 {
		t.Fatalf("lease-1 spent in database 56: %d %v, want 1", n, err)
	}
	// Re-driven: the same requests again decide nothing and take no unit.
	ds, unused, err = storage.IssueCoupons(f.ctx, c, a, "lease-2", 3, reqs)
	if err != nil || len(ds) != 0 || unused != 3 {
		t.Fatalf("a re-drive of final requests: %+v unused %d %v; want none, 3 unused", ds, unused, err)
	}
	// Batch b of the same group: ann holds a, cy holds a; dee is new.
	b0 := f.accept(couponReq(sA, "ann", "b0", "b"))
	b1 := f.accept(couponReq(sC, "dee", "b1", "b"))
	b2 := f.accept(couponReq(sC, "dee", "b2", "b"))
	ds, unused, err = storage.IssueCoupons(f.ctx, c, b, "lease-3", 3, []model.CouponRequest{b0, b1, b2})
	want = []model.CouponDecision{{Serial: "b0", Issued: false, Reason: model.ReasonGroup, App: "pay"}, {Serial: "b1", Issued: true, Reason: "", App: "pay"}, {Serial: "b2", Issued: false, Reason: model.ReasonLimit, App: "pay"}}
	if err != nil || !reflect.DeepEqual(ds, want) || unused != 2 {
		t.Fatalf("batch b: %+v unused %d %v\nwant %+v unused 2", ds, unused, err, want)
	}
	checkCouponHoldings(t, f, c, a, b)
	// The audit's reading of the same rows.
	checkCouponLedger(t, f)
}

// checkCouponPages checks CouponsOf's pages of ann's two coupons of batch
// a, issued at now by contractCouponIssue.
func checkCouponPages(t *testing.T, f *fixture, c couponStore, now int64) {
	// ann's two coupons, a page of one at a time: issued in the same
	// millisecond, they come by coupon_id, descending; the cursor of the
	// last one gives nothing more, a cursor past the newest gives both.
	p1, err := storage.CouponsOf(f.ctx, c, sA, "ann", model.FlowCursor{}, 1)
	if err != nil || len(p1) != 1 {
		t.Fatalf("ann's first page: %+v %v", p1, err)
	}
	p2, err := storage.CouponsOf(f.ctx, c, sA, "ann", model.FlowCursor{CreatedMS: p1[0].IssuedMS, ID: p1[0].ID}, 1)
	if err != nil || len(p2) != 1 || p2[0].ID >= p1[0].ID || p2[0].IssuedMS != p1[0].IssuedMS {
		t.Fatalf("ann's second page after %s: %+v %v", p1[0].ID, p2, err)
	}
	if p3, err := storage.CouponsOf(f.ctx, c, sA, "ann", model.FlowCursor{CreatedMS: p2[0].IssuedMS, ID: p2[0].ID}, 5); err != nil || len(p3) != 0 {
		t.Fatalf("after ann's last coupon: %+v %v", p3, err)
	}
	if all, err := storage.CouponsOf(f.ctx, c, sA, "ann", model.FlowCursor{CreatedMS: now + 1, ID: "0"}, 5); err != nil || len(all) != 2 || all[0].ID != p1[0].ID {
		t.Fatalf("from a cursor past the newest: %+v %v", all, err)
	}
}

// checkCouponHoldings checks the coupons contractCouponIssue issued of
// rules a and b against the holding rules, and HoldingsOf of several
// persons at once against one at a time.
func checkCouponHoldings(t *testing.T, f *fixture, c couponStore, a, b model.CouponRule) {
	var held []model.HeldCoupon
	for _, p := range []struct {
		s   model.ShardID
		act string
	}{{sA, "ann"}, {sB, "bea"}, {sC, "cy"}, {sC, "dee"}} {
		cs, err := storage.CouponsOf(f.ctx, c, p.s, p.act, model.FlowCursor{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range cs {
			r := a
			if x.Batch == "b" {
				r = b
			}
			held = append(held, model.HeldCoupon{ActID: x.ActID, Rule: r})
		}
	}
	if len(held) != 4 {
		t.Fatalf("%d coupons in all, want 4", len(held))
	}
	if ps := model.CouponHoldingProblems(held); len(ps) != 0 {
		t.Fatalf("holdings: %v", ps)
	}
	// The holdings of several persons at once, as one at a time.
	hs, err := storage.HoldingsOf(f.ctx, c, []model.CouponRequest{couponReq(sA, "ann", "q1", "a"), couponReq(sC, "dee", "q2", "a"), couponReq(sB, "zed", "q3", "a")})
	if err != nil || len(hs) != 3 || hs["ann"].ByBatch["a"] != 2 || hs["ann"].Groups["g"] != "a" || hs["dee"].ByBatch["b"] != 1 ||
		hs["dee"].Groups["g"] != "b" || len(hs["zed"].ByBatch) != 0 {
		t.Fatalf("holdings of ann, dee, zed: %+v %v", hs, err)
	}
}

// checkCouponLedger checks the audit's reading (Ledger) of the rows
// contractCouponIssue left, then of one more request accepted and left open.
func checkCouponLedger(t *testing.T, f *fixture) {
	l, err := f.s.Ledger(f.ctx, f.cell)
	if err != nil {
		t.Fatal(err)
	}
	cr := l.CouponRows
	wantReq := map[model.CouponState]int64{model.CouponIssued: 4, model.CouponRefused: 4}
	if !reflect.DeepEqual(cr.Requests, wantReq) || cr.OldestOpenMS != 0 || cr.RefusedNoReason != 0 || cr.IssuedNoCoupon != 0 || cr.CouponNoRequest != 0 {
		t.Fatalf("ledger requests %+v", cr)
	}
	if !reflect.DeepEqual(cr.ByBatch, map[string]int64{"a": 3, "b": 1}) || !reflect.DeepEqual(cr.LeaseSpent, map[string]int64{"lease-1": 3, "lease-3": 1}) {
		t.Fatalf("ledger by batch %v, by lease %v", cr.ByBatch, cr.LeaseSpent)
	}
	if !reflect.DeepEqual(cr.Multi, []model.CouponCount{{ActID: "ann", Batch: "a", N: 2}}) || len(cr.GroupClash) != 0 {
		t.Fatalf("ledger multi %v, group clashes %v", cr.Multi, cr.GroupClash)
	}
	// One more accepted and left open: the oldest open request.
	open := f.accept(couponReq(sB, "bea", "c0", "a"))
	if l, err = f.s.Ledger(f.ctx, f.cell); err != nil || l.CouponRows.Requests[model.CouponAccepted] != 1 || l.CouponRows.OldestOpenMS != open.AcceptedMS {
		t.Fatalf("ledger with an open request: %+v %v", l.CouponRows, err)
	}
}

// An issue whose COMMIT fails writes nothing; one whose answer is lost
// answers ErrCommitUnknown or its decisions, and its requests are then
// final with one coupon each at most: a re-drive decides nothing twice.
func contractCouponIssueCommitFault(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	a := model.CouponRule{Batch: "a", Limit: 1}
	r0 := f.accept(couponReq(sA, "ann", "f0", "a"))
	r1 := f.accept(couponReq(sC, "cy", "f1", "a"))
	fired := f.arm(false)
	_, _, err := storage.IssueCoupons(f.ctx, c, a, "lease-f", 2, []model.CouponRequest{r0, r1})
	fired()
	failedCommit(t, "issue coupons", err)
	for _, r := range []model.CouponRequest{r0, r1} {
		if got, _ := storage.CouponRequestOf(f.ctx, c, r.Shard, r.App, r.Serial); got.State.Final() {
			t.Fatalf("%s after a failed COMMIT: %+v", r.Serial, got)
		}
	}
	if n, _ := storage.CouponLeaseSpent(f.ctx, c, []int{sA.DB(), sC.DB()}, "lease-f"); n != 0 {
		t.Fatalf("%d coupons after a failed COMMIT", n)
	}
	fired = f.arm(true)
	ds, unused, err := storage.IssueCoupons(f.ctx, c, a, "lease-f", 2, []model.CouponRequest{r0, r1})
	fired()
	if lostAnswer(t, "issue coupons", err) && (len(ds) != 2 || unused != 0) {
		t.Fatalf("settled issue: %+v unused %d", ds, unused)
	}
	ds, unused, err = storage.IssueCoupons(f.ctx, c, a, "lease-g", 2, []model.CouponRequest{r0, r1})
	if err != nil || len(ds) != 0 || unused != 2 {
		t.Fatalf("a re-drive after the lost answer: %+v unused %d %v", ds, unused, err)
	}
	if n, _ := storage.CouponLeaseSpent(f.ctx, c, []int{sA.DB(), sC.DB()}, "lease-f"); n != 2 {
		t.Fatalf("lease-f spent %d, want 2", n)
	}
}

// Issues of one person's requests in separate merges at once decide one
// after the other against the same holding: with a limit of 1, exactly one
// coupon, and every other unit comes back unused.
func contractCouponIssueConcurrent(t *testing.T, newStore func(t *testing.T) Harness) {
	f := newFixture(t, newStore)
	c := f.coupons()
	a := model.CouponRule{Batch: "a", Limit: 1, Group: "g"}
	const n = 8
	reqs := make([]model.CouponRequest, n)
	for i := range reqs {
		reqs[i] = f.accept(couponReq(sA, "ann", fmt.Sprintf("c%d", i), "a"))
	}
	var mu sync.Mutex
	issued, unusedAll := 0, int64(0)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ds, unused, err := storage.IssueCoupons(f.ctx, c, a, fmt.Sprintf("lease-%d", i), 1, reqs[i:i+1])
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			unusedAll += unused
			for _, d := range ds {
				if d.Issued {
					issued++
				} else if d.Reason != model.ReasonLimit {
					t.Errorf("%s refused %s, want PER_PERSON_LIMIT", d.Serial, d.Reason)
				}
			}
		})
	}
	wg.Wait()
	if issued != 1 || unusedAll != n-1 {
		t.Fatalf("%d issued, %d units unused; want 1 and %d", issued, unusedAll, n-1)
	}
	if h, err := storage.HoldingOf(f.ctx, c, sA, "ann"); err != nil || h.ByBatch["a"] != 1 {
		t.Fatalf("ann holds %+v %v", h, err)
	}
}

// uniqueDBs lists the databases of shards once each.
func uniqueDBs(shards ...model.ShardID) []int {
	var out []int
	for _, s := range shards {
		if !slices.Contains(out, s.DB()) {
			out = append(out, s.DB())
		}
	}
	return out
}
