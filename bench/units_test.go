package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
)

func TestTimeline(t *testing.T) {
	start := time.Unix(1000, 0)
	tl := newTimeline(start)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	for i := range 100 {
		tl.record(at(100), int64(1000*(i+1)), true) // 1..100 ms in second 0
	}
	tl.record(at(2500), 5000, false) // second 2; second 1 stays empty
	tl.recordDropped(at(2600))
	tl.record(at(1900), 7000, true) // late: lands in the current bucket (2)
	got := tl.finish(at(3250))
	if len(got) != 4 {
		t.Fatalf("buckets %+v, want 4", got)
	}
	if got[0].OK != 100 || got[0].P99MS < 98 || got[0].P99MS > 100 || got[1].OK+got[1].Errors != 0 {
		t.Errorf("bucket 0 %+v, bucket 1 %+v", got[0], got[1])
	}
	if got[2].OK != 1 || got[2].Errors != 2 || got[2].P99MS < 6.9 {
		t.Errorf("bucket 2 %+v", got[2])
	}
	if got[3].MS != 250 || got[0].MS != 1000 || got[3].Rate() != 0 || got[0].Rate() != 100 {
		t.Errorf("widths %d %d, rates %v %v", got[0].MS, got[3].MS, got[0].Rate(), got[3].Rate())
	}
	for i, b := range got {
		if b.T != i {
			t.Errorf("bucket %d has T %d", i, b.T)
		}
	}
}

// It runs in a synctest bubble: time is the bubble's, and synctest.Wait
// knows when the second pop is blocked waiting, so the push that must wake it
// comes only then.
func TestTaskQueueOrderAndWait(t *testing.T) {
	synctest.Test(t, taskQueueOrderAndWait)
}

