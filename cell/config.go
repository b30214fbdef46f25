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
	"redcell/cell/wallet"
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
//
// The fields with YAML keys are what a config file's `cell:` section sets,
// one flat mapping (docs/config.md): the section is decoded straight over
// DefaultConfig, so a key left out keeps its default and a key given, 0
// included, sets its value (cmd/redcell). The feature sub-structs are
// inlined into it and validated on their own (Validate). The fields marked
// yaml:"-" come from the file's other parts (cells[], the top level) or
// from the caller that wires the cell.
type Config struct {
	Name   string          `yaml:"-"` // unique cell name, announced through memberlist
	Listen string          `yaml:"-"` // HTTP listen address, host:port
	Shards sharding.Ranges `yaml:"-"` // shards this cell owns: whole databases (sharding.Ranges.CheckWholeDBs)
	DSN    string          `yaml:"-"` // MariaDB DSN without database, e.g. "root@tcp(127.0.0.1:23061)/"
	// StandbyDSN is a semi-synchronous replica of DSN's server (empty: none):
	// promoted when that server has not answered for FailoverAfter
	// (storage.Failover; the caller opens the stores, cmd/redcell).
	StandbyDSN string `yaml:"-"`

	// AdminListen is the admin port (runtime strategy switch), apart from the
	// public one; empty means no admin port. AdminToken is the bearer token it
	// requires; with no token every admin request is refused.
	AdminListen string `yaml:"-"`
	AdminToken  string `yaml:"-"`

	// ClusterSecret keys the HMAC that signs every call to a cell: the requests
	// routers forward and the credits cells relay (api.Signer). A cell refuses
	// unsigned, wrongly signed and stale calls with 401 UNAUTHENTICATED, all but
	// GET /healthz. At least 16 bytes: without one a cell does not start.
	ClusterSecret string `yaml:"-"`

	// IdentityKey keys the hashes that bind app accounts to actIDs
	// (model.PhoneActID, model.AppAccountActID, model.PhoneHash): every cell
	// of a cluster must have the same, and it must never change, or the same
	// phone gets another actID. Empty: identity binding answers 501
	// IDENTITY_DISABLED. Else at least model.IdentityKeyMin (16) bytes.
	IdentityKey string `yaml:"-"`
	// IdentityDefaultRegion is the region (ISO 3166-1 alpha-2) a bound
	// phone number without a '+' is read in (model.ParsePhone): with "CN",
	// "13800138111", "008613800138111" and "+86 138 0013 8111" are one
	// number, keyed on its E.164 form. The same in every cell, like
	// IdentityKey, and changed only with care: another region reads the
	// national numbers sent afterwards as another country's.
	IdentityDefaultRegion string `yaml:"-"`

	Memcached []string `yaml:"-"` // memcached servers for the CAS cap and the grab cache
	// CouponMemcache keeps the coupon layers' cluster-wide token pools
	// (internal/climit); nil: each cell takes rate/N on its own.
	CouponMemcache climit.Memcache `yaml:"-"`
	// IssuedMemcache keeps the "issued so far" counters cluster-wide
	// (cell/issued); nil: each cell counts only its own issues.
	IssuedMemcache issued.Memcache `yaml:"-"`
	// SceneMemcache keeps each reward scene's rate_limit for the whole
	// cluster (cell/scenelimit: a token bucket per scene in memcached); nil:
	// each cell takes rate/N and burst/N on its own (N: the live cells).
	SceneMemcache climit.CASMemcache `yaml:"-"`

	PacketConfig    `yaml:",inline"`
	CommitConfig    `yaml:",inline"`
	GuardConfig     `yaml:",inline"`
	RewardConfig    `yaml:",inline"`
	WalletConfig    `yaml:",inline"`
	CouponConfig    `yaml:",inline"`
	RetentionConfig `yaml:",inline"`
	ReconConfig     `yaml:",inline"`
	ClusterConfig   `yaml:",inline"`

	// Degrade lists the features switched off (degraded) at start; the admin
	// port switches them at run time (GET/PUT /admin/degrade). In the file,
	// each switch is "on" or "off" (degrade.Config.UnmarshalYAML).
	Degrade Degrade `yaml:"degrade"`

	// WarmSchema creates today's and tomorrow's tables for every owned shard in the
	// background at start and hourly. Off, tables are still created on first use.
	WarmSchema bool `yaml:"-"`
	// WarmRetry is how long the warm-up waits after a pass that failed (the
	// database down) before it tries again, instead of the hour between passes.
	WarmRetry time.Duration `yaml:"-"`

	// Clock is where the cell and its parts read time and wait; nil is the
	// system clock (clock.Real). Tests and the simulation give a clock they
	// drive. Request deadlines (context.WithDeadline) still run on real time.
	Clock clock.Clock `yaml:"-"`
	// Failover switches the cell's database back to its primary after a
	// failover (POST /admin/failover); nil: the database has no standby.
	// Set by the caller that opened the stores (cmd/redcell).
	Failover admin.Failover `yaml:"-"`
}

