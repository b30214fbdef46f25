package cell_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"redcell/api"
	"redcell/cell"
	"redcell/model"
	"redcell/sharding"
)

// stress marks a request as stress-test traffic (shadow tables).
var stress = map[string]string{api.HeaderStress: "1"}

const adminToken = "admin-test-token"

// client reads the admin port (bearer token, not signed calls).
var client = &http.Client{Timeout: 10 * time.Second}

// twoCells runs cell-a (shards 0-499, test database 1) and cell-b (500-999,
// database 2) that know each other.
func twoCells(t *testing.T, tune func(*cell.Config)) (a, b *testCell) {
	peers := &staticPeers{}
	a = startCell(t, "cell-a", "0-499", 1, peers, tune)
	b = startCell(t, "cell-b", "500-999", 2, peers, tune)
	peers.m.Store(pairMap(a, b, b.addr))
	if a.adminURL != "" {
		waitFor(t, 5*time.Second, func() bool { _, err := client.Get(a.adminURL + "/metrics"); return err == nil }, "admin port up")
	}
	return a, b
}

// twoCellsApart runs the cells of twoCells (untuned) with a shard map that
// puts cell-b's shards at a closed port: neither reaches cell-b (cell-a's
// relay holds what it owes it) until join gives them twoCells' map.
func twoCellsApart(t *testing.T) (a, b *testCell, join func()) {
	peers := &staticPeers{}
	a = startCell(t, "cell-a", "0-499", 1, peers, nil)
	b = startCell(t, "cell-b", "500-999", 2, peers, nil)
	peers.m.Store(pairMap(a, b, "127.0.0.1:1"))
	return a, b, func() { peers.m.Store(pairMap(a, b, b.addr)) }
}

// pairMap is the shard map of cells a and b, b reached at bAddr.
func pairMap(a, b *testCell, bAddr string) *sharding.Map {
	m, _ := sharding.NewMap([]sharding.Cell{{Name: a.name, Addr: a.addr, Shards: a.cfg.Shards}, {Name: b.name, Addr: bAddr, Shards: b.cfg.Shards}})
	return m
}

// callAdmin sends a request to a cell's admin port with the token.
func callAdmin(t *testing.T, c *testCell, method, path string, body, out any) (int, string) {
	t.Helper()
	return callH(t, map[string]string{"Authorization": "Bearer " + adminToken}, method, c.adminURL+path, body, out)
}

// adminAnswer sends a request with no body to c's admin port (callAdmin),
// fails the test unless c answers 200, and answers what it decoded.
func adminAnswer[T any](t *testing.T, c *testCell, method, path string) T {
	t.Helper()
	var out T
	if st, code := callAdmin(t, c, method, path, nil, &out); st != 200 {
		t.Fatalf("%s %s on %s: %d %s", method, path, c.name, st, code)
	}
	return out
}

// metric returns one series of a cell's /metrics as a number (0 when absent).
func metric(t *testing.T, c *testCell, series string) float64 {
	t.Helper()
	v, _ := strconv.ParseFloat(metricValue(t, scrape(t, c.adminURL), series), 64)
	return v
}

// openOne opens packet id for act (with the headers h) and returns the claim.
func openOne(t *testing.T, c *testCell, h map[string]string, id, act string) api.OpenResponse {
	t.Helper()
	var o api.OpenResponse
	if st, code := callH(t, h, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: act}, &o); st != 200 {
		t.Fatalf("open by %s: %d %s", act, st, code)
	}
	return o
}

// claimDest reads the dest of a claim's row in namespace ns ("" or a
// prefix, then "shadow_" for the stress space): the cell its credit was sent
// to or may have been applied at; "" when there is no row.
func claimDest(t *testing.T, db *sql.DB, ns, claimID string) string {
	t.Helper()
	ref, seq, err := model.ParseClaimID(claimID)
	if err != nil {
		t.Fatal(err)
	}
	var dest string
	db.QueryRow(fmt.Sprintf("SELECT dest FROM %sdb_%02d.t_claim_%d_%02d WHERE packet_id = ? AND seq = ?", ns, ref.Shard.DB(), ref.Shard.Table(), ref.Day),
		string(ref.ID), seq).Scan(&dest)
	return dest
}

// creditsPending reads c's redcell_cell_credits_pending of space ("real",
// "shadow"): the claims its relay holds, not yet known credited.
func creditsPending(t *testing.T, c *testCell, space string) float64 {
	t.Helper()
	return counter(t, c.reg, "redcell_cell_credits_pending", map[string]string{"space": space})
}

// exec runs a statement against a test database and fails the test on error.
func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// hasCredit reports whether act holds a credit flow for the claim (ns: "" or "shadow_").
func hasCredit(t *testing.T, db *sql.DB, ns, act, claimID string) bool {
	sh := sharding.ShardOfAct(act)
	var n int
	db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %sdb_%02d.t_flow_%d WHERE act_id = ? AND order_no = ?", ns, sh.DB(), sh.Table()), act, "claim:"+claimID).Scan(&n)
	return n == 1
}

// series finds one series of reg (labels name it; nil for none), or nil.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// counter reads one series of c's registry (labels name the series; nil for
// none), a counter or a gauge: the tests wait on the cell's own counts of
// what it did. 0 when there is no such series.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := series(t, reg, name, labels)
	switch {
	case m == nil:
		return 0
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// waitScans waits until c's relay of space ("real", "shadow") has finished n
// more passes than when it is called: at least n-1 of them began after the
// call, so whatever they could offer or read again they have handed to the
// lanes. The deadline is far above the usual 3-4 intervals: a pass that
// meets a dropped database or a loaded machine (-race, 2 cores) takes longer.
func waitScans(t *testing.T, c *testCell, space string, n int) {
	t.Helper()
	scans := func() float64 {
		return counter(t, c.reg, "redcell_cell_relay_scans_total", map[string]string{"space": space})
	}
	from := scans()
	waitFor(t, time.Duration(n+10)*c.cfg.RelayInterval+30*time.Second, func() bool { return scans() >= from+float64(n) },
		fmt.Sprintf("%d more relay passes of the %s space", n, space))
}
