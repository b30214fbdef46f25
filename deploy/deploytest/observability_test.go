// Package deploytest checks the observability files under deploy/: the
// Prometheus rules (deploy/prometheus) pass promtool's check and their unit
// tests, the Grafana dashboard (deploy/grafana) is well formed, and every
// metric either of them names is one that redcell really exports.
package deploytest

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"redcell/cell/rewardtoken"
	"redcell/internal/testenv"
)

// Paths from this package's directory (go test runs in it).
const (
	moduleRoot    = "../.."
	rulesDir      = "../prometheus"
	dashboardPath = "../grafana/redcell.json"
)

// promtoolMissing says how to get promtool; the test fails rather than skips
// without it, so CI can never pass on rules nobody checked.
const promtoolMissing = "promtool is not on PATH. Install it the Debian way: " +
	"`apt-get install -y --no-install-recommends prometheus`, then stop the Prometheus daemon the package may " +
	"have started (`service prometheus stop`). deploy/local/testenv.sh (make test) does both when promtool is missing."

// TestPrometheusRules runs `promtool check rules` on the rule files and
// `promtool test rules` on their unit tests (*_test.yml).
func TestPrometheusRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal(promtoolMissing)
	}
	rules, tests := ruleFiles(t)
	for _, args := range [][]string{append([]string{"check", "rules"}, rules...), append([]string{"test", "rules"}, tests...)} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = rulesDir // rule_files in a test file are relative to it
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// ruleFiles returns the names (in rulesDir) of the rule files and of their
// unit-test files.
func ruleFiles(t *testing.T) (rules, tests []string) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(rulesDir, "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		name := filepath.Base(p)
		if strings.HasSuffix(name, "_test.yml") {
			tests = append(tests, name)
		} else {
			rules = append(rules, name)
		}
	}
	if len(rules) == 0 || len(tests) == 0 {
		t.Fatalf("%s: want rule files and *_test.yml unit tests, found rules %v, tests %v", rulesDir, rules, tests)
	}
	return rules, tests
}

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"` // a string, or {"query": "..."}
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Datasource json.RawMessage `json:"datasource"`
		Expr       string          `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows into their panels; rows themselves are left out.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		if p.Type != "row" {
			out = append(out, p)
		}
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// usesDatasourceVariable says whether a panel's or target's datasource is the
// dashboard's Prometheus variable (so the dashboard imports anywhere).
func usesDatasourceVariable(raw json.RawMessage) bool {
	if len(raw) == 0 || string(raw) == "null" {
		return false
	}
	var ds struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	if json.Unmarshal(raw, &ds) == nil && ds.UID != "" {
		return ds.Type == "prometheus" && isDatasourceVariable(ds.UID)
	}
	var s string // the older form: the variable as a string
	return json.Unmarshal(raw, &s) == nil && isDatasourceVariable(s)
}

func isDatasourceVariable(s string) bool {
	return s == "${datasource}" || s == "$datasource" || s == "${DS_PROMETHEUS}"
}

// TestDashboardPanels: the dashboard has a Prometheus datasource variable,
// and every panel a title, that datasource and targets with an expression.
func TestDashboardPanels(t *testing.T) {
	d := readDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current Grafana schema (39)", d.SchemaVersion)
	}
	hasVar := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"` {
			hasVar = true
		}
	}
	if !hasVar {
		t.Error(`no templating variable {"name": "datasource", "type": "datasource", "query": "prometheus"}`)
	}
	panels := allPanels(d.Panels)
	if len(panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	ids := map[int]string{}
	for _, p := range panels {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.Title == "" {
			t.Errorf("%s: no title", name)
		}
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("%s: id %d is also %q's", name, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", name)
		}
		if !usesDatasourceVariable(p.Datasource) {
			t.Errorf("%s: datasource %s, want {\"type\": \"prometheus\", \"uid\": \"${datasource}\"}", name, p.Datasource)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: target %s has no expr", name, tg.RefID)
			}
			if len(tg.Datasource) > 0 && string(tg.Datasource) != "null" && !usesDatasourceVariable(tg.Datasource) {
				t.Errorf("%s: target %s: datasource %s is not the dashboard's variable", name, tg.RefID, tg.Datasource)
			}
		}
	}
}

