// Package membership joins redcell's processes with hashicorp/memberlist. Each
// cell announces, in its node metadata, its name, when its process started, its
// HTTP address and the shards it owns; every member turns what it hears into a
// sharding.Map snapshot.
//
// Memberlist keys members by node name and refuses a known name from a new
// address until the old holder is declared dead, which after a crash takes its
// suspicion timeout (about 20 s here). So every process joins under a node name
// of its own, the cell name plus a start stamp and a random suffix, and carries
// the cell name in its metadata: a cell started again, on any address, is a new
// member at once. When two live members announce one cell name (a crashed
// process not yet declared dead, or two processes started by mistake), the map
// uses the one that started last and ignores the other.
package membership

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"redcell/sharding"
)

// Roles a member announces.
const (
	RoleCell   = "cell"
	RoleRouter = "router"
)

// Meta is the node metadata a member announces (memberlist caps it at 512 bytes,
// so shards travel as ranges, e.g. "0-499").
type Meta struct {
	Role string `json:"r"`
	// Name is the cell's (or router's) name; Join sets it from Config.Name. A
	// member without one (a process from before names were announced) is
	// taken to be called by its node name.
	Name string `json:"n,omitempty"`
	// Started is when this process joined, Unix ms; Join sets it. Of two
	// members announcing one cell name, the map uses the greater (0 loses).
	Started int64  `json:"i,omitempty"`
	Addr    string `json:"a,omitempty"` // HTTP host:port of a cell
	Shards  string `json:"s,omitempty"` // sharding.Ranges of a cell
	Version int64  `json:"v,omitempty"` // shard map version the cell announces
}

// Config says how to join.
type Config struct {
	// Name is the cell's name ("cell-1") or the router's ("router-<listen>"):
	// the name routing and logs know it by. It is not the memberlist node
	// name, which Join makes unique for each process.
	Name string
	Bind string // gossip host:port (UDP and TCP)
	// Advertise is the gossip host:port other members reach this one at
	// ("": Bind), for a Bind on every address (0.0.0.0 in a container).
	Advertise string
	Seeds     []string // gossip addresses to join; unreachable ones are retried
	Meta      Meta     // Name and Started are set by Join
	Log       *slog.Logger

	// onChange, set only by this package's tests, is called with every Map
	// the node publishes, in order, under the node's lock.
	onChange func(m *sharding.Map)
}

// supersededAlarm is how long a member may stay alive while a later process
// announces its cell name before every member logs it as a second live process
// at ERROR. Memberlist declares a crashed process dead within about 20 s here
// (probe, then a suspicion timeout of at most SuspicionMaxTimeoutMult 6 x
// SuspicionMult 3 x ProbeInterval 1 s below 10 members, twice that below 100),
// so a superseded member still alive after 60 s is running.
const supersededAlarm = 60 * time.Second

// Node is this process's membership. Safe for concurrent use.
type Node struct {
	cfg     Config
	node    string // memberlist node name: cfg.Name, "#", started, "-", 8 random hex digits
	started int64  // Unix ms
	ml      *memberlist.Memberlist
	meta    []byte // what NodeMeta announces; guarded by mu (tests change it)
	view    atomic.Pointer[sharding.Map]
	changed chan struct{} // closed (and replaced) when a new Map is published; guarded by mu
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	mu         sync.Mutex           // guards members, published, superseded
	members    map[string]member    // live cell processes by node name, superseded ones included
	published  []sharding.Cell      // the cells of the Map last published, by name
	superseded map[string]time.Time // node name -> since when a later process announces its cell (zero once alarmed)
}

// member is one live cell process as memberlist reports it.
type member struct {
	node string        // memberlist node name, unique per process
	cell sharding.Cell // cell.Name is the cell's name, shared by its processes
}

