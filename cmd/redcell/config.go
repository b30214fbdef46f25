package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.yaml.in/yaml/v3"

	"redcell/cell"
	"redcell/cell/guard"
	"redcell/model"
	"redcell/router"
	"redcell/sharding"
)

// fileConfig is the cluster config file (deploy/local/redcell.yaml documents every
// key). One file describes the whole local cluster; each process picks its part.
type fileConfig struct {
	Memcached     []string      `yaml:"memcached"`
	AdminToken    string        `yaml:"admin_token"`    // bearer token of the cells' admin ports; empty refuses all
	ClusterSecret string        `yaml:"cluster_secret"` // HMAC key of every call to a cell (router, cells, bench direct), >= 16 bytes
	IdentityKey   string        `yaml:"identity_key"`   // HMAC key of identity bindings (phone → actID); never changed; "" turns binding off
	GossipSeeds   []string      `yaml:"gossip_seeds"`
	Router        routerSection `yaml:"router"`
	Cells         []cellEntry   `yaml:"cells"`
	Cell          cellSection   `yaml:"cell"`

	// IdentityDefaultRegion: the region a bound phone without '+' is read
	// in (cell.Config.IdentityDefaultRegion); "" keeps the default, CN.
	IdentityDefaultRegion string `yaml:"identity_default_region"`

	dir string // the config file's directory: relative paths in it are relative to it
}

type routerSection struct {
	Listen         string        `yaml:"listen"`
	Gossip         string        `yaml:"gossip"`
	RequestTimeout time.Duration `yaml:"request_timeout"`
	MaxBodyBytes   int           `yaml:"max_body_bytes"`
	// RateLimits: per route name (router.RouteNames); a field left out or 0
	// keeps the default.
	RateLimits    map[string]rateEntry `yaml:"rate_limits"`
	UserRateLimit userRateEntry        `yaml:"user_rate_limit"`
	// AdminListen: GET /metrics and the API keys (/admin/keys); empty: none.
	AdminListen string `yaml:"admin_listen"`
	// APIKeys is the key file (router/apikey), required; a relative path is
	// relative to the config file's directory.
	APIKeys string `yaml:"api_keys"`
	// TLSCert, TLSKey: PEM files; both set, the router serves HTTPS only.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// HealthProbeInterval: how often the router probes each cell's /livez
	// (router.Prober); unset: 1s; 0s: no probes.
	HealthProbeInterval *time.Duration `yaml:"health_probe_interval"`
	// SharedLimits: the route and per-user limits hold for all routers
	// together, through memcached (router.Shared); unset: on when memcached
	// is configured.
	SharedLimits *bool `yaml:"shared_limits"`
	// RulesFile: the degrade switches and anti-abuse rules (router/rules),
	// relative to this file; "": none.
	RulesFile string `yaml:"rules_file"`
	// ClientIPHeader: a header a trusted proxy sets, whose last address is
	// the client's (for the rules' ips); "": the connection's address.
	ClientIPHeader string `yaml:"client_ip_header"`
	// AdvertiseHost: the host other members reach the router's gossip at,
	// with gossip's port ("": gossip's host); REDCELL_ADVERTISE_HOST
	// overrides it for one process.
	AdvertiseHost string `yaml:"advertise_host"`
}

type rateEntry struct {
	PerSec int `yaml:"per_sec"`
	Burst  int `yaml:"burst"`
}

type userRateEntry struct {
	PerSec   int `yaml:"per_sec"`
	Burst    int `yaml:"burst"`
	MaxUsers int `yaml:"max_users"`
}

type cellEntry struct {
	Name   string `yaml:"name"`
	Listen string `yaml:"listen"`
	Gossip string `yaml:"gossip"`
	Shards string `yaml:"shards"`
	DSN    string `yaml:"dsn"`
	// StandbyDSN is the cell's standby database, a semi-synchronous replica
	// of DSN's server promoted when that server stays down (failover_after);
	// empty: none.
	StandbyDSN string `yaml:"standby_dsn"`
	// AdminListen is the cell's admin port (runtime settings); empty: none.
	AdminListen string `yaml:"admin_listen"`
	// AdvertiseHost is the host routers and cells reach this cell at, with
	// the ports of listen and gossip ("": listen's and gossip's own hosts);
	// REDCELL_ADVERTISE_HOST overrides it for one process.
	AdvertiseHost string `yaml:"advertise_host"`
}

