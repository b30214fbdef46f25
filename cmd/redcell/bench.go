package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/api"
	"redcell/bench"
	"redcell/model"
)

// runConfig is the workload's defaults with the flags given applied over them.
func (f *benchFlags) runConfig() bench.Config {
	w := f.workload
	if w == workloadLimits {
		w = bench.WorkloadSmoke
	}
	cfg := bench.DefaultWorkloadConfig(w)
	cfg.RouterURL, cfg.Duration, cfg.AllowShed, cfg.Direct, cfg.Real = f.router, f.duration, f.allowShed, f.direct, f.real
	cfg.Rate, cfg.MaxInFlight = f.rate, f.maxInFlight
	cfg.ClusterSecret, cfg.APIKey = f.clusterSecret, f.apiKey
	cfg.RouterPprof = f.routerPprof
	given(f, "senders", &cfg.Senders, f.senders)
	given(f, "openers", &cfg.Openers, f.openers)
	given(f, "users", &cfg.Users, f.users)
	given(f, "packets", &cfg.Packets, f.packets)
	given(f, "amount", &cfg.PacketAmount, f.amount)
	given(f, "count", &cfg.PacketCount, f.count)
	cfg.Progress = os.Stderr
	if path := f.configPath; path != "" {
		// Bench traffic is stress traffic: the cells keep it in shadow tables,
		// so the audit that proves the run is the shadow one; a --real run's
		// is the real one.
		shadow := !f.real
		cfg.Audit = func(ctx context.Context) (model.AuditReport, error) { return auditNamespace(ctx, path, shadow) }
	}
	return cfg
}

// suiteConfig builds the invocation: the run, the strategies, the limits.
func (f *benchFlags) suiteConfig() (bench.SuiteConfig, error) {
	sc := bench.SuiteConfig{Run: f.runConfig(), SkipLoad: f.workload == workloadLimits, CompareDirect: f.compareDirect}
	if !f.plain() {
		sc.Log = os.Stderr
	}
	if f.configPath != "" {
		cells, err := metricsTargets(f.configPath)
		if err != nil {
			return sc, err
		}
		sc.Cells = cells
		if f.work {
			if sc.Run.Work, err = workSources(f.configPath, f.idleWindow); err != nil {
				return sc, err
			}
			if f.bare && f.workload != workloadLimits {
				if sc.Bare, err = bareConfig(f.configPath, f.bareWorkers, f.bareDuration); err != nil {
					return sc, err
				}
			}
		}
	}
	if f.searchOn {
		search := f.search
		sc.Search, sc.SearchOnly = &search, f.searchOnly
		if f.sustain.Strategy != "" {
			sustain := f.sustain
			sc.Sustain = &sustain
		}
	}
	if f.compare != "" {
		if f.configPath == "" {
			return sc, errors.New("bench: --compare switches the cells' strategy through their admin ports: it needs --config")
		}
		for _, s := range strings.Split(f.compare, ",") {
			if s = strings.TrimSpace(s); s != "" {
				sc.Strategies = append(sc.Strategies, s)
			}
		}
		path := f.configPath
		sc.SetStrategy = func(ctx context.Context, s string) error { return setClusterStrategy(ctx, path, s) }
		sc.GetStrategy = func(ctx context.Context) (string, error) { return getClusterStrategy(ctx, path) }
	}
	if f.limits || f.workload == workloadLimits {
		lc := f.defaultLimitsConfig
		lc.RouterURL, lc.Concurrency = f.router, f.limitsConcurrency
		lc.HTTPDuration, lc.DBDuration = f.limitsDuration, f.limitsDuration
		lc.Progress = os.Stderr
		lc.ClusterSecret, lc.APIKey = f.clusterSecret, f.apiKey
		lc.Wrk, lc.WrkSkipped = bench.FindWrk(f.wrk)
		lc.RouterPprof = f.routerPprof
		if path := f.configPath; path != "" {
			lc.DBLimit = func(ctx context.Context, batch int, d time.Duration) (float64, error) {
				return dbLimit(ctx, path, batch, d)
			}
		}
		sc.Limits = &lc
	}
	if f.baselinePath != "" {
		b, err := f.baseline()
		if err != nil {
			return sc, err
		}
		if b.Cells, err = metricsTargets(f.baselinePath); err != nil {
			return sc, err
		}
		if f.compare != "" {
			path := f.baselinePath
			b.SetStrategy = func(ctx context.Context, s string) error { return setClusterStrategy(ctx, path, s) }
			b.GetStrategy = func(ctx context.Context) (string, error) { return getClusterStrategy(ctx, path) }
		}
		sc.Baseline = b
	}
	return sc, sc.Validate()
}

