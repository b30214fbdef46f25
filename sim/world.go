package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
)

// simStart is the simulated time at event 0: two minutes before midnight UTC,
// so every run crosses a day and writes two days' tables.
var simStart = time.Date(2026, time.March, 30, 23, 58, 0, 0, time.UTC)

// Result is what a run did and found.
type Result struct {
	Seed   uint64
	Steps  int   // workload operations started
	Ops    int64 // requests the clients sent (steps and their retries)
	Events int64 // events the loop handled
	// SimTime is how much simulated time the run took.
	SimTime time.Duration
	// Hash is an FNV-1a hash of the event log: two runs of one Config give
	// the same hash, or the simulation is not deterministic.
	Hash string
	// Counts are what happened, by kind (sorted names when printed).
	Counts map[string]int64
	// Violation is the first broken invariant (nil: none).
	Violation *Violation
	// Trace holds the event-log lines naming Config.TraceKeys.
	Trace []string
}

// Violation is a broken invariant: which check, where in the run, and the
// keys (packet, account, claim IDs) whose events explain it.
type Violation struct {
	Seed   uint64
	Steps  int   // the run's Config.Steps
	Event  int64 // the event after which the check failed
	Step   int   // workload operations started by then
	AtMS   int64 // simulated ms since the start
	Check  string
	Detail string
	Keys   []string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("sim: seed %d: %s violated after event %d (step %d, t=%d ms): %s",
		v.Seed, v.Check, v.Event, v.Step, v.AtMS, v.Detail)
}

// Node numbers on the simulated network.
const (
	nodeClient = 0
	nodeRouter = 1
	nodeCell0  = 2 // cell i is node nodeCell0+i
)

type event struct {
	at  int64 // simulated ms since simStart
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// world is one run: every component and the loop that drives them.
type world struct {
	cfg    Config
	faults Faults // cfg.Faults until the network heals, then none
	ctx    context.Context
	now    int64 // simulated ms since simStart
	clk    *clock.Manual
	q      eventQueue
	seq    uint64
	events int64

	rngNet, rngFault *rand.Rand
	smap             *sharding.Map
	owner            [model.ShardCount]int8 // shard → cell index
	cells            []*cell
	router           *router
	client           *client
	check            *checker
	log              eventLog
	counts           map[string]int64
	healed           bool
	violation        *Violation
	cut              [nodeCell0 + cellCount][nodeCell0 + cellCount]bool // link from, to is cut
}

// stream returns the PCG stream of one component: seeded from the run's seed
// and a constant per component, so adding draws to one never moves another.
func stream(seed uint64, component uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15*component+1))
}

// Streams of the components.
const (
	streamNet = iota + 1
	streamFault
	streamClient
	streamCell // + cell index
)

// Run simulates cfg and checks it. It returns the result with the first
// violation found (nil when every check held). It never reads the wall clock.
func Run(cfg Config) Result {
	if err := cfg.Validate(); err != nil {
		return Result{Seed: cfg.Seed, Violation: &Violation{Seed: cfg.Seed, Steps: cfg.Steps, Check: "config", Detail: err.Error()}}
	}
	w := newWorld(cfg)
	w.run()
	return w.result()
}

func newWorld(cfg Config) *world {
	w := &world{cfg: cfg, faults: cfg.Faults, ctx: context.Background(), clk: clock.NewManual(simStart),
		rngNet: stream(cfg.Seed, streamNet), rngFault: stream(cfg.Seed, streamFault), counts: map[string]int64{}}
	w.log.init(cfg.TraceKeys)
	w.smap = clusterMap()
	w.owner = owners(w.smap)
	for i := 0; i < cellCount; i++ {
		w.cells = append(w.cells, newCell(w, i))
	}
	w.router = &router{w: w}
	w.client = newClient(w)
	w.check = newChecker(w)
	return w
}

// clusterMap is the shard map of three cells, built as cmd/redcell builds it
// from a config's ranges (whole databases: 33, 33 and 34 of them).
func clusterMap() *sharding.Map {
	ranges := []string{"0-329", "330-659", "660-999"}
	var cells []sharding.Cell
	for i, r := range ranges {
		rs, err := sharding.ParseRanges(r)
		if err == nil {
			err = rs.CheckWholeDBs()
		}
		if err != nil {
			panic(err)
		}
		cells = append(cells, sharding.Cell{Name: cellName(i), Addr: fmt.Sprintf("sim:%d", i), Shards: rs, Version: 1})
	}
	m, conflicts := sharding.NewMap(cells)
	if len(conflicts) > 0 || m.Uncovered() > 0 {
		panic(fmt.Sprintf("sim: bad cluster map: %v, %d uncovered", conflicts, m.Uncovered()))
	}
	return m
}

func cellName(i int) string { return fmt.Sprintf("cell-%d", i+1) }

