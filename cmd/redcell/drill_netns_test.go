package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"redcell/api"
)

// The netns drills (docs/operations.md, "A multi-host rehearsal on one
// machine"): the cluster as on three hosts, each in a network namespace of
// its own on a bridge (deploy/netns/netns.sh): the router and memcached in
// one, each cell with its MariaDB in another. Two drills, each under the
// drill load (drill_test.go) and ending with its checks and a clean audit:
//
//   - partition: cell-2's link down for longer than memberlist's dead-node
//     timeout, then up again;
//   - toxics: 100 ms of latency and "5 % loss" (Toxiproxy) between the
//     router and cell-1 and between cell-1 and its MariaDB.
//
// Toxiproxy runs in cell-1's namespace: this test binary, started again
// there with netnsToxiproxyEnv set, serves its API (init below). Cell-1
// listens on 127.0.0.1 and announces its namespace's address (advertise_host)
// with its ports, where a proxy forwards to it; its gossip binds that address
// itself, so memberlist's UDP and TCP go straight over the bridge, never
// through a proxy. Its DSN names a second proxy in front of its MariaDB.

// netnsToxiproxyEnv, set to host:port, makes this test binary a Toxiproxy
// server listening there instead of running tests.
const netnsToxiproxyEnv = "REDCELL_NETNS_TOXIPROXY"

func init() {
	if addr := os.Getenv(netnsToxiproxyEnv); addr != "" {
		serveToxiproxy(addr)
	}
}

// serveToxiproxy serves Toxiproxy's API on addr until the process is killed.
func serveToxiproxy(addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", netnsToxiproxyEnv, addr, err)
		os.Exit(2)
	}
	log := zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), log).Listen(host, port) // exits on error
	os.Exit(1)
}

// The ports inside the namespaces: each node has an address of its own, so
// fixed ones never meet another process's.
const (
	nsRouterPort, nsRouterGossip, nsRouterAdmin, nsMemcached = 8080, 7946, 9200, 21211
	nsToxiproxyAPI                                           = 8474
	nsDBProxy                                                = 23071 // cell-1's MariaDB behind Toxiproxy
)

var nsCellPorts = map[string]struct{ http, gossip, admin, db int }{
	"cell-1": {9101, 7947, 9201, 23061},
	"cell-2": {9102, 7948, 9202, 23062},
}

// netnsRig is the network netns.sh made for one test and what runs in it
// besides the redcell processes.
type netnsRig struct {
	id, script, services string
	names                map[string]string // netns.sh names: PREFIX, HOST_IP, NS_<node>, IP_<node>
	dir                  string
	bin                  string // the redcell binary
	tox                  *toxiclient.Client
	proxy                map[string]*toxiclient.Proxy // "http", "db": cell-1's
	toxLog               *syncBuffer
}

// node names of netns.sh: r (router, memcached), c1 and c2 (cells).
func (r *netnsRig) ns(node string) string { return r.names["NS_"+node] }
func (r *netnsRig) ip(node string) string { return r.names["IP_"+node] }

func cellNode(cell string) string { return "c" + strings.TrimPrefix(cell, "cell-") }

// netnsParams: the short drill in make test, the full one in make drill.
type netnsParams struct {
	workers    int
	pace       time.Duration // per worker, between requests
	maxOps     int64
	lead       time.Duration // load before the fault, and after recovery
	deadMax    time.Duration // how long the partition may wait for memberlist's dead-node declaration
	holdDead   time.Duration // partition kept this long after it
	toxicsFor  time.Duration
	senders    int
	openers    int
	backMax    time.Duration // heal to served, at the most
	probeEvery time.Duration
}