// Join starts gossiping on cfg.Bind and joins the seeds. Seeds that do not answer
// yet are retried in the background until this node has company. The process
// joins under a memberlist node name of its own, cfg.Name + "#" + the Unix ms it
// joined + "-" + 8 random hex digits, and announces cfg.Name and that stamp in
// its metadata. Errors: a bad cfg.Bind, an empty cfg.Name, metadata above 512
// bytes, or memberlist failing to start.
func Join(cfg Config) (*Node, error) {
	host, portStr, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("membership: bind %q: %w", cfg.Bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("membership: bind port %q: %w", portStr, err)
	}
	if cfg.Name == "" {
		return nil, fmt.Errorf("membership: empty name")
	}
	started := time.Now().UnixMilli()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	cfg.Meta.Name, cfg.Meta.Started = cfg.Name, started
	meta, err := json.Marshal(cfg.Meta)
	if err != nil || len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership: metadata too large or invalid (%d bytes)", len(meta))
	}
	n := &Node{cfg: cfg, node: fmt.Sprintf("%s#%d-%s", cfg.Name, started, hex.EncodeToString(suffix[:])), started: started,
		meta: meta, members: map[string]member{}, superseded: map[string]time.Time{}, changed: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	empty, _ := sharding.NewMap(nil)
	n.view.Store(empty)

	mc := memberlist.DefaultLocalConfig()
	// Unique per process: memberlist would refuse a known name from a new
	// address until the old holder is declared dead (see the package comment).
	mc.Name = n.node
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = host, port
	if cfg.Advertise != "" {
		ahost, aport, err := net.SplitHostPort(cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("membership: advertise %q: %w", cfg.Advertise, err)
		}
		if mc.AdvertisePort, err = strconv.Atoi(aport); err != nil {
			return nil, fmt.Errorf("membership: advertise port %q: %w", aport, err)
		}
		mc.AdvertiseAddr = ahost
	}
	// A leave (and every other broadcast) is sent in RetransmitMult x
	// ceil(log10(n+1)) packets, gossip and probes alike. DefaultLocalConfig's
	// 2 makes that 2 packets in a cluster of a few members; with a crashed
	// process not yet declared dead among them, both can go to it, and the
	// others learn of the leave only by probing, seconds later (seen in
	// TestRouterRejoin). 4, as in memberlist's LAN config.
	mc.RetransmitMult = 4
	// A member cut off for less than its own suspicion timeout still counts
	// the others alive while they have declared it dead, so rejoinLoop (which
	// rejoins a node left alone) does nothing; it learns it is dead, refutes
	// and is back only at its next push/pull with one of them. Every 5 s
	// instead of DefaultLocalConfig's 15: the netns partition drill measured
	// 3.6-14.5 s to recover after a 6-8 s cut with 15 s. A push/pull is one
	// TCP exchange of the member list, small for a cluster of cells.
	mc.PushPullInterval = 5 * time.Second
	mc.Delegate = delegate{n}
	mc.Events = events{n}
	mc.Logger = nil
	mc.LogOutput = newLogWriter(cfg.Log)
	cfg.Log.Info("joining gossip", "node", n.node, "bind", cfg.Bind)
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.Bind, err)
	}
	n.ml = ml
	n.joinSeeds()
	go n.rejoinLoop()
	return n, nil
}

func (n *Node) joinSeeds() {
	var others []string
	for _, s := range n.cfg.Seeds {
		if s != n.cfg.Bind {
			others = append(others, s)
		}
	}
	if len(others) == 0 {
		return
	}
	if _, err := n.ml.Join(others); err != nil {
		n.cfg.Log.Debug("gossip join incomplete; will retry", "err", err)
	}
}

// rejoinLoop retries the seeds every 2 s while this node knows no other member,
// so start order does not matter and a partition heals by itself. It also
// raises the alarm about superseded processes that stay alive.
func (n *Node) rejoinLoop() {
	defer close(n.done)
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			if n.ml.NumMembers() <= 1 {
				n.joinSeeds()
			}
			n.alarmSuperseded(time.Now())
		}
	}
}

// Announce changes the shard ranges and map version this cell announces (a
// move of a database hands it over this way) and gossips the change at once:
// memberlist's UpdateNode pushes the new metadata to the other members and
// waits up to two seconds for the broadcast to go out. Errors: metadata above
// 512 bytes, or the broadcast not sent in time (the change still spreads
// with the next gossip rounds).
func (n *Node) Announce(shards string, version int64) error {
	n.mu.Lock()
	m := n.cfg.Meta
	m.Shards, m.Version = shards, version
	b, err := json.Marshal(m)
	if err != nil || len(b) > memberlist.MetaMaxSize {
		n.mu.Unlock()
		return fmt.Errorf("membership: metadata too large or invalid (%d bytes)", len(b))
	}
	n.cfg.Meta, n.meta = m, b
	n.mu.Unlock()
	return n.ml.UpdateNode(2 * time.Second)
}

