package cell

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"redcell/cell/guard"
	"redcell/model"
)

// The feature parts of Config: each with its YAML keys, its defaults (with
// the reason for each value) and its own checks; Config.Validate checks
// how they relate.

// PacketConfig is the red packets' open path: how opens queue, batch and
// are shed, and a packet's limits.
type PacketConfig struct {
	PacketExpiry time.Duration `yaml:"packet_expiry"`  // a packet's life; the remainder is refunded after it
	OpenStrategy string        `yaml:"open_strategy"`  // naive | serial | batched | grouped
	BatchMax     int           `yaml:"batch_max"`      // most opens committed in one transaction (batched)
	BatchWait    time.Duration `yaml:"batch_wait"`     // how long a worker waits for a batch to fill (batched)
	QueueDepth   int           `yaml:"queue_depth"`    // bounded FIFO length per packet; beyond it opens are shed
	QueueWaitMax time.Duration `yaml:"queue_wait_max"` // an open that waited longer than this is shed (retryable)
	// CreditShedFrom and CreditShedAll bound the shedding of opens while the
	// relay is behind with this cell's credits (relay.Relay.Behind): none
	// shed up to CreditShedFrom, all from CreditShedAll, in proportion
	// between (creditshed.go). CreditShedFrom 0: never shed for credits.
	CreditShedFrom time.Duration `yaml:"credit_shed_from"`
	CreditShedAll  time.Duration `yaml:"credit_shed_all"`
	TxPerPacket    int           `yaml:"tx_per_packet"`   // memcached CAS cap on concurrent transactions per packet
	ExpiryInterval time.Duration `yaml:"expiry_interval"` // how often packet tables are scanned for expired packets
	// Limits bound a send: max_amount (cents), max_count, max_greeting (runes).
	Limits model.Limits `yaml:",inline"`
}

// defaultPacketConfig returns the PacketConfig defaults.
func defaultPacketConfig() PacketConfig {
	return PacketConfig{
		PacketExpiry:   24 * time.Hour, // WeChat's rule: unclaimed money returns after 24 h
		OpenStrategy:   StrategyGrouped,
		BatchMax:       128, // one fsync per 128 opens; bigger batches add little past this
		BatchWait:      0,   // take what is queued now; the queue fills while a commit runs
		QueueDepth:     8192,
		QueueWaitMax:   500 * time.Millisecond, // QQ's rule: after 500 ms the client gave up
		CreditShedFrom: 400 * time.Millisecond, // above the relay's linger and yield (relay.LingerMax 200 ms, relay.YieldMax 250 ms, from the claim's creation) and a loaded delivery
		CreditShedAll:  1000 * time.Millisecond,
		TxPerPacket:    1,               // one transaction per packet at a time: no lock fights
		ExpiryInterval: 5 * time.Second, // each pass reads ~3 day tables per owned shard
		Limits:         model.DefaultLimits(),
	}
}

// CommitConfig is how the cell's writes reach its database: the commit
// lanes of the group committer (cell/groupcommit) and the connections.
type CommitConfig struct {
	// GroupMax is the most requests one group commit carries (grouped): a
	// packet's batch of opens counts its opens, a credit batch its credits.
	GroupMax int `yaml:"group_max"`
	// GroupWait bounds how long a busy commit lane waits for its group to
	// fill (grouped); the lane chooses the wait below it from its arrival
	// rate and commit time, and an idle lane never waits (cell/groupcommit).
	GroupWait time.Duration `yaml:"group_wait"`
	// CommitLanes is how the owned databases map to commit lanes (grouped):
	// 0, one lane per database, so no transaction spans two databases (the
	// unit that moves between cells); N > 0 (default 2), database db joins
	// lane db % N, so one transaction may span databases of this cell. One transaction is
	// in flight per lane and space at a time.
	CommitLanes    int           `yaml:"commit_lanes"`
	MaxConns       int           `yaml:"max_conns"`       // database connections
	RequestTimeout time.Duration `yaml:"request_timeout"` // deadline of a request when the caller sent none
}

