package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"redcell/bench"
)

// workloadLimits is the --workload value that measures the ceilings only.
const workloadLimits = "limits"

// benchFlags are the command line of redcell bench.
type benchFlags struct {
	fs                  *flag.FlagSet
	workload            string
	router              string
	senders, openers    int
	rate, maxInFlight   int
	users               int
	packets             int
	duration            time.Duration
	amount, count       int64
	configPath          string
	jsonPath, outDir    string
	allowShed, direct   bool
	compare             string
	compareDirect       bool
	limits              bool
	limitsDuration      time.Duration
	limitsConcurrency   int
	set                 map[string]bool // flags given on the command line
	clusterSecret       string          // signs every request (the stress mark, direct calls): cluster_secret of --config, else REDCELL_CLUSTER_SECRET
	apiKeyFile          string          // --api-key-file
	apiKey              string          // the key the router requires: --api-key-file, else REDCELL_API_KEY, else api-key beside --config
	baselinePath        string          // --baseline: the config of a second cluster to compare with
	baselineName        string
	external            string // --external: a load command the bench meters (bench.RunExternal)
	externalOp          string
	externalRounds      int
	externalTimeout     time.Duration
	cpuProfile          string // --cpuprofile: the bench's own CPU profile
	wrk                 string // --wrk: "", "auto" or wrk's path (bench.FindWrk)
	routerPprof         string // --router-pprof: the router's pprof address
	defaultLimitsConfig bench.LimitsConfig
	search              bench.SearchConfig // --search-*
	searchOn            bool               // --search
	searchOnly          bool               // --search-only
	sustain             bench.SustainConfig
	lagSamples          int           // rewards: --lag-samples
	readsDuration       time.Duration // rewards: --reads-duration
	mergeBacklog        int           // coupons: --merge-backlog
	hotShare            float64       // coupons: --hot-share
	cleanup             bool          // --cleanup: drop the shadow databases after the runs (bench_cleanup.go)
	cleanupOnly         bool          // --cleanup with no flag but --config: only that, no load
	prepareShadow       bool          // --prepare-shadow: the shadow space's tables before the first run (bench_shadow.go)
	work                bool          // --work: measure each run's work per open (bench_work.go)
	idleWindow          time.Duration // --idle-window: how long the idle rate is measured
	real                bool          // --real: real traffic, not stress (bench.Config.Real)
	bare                bool          // --bare: the bare open after the runs (bench/bare.go)
	bareDuration        time.Duration // --bare-duration
	bareWorkers         int           // --bare-workers
}

func parseBenchFlags(args []string) (*benchFlags, error) {
	def := bench.DefaultConfig()
	lim := bench.DefaultLimitsConfig(def.RouterURL)
	f := &benchFlags{fs: flag.NewFlagSet("bench", flag.ContinueOnError), defaultLimitsConfig: lim}
	f.defineLoadFlags(def)
	f.defineMeasureFlags(lim)
	f.defineWorkloadFlags()
	f.defineSearchFlags()
	fs := f.fs
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errUsage // the flag set printed its usage; nothing more to say
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.set["concurrency"] {
		f.set["openers"] = true
	}
	if f.cleanup {
		if err := f.checkCleanup(); err != nil {
			return nil, err
		}
		if f.cleanupOnly {
			return f, nil // alone, the cleanup needs no API key or cluster secret
		}
	}
	if err := f.checkCombinations(); err != nil {
		return nil, err
	}
	if err := f.readSecrets(); err != nil {
		return nil, err
	}
	return f, nil
}

// defineLoadFlags registers the flags that shape the load itself: the
// workload, where it goes, how many accounts, how long and how large.
func (f *benchFlags) defineLoadFlags(def bench.Config) {
	fs := f.fs
	fs.StringVar(&f.workload, "workload", bench.WorkloadSmoke, "smoke | hot | festival | cold | roundrobin | rewards (the reward wallet: issues, booking lag) | coupons (the coupon drop: accepts, issue latency, merged deduction) | limits (the ceilings only)")
	fs.StringVar(&f.router, "router", def.RouterURL, "base URL of the router (default: router.listen of --config, else this)")
	fs.IntVar(&f.senders, "senders", def.Senders, "accounts that send packets (hot: always 1; default per workload)")
	fs.IntVar(&f.openers, "openers", def.Openers, "closed-loop: concurrent openers (default per workload); open-loop: the default of --max-inflight")
	fs.IntVar(&f.openers, "concurrency", def.Openers, "same as --openers")
	fs.IntVar(&f.rate, "rate", 0, "open-loop: target opens per second, started on schedule (hot, festival, cold); coupons: requests per second of one open-loop run, no ceiling; 0: closed-loop")
	fs.IntVar(&f.maxInFlight, "max-inflight", 0, "open-loop: most opens in flight, beyond it due opens are dropped (CLIENT_DROPPED); 0: --openers")
	fs.IntVar(&f.users, "users", 0, "festival, cold: accounts that open packets (default 100000)")
	fs.IntVar(&f.packets, "packets", 0, "roundrobin: packets sent before the load and opened in turn (default 2000)")
	fs.DurationVar(&f.duration, "duration", def.Duration, "how long the load runs, per run")
	fs.Int64Var(&f.amount, "amount", def.PacketAmount, "cents per packet (smoke, hot, cold; hot default 10000000)")
	fs.Int64Var(&f.count, "count", def.PacketCount, "shares per packet (smoke, hot, cold; hot default 10000000, cold 2)")
}