// Map returns the latest routing snapshot (never nil).
func (n *Node) Map() *sharding.Map { return n.view.Load() }

// Changed returns a channel closed when the next Map is published: read it,
// then Map, and wait on the channel for anything newer.
func (n *Node) Changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.changed
}

// Members returns the number of live members, this node included.
func (n *Node) Members() int { return n.ml.NumMembers() }

// Routers returns the number of live routers, this node included when it is
// one (the routers' cluster-wide limits fall back to a share of 1/Routers).
// It decodes every member's metadata: call it when the answer is needed, not
// per request.
func (n *Node) Routers() int {
	count := 0
	for _, m := range n.ml.Members() {
		var meta Meta
		if json.Unmarshal(m.Meta, &meta) == nil && meta.Role == RoleRouter {
			count++
		}
	}
	return count
}

// Leave tells the cluster this node is going (so routers stop sending to it at
// once) and stops gossiping.
func (n *Node) Leave(timeout time.Duration) error {
	var err error
	n.once.Do(func() {
		close(n.stop)
		<-n.done
		err = n.ml.Leave(timeout)
		if serr := n.ml.Shutdown(); err == nil {
			err = serr
		}
	})
	return err
}

// Shutdown stops gossiping without saying goodbye (others will notice by probe).
func (n *Node) Shutdown() error {
	var err error
	n.once.Do(func() {
		close(n.stop)
		<-n.done
		err = n.ml.Shutdown()
	})
	return err
}

func (n *Node) upsert(node *memberlist.Node) {
	var m Meta
	if err := json.Unmarshal(node.Meta, &m); err != nil || m.Role != RoleCell {
		n.remove(node.Name)
		return
	}
	r, err := sharding.Ranges{}, error(nil)
	if m.Shards != "" { // "": a cell that owns nothing (new, or drained by moves)
		r, err = sharding.ParseRanges(m.Shards)
	}
	if err != nil {
		n.cfg.Log.Warn("member announced bad shards; ignored", "member", node.Name, "shards", m.Shards, "err", err)
		n.remove(node.Name)
		return
	}
	if m.Name == "" {
		m.Name = node.Name // announced before cell names were: its node name is the cell name
	}
	n.mu.Lock()
	n.members[node.Name] = member{node: node.Name, cell: sharding.Cell{Name: m.Name, Addr: m.Addr, Shards: r, Version: m.Version, Started: m.Started}}
	n.rebuildLocked()
	n.mu.Unlock()
}

func (n *Node) remove(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.members[node]; !ok {
		return
	}
	delete(n.members, node)
	n.rebuildLocked()
}

// rebuildLocked publishes a new Map when the cells it would hold differ from
// the last one's, so a superseded process that keeps gossiping changes
// nothing; n.mu must be held.
func (n *Node) rebuildLocked() {
	kept, superseded := newest(n.members)
	n.noteSupersededLocked(kept, superseded)
	cells := make([]sharding.Cell, len(kept))
	for i, m := range kept {
		cells[i] = m.cell
	}
	if slices.EqualFunc(cells, n.published, sameCell) {
		return
	}
	n.published = cells
	m, conflicts := sharding.NewMap(cells)
	for _, c := range conflicts {
		n.cfg.Log.Warn("shard map conflict", "detail", c)
	}
	n.view.Store(m)
	n.cfg.Log.Info("shard map changed", "cells", len(cells), "uncovered_shards", m.Uncovered(), "version", m.Version)
	close(n.changed)
	n.changed = make(chan struct{})
	if n.cfg.onChange != nil {
		n.cfg.onChange(m)
	}
}