// cellOf is the index of the cell owning shard s (from the map, read once).
func (w *world) cellOf(s model.ShardID) int { return int(w.owner[s]) }

// cellIndex is the index of the cell the map names name.
func (w *world) cellIndex(name string) int {
	for i, c := range w.cells {
		if c.name == name {
			return i
		}
	}
	panic("sim: unknown cell " + name)
}

// owners reads, for every shard, the index of the cell the map names.
func owners(m *sharding.Map) (out [model.ShardCount]int8) {
	for s := model.ShardID(0); s < model.ShardCount; s++ {
		owner, ok := m.Owner(s)
		if !ok {
			panic(fmt.Sprintf("sim: shard %d has no owner", s))
		}
		out[s] = -1
		for i := 0; i < cellCount; i++ {
			if cellName(i) == owner.Name {
				out[s] = int8(i)
			}
		}
		if out[s] < 0 {
			panic("sim: unknown cell " + owner.Name)
		}
	}
	return out
}

// at schedules fn to run d from now (d >= 0). Events at one time run in the
// order they were scheduled.
func (w *world) at(d time.Duration, fn func()) { w.atMS(w.now+d.Milliseconds(), fn) }

func (w *world) atMS(t int64, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	heap.Push(&w.q, event{at: t, seq: w.seq, fn: fn})
}

// timeNow is the simulated wall time.
func (w *world) timeNow() time.Time { return simStart.Add(time.Duration(w.now) * time.Millisecond) }

func (w *world) count(kind string) { w.counts[kind]++ }

// step runs the next event; false when the queue is empty or the run stopped.
func (w *world) step() bool {
	if w.violation != nil || len(w.q) == 0 {
		return false
	}
	e := heap.Pop(&w.q).(event)
	if e.at > w.now {
		w.now = e.at
		w.clk.Set(w.timeNow())
	}
	w.events++
	e.fn()
	if w.violation == nil {
		w.check.afterEvent()
	}
	return w.violation == nil
}

// fail records the first violation and stops the loop.
func (w *world) fail(check string, keys []string, format string, args ...any) {
	if w.violation != nil {
		return
	}
	w.violation = &Violation{Seed: w.cfg.Seed, Steps: w.cfg.Steps, Event: w.events, Step: w.client.started,
		AtMS: w.now, Check: check, Detail: fmt.Sprintf(format, args...), Keys: keys}
	w.log.begin(w, "VIOLATION").s(check).s(w.violation.Detail).end()
}

// run drives the whole simulation: the workload with faults, then healing,
// draining and the final checks. A panic of an invariant inside production
// code is a violation too.
func (w *world) run() {
	defer func() {
		if p := recover(); p != nil {
			w.fail("panic", nil, "%v", p)
		}
	}()
	for _, c := range w.cells {
		c.start()
	}
	w.scheduleFaults()
	w.client.begin()
	for w.client.started < w.cfg.Steps || w.client.inFlight() > 0 {
		if !w.step() {
			return
		}
	}
	w.heal()
	w.drain()
	if w.violation == nil {
		w.check.final()
	}
}

// heal ends every fault: the network delivers everything, cut links are
// joined, down cells start again, stores stop failing.
func (w *world) heal() {
	w.healed = true
	w.faults = Faults{LatencyMinMS: w.cfg.Faults.LatencyMinMS, LatencyMaxMS: w.cfg.Faults.LatencyMaxMS}
	w.cut = [nodeCell0 + cellCount][nodeCell0 + cellCount]bool{}
	for _, c := range w.cells {
		if c.down {
			c.restart()
		}
	}
	w.log.begin(w, "heal").end()
}

// drain runs until every packet is past its expiry and refunded or sold out,
// and every claim is credited (checker.drained), or fails after a bound of
// simulated time.
func (w *world) drain() {
	until := w.client.lastExpiryMS + 3*expiryInterval.Milliseconds() + 5*relayInterval.Milliseconds()
	limit := until + 120_000 // two minutes of simulated time to deliver what is left
	for w.violation == nil {
		for len(w.q) > 0 && w.q[0].at <= until {
			if !w.step() {
				return
			}
		}
		if w.now < until {
			w.now = until
			w.clk.Set(w.timeNow())
		}
		if w.client.inFlight() == 0 && w.check.drained() {
			return
		}
		if until >= limit {
			w.fail("drain", nil, "the relays did not deliver every claim within %d ms after the network healed", limit-w.now)
			return
		}
		until += relayInterval.Milliseconds()
	}
}

func (w *world) result() Result {
	r := Result{Seed: w.cfg.Seed, Steps: w.client.started, Ops: w.client.requests, Events: w.events,
		SimTime: time.Duration(w.now) * time.Millisecond, Hash: w.log.sum(), Counts: w.counts,
		Violation: w.violation, Trace: w.log.trace()}
	return r
}
