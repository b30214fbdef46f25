package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/internal/retry"
	"redcell/model"
)

// WorkloadRewards: the festival reward wallet. Rewards of one cash scene
// (by default rain of demo-festival), each to a person of a pool of Users
// act_ids, with a fresh rain ID and an amount drawn in 1..AmountMax cents,
// issued closed-loop (Concurrency workers) or open-loop at Rate issues/s.
// It runs once per booking mode (RewardsConfig.Modes): token issuance, the
// answer pending and the cell's booker booking behind (async), against
// book_now, booked before the answer (sync). Async runs also measure the
// booking lag of a sample of rewards, each issued to a person of its own
// and polled until booked. Last, the no-op route against the issued-so-far
// read, closed-loop, one after the other. It runs through RunRewards, not
// Run: its measures are issues and lags, not opens and credits.
const WorkloadRewards = "rewards"

// Booking modes of the rewards workload.
const (
	BookingAsync = "async" // token issuance: answered pending, booked behind (the booker)
	BookingSync  = "sync"  // book_now: booked before the answer
)

// Limits of a rewards run, besides its Duration.
const (
	// issuesMax bounds the issues one run schedules.
	issuesMax = 50_000_000
	// lagSamplesMax bounds the rewards whose booking a run polls.
	lagSamplesMax = 1000
	// lagWaitMax bounds LagWait.
	lagWaitMax = 5 * time.Minute
	// lagPollInterval is how often the pending samples are asked about: the
	// resolution of the seen lag while at most lagPollsPerTick are pending.
	lagPollInterval = 200 * time.Millisecond
	// lagPollers bounds the concurrent polls.
	lagPollers = 8
	// lagPollsPerTick bounds the samples asked about at each tick (50 GETs
	// a second): with the booking off, hundreds of pending samples polled
	// every 200 ms would be a read load of their own on the cells the run
	// measures. The samples asked longest ago go first.
	lagPollsPerTick = 10
	// readsMax bounds the requests of one read measurement.
	readsMax = 10_000_000
	// readsDurationMax bounds each read measurement.
	readsDurationMax = 10 * time.Minute
	// rewardsPause separates two runs, so that one's tail does not share
	// the machine with the next one's start.
	rewardsPause = time.Second
)

// RewardsConfig describes one invocation of the rewards workload. Start from
// DefaultRewardsConfig; RunRewards calls Validate.
type RewardsConfig struct {
	RouterURL string
	// Work, when set, measures what each run cost per new reward (Work).
	Work *WorkSources
	// APIKey is the calling app's key (scope reward and read); ClusterSecret
	// signs every request, which the router needs of stress traffic (the
	// rewards go to the shadow tables, as all bench traffic).
	APIKey, ClusterSecret string
	// Real sends real traffic (Config.Real): real rewards in the real
	// tables, under the router's per-person limit.
	Real          bool
	Parent, Scene string // a cash scene; its rule must allow 1..AmountMax
	AmountMax     int64  // amounts are drawn in 1..AmountMax cents
	Users         int    // the pool of act_ids, 1..usersMax
	// Concurrency is the closed-loop workers, or the open-loop in-flight
	// bound (an issue due beyond it is dropped: CLIENT_DROPPED); also the
	// read measurement's workers. 1..openersMax.
	Concurrency int
	Rate        int           // open-loop issues/s, 0..rateMax; 0 closed-loop
	Duration    time.Duration // of each run's load, (0, 1h]
	Modes       []string      // BookingAsync, BookingSync: one run each, in this order
	AllowShed   bool          // OVERLOADED, TIMEOUT, the RATE_LIMITED codes and drops do not fail a run
	// LagSamples is how many rewards of an async run have their booking
	// polled (0..lagSamplesMax), spread over the load: the first issue of
	// each Duration/LagSamples slice goes to a person of its own. LagWait
	// bounds the wait for them after the load.
	LagSamples int
	LagWait    time.Duration
	// ReadsDuration is how long each side of the read comparison runs (no-op,
	// then issued so far); 0 skips it.
	ReadsDuration time.Duration
	Seed          uint64 // amounts; 0: from the clock
	RunID         string // prefixes act_ids; "" one from the start time
	Progress      io.Writer
	// Baseline, when set, is a second cluster (say, the build before a
	// change) each mode's run also runs against, interleaved (this cluster
	// first, then the baseline; the next mode the other way round), with the
	// same amounts; its Name, RouterURL, ClusterSecret, APIKey and Work are
	// used. The suite's VsBaseline pairs the runs.
	Baseline *Cluster
}

