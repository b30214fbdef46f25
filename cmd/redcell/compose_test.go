package main

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/go-sql-driver/mysql"
)

// composeDir holds the Compose deployment (docs/operations.md, "Deploy with
// Compose").
const composeDir = "../../deploy/compose"

// composeSecrets are the secret files loadCompose writes, as secrets.sh makes them.
var composeSecrets = map[string]string{
	"cluster_secret": "compose-test-cluster-secret-0123", "admin_token": "compose-test-admin-token-0123",
	"db_password": "compose-test-db-password", "api-keys.yaml": "keys: []\n",
}

// loadCompose copies deploy/compose into a temporary directory with secret
// files and loads the Compose files named (later ones on top of earlier
// ones, as docker compose -f a -f b does) with the Compose specification's
// own loader. It returns the project, the directory and the secrets.
func loadCompose(t *testing.T, files ...string) (*types.Project, string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"compose.yaml", "compose.standby.yaml", "redcell.yaml", "redcell.standby.yaml"} {
		b, err := os.ReadFile(filepath.Join(composeDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, v := range composeSecrets {
		if err := os.WriteFile(filepath.Join(dir, "secrets", name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var cf []types.ConfigFile
	for _, f := range files {
		cf = append(cf, types.ConfigFile{Filename: filepath.Join(dir, f)})
	}
	p, err := loader.LoadWithContext(t.Context(), types.ConfigDetails{WorkingDir: dir, ConfigFiles: cf, Environment: types.Mapping{}},
		func(o *loader.Options) { o.SetProjectName("redcell", true) })
	if err != nil {
		t.Fatalf("%v does not load: %v", files, err)
	}
	return p, dir, composeSecrets
}

// TestComposeDeployment loads deploy/compose/compose.yaml with the Compose
// specification's own loader (its JSON schema and consistency checks), loads
// the cluster config it mounts with redcell's own, and checks that the two
// agree: a service per cell and one router, each on the address its config
// gives it, reading its secrets from files Compose mounts, healthy by the
// image's own probe, each cell after its own MariaDB (a ROW binlog, a server
// id of its own); and that the Dockerfile builds the static, non-root image
// the services run.
func TestComposeDeployment(t *testing.T) {
	p, dir, secrets := loadCompose(t, "compose.yaml")

	// The cluster config as the containers read it: the file Compose
	// mounts, the secrets from the files their _FILE variables name.
	cfgMount := p.Configs["redcell"]
	if filepath.Clean(cfgMount.File) != filepath.Join(dir, "redcell.yaml") {
		t.Fatalf("configs.redcell is %q, want the redcell.yaml beside compose.yaml", cfgMount.File)
	}
	secretPath := func(svc types.ServiceConfig, env string) string {
		t.Helper()
		v := svc.Environment[env]
		if v == nil || !strings.HasPrefix(*v, "/run/secrets/") {
			t.Fatalf("%s: %s is not a file under /run/secrets", svc.Name, env)
		}
		name := strings.TrimPrefix(*v, "/run/secrets/")
		if !slices.ContainsFunc(svc.Secrets, func(s types.ServiceSecretConfig) bool {
			return s.Source == name && (s.Target == "" || s.Target == name || s.Target == *v)
		}) {
			t.Errorf("%s: %s names secret %q, which the service does not mount", svc.Name, env, name)
		}
		top, ok := p.Secrets[name]
		if !ok {
			t.Fatalf("%s: secret %q is not declared", svc.Name, name)
		}
		return top.File
	}
	load := func(svc types.ServiceConfig) fileConfig {
		t.Helper()
		if !slices.ContainsFunc(svc.Configs, func(c types.ServiceConfigObjConfig) bool {
			return c.Source == "redcell" && c.Target == "/etc/redcell/redcell.yaml"
		}) {
			t.Fatalf("%s does not mount the cluster config at /etc/redcell/redcell.yaml", svc.Name)
		}
		env := map[string]string{}
		for k := range svc.Environment {
			if strings.HasSuffix(k, "_FILE") {
				env[k] = secretPath(svc, k)
			}
		}
		for _, kv := range os.Environ() { // only the file and the service's own variables
			if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "REDCELL_") {
				t.Setenv(k, "")
			}
		}
		for k, v := range env {
			t.Setenv(k, v)
		}
		fc, err := loadConfig(filepath.Join(dir, "redcell.yaml"))
		for k := range env {
			t.Setenv(k, "")
		}
		if err != nil {
			t.Fatalf("%s: the cluster config: %v", svc.Name, err)
		}
		if fc.ClusterSecret != secrets["cluster_secret"] || fc.AdminToken != secrets["admin_token"] {
			t.Errorf("%s reads its cluster secret and admin token from elsewhere than its secret files", svc.Name)
		}
		return fc
	}
	ipOf := func(svc types.ServiceConfig) string {
		t.Helper()
		n := svc.Networks["redcell"]
		if n == nil || n.Ipv4Address == "" {
			t.Fatalf("%s has no fixed address on network redcell (gossip advertises an IP)", svc.Name)
		}
		return n.Ipv4Address
	}
	host := func(addr string) string {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("address %q: %v", addr, err)
		}
		return h
	}
	probes := func(svc types.ServiceConfig, url string) {
		t.Helper()
		want := []string{"CMD", "/usr/local/bin/redcell", "healthcheck", url}
		if svc.HealthCheck == nil || !slices.Equal([]string(svc.HealthCheck.Test), want) {
			t.Errorf("%s's health check is %v, want %v", svc.Name, svc.HealthCheck, want)
		}
	}

	fc := load(p.Services["router"])
	if len(fc.Cells) != 3 {
		t.Fatalf("the config has %d cells, want 3", len(fc.Cells))
	}
	var serverIDs []string
	gossip := []string{fc.Router.Gossip}
	for _, c := range fc.Cells {
		svc, ok := p.Services[c.Name]
		if !ok {
			t.Errorf("cell %s has no service", c.Name)
			continue
		}
		cfc := load(svc)
		cc, _, err := cfc.cellConfig(c.Name)
		if err != nil {
			t.Errorf("cell %s: the config does not validate: %v", c.Name, err)
			continue
		}
		if got, want := []string(svc.Command), []string{"cell", "--config", "/etc/redcell/redcell.yaml", "--name", c.Name}; !slices.Equal(got, want) {
			t.Errorf("%s runs %v, want %v", c.Name, got, want)
		}
		ip := ipOf(svc)
		for _, a := range []string{c.Listen, c.Gossip, c.AdminListen} {
			if host(a) != ip {
				t.Errorf("%s: %s is not its address %s", c.Name, a, ip)
			}
		}
		gossip = append(gossip, c.Gossip)
		probes(svc, "http://"+c.Listen+"/healthz")
		dsn, err := mysql.ParseDSN(cc.DSN)
		if err != nil {
			t.Fatal(err)
		}
		if dsn.Passwd != secrets["db_password"] {
			t.Errorf("%s's DSN has not the password of its secret file", c.Name)
		}
		db, ok := p.Services[host(dsn.Addr)]
		if !ok {
			t.Errorf("%s's database %s has no service", c.Name, dsn.Addr)
			continue
		}
		if svc.DependsOn[db.Name].Condition != types.ServiceConditionHealthy {
			t.Errorf("%s does not wait for %s to be healthy", c.Name, db.Name)
		}
		if !strings.HasPrefix(db.Image, "mariadb:") || db.HealthCheck == nil {
			t.Errorf("%s: image %q, health check %v", db.Name, db.Image, db.HealthCheck)
		}
		if pw := db.Environment["MARIADB_ROOT_PASSWORD_FILE"]; pw == nil || secretPath(db, "MARIADB_ROOT_PASSWORD_FILE") != secretPath(svc, "REDCELL_DB_PASSWORD_FILE") {
			t.Errorf("%s's root password is not the secret %s reads", db.Name, c.Name)
		}
		args := strings.Join(db.Command, " ")
		for _, want := range []string{"--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin", "--expire-logs-days="} {
			if !slices.ContainsFunc(db.Command, func(a string) bool { return strings.HasPrefix(a, want) }) {
				t.Errorf("%s runs without %s (byte-wise text comparison; binlogs that expire)", db.Name, want)
			}
		}
		id := regexp.MustCompile(`--server-id=(\d+)`).FindStringSubmatch(args)
		if !slices.Contains(db.Command, "--binlog-format=ROW") || !slices.ContainsFunc(db.Command, func(a string) bool { return strings.HasPrefix(a, "--log-bin=") }) || id == nil {
			t.Errorf("%s does not write a ROW binlog with a server id (moves replicate): %s", db.Name, args)
		} else if slices.Contains(serverIDs, id[1]) {
			t.Errorf("%s's server id %s is another's", db.Name, id[1])
		} else {
			serverIDs = append(serverIDs, id[1])
		}
		for _, m := range fc.Memcached {
			if _, ok := p.Services[host(m)]; !ok {
				t.Errorf("memcached %s has no service", m)
			}
		}
	}
	if len(p.Services) != 1+2*len(fc.Cells)+1 {
		t.Errorf("%d services, want the router, a cell and a MariaDB per cell, and memcached: %v", len(p.Services), p.ServiceNames())
	}

	router := p.Services["router"]
	if _, err := fc.routerConfig(); err != nil {
		t.Errorf("the router's config does not validate: %v", err)
	}
	rip := ipOf(router)
	for _, a := range []string{fc.Router.Listen, fc.Router.Gossip, fc.Router.AdminListen} {
		if host(a) != rip {
			t.Errorf("router: %s is not its address %s", a, rip)
		}
	}
	probes(router, "http://"+fc.Router.Listen+"/healthz")
	for _, c := range fc.Cells {
		if router.DependsOn[c.Name].Condition != types.ServiceConditionHealthy {
			t.Errorf("the router does not wait for %s to be healthy", c.Name)
		}
	}
	if got := fc.Router.APIKeys; got != "/run/secrets/api_keys" || !slices.ContainsFunc(router.Secrets, func(s types.ServiceSecretConfig) bool {
		return s.Source == "api_keys" && (s.Target == "" || s.Target == "api_keys" || s.Target == got)
	}) || p.Secrets["api_keys"].File == "" {
		t.Errorf("the router's API keys are %q, not its mounted secret api_keys", got)
	}
	var published []string
	for _, port := range router.Ports {
		published = append(published, port.Published)
	}
	if !slices.Contains(published, "8080") || !slices.Contains(published, "9200") {
		t.Errorf("the router publishes %v, want 8080 (API) and 9200 (metrics, admin)", published)
	}
	slices.Sort(gossip)
	seeds := slices.Sorted(slices.Values(fc.GossipSeeds))
	if !slices.Equal(gossip, seeds) {
		t.Errorf("gossip seeds %v, want every node's gossip address %v", seeds, gossip)
	}

	// The image: built static (no libc in the base), run as non-root, the
	// binary where the health checks call it.
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	stages := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	last := strings.LastIndex(df, "\nFROM ")
	if last < 0 {
		t.Fatal("Dockerfile: no FROM")
	}
	final := df[last:]
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/redcell"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
	if len(stages) < 2 || !strings.Contains(stages[len(stages)-1][1], "distroless/static") {
		t.Errorf("Dockerfile's final base is %v, want a distroless static base", stages)
	}
	if !regexp.MustCompile(`(?m)^USER\s+nonroot`).MatchString(final) || !strings.Contains(final, "/usr/local/bin/redcell") {
		t.Errorf("Dockerfile's final stage does not run /usr/local/bin/redcell as nonroot:\n%s", final)
	}
	for name, svc := range p.Services {
		if strings.HasPrefix(name, "cell-") || name == "router" {
			if svc.Image != "redcell:dev" {
				t.Errorf("%s runs image %q, want redcell:dev (docker build -t redcell:dev .)", name, svc.Image)
			}
		}
	}
}

// TestComposeStandby loads compose.yaml with compose.standby.yaml on top, as
// docker compose -f ... -f ... does, and checks the standbys against the
// cluster config the cells then mount: each cell's standby_dsn names a
// standby service replicating (by the MariaDB image's own setup) from the
// very host and port of the cell's dsn, which the cell's failover requires of
// its standby; both sides semi-synchronous (AFTER_SYNC), every server id its
// own, the replication password and the root password from the mounted
// secret; each cell waits for its standby; and redcell.standby.yaml is
// redcell.yaml but for standby_dsn.
func TestComposeStandby(t *testing.T) {
	p, dir, secrets := loadCompose(t, "compose.yaml", "compose.standby.yaml")
	if got := filepath.Clean(p.Configs["redcell"].File); got != filepath.Join(dir, "redcell.standby.yaml") {
		t.Fatalf("with standbys the cells mount %q, want redcell.standby.yaml", got)
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "REDCELL_") {
			t.Setenv(k, "")
		}
	}
	t.Setenv("REDCELL_DB_PASSWORD_FILE", filepath.Join(dir, "secrets", "db_password"))
	t.Setenv("REDCELL_CLUSTER_SECRET_FILE", filepath.Join(dir, "secrets", "cluster_secret"))
	t.Setenv("REDCELL_ADMIN_TOKEN_FILE", filepath.Join(dir, "secrets", "admin_token"))
	withStandby, err := loadConfig(filepath.Join(dir, "redcell.standby.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := loadConfig(filepath.Join(dir, "redcell.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	stripped := withStandby
	stripped.Cells = slices.Clone(withStandby.Cells)
	for i := range stripped.Cells {
		stripped.Cells[i].StandbyDSN = ""
	}
	if !reflect.DeepEqual(stripped, plain) {
		t.Fatalf("redcell.standby.yaml differs from redcell.yaml by more than standby_dsn:\n%+v\n%+v", stripped, plain)
	}
	semisync := []string{"--rpl-semi-sync-master-enabled=1", "--rpl-semi-sync-slave-enabled=1",
		"--rpl-semi-sync-master-wait-point=AFTER_SYNC", "--log-bin=mariadb-bin", "--binlog-format=ROW", "--collation-server=utf8mb4_bin"}
	ids := map[string]string{}
	serverID := func(svc types.ServiceConfig) {
		t.Helper()
		for _, f := range semisync {
			if !slices.Contains([]string(svc.Command), f) {
				t.Errorf("%s runs without %s", svc.Name, f)
			}
		}
		m := regexp.MustCompile(`^--server-id=(\d+)$`)
		for _, a := range svc.Command {
			if id := m.FindStringSubmatch(a); id != nil {
				if other, dup := ids[id[1]]; dup {
					t.Errorf("%s and %s share server id %s", svc.Name, other, id[1])
				}
				ids[id[1]] = svc.Name
				// A GTID domain of its own: a standby replicates by GTID the
				// binlog a move also writes the source's transactions into.
				if !slices.Contains([]string(svc.Command), "--gtid-domain-id="+id[1]) {
					t.Errorf("%s has server id %s but not --gtid-domain-id=%s", svc.Name, id[1], id[1])
				}
				return
			}
		}
		t.Errorf("%s has no --server-id", svc.Name)
	}
	env := func(svc types.ServiceConfig, k string) string {
		if v := svc.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	for _, c := range withStandby.Cells {
		cfg, _, err := withStandby.cellConfig(c.Name)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		primary, err := mysql.ParseDSN(cfg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		standby, err := mysql.ParseDSN(cfg.StandbyDSN)
		if err != nil || cfg.StandbyDSN == "" {
			t.Fatalf("%s: standby_dsn %q: %v", c.Name, cfg.StandbyDSN, err)
		}
		if primary.Passwd != secrets["db_password"] || standby.Passwd != secrets["db_password"] {
			t.Errorf("%s: the passwords are not the db_password secret's", c.Name)
		}
		pHost, pPort, _ := net.SplitHostPort(primary.Addr)
		sHost, sPort, _ := net.SplitHostPort(standby.Addr)
		ps, ok := p.Services[pHost]
		if !ok {
			t.Fatalf("%s: no service %s (its dsn)", c.Name, pHost)
		}
		ss, ok := p.Services[sHost]
		if !ok {
			t.Fatalf("%s: no service %s (its standby_dsn)", c.Name, sHost)
		}
		if pPort != "3306" || sPort != "3306" {
			t.Errorf("%s: ports %s and %s, want MariaDB's 3306", c.Name, pPort, sPort)
		}
		// The cell refuses a standby that replicates from anywhere but the
		// host:port of its dsn (SHOW SLAVE STATUS's Master_Host, Master_Port).
		if got := env(ss, "MARIADB_MASTER_HOST"); got != pHost || env(ss, "MARIADB_MASTER_PORT") != "" && env(ss, "MARIADB_MASTER_PORT") != pPort {
			t.Errorf("%s replicates from %q, want %s (the cell's dsn)", sHost, got, pHost)
		}
		for _, svc := range []types.ServiceConfig{ps, ss} {
			serverID(svc)
			if env(svc, "MARIADB_REPLICATION_USER") != "repl" || env(svc, "MARIADB_REPLICATION_PASSWORD_FILE") != "/run/secrets/db_password" ||
				env(svc, "MARIADB_ROOT_PASSWORD_FILE") != "/run/secrets/db_password" {
				t.Errorf("%s: replication user or password files: %v", svc.Name, svc.Environment)
			}
			if !slices.ContainsFunc(svc.Secrets, func(s types.ServiceSecretConfig) bool { return s.Source == "db_password" }) {
				t.Errorf("%s does not mount db_password", svc.Name)
			}
		}
		if d, ok := ss.DependsOn[pHost]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s does not wait for its primary to be healthy", sHost)
		}
		if ss.HealthCheck == nil || !slices.Contains([]string(ss.HealthCheck.Test), "--replication_io") || !slices.Contains([]string(ss.HealthCheck.Test), "--replication_sql") {
			t.Errorf("%s's health check does not look at its replication: %v", sHost, ss.HealthCheck)
		}
		cs := p.Services[c.Name]
		for _, dep := range []string{pHost, sHost} {
			if d, ok := cs.DependsOn[dep]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s does not wait for %s to be healthy", c.Name, dep)
			}
		}
		if !slices.ContainsFunc(ss.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Source == sHost && v.Target == "/var/lib/mysql" }) {
			t.Errorf("%s keeps its data in no volume of its own", sHost)
		}
	}
	if len(ids) != 6 {
		t.Fatalf("server ids %v, want 6 distinct", ids)
	}
}