// An expression's metric references. There is no PromQL parser in go.mod
// (github.com/prometheus/prometheus is not a dependency), so these regular
// expressions read the few shapes the files use: string literals and
// comments are removed first; a name is an identifier starting with
// redcell_ (a metric) or redcell: (a recording rule), optionally followed by
// a {matcher, ...} selector; by (...) / without (...) list grouping labels.
var (
	stringLiteral = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	lineComment   = regexp.MustCompile(`#[^\n]*`)
	metricRef     = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:$])(redcell[_:][a-zA-Z0-9_:]*)(\s*\{[^}]*\})?`)
	matcherLabel  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping      = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// exprRef is one metric named in an expression, with the labels its
// selector matches on.
type exprRef struct {
	name   string
	labels []string
}

// parseExpr returns the metrics expr names and the labels it groups by.
func parseExpr(expr string) (refs []exprRef, groupBy []string) {
	clean := lineComment.ReplaceAllString(stringLiteral.ReplaceAllString(expr, `""`), "")
	for _, m := range metricRef.FindAllStringSubmatch(clean, -1) {
		r := exprRef{name: m[1]}
		for _, l := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			r.labels = append(r.labels, l[1])
		}
		refs = append(refs, r)
	}
	for _, m := range grouping.FindAllStringSubmatch(clean, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				groupBy = append(groupBy, l)
			}
		}
	}
	return refs, groupBy
}

// usedExpr is one expression of the rules or the dashboard.
type usedExpr struct {
	where, expr string
}

// expressions returns every expression of the rule files (not their tests)
// and of the dashboard (targets and query variables), and the names the rule
// files record.
func expressions(t *testing.T) (exprs []usedExpr, recorded map[string]bool) {
	t.Helper()
	recorded = map[string]bool{}
	rules, _ := ruleFiles(t)
	for _, name := range rules {
		b, err := os.ReadFile(filepath.Join(rulesDir, name))
		if err != nil {
			t.Fatal(err)
		}
		var rf ruleFile
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				id := r.Alert
				if r.Record != "" {
					id = r.Record
					recorded[r.Record] = true
				}
				exprs = append(exprs, usedExpr{where: fmt.Sprintf("%s rule %s", name, id), expr: r.Expr})
			}
		}
	}
	d := readDashboard(t)
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			exprs = append(exprs, usedExpr{where: fmt.Sprintf("dashboard panel %q target %s", p.Title, tg.RefID), expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		var s string
		if json.Unmarshal(v.Query, &s) != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Fatalf("dashboard variable %s: query %s: %v", v.Name, v.Query, err)
			}
			s = q.Query
		}
		exprs = append(exprs, usedExpr{where: "dashboard variable " + v.Name, expr: s})
	}
	return exprs, recorded
}

// family is what the checks know of one exported metric.
type family struct {
	histogram bool
	labels    map[string]bool // nil: not known (found in the source only)
	from      string          // where it was found
}

// TestRulesAndDashboardNameRealMetrics checks every metric the rules and the
// dashboard name, and the labels they select and group by, against what a
// running cell and router export on /metrics.
//
// Where the names come from: the cell's and the router's /metrics, scraped
// from the real binary (go build ./cmd/redcell) started as `redcell cell` and
// `redcell router` against the test MariaDB and memcached (make test and
// deploy/local/testenv.sh provide them; without them the test skips, and in
// CI fails, as every test of internal/testenv does). The redcell_audit_*
// series are the cell's own audit (cell/audit), so they come from the cell's
// scrape: the `redcell audit` command exposes no metrics. A *Vec series
// appears only once a label value is used; the test sends one request to each
// process (the request histograms) and waits for the router's first health
// probe of the cell (redcell_router_cell_healthy). The cell runs a reward
// key file, an activities file of one scene and a batches file of one batch,
// so that the reward and coupon series by scene and by batch are scraped.
// Vectors that stay empty on an idle cell (the reward reconciliation's, the
// archive's, the shadow cleaner's) are accepted when the Go source declares them by name
// (Name: "...", prometheus.NewDesc("...") or httpmetrics.New(reg, "...")),
// and the test logs each name taken from the source; their labels are not
// checked.
func TestRulesAndDashboardNameRealMetrics(t *testing.T) {
	exprs, recorded := expressions(t)
	exported := scrapeRunningCluster(t)
	known := map[string]family{}
	for name, f := range sourceMetrics(t) {
		known[name] = f
	}
	for name, f := range exported {
		known[name] = f // the scrape wins: it knows the labels
	}
	var fromSource []string
	for _, e := range exprs {
		refs, groupBy := parseExpr(e.expr)
		if len(refs) == 0 {
			t.Errorf("%s: names no redcell metric: %s", e.where, e.expr)
		}
		labels := map[string]bool{"job": true, "instance": true} // added by the scrape
		labelsKnown := true
		for _, r := range refs {
			if strings.Contains(r.name, ":") {
				if !recorded[r.name] {
					t.Errorf("%s: %s is not a recording rule of %s", e.where, r.name, rulesDir)
				}
				labelsKnown = false // a recorded series has the labels its rule keeps
				continue
			}
			f, ok := lookup(known, r.name)
			if !ok {
				t.Errorf("%s: metric %s is not exported by a cell or the router, nor declared in the Go source", e.where, r.name)
				labelsKnown = false
				continue
			}
			if f.labels == nil {
				fromSource = append(fromSource, fmt.Sprintf("%s (%s)", r.name, f.from))
				labelsKnown = false
				continue
			}
			bucket := f.histogram && strings.HasSuffix(r.name, "_bucket")
			for l := range f.labels {
				labels[l] = true
			}
			if bucket {
				labels["le"] = true
			}
			for _, l := range r.labels {
				if !f.labels[l] && l != "job" && l != "instance" && !(l == "le" && bucket) {
					t.Errorf("%s: %s has no label %q (it has %v)", e.where, r.name, l, keys(f.labels))
				}
			}
		}
		if labelsKnown {
			for _, l := range groupBy {
				if !labels[l] {
					t.Errorf("%s: groups by %q, which none of its metrics has (%v)", e.where, l, keys(labels))
				}
			}
		}
	}
	slices.Sort(fromSource)
	if fromSource = slices.Compact(fromSource); len(fromSource) > 0 {
		t.Logf("not in either scrape (a vector with no series yet); accepted from the Go source, labels unchecked: %v", fromSource)
	}
}

// lookup finds name, or the histogram whose _bucket, _sum or _count it is.
func lookup(known map[string]family, name string) (family, bool) {
	if f, ok := known[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := known[base]; ok && f.histogram {
				return f, true
			}
		}
	}
	return family{}, false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Declarations of metric names in the Go source (see sourceMetrics).
var (
	declaredName = regexp.MustCompile(`Name:\s*"(redcell_[a-zA-Z0-9_]+)"`)
	declaredDesc = regexp.MustCompile(`NewDesc\(\s*"(redcell_[a-zA-Z0-9_]+)"`)
	declaredHTTP = regexp.MustCompile(`httpmetrics\.New\([^,]+,\s*"(redcell_[a-zA-Z0-9_]+)"`)
)

// sourceMetrics returns the metric names the module's non-test Go files
// declare; a name on a line with HistogramOpts (or given to httpmetrics.New)
// is a histogram. Labels are not known from the source.
func sourceMetrics(t *testing.T) map[string]family {
	t.Helper()
	out := map[string]family{}
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != moduleRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "var" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, path)
		for _, line := range strings.Split(string(b), "\n") {
			for _, re := range []*regexp.Regexp{declaredName, declaredDesc, declaredHTTP} {
				for _, m := range re.FindAllStringSubmatch(line, -1) {
					hist := re == declaredHTTP || strings.Contains(line, "HistogramOpts")
					out[m[1]] = family{histogram: hist || out[m[1]].histogram, from: "source " + rel}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// scrapeRunningCluster builds redcell, runs one cell (owning no shards, so it
// neither writes money rows nor delivers what earlier tests left in the
// shared test database) and one router, and returns the union of the metric
// families both export on their admin ports.
func scrapeRunningCluster(t *testing.T) map[string]family {
	t.Helper()
	dsn := testenv.MySQLDSN(t, 1)
	mc := testenv.Memcached(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "redcell")
	build := exec.Command("go", "build", "-o", bin, "./cmd/redcell")
	build.Dir = moduleRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/redcell: %v\n%s", err, out)
	}
	p := testenv.FreePorts(t, 6)
	cellURL, cellAdmin := fmt.Sprintf("http://127.0.0.1:%d", p[0]), fmt.Sprintf("http://127.0.0.1:%d", p[2])
	routerURL, routerAdmin := fmt.Sprintf("http://127.0.0.1:%d", p[3]), fmt.Sprintf("http://127.0.0.1:%d", p[5])
	// The cell's name is this test's own: a cell saves what it owns under its
	// name in its database (moves), and no other test uses this one.
	// A reward key file, an activities file with one open scene and a
	// batches file with one batch: the reward and coupon series by scene
	// and by batch then exist from the start, with their labels.
	if err := rewardtoken.NewKeyFile(filepath.Join(dir, "reward-keys.yaml"), "k1"); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"activities.yaml": `activities:
  - id: deploytest-fest
    children:
      - id: deploytest-official
        stage: official
        rewards:
          - id: rain
            scenes:
              - {id: deploytest-rain, award_type: cash, amount: {min: 1, max: 100}, budget: 100000, rate_limit: {per_sec: 100, burst: 100}, control_stock: true, pay_into: wallet}
`,
		"coupons.yaml": "batches:\n  - {id: deploytest-batch, stock: 100, face_value: 100, per_person_limit: 1}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	config := fmt.Sprintf(`memcached: [%q]
admin_token: "deploytest-admin-token-0123"
cluster_secret: "deploytest-cluster-secret-0123456789"
gossip_seeds: ["127.0.0.1:%d", "127.0.0.1:%d"]
router:
  listen: "127.0.0.1:%d"
  gossip: "127.0.0.1:%d"
  admin_listen: "127.0.0.1:%d"
  api_keys: "api-keys.yaml"
  health_probe_interval: 200ms
cell:
  reward_keys: "reward-keys.yaml"
  activities: "activities.yaml"
  coupons: "coupons.yaml"
cells:
  - {name: deploytest-metrics, listen: "127.0.0.1:%d", gossip: "127.0.0.1:%d", shards: "", dsn: %q, admin_listen: "127.0.0.1:%d"}
`, mc, p[4], p[1], p[3], p[4], p[5], p[0], p[1], dsn, p[2])
	cfgPath := filepath.Join(dir, "redcell.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cell := startProcess(t, "cell", bin, "cell", "--config", cfgPath, "--name", "deploytest-metrics", "--log-level", "warn")
	router := startProcess(t, "router", bin, "router", "--config", cfgPath, "--log-level", "warn")
	waitMetrics(t, cell, cellAdmin)
	waitMetrics(t, router, routerAdmin)

	// One answer each, so that the request histograms have a series: unsigned
	// at the cell and without an API key at the router, both refused (401)
	// and counted.
	for _, u := range []string{cellURL, routerURL} {
		resp, err := http.Get(u + "/v1/accounts/deploytest-probe")
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		resp.Body.Close()
	}
	// The router's first health probe of the cell makes redcell_router_cell_healthy{cell}.
	// Bounded: past 30 s the test goes on without it, as it did past 15 s before.
	testenv.Until(30*time.Second, func() bool { return strings.Contains(get(t, routerAdmin+"/metrics"), "\nredcell_router_cell_healthy{") })

	out := map[string]family{}
	for _, src := range []struct{ name, url string }{{"cell", cellAdmin}, {"router", routerAdmin}} {
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(get(t, src.url+"/metrics")))
		if err != nil {
			t.Fatalf("%s /metrics: %v", src.name, err)
		}
		for name, mf := range fams {
			f, ok := out[name]
			if !ok {
				f = family{labels: map[string]bool{}, from: src.name + " /metrics"}
			} else {
				f.from += ", " + src.name + " /metrics"
			}
			f.histogram = f.histogram || mf.GetType() == dto.MetricType_HISTOGRAM
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					f.labels[l.GetName()] = true
				}
			}
			out[name] = f
		}
	}
	n := 0
	for name := range out {
		if strings.HasPrefix(name, "redcell_") {
			n++
		}
	}
	t.Logf("scraped %d redcell_* metric families from the cell and the router", n)
	return out
}

// process is a child process and a log of what it wrote.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *testenv.Buffer
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, once exited is closed
}

// startProcess runs bin with args until the test ends: then SIGTERM, and a
// kill if it is not gone within 20 s. Its output is logged if the test failed.
func startProcess(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: &testenv.Buffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("%s did not stop within 20 s of SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("--- log of %s ---\n%s", name, p.log.String())
		}
	})
	return p
}

// waitMetrics waits up to 60 s for p to answer GET /metrics on admin.
func waitMetrics(t *testing.T, p *process, admin string) {
	t.Helper()
	if !testenv.Until(60*time.Second, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before serving /metrics (%v):\n%s", p.name, p.err, p.log.String())
		default:
		}
		resp, err := http.Get(admin + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("%s did not serve %s/metrics within 60 s:\n%s", p.name, admin, p.log.String())
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}
