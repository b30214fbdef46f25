// Package cell is one SET of redcell: it owns a range of shards and their
// MariaDB database, serves the wallet and red-packet API for them, serializes the
// opens of each packet through a FIFO worker, relays claims to the claimants'
// cells and refunds expired packets.
package cell

import (
	"errors"
	"fmt"
	"time"

	"redcell/api"
	"redcell/cell/admin"
	"redcell/cell/degrade"
	"redcell/cell/issued"
	"redcell/internal/climit"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
)

// WithdrawRelease is the gray release of withdrawals (api.WithdrawRelease).
type WithdrawRelease = api.WithdrawRelease

// Degrade lists the features switched off at start (cell/degrade.Config).
type Degrade = degrade.Config

// Open strategies (Config.OpenStrategy).
const (
	// StrategyNaive: every open runs its own transaction at once; concurrent opens
	// of one packet fight for its row lock.
	StrategyNaive = "naive"
	// StrategySerial: opens of one packet queue in a FIFO; one transaction per open.
	StrategySerial = "serial"
	// StrategyBatched: opens of one packet queue in a FIFO; the worker commits what
	// is queued (up to BatchMax) as one transaction.
	StrategyBatched = "batched"
	// StrategyGrouped: opens queue and batch per packet as under batched; each
	// packet's batch, and every send, deposit and received credit batch, then
	// joins its commit lane's group (cell/groupcommit): work for many keys of
	// one lane shares one transaction (up to GroupMax requests).
	StrategyGrouped = "grouped"
)

// MaxRetention bounds Config.Retention: a packet made at the end of day D
// is archived by D + 1 + 25 days + one ArchiveInterval (at most a day),
// before the shortest month brings day D round again 28 days after it
// began.
const MaxRetention = 25 * 24 * time.Hour

// MinExportMargin and MaxExportAfter bound Config.ExportAfter: a row leaves
// its table at least a week after its packet was archived, and within ten
// years.
const (
	MinExportMargin = 7 * 24 * time.Hour
	MaxExportAfter  = 3650 * 24 * time.Hour
)

