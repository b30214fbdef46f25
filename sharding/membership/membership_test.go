package membership

import (
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"redcell/sharding"
)

func proc(node, name string, started int64, addr string) member {
	r, _ := sharding.ParseRanges("0-499")
	return member{node: node, cell: sharding.Cell{Name: name, Addr: addr, Shards: r, Version: 1, Started: started}}
}

// TestNewest: of the processes announcing one cell name the one that started
// last is kept, equal stamps go to the greater node name, a process that
// announced no stamp (from before stamps existed) loses, and the answer does
// not depend on the order memberlist reported them in (Go maps iterate in a
// random order, so each case runs many times).
func TestNewest(t *testing.T) {
	for _, tc := range []struct {
		name       string
		members    []member
		keep       []string // node names kept, by cell name
		superseded []string // node names passed over, sorted
	}{
		{"one process per cell", []member{proc("cell-1#100-aa", "cell-1", 100, "a:1"), proc("cell-2#90-bb", "cell-2", 90, "b:1")},
			[]string{"cell-1#100-aa", "cell-2#90-bb"}, nil},
		{"a restart", []member{proc("cell-1#100-aa", "cell-1", 100, "a:1"), proc("cell-1#200-bb", "cell-1", 200, "a:2")},
			[]string{"cell-1#200-bb"}, []string{"cell-1#100-aa"}},
		{"three processes, one cell", []member{proc("cell-1#300-cc", "cell-1", 300, "a:3"), proc("cell-1#100-aa", "cell-1", 100, "a:1"),
			proc("cell-1#200-bb", "cell-1", 200, "a:2"), proc("cell-2#50-dd", "cell-2", 50, "b:1")},
			[]string{"cell-1#300-cc", "cell-2#50-dd"}, []string{"cell-1#100-aa", "cell-1#200-bb"}},
		{"same millisecond", []member{proc("cell-1#100-aa", "cell-1", 100, "a:1"), proc("cell-1#100-ff", "cell-1", 100, "a:2")},
			[]string{"cell-1#100-ff"}, []string{"cell-1#100-aa"}},
		{"no stamp loses", []member{proc("cell-1", "cell-1", 0, "a:1"), proc("cell-1#5-aa", "cell-1", 5, "a:2")},
			[]string{"cell-1#5-aa"}, []string{"cell-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 {
				in := map[string]member{}
				for _, m := range tc.members {
					in[m.node] = m
				}
				kept, superseded := newest(in)
				var gotKeep, gotSup []string
				for _, m := range kept {
					gotKeep = append(gotKeep, m.node)
				}
				for _, m := range superseded {
					gotSup = append(gotSup, m.node)
				}
				if !slices.Equal(gotKeep, tc.keep) || !slices.Equal(gotSup, tc.superseded) {
					t.Fatalf("kept %v, superseded %v; want %v, %v", gotKeep, gotSup, tc.keep, tc.superseded)
				}
			}
		})
	}
}

// TestSupersededDoesNotFlap drives a Node's event handlers as memberlist
// would: an earlier process of a cell that keeps announcing itself (changed
// metadata, repeated updates, a leave) never changes the published Map, and
// the later process's leave hands the cell back to the earlier one.
func TestSupersededDoesNotFlap(t *testing.T) {
	var published []*sharding.Map
	n := &Node{cfg: Config{Name: "router", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		onChange: func(m *sharding.Map) { published = append(published, m) }},
		node: "router#1-00", members: map[string]member{}, superseded: map[string]time.Time{}, changed: make(chan struct{})}
	ev := events{n}
	announce := func(node string, meta Meta) *memberlist.Node {
		b, _ := json.Marshal(meta)
		return &memberlist.Node{Name: node, Meta: b}
	}
	early := func(version int64) *memberlist.Node {
		return announce("cell-1#100-aa", Meta{Role: RoleCell, Name: "cell-1", Started: 100, Addr: "127.0.0.1:1", Shards: "0-499", Version: version})
	}
	late := announce("cell-1#200-bb", Meta{Role: RoleCell, Name: "cell-1", Started: 200, Addr: "127.0.0.1:2", Shards: "0-499", Version: 1})

	ev.NotifyJoin(early(1))
	ev.NotifyJoin(late)
	if len(published) != 2 {
		t.Fatalf("published %d maps after two joins, want 2", len(published))
	}
	for v := int64(1); v <= 5; v++ { // the earlier process keeps gossiping, even a new version
		ev.NotifyUpdate(early(v))
	}
	ev.NotifyUpdate(late) // the same announcement again
	ev.NotifyLeave(early(5))
	if len(published) != 2 {
		t.Fatalf("the earlier process's updates and leave published %d more maps", len(published)-2)
	}
	if c, _ := n.Map().Owner(0); c.Addr != "127.0.0.1:2" || c.Name != "cell-1" || c.Started != 200 {
		t.Fatalf("shard 0 goes to %+v, want the later process", c)
	}
	ev.NotifyJoin(early(1)) // back (it was not dead after all), then the later one leaves
	ev.NotifyLeave(late)
	if c, _ := n.Map().Owner(0); len(published) != 3 || c.Addr != "127.0.0.1:1" {
		t.Fatalf("after the later process left: %d maps, shard 0 goes to %+v; want the earlier process", len(published), c)
	}
	// A member from before names were announced is called by its node name.
	ev.NotifyJoin(announce("cell-9", Meta{Role: RoleCell, Addr: "127.0.0.1:9", Shards: "500-999", Version: 1}))
	if c, _ := n.Map().Owner(999); c.Name != "cell-9" || c.Started != 0 {
		t.Fatalf("shard 999 goes to %+v, want cell-9", c)
	}
}
