package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"redcell/api"
	"redcell/internal/testaudit"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// cluster is the real binaries — two cells and a router — on loopback, against
// MariaDB servers and a memcached, joined with memberlist. Processes can be
// stopped, killed and started again (the fault drills do), and the config
// rewritten in between (a cell coming back on new ports).
type cluster struct {
	t                   *testing.T // the test that started it: a spec mismatch of a request without a test of its own fails it
	bin, config, router string
	routerAdmin         string // the router's admin port: GET /metrics, /admin/keys
	spec                clusterSpec
	port                map[string]int // "router", "router-gossip", "cell-1", "cell-1-gossip", "cell-1-admin", ...
	cellURL             map[string]string
	adminURL            map[string]string

	mu    sync.Mutex // guards procs and logs: drills restart processes while loads run
	procs map[string]*exec.Cmd
	logs  map[string]*syncBuffer
}

// clusterSpec is what a cluster runs against and the config's cell section.
type clusterSpec struct {
	dsn [2]string // MariaDB of cell-1 and cell-2
	// standby: each cell's standby_dsn (empty: none).
	standby [2]string
	mc      string // memcached host:port
	// third: cell-3's MariaDB; cell-3 starts owning nothing (a cell being
	// added; redcell cells add gives it databases). "": no cell-3.
	third string
	// thirdStandby: cell-3's standby_dsn ("" none).
	thirdStandby string
	cell         string // the YAML body of the "cell:" section, indented two spaces
	// rewards: the cells issue rewards, as make run's do: the config names
	// activities.yaml (a copy of deploy/local/activities.yaml) and
	// reward-keys.yaml (made by redcell rewards keygen) beside it.
	rewards bool
	// coupons: the config names coupons.yaml beside it, holding one batch
	// (drill-base); tests add theirs (cluster.addCouponBatches).
	coupons bool
	// identity: the config has an identity_key, so identity binding works.
	identity bool
}

// e2eCell: packets expire within seconds so that the refund path runs in the test.
const e2eCell = `  packet_expiry: 3s
  expiry_interval: 300ms
  relay_interval: 300ms
`

// syncBuffer is a process log that tests may read while the process writes it.
type syncBuffer = testenv.Buffer

// freePorts returns n distinct loopback ports free for TCP and UDP (see
// testenv.FreePorts).
func freePorts(t *testing.T, n int) []int { return testenv.FreePorts(t, n) }

// binDir holds the binary buildBinary built; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	// Every exchange of http.DefaultClient (do, the tests' own calls, the
	// admin calls of the commands run in process) with a test cluster's
	// router or admin ports is checked against docs/openapi.yaml.
	http.DefaultClient.Transport = specTransport{next: http.DefaultTransport}
	code := m.Run()
	if s := specSummary(); s != "" {
		fmt.Print(s)
	}
	// The closing audit of the shared test servers (internal/testaudit):
	// clusters of this package run there, and a credit booked twice fails
	// the package even when every test passed.
	if report, ok := testaudit.Check("redcell/cmd/redcell"); !ok {
		fmt.Print(report)
		if code == 0 {
			code = 1
		}
	} else {
		fmt.Print(report)
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinary builds the redcell binary once per test process.
var buildBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "redcell-bin")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "redcell")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return bin, nil
})