// Config is one cell's configuration. Start from DefaultConfig.
type Config struct {
	Name   string          // unique cell name, announced through memberlist
	Listen string          // HTTP listen address, host:port
	Shards sharding.Ranges // shards this cell owns: whole databases (sharding.Ranges.CheckWholeDBs)
	DSN    string          // MariaDB DSN without database, e.g. "root@tcp(127.0.0.1:23061)/"
	// StandbyDSN is a semi-synchronous replica of DSN's server (empty: none):
	// promoted when that server has not answered for FailoverAfter
	// (storage.Failover; the caller opens the stores, cmd/redcell).
	StandbyDSN string
	// FailoverAfter is how long the primary may stay silent before its
	// standby is promoted: long enough that a restart of the server (the
	// db_restart drill, about a second) never promotes.
	FailoverAfter time.Duration

	// AdminListen is the admin port (runtime strategy switch), apart from the
	// public one; empty means no admin port. AdminToken is the bearer token it
	// requires; with no token every admin request is refused.
	AdminListen string
	AdminToken  string

	// ClusterSecret keys the HMAC that signs every call to a cell: the requests
	// routers forward and the credits cells relay (api.Signer). A cell refuses
	// unsigned, wrongly signed and stale calls with 401 UNAUTHENTICATED, all but
	// GET /healthz. At least 16 bytes: without one a cell does not start.
	ClusterSecret string

	// IdentityKey keys the hashes that bind app accounts to actIDs
	// (model.PhoneActID, model.AppAccountActID, model.PhoneHash): every cell
	// of a cluster must have the same, and it must never change, or the same
	// phone gets another actID. Empty: identity binding answers 501
	// IDENTITY_DISABLED. Else at least model.IdentityKeyMin (16) bytes.
	IdentityKey string
	// IdentityDefaultRegion is the region (ISO 3166-1 alpha-2) a bound
	// phone number without a '+' is read in (model.ParsePhone): with "CN",
	// "13800138111", "008613800138111" and "+86 138 0013 8111" are one
	// number, keyed on its E.164 form. The same in every cell, like
	// IdentityKey, and changed only with care: another region reads the
	// national numbers sent afterwards as another country's.
	IdentityDefaultRegion string

	// Activities is the reward activities' YAML file (cell/activity),
	// loaded at start (an invalid file stops the cell) and again on POST
	// /admin/activities/reload; empty: none.
	Activities string

	// Coupons is the coupon batches' YAML file (cell/couponbatch), loaded
	// at start (an invalid file stops the cell) and again on POST
	// /admin/coupons/reload; empty: the coupon routes answer 501
	// COUPONS_DISABLED.
	Coupons string
	// CouponRates are the cluster-wide rates of the two coupon layers,
	// requests per second shared by every cell (internal/climit): [0] the
	// activity decision, [1] the stock deduction and issue.
	CouponRates [2]int
	// CouponMergeMax is the most queued requests one stock deduction takes
	// (cell/couponq.Config.MergeMax).
	CouponMergeMax int
	// CouponPrefetch is how many units beyond its own a merge's deduction
	// asks the batch's home for, kept as a held lease the next merges
	// deduct from (cell/couponq.Config.Prefetch); 0: a grant per merge.
	CouponPrefetch int
	// CouponQueueLen bounds each coupon layer's local queue.
	CouponQueueLen int
	// CouponGather is how long each coupon layer's gatherer waits after a
	// chunk's first request for more ([0] layer 1's decisions, [1] layer
	// 2's merges; cell/couponq.Config.Gather); 0: what is queued at once.
	CouponGather [2]time.Duration
	// CouponStaleAfter is how long a coupon request may stay deciding before
	// it is taken again (a cell died or stopped holding it).
	CouponStaleAfter time.Duration
	// CouponMemcache keeps the coupon layers' cluster-wide token pools
	// (internal/climit); nil: each cell takes rate/N on its own.
	CouponMemcache climit.Memcache

	// RewardKeys is the reward token key file (cell/rewardtoken: Ed25519
	// keys by ID, one active); empty: the cell issues no rewards (404).
	RewardKeys string
	// TokenTTL is how long a reward token handed back by its client
	// (POST .../tokens) is accepted after its issue; 0: forever.
	TokenTTL time.Duration
	// RewardCashMax caps one cash reward, cents, whatever a scene's rule
	// allows.
	RewardCashMax int64
	// BookingRate bounds the rewards each space's booker books per second,
	// apart from the issue rate; BookingBatch is the most it books in one
	// transaction.
	BookingRate  int
	BookingBatch int
	// BookingInterval is how often each space's booker books the databases
	// issued into since its last pass (docs/rewards.md): a reward waits up
	// to this long for its booking, and a longer interval books more
	// rewards per database at once (one locking read, one UPDATE and, per
	// shard table, one flow INSERT and one balance upsert for all of them).
	BookingInterval time.Duration
	// BudgetLeaseTTL is how long a cell spends from one budget lease before
	// giving back its rest and taking a new one; a dead cell's leases are
	// settled a little after it (0: cell/budget's default, 60 s).
	BudgetLeaseTTL time.Duration
	// WithdrawRelease is the gray release of withdrawals at start (the admin
	// port changes it: PUT /admin/withdraw).
	WithdrawRelease WithdrawRelease
	// IssuedMemcache keeps the "issued so far" counters cluster-wide
	// (cell/issued); nil: each cell counts only its own issues.
	IssuedMemcache issued.Memcache
	// SceneMemcache keeps each reward scene's rate_limit for the whole
	// cluster (cell/scenelimit: a token bucket per scene in memcached); nil:
	// each cell takes rate/N and burst/N on its own (N: the live cells).
	SceneMemcache climit.CASMemcache

	Memcached []string // memcached servers for the CAS cap and the grab cache

	PacketExpiry time.Duration // a packet's life; the remainder is refunded after it
	OpenStrategy string        // naive | serial | batched | grouped
	BatchMax     int           // most opens committed in one transaction (batched)
	BatchWait    time.Duration // how long a worker waits for a batch to fill (batched)
	QueueDepth   int           // bounded FIFO length per packet; beyond it opens are shed
	QueueWaitMax time.Duration // an open that waited longer than this is shed (retryable)
	// CreditShedFrom and CreditShedAll bound the shedding of opens while the
	// relay is behind with this cell's credits (relay.Relay.Behind): none
	// shed up to CreditShedFrom, all from CreditShedAll, in proportion
	// between (creditshed.go). CreditShedFrom 0: never shed for credits.
	CreditShedFrom time.Duration
	CreditShedAll  time.Duration
	TxPerPacket    int           // memcached CAS cap on concurrent transactions per packet
	MaxConns       int           // database connections
	RequestTimeout time.Duration // deadline of a request when the caller sent none
	Limits         model.Limits

	// GroupMax is the most requests one group commit carries (grouped): a
	// packet's batch of opens counts its opens, a credit batch its credits.
	GroupMax int
	// GroupWait bounds how long a busy commit lane waits for its group to
	// fill (grouped); the lane chooses the wait below it from its arrival
	// rate and commit time, and an idle lane never waits (cell/groupcommit).
	GroupWait time.Duration
	// CommitLanes is how the owned databases map to commit lanes (grouped):
	// 0, one lane per database, so no transaction spans two databases (the
	// unit that moves between cells); N > 0 (default 2), database db joins
	// lane db % N, so one transaction may span databases of this cell. One transaction is
	// in flight per lane and space at a time.
	CommitLanes int

	// RateLimitPerSec and RateBurst are the cell's own token bucket over every
	// /v1 request (stress traffic included; not /healthz or the cell-to-cell
	// /internal/credits): beyond it the cell answers 429 CELL_RATE_LIMITED
	// without touching its store. It guards the cell when several routers, or
	// clients that bypass them, send more than it can take.
	RateLimitPerSec int
	RateBurst       int

	RelayInterval  time.Duration // how often the relay offers again what no lane took, reads claims it must and (every relay.PositionEvery) saves positions
	ExpiryInterval time.Duration // how often packet tables are scanned for expired packets
	// Retention is how long a settled packet and its claims stay in their
	// day table (t_packet_Y_DD, t_claim_Y_DD) before they move to the
	// shard's archive tables (t_packet_Y_00, t_claim_Y_00): at least
	// PacketExpiry + 72h (the expiry, the two days after it in which opens
	// still take the queue, and a day for the refund), at most MaxRetention
	// (25 days), so day DD is empty before it comes round next month. 0
	// turns archiving off (day tables then fill month after month).
	Retention time.Duration
	// ArchiveInterval is how often the archive pass runs (with Retention).
	ArchiveInterval time.Duration
	// ExportAfter is how old rows get before the export pass, run after
	// each archive pass, writes them to checksummed files under ExportDir
	// and deletes them (storage.ExportPass): archived packets with their
	// claims, flows, booked rewards, refused coupon requests. 0 (the
	// default) turns it off; else at least Retention + MinExportMargin, so
	// the archive, the relay, reconciliation and the audits are done with
	// a row before it leaves, and at most MaxExportAfter.
	ExportAfter time.Duration
	// ExportDir is the directory the export files go to (one folder per
	// database); needed when ExportAfter is set.
	ExportDir string
	// ShadowRetention: once the cell has served no stress traffic for this
	// long, it drops its shadow space (the shadow databases of the databases
	// it owns, as POST /admin/shadow/cleanup does), checked every 10
	// minutes; its start counts as stress traffic. 0 turns it off; else at
	// least 1h.
	ShadowRetention time.Duration
	MapVersion      int64 // version of the shard map this cell announces
	// MoveGrace is how long a cell keeps its copy of a database it handed to
	// another cell (cell/moves.go) before it drops it, after checking the copy
	// did not change since the handover. Default 10 minutes.
	MoveGrace time.Duration

	// ReconInterval is how often reconciliation checks the claims made since its
	// last pass against the claimants' credits (cell/recon).
	ReconInterval time.Duration
	// ReconSettle is how old a claim must be before reconciliation checks it:
	// by then its transaction has committed and its credit normally arrived,
	// so a claim still undelivered at that age is reported as lag.
	ReconSettle time.Duration
	// AuditInterval is how often the cell audits all of its own books (both
	// spaces; reads every money row, like redcell audit does for one cell).
	AuditInterval time.Duration

	// Degrade lists the features switched off (degraded) at start; the admin
	// port switches them at run time (GET/PUT /admin/degrade).
	Degrade Degrade

	// WarmSchema creates today's and tomorrow's tables for every owned shard in the
	// background at start and hourly. Off, tables are still created on first use.
	WarmSchema bool
	// WarmRetry is how long the warm-up waits after a pass that failed (the
	// database down) before it tries again, instead of the hour between passes.
	WarmRetry time.Duration

	// Clock is where the cell and its parts read time and wait; nil is the
	// system clock (clock.Real). Tests and the simulation give a clock they
	// drive. Request deadlines (context.WithDeadline) still run on real time.
	Clock clock.Clock
	// Failover switches the cell's database back to its primary after a
	// failover (POST /admin/failover); nil: the database has no standby.
	// Set by the caller that opened the stores (cmd/redcell).
	Failover admin.Failover `yaml:"-"`
}