// defaultCommitConfig returns the CommitConfig defaults.
func defaultCommitConfig() CommitConfig {
	return CommitConfig{
		// Two full hot batches (BatchMax) or hundreds of cold ops per fsync;
		// past a few hundred, a group mostly holds its rows' locks longer and
		// one failed COMMIT answers more requests.
		GroupMax: 256,
		// About one commit's time on a local disk: the most a group commit
		// adds to a request's latency, far below the 50 ms open p99 target.
		// The lane waits less when its commits are faster (half of one) or
		// its arrivals too slow to add a request meanwhile.
		GroupWait: 2 * time.Millisecond,
		// Two lanes per space: on cold traffic a lane per database (0) made
		// groups of 1.7 requests and half the rate of 2 lanes (groups of
		// 5.4, p99 a third), measured in one bench invocation on 2 cores;
		// 1 lane was no better than 2. A transaction may then span two
		// databases of this cell's server, which stays atomic; moving a
		// database freezes its shards first, so no group touches it then.
		CommitLanes:    2,
		MaxConns:       64,
		RequestTimeout: 3 * time.Second,
	}
}

// GuardConfig is what guards the cell from more than it can take: its own
// rate limit and the circuit breakers of its MariaDB and memcached.
type GuardConfig struct {
	// RateLimitPerSec and RateBurst are the cell's own token bucket over every
	// /v1 request (stress traffic included; not /healthz or the cell-to-cell
	// /internal/credits): beyond it the cell answers 429 CELL_RATE_LIMITED
	// without touching its store. It guards the cell when several routers, or
	// clients that bypass them, send more than it can take.
	RateLimitPerSec int `yaml:"rate_limit_per_sec"`
	RateBurst       int `yaml:"rate_burst"`
	// Breaker is the circuit breakers' settings, one breaker for MariaDB and
	// one for memcached, alike (cell/guard; breaker_failures,
	// breaker_cooldown). The caller that opens the stores builds them.
	Breaker guard.Config `yaml:",inline"`
}

// defaultGuardConfig returns the GuardConfig defaults.
func defaultGuardConfig() GuardConfig {
	return GuardConfig{
		// Well above what one cell serves on a 2-core machine, so that it only
		// binds a flood; set it near the cell's measured ceiling in production.
		RateLimitPerSec: 100_000,
		RateBurst:       20_000, // 200 ms of the rate: absorbs a router's reconnect burst
		Breaker:         guard.DefaultConfig(),
	}
}

// RewardConfig is the reward wallet's issuing and booking (cell/rewards,
// budgets.go).
type RewardConfig struct {
	// Activities is the reward activities' YAML file (cell/activity),
	// loaded at start (an invalid file stops the cell) and again on POST
	// /admin/activities/reload; empty: none. A relative path in a config
	// file is relative to that file.
	Activities string `yaml:"activities"`
	// RewardKeys is the reward token key file (cell/rewardtoken: Ed25519
	// keys by ID, one active); empty: the cell issues no rewards (404).
	RewardKeys string `yaml:"reward_keys"`
	// TokenTTL is how long a reward token handed back by its client
	// (POST .../tokens) is accepted after its issue; 0: forever.
	TokenTTL time.Duration `yaml:"token_ttl"`
	// RewardCashMax caps one cash reward, cents, whatever a scene's rule
	// allows.
	RewardCashMax int64 `yaml:"reward_cash_max"`
	// BookingRate bounds the rewards each space's booker books per second,
	// apart from the issue rate; BookingBatch is the most it books in one
	// transaction.
	BookingRate  int `yaml:"booking_rate"`
	BookingBatch int `yaml:"booking_batch"`
	// BookingInterval is how often each space's booker books the databases
	// issued into since its last pass (docs/rewards.md): a reward waits up
	// to this long for its booking, and a longer interval books more
	// rewards per database at once (one locking read, one UPDATE and, per
	// shard table, one flow INSERT and one balance upsert for all of them).
	BookingInterval time.Duration `yaml:"booking_interval"`
	// BudgetLeaseTTL is how long a cell spends from one budget lease before
	// giving back its rest and taking a new one; a dead cell's leases are
	// settled a little after it (0: cell/budget's default, 60 s).
	BudgetLeaseTTL time.Duration `yaml:"budget_lease_ttl"`
}