// baseline is the --baseline cluster (nil without the flag), its work
// measured (workSources) with --work.
func (f *benchFlags) baseline() (*bench.Cluster, error) {
	if f.baselinePath == "" {
		return nil, nil
	}
	b, err := baselineCluster(f.baselinePath, f.baselineName, !f.real)
	if err != nil {
		return nil, err
	}
	if f.work {
		if b.Work, err = workSources(f.baselinePath, f.idleWindow); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// baselineCluster reads the --baseline cluster from its config: where its
// router listens, its cluster secret and the API key make run wrote beside it.
func baselineCluster(path, name string, shadow bool) (*bench.Cluster, error) {
	fc, err := loadConfig(path)
	if err != nil {
		return nil, fmt.Errorf("bench: --baseline: %w", err)
	}
	if fc.Router.Listen == "" {
		return nil, fmt.Errorf("bench: --baseline %s names no router.listen", path)
	}
	key, err := os.ReadFile(filepath.Join(filepath.Dir(path), "api-key"))
	if err != nil {
		return nil, fmt.Errorf("bench: --baseline: the API key beside its config: %w", err)
	}
	return &bench.Cluster{Name: name, RouterURL: "http://" + fc.Router.Listen, ClusterSecret: fc.ClusterSecret,
		APIKey: strings.TrimSpace(string(key)),
		Audit:  func(ctx context.Context) (model.AuditReport, error) { return auditNamespace(ctx, path, shadow) }}, nil
}

// metricsTargets lists the GET /metrics of every cell in the config that has
// an admin port (which serves it without a token).
func metricsTargets(configPath string) ([]bench.MetricsTarget, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return nil, err
	}
	var out []bench.MetricsTarget
	for _, c := range fc.Cells {
		if c.AdminListen != "" {
			out = append(out, bench.MetricsTarget{Cell: c.Name, URL: "http://" + c.AdminListen + "/metrics"})
		}
	}
	return out, nil
}

// plain is a single smoke run, printed as before: no files unless asked.
func (f *benchFlags) plain() bool {
	return f.workload == bench.WorkloadSmoke && f.compare == "" && !f.compareDirect && !f.limits && f.baselinePath == "" && !f.searchOn
}

// runBench drives load (see bench.RunSuite), prints every run's text report and
// the comparisons to stdout, and writes the report files (--out, --json). It
// returns an error when any run or step fails (see bench.Suite.OK), so the exit
// status tells CI.
func runBench(ctx context.Context, args []string) (err error) {
	f, err := parseBenchFlags(args)
	if err != nil {
		return err
	}
	if f.cleanupOnly {
		return cleanShadowSpaces(ctx, f.configPath, os.Stdout)
	}
	if f.cleanup {
		defer func() { err = cleanAfterBench(ctx, f.configPath, err) }()
	}
	if f.external != "" { // its own traffic: real, no shadow tables to make
		return runExternalBench(ctx, f, args)
	}
	if f.configPath != "" && f.prepareShadow && !f.real { // a real run writes the real tables, made at the cells' start
		// The shadow space's tables before the first run: else the runs
		// create them, and whichever comes second pays (prepareShadow).
		if err := prepareShadow(ctx, f.configPath, os.Stderr); err != nil {
			return err
		}
	}
	if f.workload == bench.WorkloadRewards {
		return runRewardsBench(ctx, f, args)
	}
	if f.workload == bench.WorkloadCoupons {
		return runCouponsBench(ctx, f, args)
	}
	sc, err := f.suiteConfig()
	if err != nil {
		return err
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if sc.Bare != nil {
		defer sc.Bare.DB.Close()
	}
	suite, runErr := bench.RunSuite(ctx, sc)
	if runErr != nil && len(suite.Runs) == 0 && suite.Limits == nil && len(suite.Search) == 0 {
		return runErr // nothing ran (say, the cells' strategy could not be read)
	}
	suite.Config = map[string]any{"args": args}
	if err := writeBenchOutput(f, suite); err != nil {
		return err
	}
	if runErr != nil {
		return fmt.Errorf("bench: stopped early: %w", runErr)
	}
	return benchVerdict(suite)
}

// benchVerdict is an invocation's exit: nil (status 0) when every run was
// made and balanced its money, whatever the cluster shed by design in runs
// that allow it (counted in the summary's verdict) and whether every
// strategy's search confirmed a rate; else "bench FAILED" with the problems.
func benchVerdict(suite bench.Suite) error {
	if !suite.OK() {
		return fmt.Errorf("bench FAILED: %s", strings.Join(suite.Problems(), "; "))
	}
	return nil
}

// startCPUProfile profiles this process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); out.Close() }, nil
}

// writeBenchOutput prints the reports and writes the files the flags ask for.
func writeBenchOutput(f *benchFlags, suite bench.Suite) error {
	for _, r := range suite.Runs {
		if err := r.WriteText(os.Stdout); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
		fmt.Println()
	}
	if !f.plain() {
		if err := suite.WriteSummary(os.Stdout); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
	}
	if f.jsonPath != "" {
		var v any = suite
		if f.plain() && len(suite.Runs) == 1 {
			v = suite.Runs[0] // a single run's report, as before suites existed
		}
		if err := writeJSONFile(f.jsonPath, v); err != nil {
			return err
		}
	}
	dir := f.outDir
	if dir == "" && !f.plain() {
		dir = filepath.Join("var", "bench", suite.StartedAt.Format("20060102-150405"))
	}
	if dir == "" {
		return nil
	}
	if err := bench.WriteFiles(dir, suite); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s, %s and %s in %s\n", bench.ReportMarkdownFile, bench.ReportJSONFile, bench.ChartFile, dir)
	return nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// adminTimeout bounds one request to a cell's admin port.
const adminTimeout = 5 * time.Second

// getClusterStrategy reads the open strategy of every cell in the config that
// has an admin port (GET /admin/strategy with the admin token). The cells must
// agree: a comparison restores one strategy to all of them afterwards.
func getClusterStrategy(ctx context.Context, configPath string) (string, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return "", err
	}
	seen := map[string][]string{} // strategy -> cells
	for _, c := range fc.Cells {
		if c.AdminListen == "" {
			continue
		}
		st, err := getCellStrategy(ctx, c.AdminListen, fc.AdminToken)
		if err != nil {
			return "", fmt.Errorf("bench: strategy of cell %s: %w", c.Name, err)
		}
		seen[st.Strategy] = append(seen[st.Strategy], c.Name)
	}
	switch len(seen) {
	case 0:
		return "", fmt.Errorf("bench: no cell in %s has an admin_listen to read its strategy from", configPath)
	case 1:
		for s := range seen {
			return s, nil
		}
	}
	return "", fmt.Errorf("bench: the cells run different strategies %v; set one first", seen)
}

func getCellStrategy(ctx context.Context, adminAddr, token string) (api.StrategySetting, error) {
	var st api.StrategySetting
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/admin/strategy", nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /admin/strategy: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &st); err != nil || st.Strategy == "" {
		return st, fmt.Errorf("GET /admin/strategy: unreadable answer %q", body)
	}
	return st, nil
}

