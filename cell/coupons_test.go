package cell_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/couponq"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// The coupon drop through real cells, MariaDB and memcached: the paths no
// other test reaches (the sold-out answer at accept, the risk caps, the
// coupon_issue switch, a request left deciding by a dead cell).

// couponFile writes a batches file (cell/couponbatch) and answers its path.
func couponFile(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "coupons.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// couponTune sets the batches file and an admin port of its own on each cell.
func couponTune(t *testing.T, file string, more func(*cell.Config)) func(*cell.Config) {
	return func(cfg *cell.Config) {
		cfg.Coupons = file
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		if more != nil {
			more(cfg)
		}
	}
}

// couponPrefix is a fresh prefix for act_ids, serials and batch IDs.
func couponPrefix() string { return strings.ReplaceAll(testenv.Prefix(), "_", "-") }

// takeCoupon sends POST /v1/coupons/issue to c: the status, the request's
// state (on a 200 or 202) and the error code (otherwise).
func takeCoupon(t *testing.T, c *testCell, req api.CouponIssueRequest) (int, api.CouponRequestState, string) {
	t.Helper()
	raw, _ := json.Marshal(req)
	r := newRequest(nil, "POST", c.url+api.CouponIssuePath, raw)
	signer.SignRequest(r, time.Now())
	resp, err := roundTrip(t, r)
	if err != nil {
		t.Fatalf("POST %s: %v", api.CouponIssuePath, err)
	}
	var out api.CouponRequestState
	if st := resp.StatusCode(); st != 200 && st != 202 {
		return st, out, string(api.ErrorCode(resp.Body()))
	}
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		t.Fatalf("decode %s: %v", resp.Body(), err)
	}
	return resp.StatusCode(), out, ""
}

// couponStateOf reads GET /v1/coupons/issue/{serial}?act_id=.
func couponStateOf(t *testing.T, c *testCell, serial, act string) api.CouponRequestState {
	t.Helper()
	var out api.CouponRequestState
	if st, code := call(t, "GET", c.url+api.CouponStatePath(serial, act), nil, &out); st != 200 {
		t.Fatalf("state of %s: %d %s", serial, st, code)
	}
	return out
}

// waitCouponFinal polls a request's state until it is final (within limit).
func waitCouponFinal(t *testing.T, c *testCell, serial, act string, limit time.Duration) api.CouponRequestState {
	t.Helper()
	var st api.CouponRequestState
	waitFor(t, limit, func() bool {
		st = couponStateOf(t, c, serial, act)
		return model.CouponState(st.State).Final()
	}, "coupon request "+serial+" final")
	return st
}

// batchBooks reads a batch's books from the rows of cells (every database
// of their servers): coupons issued, and at the batch's home the stock row
// (left: no deduction took it) and what deductions took that no coupon
// carries (written off), checking stock = issued + left + written off and
// that every issued request has its coupon.
func batchBooks(t *testing.T, batch string, cells ...*testCell) (issued, left, writtenOff int64) {
	t.Helper()
	key := couponq.StockKey(batch)
	sh := sharding.BudgetShard(key)
	var stock, out int64
	homes, issuedReqs := 0, int64(0)
	for _, c := range cells {
		for db := range model.ShardCount / 10 {
			var n, r int64
			err := c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_coupon WHERE batch_id = ?", db), batch).Scan(&n)
			if err == nil {
				issued += n
			}
			err = c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_coupon_req WHERE batch_id = ? AND state = 'issued'", db), batch).Scan(&r)
			if err == nil {
				issuedReqs += r
			}
		}
		if !c.cfg.Shards.Contains(sh) {
			continue
		}
		var total, granted, returned int64
		err := c.db.QueryRow(fmt.Sprintf("SELECT total, granted, returned FROM db_%02d.t_budget WHERE budget_key = ?", sh.DB()), key).Scan(&total, &granted, &returned)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			t.Fatalf("stock row of %s: %v", batch, err)
		}
		homes++
		stock, out = total, granted-returned
	}
	if homes != 1 {
		t.Fatalf("batch %s: %d stock rows among the cells, want 1", batch, homes)
	}
	left, writtenOff = stock-out, out-issued
	if issued != issuedReqs || writtenOff < 0 || left < 0 || issued+left+writtenOff != stock {
		t.Fatalf("batch %s: stock %d, issued %d (requests issued %d), left %d, written off %d: the books do not close",
			batch, stock, issued, issuedReqs, left, writtenOff)
	}
	return issued, left, writtenOff
}