type cellSection struct {
	Activities string `yaml:"activities"` // reward activities' YAML, relative to this file; "" none
	// Coupons is the coupon batches' YAML, relative to this file; "" none (coupons off).
	Coupons          string          `yaml:"coupons"`
	CouponRates      []int           `yaml:"coupon_rates"` // [layer 1, layer 2] requests/s, cluster-wide
	CouponMergeMax   int             `yaml:"coupon_merge_max"`
	CouponPrefetch   *int            `yaml:"coupon_prefetch"` // nil: the default; 0: a grant per merge
	CouponQueueLen   int             `yaml:"coupon_queue_len"`
	CouponGather     []time.Duration `yaml:"coupon_gather"` // [layer 1, layer 2] waits for more requests per chunk
	CouponStaleAfter time.Duration   `yaml:"coupon_stale_after"`
	// RewardKeys is the reward token key file, relative to this file; "" none (no rewards).
	RewardKeys      string                `yaml:"reward_keys"`
	TokenTTL        time.Duration         `yaml:"token_ttl"`
	RewardCashMax   int64                 `yaml:"reward_cash_max"`
	BookingRate     int                   `yaml:"booking_rate"`
	BookingBatch    int                   `yaml:"booking_batch"`
	BookingInterval time.Duration         `yaml:"booking_interval"`
	BudgetLeaseTTL  time.Duration         `yaml:"budget_lease_ttl"`
	WithdrawRelease *cell.WithdrawRelease `yaml:"withdraw_release"`
	PacketExpiry    time.Duration         `yaml:"packet_expiry"`
	OpenStrategy    string                `yaml:"open_strategy"`
	BatchMax        int                   `yaml:"batch_max"`
	BatchWait       time.Duration         `yaml:"batch_wait"`
	QueueDepth      int                   `yaml:"queue_depth"`
	QueueWaitMax    time.Duration         `yaml:"queue_wait_max"`
	CreditShedFrom  *time.Duration        `yaml:"credit_shed_from"` // nil: the default; 0s: never shed for credits
	CreditShedAll   time.Duration         `yaml:"credit_shed_all"`
	TxPerPacket     int                   `yaml:"tx_per_packet"`
	MaxConns        int                   `yaml:"max_conns"`
	RequestTimeout  time.Duration         `yaml:"request_timeout"`
	RelayInterval   time.Duration         `yaml:"relay_interval"`
	ExpiryInterval  time.Duration         `yaml:"expiry_interval"`
	RetentionDays   *int                  `yaml:"retention_days"`   // settled packets older than this move to the archive tables; 0: off
	ArchiveInterval time.Duration         `yaml:"archive_interval"` // how often the archive pass runs
	ExportDays      int                   `yaml:"export_days"`      // rows older than this go to export files and leave their tables; 0: off
	ExportDir       string                `yaml:"export_dir"`       // where the export files go; "": export/<cell name> beside the config file
	ShadowRetention *time.Duration        `yaml:"shadow_retention"` // drop the shadow space after this long without stress traffic; nil: 72h; 0: never
	FailoverAfter   time.Duration         `yaml:"failover_after"`   // a cell with a standby promotes it after its primary is down this long
	LeaseTTL        time.Duration         `yaml:"lease_ttl"`        // how long a cell process's serving lease lasts unrenewed (4s): another process of the cell takes over after it
	MoveGrace       time.Duration         `yaml:"move_grace"`       // how long a cell keeps its copy of a database it handed over (10m)
	MaxAmount       int64                 `yaml:"max_amount"`
	MaxCount        int64                 `yaml:"max_count"`
	MaxGreeting     int                   `yaml:"max_greeting"`
	MapVersion      int64                 `yaml:"map_version"`

	RateLimitPerSec int           `yaml:"rate_limit_per_sec"`
	RateBurst       int           `yaml:"rate_burst"`
	BreakerFailures int           `yaml:"breaker_failures"`
	BreakerCooldown time.Duration `yaml:"breaker_cooldown"`

	ReconInterval time.Duration `yaml:"recon_interval"`
	ReconSettle   time.Duration `yaml:"recon_settle"`
	AuditInterval time.Duration `yaml:"audit_interval"`
	Degrade       degradeEntry  `yaml:"degrade"`

	GroupMax    int            `yaml:"group_max"`
	GroupWait   *time.Duration `yaml:"group_wait"`   // nil: the default; 0s: a busy lane never waits
	CommitLanes *int           `yaml:"commit_lanes"` // nil: the default; 0: a lane per database
}

