package sharding

import (
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"redcell/model"
)

// Golden routing vectors. If one of these changes, every account moves to
// another shard and its money with it: CI must fail loudly.
var golden = []struct {
	act   string
	shard model.ShardID
}{
	{"u1", 663},
	{"u2", 851},
	{"alice", 289},
	{"bob", 27},
	{"act-000001", 591},
	{"x", 299},
	{"ZZZ_top-9", 317},
	{"sender-42", 925},
}

func TestGoldenShards(t *testing.T) {
	// The published XXH64 of the empty input with seed 0.
	if got := xxhash.Sum64String(""); got != 0xef46db3751d8e999 {
		t.Fatalf("xxhash64(\"\") = %#x: the hash function changed", got)
	}
	for _, g := range golden {
		if got := ShardOfAct(g.act); got != g.shard {
			t.Errorf("ShardOfAct(%q) = %d, golden %d", g.act, got, g.shard)
		}
	}
	// A budget's home: "budget/"+key hashed as an actID (golden too: a change
	// moves every scene's budget rows away from their leases).
	if got := BudgetShard("cny2027/official/rain-1"); got != 226 || got != ShardOfAct("budget/cny2027/official/rain-1") {
		t.Errorf("BudgetShard(cny2027/official/rain-1) = %d, golden 226", got)
	}
	if s := model.ShardID(663); s.DB() != 66 || s.Table() != 3 {
		t.Fatalf("shard 663 -> db %d table %d", s.DB(), s.Table())
	}
}

func TestShardSpread(t *testing.T) {
	counts := make([]int, model.ShardCount)
	for i := 0; i < 100000; i++ {
		counts[ShardOfAct("user-"+itoa(i))]++
	}
	for s, n := range counts {
		if n < 50 || n > 160 { // mean 100
			t.Fatalf("shard %d got %d of 100000 keys", s, n)
		}
	}
}

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		i /= 10
		if i == 0 {
			return string(b)
		}
	}
}

func TestParseRanges(t *testing.T) {
	r, err := ParseRanges("500-999, 0-9,42")
	if err != nil {
		t.Fatal(err)
	}
	if r.String() != "0-9,42,500-999" || !r.Contains(42) || r.Contains(41) || !r.Contains(999) || len(r.Shards()) != 511 {
		t.Fatalf("ranges %v", r)
	}
	for _, bad := range []string{"", "0-1000", "-1", "5-3", "0-10,10-20", "a-b", "1-2-3"} {
		if _, err := ParseRanges(bad); err == nil {
			t.Errorf("ParseRanges(%q) accepted", bad)
		}
	}
}

func TestMapOwnersAndConflicts(t *testing.T) {
	a, _ := ParseRanges("0-499")
	b, _ := ParseRanges("500-999")
	c, _ := ParseRanges("400-599")
	m, conflicts := NewMap([]Cell{{Name: "b", Addr: "B", Shards: b, Version: 1}, {Name: "a", Addr: "A", Shards: a, Version: 1}})
	if len(conflicts) != 0 || m.Uncovered() != 0 {
		t.Fatalf("conflicts %v uncovered %d", conflicts, m.Uncovered())
	}
	if o, _ := m.Owner(499); o.Name != "a" {
		t.Fatalf("owner of 499 %s", o.Name)
	}
	if o, _ := m.Owner(500); o.Name != "b" {
		t.Fatalf("owner of 500 %s", o.Name)
	}
	// A newer map version takes the contested shards.
	m, conflicts = NewMap([]Cell{{Name: "a", Shards: a, Version: 1}, {Name: "b", Shards: b, Version: 1}, {Name: "c", Shards: c, Version: 2}})
	if len(conflicts) != 200 || m.Version != 2 {
		t.Fatalf("%d conflicts, version %d", len(conflicts), m.Version)
	}
	if o, _ := m.Owner(450); o.Name != "c" {
		t.Fatalf("owner of 450 %s", o.Name)
	}
	m, _ = NewMap([]Cell{{Name: "a", Shards: a}})
	if _, ok := m.Owner(700); ok || m.Uncovered() != 500 {
		t.Fatal("a shard without a cell has an owner")
	}
	var nilMap *Map
	if _, ok := nilMap.Owner(1); ok {
		t.Fatal("nil map routes")
	}
}

func BenchmarkShardOfAct(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = ShardOfAct("act-000001")
	}
}

func BenchmarkMapOwner(b *testing.B) {
	a, _ := ParseRanges("0-499")
	c, _ := ParseRanges("500-999")
	m, _ := NewMap([]Cell{{Name: "a", Shards: a}, {Name: "b", Shards: c}})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, _ = m.Owner(ShardOfAct("act-000001"))
	}
}

