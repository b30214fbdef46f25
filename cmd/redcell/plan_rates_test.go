package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/bench"
	"redcell/internal/testenv"
)

// TestPlanFromRates: redcell plan --rate-window reads each database's rate of
// money operations from the cells' metrics and plans the moves that even the
// cells' load out. Deposits through the router go to databases 3 and 4
// (cell-1) three and two times as often as to 70 and 80 (cell-2), and
// nowhere else: a plan by count keeps the map (50 databases each), the plan
// by rates moves db_04 to cell-2 (cell-1 about 5 parts, cell-2 1; half the
// gap is db_04's 2), and says what it measured.
func TestPlanFromRates(t *testing.T) {
	c := startClusterSpec(t, clusterSpec{dsn: [2]string{testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)}, mc: testenv.Memcached(t), cell: e2eCell})
	pre := testenv.Prefix()
	// Accounts enough that the router's per-person rate limit holds no
	// deposit back: the rates are the pattern's, not the limit's.
	acts := map[int][]string{}
	for _, db := range []int{3, 4, 70, 80} {
		for i := range 400 {
			acts[db] = append(acts[db], actIn(fmt.Sprintf("%s-r%d-%d", pre, db, i), db*10, db*10+9))
		}
	}
	// Every 6 deposits: 3 to db_03, 2 to db_04, and one to db_70 or db_80.
	pattern := []int{3, 4, 3, 70, 4, 3, 3, 4, 3, 80, 4, 3}
	hc := &http.Client{Timeout: 10 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(2 * time.Minute)
			for i := 0; i < 20_000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				db := pattern[(w*len(pattern)/4+i)%len(pattern)]
				act := acts[db][(i/len(pattern)*4+w)%len(acts[db])]
				a := drillCall(hc, c.routerURL(), "POST", "/v1/accounts/"+act+"/deposit",
					map[string]any{"amount": 1, "order_no": fmt.Sprintf("%s-%d-%d", pre, w, i)}, nil, func(s int) bool { return s == 200 })
				mu.Lock()
				codes[a.code]++
				mu.Unlock()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(time.Second) // the load runs before the window opens
	mu.Lock()
	if codes[""] == 0 {
		t.Fatalf("no deposit succeeded in the first second: %v", codes)
	}
	mu.Unlock()
	out, err := exec.Command(c.bin, "plan", "--cells", "2", "--config", c.config, "--rate-window", "5s", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("redcell plan --rate-window: %v\n%s", err, out)
	}
	t.Logf("redcell plan --cells 2 --rate-window 5s:\n%s", out)
	i := bytes.Index(out, []byte("\n{"))
	if i < 0 {
		t.Fatalf("no JSON plan in:\n%s", out)
	}
	var p bench.MovePlan
	if err := json.Unmarshal(out[i+1:], &p); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	t.Logf("deposits by answer (\"\": OK): %v", codes)
	if len(codes) != 1 {
		t.Errorf("deposits answered other than OK: %v", codes)
	}
	mu.Unlock()
	if !p.ByRate || len(p.Moves) != 1 || p.Moves[0] != (bench.Move{DB: 4, From: "cell-1", To: "cell-2"}) {
		t.Fatalf("plan by rates: %+v, want db_04 cell-1 → cell-2", p)
	}
	c1, c2 := p.Cells[0], p.Cells[1]
	if c1.RateBefore < 3*c2.RateBefore || c1.RateAfter > 1.5*c2.RateAfter || c2.RateAfter > 1.5*c1.RateAfter {
		t.Fatalf("rates: cell-1 %.1f → %.1f, cell-2 %.1f → %.1f ops/s: not the load's 5:1 evened out", c1.RateBefore, c1.RateAfter, c2.RateBefore, c2.RateAfter)
	}
	if !strings.Contains(string(out), "hottest: db_03 ") {
		t.Errorf("the plan does not name db_03 as the hottest database:\n%s", out)
	}
	count, err := exec.Command(c.bin, "plan", "--cells", "2", "--config", c.config, "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(count), "databases to move: 0 of 100") {
		t.Fatalf("redcell plan by count: %v\n%s", err, count)
	}
}