// defaultRewardConfig returns the RewardConfig defaults.
func defaultRewardConfig() RewardConfig {
	return RewardConfig{
		// A token's copy held by its client is worth handing back for a
		// festival and its aftermath, not forever.
		TokenTTL: 30 * 24 * time.Hour,
		// 200.00 CNY: a rain's largest prize is far below; a mistyped rule
		// cannot pay more than this per reward.
		RewardCashMax: 20_000,
		// Booking runs apart from issuing (the seed planned 300,000
		// bookings/s against 1.8 million issues/s); on 2 cores a few
		// thousand a second leaves the database to opens.
		BookingRate:     5_000,
		BookingBatch:    200,
		BookingInterval: 2 * time.Second,
	}
}

// WalletConfig is the wallet's withdrawals (cell/wallet).
type WalletConfig struct {
	// WithdrawRelease is the gray release of withdrawals at start (the admin
	// port changes it: PUT /admin/withdraw).
	WithdrawRelease WithdrawRelease `yaml:"withdraw_release"`
}

// defaultWalletConfig returns the WalletConfig defaults.
func defaultWalletConfig() WalletConfig {
	return WalletConfig{WithdrawRelease: WithdrawRelease{Percent: 100, Allow: []string{}}}
}

// CouponConfig is the coupon drop (cell/coupons, cell/couponq).
type CouponConfig struct {
	// Coupons is the coupon batches' YAML file (cell/couponbatch), loaded
	// at start (an invalid file stops the cell) and again on POST
	// /admin/coupons/reload; empty: the coupon routes answer 501
	// COUPONS_DISABLED. A relative path in a config file is relative to
	// that file.
	Coupons string `yaml:"coupons"`
	// CouponRates are the cluster-wide rates of the two coupon layers,
	// requests per second shared by every cell (internal/climit): [0] the
	// activity decision, [1] the stock deduction and issue.
	CouponRates LayerRates `yaml:"coupon_rates"`
	// CouponMergeMax is the most queued requests one stock deduction takes
	// (cell/couponq.Config.MergeMax).
	CouponMergeMax int `yaml:"coupon_merge_max"`
	// CouponPrefetch is how many units beyond its own a merge's deduction
	// asks the batch's home for, kept as a held lease the next merges
	// deduct from (cell/couponq.Config.Prefetch); 0: a grant per merge.
	CouponPrefetch int `yaml:"coupon_prefetch"`
	// CouponQueueLen bounds each coupon layer's local queue.
	CouponQueueLen int `yaml:"coupon_queue_len"`
	// CouponGather is how long each coupon layer's gatherer waits after a
	// chunk's first request for more ([0] layer 1's decisions, [1] layer
	// 2's merges; cell/couponq.Config.Gather); 0: what is queued at once.
	CouponGather LayerWaits `yaml:"coupon_gather"`
	// CouponStaleAfter is how long a coupon request may stay deciding before
	// it is taken again (a cell died or stopped holding it).
	CouponStaleAfter time.Duration `yaml:"coupon_stale_after"`
}

