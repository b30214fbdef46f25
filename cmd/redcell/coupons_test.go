package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"redcell/api"
	"redcell/client"
	"redcell/internal/testenv"
)

// couponBatches is a batches file for the coupon tests; p makes the batch
// IDs fresh, since the test databases (and the batches' stock rows) are
// shared between runs.
func couponBatches(p string) string {
	return fmt.Sprintf(`batches:
  - {id: %[1]s-hot, stock: 40, face_value: 500, per_person_limit: 1}
  - {id: %[1]s-two, stock: 1000, face_value: 200, per_person_limit: 2}
  - {id: %[1]s-ga, stock: 100, face_value: 300, per_person_limit: 1, group: %[1]s-g}
  - {id: %[1]s-gb, stock: 100, face_value: 100, per_person_limit: 1, group: %[1]s-g}
`, p)
}

// startCouponCluster starts the test cluster with a batches file made by
// couponBatches(p).
func startCouponCluster(t *testing.T, p string) *cluster {
	t.Helper()
	file := filepath.Join(t.TempDir(), "coupons.yaml")
	if err := os.WriteFile(file, []byte(couponBatches(p)), 0o644); err != nil {
		t.Fatal(err)
	}
	cell := e2eCell + fmt.Sprintf("  coupons: %q\n", file)
	return startClusterSpec(t, clusterSpec{dsn: [2]string{testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)}, mc: testenv.Memcached(t), cell: cell})
}