// DefaultRewardsConfig is the demo activity make run loads, closed-loop, one
// async run of 10 s, with the lag and the reads measured.
func DefaultRewardsConfig() RewardsConfig {
	return RewardsConfig{
		RouterURL:     "http://127.0.0.1:8080",
		Parent:        "demo-festival", // deploy/local/activities.yaml
		Scene:         "rain",          // cash, 1..888 cents
		AmountMax:     888,
		Users:         100_000,          // a person gets about one reward per run
		Concurrency:   32,               // enough to keep two cells busy on two cores
		Duration:      10 * time.Second, // as the other workloads
		Modes:         []string{BookingAsync},
		LagSamples:    200,              // a p99 from 200 samples is their second highest
		LagWait:       30 * time.Second, // far above the booker's 100 ms tick at its rate
		ReadsDuration: 3 * time.Second,  // two short closed-loop runs
	}
}

// Validate checks every field.
func (c RewardsConfig) Validate() error {
	base := Config{RouterURL: c.RouterURL}
	if err := base.validateRouter(); err != nil {
		return err
	}
	switch {
	case c.ClusterSecret == "":
		return errors.New("bench: rewards: its stress traffic must be signed: give the cluster secret")
	case c.Parent == "" || c.Scene == "":
		return errors.New("bench: rewards: name the parent activity and the cash scene")
	case c.AmountMax < 1:
		return fmt.Errorf("bench: rewards: AmountMax must be >= 1, got %d", c.AmountMax)
	case c.Users < 1 || c.Users > usersMax:
		return fmt.Errorf("bench: rewards: Users must be 1..%d, got %d", usersMax, c.Users)
	case c.Concurrency < 1 || c.Concurrency > openersMax:
		return fmt.Errorf("bench: rewards: Concurrency must be 1..%d, got %d", openersMax, c.Concurrency)
	case c.Rate < 0 || c.Rate > rateMax:
		return fmt.Errorf("bench: rewards: Rate must be 0..%d issues/s, got %d", rateMax, c.Rate)
	case c.Duration <= 0 || c.Duration > durationMax:
		return fmt.Errorf("bench: rewards: Duration must be in (0, %v], got %v", durationMax, c.Duration)
	case c.LagSamples < 0 || c.LagSamples > lagSamplesMax || c.LagWait < 0 || c.LagWait > lagWaitMax:
		return fmt.Errorf("bench: rewards: LagSamples must be 0..%d and LagWait 0..%v", lagSamplesMax, lagWaitMax)
	case c.ReadsDuration < 0 || c.ReadsDuration > readsDurationMax:
		return fmt.Errorf("bench: rewards: ReadsDuration must be 0..%v", readsDurationMax)
	case len(c.Modes) < 1 || len(c.Modes) > 2:
		return fmt.Errorf("bench: rewards: one or two booking modes (%s, %s), got %q", BookingAsync, BookingSync, c.Modes)
	}
	seen := map[string]bool{}
	for _, m := range c.Modes {
		if m != BookingAsync && m != BookingSync || seen[m] {
			return fmt.Errorf("bench: rewards: modes must be distinct, of %s and %s: %q", BookingAsync, BookingSync, c.Modes)
		}
		seen[m] = true
	}
	if b := c.Baseline; b != nil {
		if err := b.validateTarget(); err != nil {
			return fmt.Errorf("bench: rewards: %w", err)
		}
	}
	if c.RunID != "" {
		return validateRunID(c.RunID)
	}
	return nil
}

// RewardsSuite is what one invocation of the rewards workload measured.
type RewardsSuite struct {
	StartedAt  time.Time    `json:"started_at"`
	FinishedAt time.Time    `json:"finished_at"`
	Workload   string       `json:"workload"`
	Parent     string       `json:"parent_activity_id"`
	Scene      string       `json:"scene_id"`
	Real       bool         `json:"real,omitempty"` // real traffic (RewardsConfig.Real), not stress
	Runs       []RewardsRun `json:"runs"`
	// AsyncOverSync is the async run's issues/s over the sync run's (both
	// ran; else 0): what token issuance buys over booking in the request.
	AsyncOverSync float64      `json:"async_over_sync,omitempty"`
	Reads         *ReadsReport `json:"reads,omitempty"`
	// VsBaseline pairs each mode's run with its run on the baseline cluster
	// (RewardsConfig.Baseline): issues/s and work per reward.
	VsBaseline []OpsVsBaseline `json:"vs_baseline,omitempty"`
	// Bare is the bare open run after the runs (the floor; bare.go).
	Bare   *BareReport    `json:"bare,omitempty"`
	Config map[string]any `json:"config,omitempty"`
}