// defaultCouponConfig returns the CouponConfig defaults.
func defaultCouponConfig() CouponConfig {
	return CouponConfig{
		// The seed's drop issued about 10^5 coupons a second over a whole
		// cluster; 20,000 a second per layer is far above what two cells on
		// two cores take, so on this machine it binds only a flood.
		CouponRates: [2]int{20_000, 20_000},
		// One deduction per 64 requests of a hot batch: a 64th of the stock
		// row's lock time, and a merge small enough to commit in one fsync.
		CouponMergeMax: 64,
		// Half a full merge: on a hot batch, one grant and one return at
		// its home serve about ten merges of the open-loop drop.
		CouponPrefetch: 32,
		// About a fifth of a second of the layer rates: a queue that holds
		// more would hold requests past the seed's 0.5 s target.
		CouponQueueLen: 4096,
		// A busy cell's decisions and merges each take the requests of
		// 10 ms and 40 ms: at 600 requests/s on this machine the cluster
		// spent about an eighth less CPU and the accepts' p99 about halved,
		// for about 40 ms more from accept to issued (docs/performance.md).
		CouponGather: [2]time.Duration{10 * time.Millisecond, 40 * time.Millisecond},
		// A step holds a request at most 30 s (its timeout); past that the
		// cell holding it is gone.
		CouponStaleAfter: time.Minute,
	}
}

// LayerRates are the coupon layers' rates, requests/s: [layer 1, layer 2].
// In a config file, a list of exactly two (coupon_rates).
type LayerRates [2]int

// UnmarshalYAML reads coupon_rates. Errors: not a list of two integers.
func (r *LayerRates) UnmarshalYAML(n *yaml.Node) error {
	return decodePair(n, (*[2]int)(r), "coupon_rates", "rates")
}

// LayerWaits are the coupon layers' gather waits: [layer 1, layer 2]. In a
// config file, a list of exactly two durations (coupon_gather).
type LayerWaits [2]time.Duration

// UnmarshalYAML reads coupon_gather. Errors: not a list of two durations.
func (w *LayerWaits) UnmarshalYAML(n *yaml.Node) error {
	return decodePair(n, (*[2]time.Duration)(w), "coupon_gather", "waits")
}

// decodePair decodes n, a list of exactly two values, into p.
func decodePair[T any](n *yaml.Node, p *[2]T, key, what string) error {
	var l []T
	if err := n.Decode(&l); err != nil {
		return fmt.Errorf("cell.%s: %w", key, err)
	}
	if len(l) == 0 { // [] keeps the default, as it always did
		return nil
	}
	if len(l) != 2 {
		return fmt.Errorf("cell.%s must be two %s, [layer 1, layer 2], got %d (line %d)", key, what, len(l), n.Line)
	}
	*p = [2]T{l[0], l[1]}
	return nil
}

// RetentionConfig is how long rows stay: the archive and export passes
// (archive.go) and the shadow space's drop (shadow.go).
type RetentionConfig struct {
	// RetentionDays is how many days a settled packet and its claims stay
	// in their day table (t_packet_Y_DD, t_claim_Y_DD) before they move to
	// the shard's archive tables (t_packet_Y_00, t_claim_Y_00); nil: the
	// default, Config.Retention. At least PacketExpiry + 72h (the expiry,
	// the two days after it in which opens still take the queue, and a day
	// for the refund), at most MaxRetention (25 days), so day DD is empty
	// before it comes round next month. 0 turns archiving off (day tables
	// then fill month after month).
	RetentionDays *int `yaml:"retention_days"`
	// ArchiveInterval is how often the archive pass runs (with Retention).
	ArchiveInterval time.Duration `yaml:"archive_interval"`
	// ExportDays is how many days old rows get before the export pass, run
	// after each archive pass, writes them to checksummed files under
	// ExportDir and deletes them (storage.ExportPass): archived packets
	// with their claims, flows, booked rewards, refused coupon requests. 0
	// (the default) turns it off; else at least Retention +
	// MinExportMargin, so the archive, the relay, reconciliation and the
	// audits are done with a row before it leaves, and at most
	// MaxExportAfter.
	ExportDays int `yaml:"export_days"`
	// ExportDir is the directory the export files go to (one folder per
	// database); needed when ExportDays is set. A relative path in a config
	// file is relative to that file; there, empty is export/<cell name>.
	ExportDir string `yaml:"export_dir"`
	// ShadowRetention: once the cell has served no stress traffic for this
	// long, it drops its shadow space (the shadow databases of the databases
	// it owns, as POST /admin/shadow/cleanup does), checked every 10
	// minutes; its start counts as stress traffic. 0 turns it off; else at
	// least 1h.
	ShadowRetention time.Duration `yaml:"shadow_retention"`
}