// newest keeps, of the members announcing one cell name, the process that
// started last (equal stamps: the greater node name), so every member that
// has heard the same announcements routes to the same process. It returns the
// kept members sorted by cell name and the ones passed over sorted by node
// name.
func newest(members map[string]member) (kept, superseded []member) {
	best := map[string]member{}
	for _, m := range members {
		b, ok := best[m.cell.Name]
		switch {
		case !ok:
			best[m.cell.Name] = m
		case later(m, b):
			best[m.cell.Name] = m
			superseded = append(superseded, b)
		default:
			superseded = append(superseded, m)
		}
	}
	kept = make([]member, 0, len(best))
	for _, m := range best {
		kept = append(kept, m)
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].cell.Name < kept[j].cell.Name })
	sort.Slice(superseded, func(i, j int) bool { return superseded[i].node < superseded[j].node })
	return kept, superseded
}

// later reports whether process a started after process b.
func later(a, b member) bool {
	if a.cell.Started != b.cell.Started {
		return a.cell.Started > b.cell.Started
	}
	return a.node > b.node
}

func sameCell(a, b sharding.Cell) bool {
	return a.Name == b.Name && a.Addr == b.Addr && a.Version == b.Version && a.Started == b.Started && slices.Equal(a.Shards, b.Shards)
}

// noteSupersededLocked logs each member when it is first passed over: at
// ERROR when it is this process (two processes run as one cell, and routers
// now send this one nothing), else at WARN (usually a process that crashed
// and is not yet declared dead). n.mu must be held.
func (n *Node) noteSupersededLocked(kept, superseded []member) {
	now := time.Now()
	byName := make(map[string]member, len(kept))
	for _, m := range kept {
		byName[m.cell.Name] = m
	}
	current := make(map[string]bool, len(superseded))
	for _, m := range superseded {
		current[m.node] = true
		if _, ok := n.superseded[m.node]; ok {
			continue
		}
		n.superseded[m.node] = now
		w := byName[m.cell.Name]
		if m.node == n.node {
			n.cfg.Log.Error("another process announces this cell and started later: routers send this process nothing now; stop one of them",
				"cell", m.cell.Name, "node", m.node, "other_node", w.node, "other_addr", w.cell.Addr)
			continue
		}
		n.cfg.Log.Warn("a later process announces a cell: the earlier one is ignored (it crashed and is not yet declared dead, or runs twice)",
			"cell", m.cell.Name, "ignored_node", m.node, "ignored_addr", m.cell.Addr, "node", w.node, "addr", w.cell.Addr)
	}
	for node := range n.superseded {
		if !current[node] {
			delete(n.superseded, node)
		}
	}
}

// alarmSuperseded logs, at ERROR and once each, the superseded members still
// alive supersededAlarm after a later process of their cell appeared: a crash
// would have been detected by then, so two processes run as one cell.
func (n *Node) alarmSuperseded(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for node, since := range n.superseded {
		if since.IsZero() || now.Sub(since) < supersededAlarm {
			continue
		}
		m := n.members[node]
		n.cfg.Log.Error("two live processes announce one cell: the earlier is still alive, so it did not crash; routers use the later; stop one of them",
			"cell", m.cell.Name, "ignored_node", node, "ignored_addr", m.cell.Addr, "for", now.Sub(since).Round(time.Second))
		n.superseded[node] = time.Time{} // alarmed: once is enough
	}
}

// delegate announces our metadata. Memberlist calls it under its own locks, so
// it touches only immutable fields.
type delegate struct{ n *Node }

func (d delegate) NodeMeta(limit int) []byte {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	return d.n.meta
}
func (d delegate) NotifyMsg([]byte)                           {}
func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d delegate) LocalState(join bool) []byte                { return nil }
func (d delegate) MergeRemoteState(buf []byte, join bool)     {}

// events keeps our own member table: memberlist calls these under its node lock,
// so they must not call back into memberlist.
type events struct{ n *Node }

func (e events) NotifyJoin(node *memberlist.Node)   { e.n.upsert(node) }
func (e events) NotifyUpdate(node *memberlist.Node) { e.n.upsert(node) }
func (e events) NotifyLeave(node *memberlist.Node) {
	e.n.cfg.Log.Info("member left", "member", node.Name)
	e.n.remove(node.Name)
}