func taskQueueOrderAndWait(t *testing.T) {
	q := newTaskQueue(3)
	now := time.Now()
	p := &packetState{id: "p"}
	dropped := q.push([]openTask{
		{due: now.Add(60 * time.Millisecond), pkt: p, act: "late"},
		{due: now.Add(-time.Second), pkt: p, act: "first"},
		{due: now.Add(-time.Second), pkt: p, act: "second"}, // same due: FIFO
		{due: now, pkt: p, act: "over"},                     // queue full
	})
	if dropped != 1 || q.len() != 3 {
		t.Fatalf("dropped %d, len %d", dropped, q.len())
	}
	if lag := q.lag(now); lag < time.Second {
		t.Errorf("lag %v, want >= 1s", lag)
	}
	ctx := context.Background()
	for _, want := range []string{"first", "second"} {
		if got, ok := q.pop(ctx); !ok || got.act != want {
			t.Fatalf("pop = %q, want %q", got.act, want)
		}
	}
	got, ok := q.pop(ctx)
	if !ok || got.act != "late" || time.Now().Before(got.due) {
		t.Fatalf("pop = %q at %v, before its due %v", got.act, time.Now(), got.due)
	}
	// A push wakes a waiting pop; an ended ctx stops it.
	done := make(chan string)
	go func() {
		got, _ := q.pop(ctx)
		done <- got.act
	}()
	synctest.Wait() // the pop is blocked: nothing is due
	select {
	case got := <-done:
		t.Fatalf("pop returned %q from an empty queue", got)
	default:
	}
	q.push([]openTask{{due: time.Now(), pkt: p, act: "woken"}})
	select {
	case got := <-done:
		if got != "woken" {
			t.Fatalf("pop = %q", got)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("pop was not woken by a push")
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, ok := q.pop(cctx); ok {
		t.Fatal("pop on an empty queue returned a task")
	}
}

// The festival's group sizes: most small, a few huge, the few huge taking a
// good part of the opens; the comments in workload.go state these numbers.
func TestGroupSizes(t *testing.T) {
	g := newGroupSizes(rand.New(rand.NewPCG(1, 2)))
	const n = 200_000
	var small, big, sum, bigSum int
	for range n {
		s := g.next()
		if s < festivalGroupMin || s > festivalGroupMax {
			t.Fatalf("group of %d", s)
		}
		sum += s
		if s <= 20 {
			small++
		}
		if s >= 200 {
			big++
			bigSum += s
		}
	}
	if f := float64(small) / n; f < 0.95 || f > 0.99 {
		t.Errorf("%.3f of groups have 2-20 members, want about 0.97", f)
	}
	if f := float64(big) / n; f < 0.002 || f > 0.005 {
		t.Errorf("%.4f of groups have 200+ members, want about 0.003", f)
	}
	if f := float64(bigSum) / float64(sum); f < 0.15 || f > 0.4 {
		t.Errorf("groups of 200+ take %.2f of the members, want about a quarter", f)
	}
	if mean, want := float64(sum)/n, meanGroupSize(); math.Abs(mean-want)/want > 0.1 {
		t.Errorf("sampled mean %.2f, computed %.2f", mean, want)
	}
	if festivalCount(2) != 2 || festivalCount(4) != 3 || festivalCount(2000) != 1500 {
		t.Error("festivalCount")
	}
	for range 1000 {
		if d := openDelay(rand.New(rand.NewPCG(3, 4)), time.Second); d < 0 || d >= time.Second {
			t.Fatalf("delay %v", d)
		}
	}
}

// The bench's copy of the routing rule agrees with the router's inputs: act
// paths by sharding.ShardOfAct, a send by its sender, a packet by its ID.
func TestShardOf(t *testing.T) {
	id := string(model.NewPacketID(417, time.Now()))
	tests := []struct {
		method, path string
		in           any
		want         model.ShardID
		ok           bool
	}{
		{http.MethodGet, "/v1/accounts/alice", nil, sharding.ShardOfAct("alice"), true},
		{http.MethodPost, "/v1/accounts/bob/deposit", api.DepositRequest{}, sharding.ShardOfAct("bob"), true},
		{http.MethodPost, "/v1/noop/carol", nil, sharding.ShardOfAct("carol"), true},
		{http.MethodPost, "/v1/packets", api.SendRequest{Sender: "dave"}, sharding.ShardOfAct("dave"), true},
		{http.MethodPost, "/v1/packets/" + id + "/open", api.ActRequest{ActID: "x"}, 417, true},
		{http.MethodGet, "/v1/packets/" + id, nil, 417, true},
		{http.MethodPost, "/v1/packets/short/open", nil, 0, false},
		{http.MethodPost, "/v1/packets", nil, 0, false},
		{http.MethodGet, "/healthz", nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := shardOf(tt.method, tt.path, tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("shardOf(%s %s) = %d %v, want %d %v", tt.method, tt.path, got, ok, tt.want, tt.ok)
		}
	}
	table, err := newCellTable([]CellInfo{{Name: "a", Addr: "h1:1", Shards: "0-416"}, {Name: "b", Addr: "h2:2", Shards: "417-999"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := table.baseFor(http.MethodPost, "/v1/packets/"+id+"/open", nil); !ok || b != "http://h2:2" {
		t.Errorf("baseFor = %q %v", b, ok)
	}
	if _, err := newCellTable([]CellInfo{{Name: "a", Addr: "h", Shards: "x"}}); err == nil {
		t.Error("bad shards accepted")
	}
}

func TestProgressLine(t *testing.T) {
	line := progressLine("naive", 5*time.Second, 10*time.Second, progressSnapshot{opens: 1234, errors: 3, extra: "sends 9"}, 246.6)
	want := "\r[naive] [##########..........]   5s/10s  opens 1234  247 opens/s  errors 3  sends 9   "
	if line != want {
		t.Errorf("progressLine =\n%q, want\n%q", line, want)
	}
	if l := progressLine("", 12*time.Second, 10*time.Second, progressSnapshot{}, 0); !strings.Contains(l, "[####################]") {
		t.Errorf("overtime line %q", l)
	}
}

func TestScheduledAt(t *testing.T) {
	t0 := time.Unix(0, 0)
	// Computed from k, so arrival 3e6 at 3/s is at 1e6 s with no drift.
	if got := scheduledAt(t0, 3, 3_000_000).Sub(t0); got != 1_000_000*time.Second {
		t.Errorf("arrival 3e6 at 3/s at %v, want 1e6 s", got)
	}
	if got := scheduledAt(t0, 1000, 1); got.Sub(t0) != time.Millisecond {
		t.Errorf("arrival 1 at 1000/s at %v", got.Sub(t0))
	}
}

func TestWorkloadConfigs(t *testing.T) {
	for _, w := range Workloads {
		c := DefaultWorkloadConfig(w)
		if err := c.Validate(); err != nil {
			t.Errorf("%s defaults: %v", w, err)
		}
	}
	hot := DefaultWorkloadConfig(WorkloadHot)
	if hot.PacketCount != 10_000_000 || hot.PacketAmount != 10_000_000 || hot.depositCents() < hot.PacketAmount {
		t.Errorf("hot defaults %+v", hot)
	}
	tests := []struct {
		w      string
		modify func(*Config)
		want   string
	}{
		{WorkloadSmoke, func(c *Config) { c.Rate = 10 }, "closed-loop"},
		{WorkloadHot, func(c *Config) { c.Rate = rateMax + 1 }, "Rate"},
		{WorkloadHot, func(c *Config) { c.Rate = -1 }, "Rate"},
		{WorkloadHot, func(c *Config) { c.MaxInFlight = inFlightMax + 1 }, "MaxInFlight"},
		{WorkloadFestival, func(c *Config) { c.Users = festivalGroupMax - 1 }, "Users"},
		{WorkloadCold, func(c *Config) { c.PacketCount = coldCountMax + 1; c.PacketAmount = 1000 }, "at most"},
		{WorkloadCold, func(c *Config) { c.Users = 1 }, "Users"},
		{"rain", func(*Config) {}, "unknown Workload"},
		{WorkloadHot, func(c *Config) { c.Rate, c.MaxInFlight = 5000, 2000 }, ""},
	}
	for _, tt := range tests {
		c := DefaultWorkloadConfig(tt.w)
		c.Workload = tt.w
		tt.modify(&c)
		err := c.Validate()
		if (tt.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want %q", tt.w, err, tt.want)
		}
	}
	if (Config{Openers: 7}).inFlight() != 7 || (Config{Openers: 7, MaxInFlight: 9}).inFlight() != 9 {
		t.Error("inFlight")
	}
}

// The longest names the newer workloads make are valid act_ids and order numbers.
func TestLoadNamesFitTheAPI(t *testing.T) {
	id := strings.Repeat("Z", runIDLenMax)
	for _, n := range []string{
		id + "-h49999999", id + "-u9999999", id + "-s999", id + "-n4999999",
		id + "-dep-999-1000", id + "-snd-999-10000000",
	} {
		if err := model.ValidateOrderNo(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
}