// defaultRetentionConfig returns the RetentionConfig defaults.
func defaultRetentionConfig() RetentionConfig {
	return RetentionConfig{
		// RetentionDays nil: a week, or longer when packets live longer
		// (Config.Retention).
		ArchiveInterval: time.Hour,
		// Three days: a bench's rows outlive a weekend between its runs,
		// and a cluster benched now and then does not keep them for good.
		ShadowRetention: 72 * time.Hour,
	}
}

// ReconConfig is the schedule of the passes that deliver and check money
// between cells: the relay, reconciliation and the cell's own audit.
type ReconConfig struct {
	RelayInterval time.Duration `yaml:"relay_interval"` // how often the relay offers again what no lane took, reads claims it must and (every relay.PositionEvery) saves positions
	// ReconInterval is how often reconciliation checks the claims made since its
	// last pass against the claimants' credits (cell/recon).
	ReconInterval time.Duration `yaml:"recon_interval"`
	// ReconSettle is how old a claim must be before reconciliation checks it:
	// by then its transaction has committed and its credit normally arrived,
	// so a claim still undelivered at that age is reported as lag.
	ReconSettle time.Duration `yaml:"recon_settle"`
	// AuditInterval is how often the cell audits all of its own books (both
	// spaces; reads every money row, like redcell audit does for one cell).
	AuditInterval time.Duration `yaml:"audit_interval"`
}

// defaultReconConfig returns the ReconConfig defaults.
func defaultReconConfig() ReconConfig {
	return ReconConfig{
		RelayInterval: time.Second,
		// Near real time, as the reward wallet does it: a difference is found
		// within about two minutes of the claim that made it.
		ReconInterval: time.Minute,
		// An open transaction commits within 5 s of its claims' creation time
		// (txTimeout); a failed delivery is retried by its lane after at most
		// 5 s of backoff (relayBackoffMax), each attempt bounded by 2 s
		// (relayAttemptTimeout), and by the scan. 30 s covers both, so a claim
		// undelivered at that age is late, not merely in flight.
		ReconSettle: 30 * time.Second,
		// The full audit reads every money row of the cell: hourly keeps its cost
		// small next to the traffic while no difference goes unseen for long.
		AuditInterval: time.Hour,
	}
}

// ClusterConfig is the cell's place in the cluster: the shard map it
// announces, moves of databases, failover to its standby and the serving
// lease of its processes.
type ClusterConfig struct {
	MapVersion int64 `yaml:"map_version"` // version of the shard map this cell announces
	// MoveGrace is how long a cell keeps its copy of a database it handed to
	// another cell (cell/moves) before it drops it, after checking the copy
	// did not change since the handover. Default 10 minutes.
	MoveGrace time.Duration `yaml:"move_grace"`
	// FailoverAfter is how long the primary may stay silent before its
	// standby is promoted: long enough that a restart of the server (the
	// db_restart drill, about a second) never promotes.
	FailoverAfter time.Duration `yaml:"failover_after"`
	// LeaseTTL is how long a cell process's serving lease lasts unrenewed:
	// another process of the cell takes over after it (cmd/redcell).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
}

// defaultClusterConfig returns the ClusterConfig defaults.
func defaultClusterConfig() ClusterConfig {
	return ClusterConfig{
		MapVersion:    1,
		MoveGrace:     10 * time.Minute,
		FailoverAfter: 30 * time.Second,
		// Long enough that a GC pause or a slow renewal does not hand the
		// cell over, short enough that a dead process's cell serves again
		// within seconds (the cell_takeover drill: about 4 s).
		LeaseTTL: 4 * time.Second,
	}
}