// DefaultConfig returns a config with a reason for every value.
func DefaultConfig() Config {
	return Config{
		Name:   "cell-1",
		Listen: "127.0.0.1:9101",
		Shards: sharding.Ranges{{From: 0, To: model.ShardCount - 1}},
		DSN:    "root@tcp(127.0.0.1:23061)/",

		Memcached: []string{"127.0.0.1:21211"},

		// The red-packet festival's users are in mainland China: a number
		// sent without its country code is a Chinese one.
		IdentityDefaultRegion: "CN",

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
		WithdrawRelease: WithdrawRelease{Percent: 100, Allow: []string{}},
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

		PacketExpiry:   24 * time.Hour, // WeChat's rule: unclaimed money returns after 24 h
		OpenStrategy:   StrategyGrouped,
		BatchMax:       128, // one fsync per 128 opens; bigger batches add little past this
		BatchWait:      0,   // take what is queued now; the queue fills while a commit runs
		QueueDepth:     8192,
		QueueWaitMax:   500 * time.Millisecond, // QQ's rule: after 500 ms the client gave up
		CreditShedFrom: 400 * time.Millisecond, // above the relay's linger and yield (relay.LingerMax 200 ms, relay.YieldMax 250 ms, from the claim's creation) and a loaded delivery
		CreditShedAll:  1000 * time.Millisecond,
		TxPerPacket:    1, // one transaction per packet at a time: no lock fights
		MaxConns:       64,
		RequestTimeout: 3 * time.Second,
		Limits:         model.DefaultLimits(),
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
		CommitLanes: 2,
		// Well above what one cell serves on a 2-core machine, so that it only
		// binds a flood; set it near the cell's measured ceiling in production.
		RateLimitPerSec: 100_000,
		RateBurst:       20_000, // 200 ms of the rate: absorbs a router's reconnect burst

		RelayInterval:   time.Second,
		ExpiryInterval:  5 * time.Second, // each pass reads ~3 day tables per owned shard
		Retention:       7 * 24 * time.Hour,
		FailoverAfter:   30 * time.Second,
		ArchiveInterval: time.Hour,
		// Three days: a bench's rows outlive a weekend between its runs,
		// and a cluster benched now and then does not keep them for good.
		ShadowRetention: 72 * time.Hour,
		MapVersion:      1,
		MoveGrace:       10 * time.Minute,
		WarmSchema:      true,
		// A failed pass costs little to repeat (tables are made IF NOT EXISTS,
		// and while the database breaker is open the store refuses at once), and
		// tomorrow's tables should not wait an hour for an outage of a minute.
		WarmRetry: 30 * time.Second,

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

// Validate checks every value and how they relate.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("cell: "+format, args...)) }
	if c.Name == "" || len(c.Name) > 64 {
		bad("Name must be 1..64 characters")
	}
	if c.Listen == "" {
		bad("Listen is required")
	}
	if err := c.Shards.CheckWholeDBs(); err != nil {
		bad("Shards: %v", err)
	}
	if c.DSN == "" {
		bad("DSN is required")
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		bad("AdminToken (admin_token) must be empty (admin port refuses everything) or at least 16 bytes")
	}
	if len(c.ClusterSecret) < 16 {
		bad("ClusterSecret (cluster_secret) must be at least 16 bytes: every call to a cell must be signed with it")
	}
	if c.IdentityKey != "" && len(c.IdentityKey) < model.IdentityKeyMin {
		bad("IdentityKey (identity_key) must be empty (identity binding off) or at least %d bytes", model.IdentityKeyMin)
	}
	if err := model.ValidPhoneRegion(c.IdentityDefaultRegion); err != nil {
		bad("IdentityDefaultRegion (identity_default_region): %v", err)
	}
	if c.TokenTTL < 0 {
		bad("TokenTTL must be >= 0 (0: tokens never expire)")
	}
	if c.BudgetLeaseTTL != 0 && (c.BudgetLeaseTTL < 2*time.Second || c.BudgetLeaseTTL > time.Hour) {
		bad("BudgetLeaseTTL (budget_lease_ttl) must be 0 (the default, 60s) or 2s..1h")
	} else if err := poolConfig(c.BudgetLeaseTTL).Validate(); err != nil {
		bad("BudgetLeaseTTL: %v", err)
	}
	if c.RewardCashMax < 1 {
		bad("RewardCashMax (reward_cash_max) must be >= 1 cent")
	}
	if c.BookingRate < 1 || c.BookingBatch < 1 || c.BookingBatch > 1000 {
		bad("BookingRate must be >= 1 and BookingBatch 1..1000")
	}
	if c.BookingInterval < 10*time.Millisecond || c.BookingInterval > 10*time.Second {
		bad("BookingInterval must be 10ms..10s")
	}
	if err := validateRelease(c.WithdrawRelease); err != nil {
		bad("WithdrawRelease: %v", err)
	}
	if c.PacketExpiry < time.Second || c.PacketExpiry > 7*24*time.Hour {
		bad("PacketExpiry must be 1s..168h, got %s", c.PacketExpiry)
	}
	switch c.OpenStrategy {
	case StrategyNaive, StrategySerial, StrategyBatched, StrategyGrouped:
	default:
		bad("OpenStrategy must be naive, serial, batched or grouped, got %q", c.OpenStrategy)
	}
	if c.BatchMax < 1 || c.BatchMax > 4096 {
		bad("BatchMax must be 1..4096")
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		bad("BatchWait must be 0..1s")
	}
	if c.GroupMax < 1 || c.GroupMax > 4096 {
		bad("GroupMax must be 1..4096")
	}
	if c.GroupWait < 0 || c.GroupWait > time.Second || c.GroupWait%time.Millisecond != 0 {
		bad("GroupWait must be 0..1s in whole milliseconds (the admin port sets it in ms), got %s", c.GroupWait)
	}
	if c.CommitLanes < 0 || c.CommitLanes > model.ShardCount/10 {
		bad("CommitLanes must be 0 (one lane per database) .. %d (the databases)", model.ShardCount/10)
	}
	if c.QueueDepth < 1 || c.QueueWaitMax <= 0 {
		bad("QueueDepth and QueueWaitMax must be > 0")
	}
	if c.CreditShedFrom < 0 || (c.CreditShedFrom > 0 && c.CreditShedAll <= c.CreditShedFrom) {
		bad("CreditShedFrom must be 0 (off) or > 0 with CreditShedAll above it")
	}
	if c.TxPerPacket < 1 {
		bad("TxPerPacket must be >= 1")
	}
	if c.MaxConns < 2 {
		bad("MaxConns must be >= 2")
	}
	if c.Retention != 0 && (c.Retention < c.PacketExpiry+72*time.Hour || c.Retention > MaxRetention) {
		bad("Retention (retention_days) must be 0 (off) or from packet_expiry + 72h (%s) to %s, got %s",
			c.PacketExpiry+72*time.Hour, MaxRetention, c.Retention)
	}
	if c.ExportAfter != 0 && (c.Retention == 0 || c.ExportAfter < c.Retention+MinExportMargin || c.ExportAfter > MaxExportAfter || c.ExportDir == "") {
		bad("ExportAfter (export_days) must be 0 (off) or, with archiving on (retention_days), from retention_days + 7 days (%s) to %s, with ExportDir (export_dir) set; got %s, dir %q",
			c.Retention+MinExportMargin, MaxExportAfter, c.ExportAfter, c.ExportDir)
	}
	if c.FailoverAfter < 2*time.Second || c.FailoverAfter > time.Hour {
		bad("FailoverAfter (failover_after) must be 2s..1h, got %s", c.FailoverAfter)
	}
	if c.StandbyDSN != "" && c.StandbyDSN == c.DSN {
		bad("StandbyDSN (standby_dsn) must name another server than DSN")
	}
	if c.ShadowRetention != 0 && c.ShadowRetention < time.Hour {
		bad("ShadowRetention (shadow_retention) must be 0 (off) or at least 1h, got %s: shorter would drop a bench's rows between two of its runs", c.ShadowRetention)
	}
	if c.ArchiveInterval <= 0 || c.ArchiveInterval > 24*time.Hour {
		bad("ArchiveInterval (archive_interval) must be > 0 and at most 24h, got %s", c.ArchiveInterval)
	}
	if c.RequestTimeout <= 0 || c.RelayInterval <= 0 || c.ExpiryInterval <= 0 || c.WarmRetry <= 0 {
		bad("RequestTimeout, RelayInterval, ExpiryInterval and WarmRetry must be > 0")
	}
	if c.ReconInterval <= 0 || c.ReconSettle <= 0 || c.AuditInterval <= 0 {
		bad("ReconInterval, ReconSettle and AuditInterval must be > 0")
	}
	if c.RateLimitPerSec < 1 || c.RateBurst < 1 {
		bad("RateLimitPerSec and RateBurst must be >= 1")
	}
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
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
