package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/cell"
	"redcell/cell/activity"
	"redcell/cell/guard"
	"redcell/router"
)

// TestOverloadConfig: the rate-limit and breaker keys decode, merge over the
// defaults field by field, and bad values stop the process.
func TestOverloadConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "") // the files below decide
	fc, err := loadConfigBody(t, `
cluster_secret: "config-test-secret-0123456789"
router:
  rate_limits:
    open: {per_sec: 1000}
    send: {per_sec: 10, burst: 5}
  user_rate_limit: {per_sec: 5, max_users: 2048}
cell:
  rate_limit_per_sec: 7000
  breaker_failures: 3
  breaker_cooldown: 500ms
`)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := fc.routerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.ClusterSecret != "config-test-secret-0123456789" {
		t.Errorf("the router did not get the cluster secret: %q", rc.ClusterSecret)
	}
	def := router.DefaultConfig()
	if got := rc.RateLimits["open"]; got != (router.Rate{PerSec: 1000, Burst: def.RateLimits["open"].Burst}) {
		t.Errorf("open: %+v", got)
	}
	if got := rc.RateLimits["send"]; got != (router.Rate{PerSec: 10, Burst: 5}) {
		t.Errorf("send: %+v", got)
	}
	if rc.RateLimits["grab"] != def.RateLimits["grab"] {
		t.Errorf("grab lost its default: %+v", rc.RateLimits["grab"])
	}
	if rc.UserRate != (router.Rate{PerSec: 5, Burst: def.UserRate.Burst}) || rc.UserLimitersMax != 2048 {
		t.Errorf("user rate %+v, max %d", rc.UserRate, rc.UserLimitersMax)
	}
	if bc := fc.Cell.Breaker; bc.Failures != 3 || bc.Cooldown != 500*time.Millisecond || bc.SlowCall != guard.DefaultConfig().SlowCall {
		t.Errorf("breaker config %+v", bc)
	}
	if fc.Cell.RateLimitPerSec != 7000 {
		t.Errorf("cell rate %d", fc.Cell.RateLimitPerSec)
	}

	fc, err = loadConfigBody(t, "cluster_secret: config-test-secret-0123456789\nrouter:\n  rate_limits:\n    opne: {per_sec: 5}\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.routerConfig(); err == nil || !strings.Contains(err.Error(), `"opne"`) {
		t.Errorf("a misspelt route: %v", err)
	}
	fc, err = loadConfigBody(t, "router:\n  listen: 127.0.0.1:8080\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.routerConfig(); err == nil || !strings.Contains(err.Error(), "ClusterSecret") {
		t.Errorf("a router without a cluster secret: %v", err)
	}
	if _, err := loadConfigBody(t, "cell:\n  rate_limit: 5\n"); err == nil {
		t.Error("an unknown cell key was accepted")
	}
}