// validate checks the open path's values.
func (c PacketConfig) validate(bad func(string, ...any)) {
	if c.PacketExpiry < time.Second || c.PacketExpiry > 7*24*time.Hour {
		bad("PacketExpiry (packet_expiry) must be 1s..168h, got %s", c.PacketExpiry)
	}
	switch c.OpenStrategy {
	case StrategyNaive, StrategySerial, StrategyBatched, StrategyGrouped:
	default:
		bad("OpenStrategy (open_strategy) must be naive, serial, batched or grouped, got %q", c.OpenStrategy)
	}
	if c.BatchMax < 1 || c.BatchMax > 4096 {
		bad("BatchMax (batch_max) must be 1..4096")
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		bad("BatchWait (batch_wait) must be 0..1s")
	}
	if c.QueueDepth < 1 || c.QueueWaitMax <= 0 {
		bad("QueueDepth and QueueWaitMax (queue_depth, queue_wait_max) must be > 0")
	}
	if c.CreditShedFrom < 0 || (c.CreditShedFrom > 0 && c.CreditShedAll <= c.CreditShedFrom) {
		bad("CreditShedFrom (credit_shed_from) must be 0 (off) or > 0 with CreditShedAll (credit_shed_all) above it")
	}
	if c.TxPerPacket < 1 {
		bad("TxPerPacket (tx_per_packet) must be >= 1")
	}
	if c.ExpiryInterval <= 0 {
		bad("ExpiryInterval (expiry_interval) must be > 0")
	}
	if err := c.Limits.Validate(); err != nil {
		bad("%v", err)
	}
}

// validate checks the commit lanes' and connections' values.
func (c CommitConfig) validate(bad func(string, ...any)) {
	if c.GroupMax < 1 || c.GroupMax > 4096 {
		bad("GroupMax (group_max) must be 1..4096")
	}
	if c.GroupWait < 0 || c.GroupWait > time.Second || c.GroupWait%time.Millisecond != 0 {
		bad("GroupWait (group_wait) must be 0..1s in whole milliseconds (the admin port sets it in ms), got %s", c.GroupWait)
	}
	if c.CommitLanes < 0 || c.CommitLanes > model.ShardCount/10 {
		bad("CommitLanes (commit_lanes) must be 0 (one lane per database) .. %d (the databases)", model.ShardCount/10)
	}
	if c.MaxConns < 2 {
		bad("MaxConns (max_conns) must be >= 2")
	}
	if c.RequestTimeout <= 0 {
		bad("RequestTimeout (request_timeout) must be > 0")
	}
}

// validate checks the rate limit's and the breakers' values.
func (c GuardConfig) validate(bad func(string, ...any)) {
	if c.RateLimitPerSec < 1 || c.RateBurst < 1 {
		bad("RateLimitPerSec and RateBurst (rate_limit_per_sec, rate_burst) must be >= 1")
	}
	if err := c.Breaker.Validate(); err != nil {
		bad("breaker_failures must be >= 1 and breaker_cooldown > 0: %v", err)
	}
}

// validate checks the reward wallet's values.
func (c RewardConfig) validate(bad func(string, ...any)) {
	if c.TokenTTL < 0 {
		bad("TokenTTL (token_ttl) must be >= 0 (0: tokens never expire)")
	}
	if c.BudgetLeaseTTL != 0 && (c.BudgetLeaseTTL < 2*time.Second || c.BudgetLeaseTTL > time.Hour) {
		bad("BudgetLeaseTTL (budget_lease_ttl) must be 0 (the default, 60s) or 2s..1h")
	} else if err := poolConfig(c.BudgetLeaseTTL).Validate(); err != nil {
		bad("BudgetLeaseTTL (budget_lease_ttl): %v", err)
	}
	if c.RewardCashMax < 1 {
		bad("RewardCashMax (reward_cash_max) must be >= 1 cent")
	}
	if c.BookingRate < 1 || c.BookingBatch < 1 || c.BookingBatch > 1000 {
		bad("BookingRate (booking_rate) must be >= 1 and BookingBatch (booking_batch) 1..1000")
	}
	if c.BookingInterval < 10*time.Millisecond || c.BookingInterval > 10*time.Second {
		bad("BookingInterval (booking_interval) must be 10ms..10s")
	}
}