func TestDrillNetns(t *testing.T) {
	needNetns(t)
	p := netnsParams{workers: 4, pace: 40 * time.Millisecond, maxOps: 20_000, lead: 1500 * time.Millisecond, deadMax: 60 * time.Second,
		holdDead: 2 * time.Second, toxicsFor: 5 * time.Second, senders: 12, openers: 100, backMax: 60 * time.Second, probeEvery: 50 * time.Millisecond}
	if os.Getenv("REDCELL_DRILL") == "full" {
		p.workers, p.pace, p.maxOps, p.lead, p.holdDead, p.toxicsFor, p.openers = 16, 10*time.Millisecond, 1_000_000, 10*time.Second, 30*time.Second, 30*time.Second, 300
	}
	started := time.Now()
	r := upNetns(t)
	r.startServices(t)
	r.startToxiproxy(t)
	c := r.startCluster(t)
	t.Logf("netns cluster %s (%s.0/24) serving %s after the start", r.id, r.names["PREFIX"], time.Since(started).Round(time.Millisecond))
	t.Run("partition", func(t *testing.T) { netnsPartition(t, c, r, p) })
	if t.Failed() {
		return
	}
	t.Run("toxics", func(t *testing.T) { netnsToxics(t, c, r, p) })
}

// needNetns skips without root or ip (fails in CI), and without MariaDB
// and memcached as needServers does.
func needNetns(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "the netns drills need root (network namespaces, veth pairs, a bridge)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "the netns drills need ip (iproute2)"
	}
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why + "; run make test or make drill as root")
	}
	needServers(t)
}

// upNetns makes the network (netns.sh up) under a fresh ID, and removes it
// and whatever runs in it when the test ends, failed or not.
func upNetns(t *testing.T) *netnsRig {
	t.Helper()
	script, _ := filepath.Abs("../../deploy/netns/netns.sh")
	services, _ := filepath.Abs("../../deploy/local/services.sh")
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	r := &netnsRig{script: script, services: services, dir: t.TempDir(), bin: bin, names: map[string]string{}}
	// Networks whose owner died without removing them (a test killed at its
	// timeout runs no cleanup) go first.
	if out, err := exec.Command(script, "sweep").CombinedOutput(); err != nil || len(out) > 0 {
		t.Logf("netns.sh sweep: %v\n%s", err, out)
	}
	for try := 1; ; try++ {
		id := fmt.Sprintf("t%04x", rand.IntN(0x10000))
		out, err := exec.Command(script, "up", id).Output() // a failed up removes what it made
		if err == nil {
			t.Cleanup(func() { // after everything else but the temp dir
				if out, err := exec.Command(script, "down", id).CombinedOutput(); err != nil {
					t.Errorf("netns.sh down %s: %v\n%s", id, err, out)
				}
			})
			r.id = id
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				if k, v, ok := strings.Cut(sc.Text(), "="); ok {
					r.names[k] = v
				}
			}
			return r
		}
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		if strings.Contains(msg, "Operation not permitted") && os.Getenv("CI") == "" {
			t.Skipf("netns.sh up: %s (no network namespaces here)", msg)
		}
		if try == 3 { // another network holds the subnet of each ID tried
			t.Fatalf("netns.sh up %s: %v: %s", id, err, msg)
		}
	}
}

// sh runs a script with deploy/local/services.sh's functions in node's
// namespace.
func (r *netnsRig) sh(t *testing.T, node, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", r.ns(node), "bash", "-c", ". "+r.services+"\nset -e\n"+script)
	cmd.Env = append(os.Environ(), "REDCELL_FILE_PER_TABLE=0", "REDCELL_BIND_ADDR="+r.ip(node))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("in %s: %s: %v\n%s", r.ns(node), script, err, out)
	}
}