// RewardsRun is one booking mode's run.
type RewardsRun struct {
	RunID       string `json:"run_id"`
	Cluster     string `json:"cluster,omitempty"` // the baseline's Name for its runs; "" this cluster's
	Booking     string `json:"booking"`           // BookingAsync or BookingSync
	Mode        string `json:"mode"`              // closed or open
	Rate        int    `json:"rate_per_sec"`
	Concurrency int    `json:"concurrency"`
	DurationMS  int64  `json:"duration_ms"`
	ElapsedMS   int64  `json:"elapsed_ms"` // the load as measured; rates are over it
	AllowShed   bool   `json:"allow_shed"`
	// Issue counts every issue request (retries too) and its latency, from
	// the scheduled time in open-loop mode.
	Issue        OpStats `json:"issue"`
	IssuesPerSec float64 `json:"issues_per_sec"` // new rewards (not repeats) per second of ElapsedMS
	IssuedCents  int64   `json:"issued_cents"`
	// Due and Started, open-loop: the arrivals that fell due during the load
	// and those the client started.
	Due     int64       `json:"due,omitempty"`
	Started int64       `json:"started,omitempty"`
	Lag     *BookingLag `json:"booking_lag,omitempty"` // async runs with LagSamples
	// Work is what the run cost per new reward, its booking included
	// (RewardsConfig.Work).
	Work *Work `json:"work,omitempty"`
}

// BookingLag is how long the sampled rewards of an async run took from
// issue to booked, in ms.
type BookingLag struct {
	Sampled int `json:"sampled"` // samples issued (pending)
	Booked  int `json:"booked"`  // of them, seen booked within the wait
	// Seen is the time the poll first saw a sample booked minus its
	// created_ms: what a client observes, Booked plus up to one poll
	// interval (PollIntervalMS) and a request.
	Seen LatencyMS `json:"seen_ms"`
	// Server is booked_ms − created_ms, both the cell's clock: the booker's
	// own lag, without the poll.
	Server         LatencyMS `json:"server_ms"`
	PollIntervalMS int64     `json:"poll_interval_ms"`
	// MaxAskGapMS is the longest time a sample waited between two asks
	// (or from its issue to its first ask) before it was seen booked: the
	// seen lag's real resolution when more samples were pending than one
	// poll asks about.
	MaxAskGapMS int64 `json:"max_ask_gap_ms"`
	// WaitedMS is how long after the load the last sample was seen booked
	// (or the wait gave up).
	WaitedMS int64 `json:"waited_ms"`
}

// ReadsReport compares the no-op route with the issued-so-far read (GET
// /v1/activities/{parent}/issued, answered from in-process counters),
// closed-loop with the same workers, one after the other.
type ReadsReport struct {
	Concurrency  int     `json:"concurrency"`
	DurationMS   int64   `json:"duration_ms"`
	Noop         OpStats `json:"noop"`
	Issued       OpStats `json:"issued"`
	NoopPerSec   float64 `json:"noop_per_sec"`
	IssuedPerSec float64 `json:"issued_per_sec"`
	Ratio        float64 `json:"issued_over_noop"` // 1: the read costs no more than the HTTP path
}