func TestGroupByOwner(t *testing.T) {
	a, _ := ParseRanges("0-299")
	b, _ := ParseRanges("300-599")
	c, _ := ParseRanges("600-899") // 900-999: no owner
	// Announced out of name order: the groups come in name order all the same.
	m, _ := NewMap([]Cell{{Name: "c", Addr: "C", Shards: c}, {Name: "a", Addr: "A", Shards: a}, {Name: "b", Addr: "B", Shards: b}})
	cr := func(id string, s model.ShardID) model.Credit {
		return model.Credit{ClaimID: id, Shard: s, Amount: model.Cents(len(id))}
	}
	in := []model.Credit{cr("c1", 700), cr("a1", 5), cr("x1", 950), cr("b1", 300), cr("c2", 899), cr("a2", 299), cr("x2", 999), cr("c3", 600)}
	// The caller is cell "a" but also credits shard 950 itself (it owns it by
	// its own config while the map says no one does): owns wins.
	ownsA := func(s model.ShardID) bool { return a.Contains(s) || s == 950 }
	local, remote, noOwner := m.GroupByOwner(in, ownsA)
	ids := func(cs []model.Credit) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ClaimID)
		}
		return strings.Join(out, ",")
	}
	if got := ids(local); got != "a1,x1,a2" {
		t.Fatalf("local %s, want a1,x1,a2", got)
	}
	if noOwner != 1 {
		t.Fatalf("noOwner %d, want 1 (x2)", noOwner)
	}
	var got []string
	for _, g := range remote {
		got = append(got, g.Cell.Name+"@"+g.Cell.Addr+":"+ids(g.Credits))
	}
	if want := "b@B:b1 c@C:c1,c2,c3"; strings.Join(got, " ") != want {
		t.Fatalf("remote %q, want %q", strings.Join(got, " "), want)
	}

	// Without owns nothing is local: cell a's credits go to a through the map.
	local, remote, noOwner = m.GroupByOwner(in, nil)
	if len(local) != 0 || noOwner != 2 || len(remote) != 3 || remote[0].Cell.Name != "a" || ids(remote[0].Credits) != "a1,a2" {
		t.Fatalf("nil owns: local %d noOwner %d remote %+v", len(local), noOwner, remote)
	}
	// A nil map owns nothing; an invalid shard has no owner.
	var nilMap *Map
	local, remote, noOwner = nilMap.GroupByOwner(append(in, cr("bad", model.ShardCount)), ownsA)
	if ids(local) != "a1,x1,a2" || len(remote) != 0 || noOwner != 6 {
		t.Fatalf("nil map: local %s remote %d noOwner %d", ids(local), len(remote), noOwner)
	}
	if l, r, n := m.GroupByOwner(nil, ownsA); l != nil || r != nil || n != 0 {
		t.Fatalf("no credits: %v %v %d", l, r, n)
	}
}

// TestWholeDBs: a cell's ranges cover whole databases of ten shards, and
// RangesOfDBs writes databases back as merged ranges.
func TestWholeDBs(t *testing.T) {
	for _, ok := range []string{"0-999", "0-499", "500-999", "0-9", "990-999", "0-9,20-29,500-999"} {
		r, err := ParseRanges(ok)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CheckWholeDBs(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, names := range map[string]string{"0-4": "0-4", "0-332": "0-332", "5-9": "5-9", "0-9,25-39": "25-39", "7": "7", "0-498": "e.g. 0-499"} {
		r, err := ParseRanges(bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CheckWholeDBs(); err == nil || !strings.Contains(err.Error(), names) {
			t.Errorf("%q: %v, want an error naming %q", bad, err, names)
		}
	}
	r, err := RangesOfDBs([]int{5, 0, 1, 1, 99, 6, 98})
	if err != nil || r.String() != "0-19,50-69,980-999" || r.CheckWholeDBs() != nil {
		t.Errorf("RangesOfDBs = %v, %v", r, err)
	}
	if dbs := r.DBs(); len(dbs) != 6 || dbs[0] != 0 || dbs[5] != 99 {
		t.Errorf("DBs of %v = %v", r, dbs)
	}
	for _, bad := range [][]int{{-1}, {100}} {
		if _, err := RangesOfDBs(bad); err == nil {
			t.Errorf("RangesOfDBs(%v) accepted", bad)
		}
	}
	if r, err := RangesOfDBs(nil); err != nil || len(r) != 0 {
		t.Errorf("RangesOfDBs(nil) = %v, %v", r, err)
	}
}