// degradeEntry: each switch "on" or "off" at start; absent keeps it on.
type degradeEntry struct {
	ClaimsList   string `yaml:"claims_list"`
	GrabCache    string `yaml:"grab_cache"`
	Relay        string `yaml:"relay"`
	WalletFlow   string `yaml:"wallet_flow"`
	Booking      string `yaml:"booking"`
	CouponIssue  string `yaml:"coupon_issue"`
	TokenRestore string `yaml:"token_restore"`
}

// switches returns the entry's fields by switch name, to read and set them.
func (d *degradeEntry) switches() map[string]*string {
	return map[string]*string{"claims_list": &d.ClaimsList, "grab_cache": &d.GrabCache, "relay": &d.Relay,
		"wallet_flow": &d.WalletFlow, "booking": &d.Booking, "coupon_issue": &d.CouponIssue,
		"token_restore": &d.TokenRestore}
}

// loadConfig reads path (strict: unknown keys are errors), then applies the
// environment overrides listed in envOverrides.
func loadConfig(path string) (fileConfig, error) {
	var fc fileConfig
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fc, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&fc); err != nil {
			return fc, fmt.Errorf("config %s: %w", path, err)
		}
		fc.dir = filepath.Dir(path)
	}
	if err := applyEnv(&fc, os.Getenv); err != nil {
		return fc, err
	}
	return fc, nil
}