// RunRewards runs cfg: one run per booking mode, then the reads. Failed
// requests are counted, never returned; see RewardsSuite.Problems. It
// returns an error for an invalid cfg, and ctx.Err() with what was
// measured when ctx ends first.
func RunRewards(ctx context.Context, cfg RewardsConfig) (RewardsSuite, error) {
	if err := cfg.Validate(); err != nil {
		return RewardsSuite{}, err
	}
	s := RewardsSuite{StartedAt: time.Now(), Workload: WorkloadRewards, Parent: cfg.Parent, Scene: cfg.Scene}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(s.StartedAt.UnixNano())
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID(s.StartedAt)
	}
	c := newClient(cfg.RouterURL, cfg.Concurrency+lagPollers, cfg.APIKey, cfg.ClusterSecret)
	c.real, s.Real = cfg.Real, cfg.Real
	defer c.hc.CloseIdleConnections()
	type target struct {
		c       *client
		cluster string
		work    *WorkSources
	}
	targets := []target{{c, "", cfg.Work}}
	if b := cfg.Baseline; b != nil {
		bc := newClient(b.RouterURL, cfg.Concurrency+lagPollers, b.APIKey, b.ClusterSecret)
		bc.real = cfg.Real
		defer bc.hc.CloseIdleConnections()
		targets = append(targets, target{bc, b.Name, b.Work})
	}
	n := 0
	for i, mode := range cfg.Modes {
		order := slices.Clone(targets)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			if n > 0 && !sleepCtx(ctx, rewardsPause) {
				break
			}
			run := cfg
			run.RunID, run.Work = suiteRunID(cfg.RunID, n), t.work
			r := runRewardsMode(ctx, t.c, run, mode)
			r.Cluster = t.cluster
			s.Runs = append(s.Runs, r)
			n++
		}
	}
	var async, sync *RewardsRun
	for i, r := range s.Runs {
		if r.Cluster != "" {
			continue
		}
		if r.Booking == BookingSync {
			sync = &s.Runs[i]
		} else {
			async = &s.Runs[i]
		}
	}
	if async != nil && sync != nil {
		s.AsyncOverSync = ratio(async.IssuesPerSec, sync.IssuesPerSec)
	}
	s.VsBaseline = pairWithBaseline(s.Runs, func(r RewardsRun) (string, string) { return r.Cluster, r.Booking },
		func(r, b RewardsRun) OpsVsBaseline {
			return newOpsVsBaseline(r.Booking, r.IssuesPerSec, b.IssuesPerSec, r.Issue.LatencyMS.P99, b.Issue.LatencyMS.P99, r.Work, b.Work)
		})
	if ctx.Err() == nil && cfg.ReadsDuration > 0 {
		r := measureReads(ctx, c, cfg)
		s.Reads = &r
	}
	s.FinishedAt = time.Now()
	return s, ctx.Err()
}

// rewardsRun is the state of one mode's run, shared by its goroutines.
type rewardsRun struct {
	c       *client
	cfg     RewardsConfig
	bookNow bool
	rec     *opRecorder
	loadAt  time.Time
	next    atomic.Int64 // the next issue number (closed-loop)
	issued  atomic.Int64 // cents of new rewards
	started atomic.Int64
	lag     *lagSampler // nil: no samples (sync, or LagSamples 0)
}

// runRewardsMode runs one booking mode's load and, async, its lag wait.
func runRewardsMode(ctx context.Context, c *client, cfg RewardsConfig, mode string) RewardsRun {
	r := &rewardsRun{c: c, cfg: cfg, bookNow: mode == BookingSync, rec: newOpRecorder()}
	out := RewardsRun{RunID: cfg.RunID, Booking: mode, Mode: modeClosed, Rate: cfg.Rate, Concurrency: cfg.Concurrency,
		DurationMS: cfg.Duration.Milliseconds(), AllowShed: cfg.AllowShed}
	if cfg.Rate > 0 {
		out.Mode = modeOpen
	}
	var work0 workSnap
	if cfg.Work != nil {
		work0 = cfg.Work.begin(ctx)
	}
	r.loadAt = time.Now()
	if !r.bookNow && cfg.LagSamples > 0 {
		r.lag = newLagSampler(c, cfg, r.loadAt)
	}
	load, cancel := context.WithTimeout(ctx, cfg.Duration)
	stopPolls := r.lag.poll(ctx)
	stopProgress := startProgress(cfg.Progress, WorkloadRewards+"/"+mode, r.loadAt, cfg.Duration, func() progressSnapshot {
		return progressSnapshot{noun: "issues", opens: r.rec.okCount(), errors: r.rec.errorCount()}
	})
	if cfg.Rate > 0 {
		out.Due = r.openLoop(ctx, load)
		out.Started = r.started.Load()
	} else {
		r.closedLoop(ctx, load)
	}
	cancel()
	end := time.Now()
	stopProgress()
	out.ElapsedMS = end.Sub(r.loadAt).Milliseconds()
	out.Issue, out.IssuedCents = r.rec.stats(), r.issued.Load()
	if s := end.Sub(r.loadAt).Seconds(); s > 0 {
		out.IssuesPerSec = float64(out.Issue.OK-out.Issue.Repeats) / s
	}
	if r.lag != nil {
		lag := r.lag.wait(ctx, stopPolls, end)
		out.Lag = &lag
	}
	if cfg.Work != nil && ctx.Err() == nil {
		out.Work = cfg.Work.end(ctx, work0, out.Issue.OK-out.Issue.Repeats, "reward")
	}
	return out
}

