package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrepareShadow: the bench's first step makes, in each cell's shadow
// space on its own server, the shard tables of every shard the cell owns and
// their packet and claim tables of today and tomorrow, and a second call
// finds them made.
func TestPrepareShadow(t *testing.T) {
	config, dsn1, dsn2 := twoCellConfig(t, "970-979", "980-999")
	for round := range 2 {
		var out bytes.Buffer
		if err := prepareShadow(t.Context(), config, &out); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, out.String())
		}
		if !strings.Contains(out.String(), "cell-1 10/10 shards, cell-2 20/20 shards ready") {
			t.Errorf("round %d: output does not say every shard is ready:\n%s", round, out.String())
		}
	}
	now := time.Now().UTC()
	days := []int{now.Day(), now.Add(24 * time.Hour).Day()}
	for _, c := range []struct {
		dsn string
		dbs []int
	}{{dsn1, []int{97}}, {dsn2, []int{98, 99}}} {
		db := openDB(t, c.dsn)
		for _, d := range c.dbs {
			var want []string
			for tbl := range 10 {
				want = append(want, fmt.Sprintf("t_account_%d", tbl), fmt.Sprintf("t_flow_%d", tbl))
				for _, day := range days {
					want = append(want, fmt.Sprintf("t_packet_%d_%02d", tbl, day), fmt.Sprintf("t_claim_%d_%02d", tbl, day))
				}
			}
			have := map[string]bool{}
			rows, err := db.QueryContext(t.Context(), "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", fmt.Sprintf("shadow_db_%02d", d))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var name string
				if err := rows.Scan(&name); err != nil {
					t.Fatal(err)
				}
				have[name] = true
			}
			rows.Close()
			for _, w := range want {
				if !have[w] {
					t.Errorf("shadow_db_%02d on %s has no table %s", d, c.dsn, w)
				}
			}
		}
	}
}
