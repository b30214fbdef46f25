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

// couponCell runs one cell owning every shard with the batches file and
// an admin port, up.
func couponCell(t *testing.T, file string, more func(*cell.Config)) *testCell {
	t.Helper()
	c := oneCell(t, couponTune(t, file, more))
	waitFor(t, 5*time.Second, func() bool { _, err := client.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	return c
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
// that every issued request holds its coupon (an ID and the lease it came
// from).
func batchBooks(t *testing.T, batch string, cells ...*testCell) (issued, left, writtenOff int64) {
	t.Helper()
	key := couponq.StockKey(batch)
	sh := sharding.BudgetShard(key)
	var stock, out int64
	homes, issuedReqs := 0, int64(0)
	for _, c := range cells {
		for db := range model.ShardCount / 10 {
			var n, r int64
			err := c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM db_%02d.t_coupon_req WHERE batch_id = ? AND state = 'issued' AND coupon_id <> '' AND lease_id <> ''", db), batch).Scan(&n)
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

// settledBooks is batchBooks once nothing is out but what was issued: an
// engine's held lease goes back once idle (couponq's heldIdle, 250 ms), and
// until then its unspent units read as written off. Waited for up to 30 s.
func settledBooks(t *testing.T, batch string, cells ...*testCell) (issued, left, writtenOff int64) {
	t.Helper()
	waitFor(t, 30*time.Second, func() bool {
		issued, left, writtenOff = batchBooks(t, batch, cells...)
		return writtenOff == 0
	}, "batch "+batch+": every held lease returned (nothing written off)")
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
			// A 503 or 504 may come after the request was stored (the
			// first accepts make the cells' tables; slow under -race):
			// retried with the same serial, as api.md says.
			for try := 1; ; try++ {
				st, _, code := takeCoupon(t, cellOf(act, a, b), api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", p, i)})
				if st == 202 || st == 200 {
					break
				}
				if (st != 503 && st != 504) || try == 5 {
					t.Errorf("person %d, try %d: %d %s", i, try, st, code)
					break
				}
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
		if got.Repeat == nil || *got.Repeat {
			t.Fatalf("%s: the request refused at accept answered repeat %v; want false", c.name, got.Repeat)
		}
		got.Repeat = nil // the state route leaves it out; a repeat says true
		if st, again, code := takeCoupon(t, c, api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: serial}); st != 200 ||
			again.Repeat == nil || !*again.Repeat {
			t.Fatalf("%s: repeat answered %d %s repeat %v; want 200, a repeat", c.name, st, code, again.Repeat)
		} else if again.Repeat = nil; again != got {
			t.Fatalf("%s: repeat answered %+v; want %+v", c.name, again, got)
		}
		green := serial + "-g"
		if st, again, code := takeCoupon(t, c, api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: green, Green: true}); st != 200 ||
			again.State != "refused" || again.Reason != "SOLD_OUT" || again.DecidedMS != again.AcceptedMS {
			t.Fatalf("%s: a green request answered %d %s %+v", c.name, st, code, again)
		}
		if st := couponStateOf(t, c, serial, act); st != got {
			t.Fatalf("%s: the state route answered %+v; want %+v", c.name, st, got)
		}
		if v := metric(t, c, `redcell_coupon_refused_total{batch="`+batch+`",reason="SOLD_OUT",space="real"}`); v < 2 {
			t.Fatalf("%s: redcell_coupon_refused_total{SOLD_OUT} %v, want at least the 2 answered at accept", c.name, v)
		}
	}
	iss, left, off := settledBooks(t, batch, a, b)
	if iss != 5 || left != 0 || off != 0 {
		t.Fatalf("books of %s: issued %d, left %d, written off %d; want 5, 0, 0", batch, iss, left, off)
	}
}

// TestCouponRiskCaps (issue 27, item 5): past a risk cap of the batches
// file (requests per minute of a device, an IP, an act_id) a request is
// refused RISK, green or queued, and takes no unit: the rows show the
// coupons of the requests within the caps only, and the books close. A
// minute that turns during an attempt resets the counts, so the attempt is
// made again with fresh names (at most three).
func TestCouponRiskCaps(t *testing.T) {
	p := couponPrefix()
	batch := p + "-risk"
	file := couponFile(t, fmt.Sprintf(`batches:
  - {id: %s, stock: 1000, face_value: 100, per_person_limit: 100}
risk: {per_device_per_min: 2, per_ip_per_min: 3, per_act_per_min: 2}
`, batch))
	c := couponCell(t, file, nil)
	n := 0
	take := func(act string, green bool, device, ip string) api.CouponRequestState {
		t.Helper()
		n++
		req := api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", p, n), Green: green, DeviceID: device, ClientIP: ip}
		if st, _, code := takeCoupon(t, c, req); st != 200 && st != 202 {
			t.Fatalf("%+v: %d %s", req, st, code)
		}
		return waitCouponFinal(t, c, req.SerialNo, act, 20*time.Second)
	}
	wantIssued := 0
	for attempt := 0; ; attempt++ {
		minute := time.Now().Unix() / 60
		a := fmt.Sprintf("%s-%d", p, attempt)
		var got []string
		// Per device (green: decided in the call, in order): the third is refused.
		for i := range 3 {
			got = append(got, take(fmt.Sprintf("%s-d%d", a, i), true, a+"-dev", "").Reason)
		}
		// Per IP (green): the fourth is refused.
		for i := range 4 {
			got = append(got, take(fmt.Sprintf("%s-i%d", a, i), true, "", fmt.Sprintf("10.27.%d.1", attempt)).Reason)
		}
		// Per act_id, queued behind: three accepted at once, one of them refused.
		act := a + "-act"
		var serials []string
		for range 3 {
			n++
			req := api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", p, n)}
			if st, _, code := takeCoupon(t, c, req); st != 202 && st != 200 {
				t.Fatalf("queued %+v: %d %s", req, st, code)
			}
			serials = append(serials, req.SerialNo)
		}
		risky := 0
		for _, s := range serials {
			st := waitCouponFinal(t, c, s, act, 20*time.Second)
			switch {
			case st.State == "refused" && st.Reason == "RISK":
				risky++
			case st.State != "issued":
				t.Fatalf("act_id cap: %+v", st)
			}
		}
		if time.Now().Unix()/60 != minute && attempt < 2 {
			wantIssued += countIssued(got) + 3 - risky
			continue // the counts were reset mid-attempt: again, fresh
		}
		if want := []string{"", "", "RISK", "", "", "", "RISK"}; strings.Join(got, ",") != strings.Join(want, ",") || risky != 1 {
			t.Fatalf("reasons %q (device cap 2, then IP cap 3), %d of 3 refused RISK by the act_id cap (2); want %q and 1", got, risky, want)
		}
		wantIssued += countIssued(got) + 3 - risky
		break
	}
	if v := metric(t, c, `redcell_coupon_refused_total{batch="`+batch+`",reason="RISK",space="real"}`); v < 3 {
		t.Fatalf("redcell_coupon_refused_total{RISK} %v, want at least 3", v)
	}
	issued, left, off := settledBooks(t, batch, c)
	if int(issued) != wantIssued || left != 1000-issued || off != 0 {
		t.Fatalf("books of %s: issued %d (want %d), left %d, written off %d", batch, issued, wantIssued, left, off)
	}
}

// countIssued counts the requests of reasons that were not refused ("").
func countIssued(reasons []string) int {
	n := 0
	for _, r := range reasons {
		if r == "" {
			n++
		}
	}
	return n
}

// TestCouponIssueSwitch (issue 27, item 5): with coupon_issue off, requests
// are accepted (202; a green one 200 accepted) and wait accepted in their
// rows through the feeder's passes, issuing nothing; switched on, the
// feeder takes the backlog and every request is issued, the books closing.
func TestCouponIssueSwitch(t *testing.T) {
	p := couponPrefix()
	batch := p + "-held"
	file := couponFile(t, fmt.Sprintf("batches:\n  - {id: %s, stock: 100, face_value: 100, per_person_limit: 1}\n", batch))
	c := couponCell(t, file, nil)
	setDegrade(t, c, api.DegradeSetting{CouponIssue: "off"})
	var reqs []api.CouponIssueRequest
	for i := range 4 {
		req := api.CouponIssueRequest{ActID: fmt.Sprintf("%s-p%d", p, i), BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", p, i), Green: i == 3}
		st, got, code := takeCoupon(t, c, req)
		if want := map[bool]int{false: 202, true: 200}[req.Green]; st != want || got.State != "accepted" {
			t.Fatalf("%+v while off: %d %s %+v; want %d accepted", req, st, code, got, want)
		}
		reqs = append(reqs, req)
	}
	// The feeder would take the databases accepted into every 50 ms: watched
	// for 2.5 s (fifty passes), the requests stay accepted and nothing is
	// issued. Absence takes a window of time; it is bounded, not waited
	// on.
	// A take already running when the switch went off (the engine's first
	// sweep over cold tables may take seconds) may hold a request deciding
	// for a moment; it gives it back, never decides it.
	watched := time.Now()
	waitFor(t, 10*time.Second, func() bool {
		for _, r := range reqs {
			if st := couponStateOf(t, c, r.SerialNo, r.ActID); st.State != "accepted" && st.State != "deciding" {
				t.Fatalf("%s while off: %+v", r.SerialNo, st)
			}
		}
		return time.Since(watched) > 2500*time.Millisecond
	}, "two sweeps with issuing off")
	// A take that was running gives its requests back: each is accepted
	// again (waited on, not assumed after the window).
	waitFor(t, 30*time.Second, func() bool {
		for _, r := range reqs {
			if st := couponStateOf(t, c, r.SerialNo, r.ActID); st.State != "accepted" {
				if st.State != "deciding" {
					t.Fatalf("%s while off: %+v", r.SerialNo, st)
				}
				return false
			}
		}
		return true
	}, "every request accepted while off")
	if issued, _, _ := batchBooks(t, batch, c); issued != 0 {
		t.Fatalf("%d issued while off", issued)
	}
	setDegrade(t, c, api.DegradeSetting{CouponIssue: "on"})
	for _, r := range reqs {
		if st := waitCouponFinal(t, c, r.SerialNo, r.ActID, 20*time.Second); st.State != "issued" || st.CouponID == "" {
			t.Fatalf("%s once on: %+v", r.SerialNo, st)
		}
	}
	if issued, left, off := settledBooks(t, batch, c); issued != 4 || left != 96 || off != 0 {
		t.Fatalf("books of %s: issued %d, left %d, written off %d; want 4, 96, 0", batch, issued, left, off)
	}
}