func startClusterSpec(t *testing.T, spec clusterSpec) *cluster {
	t.Helper()
	settleLeftovers(t, spec.dsn[:])
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin, config: filepath.Join(t.TempDir(), "redcell.yaml"), spec: spec, port: map[string]int{},
		cellURL: map[string]string{}, adminURL: map[string]string{}, procs: map[string]*exec.Cmd{}, logs: map[string]*syncBuffer{}}
	t.Cleanup(func() { specForget(c) }) // after the processes stop (cleanups run last first)
	names := []string{"router", "router-gossip", "router-admin", "cell-1", "cell-1-gossip", "cell-1-admin", "cell-2", "cell-2-gossip", "cell-2-admin",
		"cell-3", "cell-3-gossip", "cell-3-admin"}
	for i, p := range freePorts(t, len(names)) {
		c.port[names[i]] = p
	}
	c.writeConfig(t)
	if spec.rewards {
		c.rewardFiles(t)
	}
	if spec.coupons {
		base := "batches:\n  - {id: drill-base, stock: 1000, face_value: 100, per_person_limit: 1}\n"
		if err := os.WriteFile(filepath.Join(filepath.Dir(c.config), "coupons.yaml"), []byte(base), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The calling app's key, made as make run makes it, beside the config
	// (where redcell bench --config finds it); do sends it with every request.
	keyFile := filepath.Join(filepath.Dir(c.config), "api-key")
	if out, err := exec.Command(bin, "apikey", "add", "--config", c.config, "--app", "e2e", "--scopes", "all", "--out", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("apikey add: %v\n%s", err, out)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	testAPIKey = strings.TrimSpace(string(key))
	c.start(t, "cell-1", "cell", "--config", c.config, "--name", "cell-1")
	c.start(t, "cell-2", "cell", "--config", c.config, "--name", "cell-2")
	if spec.third != "" {
		c.start(t, "cell-3", "cell", "--config", c.config, "--name", "cell-3")
	}
	c.start(t, "router", "router", "--config", c.config)
	t.Cleanup(func() { c.stopAll(t) })
	c.waitReady(t, 0)
	return c
}

// movePorts gives a cell new HTTP, gossip and admin ports (before it is
// started again).
func (c *cluster) movePorts(t *testing.T, cell string) {
	p := freePorts(t, 3)
	c.port[cell], c.port[cell+"-gossip"], c.port[cell+"-admin"] = p[0], p[1], p[2]
	c.writeConfig(t)
}

// writeConfig writes the config file from the spec and the current ports.
func (c *cluster) writeConfig(t *testing.T) {
	t.Helper()
	p := c.port
	cfg := fmt.Sprintf(`memcached: [%q]
admin_token: "e2e-admin-token-0123"
cluster_secret: "e2e-cluster-secret-0123456789"
gossip_seeds: ["127.0.0.1:%d", "127.0.0.1:%d", "127.0.0.1:%d"]
router:
  listen: "127.0.0.1:%d"
  gossip: "127.0.0.1:%d"
  admin_listen: "127.0.0.1:%d"
  api_keys: "api-keys.yaml"
cells:
  - {name: cell-1, listen: "127.0.0.1:%d", gossip: "127.0.0.1:%d", shards: "0-499", dsn: %q, standby_dsn: %q, admin_listen: "127.0.0.1:%d"}
  - {name: cell-2, listen: "127.0.0.1:%d", gossip: "127.0.0.1:%d", shards: "500-999", dsn: %q, standby_dsn: %q, admin_listen: "127.0.0.1:%d"}
cell:
%s%s`, c.spec.mc, p["router-gossip"], p["cell-1-gossip"], p["cell-2-gossip"], p["router"], p["router-gossip"], p["router-admin"],
		p["cell-1"], p["cell-1-gossip"], c.spec.dsn[0], c.spec.standby[0], p["cell-1-admin"],
		p["cell-2"], p["cell-2-gossip"], c.spec.dsn[1], c.spec.standby[1], p["cell-2-admin"], c.spec.cell, rewardLines(c.spec.rewards)+couponLines(c.spec.coupons))
	if c.spec.third != "" {
		cfg = strings.Replace(cfg, "cell:\n", fmt.Sprintf("  - {name: cell-3, listen: \"127.0.0.1:%d\", gossip: \"127.0.0.1:%d\", shards: \"\", dsn: %q, standby_dsn: %q, admin_listen: \"127.0.0.1:%d\"}\ncell:\n",
			p["cell-3"], p["cell-3-gossip"], c.spec.third, c.spec.thirdStandby, p["cell-3-admin"]), 1)
	}
	if c.spec.identity {
		cfg = "identity_key: \"e2e-identity-key-0123456789\"\n" + cfg
	}
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.router = fmt.Sprintf("http://127.0.0.1:%d", p["router"])
	c.routerAdmin = fmt.Sprintf("http://127.0.0.1:%d", p["router-admin"])
	for _, name := range c.cells(false) {
		c.cellURL[name] = fmt.Sprintf("http://127.0.0.1:%d", p[name])
		c.adminURL[name] = fmt.Sprintf("http://127.0.0.1:%d", p[name+"-admin"])
	}
	specRegister(c)
}

// rewardLines is what the cell section gets when the cells issue rewards.
func rewardLines(rewards bool) string {
	if !rewards {
		return ""
	}
	return "  activities: \"activities.yaml\"\n  reward_keys: \"reward-keys.yaml\"\n"
}

// couponLines is what the cell section gets when the cells issue coupons.
func couponLines(coupons bool) string {
	if !coupons {
		return ""
	}
	return "  coupons: \"coupons.yaml\"\n"
}

// rewardFiles puts the reward activities and a token key file beside the
// config, as deploy/local/run.sh does for make run.
func (c *cluster) rewardFiles(t *testing.T) {
	t.Helper()
	dir := filepath.Dir(c.config)
	acts, err := os.ReadFile("../../deploy/local/activities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "activities.yaml"), acts, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(c.bin, "rewards", "keygen", "--out", filepath.Join(dir, "reward-keys.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("rewards keygen: %v\n%s", err, out)
	}
}

// start runs the binary as process name; a process started again under the
// same name appends to the same log.
func (c *cluster) start(t *testing.T, name string, args ...string) {
	c.startCmd(t, name, exec.Command(c.bin, args...), "")
}

// startCmd starts cmd as process name, its output appended to name's log
// after a line that says when, and where (" in ...", or ""), it started.
func (c *cluster) startCmd(t *testing.T, name string, cmd *exec.Cmd, where string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := c.logs[name]
	if buf == nil {
		buf = &syncBuffer{}
		c.logs[name] = buf
	}
	fmt.Fprintf(buf, "--- started %s%s ---\n", time.Now().Format(time.RFC3339Nano), where)
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.procs[name] = cmd
}

// restart starts a stopped or killed process again with its usual arguments.
func (c *cluster) restart(t *testing.T, name string) {
	if name == "router" {
		c.start(t, name, "router", "--config", c.config)
		return
	}
	c.start(t, name, "cell", "--config", c.config, "--name", name)
}

func (c *cluster) take(name string) *exec.Cmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := c.procs[name]
	delete(c.procs, name)
	return cmd
}

// stopAll stops the cluster's processes, the router first (cells(true)),
// and, when t has failed, logs the output of each.
func (c *cluster) stopAll(t *testing.T) {
	for _, name := range c.cells(true) {
		c.stop(t, name)
	}
	if t.Failed() {
		for name, b := range c.logs {
			t.Logf("--- log of %s ---\n%s", name, b.String())
		}
	}
}

// stop sends SIGTERM and requires a clean exit within 20 s.
func (c *cluster) stop(t *testing.T, name string) {
	cmd := c.take(name)
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s exited with %v", name, err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Errorf("%s did not stop within 20 s of SIGTERM", name)
	}
}