// envOverrides maps environment variables to config fields. Each wins over the file.
var envOverrides = []struct {
	name string
	set  func(fc *fileConfig, v string) error
}{
	{"REDCELL_MEMCACHED", func(fc *fileConfig, v string) error { fc.Memcached = splitList(v); return nil }},
	{"REDCELL_ADMIN_TOKEN", func(fc *fileConfig, v string) error { fc.AdminToken = v; return nil }},
	{"REDCELL_CLUSTER_SECRET", func(fc *fileConfig, v string) error { fc.ClusterSecret = v; return nil }},
	{"REDCELL_IDENTITY_KEY", func(fc *fileConfig, v string) error { fc.IdentityKey = v; return nil }},
	{"REDCELL_ACTIVITIES", func(fc *fileConfig, v string) error { fc.Cell.Activities = v; return nil }},
	{"REDCELL_REWARD_KEYS", func(fc *fileConfig, v string) error { fc.Cell.RewardKeys = v; return nil }},
	{"REDCELL_COUPONS", func(fc *fileConfig, v string) error { fc.Cell.Coupons = v; return nil }},
	{"REDCELL_GOSSIP_SEEDS", func(fc *fileConfig, v string) error { fc.GossipSeeds = splitList(v); return nil }},
	{"REDCELL_ROUTER_LISTEN", func(fc *fileConfig, v string) error { fc.Router.Listen = v; return nil }},
	{"REDCELL_ROUTER_GOSSIP", func(fc *fileConfig, v string) error { fc.Router.Gossip = v; return nil }},
	{"REDCELL_ROUTER_ADMIN_LISTEN", func(fc *fileConfig, v string) error { fc.Router.AdminListen = v; return nil }},
	{"REDCELL_API_KEYS", func(fc *fileConfig, v string) error { fc.Router.APIKeys = v; return nil }},
	{"REDCELL_PACKET_EXPIRY", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.PacketExpiry })},
	{"REDCELL_OPEN_STRATEGY", func(fc *fileConfig, v string) error { fc.Cell.OpenStrategy = v; return nil }},
	{"REDCELL_BATCH_MAX", intInto(func(fc *fileConfig) *int { return &fc.Cell.BatchMax })},
	{"REDCELL_BATCH_WAIT", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.BatchWait })},
	{"REDCELL_GROUP_MAX", intInto(func(fc *fileConfig) *int { return &fc.Cell.GroupMax })},
	{"REDCELL_GROUP_WAIT", func(fc *fileConfig, v string) error {
		d, err := time.ParseDuration(v)
		if err == nil {
			fc.Cell.GroupWait = &d
		}
		return err
	}},
	{"REDCELL_COMMIT_LANES", func(fc *fileConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err == nil {
			fc.Cell.CommitLanes = &n
		}
		return err
	}},
	{"REDCELL_QUEUE_WAIT_MAX", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.QueueWaitMax })},
	{"REDCELL_RELAY_INTERVAL", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.RelayInterval })},
	{"REDCELL_EXPIRY_INTERVAL", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.ExpiryInterval })},
	{"REDCELL_RECON_INTERVAL", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.ReconInterval })},
	{"REDCELL_AUDIT_INTERVAL", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.AuditInterval })},
	// Secrets as files (Compose and Kubernetes mount them so): each _FILE
	// variable names a file whose content, less trailing white space, is the
	// value; listed after the plain variable, it wins over it.
	{"REDCELL_ADMIN_TOKEN_FILE", secretInto(func(fc *fileConfig) *string { return &fc.AdminToken })},
	{"REDCELL_CLUSTER_SECRET_FILE", secretInto(func(fc *fileConfig) *string { return &fc.ClusterSecret })},
	{"REDCELL_IDENTITY_KEY_FILE", secretInto(func(fc *fileConfig) *string { return &fc.IdentityKey })},
	// REDCELL_DB_PASSWORD_FILE: the password of every cell's dsn and
	// standby_dsn, so that the config file holds none.
	{"REDCELL_DB_PASSWORD_FILE", func(fc *fileConfig, v string) error {
		pw, err := readSecret(v)
		if err != nil {
			return err
		}
		for i := range fc.Cells {
			for _, dsn := range []*string{&fc.Cells[i].DSN, &fc.Cells[i].StandbyDSN} {
				if *dsn == "" {
					continue
				}
				c, err := mysql.ParseDSN(*dsn)
				if err != nil {
					return fmt.Errorf("cell %s: dsn: %w", fc.Cells[i].Name, err)
				}
				c.Passwd = pw
				*dsn = c.FormatDSN()
			}
		}
		return nil
	}},
	{"REDCELL_DEGRADE", func(fc *fileConfig, v string) error {
		sw := fc.Cell.Degrade.switches()
		for _, name := range splitList(v) {
			if sw[name] == nil {
				return fmt.Errorf("unknown degrade switch %q (claims_list, grab_cache, relay, wallet_flow, booking, coupon_issue, token_restore)", name)
			}
			*sw[name] = "off"
		}
		return nil
	}},
}

func applyEnv(fc *fileConfig, getenv func(string) string) error {
	for _, o := range envOverrides {
		if v := getenv(o.name); v != "" {
			if err := o.set(fc, v); err != nil {
				return fmt.Errorf("config: %s=%q: %w", o.name, v, err)
			}
		}
	}
	return nil
}

// readSecret reads a secret file: its content less trailing white space,
// which must leave something.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(b), " \t\r\n")
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

func secretInto(field func(*fileConfig) *string) func(*fileConfig, string) error {
	return func(fc *fileConfig, path string) error {
		v, err := readSecret(path)
		if err == nil {
			*field(fc) = v
		}
		return err
	}
}

func durationInto(field func(*fileConfig) *time.Duration) func(*fileConfig, string) error {
	return func(fc *fileConfig, v string) error {
		d, err := time.ParseDuration(v)
		if err == nil {
			*field(fc) = d
		}
		return err
	}
}