// defineMeasureFlags registers the flags of what a run measures and reports
// beside the load: the cluster config, the reports, the work per open, the
// ceilings, a baseline cluster, an external load command and profiles.
func (f *benchFlags) defineMeasureFlags(lim bench.LimitsConfig) {
	fs := f.fs
	fs.StringVar(&f.configPath, "config", "", "cluster config file: audit the shadow tables after every run; needed by --compare and the database limit; its cluster_secret signs direct requests")
	fs.BoolVar(&f.prepareShadow, "prepare-shadow", true, "with --config: first create, in every cell's shadow space, the shard tables and today's and tomorrow's day tables of the shards it owns, "+
		"which the cells' warm-up makes for the real space only (else the first runs make them and the second run pays; a few seconds when they exist; not while databases move)")
	fs.StringVar(&f.jsonPath, "json", "", "also write the JSON report to this file (a single run's report, or the suite's)")
	fs.StringVar(&f.outDir, "out", "", "write report.md, report.json and chart.svg here (default var/bench/<time>/ unless a plain smoke run)")
	fs.BoolVar(&f.work, "work", true, "with --config: measure what each run costs per fresh open, from its load's start until the servers are quiet again, "+
		"the idle rate taken off: SQL statements (each database server's Queries, and by kind), the cells' round trips to their databases, memcached commands, "+
		"and CPU µs by process (MariaDB when it runs on this machine, the cells, the router, memcached, the bench)")
	fs.BoolVar(&f.bare, "bare", true, "with --config and --work, an open workload: after the runs, run the bare open (the floor: per transaction one locking read, one claim INSERT and one "+
		"packet upsert for 16 packets on one table, no HTTP, no cell) on the first cell's database server, measured the same way, and report every run's statements and MariaDB µs per open over it")
	fs.DurationVar(&f.bareDuration, "bare-duration", 5*time.Second, "--bare: how long the bare opens run")
	fs.IntVar(&f.bareWorkers, "bare-workers", 4, "--bare: concurrent bare transactions, each on its own 16 packets")
	fs.DurationVar(&f.idleWindow, "idle-window", 5*time.Second, "--work: how long each cluster's idle rate is measured before its first run (0: none, nothing taken off)")
	fs.BoolVar(&f.allowShed, "allow-shed", false, "count OVERLOADED, TIMEOUT, DB_UNAVAILABLE and the other shedding answers, client timeouts and open-loop drops as load shedding (reported) instead of failing the run (make bench sets it)")
	fs.BoolVar(&f.real, "real", false, "send real traffic, not stress traffic: real money in the cells' real tables (the bench's own accounts, left there), "+
		"under the router's per-person limit (user_rate_limit: give enough --senders that each sends at most its burst), audited in the real space; "+
		"the path production requests take; the coupons workload takes its batches' real stock. A test cluster only; through the router only")
	fs.BoolVar(&f.direct, "direct", false, "send the workload straight to the owning cells instead of through the router (signed: needs the cluster secret of --config or REDCELL_CLUSTER_SECRET)")
	fs.StringVar(&f.compare, "compare", "", "comma-separated strategies (naive, serial, batched, grouped; e.g. naive,batched,grouped): one run per strategy, switching the cells first (needs --config); "+
		"rewards: booking modes async,sync (token issuance, booked behind, against book_now)")
	fs.BoolVar(&f.compareDirect, "compare-direct", false, "run each workload run through the router and then direct, and report router/direct")
	fs.BoolVar(&f.limits, "limits", false, "also measure the ceilings: the database's batched hot-open rate and the HTTP no-op rate via the router and direct")
	fs.DurationVar(&f.limitsDuration, "limits-duration", lim.HTTPDuration, "how long each limit measurement runs")
	fs.IntVar(&f.limitsConcurrency, "limits-concurrency", lim.Concurrency, "concurrent no-op requests")
	fs.StringVar(&f.baselinePath, "baseline", "", "config file of a second cluster (an older build, say) to run every run against too, interleaved, and compare with (its API key: the file api-key beside it)")
	fs.StringVar(&f.baselineName, "baseline-name", "baseline", "how reports name the --baseline cluster's runs")
	fs.StringVar(&f.external, "external", "", "a load command (sh -c; wrk with a script of deploy/local/wrk, say) to meter instead of the bench's own load: "+
		"it gets REDCELL_ROUTER_URL, REDCELL_API_KEY, REDCELL_CLUSTER and REDCELL_ROUND, and prints \"REDCELL_FRESH <n>\", its fresh operations; "+
		"the report gives the work per operation (needs --config; with --baseline, on both clusters, interleaved)")
	fs.StringVar(&f.externalOp, "external-op", "open", "--external: what its fresh operations are (open, reward, coupon request), for the report")
	fs.DurationVar(&f.externalTimeout, "external-timeout", 10*time.Minute, "--external: each run of the command is stopped after this (with what it started)")
	fs.IntVar(&f.externalRounds, "external-rounds", 1, "--external: runs of the command per cluster (1..10; with --baseline round 2 runs the baseline first)")
	fs.StringVar(&f.wrk, "wrk", "", "with the limits: also send the router no-op with wrk (auto: wrk on PATH, skipped when missing; or its path) and report bench ÷ wrk")
	fs.StringVar(&f.routerPprof, "router-pprof", "", "profile the router's CPU during each run through it and during the limits' router no-op, from its pprof address (make run with REDCELL_PPROF=1: 127.0.0.1:6060), and report its top functions and CPU per request")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write the bench's own CPU profile (go tool pprof) to this file: is the client the bottleneck?")
	fs.StringVar(&f.apiKeyFile, "api-key-file", "", "file holding the API key the router requires (default: REDCELL_API_KEY, else the file api-key beside --config, which make run writes)")
}

