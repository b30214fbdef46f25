package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/api"
	"redcell/model"
)

// The coupon drills of docs/operations.md: a coupon drop through the router
// (fresh persons and a pool of repeat ones, four batches: a hot one, one
// with a limit of two, two of one group; one request in ten on the green
// channel) while the layers run slower than the accepts (the drill cells'
// coupon_rates), so that both queues are full when the fault comes:
//
//   - coupon_cell_kill: cell-1 killed with SIGKILL and started again;
//   - coupon_cell_term: cell-2 stopped with SIGTERM (it releases what it
//     queued) and started again;
//   - coupon_memcached_stop: memcached stopped: the layers' cluster-wide
//     limiters fall back to rate/N;
//   - coupon_sold_out: the hot batch's stock runs out mid-drop.
//
// Afterwards every request is sent again under its serial until answered,
// and polled until final:
//
//   - every serial accepted is issued or refused with a reason (none lost);
//   - a repeat answers the same state as the poll;
//   - redcell audit is clean: per batch issued + left + written off = stock,
//     nobody over a limit or holding two batches of a group, every issued
//     request with its coupon and none without, no request left open.

// drillCouponRates slows both layers below the drill's accept rate.
const drillCouponRates = "  coupon_rates: [300, 300]\n  coupon_stale_after: 31s\n"

// drillLayerRate is the layers' rate drillCouponRates sets, per second, for
// the whole cluster: what a drop's backlog drains at.
const drillLayerRate = 300

// couponRec is one coupon request and the first answer.
type couponRec struct {
	body  api.CouponIssueRequest
	first answer
	state api.CouponRequestState
}

// couponLoad is one coupon drill's client.
type couponLoad struct {
	c       *cluster
	hc      *http.Client
	prefix  string
	batches []string // hot, two, ga, gb
	mu      sync.Mutex
	recs    []*couponRec
	seq     atomic.Int64
}

// couponDrillBatches is the drill's batches, appended to the cells' file:
// hotStock for the hot batch.
func couponDrillBatches(p string, hotStock int) string {
	return fmt.Sprintf(`  - {id: %[1]s-hot, stock: %[2]d, face_value: 100, per_person_limit: 1}
  - {id: %[1]s-two, stock: 1000000, face_value: 100, per_person_limit: 2}
  - {id: %[1]s-ga, stock: 1000000, face_value: 100, per_person_limit: 1, group: %[1]s-g}
  - {id: %[1]s-gb, stock: 1000000, face_value: 100, per_person_limit: 1, group: %[1]s-g}
`, p, hotStock)
}

// addCouponBatches appends batches to the cells' file and reloads it on
// both cells.
func (c *cluster) addCouponBatches(t *testing.T, batches string) {
	t.Helper()
	file := filepath.Join(filepath.Dir(c.config), "coupons.yaml")
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(batches); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, cell := range []string{"cell-1", "cell-2"} {
		c.admin(t, cell, "POST", "/admin/coupons/reload", "")
	}
}

// call sends one coupon request: 200 and 202 are answers (ok); out
// receives the state.
func (l *couponLoad) call(method, path string, body any, out *api.CouponRequestState) answer {
	return drillCall(l.hc, l.c.routerURL(), method, path, body, out, func(status int) bool { return status == 200 || status == 202 })
}

// issue sends request k: a fresh person two times in three, else one of a
// pool of 40 (who meet the limits and the group).
func (l *couponLoad) issue(rng *rand.Rand, hotShare int) {
	k := l.seq.Add(1)
	act := fmt.Sprintf("%s-f%d", l.prefix, k)
	if rng.IntN(3) == 0 {
		act = fmt.Sprintf("%s-r%d", l.prefix, rng.IntN(40))
	}
	batch := l.batches[0]
	if rng.IntN(100) >= hotShare {
		batch = l.batches[1+rng.IntN(3)]
	}
	r := &couponRec{body: api.CouponIssueRequest{ActID: act, BatchID: batch, SerialNo: fmt.Sprintf("%s-s%d", l.prefix, k), Green: rng.IntN(10) == 0}}
	r.first = l.call("POST", api.CouponIssuePath, r.body, &r.state)
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
	if r.first.status == 0 {
		time.Sleep(10 * time.Millisecond) // no answer: back off a little, as an app would
	}
}