// waitFinal polls a coupon request until its state is final.
func waitFinal(t *testing.T, cl *client.Client, serial, actID string, within time.Duration) api.CouponRequestState {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := cl.CouponRequest(context.Background(), serial, actID)
		if err != nil {
			t.Fatalf("state of %s: %v", serial, err)
		}
		if st.State == "issued" || st.State == "refused" {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still %s after %s", serial, st.State, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCouponClient drives coupon issuance through the router with package
// client, on a cluster of real processes: accept and answer 202, the state
// read back, the holder's list, repeats and conflicts, the per-person limit,
// the group exclusion on the green channel, the app scope of a serial, and
// a drop of 70 persons on a batch of 40 — whose rows in both cells'
// databases show exactly 40 coupons, one per person, and whose home cell
// shows its stock spent with nothing left out.
func TestCouponClient(t *testing.T) {
	p := testenv.Prefix()
	c := startCouponCluster(t, p)
	cl := must[*client.Client](t, "client")(client.New(c.router, testAPIKey, client.WithHTTPClient(newSpecClient())))
	ctx := context.Background()
	hot, two, ga, gb := p+"-hot", p+"-two", p+"-ga", p+"-gb"
	ann := p + "-ann"

	// Accepted at once, issued behind.
	st := must[api.CouponRequestState](t, "issue")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s1"}))
	if st.State != "accepted" && st.State != "deciding" && st.State != "issued" || st.SerialNo != p+"-s1" || st.ActID != ann || st.AcceptedMS == 0 {
		t.Fatalf("first answer %+v", st)
	}
	st = waitFinal(t, cl, p+"-s1", ann, 10*time.Second)
	if st.State != "issued" || st.CouponID == "" || st.BatchID != two {
		t.Fatalf("final state %+v", st)
	}
	held := must[api.CouponsResponse](t, "coupons")(cl.Coupons(ctx, ann))
	if len(held.Coupons) != 1 || held.Coupons[0].CouponID != st.CouponID || held.Coupons[0].FaceValue != 200 || held.Coupons[0].SerialNo != p+"-s1" {
		t.Fatalf("ann holds %+v", held)
	}
	// A repeat answers the stored request; the serial for another batch is a conflict.
	if again := must[api.CouponRequestState](t, "repeat")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s1"})); again.CouponID != st.CouponID || again.State != "issued" {
		t.Fatalf("repeat answered %+v", again)
	}
	_, err := cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: hot, SerialNo: p + "-s1"})
	apiError(t, "serial reused for another batch", err, http.StatusConflict, "ORDER_CONFLICT")
	_, err = cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: p + "-none", SerialNo: p + "-s9"})
	apiError(t, "unknown batch", err, http.StatusNotFound, "NOT_FOUND")
	_, err = cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s9", ClientIP: "010.1.1.1"})
	apiError(t, "a client_ip not in canonical form", err, http.StatusBadRequest, "INVALID_ARGUMENT")
	_, err = cl.CouponRequest(ctx, p+"-s1", p+"-bob")
	apiError(t, "another person's serial", err, http.StatusNotFound, "NOT_FOUND")

	// The limit of two: a third request is refused (the green channel
	// answers the final state in the call).
	if g := must[api.CouponRequestState](t, "green 2")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s2", Green: true})); g.State != "issued" {
		t.Fatalf("second of two: %+v", g)
	}
	if g := must[api.CouponRequestState](t, "green 3")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s3", Green: true})); g.State != "refused" || g.Reason != "PER_PERSON_LIMIT" {
		t.Fatalf("third of two: %+v", g)
	}
	// The group: one batch of it per person, queued or green.
	must[api.CouponRequestState](t, "group a")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: ga, SerialNo: p + "-g1"}))
	if st := waitFinal(t, cl, p+"-g1", ann, 10*time.Second); st.State != "issued" {
		t.Fatalf("group a: %+v", st)
	}
	if g := must[api.CouponRequestState](t, "group b")(cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: gb, SerialNo: p + "-g2", Green: true})); g.State != "refused" || g.Reason != "GROUP_HELD" {
		t.Fatalf("group b: %+v", g)
	}

	// ann's three coupons, two pages of two: the first with a cursor, the
	// second the last; together the full list, newest first.
	full := must[api.CouponsResponse](t, "coupons")(cl.Coupons(ctx, ann))
	page1 := must[api.CouponsResponse](t, "page 1")(cl.CouponsPage(ctx, ann, "", 2))
	page2 := must[api.CouponsResponse](t, "page 2")(cl.CouponsPage(ctx, ann, page1.NextCursor, 2))
	if len(full.Coupons) != 3 || full.NextCursor != "" || len(page1.Coupons) != 2 || page1.NextCursor == "" || len(page2.Coupons) != 1 || page2.NextCursor != "" ||
		page1.Coupons[0] != full.Coupons[0] || page1.Coupons[1] != full.Coupons[1] || page2.Coupons[0] != full.Coupons[2] {
		t.Fatalf("ann's coupons %+v in pages of two: %+v then %+v", full, page1, page2)
	}
	_, err = cl.CouponsPage(ctx, ann, "not-a-cursor", 2)
	apiError(t, "a cursor the API did not give", err, http.StatusBadRequest, "INVALID_ARGUMENT")

	// A serial belongs to its app: another app's key sees no such request,
	// and may use the same serial for its own.
	out, err := exec.Command(c.bin, "apikey", "add", "--config", c.config, "--app", "other", "--scopes", "read,coupon").Output()
	if err != nil {
		t.Fatalf("apikey add: %v", err)
	}
	other := must[*client.Client](t, "client")(client.New(c.router, strings.TrimSpace(string(out)), client.WithHTTPClient(newSpecClient())))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err = other.CouponRequest(ctx, p+"-s1", ann)
		if e := (*client.Error)(nil); errors.As(err, &e) && e.Code == "NOT_FOUND" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other app reading app e2e's serial: %v", err)
		}
	}
	if o := must[api.CouponRequestState](t, "other app")(other.IssueCoupon(ctx, api.CouponIssueRequest{ActID: ann, BatchID: two, SerialNo: p + "-s1", Green: true})); o.State != "refused" || o.Reason != "PER_PERSON_LIMIT" {
		t.Fatalf("the other app's s1: %+v", o)
	}

	// A drop: 70 persons, 40 coupons, everything accepted first.
	const persons = 70
	var wg sync.WaitGroup
	errs := make(chan error, persons)
	for i := range persons {
		wg.Go(func() {
			_, err := cl.IssueCoupon(ctx, api.CouponIssueRequest{ActID: fmt.Sprintf("%s-p%d", p, i), BatchID: hot, SerialNo: fmt.Sprintf("%s-d%d", p, i)})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("drop accept: %v", err)
	}
	issued, soldOut := 0, 0
	for i := range persons {
		st := waitFinal(t, cl, fmt.Sprintf("%s-d%d", p, i), fmt.Sprintf("%s-p%d", p, i), 20*time.Second)
		switch {
		case st.State == "issued":
			issued++
		case st.Reason == "SOLD_OUT":
			soldOut++
		default:
			t.Fatalf("drop request %d: %+v", i, st)
		}
	}
	if issued != 40 || soldOut != persons-40 {
		t.Fatalf("drop: %d issued, %d sold out; want 40 and %d", issued, soldOut, persons-40)
	}
	// The rows: 40 coupons of the batch over both cells, one per person.
	rows, people := 0, 0
	for _, dsn := range c.spec.dsn {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n, np int
		for d := range 100 {
			var exists int
			if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = 't_coupon_req'", fmt.Sprintf("db_%02d", d)).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if exists == 0 {
				continue
			}
			var a, b int
			if err := db.QueryRow(fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT act_id) FROM db_%02d.t_coupon_req WHERE batch_id = ? AND state = 'issued'", d), hot).Scan(&a, &b); err != nil {
				t.Fatal(err)
			}
			n, np = n+a, np+b
		}
		rows, people = rows+n, people+np
	}
	if rows != 40 || people != 40 {
		t.Fatalf("the databases hold %d coupons of %s for %d persons; want 40 and 40", rows, hot, people)
	}
	// The batch's home: the stock spent, nothing left out in deductions.
	homes := 0
	for _, cell := range []string{"cell-1", "cell-2"} {
		var bs api.CouponBatchesResponse
		req, _ := http.NewRequest(http.MethodGet, c.adminURL[cell]+"/admin/coupons", nil)
		req.Header.Set("Authorization", "Bearer e2e-admin-token-0123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&bs)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s /admin/coupons: %d %v", cell, resp.StatusCode, err)
		}
		for _, b := range bs.Batches {
			if b.ID != hot || !b.Home {
				continue
			}
			homes++
			if b.Spent != 40 || b.Left != 0 || b.Out != 0 {
				t.Fatalf("%s homes %s: %+v", cell, hot, b)
			}
		}
	}
	if homes != 1 {
		t.Fatalf("%d cells home %s", homes, hot)
	}
	// The audit over both cells: the batch's books close, and nobody is over a limit.
	var rep strings.Builder
	if err := audit(ctx, []string{"--config", c.config, "--settle", "0s"}, &rep); err != nil {
		t.Fatalf("audit: %v\n%s", err, rep.String())
	}
	if want := fmt.Sprintf("coupon batch %-34s stock 40 = issued 40 + left 0 + written off 0", hot); !strings.Contains(rep.String(), want) {
		t.Fatalf("audit report lacks %q:\n%s", want, rep.String())
	}
	if n := c.metric(t, "cell-1", "redcell_coupon_issued_total") + c.metric(t, "cell-2", "redcell_coupon_issued_total"); n != 40+3 {
		t.Fatalf("redcell_coupon_issued_total %v, want 43 (40 of the drop, three of ann)", n)
	}
}
