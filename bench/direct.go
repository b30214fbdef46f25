package bench

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
)

// CellInfo is one cell as the router's GET /healthz lists it.
type CellInfo struct {
	Name   string `json:"name"`
	Addr   string `json:"addr"`   // host:port of the cell's public API
	Shards string `json:"shards"` // e.g. "0-499"
}

// routerHealth is the part of the router's /healthz answer the bench reads.
type routerHealth struct {
	Status    string     `json:"status"`
	Cells     []CellInfo `json:"cells"`
	Uncovered int        `json:"uncovered_shards"`
}

// discoverCells asks the router which cells own which shards. It is how direct
// mode and the no-op ceilings find the cells without reading the config.
func discoverCells(c *client) ([]CellInfo, int, error) {
	var h routerHealth
	if res := c.call(http.MethodGet, api.HealthPath, nil, &h); res.code != "" {
		return nil, 0, fmt.Errorf("bench: router /healthz: %s %s", res.code, res.message)
	}
	sort.Slice(h.Cells, func(i, j int) bool { return h.Cells[i].Name < h.Cells[j].Name })
	return h.Cells, h.Uncovered, nil
}

// cellTable maps every shard to the base URL of the cell that owns it, the
// router's routing rule done on the client: act_id -> sharding.ShardOfAct,
// packet ID -> its characters 8..10, send -> the sender's shard. It is
// read-only after newCellTable, so safe for concurrent use.
type cellTable struct {
	base [model.ShardCount]string // "" when no cell owns the shard
}

// newCellTable builds the table from the router's view of the cells.
func newCellTable(cells []CellInfo) (*cellTable, error) {
	t := &cellTable{}
	for _, c := range cells {
		r, err := sharding.ParseRanges(c.Shards)
		if err != nil {
			return nil, fmt.Errorf("bench: cell %s: %w", c.Name, err)
		}
		if c.Addr == "" {
			return nil, fmt.Errorf("bench: cell %s has no address", c.Name)
		}
		for _, s := range r.Shards() {
			t.base[s] = "http://" + c.Addr
		}
	}
	return t, nil
}

// baseFor returns the base URL for a request, or ok false when the request has
// no key the bench can route (then it goes nowhere) or no cell owns its shard.
func (t *cellTable) baseFor(method, path string, in any) (string, bool) {
	s, ok := shardOf(method, path, in)
	if !ok {
		return "", false
	}
	b := t.base[s]
	return b, b != ""
}

// shardOf finds the shard of a request the bench makes, as the router does:
// the route's key kind in api's table says where the key is.
func shardOf(method, path string, in any) (model.ShardID, bool) {
	parts, ok := api.PathSegments([]byte(path))
	if !ok {
		return 0, false
	}
	rt, p, err := api.MatchPublic(method, parts)
	if err != nil {
		return 0, false
	}
	switch rt.Key {
	case api.KeyActPath:
		return sharding.ShardOfAct(p.Key), true
	case api.KeySenderBody:
		req, ok := in.(api.SendRequest)
		if !ok {
			return 0, false
		}
		return sharding.ShardOfAct(req.Sender), true
	case api.KeyPacketPath:
		return packetShard(p.Key)
	case api.KeyActBody:
		if b, ok := in.([]byte); ok {
			if act, err := api.ActIDOf(b); err == nil {
				return sharding.ShardOfAct(act), true
			}
		}
	}
	return 0, false
}

// packetShard reads the shard from a packet ID: characters 8..10 (after the
// YYYYMMDD date), as model.ParsePacketID does.
func packetShard(id string) (model.ShardID, bool) {
	if len(id) != model.PacketIDLen {
		return 0, false
	}
	n, err := strconv.Atoi(id[8:11])
	if err != nil || !model.ShardID(n).Valid() {
		return 0, false
	}
	return model.ShardID(n), true
}