// run drives the load until stop is closed or d passes, at most maxOps.
func (l *couponLoad) run(workers int, stop <-chan struct{}, d time.Duration, maxOps int64, hotShare int) {
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for time.Now().Before(deadline) && l.seq.Load() < maxOps {
				select {
				case <-stop:
					return
				default:
				}
				l.issue(rng, hotShare)
			}
		})
	}
	wg.Wait()
}

// settle sends every request whose first answer was not final again under
// its serial, then polls each until final (for at most wait), and checks
// what the states say. It returns the counts by final state and reason.
func (l *couponLoad) settle(t *testing.T, wait time.Duration) map[string]int {
	t.Helper()
	deadline := time.Now().Add(wait)
	var pending []*couponRec
	for _, r := range l.recs {
		switch {
		case r.first.status == 200:
			pending = append(pending, r)
		case r.first.code == "INVALID_ARGUMENT" || r.first.code == "ORDER_CONFLICT" || r.first.code == "NOT_FOUND":
			t.Errorf("request %+v refused %s", r.body, r.first.code)
		default: // unknown or refused for now: sent again, a repeat at worst
			for {
				a := l.call("POST", api.CouponIssuePath, r.body, &r.state)
				if a.status == 200 {
					pending = append(pending, r)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("request %+v still unanswered: %+v", r.body, a)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	counts := map[string]int{}
	var mu sync.Mutex
	parallel(16, func(i int) {
		for j := i; j < len(pending); j += 16 {
			r := pending[j]
			for r.state.State != "issued" && r.state.State != "refused" {
				var st api.CouponRequestState
				a := l.call("GET", api.CouponStatePath(r.body.SerialNo, r.body.ActID), nil, &st)
				if a.status == 200 {
					r.state = st
					continue
				}
				if time.Now().After(deadline) {
					t.Errorf("serial %s still %q after %s (last answer %+v): lost", r.body.SerialNo, r.state.State, wait, a)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			if r.state.State == "refused" && r.state.Reason == "" || r.state.State == "issued" && r.state.CouponID == "" ||
				r.state.SerialNo != r.body.SerialNo || r.state.ActID != r.body.ActID || r.state.BatchID != r.body.BatchID {
				t.Errorf("serial %s: final state %+v for request %+v", r.body.SerialNo, r.state, r.body)
			}
			key := r.state.State
			if r.state.Reason != "" {
				key += ":" + r.state.Reason
			}
			mu.Lock()
			counts[key]++
			mu.Unlock()
		}
	})
	// A repeat of a final request answers its stored state. The router's
	// per-person limit counts a repeat like any request (it cannot know it
	// is one), so the repeat persons' answers may be 429 for a moment: a
	// client waits and sends again.
	for _, r := range pending[:min(len(pending), 50)] {
		var again api.CouponRequestState
		a := l.call("POST", api.CouponIssuePath, r.body, &again)
		for a.status == 429 && a.code == "USER_RATE_LIMITED" && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			a = l.call("POST", api.CouponIssuePath, r.body, &again)
		}
		if a.status != 200 || again.State != r.state.State || again.CouponID != r.state.CouponID {
			t.Errorf("repeat of %s answered %+v %+v, the poll saw %+v", r.body.SerialNo, a, again, r.state)
		}
	}
	return counts
}

// couponDrill runs one coupon drill: the load, the fault a third of the
// way in, the settle and the audit.
func couponDrill(t *testing.T, c *cluster, d *drillDeps, full bool, hotStock, hotShare int,
	fault func(t *testing.T, c *cluster, d *drillDeps, window time.Duration)) (counts map[string]int, hot model.CouponBatchLine) {
	loadFor, workers, maxOps := 4500*time.Millisecond, 8, int64(4_000)
	if full {
		loadFor, workers, maxOps = 30*time.Second, 24, 200_000
	}
	p := "cd" + randHex()
	c.addCouponBatches(t, couponDrillBatches(p, hotStock))
	l := &couponLoad{c: c, prefix: p, batches: []string{p + "-hot", p + "-two", p + "-ga", p + "-gb"},
		hc: &http.Client{Timeout: 10 * time.Second, Transport: specTransport{next: &http.Transport{MaxIdleConnsPerHost: 256}}}}
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.run(workers, stop, 10*loadFor, maxOps, hotShare) }()
	time.Sleep(loadFor / 3)
	// The fault comes once requests are queued: the queues' depth is sampled
	// every 25 ms until one finds requests queued, for up to 5 s while the
	// load goes on (the layers empty a queue between their takes, and six
	// samples 50 ms apart once missed every full one on a busy machine).
	var q float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(25 * time.Millisecond) {
		if q = c.metric(t, "cell-1", "redcell_coupon_queue_depth") + c.metric(t, "cell-2", "redcell_coupon_queue_depth"); q > 0 || time.Now().After(deadline) {
			break
		}
	}
	fault(t, c, d, loadFor/3)
	time.Sleep(loadFor / 3)
	close(stop)
	<-done
	if t.Failed() {
		return nil, hot
	}
	c.waitReady(t, 0)
	// Everything accepted is decided at the layers' rate: a long drop's
	// backlog needs its time (half as much again, for the fault's
	// re-drives), never less than 90 s.
	counts = l.settle(t, max(90*time.Second, time.Duration(len(l.recs))*time.Second*3/2/drillLayerRate))
	rep := c.audit(t)
	if !rep.OK() || rep.Coupons.Open != 0 {
		t.Fatalf("audit after the drill: problems %v, %d coupon requests open; rows that break a rule:\n%s", rep.Problems, rep.Coupons.Open,
			oddCouponRows(t, c))
	}
	for _, b := range rep.Coupons.Batches {
		if b.Batch == p+"-hot" {
			hot = b
		}
		if strings.HasPrefix(b.Batch, p) {
			t.Logf("batch %s: stock %d = issued %d + left %d + written off %d", b.Batch, b.Stock, b.Issued, b.Left, b.WrittenOff)
		}
	}
	t.Logf("%d requests (queues held %v when the fault came); final states %v", len(l.recs), q, counts)
	// With a stock far above the drop, a fault never makes a request sold
	// out; short, the repeat persons stay below the risk caps (60 a minute),
	// so a request decided again after a fault is never counted twice.
	if hotStock > len(l.recs) && counts["refused:SOLD_OUT"] > 0 {
		t.Errorf("%d requests refused SOLD_OUT with stock left", counts["refused:SOLD_OUT"])
	}
	if !full && counts["refused:RISK"] > 0 {
		t.Errorf("%d requests refused RISK below the caps", counts["refused:RISK"])
	}
	if q == 0 {
		t.Errorf("the queues were empty when the fault came: the drill did not test full queues")
	}
	return counts, hot
}

// couponDrills are the coupon subtests of TestDrill.
func couponDrills(t *testing.T, c *cluster, deps *drillDeps, full bool) {
	cell1Act := actIn("probe-a", 0, 499)
	t.Run("coupon_cell_kill", func(t *testing.T) {
		couponDrill(t, c, deps, full, 1_000_000, 40, func(t *testing.T, c *cluster, d *drillDeps, window time.Duration) {
			before := routerSees(t, c, "cell-1")
			c.kill(t, "cell-1")
			time.Sleep(window / 4)
			ready, serves := restartServes(t, c, "cell-1", cell1Act, before)
			t.Logf("cell-1 killed with SIGKILL with its queues full, started again: ready %s, served %s after that", ready, serves)
		})
	})
	if t.Failed() {
		return
	}
	t.Run("coupon_cell_term", func(t *testing.T) {
		couponDrill(t, c, deps, full, 1_000_000, 40, func(t *testing.T, c *cluster, d *drillDeps, window time.Duration) {
			before := routerSees(t, c, "cell-2")
			start := time.Now()
			c.stop(t, "cell-2")
			stopped := time.Since(start)
			ready, serves := restartServes(t, c, "cell-2", actIn("probe-b", 500, 999), before)
			t.Logf("cell-2 stopped with SIGTERM with its queues full in %s, started again: ready %s, served %s after that",
				stopped.Round(time.Millisecond), ready, serves)
		})
	})
	if t.Failed() {
		return
	}
	t.Run("coupon_memcached_stop", func(t *testing.T) {
		couponDrill(t, c, deps, full, 1_000_000, 40, func(t *testing.T, c *cluster, d *drillDeps, window time.Duration) {
			before := c.metric(t, "cell-1", "redcell_coupon_limiter_fallbacks_total") + c.metric(t, "cell-2", "redcell_coupon_limiter_fallbacks_total")
			d.stopMemcached(t)
			time.Sleep(window)
			after := c.metric(t, "cell-1", "redcell_coupon_limiter_fallbacks_total") + c.metric(t, "cell-2", "redcell_coupon_limiter_fallbacks_total")
			d.startMemcached(t)
			if after <= before {
				t.Errorf("memcached down for %s: the coupon limiters never fell back (%v → %v)", window, before, after)
			}
			t.Logf("memcached down for %s: the coupon layers' limiters fell back to rate/N %v times", window, after-before)
		})
	})
	if t.Failed() {
		return
	}
	t.Run("coupon_sold_out", func(t *testing.T) {
		const stock = 300
		counts, hot := couponDrill(t, c, deps, full, stock, 70, func(t *testing.T, c *cluster, d *drillDeps, window time.Duration) {
			time.Sleep(window) // the fault is the stock running out
		})
		// Sold out: nothing left, and at most one merge's worth written off
		// (a deduction whose units no request could take is given back).
		if counts["refused:SOLD_OUT"] == 0 || hot.Left != 0 || hot.Issued+hot.WrittenOff != stock || hot.WrittenOff > 64 {
			t.Errorf("the hot batch of %d did not sell out cleanly: %+v, final states %v", stock, hot, counts)
		}
	})
}

// oddCouponRows lists, from both cells' databases, the requests holding a
// coupon ID without being issued and the issued requests without one: what
// a failed coupon audit is about.
func oddCouponRows(t *testing.T, c *cluster) string {
	var b strings.Builder
	for _, dsn := range c.spec.dsn {
		db := openDB(t, dsn)
		for d := range 100 {
			var n int
			if db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = 't_coupon_req'", fmt.Sprintf("db_%02d", d)).Scan(&n); n == 0 {
				continue
			}
			for _, q := range []string{
				"SELECT CONCAT_WS(' ', 'request', r.serial_no, r.act_id, r.batch_id, r.state, r.reason, r.coupon_id, r.lease_id, " +
					"r.accepted_ms, r.taken_ms, r.decided_ms) FROM db_%02d.t_coupon_req r " +
					"WHERE (r.state = 'issued') <> (r.coupon_id <> '')",
			} {
				rows, err := db.Query(fmt.Sprintf(q, d))
				if err != nil {
					fmt.Fprintf(&b, "db_%02d: %v\n", d, err)
					continue
				}
				for rows.Next() {
					var line string
					_ = rows.Scan(&line)
					fmt.Fprintf(&b, "db_%02d: %s\n", d, line)
				}
				rows.Close()
			}
		}
	}
	return b.String()
}