// cellOf is the cell of a and b that owns act's shard.
func cellOf(act string, a, b *testCell) *testCell {
	if a.cfg.Shards.Contains(sharding.ShardOfAct(act)) {
		return a
	}
	return b
}

// TestCouponSoldOutAtAccept (issue 27, item 6): a batch of 5 taken by 12
// persons at once over two cells issues exactly 5, the rest refused
// SOLD_OUT by the merge. Once each cell's local copy of the stock (its
// home's, read over POST /internal/coupons/stock by the other) shows
// nothing left, a request is answered at once, 200 refused SOLD_OUT, decided
// when accepted; a repeat and the state route answer the same; the books
// close with 5 issued, nothing left or written off.
func TestCouponSoldOutAtAccept(t *testing.T) {
	p := couponPrefix()
	batch := p + "-five"
	file := couponFile(t, fmt.Sprintf("batches:\n  - {id: %s, stock: 5, face_value: 100, per_person_limit: 1}\n", batch))
	a, b := twoCells(t, couponTune(t, file, nil))

	const persons = 12
	var wg sync.WaitGroup
	for i := range persons {
		wg.Go(func() {
			act := fmt.Sprintf("%s-p%d", p, i)
			if st, _, code := takeCoupon(t, cellOf(act, a, b), api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", p, i)}); st != 202 && st != 200 {
				t.Errorf("person %d: %d %s", i, st, code)
			}
		})
	}
	wg.Wait()
	issued := 0
	for i := range persons {
		act := fmt.Sprintf("%s-p%d", p, i)
		st := waitCouponFinal(t, cellOf(act, a, b), fmt.Sprintf("%s-s%d", p, i), act, 30*time.Second)
		switch {
		case st.State == "issued":
			issued++
		case st.State == "refused" && st.Reason == "SOLD_OUT":
		default:
			t.Fatalf("person %d: %+v", i, st)
		}
	}
	if issued != 5 {
		t.Fatalf("%d issued of a stock of 5", issued)
	}

	// Each cell answers at once once its copy has caught up (within a
	// second; 10 s allowed), whichever cell homes the batch.
	for _, c := range []*testCell{a, b} {
		n := 0
		var act, serial string
		var got api.CouponRequestState
		waitFor(t, 10*time.Second, func() bool {
			n++
			act, serial = actIn(t, fmt.Sprintf("%s-late-%s-%d", p, c.name, n), c.cfg.Shards), fmt.Sprintf("%s-late-%s-%d", p, c.name, n)
			var st int
			st, got, _ = takeCoupon(t, c, api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: serial})
			return st == 200
		}, c.name+" answering a request for the sold-out batch at once")
		if got.State != "refused" || got.Reason != "SOLD_OUT" || got.AcceptedMS == 0 || got.DecidedMS != got.AcceptedMS || got.CouponID != "" {
			t.Fatalf("%s: answered %+v; want refused SOLD_OUT, decided when accepted", c.name, got)
		}
		if st, again, code := takeCoupon(t, c, api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: serial}); st != 200 || again != got {
			t.Fatalf("%s: repeat answered %d %s %+v; want 200 %+v", c.name, st, code, again, got)
		}
		green := serial + "-g"
		if st, again, code := takeCoupon(t, c, api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: green, Green: true}); st != 200 ||
			again.State != "refused" || again.Reason != "SOLD_OUT" || again.DecidedMS != again.AcceptedMS {
			t.Fatalf("%s: a green request answered %d %s %+v", c.name, st, code, again)
		}
		if st := couponStateOf(t, c, serial, act); st != got {
			t.Fatalf("%s: the state route answered %+v; want %+v", c.name, st, got)
		}
		if v := metric(t, c, `redcell_coupon_refused_total{reason="SOLD_OUT",space="real"}`); v < 2 {
			t.Fatalf("%s: redcell_coupon_refused_total{SOLD_OUT} %v, want at least the 2 answered at accept", c.name, v)
		}
	}
	iss, left, off := batchBooks(t, batch, a, b)
	if iss != 5 || left != 0 || off != 0 {
		t.Fatalf("books of %s: issued %d, left %d, written off %d; want 5, 0, 0", batch, iss, left, off)
	}
}