// startServices starts each cell's MariaDB in its namespace and memcached
// in the router's; they stop before the network goes.
func (r *netnsRig) startServices(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		cmd := exec.Command("bash", "-c", fmt.Sprintf(". %s; stop_mariadb %[2]s/db1 & stop_mariadb %[2]s/db2; wait; stop_memcached %[2]s/mc", r.services, r.dir))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("stopping MariaDB and memcached: %v\n%s", err, out)
		}
	})
	var wg sync.WaitGroup
	errs := make(chan string, 2)
	for i, cell := range []string{"cell-1", "cell-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := cellNode(cell)
			cmd := exec.Command("ip", "netns", "exec", r.ns(node), "bash", "-c",
				fmt.Sprintf(". %s\nstart_mariadb %s/db%d %d fast", r.services, r.dir, i+1, nsCellPorts[cell].db))
			cmd.Env = append(os.Environ(), "REDCELL_FILE_PER_TABLE=0", "REDCELL_BIND_ADDR="+r.ip(node))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Sprintf("MariaDB of %s: %v\n%s", cell, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	r.sh(t, "r", fmt.Sprintf("start_memcached %s/mc %d", r.dir, nsMemcached))
}

// startToxiproxy runs the Toxiproxy server in cell-1's namespace and makes
// cell-1's two proxies, without toxics: its HTTP (announced address →
// 127.0.0.1, where it listens) and its MariaDB (nsDBProxy → the server).
func (r *netnsRig) startToxiproxy(t *testing.T) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	api := net.JoinHostPort(r.ip("c1"), strconv.Itoa(nsToxiproxyAPI))
	cmd := exec.Command("ip", "netns", "exec", r.ns("c1"), self)
	cmd.Env = append(os.Environ(), netnsToxiproxyEnv+"="+api)
	r.toxLog = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = r.toxLog, r.toxLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	r.tox = toxiclient.NewClient(api)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err = r.tox.Proxies(); err == nil {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("Toxiproxy's API on %s never answered: %v\n%s", api, err, r.toxLog.String())
		}
	}
	p1 := nsCellPorts["cell-1"]
	r.proxy = map[string]*toxiclient.Proxy{}
	for name, ends := range map[string][2]string{
		"http": {net.JoinHostPort(r.ip("c1"), strconv.Itoa(p1.http)), net.JoinHostPort("127.0.0.1", strconv.Itoa(p1.http))},
		"db":   {net.JoinHostPort(r.ip("c1"), strconv.Itoa(nsDBProxy)), net.JoinHostPort(r.ip("c1"), strconv.Itoa(p1.db))},
	} {
		if r.proxy[name], err = r.tox.CreateProxy("cell-1-"+name, ends[0], ends[1]); err != nil {
			t.Fatalf("proxy cell-1-%s: %v", name, err)
		}
	}
}

// netnsConfig is the cluster config: every address a namespace's, cell-1
// behind its proxies.
func (r *netnsRig) netnsConfig() string {
	rt, c1, c2 := r.ip("r"), r.ip("c1"), r.ip("c2")
	p1, p2 := nsCellPorts["cell-1"], nsCellPorts["cell-2"]
	return fmt.Sprintf(`memcached: ["%[1]s:%[4]d"]
admin_token: "e2e-admin-token-0123"
cluster_secret: "e2e-cluster-secret-0123456789"
gossip_seeds: ["%[1]s:%[5]d", "%[2]s:%[8]d", "%[3]s:%[11]d"]
router:
  listen: "%[1]s:%[6]d"
  gossip: "%[1]s:%[5]d"
  admin_listen: "%[1]s:%[13]d"
  api_keys: "api-keys.yaml"
cells:
  - {name: cell-1, listen: "127.0.0.1:%[7]d", advertise_host: %[2]q, gossip: "%[2]s:%[8]d", shards: "0-499", dsn: "root@tcp(%[2]s:%[14]d)/", admin_listen: "%[2]s:%[9]d"}
  - {name: cell-2, listen: "%[3]s:%[10]d", gossip: "%[3]s:%[11]d", shards: "500-999", dsn: "root@tcp(%[3]s:%[15]d)/", admin_listen: "%[3]s:%[12]d"}
cell:
%[16]s`, rt, c1, c2, nsMemcached, nsRouterGossip, nsRouterPort, p1.http, p1.gossip, p1.admin, p2.http, p2.gossip, p2.admin,
		nsRouterAdmin, nsDBProxy, p2.db, drillCell)
}