// bareConfig is the bare open's run on the database server of the config's
// first cell: a pool of its own (parameters interpolated, as the cells'
// statements are, so each statement is one round trip); nil when the
// config names no database server (nothing to run it on).
func bareConfig(configPath string, workers int, d time.Duration) (*bench.BareConfig, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return nil, err
	}
	if len(fc.Cells) == 0 || fc.Cells[0].DSN == "" {
		return nil, nil // no database server to run it on: no floor
	}
	if workers < 1 || workers > 256 || d <= 0 || d > 5*time.Minute {
		return nil, errors.New("bench: --bare-workers must be 1..256 and --bare-duration in (0, 5m]")
	}
	dc, err := mysql.ParseDSN(fc.Cells[0].DSN)
	if err != nil {
		return nil, fmt.Errorf("bench: --bare: cell %s: dsn: %w", fc.Cells[0].Name, err)
	}
	dc.DBName, dc.InterpolateParams = "", true
	db, err := sql.Open("mysql", dc.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(workers + 1)
	db.SetMaxIdleConns(workers + 1)
	return &bench.BareConfig{DB: db, Workers: workers, Duration: d}, nil
}

// runBare runs the bare open after a rewards or coupons invocation, measured
// by work (nil: --work off, no floor), unless --bare=false or the config
// names no database server. A failed bare run is said on stderr and leaves
// no floor: the workload's verdict is its own.
func (f *benchFlags) runBare(ctx context.Context, work *bench.WorkSources) *bench.BareReport {
	if !f.bare || work == nil || f.configPath == "" {
		return nil
	}
	bc, err := bareConfig(f.configPath, f.bareWorkers, f.bareDuration)
	if err == nil && bc == nil {
		return nil
	}
	if err == nil {
		defer bc.DB.Close()
		bc.Work = work
		fmt.Fprintf(os.Stderr, "bench: bare open: %d workers, %d packets a transaction, for %v\n", f.bareWorkers, bench.BarePackets, f.bareDuration)
		var rep *bench.BareReport
		if rep, err = bench.RunBare(ctx, *bc); err == nil {
			return rep
		}
	}
	fmt.Fprintf(os.Stderr, "bench: bare open: %v\n", err)
	return nil
}
