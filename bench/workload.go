package bench

import (
	"math"
	"math/rand/v2"
	"time"
)

// Workloads. Each run uses fresh act_ids and order numbers under its run ID.
const (
	// WorkloadSmoke: a few senders keep a ring of small packets live; each opener
	// is one account that opens packets it has not opened, asking grab first
	// about half the time. Closed-loop only. The default.
	WorkloadSmoke = "smoke"
	// WorkloadHot: a red-packet rain. One sender sends one packet with a huge
	// count (by default 10,000,000 shares of one cent); every open is by a fresh
	// act_id. The load ends early if the packet sells out.
	WorkloadHot = "hot"
	// WorkloadFestival: many senders send packets to groups whose sizes follow a
	// power law (most 2-20 members, a few 200-2000); the members open within
	// seconds of the send, most of them in the first second. A few very hot
	// packets among many cold ones.
	WorkloadFestival = "festival"
	// WorkloadCold: many distinct small packets, each opened by as many users as
	// it has shares (PacketCount, at most coldCountMax): no contention.
	WorkloadCold = "cold"
	// WorkloadRoundRobin: cold packets without sends during the load.
	// Packets packets (by default 2,000 of 10,000 shares each), sent before
	// the load starts, are opened round robin, every open by a fresh act_id:
	// each open is the only one of its packet in flight, so batching per
	// packet cannot help and only commits shared across keys can (strategy
	// grouped). With Packets 1 it is hot.
	WorkloadRoundRobin = "roundrobin"
)

// Workloads lists the workloads in the order the CLI shows them.
var Workloads = []string{WorkloadSmoke, WorkloadHot, WorkloadFestival, WorkloadCold, WorkloadRoundRobin}

// The shape of the festival and cold workloads.
const (
	// Festival group sizes are festivalGroupMin + k with P(k) ∝ (1+k)^-s over
	// k in [0, festivalGroupMax-festivalGroupMin]. With s = 2 about 97% of the
	// groups have 2-20 members and about 0.3% have 200 or more, while those few
	// big groups take about a quarter of all opens: the hot packets of a festival.
	festivalGroupMin = 2
	festivalGroupMax = 2000
	festivalZipfS    = 2.0
	// festivalShareCents is the mean share of a festival packet: 1 CNY.
	festivalShareCents = 100
	// festivalOpenWindow: members open within 3 s of the send.
	festivalOpenWindow = 3 * time.Second
	// coldCountMax keeps cold packets small: few openers each.
	coldCountMax = 10
	// packetsRRMax bounds a roundrobin run's packets, all sent before the load.
	packetsRRMax = 20_000
	// coldOpenWindow: a cold packet's openers come within a second.
	coldOpenWindow = time.Second
)

// Bounds on one run's loops, besides its Duration.
const (
	// opensMax bounds the opens one run schedules (hot: act_ids "<run>-h<k>").
	opensMax = 50_000_000
	// packetsMax bounds the packets one festival or cold run sends.
	packetsMax = 10_000_000
	// depositsMax bounds the deposits of one festival or cold sender: it deposits
	// again when a send finds its balance spent, up to this many times.
	depositsMax = 1000
	// balanceSampleMax bounds the claimant accounts whose balances are read
	// after a hot, festival or cold run: the first ones to be offered a share
	// (the audit covers the rest).
	balanceSampleMax = 256
)

// groupSizes draws festival group sizes. Not safe for concurrent use: each
// goroutine that plans packets has its own.
type groupSizes struct{ z *rand.Zipf }

func newGroupSizes(r *rand.Rand) groupSizes {
	return groupSizes{z: rand.NewZipf(r, festivalZipfS, 1, festivalGroupMax-festivalGroupMin)}
}

func (g groupSizes) next() int { return festivalGroupMin + int(g.z.Uint64()) }

// meanGroupSize is the exact mean of groupSizes' distribution, used to turn a
// rate of opens into a rate of sends.
func meanGroupSize() float64 {
	var sum, weighted float64
	for k := 0; k <= festivalGroupMax-festivalGroupMin; k++ {
		p := math.Pow(1+float64(k), -festivalZipfS)
		sum += p
		weighted += p * float64(festivalGroupMin+k)
	}
	return weighted / sum
}

// festivalCount is the number of shares of a packet sent to a group of g: three
// in four members get one, so the last to open find it sold out, as in a real
// group.
func festivalCount(g int) int64 { return int64(g - g/4) }

// openDelay is how long after the send a member opens: window·u² for u uniform
// in [0, 1), so most open early and a few late (mean window/3).
func openDelay(r *rand.Rand, window time.Duration) time.Duration {
	u := r.Float64()
	return time.Duration(u * u * float64(window))
}

// packetPlan is one packet a festival or cold run sends and who opens it.
type packetPlan struct {
	amount, count int64 // cents, shares
	firstUser     int   // members are users firstUser, firstUser+1, ... modulo Users
	members       int   // distinct users who try to open it
	window        time.Duration
}

// plan draws the next packet of a festival or cold run.
func (c Config) plan(r *rand.Rand, sizes groupSizes) packetPlan {
	if c.Workload == WorkloadFestival {
		g := sizes.next()
		n := festivalCount(g)
		return packetPlan{amount: n * festivalShareCents, count: n, firstUser: r.IntN(c.Users), members: g, window: festivalOpenWindow}
	}
	return packetPlan{amount: c.PacketAmount, count: c.PacketCount, firstUser: r.IntN(c.Users),
		members: int(c.PacketCount), window: coldOpenWindow}
}

// opensPerPacket is the mean number of opens a festival or cold packet brings.
func (c Config) opensPerPacket() float64 {
	if c.Workload == WorkloadFestival {
		return meanGroupSize()
	}
	return float64(c.PacketCount)
}