// closedLoop: Concurrency workers issue back to back until load ends.
func (r *rewardsRun) closedLoop(ctx, load context.Context) {
	closedLoopN(load, r.cfg.Concurrency, issuesMax, &r.next, func(k int64) { r.issue(ctx, time.Time{}, k) })
}

// openLoop starts issue k at its scheduled time at Rate per second until
// load ends, Concurrency in flight at most, and returns how many fell due.
func (r *rewardsRun) openLoop(ctx, load context.Context) (due int64) {
	due, started := openLoopN(load, r.cfg.Concurrency, r.cfg.Rate, issuesMax, func(at time.Time, k int64) { r.issue(ctx, at, k) },
		r.rec.recordDropped)
	r.started.Add(started)
	return due
}

// issue sends issue number k (scheduled at due; zero: now), retrying a
// retryable failure: the order number makes a retry a repeat at worst.
func (r *rewardsRun) issue(ctx context.Context, due time.Time, k int64) {
	act := r.cfg.RunID + "-u" + strconv.FormatInt(k%int64(r.cfg.Users), 10)
	slot := r.lag.take(time.Now())
	if slot >= 0 {
		act = r.cfg.RunID + "-l" + strconv.Itoa(slot) // a person of its own: its one reward is the sample
	}
	req := api.RewardRequest{ParentActivityID: r.cfg.Parent, SceneID: r.cfg.Scene, RainID: "r" + strconv.FormatInt(k, 10),
		ActID: act, AwardType: "cash", Amount: r.amount(k), BookNow: r.bookNow}
	var out api.RewardResponse
	var res result
	start := due
	_ = retry.Do(ctx, retry.Policy{Attempts: attemptsMax, Backoff: retryBackoff, Retryable: isRetryable}, func(int) error {
		out = api.RewardResponse{}
		res = r.c.callFrom(start, http.MethodPost, api.RewardsPath, req, &out)
		start = time.Time{}
		if res.code == "" {
			if breach := r.breach(req, out); breach != "" {
				res.code, res.message = codeBadResponse, breach
			}
		}
		r.rec.record(res, res.code == "" && out.Repeat)
		if res.code != "" {
			return failed{res}
		}
		return nil
	})
	if res.code != "" {
		return
	}
	if !out.Repeat {
		r.issued.Add(out.Amount)
	}
	if slot >= 0 {
		r.lag.add(act, out)
	}
}

// breach checks an answer against its request: "" when it keeps the
// contract.
func (r *rewardsRun) breach(req api.RewardRequest, out api.RewardResponse) string {
	prefix := req.ActID + "_" + req.SceneID + "_" + req.RainID + "_cash_"
	status := map[string]bool{"pending": !r.bookNow, "processing": !r.bookNow, "booked": r.bookNow || out.Repeat}
	if !strings.HasPrefix(out.OrderNo, prefix) || out.Amount != req.Amount || out.AwardType != "cash" || !status[out.Status] || out.Token == "" {
		return fmt.Sprintf("reward answer %+v does not match the request %+v (book_now %v)", out, req, r.bookNow)
	}
	return ""
}

// amount is issue k's amount, 1..AmountMax cents, drawn from the seed (a
// splitmix64 step, so each k has its own without shared state).
func (r *rewardsRun) amount(k int64) int64 {
	z := r.cfg.Seed + uint64(k)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return 1 + int64(z%uint64(r.cfg.AmountMax))
}

// OK reports whether every run passed: see Problems.
func (s RewardsSuite) OK() bool { return len(s.Problems()) == 0 }

