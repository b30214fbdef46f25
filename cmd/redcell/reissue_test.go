package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"redcell/api"
	"redcell/client"
)

// TestReissueOutcomes sorts each kind of answer (httptest, no cluster): a
// new reward is applied, a repeat repeated, a final error refused by its
// code, a retryable one tried reissueAttempts times and then failed by its
// code, an answer that never comes failed as TRANSPORT.
func TestReissueOutcomes(t *testing.T) {
	var overloaded atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req api.RewardRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ParentActivityID != "demo-festival" {
			t.Errorf("request %+v %v", req, err)
		}
		w.Header().Set("Content-Type", "application/json")
		switch req.ActID {
		case "new", "again":
			json.NewEncoder(w).Encode(api.RewardResponse{OrderNo: req.ActID, Repeat: req.ActID == "again"})
		case "bad":
			w.WriteHeader(400)
			w.Write([]byte(`{"error":{"code":"INVALID_ARGUMENT","message":"amount"}}`))
		case "busy":
			overloaded.Add(1)
			w.WriteHeader(503)
			w.Write([]byte(`{"error":{"code":"OVERLOADED","message":"busy","retryable":true}}`))
		case "gone":
			panic(http.ErrAbortHandler) // the connection is cut: no answer
		}
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "rck_test")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "x.csv")
	os.WriteFile(file, []byte("new,rain,r1,5\nagain,rain,r1,5\nbad,rain,r1,5\nbusy,rain,r1,5\ngone,rain,r1,5,cash\n"), 0o644)
	lines, err := readReissueFile(file, "demo-festival")
	if err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	sum := reissue(context.Background(), c, lines, 2, &progress)
	if sum.lines != 5 || sum.applied != 1 || sum.repeated != 1 || len(sum.refused) != 1 || len(sum.refused["INVALID_ARGUMENT"]) != 1 ||
		sum.refused["INVALID_ARGUMENT"][0] != 3 || len(sum.failed) != 2 || sum.failed["OVERLOADED"][0] != 4 || sum.failed["TRANSPORT"][0] != 5 ||
		sum.notSent != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if n := overloaded.Load(); n != reissueAttempts {
		t.Fatalf("a retryable answer was tried %d times, want %d", n, reissueAttempts)
	}
	if !strings.HasSuffix(progress.String(), "5/5 lines  applied 1  repeated 1  refused 1  failed 2 \n") {
		t.Fatalf("progress %q", progress.String())
	}
	var out strings.Builder
	writeReissueSummary(&out, "x.csv", "demo-festival", sum)
	want := "reissue x.csv (demo-festival): 5 lines: applied 1, repeated 1, refused 1, failed 2\n" +
		"  refused INVALID_ARGUMENT: 1\n  refused lines (first 1 of 1): 3\n" +
		"  failed OVERLOADED: 1\n  failed TRANSPORT: 1\n  failed lines (first 2 of 2): 4, 5\n"
	if out.String() != want {
		t.Fatalf("summary:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestReissueFile: a header is skipped only as the first line, award_type
// defaults to cash, and the shape of every line is checked before sending.
func TestReissueFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "f.csv")
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	lines, err := readReissueFile(write("act_id, scene_id, rain_id, amount\na,rain,r1,5\nb, card ,r2,1,coupon\n"), "p")
	if err != nil || len(lines) != 2 || lines[0].no != 2 || lines[1].no != 3 ||
		lines[0].req != (api.RewardRequest{ParentActivityID: "p", ActID: "a", SceneID: "rain", RainID: "r1", Amount: 5, AwardType: "cash"}) ||
		lines[1].req != (api.RewardRequest{ParentActivityID: "p", ActID: "b", SceneID: "card", RainID: "r2", Amount: 1, AwardType: "coupon"}) {
		t.Fatalf("lines %+v %v", lines, err)
	}
	for body, want := range map[string]string{
		"":                                 "has no lines",
		"act_id,scene_id,rain_id,amount\n": "has no lines",
		"a,rain,r1,5\nact_id,scene_id,rain_id,amount\n": `line 2: amount "amount" is not an integer`,
		"a,rain,r1\n":          "line 1: 3 fields",
		"a,rain,r1,5,cash,x\n": "line 1: 6 fields",
		",rain,r1,5\n":         "line 1: act_id is empty",
		"a,rain,r1,1.5\n":      `line 1: amount "1.5" is not an integer`,
		"a,\"rain,r1,5\n":      "extraneous or missing",
	} {
		if _, err := readReissueFile(write(body), "p"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
