// Package sharding is redcell's pure routing: a key (an actID or a packet ID)
// goes to a logical shard, and a shard goes to the cell that owns it through an
// immutable, versioned Map.
package sharding

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"

	"redcell/internal/invariant"
	"redcell/model"
)

// ShardOfAct returns xxhash64(actID) % 1000, the shard of an account.
// actID must already be validated (model.ValidateActID).
func ShardOfAct(actID string) model.ShardID {
	return model.ShardID(xxhash.Sum64String(actID) % model.ShardCount)
}

// ShardOfIdentity is the home shard of an app account's identity binding
// (app, appUserID): the pair hashed like an actID, "app/app_user_id" (neither
// holds '/'), so the binding lives in a db_XX like everything keyed by a
// person.
func ShardOfIdentity(app, appUserID string) model.ShardID {
	return ShardOfAct(app + "/" + appUserID)
}

// BudgetShard is the home shard of a reward scene's budget (key from
// model.BudgetKey): "budget/"+key hashed like an actID, so the budget row and
// its leases live in a db_XX like everything else, and every cell finds the
// home from the key alone.
func BudgetShard(key string) model.ShardID {
	return ShardOfAct("budget/" + key)
}

// Range is an inclusive range of shards.
type Range struct{ From, To model.ShardID }

// Ranges is a set of shards written as inclusive ranges, e.g. "0-499,700-799".
type Ranges []Range

// ParseRanges parses "a-b,c,d-e". Every shard must be in 0..999 and ranges must
// not overlap. Errors name the bad part.
func ParseRanges(s string) (Ranges, error) {
	var out Ranges
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.Atoi(strings.TrimSpace(lo))
		b, err2 := strconv.Atoi(strings.TrimSpace(hi))
		if err1 != nil || err2 != nil || a > b || !model.ShardID(a).Valid() || !model.ShardID(b).Valid() {
			return nil, fmt.Errorf("sharding: bad shard range %q", part)
		}
		out = append(out, Range{model.ShardID(a), model.ShardID(b)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sharding: empty shard ranges %q", s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].From < out[j].From })
	for i := 1; i < len(out); i++ {
		if out[i].From <= out[i-1].To {
			return nil, fmt.Errorf("sharding: overlapping shard ranges %q", s)
		}
	}
	return out, nil
}

// Contains reports whether s is in one of the ranges.
func (r Ranges) Contains(s model.ShardID) bool {
	for _, x := range r {
		if s >= x.From && s <= x.To {
			return true
		}
	}
	return false
}

// Shards lists every shard in the ranges, ascending.
func (r Ranges) Shards() []model.ShardID {
	var out []model.ShardID
	for _, x := range r {
		for s := x.From; s <= x.To; s++ {
			out = append(out, s)
		}
	}
	return out
}

// String writes the ranges back in ParseRanges form.
func (r Ranges) String() string {
	parts := make([]string, len(r))
	for i, x := range r {
		if x.From == x.To {
			parts[i] = strconv.Itoa(int(x.From))
		} else {
			parts[i] = fmt.Sprintf("%d-%d", x.From, x.To)
		}
	}
	return strings.Join(parts, ",")
}

// Cell is one cell as the routing table sees it.
type Cell struct {
	Name    string // cell name, e.g. "cell-1"; unique in a Map
	Addr    string // HTTP host:port
	Shards  Ranges
	Version int64 // version of the shard map this cell announces
	// Started is when the process serving the cell joined the cluster, Unix ms
	// (0: not announced). A cell restarted is the same cell with a later
	// Started; sharding/membership keeps the latest process of each name.
	Started int64
}

// Map is an immutable shard → cell table. The zero Map routes nothing.
type Map struct {
	Version int64
	owner   [model.ShardCount]int16 // index into cells, -1 = none
	cells   []Cell
}

// NewMap builds a Map from the cells' announcements, one per cell name (the
// caller picks one process per name). When two cells claim one shard, the
// higher Version wins and ties go to the smaller name, so every router builds
// the same Map from the same announcements; conflicts are returned as
// descriptions for logging.
func NewMap(cells []Cell) (*Map, []string) {
	sorted := append([]Cell(nil), cells...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	m := &Map{cells: sorted}
	for i := range m.owner {
		m.owner[i] = -1
	}
	var conflicts []string
	for ci, c := range sorted {
		if c.Version > m.Version {
			m.Version = c.Version
		}
		for _, s := range c.Shards.Shards() {
			prev := m.owner[s]
			if prev >= 0 {
				p := sorted[prev]
				conflicts = append(conflicts, fmt.Sprintf("shard %d claimed by %s (v%d) and %s (v%d)", s, p.Name, p.Version, c.Name, c.Version))
				if p.Version >= c.Version {
					continue
				}
			}
			m.owner[s] = int16(ci)
		}
	}
	return m, conflicts
}

// Owner returns the cell that owns shard s, or false if no live cell does.
func (m *Map) Owner(s model.ShardID) (Cell, bool) {
	if m == nil || !s.Valid() || m.owner[s] < 0 {
		return Cell{}, false
	}
	return m.cells[m.owner[s]], true
}

// Cells returns the cells in the map, sorted by name.
func (m *Map) Cells() []Cell {
	if m == nil {
		return nil
	}
	return append([]Cell(nil), m.cells...)
}

// Uncovered counts shards no cell owns.
func (m *Map) Uncovered() int {
	n := 0
	for _, o := range m.owner {
		if o < 0 {
			n++
		}
	}
	return n
}

// Group is the credits bound for one cell: those whose claimants' shards Cell
// owns.
type Group struct {
	Cell    Cell
	Credits []model.Credit
}

// GroupByOwner splits credits by the cell that holds each claimant's wallet
// (Credit.Shard): local gets those whose shard owns reports (the caller's own
// cell, credited there whatever the map says; a nil owns reports none), remote
// the others grouped by the cell that owns their shard in m, one Group per cell
// in the order of Cells (by name), and noOwner counts those whose shard no live
// cell owns (a nil m owns none). Each credit lands in exactly one of the three;
// every group keeps the credits' order. It reads no clock and iterates no map,
// so the same input gives the same groups in the same order.
func (m *Map) GroupByOwner(credits []model.Credit, owns func(model.ShardID) bool) (local []model.Credit, remote []Group, noOwner int) {
	var byCell [][]model.Credit // index into m.cells
	for _, c := range credits {
		if owns != nil && owns(c.Shard) {
			local = append(local, c)
			continue
		}
		if m == nil || !c.Shard.Valid() || m.owner[c.Shard] < 0 {
			noOwner++
			continue
		}
		if byCell == nil {
			byCell = make([][]model.Credit, len(m.cells))
		}
		i := m.owner[c.Shard]
		byCell[i] = append(byCell[i], c)
	}
	for i, cs := range byCell {
		if len(cs) > 0 {
			remote = append(remote, Group{Cell: m.cells[i], Credits: cs})
		}
	}
	invariant.That(len(local)+noOwner+groupsLen(remote) == len(credits), "sharding: GroupByOwner lost or made credits")
	return local, remote, noOwner
}

func groupsLen(gs []Group) int {
	n := 0
	for _, g := range gs {
		n += len(g.Credits)
	}
	return n
}
