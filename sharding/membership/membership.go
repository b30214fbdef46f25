// Package membership joins redcell's processes with hashicorp/memberlist. Each
// cell announces, in its node metadata, its HTTP address and the shards it owns;
// every member turns what it hears into a sharding.Map snapshot.
package membership

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
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
	Role    string `json:"r"`
	Addr    string `json:"a,omitempty"` // HTTP host:port of a cell
	Shards  string `json:"s,omitempty"` // sharding.Ranges of a cell
	Version int64  `json:"v,omitempty"` // shard map version the cell announces
}

// Config says how to join.
type Config struct {
	Name  string   // unique member name, e.g. "cell-1" or "router"
	Bind  string   // gossip host:port (UDP and TCP)
	Seeds []string // gossip addresses to join; unreachable ones are retried
	Meta  Meta
	Log   *slog.Logger
	// OnChange is called with every new Map (optional). It must not block long.
	OnChange func(m *sharding.Map)
}

// Node is this process's membership. Safe for concurrent use.
type Node struct {
	cfg  Config
	ml   *memberlist.Memberlist
	meta []byte
	view atomic.Pointer[sharding.Map]
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu    sync.Mutex // guards cells
	cells map[string]sharding.Cell
}

// Join starts gossiping on cfg.Bind and joins the seeds. Seeds that do not answer
// yet are retried in the background until this node has company.
func Join(cfg Config) (*Node, error) {
	host, portStr, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("membership: bind %q: %w", cfg.Bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("membership: bind port %q: %w", portStr, err)
	}
	meta, err := json.Marshal(cfg.Meta)
	if err != nil || len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership: metadata too large or invalid (%d bytes)", len(meta))
	}
	n := &Node{cfg: cfg, meta: meta, cells: map[string]sharding.Cell{}, stop: make(chan struct{}), done: make(chan struct{})}
	empty, _ := sharding.NewMap(nil)
	n.view.Store(empty)

	mc := memberlist.DefaultLocalConfig()
	mc.Name = cfg.Name
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = host, port
	mc.Delegate = delegate{n}
	mc.Events = events{n}
	// A cell that restarts under the same name on a new port is taken back at once.
	mc.DeadNodeReclaimTime = time.Second
	mc.Logger = nil
	mc.LogOutput = newLogWriter(cfg.Log)
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
// so start order does not matter and a partition heals by itself.
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
		}
	}
}

// Map returns the latest routing snapshot (never nil).
func (n *Node) Map() *sharding.Map { return n.view.Load() }

// Members returns the number of live members, this node included.
func (n *Node) Members() int { return n.ml.NumMembers() }

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
	r, err := sharding.ParseRanges(m.Shards)
	if err != nil {
		n.cfg.Log.Warn("member announced bad shards; ignored", "member", node.Name, "shards", m.Shards, "err", err)
		n.remove(node.Name)
		return
	}
	n.mu.Lock()
	n.cells[node.Name] = sharding.Cell{Name: node.Name, Addr: m.Addr, Shards: r, Version: m.Version}
	n.rebuildLocked()
	n.mu.Unlock()
}

func (n *Node) remove(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.cells[name]; !ok {
		return
	}
	delete(n.cells, name)
	n.rebuildLocked()
}

// rebuildLocked publishes a new Map; n.mu must be held.
func (n *Node) rebuildLocked() {
	cells := make([]sharding.Cell, 0, len(n.cells))
	for _, c := range n.cells {
		cells = append(cells, c)
	}
	m, conflicts := sharding.NewMap(cells)
	for _, c := range conflicts {
		n.cfg.Log.Warn("shard map conflict", "detail", c)
	}
	n.view.Store(m)
	n.cfg.Log.Info("shard map changed", "cells", len(cells), "uncovered_shards", m.Uncovered(), "version", m.Version)
	if n.cfg.OnChange != nil {
		n.cfg.OnChange(m)
	}
}

// delegate announces our metadata. Memberlist calls it under its own locks, so
// it touches only immutable fields.
type delegate struct{ n *Node }

func (d delegate) NodeMeta(limit int) []byte                  { return d.n.meta }
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