// defineWorkloadFlags registers the flags of the rewards and coupons
// workloads only.
func (f *benchFlags) defineWorkloadFlags() {
	fs := f.fs
	rd := bench.DefaultRewardsConfig()
	fs.IntVar(&f.lagSamples, "lag-samples", rd.LagSamples, "rewards: async rewards whose issue-to-booked lag is polled (0..1000)")
	fs.DurationVar(&f.readsDuration, "reads-duration", rd.ReadsDuration, "rewards: each side of the no-op vs issued-so-far read comparison; 0 skips it")
	cd := bench.DefaultCouponsConfig()
	fs.IntVar(&f.mergeBacklog, "merge-backlog", cd.MergeBacklog, "coupons: requests of a hot batch each side of the merged-vs-single comparison accepts while issuing is held; 0 skips it (needs --config)")
	fs.Float64Var(&f.hotShare, "hot-share", cd.HotShare, "coupons: the share of requests for the hot batches")
}

// defineSearchFlags registers the flags of the sustained-rate search, the
// --sustain-at run and --cleanup.
func (f *benchFlags) defineSearchFlags() {
	fs := f.fs
	f.search, f.sustain = bench.DefaultSearchConfig(), bench.DefaultSustainConfig("")
	fs.BoolVar(&f.searchOn, "search", false, "after the runs, find each strategy's highest sustained open-loop rate (hot, festival, cold): p99 within --search-p99, nothing shed, the schedule offered")
	fs.BoolVar(&f.searchOnly, "search-only", false, "the search (and --sustain-at) without the fixed runs; implies --search")
	fs.DurationVar(&f.search.P99Bound, "search-p99", f.search.P99Bound, "search: the highest open p99 a sustained rate may have")
	fs.DurationVar(&f.search.Step, "search-step", f.search.Step, "search: the load phase of one step")
	fs.DurationVar(&f.search.Budget, "search-time", f.search.Budget, "search: the whole search, every strategy together (each gets an equal share)")
	fs.DurationVar(&f.search.Confirm, "search-confirm", f.search.Confirm, "search: run the highest passing rate again this long to confirm it, a tenth lower each time it fails (at most 4 runs, outside --search-time); 0: no confirmation (default: 12s, or 3 × --search-step when that is longer than 4s)")
	fs.IntVar(&f.search.StartRate, "search-start", f.search.StartRate, "search: the first step's rate, opens/s (the ramp doubles it)")
	fs.StringVar(&f.sustain.Strategy, "sustain-at", "", "after the search, run open-loop at --sustain-fraction of this strategy's sustained rate, audited (one of --compare; implies --search)")
	fs.Float64Var(&f.sustain.Fraction, "sustain-fraction", f.sustain.Fraction, "the fraction of the sustained rate --sustain-at runs at")
	fs.DurationVar(&f.sustain.Duration, "sustain-duration", 0, "the load phase of the --sustain-at run (default --duration)")
	fs.DurationVar(&f.sustain.LagBound, "lag-bound", f.sustain.LagBound, "the credit-lag p99 the --sustain-at run should stay within")
	fs.BoolVar(&f.cleanup, "cleanup", false, "drop the stress traffic's shadow databases on every cell of --config once the runs passed (POST /admin/shadow/cleanup; a failed run keeps them); with no other flag but --config, only that, no load")
}

