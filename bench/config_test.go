package bench

import (
	"strings"
	"testing"
	"time"

	"redcell/model"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	if c.Senders != 4 || c.Openers != 32 || c.Duration != 10*time.Second || c.PacketAmount != 1000 || c.PacketCount != 10 {
		t.Fatalf("DefaultConfig() = %+v, want the documented defaults", c)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // substring of the error; "" means valid
	}{
		{"https router", func(c *Config) { c.RouterURL = "https://router.local:8443/" }, ""},
		{"router without scheme", func(c *Config) { c.RouterURL = "127.0.0.1:8080" }, "RouterURL"},
		{"router ftp", func(c *Config) { c.RouterURL = "ftp://x" }, "RouterURL"},
		{"empty router", func(c *Config) { c.RouterURL = "" }, "RouterURL"},
		{"no senders", func(c *Config) { c.Senders = 0 }, "Senders"},
		{"too many senders", func(c *Config) { c.Senders = sendersMax + 1 }, "Senders"},
		{"no openers", func(c *Config) { c.Openers = 0 }, "Openers"},
		{"too many openers", func(c *Config) { c.Openers = openersMax + 1 }, "Openers"},
		{"zero duration", func(c *Config) { c.Duration = 0 }, "Duration"},
		{"negative duration", func(c *Config) { c.Duration = -time.Second }, "Duration"},
		{"duration over an hour", func(c *Config) { c.Duration = time.Hour + time.Second }, "Duration"},
		{"zero count", func(c *Config) { c.PacketCount = 0 }, "PacketCount"},
		{"amount below count", func(c *Config) { c.PacketAmount, c.PacketCount = 9, 10 }, "PacketAmount"},
		{"amount equals count", func(c *Config) { c.PacketAmount, c.PacketCount = 10, 10 }, ""},
		{"amount above limit", func(c *Config) { c.PacketAmount = int64(model.DefaultLimits().MaxAmount) + 1 }, "PacketAmount"},
		{"good run id", func(c *Config) { c.RunID = "Run-42" }, ""},
		{"run id underscore", func(c *Config) { c.RunID = "run_42" }, "RunID"},
		{"run id too long", func(c *Config) { c.RunID = strings.Repeat("a", runIDLenMax+1) }, "RunID"},
		{"run id at limit", func(c *Config) { c.RunID = strings.Repeat("a", runIDLenMax) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.modify(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error about %s", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("Validate() = %v, want it to name %s", err, tt.want)
			}
		})
	}
}

// The longest names the bench makes must still be valid act_ids and order
// numbers, or a long run would fail with INVALID_ARGUMENT.
func TestNamesFitTheAPI(t *testing.T) {
	id := strings.Repeat("Z", runIDLenMax)
	names := []string{
		id + "-dep-999",
		id + "-snd-999-" + "9223372036854775807", // n cannot exceed an int64
		id + "-s999",
		id + "-o9999",
	}
	for _, n := range names {
		if err := model.ValidateOrderNo(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	derived := newRunID(time.Date(2999, 12, 31, 23, 59, 59, 0, time.UTC))
	if err := validateRunID(derived); err != nil || len(derived) > runIDLenMax {
		t.Fatalf("newRunID = %q: %v", derived, err)
	}
	if newRunID(time.UnixMilli(1)) == newRunID(time.UnixMilli(2)) {
		t.Fatal("run IDs one millisecond apart are equal")
	}
}

func TestDepositCents(t *testing.T) {
	limit := int64(model.DefaultLimits().MaxAmount)
	tests := []struct{ amount, want int64 }{
		{1, 100_000},
		{100, 10_000_000},
		{1000, limit},
		{limit, limit},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.PacketAmount = tt.amount
		if got := c.depositCents(); got != tt.want {
			t.Errorf("PacketAmount %d: depositCents = %d, want %d", tt.amount, got, tt.want)
		}
		if got := c.depositCents(); got < tt.amount {
			t.Errorf("PacketAmount %d: deposit %d cannot pay one packet", tt.amount, got)
		}
	}
}

// TestRoundRobinWorkload: its defaults are valid and cover their sends with
// the senders' deposits; bad packet counts are refused; open k goes to
// packet k mod Packets, each by a fresh account.
func TestRoundRobinWorkload(t *testing.T) {
	c := DefaultWorkloadConfig(WorkloadRoundRobin)
	if err := c.Validate(); err != nil {
		t.Fatalf("roundrobin defaults: %v", err)
	}
	if c.Packets != 2000 || c.Openers != 64 || int64(c.Packets)*c.PacketAmount > int64(c.Senders)*c.depositCents() {
		t.Fatalf("roundrobin defaults %+v", c)
	}
	for _, n := range []int{0, packetsRRMax + 1} {
		bad := c
		bad.Packets = n
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "Packets") {
			t.Errorf("Packets %d: %v", n, err)
		}
	}
	poor := c
	poor.Senders = 1
	if err := poor.Validate(); err == nil || !strings.Contains(err.Error(), "deposits") {
		t.Errorf("2,000 packets from one sender's deposit: %v", err)
	}
	r := &loadRun{cfg: c, rr: []*packetState{{id: "a"}, {id: "b"}, {id: "c"}}}
	seen := map[string]bool{}
	for k := int64(balanceSampleMax); k < balanceSampleMax+7; k++ { // past the sampled accounts: no claim book needed
		task := r.hotTask(k, time.Time{})
		if want := r.rr[k%3].id; task.pkt.id != want || seen[task.act] {
			t.Fatalf("open %d: packet %s by %s, want packet %s by a fresh account", k, task.pkt.id, task.act, want)
		}
		seen[task.act] = true
	}
}
