package cell_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"redcell/api"
	"redcell/cell"
	"redcell/cell/admission"
	"redcell/cell/guard"
	"redcell/sharding"
	"redcell/storage/memstore"
)

// TestActivitiesReload: a cell loads its activities file when it starts and
// shows it on the admin port; a reload with an invalid file is 400
// INVALID_ARGUMENT listing the problems and the loaded tree stays; a valid
// edit is taken without a restart.
func TestActivitiesReload(t *testing.T) {
	ref, err := os.ReadFile("../deploy/local/activities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "activities.yaml")
	write := func(b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(ref)
	const token = "activities-admin-token"
	c := oneCell(t, func(cfg *cell.Config) { cfg.AdminListen, cfg.AdminToken, cfg.Activities = freeAddr(t), token, path })
	waitFor(t, 5*time.Second, func() bool { _, err := http.Get(c.adminURL + "/metrics"); return err == nil }, "admin port up")
	get := func(method, route string) (int, string, api.ActivitiesResponse) {
		t.Helper()
		var out api.ActivitiesResponse
		st, code := exchange(t, newRequest(map[string]string{"Authorization": "Bearer " + token}, method, c.adminURL+route, nil), &out)
		return st, code, out
	}
	st, _, first := get("GET", "/admin/activities")
	if st != 200 || !first.Loaded || first.Path != path || len(first.Version) != 12 || len(first.Parents) != 1 ||
		first.Parents[0].ID != "demo-festival" || first.Parents[0].Children[0].Stage != "official" ||
		strings.Join(first.Parents[0].Children[0].Scenes, ",") != "rain,card" {
		t.Fatalf("loaded at start: %d %+v", st, first)
	}

	write([]byte(strings.Replace(string(ref), "stage: official", "stage: prod", 1)))
	var e api.ErrorBody
	req := newRequest(map[string]string{"Authorization": "Bearer " + token}, "POST", c.adminURL+"/admin/activities/reload", nil)
	resp, err := roundTrip(t, req)
	if err != nil || resp.StatusCode() != 400 || json.Unmarshal(resp.Body(), &e) != nil || e.Error.Code != "INVALID_ARGUMENT" ||
		!strings.Contains(e.Error.Message, `unknown stage "prod"`) || !strings.Contains(e.Error.Message, "the loaded activities stay") {
		t.Fatalf("reload of an invalid file: %v %d %s", err, resp.StatusCode(), resp.Body())
	}
	if _, _, now := get("GET", "/admin/activities"); now.Version != first.Version {
		t.Errorf("after the refused reload: version %s, want %s still", now.Version, first.Version)
	}

	write([]byte(strings.Replace(string(ref), "max: 888", "max: 666", 1)))
	st, code, second := get("POST", "/admin/activities/reload")
	if st != 200 || second.Version == first.Version || second.LoadedMS < first.LoadedMS {
		t.Fatalf("reload of a valid edit: %d %s %+v", st, code, second)
	}
	if _, _, now := get("GET", "/admin/activities"); now.Version != second.Version {
		t.Errorf("after the reload: version %s, want %s", now.Version, second.Version)
	}
}

// TestActivitiesInvalidAtStart: a cell whose activities file is invalid is
// not built (so it never joins the cluster): New answers why.
func TestActivitiesInvalidAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "activities.yaml")
	if err := os.WriteFile(path, []byte("activities: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := cell.DefaultConfig()
	cfg.Name, cfg.Listen, cfg.DSN, cfg.ClusterSecret, cfg.Activities = "bad", "127.0.0.1:0", "unused", testSecret, path
	cfg.Shards, _ = sharding.ParseRanges("0-999")
	reg, log := prometheus.NewRegistry(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	mcBreak, err := guard.NewBreaker("memcached", guard.DefaultConfig(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	mc := guard.NewMemcache(admission.NewClient([]string{"127.0.0.1:1"}), mcBreak) // never reached: Serve stops first
	_, err = cell.New(cfg, cell.Stores{Real: memstore.New(nil), Shadow: memstore.New(nil)}, admission.NewSlots(mc, cfg.TxPerPacket, log),
		admission.NewCache(mc, log), nil, reg, log)
	if err == nil || !strings.Contains(err.Error(), "activities: no activity") {
		t.Fatalf("a cell with an invalid activities file: %v", err)
	}
}