// checkCombinations settles the flags that imply others and refuses the
// workloads and combinations the bench does not run. It runs after the
// parse, so f.set is filled.
func (f *benchFlags) checkCombinations() error {
	f.searchOn = f.searchOn || f.searchOnly || f.sustain.Strategy != ""
	if !f.set["search-confirm"] && f.search.Step > bench.DefaultSearchConfig().Step {
		f.search.Confirm = min(3*f.search.Step, 2*time.Minute) // a longer step than the default's: confirm in proportion
	}
	if f.sustain.Strategy != "" && f.compare == "" {
		return errors.New("bench: --sustain-at names a strategy of --compare (--compare batched --sustain-at batched for one)")
	}
	if f.workload != workloadLimits && f.workload != bench.WorkloadRewards && f.workload != bench.WorkloadCoupons && !slices.Contains(bench.Workloads, f.workload) {
		return fmt.Errorf("bench: unknown --workload %q (%s, %s, %s, %s)", f.workload, strings.Join(bench.Workloads, ", "), bench.WorkloadRewards,
			bench.WorkloadCoupons, workloadLimits)
	}
	if f.real && (f.direct || f.compareDirect || f.limits || f.workload == workloadLimits) {
		return errors.New("bench: --real runs a workload through the router: not with --direct, --compare-direct, --limits or --workload limits")
	}
	return nil
}

// readSecrets finds the cluster secret (cluster_secret of --config, which
// also gives the router's address unless --router was given; else
// REDCELL_CLUSTER_SECRET) and the API key (readAPIKey). Without a cluster secret
// the bench cannot mark its requests as stress traffic: an error.
func (f *benchFlags) readSecrets() error {
	f.clusterSecret = os.Getenv("REDCELL_CLUSTER_SECRET")
	if f.configPath != "" {
		fc, err := loadConfig(f.configPath) // the environment wins over the file, as everywhere
		if err != nil {
			return err
		}
		f.clusterSecret = fc.ClusterSecret
		// deploy/local/run.sh moves ports that are taken: the config knows where
		// the router listens.
		if fc.Router.Listen != "" && !f.set["router"] {
			f.router = "http://" + fc.Router.Listen
		}
	}
	if err := f.readAPIKey(); err != nil {
		return err
	}
	if f.clusterSecret == "" {
		return errors.New("bench: its requests are marked as stress traffic, which the router and the cells take only signed with the cluster secret: give --config or REDCELL_CLUSTER_SECRET")
	}
	return nil
}

// readAPIKey finds the API key the router requires: --api-key-file, else
// REDCELL_API_KEY, else the file api-key beside --config (make run writes
// var/api-key beside var/redcell.yaml). A direct run needs none.
func (f *benchFlags) readAPIKey() error {
	path := f.apiKeyFile
	if path == "" {
		if f.apiKey = os.Getenv("REDCELL_API_KEY"); f.apiKey != "" {
			return nil
		}
		if f.configPath != "" {
			if p := filepath.Join(filepath.Dir(f.configPath), "api-key"); fileExists(p) {
				path = p
			}
		}
	}
	if path == "" {
		if f.direct && !f.compareDirect && !f.limits && f.workload != workloadLimits {
			return nil
		}
		return errors.New("bench: the router needs an API key: give --api-key-file (make run writes var/api-key) or REDCELL_API_KEY")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: API key: %w", err)
	}
	f.apiKey = strings.TrimSpace(string(b))
	return nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// given sets *dst to v when the flag name was given on the command line, so
// that a flag left out keeps the workload's default in *dst.
func given[T any](f *benchFlags, name string, dst *T, v T) {
	if f.set[name] {
		*dst = v
	}
}