// validate checks the coupon drop's values.
func (c CouponConfig) validate(bad func(string, ...any)) {
	if c.CouponRates[0] < 1 || c.CouponRates[1] < 1 {
		bad("CouponRates (coupon_rates) must be >= 1 request/s for both layers")
	}
	if c.CouponMergeMax < 1 || c.CouponMergeMax > 1000 {
		bad("CouponMergeMax (coupon_merge_max) must be 1..1000")
	}
	if c.CouponPrefetch < 0 || c.CouponPrefetch > 10000 {
		bad("CouponPrefetch (coupon_prefetch) must be 0..10000")
	}
	if c.CouponGather[0] < 0 || c.CouponGather[1] < 0 || c.CouponGather[0]+c.CouponGather[1] > 400*time.Millisecond {
		bad("CouponGather (coupon_gather) must be two waits >= 0 adding up to at most 400ms: they add to the seed's 0.5 s from accept to issued")
	}
	if c.CouponQueueLen < 1 || c.CouponQueueLen > 1_000_000 {
		bad("CouponQueueLen (coupon_queue_len) must be 1..1000000")
	}
	if c.CouponStaleAfter < 31*time.Second {
		bad("CouponStaleAfter (coupon_stale_after) must be at least 31s: longer than a coupon step's 30 s timeout")
	}
}

// validate checks the retention's values on their own (Config.Validate
// checks them against the packets' life).
func (c RetentionConfig) validate(bad func(string, ...any)) {
	if d := c.RetentionDays; d != nil && (*d < 0 || *d > 365) {
		bad("RetentionDays (retention_days) must be 0 (off) .. 365, got %d", *d)
	}
	if c.ArchiveInterval <= 0 || c.ArchiveInterval > 24*time.Hour {
		bad("ArchiveInterval (archive_interval) must be > 0 and at most 24h, got %s", c.ArchiveInterval)
	}
	if maxDays := int(MaxExportAfter / (24 * time.Hour)); c.ExportDays < 0 || c.ExportDays > maxDays {
		bad("ExportDays (export_days) must be 0 (off) .. %d, got %d", maxDays, c.ExportDays)
	}
	if c.ShadowRetention != 0 && c.ShadowRetention < time.Hour {
		bad("ShadowRetention (shadow_retention) must be 0 (off) or at least 1h, got %s: shorter would drop a bench's rows between two of its runs", c.ShadowRetention)
	}
}

// validate checks the relay's, reconciliation's and audit's schedule.
func (c ReconConfig) validate(bad func(string, ...any)) {
	if c.RelayInterval <= 0 || c.ReconInterval <= 0 || c.ReconSettle <= 0 || c.AuditInterval <= 0 {
		bad("RelayInterval, ReconInterval, ReconSettle and AuditInterval (relay_interval, recon_interval, recon_settle, audit_interval) must be > 0")
	}
}

// validate checks the map version, moves', failover's and lease's values.
func (c ClusterConfig) validate(bad func(string, ...any)) {
	if c.MapVersion < 1 {
		bad("MapVersion (map_version) must be >= 1, got %d", c.MapVersion)
	}
	if c.MoveGrace <= 0 {
		bad("MoveGrace (move_grace) must be > 0, got %s", c.MoveGrace)
	}
	if c.FailoverAfter < 2*time.Second || c.FailoverAfter > time.Hour {
		bad("FailoverAfter (failover_after) must be 2s..1h, got %s", c.FailoverAfter)
	}
	if c.LeaseTTL < time.Second || c.LeaseTTL > time.Minute {
		bad("LeaseTTL (lease_ttl) must be 1s..1m, got %s", c.LeaseTTL)
	}
}