// kill ends the process with SIGKILL: no drain, no leave, nothing flushed.
func (c *cluster) kill(t *testing.T, name string) {
	cmd := c.take(name)
	if cmd == nil {
		t.Fatalf("%s is not running", name)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// waitReady waits until the router's map has uncovered shards == want.
func (c *cluster) waitReady(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var h struct {
			Uncovered int `json:"uncovered_shards"`
		}
		if st, _ := do(t, "GET", c.router+"/healthz", nil, &h); st == 200 && h.Uncovered == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("router never saw %d uncovered shards", want)
}

// waitSchema waits until every cell has created today's and tomorrow's tables
// (a startup phase whose DDL load would otherwise make the first opens wait).
func (c *cluster) waitSchema(t *testing.T) {
	t.Helper()
	for name, url := range c.cellURL {
		deadline := time.Now().Add(90 * time.Second)
		for {
			var h struct {
				SchemaReady bool `json:"schema_ready"`
			}
			if st, _ := do(t, "GET", url+"/healthz", nil, &h); st == 200 && h.SchemaReady {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never finished creating its tables", name)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// metric returns the sum of the samples of a Prometheus series (name plus an
// optional label filter such as `{breaker="db"}`) on a cell's admin port.
func (c *cluster) metric(t *testing.T, cell, series string) float64 {
	t.Helper()
	resp, err := adminUp(func() (*http.Response, error) { return http.Get(c.adminURL[cell] + "/metrics") })
	if err != nil {
		t.Fatalf("%s metrics: %v", cell, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, series) {
			continue
		}
		rest := line[len(series):]
		if !strings.HasPrefix(rest, " ") && (strings.HasSuffix(series, "}") || !strings.HasPrefix(rest, "{")) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// testAPIKey is the API key of the cluster the test runs (startClusterSpec
// makes one per cluster); do sends it with every request.
var testAPIKey string

// authorize adds what the router requires of a calling app: its API key, and
// for a body the JSON media type.
func authorize(req *http.Request, hasBody bool) {
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
}

func do(t *testing.T, method, url string, body, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(withSpecTest(t), method, url, rd)
	authorize(req, body != nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "TRANSPORT"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		var e api.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" {
			t.Errorf("%s %s: %d with a non-error body %q", method, url, resp.StatusCode, b)
		}
		return resp.StatusCode, e.Error.Code
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Errorf("decode %q: %v", b, err)
		}
	}
	return 200, ""
}

func actIn(prefix string, from, to int) string {
	for i := 0; ; i++ {
		a := fmt.Sprintf("%s-%d", prefix, i)
		if s := int(sharding.ShardOfAct(a)); s >= from && s <= to {
			return a
		}
	}
}

// settleLeftovers readies the servers all for this cluster
// (testaudit.Settle): each database's relay position moves past the claims
// earlier tests credited on one of them, and reconciliation positions are
// forgotten. This cluster's relay, whose shard map differs from theirs,
// would otherwise read such a claim again past an earlier cell's saved
// position and deliver it to another cell, crediting it twice (a credit an
// earlier cell booked on the other server, for a shard this cluster gives to
// this one, was once booked again here); its reconciliation, resuming, would
// re-drive it. Claims past the latest credited one stay for the relay.
func settleLeftovers(t *testing.T, all []string) {
	t.Helper()
	var dsns []string
	for _, d := range all {
		if d != "" {
			dsns = append(dsns, d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	moved, err := testaudit.Settle(ctx, dsns)
	if err != nil {
		t.Fatal(err)
	}
	if moved > 0 {
		t.Logf("moved %d relay positions past the claims earlier tests credited", moved)
	}
}

// cells names the cluster's cells (cell-3 only when the spec has one), and
// the router first when withRouter.
func (c *cluster) cells(withRouter bool) []string {
	out := []string{"cell-1", "cell-2"}
	if c.spec.third != "" {
		out = append(out, "cell-3")
	}
	if withRouter {
		out = append([]string{"router"}, out...)
	}
	return out
}