// Retention is how long a settled packet and its claims stay in their day
// tables (RetentionDays): by default a week, or PacketExpiry + 3 days in
// whole days when that is longer; 0: archiving is off.
func (c Config) Retention() time.Duration {
	if c.RetentionDays == nil {
		const day = 24 * time.Hour
		return max(7*day, (c.PacketExpiry+72*time.Hour+day-1)/day*day)
	}
	return time.Duration(*c.RetentionDays) * 24 * time.Hour
}

// ExportAfter is how old rows get before they leave for the export files
// (ExportDays); 0: the export is off.
func (c Config) ExportAfter() time.Duration {
	return time.Duration(c.ExportDays) * 24 * time.Hour
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

		// Each part's defaults, with their reasons, are beside it
		// (config_parts.go).
		PacketConfig:    defaultPacketConfig(),
		CommitConfig:    defaultCommitConfig(),
		GuardConfig:     defaultGuardConfig(),
		RewardConfig:    defaultRewardConfig(),
		WalletConfig:    defaultWalletConfig(),
		CouponConfig:    defaultCouponConfig(),
		RetentionConfig: defaultRetentionConfig(),
		ReconConfig:     defaultReconConfig(),
		ClusterConfig:   defaultClusterConfig(),

		WarmSchema: true,
		// A failed pass costs little to repeat (tables are made IF NOT EXISTS,
		// and while the database breaker is open the store refuses at once), and
		// tomorrow's tables should not wait an hour for an outage of a minute.
		WarmRetry: 30 * time.Second,
	}
}

// Validate checks every value and how they relate: each feature's part
// checks its own (validate), the rest is checked here. Errors name the
// field and its key in a config file.
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
	if c.StandbyDSN != "" && c.StandbyDSN == c.DSN {
		bad("StandbyDSN (standby_dsn) must name another server than DSN")
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
	if c.WarmRetry <= 0 {
		bad("WarmRetry must be > 0")
	}
	c.PacketConfig.validate(bad)
	c.CommitConfig.validate(bad)
	c.GuardConfig.validate(bad)
	c.RewardConfig.validate(bad)
	if err := wallet.ValidateRelease(c.WithdrawRelease); err != nil {
		bad("WithdrawRelease (withdraw_release): %v", err)
	}
	c.CouponConfig.validate(bad)
	c.RetentionConfig.validate(bad)
	c.ReconConfig.validate(bad)
	c.ClusterConfig.validate(bad)
	// How the parts relate.
	if r := c.Retention(); r != 0 && (r < c.PacketExpiry+72*time.Hour || r > MaxRetention) {
		bad("Retention (retention_days) must be 0 (off) or from packet_expiry + 72h (%s) to %s, got %s",
			c.PacketExpiry+72*time.Hour, MaxRetention, r)
	}
	if x, r := c.ExportAfter(), c.Retention(); x != 0 && (r == 0 || x < r+MinExportMargin || c.ExportDir == "") {
		bad("ExportAfter (export_days) must be 0 (off) or, with archiving on (retention_days), from retention_days + 7 days (%s) to %s, with ExportDir (export_dir) set; got %s, dir %q",
			r+MinExportMargin, MaxExportAfter, x, c.ExportDir)
	}
	return errors.Join(errs...)
}