// startCluster writes the config and an API key, starts the cells and the
// router each in its namespace, and waits until the router covers every
// shard and the cells have made their tables. The processes stop (SIGTERM,
// a clean exit required) before the proxies, MariaDB and the network.
func (r *netnsRig) startCluster(t *testing.T) *cluster {
	t.Helper()
	cfg := filepath.Join(r.dir, "redcell.yaml")
	if err := os.WriteFile(cfg, []byte(r.netnsConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(r.dir, "api-key")
	if out, err := exec.Command(r.bin, "apikey", "add", "--config", cfg, "--app", "e2e", "--scopes", "all", "--out", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("apikey add: %v\n%s", err, out)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	testAPIKey = strings.TrimSpace(string(key))
	hostPort := func(node string, port int) string {
		return "http://" + net.JoinHostPort(r.ip(node), strconv.Itoa(port))
	}
	c := &cluster{t: t, bin: r.bin, config: cfg, router: hostPort("r", nsRouterPort), routerAdmin: hostPort("r", nsRouterAdmin),
		port: map[string]int{}, cellURL: map[string]string{}, adminURL: map[string]string{}, procs: map[string]*exec.Cmd{}, logs: map[string]*syncBuffer{}}
	for _, cell := range []string{"cell-1", "cell-2"} {
		p := nsCellPorts[cell]
		c.cellURL[cell], c.adminURL[cell] = hostPort(cellNode(cell), p.http), hostPort(cellNode(cell), p.admin)
	}
	specRegister(c)
	t.Cleanup(func() { specForget(c) })
	r.startProc(t, c, "cell-1", "c1", "cell", "--config", cfg, "--name", "cell-1")
	r.startProc(t, c, "cell-2", "c2", "cell", "--config", cfg, "--name", "cell-2")
	r.startProc(t, c, "router", "r", "router", "--config", cfg)
	t.Cleanup(func() {
		c.stopAll(t)
		if t.Failed() {
			t.Logf("--- log of toxiproxy ---\n%s", r.toxLog.String())
		}
	})
	start := time.Now()
	c.waitReady(t, 0)
	ready := time.Since(start)
	c.waitSchema(t)
	t.Logf("the router covered every shard %s after the processes started, the cells had made their tables %s after that",
		ready.Round(time.Millisecond), (time.Since(start) - ready).Round(time.Millisecond))
	return c
}

// startProc runs the redcell binary as process name in node's namespace
// (ip netns exec runs it in its own place: the pid is redcell's).
func (r *netnsRig) startProc(t *testing.T, c *cluster, name, node string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", r.ns(node), r.bin}, args...)...)
	// An advertise host from the environment would override the config's
	// for every process.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "REDCELL_ADVERTISE_HOST=") })
	c.startCmd(t, name, cmd, " in "+r.ns(node))
}

// link sets node's link up or down (netns.sh link).
func (r *netnsRig) link(t *testing.T, node, state string) {
	t.Helper()
	if out, err := exec.Command(r.script, "link", r.id, node, state).CombinedOutput(); err != nil {
		t.Fatalf("netns.sh link %s %s %s: %v\n%s", r.id, node, state, err, out)
	}
}

// routerHealth is the router's GET /healthz: the cells of its map, and the
// cells gossip lists that its probes hold out.
type routerHealth struct {
	Cells     []routerCell `json:"cells"`
	CellsOut  []string     `json:"cells_out"`
	Uncovered int          `json:"uncovered_shards"`
}

func (h routerHealth) lists(cell string) []routerCell {
	var out []routerCell
	for _, rc := range h.Cells {
		if rc.Name == cell {
			out = append(out, rc)
		}
	}
	return out
}

func health(t *testing.T, c *cluster) routerHealth {
	t.Helper()
	var h routerHealth
	if st, code := do(t, "GET", c.routerURL()+"/healthz", nil, &h); st != 200 {
		t.Fatalf("router /healthz: %d %s", st, code)
	}
	return h
}

// startLoad runs the drill load's sends and opens (drillLoad) with
// p.workers workers, each at most one request per p.pace (a light load: the
// refusals of a cut-off cell come back at once, and an unpaced load would
// only pile up requests for verify to settle), until the returned stop is
// called (at most 20 minutes or p.maxOps requests); stop returns once the
// workers have.
func startLoad(t *testing.T, c *cluster, prefix string, p netnsParams) (*drillLoad, func()) {
	l := newDrillLoad(t, c, prefix+randHex(), p.senders, p.openers)
	done, stop := make(chan struct{}), make(chan struct{})
	var ops atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Minute)
	for w := range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			tick := time.NewTicker(p.pace)
			defer tick.Stop()
			for time.Now().Before(deadline) && ops.Add(1) <= p.maxOps {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				l.mu.Lock()
				nlive := len(l.live)
				l.mu.Unlock()
				if nlive < 8 || rng.IntN(100) < 8 {
					l.send(rng)
				} else {
					l.open(rng)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var once sync.Once
	return l, func() { once.Do(func() { close(stop); <-done }) }
}

// netnsPartition cuts cell-2 off (its link down) under load until the
// router's map has dropped it (its probes) and memberlist has declared it
// dead (gossip's map no longer lists it), keeps it cut p.holdDead longer,
// heals the link and measures the time until the router lists and serves
// cell-2 again (the same process: it rejoins, nothing restarts).
func netnsPartition(t *testing.T, c *cluster, r *netnsRig, p netnsParams) {
	cell1Act, cell2Act := actIn("probe-a", 0, 499), actIn("probe-b", 500, 999)
	l, stopLoad := startLoad(t, c, "np", p)
	defer stopLoad()
	time.Sleep(p.lead)
	before := health(t, c).lists("cell-2")
	r.link(t, "c2", "down")
	cut := time.Now()
	healed := false
	defer func() {
		if !healed {
			r.link(t, "c2", "up")
		}
	}()
	out, dead := waitPartitioned(t, c, cut, p.deadMax)
	ok2, code2 := servesAct(t, c, cell2Act)
	ok1, code1 := servesAct(t, c, cell1Act)
	if ok2 || code2 != "CELL_UNAVAILABLE" || !ok1 {
		t.Errorf("cell-2 partitioned and dead to gossip: its shards answered %v %s (want CELL_UNAVAILABLE), cell-1's %v %s (want served)", ok2, code2, ok1, code1)
	}
	time.Sleep(p.holdDead)
	r.link(t, "c2", "up")
	healed = true
	cutFor := time.Since(cut)
	listed, served := waitHealed(t, c, cell2Act, p.backMax)
	now := health(t, c).lists("cell-2")
	if len(before) != 1 || len(now) != 1 || now[0] != before[0] {
		t.Errorf("router /healthz lists cell-2 as %+v before the partition and %+v after; want the same process once", before, now)
	}
	time.Sleep(p.lead)
	stopLoad()
	c.waitReady(t, 0)
	t.Logf("partition: cell-2's link down for %s: out of the router's map (probes) after %s, dead to gossip (memberlist) after %s; "+
		"healed: back in the router's map after %s, served after %s; %s; opens by answer: %v",
		cutFor.Round(time.Millisecond), out.Round(time.Millisecond), dead.Round(time.Millisecond), listed.Round(time.Millisecond),
		served.Round(time.Millisecond), l.verify(t), l.codes(time.Time{}, time.Now().Add(time.Hour)))
	netnsBackInMap(t, c, "cell-2")
}

// waitPartitioned polls the router's /healthz from cut until cell-2 is out
// of its map (the probes' drop) and then gone from gossip's map too (no
// longer in cells_out: memberlist declared it dead, seen within a probe
// interval); limit bounds the wait.
func waitPartitioned(t *testing.T, c *cluster, cut time.Time, limit time.Duration) (out, dead time.Duration) {
	t.Helper()
	for {
		h := health(t, c)
		gone := len(h.lists("cell-2")) == 0
		if out == 0 && gone {
			out = time.Since(cut)
		}
		if out != 0 && gone && !slices.Contains(h.CellsOut, "cell-2") {
			return out, time.Since(cut)
		}
		if time.Since(cut) > limit {
			t.Fatalf("cell-2 cut off %s ago: the router's map still lists it (%v) or gossip does (cells_out %v); out after %s", limit, h.Cells, h.CellsOut, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHealed returns how long after the heal the router listed cell-2 in
// its map again and served act, one of its accounts; limit bounds the wait.
func waitHealed(t *testing.T, c *cluster, act string, limit time.Duration) (listed, served time.Duration) {
	t.Helper()
	start := time.Now()
	for listed == 0 || served == 0 {
		if listed == 0 && len(health(t, c).lists("cell-2")) == 1 {
			listed = time.Since(start)
		}
		if ok, _ := servesAct(t, c, act); ok && served == 0 {
			served = time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("cell-2 healed %s ago and not back: listed after %s, served after %s", limit, listed, served)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return listed, served
}

// netnsBackInMap requires the router's map whole, with cell once.
func netnsBackInMap(t *testing.T, c *cluster, cell string) {
	t.Helper()
	if h := health(t, c); h.Uncovered != 0 || len(h.lists(cell)) != 1 || len(h.CellsOut) != 0 {
		t.Errorf("after the drill the router's map is %+v; want %s in it once, every shard covered", h, cell)
	}
}

// netnsToxics adds, under load, 100 ms of latency and a 5 % loss to both of
// cell-1's proxies (router → cell-1, cell-1 → its MariaDB) for p.toxicsFor,
// then removes them. Toxiproxy has no packet loss: a timeout toxic with
// toxicity 0.05 on the downstream black-holes the answers of one connection
// in 20 (each connection draws once, when it opens or when the toxic comes)
// and closes it after 1 s without data, a lost answer being the case that
// matters to money: the request was applied and its caller cannot know.
// Meanwhile a probe reads an account of cell-1 through the router; its
// latency proves the proxies are in the path. cell-1's requests must still
// succeed, with only retryable errors besides.
func netnsToxics(t *testing.T, c *cluster, r *netnsRig, p netnsParams) {
	act := actIn("probe-a", 0, 499)
	l, stopLoad := startLoad(t, c, "nt", p)
	defer stopLoad()
	pr := startProbe(t, c, act, p.probeEvery)
	defer pr.stop()
	time.Sleep(p.lead)
	from := time.Now()
	r.addToxics(t)
	removed := false
	defer func() {
		if !removed {
			r.removeToxics(t)
		}
	}()
	time.Sleep(p.toxicsFor)
	to := time.Now()
	r.removeToxics(t)
	removed = true
	time.Sleep(p.lead)
	pr.stop()
	stopLoad()
	during := pr.window(from, to)
	after := pr.window(to.Add(time.Second), time.Now())
	opens := cellOpens(l, from, to, 0, 499)
	before, later := cellOpens(l, time.Time{}, from, 0, 499), cellOpens(l, to, time.Now(), 0, 499)
	breaker := strings.Count(c.log("cell-1"), "circuit breaker opened")
	bad := map[string]int{}
	for code, n := range opens {
		if code != "OK" && code != "SOLD_OUT" && code != "NO_ANSWER" && !api.Retryable(code) {
			bad[code] = n
		}
	}
	if opens["OK"] == 0 || len(bad) > 0 || during.ok == 0 || during.p50 < 100*time.Millisecond {
		t.Errorf("under the toxics cell-1's opens were answered %v (not retryable: %v); the probe read %d of %d, p50 %s (want >= 100 ms: the latency toxics)",
			opens, bad, during.ok, during.n, during.p50)
	}
	c.waitReady(t, 0)
	t.Logf("toxics: 100 ms latency and 5%% loss on router→cell-1 and cell-1→MariaDB for %s: cell-1's opens answered %v (%.1f%% with a claim or sold out); "+
		"before %v, after %v; cell-1's breakers opened %d times; the probe read of a cell-1 account: %d of %d answered (%.1f%%), p50 %s, p99 %s, max %s (after: p50 %s, p99 %s); %s; opens by answer: %v",
		to.Sub(from).Round(time.Millisecond), opens, pct(opens["OK"]+opens["SOLD_OUT"], sum(opens)), before, later, breaker, during.ok, during.n, pct(during.ok, during.n),
		during.p50, during.p99, during.max, after.p50, after.p99, l.verify(t), l.codes(time.Time{}, time.Now().Add(time.Hour)))
	netnsBackInMap(t, c, "cell-1")
}

// addToxics puts the latency and loss toxics on both of cell-1's proxies.
func (r *netnsRig) addToxics(t *testing.T) {
	t.Helper()
	for _, name := range []string{"http", "db"} {
		if _, err := r.proxy[name].AddToxic("latency", "latency", "downstream", 1, toxiclient.Attributes{"latency": 100}); err != nil {
			t.Fatalf("latency toxic on cell-1-%s: %v", name, err)
		}
		if _, err := r.proxy[name].AddToxic("loss", "timeout", "downstream", 0.05, toxiclient.Attributes{"timeout": 1000}); err != nil {
			t.Fatalf("loss toxic on cell-1-%s: %v", name, err)
		}
	}
}

// removeToxics takes the latency toxics away and turns the loss off: a
// timeout toxic is set to toxicity 0, not removed, since Toxiproxy's removal
// of one closes every connection of its proxy (its Cleanup closes each
// link), an outage of its own the drill does not mean (it opened cell-1's
// database breaker at once, 400 DB_UNAVAILABLE answers).
func (r *netnsRig) removeToxics(t *testing.T) {
	t.Helper()
	for _, name := range []string{"http", "db"} {
		if err := r.proxy[name].RemoveToxic("latency"); err != nil {
			t.Errorf("removing the latency toxic of cell-1-%s: %v", name, err)
		}
		if _, err := r.proxy[name].UpdateToxic("loss", 0, toxiclient.Attributes{"timeout": 1000}); err != nil {
			t.Errorf("turning off the loss toxic of cell-1-%s: %v", name, err)
		}
	}
}

// cellOpens counts by answer the opens made in [from, to) of packets whose
// shard is within [lo, hi] (a packet ID carries its shard after the date).
func cellOpens(l *drillLoad, from, to time.Time, lo, hi int) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int{}
	for _, o := range l.opens {
		if o.at.Before(from) || !o.at.Before(to) || len(o.packetID) < 11 {
			continue
		}
		if s, err := strconv.Atoi(o.packetID[8:11]); err == nil && s >= lo && s <= hi {
			m[o.res.label()]++
		}
	}
	return m
}

// probe reads one account through the router every few ms, timing each read.
type probe struct {
	mu    sync.Mutex // guards reads
	reads []probeRead
	stop  func()
}

type probeRead struct {
	at  time.Time
	dur time.Duration
	ok  bool
}

func startProbe(t *testing.T, c *cluster, act string, every time.Duration) *probe {
	pr := &probe{}
	hc := &http.Client{Timeout: 10 * time.Second}
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100_000; i++ {
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
			at := time.Now()
			a := drillCall(hc, c.routerURL(), "GET", "/v1/accounts/"+act, nil, nil, func(st int) bool { return st == 200 || st == 404 })
			pr.mu.Lock()
			pr.reads = append(pr.reads, probeRead{at: at, dur: time.Since(at), ok: a.ok()})
			pr.mu.Unlock()
		}
	}()
	var once sync.Once
	pr.stop = func() { once.Do(func() { close(stop); <-done }) }
	return pr
}

type probeStats struct {
	n, ok         int
	p50, p99, max time.Duration
}

// window sums up the reads started in [from, to).
func (pr *probe) window(from, to time.Time) probeStats {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var s probeStats
	var durs []time.Duration
	for _, r := range pr.reads {
		if r.at.Before(from) || !r.at.Before(to) {
			continue
		}
		s.n++
		if r.ok {
			s.ok++
		}
		durs = append(durs, r.dur)
	}
	if len(durs) == 0 {
		return s
	}
	slices.Sort(durs)
	at := func(q float64) time.Duration {
		return durs[min(len(durs)-1, int(q*float64(len(durs))))].Round(time.Millisecond)
	}
	s.p50, s.p99, s.max = at(0.50), at(0.99), durs[len(durs)-1].Round(time.Millisecond)
	return s
}

// sum adds up the values of m (counts by answer, rates by cell).
func sum[V int | float64](m map[string]V) V {
	var n V
	for _, v := range m {
		n += v
	}
	return n
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