func intInto(field func(*fileConfig) *int) func(*fileConfig, string) error {
	return func(fc *fileConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err == nil {
			*field(fc) = n
		}
		return err
	}
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// cellConfig builds the config of the cell called name: defaults, then the
// file's shared cell section, then the cell's own entry.
func (fc fileConfig) cellConfig(name string) (cell.Config, string, error) {
	c := cell.DefaultConfig()
	var entry *cellEntry
	for i := range fc.Cells {
		if fc.Cells[i].Name == name {
			entry = &fc.Cells[i]
		}
	}
	if entry == nil {
		return c, "", fmt.Errorf("config: no cell named %q in cells", name)
	}
	c.Name, c.Listen, c.DSN, c.StandbyDSN = entry.Name, entry.Listen, entry.DSN, entry.StandbyDSN
	c.AdminListen, c.AdminToken, c.ClusterSecret, c.IdentityKey = entry.AdminListen, fc.AdminToken, fc.ClusterSecret, fc.IdentityKey
	if fc.IdentityDefaultRegion != "" {
		c.IdentityDefaultRegion = fc.IdentityDefaultRegion
	}
	// A cell added to a running cluster starts with no shards ("") and
	// receives databases by moves (redcell cells add).
	c.Shards = sharding.Ranges{}
	if strings.TrimSpace(entry.Shards) != "" {
		r, err := sharding.ParseRanges(entry.Shards)
		if err != nil {
			return c, "", fmt.Errorf("config: cell %s: %w", name, err)
		}
		c.Shards = r
	}
	if len(fc.Memcached) > 0 {
		c.Memcached = fc.Memcached
	}
	s := fc.Cell
	c.Activities = fc.path(s.Activities)
	c.RewardKeys = fc.path(s.RewardKeys)
	c.Coupons = fc.path(s.Coupons)
	switch len(s.CouponRates) {
	case 0:
	case 2:
		c.CouponRates = [2]int{s.CouponRates[0], s.CouponRates[1]}
	default:
		return c, "", fmt.Errorf("config: cell.coupon_rates must be two rates, [layer 1, layer 2], got %v", s.CouponRates)
	}
	switch len(s.CouponGather) {
	case 0:
	case 2:
		c.CouponGather = [2]time.Duration{s.CouponGather[0], s.CouponGather[1]}
	default:
		return c, "", fmt.Errorf("config: cell.coupon_gather must be two waits, [layer 1, layer 2], got %v", s.CouponGather)
	}
	setInt(&c.CouponMergeMax, s.CouponMergeMax)
	if s.CouponPrefetch != nil {
		c.CouponPrefetch = *s.CouponPrefetch
	}
	setInt(&c.CouponQueueLen, s.CouponQueueLen)
	setDur(&c.CouponStaleAfter, s.CouponStaleAfter)
	setDur(&c.TokenTTL, s.TokenTTL)
	if s.RewardCashMax > 0 {
		c.RewardCashMax = s.RewardCashMax
	}
	setInt(&c.BookingRate, s.BookingRate)
	setInt(&c.BookingBatch, s.BookingBatch)
	setDur(&c.BookingInterval, s.BookingInterval)
	setDur(&c.BudgetLeaseTTL, s.BudgetLeaseTTL)
	if s.WithdrawRelease != nil {
		c.WithdrawRelease = *s.WithdrawRelease
	}
	setDur(&c.PacketExpiry, s.PacketExpiry)
	if s.OpenStrategy != "" {
		c.OpenStrategy = s.OpenStrategy
	}
	setInt(&c.BatchMax, s.BatchMax)
	setDur(&c.BatchWait, s.BatchWait)
	setInt(&c.QueueDepth, s.QueueDepth)
	setDur(&c.QueueWaitMax, s.QueueWaitMax)
	if s.CreditShedFrom != nil {
		c.CreditShedFrom = *s.CreditShedFrom
	}
	setDur(&c.CreditShedAll, s.CreditShedAll)
	setInt(&c.TxPerPacket, s.TxPerPacket)
	setInt(&c.MaxConns, s.MaxConns)
	setInt(&c.GroupMax, s.GroupMax)
	if s.GroupWait != nil {
		c.GroupWait = *s.GroupWait
	}
	if s.CommitLanes != nil {
		c.CommitLanes = *s.CommitLanes
	}
	setDur(&c.RequestTimeout, s.RequestTimeout)
	setDur(&c.RelayInterval, s.RelayInterval)
	setDur(&c.ExpiryInterval, s.ExpiryInterval)
	switch days := s.RetentionDays; {
	case days == nil:
		// The default week, or longer when packets live longer: at least
		// packet_expiry + 3 days, in whole days.
		c.Retention = max(c.Retention, (c.PacketExpiry+72*time.Hour+23*time.Hour)/(24*time.Hour)*24*time.Hour)
	case *days < 0 || *days > 365:
		return c, "", fmt.Errorf("config: cell.retention_days must be 0 (off) .. 365, got %d", *days)
	default:
		c.Retention = time.Duration(*days) * 24 * time.Hour
	}
	setDur(&c.ArchiveInterval, s.ArchiveInterval)
	if s.ExportDays < 0 || s.ExportDays > int(cell.MaxExportAfter/(24*time.Hour)) {
		return c, "", fmt.Errorf("config: cell.export_days must be 0 (off) .. %d, got %d", int(cell.MaxExportAfter/(24*time.Hour)), s.ExportDays)
	}
	c.ExportAfter = time.Duration(s.ExportDays) * 24 * time.Hour
	c.ExportDir = fc.path(s.ExportDir)
	if c.ExportDir == "" {
		c.ExportDir = fc.path(filepath.Join("export", name))
	}
	if s.ShadowRetention != nil {
		c.ShadowRetention = *s.ShadowRetention
	}
	setDur(&c.FailoverAfter, s.FailoverAfter)
	setDur(&c.MoveGrace, s.MoveGrace)
	if s.MaxAmount > 0 {
		c.Limits.MaxAmount = model.Cents(s.MaxAmount)
	}
	if s.MaxCount > 0 {
		c.Limits.MaxCount = s.MaxCount
	}
	setInt(&c.Limits.MaxGreeting, s.MaxGreeting)
	setInt(&c.RateLimitPerSec, s.RateLimitPerSec)
	setInt(&c.RateBurst, s.RateBurst)
	if s.MapVersion > 0 {
		c.MapVersion = s.MapVersion
	}
	setDur(&c.ReconInterval, s.ReconInterval)
	setDur(&c.ReconSettle, s.ReconSettle)
	setDur(&c.AuditInterval, s.AuditInterval)
	off := map[string]*bool{"claims_list": &c.Degrade.ClaimsList, "grab_cache": &c.Degrade.GrabCache, "relay": &c.Degrade.Relay,
		"wallet_flow": &c.Degrade.WalletFlow, "booking": &c.Degrade.Booking, "coupon_issue": &c.Degrade.CouponIssue,
		"token_restore": &c.Degrade.TokenRestore}
	for name, v := range fc.Cell.Degrade.switches() {
		switch *v {
		case "", "on":
		case "off":
			*off[name] = true
		default:
			return c, "", fmt.Errorf("config: cell.degrade.%s must be on or off, got %q", name, *v)
		}
	}
	return c, entry.Gossip, c.Validate()
}

// routerConfig builds the router's config: defaults, then the file.
func (fc fileConfig) routerConfig() (router.Config, error) {
	c := router.DefaultConfig()
	c.ClusterSecret, c.AdminToken, c.AdminListen = fc.ClusterSecret, fc.AdminToken, fc.Router.AdminListen
	c.TLSCert, c.TLSKey = fc.path(fc.Router.TLSCert), fc.path(fc.Router.TLSKey)
	if fc.Router.Listen != "" {
		c.Listen = fc.Router.Listen
	}
	setDur(&c.RequestTimeout, fc.Router.RequestTimeout)
	setInt(&c.MaxBodyBytes, fc.Router.MaxBodyBytes)
	for name, e := range fc.Router.RateLimits {
		r := c.RateLimits[name] // an unknown name starts from zero and fails Validate
		setInt(&r.PerSec, e.PerSec)
		setInt(&r.Burst, e.Burst)
		c.RateLimits[name] = r
	}
	u := fc.Router.UserRateLimit
	setInt(&c.UserRate.PerSec, u.PerSec)
	setInt(&c.UserRate.Burst, u.Burst)
	setInt(&c.UserLimitersMax, u.MaxUsers)
	c.RulesFile, c.ClientIPHeader = fc.path(fc.Router.RulesFile), fc.Router.ClientIPHeader
	return c, c.Validate()
}

// cellAdvertise returns the HTTP and gossip addresses cell name announces
// (advertised). Errors: no such cell; a listen or gossip address that binds
// every address without an advertise host.
func (fc fileConfig) cellAdvertise(name, listen, gossip string) (httpAddr, gossipAddr string, err error) {
	host := ""
	for _, e := range fc.Cells {
		if e.Name == name {
			host = e.AdvertiseHost
		}
	}
	if httpAddr, err = advertised(listen, host, "cell "+name+" listen"); err != nil {
		return "", "", err
	}
	if gossipAddr, err = advertised(gossip, host, "cell "+name+" gossip"); err != nil {
		return "", "", err
	}
	return httpAddr, gossipAddr, nil
}

// advertised returns addr (host:port) with its host replaced by the
// process's advertise host: REDCELL_ADVERTISE_HOST, else configured (a
// cell's or the router's advertise_host), else addr as it is. Errors: addr
// binds every address (0.0.0.0, ::, or no host) and no advertise host is
// set: other members could not reach what it announces.
func advertised(addr, configured, what string) (string, error) {
	host := os.Getenv("REDCELL_ADVERTISE_HOST")
	if host == "" {
		host = configured
	}
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("config: %s %q: %w", what, addr, err)
	}
	if host == "" {
		if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
			return "", fmt.Errorf("config: %s %q listens on every address: set advertise_host (or REDCELL_ADVERTISE_HOST) to the address the others reach it at", what, addr)
		}
		return addr, nil
	}
	return net.JoinHostPort(host, port), nil
}