// Problems lists why the suite failed: a run with an unexpected error code
// (the shed codes are expected with AllowShed; nothing else is), with no
// reward issued, or with samples not seen booked within the wait; a read
// measurement with errors or no answer.
func (s RewardsSuite) Problems() []string {
	var ps []string
	for _, r := range s.Runs {
		name := r.Booking
		if r.Cluster != "" {
			name = r.Cluster + "/" + name
		}
		for _, code := range sortedCodes(r.Issue.Errors) {
			if !(r.AllowShed && shedCode(code)) {
				ps = append(ps, fmt.Sprintf("%s: %d unexpected %s", name, r.Issue.Errors[code], code))
			}
		}
		if r.Issue.OK == 0 {
			ps = append(ps, name+": no reward was issued")
		}
		if l := r.Lag; l != nil && l.Booked < l.Sampled {
			ps = append(ps, fmt.Sprintf("%s: %d of %d sampled rewards not seen booked within %v", name, l.Sampled-l.Booked, l.Sampled,
				time.Duration(l.WaitedMS)*time.Millisecond))
		}
	}
	if r := s.Reads; r != nil {
		for name, st := range map[string]OpStats{"noop": r.Noop, "issued": r.Issued} {
			if st.OK == 0 || len(st.Errors) > 0 {
				ps = append(ps, fmt.Sprintf("reads: %s: %d of %d failed", name, st.Count-st.OK, st.Count))
			}
		}
	}
	slices.Sort(ps)
	return ps
}

// shedCode: an answer that says the cluster (or the client) shed load.
func shedCode(code string) bool {
	return code == model.ErrOverloaded.Code || code == model.ErrTimeout.Code || code == model.ErrRateLimited.Code ||
		code == model.ErrCellRateLimited.Code || code == model.ErrUserRateLimited.Code || code == model.ErrSceneRateLimited.Code ||
		code == codeClientTimeout || code == codeDropped
}

// WriteText prints the suite for a person.
func (s RewardsSuite) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("redcell bench: rewards of %s/%s%s\n", s.Parent, s.Scene, realNote(s.Real))
	for _, r := range s.Runs {
		how := loopText(r.Mode, r.Rate, r.Concurrency, r.Started, r.Due)
		name := r.Booking
		if r.Cluster != "" {
			name = r.Cluster + "/" + name
		}
		ew.printf("  %-5s run %s: %s, %v\n", name, r.RunID, how, time.Duration(r.ElapsedMS)*time.Millisecond)
		ew.printf("        issues/s %.0f  issued %d (%d cents)  repeats %d  p50 %.1f ms  p99 %.1f ms  p99.9 %.1f ms\n",
			r.IssuesPerSec, r.Issue.OK-r.Issue.Repeats, r.IssuedCents, r.Issue.Repeats, r.Issue.LatencyMS.P50, r.Issue.LatencyMS.P99, r.Issue.LatencyMS.P999)
		if len(r.Issue.Errors) > 0 {
			ew.printf("        errors %s\n", codeList(r.Issue.Errors))
		}
		if l := r.Lag; l != nil {
			ew.printf("        booking lag of %d sampled (%d booked): seen p50 %.0f ms p99 %.0f ms max %.0f ms (poll every %d ms, at most %d samples a poll, longest gap between asks %d ms); booked_ms p50 %.0f ms p99 %.0f ms max %.0f ms\n",
				l.Sampled, l.Booked, l.Seen.P50, l.Seen.P99, l.Seen.Max, l.PollIntervalMS, lagPollsPerTick, l.MaxAskGapMS, l.Server.P50, l.Server.P99, l.Server.Max)
		}
		r.Work.writeLine(ew, "        ")
	}
	if s.AsyncOverSync > 0 {
		ew.printf("  token issuance (async) / book_now (sync): %.2fx issues/s\n", s.AsyncOverSync)
	}
	for _, v := range s.VsBaseline {
		v.writeLine(ew, "  ", "issues/s", "reward")
	}
	if r := s.Reads; r != nil {
		ew.printf("  reads, closed-loop, %d workers, %v each: no-op %.0f/s (p99 %.1f ms), issued so far %.0f/s (p99 %.1f ms): issued/no-op %.2f\n",
			r.Concurrency, time.Duration(r.DurationMS)*time.Millisecond, r.NoopPerSec, r.Noop.LatencyMS.P99, r.IssuedPerSec, r.Issued.LatencyMS.P99, r.Ratio)
	}
	if s.Bare != nil {
		var works []namedWork
		for _, r := range s.Runs {
			works = appendOwnWork(works, r.Cluster, r.Booking, r.Work)
		}
		s.Bare.writeFloor(ew, "  ", works)
	}
	ew.verdict(s.Problems())
	return ew.err
}
