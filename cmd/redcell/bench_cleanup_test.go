package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"redcell/api"
)

// TestBenchCleanup: redcell bench --cleanup --config F runs alone (no API key
// or cluster secret needed) and asks every cell of F, with the admin token,
// to drop its shadow databases, printing what each dropped; a cell that fails
// does not stop the next, and makes the command fail. --cleanup needs
// --config; with a load flag it runs after the load.
func TestBenchCleanup(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "")
	t.Setenv("REDCELL_API_KEY", "")
	var calls atomic.Int64
	cellAt := func(answer api.ShadowCleanupResponse, status int) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || r.URL.Path != "/admin/shadow/cleanup" || r.Header.Get("Authorization") != "Bearer cleanup-admin-token-0123" {
				http.Error(w, "wrong call", http.StatusBadRequest)
				return
			}
			calls.Add(1)
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(answer)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return ln.Addr().String()
	}
	one := cellAt(api.ShadowCleanupResponse{Cell: "c1", Databases: []string{"shadow_db_00", "shadow_db_07"}, Tables: 23, Owned: 50, TookMS: 1200}, 200)
	two := cellAt(api.ShadowCleanupResponse{Cell: "c2", Databases: []string{}, Owned: 50}, 200)
	down := cellAt(api.ShadowCleanupResponse{}, http.StatusServiceUnavailable)
	write := func(adminAddrs ...string) string {
		var b strings.Builder
		b.WriteString("admin_token: cleanup-admin-token-0123\ncells:\n")
		for i, a := range adminAddrs {
			b.WriteString("  - {name: c" + string(rune('1'+i)) + ", listen: \"127.0.0.1:1\", shards: \"0-999\", dsn: \"root@tcp(127.0.0.1:3)/\", admin_listen: \"" + a + "\"}\n")
		}
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	path := write(one, two)
	f, err := parseBenchFlags([]string{"--cleanup", "--config", path})
	if err != nil || !f.cleanupOnly {
		t.Fatalf("--cleanup --config alone: %+v, %v", f, err)
	}
	var out bytes.Buffer
	if err := cleanShadowSpaces(t.Context(), path, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); calls.Load() != 2 || !strings.Contains(got, "c1: dropped 2 shadow databases of its 50, 23 tables, in 1.2s: shadow_db_00 shadow_db_07") ||
		!strings.Contains(got, "c2: nothing to drop") {
		t.Fatalf("%d calls, output:\n%s", calls.Load(), got)
	}

	out.Reset()
	if err := cleanShadowSpaces(t.Context(), write(down, one), &out); err == nil || calls.Load() != 4 || !strings.Contains(out.String(), "c1: shadow cleanup failed") ||
		!strings.Contains(out.String(), "c2: dropped 2") {
		t.Fatalf("a failing cell: %v, %d calls, output:\n%s", err, calls.Load(), out.String())
	}

	if _, err := parseBenchFlags([]string{"--cleanup"}); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("--cleanup without --config: %v", err)
	}
	if f, err := parseBenchFlags([]string{"--cleanup", "--config", path, "--workload", "hot"}); err == nil && f.cleanupOnly {
		t.Fatal("--cleanup with a workload ran alone")
	}
}
