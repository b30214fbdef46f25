package storage

// Tests of the grouped coupon accept's one-round-trip path (acceptAll) and
// where it falls back to an INSERT per database: a stored serial in the
// group, and a serial another transaction holds a lock on. The rows are
// checked as stored.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"redcell/model"
)

func acceptOps(rs []model.CouponRequest) []*AcceptOp {
	ops := make([]*AcceptOp, len(rs))
	for i, r := range rs {
		ops[i] = &AcceptOp{Coupon: r}
	}
	return ops
}

// checkAccepted asserts each request of rs is stored once, accepted, for
// its person and batch at its accept time.
func checkAccepted(t *testing.T, m *MySQL, rs []model.CouponRequest) {
	t.Helper()
	for _, r := range rs {
		var n int
		var act, state string
		var at int64
		err := m.db.QueryRow("SELECT COUNT(*), MAX(act_id), MAX(state), MAX(accepted_ms) FROM "+m.couponReqTable(r.Shard.DB())+
			" WHERE app = ? AND serial_no = ?", r.App, r.Serial).Scan(&n, &act, &state, &at)
		if err != nil || n != 1 || act != r.ActID || state != string(model.CouponAccepted) || at != r.AcceptedMS {
			t.Fatalf("%s: %d rows, %s %s at %d, %v; want 1 row of %s accepted at %d", r.Serial, n, act, state, at, err, r.ActID, r.AcceptedMS)
		}
	}
}

func TestAcceptStatementList(t *testing.T) {
	m := ownNamespaceStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	shards := []model.ShardID{5, 15, 125, 999} // databases 0, 1, 12, 99
	req := func(prefix string, i int) model.CouponRequest {
		s := shards[i%len(shards)]
		return model.CouponRequest{App: "pay", Serial: fmt.Sprintf("%s-%d", prefix, i), ActID: fmt.Sprintf("%s-act-%d", prefix, i),
			Shard: s, Batch: "b1", AcceptedMS: now}
	}
	paths := func() (int64, int64) { return m.accepts.Bulk.Load(), m.accepts.Fallback.Load() }
	wantPaths := func(t *testing.T, bulk0, fb0, bulk, fb int64) {
		t.Helper()
		if b, f := paths(); b != bulk0+bulk || f != fb0+fb {
			t.Fatalf("paths: bulk %d→%d fallback %d→%d; want +%d bulk +%d fallback", bulk0, b, fb0, f, bulk, fb)
		}
	}

	var fresh []model.CouponRequest
	for i := range 24 {
		fresh = append(fresh, req("a", i))
	}
	t.Run("new serials in one round trip", func(t *testing.T) {
		b, f := paths()
		ops := acceptOps(fresh)
		if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
			t.Fatal(err)
		}
		wantPaths(t, b, f, 1, 0)
		for i, op := range ops {
			if op.Err != nil || op.Repeat || op.Accepted.Serial != fresh[i].Serial || op.Accepted.State != model.CouponAccepted {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Accepted, op.Repeat, op.Err)
			}
		}
		checkAccepted(t, m, fresh)
	})

	t.Run("a stored serial falls back and writes nothing twice", func(t *testing.T) {
		b, f := paths()
		again := fresh[3] // a retry stored in the same millisecond as the first: still a repeat
		more := []model.CouponRequest{req("b", 0), req("b", 1), req("b", 2)}
		ops := acceptOps([]model.CouponRequest{more[0], again, more[1], more[2]})
		if err := m.CommitGroup(ctx, Ops(ops)); err != nil {
			t.Fatal(err)
		}
		wantPaths(t, b, f, 0, 1)
		if op := ops[1]; op.Err != nil || !op.Repeat || op.Accepted.AcceptedMS != now {
			t.Fatalf("the retry: %+v repeat %v err %v; want the first request, repeat", op.Accepted, op.Repeat, op.Err)
		}
		for _, i := range []int{0, 2, 3} {
			if op := ops[i]; op.Err != nil || op.Repeat {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Accepted, op.Repeat, op.Err)
			}
		}
		checkAccepted(t, m, append(more, fresh...))
	})

	t.Run("a serial locked by another transaction falls back and waits", func(t *testing.T) {
		b, f := paths()
		var rs []model.CouponRequest
		for i := range 8 {
			rs = append(rs, req("c", i))
		}
		other, err := m.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := other.QueryRow("SELECT COUNT(*) FROM "+m.couponReqTable(rs[5].Shard.DB())+" WHERE app = ? AND serial_no = ? FOR UPDATE",
			rs[5].App, rs[5].Serial).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the other transaction's lock: %d %v", n, err)
		}
		released := commitOnceWaitedFor(m, other, m.couponReqTable(rs[5].Shard.DB()))
		ops := acceptOps(rs)
		err = m.CommitGroup(ctx, Ops(ops))
		if rerr := <-released; rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		wantPaths(t, b, f, 0, 1)
		for i, op := range ops {
			if op.Err != nil || op.Repeat {
				t.Fatalf("op %d: %+v repeat %v err %v", i, op.Accepted, op.Repeat, op.Err)
			}
		}
		checkAccepted(t, m, rs)
	})

	t.Run("groups with a retry and new serials at once all store, none deadlocked", func(t *testing.T) {
		b, f := paths()
		const groups = 8
		errs := make(chan error, groups)
		var all []model.CouponRequest
		var lists [][]model.CouponRequest
		for g := range groups {
			list := []model.CouponRequest{fresh[0]} // a retry: every group falls back
			for i := range 3 {
				r := req(fmt.Sprintf("d%d", g), i*4) // shard 5: one database for all
				list = append(list, r)
				all = append(all, r)
			}
			lists = append(lists, list)
		}
		for _, list := range lists {
			go func() { errs <- m.CommitGroup(ctx, Ops(acceptOps(list))) }()
		}
		for range groups {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		wantPaths(t, b, f, 0, groups)
		checkAccepted(t, m, all)
	})
}