// TestReferenceConfig: deploy/local/redcell.yaml loads and gives every process
// a valid config (with a cluster secret, which make run writes in).
func TestReferenceConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	fc, err := loadConfig("../../deploy/local/redcell.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := fc.routerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.RateLimits["open"] != (router.Rate{PerSec: 50_000, Burst: 10_000}) || rc.UserRate != (router.Rate{PerSec: 20, Burst: 40}) {
		t.Errorf("router limits in the reference file: %+v, user %+v", rc.RateLimits, rc.UserRate)
	}
	for _, name := range []string{"cell-1", "cell-2"} {
		c, _, err := fc.cellConfig(name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		// cell.activities is relative to the config file: beside it, the
		// demo activities make run copies there.
		if want := filepath.Join("../../deploy/local", "activities.yaml"); c.Activities != want {
			t.Errorf("%s: activities %q, want %q", name, c.Activities, want)
		} else if _, err := activity.Load(c.Activities, time.Now()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestBenchClusterSecret: the bench signs its requests with the
// cluster_secret of --config (the environment wins over the file, as for every
// process), or REDCELL_CLUSTER_SECRET without a config, and refuses to start
// without one: the router takes its stress-marked traffic only signed, and the
// cells nothing unsigned.
func TestBenchClusterSecret(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("cluster_secret: file-secret-0123456789\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDCELL_API_KEY", "")
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"", []string{"--direct", "--config", p}, "file-secret-0123456789"},
		{"env-secret-0123456789", []string{"--direct", "--config", p}, "env-secret-0123456789"},
		{"env-secret-0123456789", []string{"--direct"}, "env-secret-0123456789"},
		{"", []string{"--direct"}, ""},
	} {
		t.Setenv("REDCELL_CLUSTER_SECRET", c.env)
		f, err := parseBenchFlags(c.args)
		if c.want == "" {
			if err == nil || !strings.Contains(err.Error(), "cluster secret") {
				t.Errorf("env %q, %v: no secret, error %v", c.env, c.args, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := f.runConfig().ClusterSecret; got != c.want {
			t.Errorf("env %q, %v: secret %q, want %q", c.env, c.args, got, c.want)
		}
		if _, err = f.suiteConfig(); err != nil {
			t.Errorf("env %q, %v: suite config error %v", c.env, c.args, err)
		}
	}
}

// TestBenchAPIKey: through the router the bench needs the calling app's key:
// --api-key-file, else REDCELL_API_KEY, else the file api-key beside --config
// (where make run writes it); without one it does not start. A direct run
// needs none.
func TestBenchAPIKey(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "redcell.yaml")
	if err := os.WriteFile(cfg, []byte("cluster_secret: file-secret-0123456789\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDCELL_CLUSTER_SECRET", "")
	t.Setenv("REDCELL_API_KEY", "")
	if _, err := parseBenchFlags([]string{"--config", cfg}); err == nil || !strings.Contains(err.Error(), "API key") {
		t.Fatalf("no key anywhere: %v", err)
	}
	if f, err := parseBenchFlags([]string{"--config", cfg, "--direct"}); err != nil || f.apiKey != "" {
		t.Fatalf("direct without a key: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "api-key"), []byte("rck_beside\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(other, []byte(" rck_flag \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"", []string{"--config", cfg}, "rck_beside"},
		{"rck_env", []string{"--config", cfg}, "rck_env"},
		{"rck_env", []string{"--config", cfg, "--api-key-file", other}, "rck_flag"},
	} {
		t.Setenv("REDCELL_API_KEY", c.env)
		f, err := parseBenchFlags(c.args)
		if err != nil || f.runConfig().APIKey != c.want {
			t.Errorf("env %q, %v: key %q, %v; want %q", c.env, c.args, f.apiKey, err, c.want)
		}
	}
}

// TestReconAndDegradeConfig: the reconciliation and audit intervals and the
// degrade switches decode from the file and the environment; a bad switch
// value or name stops the process.
func TestReconAndDegradeConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cells := oneCell
	fc, err := loadConfigBody(t, cells+"cell:\n  recon_interval: 30s\n  recon_settle: 45s\n  degrade: {claims_list: off, relay: on, token_restore: off}\n")
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := fc.cellConfig("c1")
	if err != nil {
		t.Fatal(err)
	}
	if c.ReconInterval != 30*time.Second || c.ReconSettle != 45*time.Second || c.AuditInterval != time.Hour ||
		!c.Degrade.ClaimsList || c.Degrade.GrabCache || c.Degrade.Relay || !c.Degrade.TokenRestore {
		t.Fatalf("cell config %+v", c)
	}
	t.Setenv("REDCELL_AUDIT_INTERVAL", "10m")
	t.Setenv("REDCELL_DEGRADE", "relay,grab_cache,token_restore")
	if fc, err = loadConfigBody(t, cells); err != nil {
		t.Fatal(err)
	}
	if c, _, err = fc.cellConfig("c1"); err != nil || c.AuditInterval != 10*time.Minute || !c.Degrade.Relay || !c.Degrade.GrabCache || c.Degrade.ClaimsList || !c.Degrade.TokenRestore {
		t.Fatalf("from the environment: %+v, %v", c, err)
	}
	t.Setenv("REDCELL_DEGRADE", "relya")
	if _, err := loadConfigBody(t, cells); err == nil || !strings.Contains(err.Error(), "REDCELL_DEGRADE") {
		t.Fatalf("a misspelt switch: %v", err)
	}
	t.Setenv("REDCELL_DEGRADE", "")
	if _, err := loadConfigBody(t, cells+"cell:\n  degrade: {relay: maybe}\n"); err == nil || !strings.Contains(err.Error(), "cell.degrade.relay") {
		t.Fatalf("a bad switch value: %v", err)
	}
}

// TestGroupCommitConfig: group_max, group_wait and commit_lanes decode over
// the defaults (group_wait 0s means no wait, not the default), the
// environment wins, and bad values stop the cell.
func TestGroupCommitConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cells := oneCell
	cellOf := func(body string) (cell.Config, error) {
		t.Helper()
		fc, err := loadConfigBody(t, cells+body)
		if err != nil {
			t.Fatal(err)
		}
		c, _, err := fc.cellConfig("c1")
		return c, err
	}
	def := cell.DefaultConfig()
	if c, err := cellOf(""); err != nil || c.GroupMax != def.GroupMax || c.GroupWait != def.GroupWait || c.CommitLanes != def.CommitLanes {
		t.Fatalf("defaults: %d %s %d, %v", c.GroupMax, c.GroupWait, c.CommitLanes, err)
	}
	c, err := cellOf("cell:\n  open_strategy: grouped\n  group_max: 64\n  group_wait: 0s\n  commit_lanes: 4\n")
	if err != nil || c.OpenStrategy != cell.StrategyGrouped || c.GroupMax != 64 || c.GroupWait != 0 || c.CommitLanes != 4 {
		t.Fatalf("from the file: %s %d %s %d, %v", c.OpenStrategy, c.GroupMax, c.GroupWait, c.CommitLanes, err)
	}
	if c, err := cellOf("cell:\n  commit_lanes: 0\n"); err != nil || c.CommitLanes != 0 {
		t.Fatalf("commit_lanes: 0 (a lane per database) read as %d, %v", c.CommitLanes, err)
	}
	t.Setenv("REDCELL_COMMIT_LANES", "0")
	if c, err := cellOf(""); err != nil || c.CommitLanes != 0 {
		t.Fatalf("REDCELL_COMMIT_LANES=0 read as %d, %v", c.CommitLanes, err)
	}
	t.Setenv("REDCELL_GROUP_MAX", "512")
	t.Setenv("REDCELL_GROUP_WAIT", "5ms")
	t.Setenv("REDCELL_COMMIT_LANES", "8")
	if c, err = cellOf("cell:\n  group_max: 64\n  group_wait: 0s\n"); err != nil || c.GroupMax != 512 || c.GroupWait != 5*time.Millisecond || c.CommitLanes != 8 {
		t.Fatalf("from the environment: %d %s %d, %v", c.GroupMax, c.GroupWait, c.CommitLanes, err)
	}
	t.Setenv("REDCELL_GROUP_MAX", "")
	t.Setenv("REDCELL_GROUP_WAIT", "")
	t.Setenv("REDCELL_COMMIT_LANES", "")
	for body, want := range map[string]string{
		"cell:\n  group_max: 5000\n":     "GroupMax",
		"cell:\n  group_wait: 1500us\n":  "GroupWait",
		"cell:\n  group_wait: 2s\n":      "GroupWait",
		"cell:\n  commit_lanes: -1\n":    "CommitLanes",
		"cell:\n  commit_lanes: 101\n":   "CommitLanes",
		"cell:\n  open_strategy: grup\n": "grouped",
	} {
		if _, err := cellOf(body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", body, err, want)
		}
	}
}

// TestCouponGatherConfig: coupon_gather is two waits from the file, the
// defaults without it, [0s, 0s] for none; a wrong count, a negative wait or
// waits that eat the 0.5 s target are refused.
func TestCouponGatherConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cells := oneCell
	cellOf := func(body string) (cell.Config, error) { t.Helper(); return cellFromFile(t, cells+body) }
	if c, err := cellOf(""); err != nil || c.CouponGather != [2]time.Duration{10 * time.Millisecond, 40 * time.Millisecond} {
		t.Fatalf("default: %v, %v", c.CouponGather, err)
	}
	if c, err := cellOf("cell:\n  coupon_gather: [0s, 0s]\n"); err != nil || c.CouponGather != [2]time.Duration{} {
		t.Fatalf("none: %v, %v", c.CouponGather, err)
	}
	if c, err := cellOf("cell:\n  coupon_gather: [5ms, 100ms]\n"); err != nil || c.CouponGather != [2]time.Duration{5 * time.Millisecond, 100 * time.Millisecond} {
		t.Fatalf("from the file: %v, %v", c.CouponGather, err)
	}
	for _, body := range []string{"cell:\n  coupon_gather: [10ms]\n", "cell:\n  coupon_gather: [-1ms, 10ms]\n", "cell:\n  coupon_gather: [200ms, 300ms]\n"} {
		if _, err := cellOf(body); err == nil || !strings.Contains(err.Error(), "coupon_gather") {
			t.Errorf("%q: %v, want an error naming coupon_gather", body, err)
		}
	}
}

// TestIdentityKeyConfig: identity_key reaches every cell from the file, the
// environment wins over it, a short one stops the cell, and none leaves
// binding off.
func TestIdentityKeyConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	t.Setenv("REDCELL_IDENTITY_KEY", "")
	fc, err := loadConfig("../../deploy/local/redcell.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c, _, err := fc.cellConfig("cell-1"); err != nil || c.IdentityKey != "" {
		t.Errorf("the reference file (make run writes the key in): %q, %v", c.IdentityKey, err)
	}
	ref, err := os.ReadFile("../../deploy/local/redcell.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "redcell.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(string(ref), `identity_key: ""`, `identity_key: "file-identity-key-0123456789"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if fc, err = loadConfig(path); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cell-1", "cell-2"} {
		if c, _, err := fc.cellConfig(name); err != nil || c.IdentityKey != "file-identity-key-0123456789" {
			t.Errorf("%s: identity key %q, %v", name, c.IdentityKey, err)
		}
	}
	t.Setenv("REDCELL_IDENTITY_KEY", "env-identity-key-0123456789")
	if fc, err = loadConfig("../../deploy/local/redcell.yaml"); err != nil {
		t.Fatal(err)
	}
	if c, _, err := fc.cellConfig("cell-2"); err != nil || c.IdentityKey != "env-identity-key-0123456789" {
		t.Errorf("REDCELL_IDENTITY_KEY: %q, %v", c.IdentityKey, err)
	}
	t.Setenv("REDCELL_IDENTITY_KEY", "short")
	if fc, err = loadConfig("../../deploy/local/redcell.yaml"); err != nil {
		t.Fatal(err)
	}
	c, _, err := fc.cellConfig("cell-1")
	if err == nil {
		err = c.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), "IdentityKey") {
		t.Errorf("a 5-byte identity key: %v", err)
	}
}

// TestCellShardsWholeDBs: a cell's shards in the config cover whole
// databases (ten shards each); a range that splits one is refused with the
// aligned range it should be.
func TestCellShardsWholeDBs(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cellOf := func(shards string) error {
		t.Helper()
		_, err := cellFromFile(t, strings.Replace(oneCell, `"0-999"`, `"`+shards+`"`, 1))
		return err
	}
	for _, ok := range []string{"0-999", "0-499", "500-509,600-999"} {
		if err := cellOf(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{"0-332": "0-339", "1-999": "0-999", "500-504": "500-509"} {
		if err := cellOf(bad); err == nil || !strings.Contains(err.Error(), "whole databases") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want a whole-databases error suggesting %s", bad, err, want)
		}
	}
}

// TestRetentionConfig: retention_days sets how long settled packets stay in
// their day tables (7 by default, or packet_expiry + 3 days when longer; 0
// off); below packet_expiry + 3 days, above 25, or outside 0..365 it is
// refused.
func TestRetentionConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cells := oneCell
	cellOf := func(body string) (cell.Config, error) { t.Helper(); return cellFromFile(t, cells+body) }
	day := 24 * time.Hour
	for body, want := range map[string]time.Duration{
		"":                               7 * day,
		"cell:\n  retention_days: 0\n":   0,
		"cell:\n  retention_days: 4\n":   4 * day, // packet_expiry 24h + 3 days
		"cell:\n  retention_days: 25\n":  25 * day,
		"cell:\n  packet_expiry: 168h\n": 10 * day, // unset: at least packet_expiry + 3 days
		"cell:\n  packet_expiry: 100h\n": 8 * day,  // 172h, rounded up to whole days
		"cell:\n  retention_days: 12\n  packet_expiry: 168h\n": 12 * day,
	} {
		c, err := cellOf(body)
		if err != nil || c.Retention() != want {
			t.Errorf("%q: retention %s, %v; want %s", body, c.Retention(), err, want)
		}
	}
	for _, body := range []string{"cell:\n  retention_days: 3\n", "cell:\n  retention_days: 26\n", "cell:\n  retention_days: 9\n  packet_expiry: 168h\n",
		"cell:\n  archive_interval: 25h\n", "cell:\n  retention_days: -1\n", "cell:\n  retention_days: 100000000000\n"} {
		if _, err := cellOf(body); err == nil || !strings.Contains(err.Error(), "Retention") && !strings.Contains(err.Error(), "retention_days") && !strings.Contains(err.Error(), "ArchiveInterval") {
			t.Errorf("%q: %v, want a retention or archive_interval error", body, err)
		}
	}
}

// TestExportConfig: export_days turns the retention export on (0, the
// default, off), its files going to export_dir resolved against the config
// file's directory, or export/<cell name> beside it; below retention_days +
// 7, with archiving off, or above 3650 days it is refused.
func TestExportConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cellOf := func(body string) (cell.Config, error) { t.Helper(); return cellFromFile(t, oneCell+body) }
	day := 24 * time.Hour
	c, err := cellOf("")
	if err != nil || c.ExportAfter() != 0 {
		t.Fatalf("default: export after %s, %v; want off", c.ExportAfter(), err)
	}
	c, err = cellOf("cell:\n  export_days: 14\n")
	if err != nil || c.ExportAfter() != 14*day || !filepath.IsAbs(c.ExportDir) || filepath.Base(filepath.Dir(c.ExportDir)) != "export" || filepath.Base(c.ExportDir) != c.Name {
		t.Fatalf("export_days 14: %s into %q, %v; want 14 days into <config dir>/export/%s", c.ExportAfter(), c.ExportDir, err, c.Name)
	}
	c, err = cellOf("cell:\n  export_days: 400\n  retention_days: 20\n  export_dir: /srv/exports\n")
	if err != nil || c.ExportAfter() != 400*day || c.ExportDir != "/srv/exports" {
		t.Fatalf("export_days 400: %s into %q, %v", c.ExportAfter(), c.ExportDir, err)
	}
	for _, body := range []string{"cell:\n  export_days: 13\n", "cell:\n  export_days: 26\n  retention_days: 20\n",
		"cell:\n  export_days: 30\n  retention_days: 0\n", "cell:\n  export_days: 3651\n", "cell:\n  export_days: -1\n"} {
		if _, err := cellOf(body); err == nil || !strings.Contains(err.Error(), "export_days") {
			t.Errorf("%q: %v, want an export_days error", body, err)
		}
	}
}

// TestStandbyConfig: a cell entry's standby_dsn and the shared
// failover_after reach the cell's config; failover_after outside 2s..1h, or
// a standby that is the primary, is refused.
func TestStandbyConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	cellOf := func(standby, body string) (cell.Config, error) {
		t.Helper()
		return cellFromFile(t, strings.Replace(oneCell, `/"}`, `/", standby_dsn: "`+standby+`"}`, 1)+body)
	}
	if c, err := cellOf("", ""); err != nil || c.StandbyDSN != "" || c.FailoverAfter != 30*time.Second {
		t.Fatalf("defaults: %q %s, %v", c.StandbyDSN, c.FailoverAfter, err)
	}
	if c, err := cellOf("root@tcp(127.0.0.1:4)/", "cell:\n  failover_after: 5s\n"); err != nil || c.StandbyDSN != "root@tcp(127.0.0.1:4)/" || c.FailoverAfter != 5*time.Second {
		t.Fatalf("from the file: %q %s, %v", c.StandbyDSN, c.FailoverAfter, err)
	}
	for _, bad := range [][2]string{{"", "cell:\n  failover_after: 1s\n"}, {"", "cell:\n  failover_after: 2h\n"}, {"root@tcp(127.0.0.1:3)/", ""}} {
		if _, err := cellOf(bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), "FailoverAfter") && !strings.Contains(err.Error(), "StandbyDSN") {
			t.Errorf("%q %q: %v, want a failover_after or standby_dsn error", bad[0], bad[1], err)
		}
	}
}

// loadConfigBody writes body to a config file of its own and loads it
// (loadConfig).
func loadConfigBody(t *testing.T, body string) (fileConfig, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return loadConfig(p)
}

// cellFromFile loads the config file body and returns cell c1's config,
// validated (the caller's body lists a cell named c1).
func cellFromFile(t *testing.T, body string) (cell.Config, error) {
	t.Helper()
	fc, err := loadConfigBody(t, body)
	if err != nil {
		return cell.Config{}, err
	}
	c, _, err := fc.cellConfig("c1")
	if err == nil {
		err = c.Validate()
	}
	return c, err
}

// oneCell is a cells section of one cell, c1, owning every shard.
const oneCell = "cells:\n  - {name: c1, listen: \"127.0.0.1:1\", gossip: \"127.0.0.1:2\", shards: \"0-999\", dsn: \"root@tcp(127.0.0.1:3)/\"}\n"

// TestSecretFiles: the _FILE variables read secrets from files (as Compose
// and Kubernetes mount them), win over the plain variables, and give every
// cell's DSN the database password; an empty or missing file is an error.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := map[string]string{
		"REDCELL_CLUSTER_SECRET":      "plain-secret-0123456789",
		"REDCELL_CLUSTER_SECRET_FILE": write("cluster", "file-secret-0123456789\n"),
		"REDCELL_ADMIN_TOKEN_FILE":    write("admin", "admin-token-from-file \r\n"),
		"REDCELL_IDENTITY_KEY_FILE":   write("identity", "identity-key-0123456789"),
		"REDCELL_DB_PASSWORD_FILE":    write("db", "p@ss:w/rd\n"),
	}
	fc := fileConfig{Cells: []cellEntry{
		{Name: "cell-1", DSN: "redcell@tcp(mariadb-1:3306)/", StandbyDSN: "redcell@tcp(mariadb-1-standby:3306)/"},
		{Name: "cell-2", DSN: "redcell:old@tcp(mariadb-2:3306)/?timeout=2s"},
	}}
	if err := applyEnv(&fc, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if fc.ClusterSecret != "file-secret-0123456789" || fc.AdminToken != "admin-token-from-file" || fc.IdentityKey != "identity-key-0123456789" {
		t.Errorf("secrets %q %q %q", fc.ClusterSecret, fc.AdminToken, fc.IdentityKey)
	}
	for _, dsn := range []string{fc.Cells[0].DSN, fc.Cells[0].StandbyDSN, fc.Cells[1].DSN} {
		c, err := mysql.ParseDSN(dsn)
		if err != nil || c.Passwd != "p@ss:w/rd" || c.User != "redcell" {
			t.Errorf("dsn %q: user %q password %q (%v)", dsn, c.User, c.Passwd, err)
		}
	}
	if c, _ := mysql.ParseDSN(fc.Cells[1].DSN); c.Addr != "mariadb-2:3306" || c.Timeout != 2*time.Second {
		t.Errorf("cell-2's dsn lost its address or options: %q", fc.Cells[1].DSN)
	}
	for name, content := range map[string]string{"empty": " \n", "missing": ""} {
		path := filepath.Join(dir, "no-such-file")
		if content != "" {
			path = write(name, content)
		}
		err := applyEnv(&fileConfig{}, func(k string) string {
			if k == "REDCELL_ADMIN_TOKEN_FILE" {
				return path
			}
			return ""
		})
		if err == nil {
			t.Errorf("an %s secret file was taken", name)
		}
	}
}

// A process announces its advertise host with its listen and gossip ports;
// one bound to every address without an advertise host is refused.
func TestAdvertised(t *testing.T) {
	t.Setenv("REDCELL_ADVERTISE_HOST", "")
	for _, c := range []struct{ addr, host, want, err string }{
		{"127.0.0.1:9101", "", "127.0.0.1:9101", ""},
		{"0.0.0.0:9101", "10.1.2.3", "10.1.2.3:9101", ""},
		{"[::]:7947", "fd00::5", "[fd00::5]:7947", ""},
		{"0.0.0.0:9101", "", "", "listens on every address"},
		{":9101", "", "", "listens on every address"},
		{"nohost", "10.1.2.3", "", "missing port"},
	} {
		got, err := advertised(c.addr, c.host, "cell x listen")
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("advertised(%q, %q) = %q, %v; want %q, %q", c.addr, c.host, got, err, c.want, c.err)
		}
	}
	t.Setenv("REDCELL_ADVERTISE_HOST", "10.9.9.9") // the process's own wins over the file's
	fc := fileConfig{Cells: []cellEntry{{Name: "cell-1", AdvertiseHost: "10.1.1.1"}}}
	h, g, err := fc.cellAdvertise("cell-1", "0.0.0.0:9101", "0.0.0.0:7947")
	if err != nil || h != "10.9.9.9:9101" || g != "10.9.9.9:7947" {
		t.Fatalf("cellAdvertise: %q %q %v", h, g, err)
	}
}

// TestIdentityDefaultRegionConfig: identity_default_region reaches every
// cell from the file (the reference file's CN, and the default when absent),
// and a region the phone metadata does not know stops the cell.
func TestIdentityDefaultRegionConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	ref, err := os.ReadFile("../../deploy/local/redcell.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for region, want := range map[string]string{`"CN"`: "CN", `"DE"`: "DE", `""`: "CN", `"XX"`: ""} {
		path := filepath.Join(t.TempDir(), "redcell.yaml")
		text := strings.Replace(string(ref), `identity_default_region: "CN"`, "identity_default_region: "+region, 1)
		if !strings.Contains(text, "identity_default_region: "+region) {
			t.Fatal("the reference file sets no identity_default_region")
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		fc, err := loadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"cell-1", "cell-2"} {
			c, _, err := fc.cellConfig(name)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case want == "" && (err == nil || !strings.Contains(err.Error(), "IdentityDefaultRegion")):
				t.Errorf("region %s, %s: %v, want refused", region, name, err)
			case want != "" && (err != nil || c.IdentityDefaultRegion != want):
				t.Errorf("region %s, %s: %q, %v; want %s", region, name, c.IdentityDefaultRegion, err, want)
			}
		}
	}
}