// sharedLimits reports whether the routers' limits are cluster-wide
// (router.shared_limits; by default when memcached is configured). Errors:
// on without memcached.
func (fc fileConfig) sharedLimits() (bool, error) {
	if fc.Router.SharedLimits == nil {
		return len(fc.Memcached) > 0, nil
	}
	if *fc.Router.SharedLimits && len(fc.Memcached) == 0 {
		return false, fmt.Errorf("config: router.shared_limits needs memcached servers (memcached)")
	}
	return *fc.Router.SharedLimits, nil
}

// apiKeysPath returns the router's key file (router.api_keys), resolved
// against the config file's directory. Errors: none configured.
func (fc fileConfig) apiKeysPath() (string, error) {
	if fc.Router.APIKeys == "" {
		return "", fmt.Errorf("config: router.api_keys (or REDCELL_API_KEYS) must name the API key file; it may not exist yet")
	}
	return fc.path(fc.Router.APIKeys), nil
}

// path resolves a path of the config file against the file's directory.
func (fc fileConfig) path(p string) string {
	if p == "" || filepath.IsAbs(p) || fc.dir == "" {
		return p
	}
	return filepath.Join(fc.dir, p)
}

// breakerConfig builds the cells' circuit-breaker settings (one for MariaDB,
// one for memcached, alike): defaults, then the file's cell section.
func (fc fileConfig) breakerConfig() (guard.Config, error) {
	c := guard.DefaultConfig()
	setInt(&c.Failures, fc.Cell.BreakerFailures)
	setDur(&c.Cooldown, fc.Cell.BreakerCooldown)
	return c, c.Validate()
}

func setDur(dst *time.Duration, v time.Duration) {
	if v != 0 {
		*dst = v
	}
}

func setInt(dst *int, v int) {
	if v != 0 {
		*dst = v
	}
}

// probeConfig is the router's health probes: router.DefaultProbeConfig, at
// the file's interval when it sets one (0s: off; the timeout stays within
// the interval).
func (fc fileConfig) probeConfig() (router.ProbeConfig, error) {
	c := router.DefaultProbeConfig()
	if iv := fc.Router.HealthProbeInterval; iv != nil {
		c.Interval = *iv
		c.Timeout = min(c.Timeout, c.Interval/2)
	}
	return c, c.Validate()
}
