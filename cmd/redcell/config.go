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
	// Cell is the section every cell shares: decoded straight over
	// cell.DefaultConfig (a key left out keeps its default), its keys are
	// cell.Config's YAML tags (docs/config.md lists them; TestConfigDocs
	// holds the two together).
	Cell cell.Config `yaml:"cell"`

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

// loadConfig reads path (strict: unknown keys are errors), then applies the
// environment overrides listed in envOverrides.
func loadConfig(path string) (fileConfig, error) {
	fc := fileConfig{Cell: cell.DefaultConfig()}
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
	{"REDCELL_GROUP_WAIT", durationInto(func(fc *fileConfig) *time.Duration { return &fc.Cell.GroupWait })},
	{"REDCELL_COMMIT_LANES", intInto(func(fc *fileConfig) *int { return &fc.Cell.CommitLanes })},
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
		for _, name := range splitList(v) {
			if err := fc.Cell.Degrade.TurnOff(name); err != nil {
				return err
			}
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

// cellConfig builds the config of the cell called name: the file's shared
// cell section (already over the defaults), the cell's own entry and the
// top level's keys a cell uses, its relative paths resolved against the
// file's directory; then it validates the whole.
func (fc fileConfig) cellConfig(name string) (cell.Config, string, error) {
	c := fc.Cell
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
	c.Activities, c.RewardKeys, c.Coupons = fc.path(c.Activities), fc.path(c.RewardKeys), fc.path(c.Coupons)
	if c.ExportDir == "" {
		c.ExportDir = filepath.Join("export", name)
	}
	c.ExportDir = fc.path(c.ExportDir)
	if err := c.Validate(); err != nil {
		return c, "", fmt.Errorf("config: %w", err)
	}
	return c, entry.Gossip, nil
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

// setDur and setInt copy a router key the file set (non-zero) over its default.
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
