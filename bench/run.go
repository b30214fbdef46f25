package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/model"
)

// Timing of the phases around the load. Variables, not constants, so tests can
// shorten them.
var (
	// settleTimeout bounds the wait after the load for the cells' relays to
	// deliver every credit (the audit's InFlight reaching 0).
	settleTimeout = 15 * time.Second
	// auditTimeout bounds one audit (it reads every row of every cell).
	auditTimeout = 2 * time.Minute
	// settleInterval is the pause between two audits while settling.
	settleInterval = 500 * time.Millisecond
	// idleWait is how long a sender waits when enough packets are live, and an
	// opener when it has nothing left to open.
	idleWait = 2 * time.Millisecond
	// progressInterval is how often the progress line is rewritten.
	progressInterval = time.Second
)

// attemptsMax bounds the tries of one idempotent request (deposit, send, open
// all carry their idempotency key) when the failure is retryable. Retrying
// resolves an answer lost in flight: the repeat answer tells what happened.
const attemptsMax = 3

// retryBackoff is the wait before the second attempt of a request; the
// third waits twice as long.
const retryBackoff = 20 * time.Millisecond

// balanceReaders bounds the concurrent balance reads while settling.
const balanceReaders = 16

// run is the state of one smoke Run, shared by its goroutines.
type run struct {
	requester
	cfg  Config
	ring *recent
	seed uint64 // seeds each opener's rand, with the opener's index
	// cells is how many cells the router listed (0: unknown).
	cells int

	// liveTarget is how many unretired packets senders keep in the ring, so that
	// they send about as fast as openers drain instead of piling up packets
	// nobody opens. Sends per second are therefore paced by opens.
	liveTarget int

	depositedCents atomic.Int64
	sentCents      atomic.Int64
	claimedCents   atomic.Int64
	resolved       atomic.Int64 // uncertain opens that turned out to have committed
	// claimedBy[j] is what opener j claimed, in cents. Each opener writes only its
	// own entry; it is read after every opener has returned.
	claimedBy []int64
	// uncertain[j] lists packets whose open by opener j ended without an answer
	// that says whether it committed (a timeout, a lost connection): settle asks
	// again, which returns the claim if there is one (open is idempotent).
	uncertain [][]string
}

// Run drives the cluster behind cfg.RouterURL for cfg.Duration with
// cfg.Workload and returns the report. After the load it waits (about 15 s at
// most) for credits to be delivered, reading the claimants' balances (smoke:
// every opener; the others: a sample) and calling cfg.Audit when set.
//
// Smoke: each sender deposits once and sends packets until the time is up or
// its balance runs out; each opener opens packets it has not opened before.
// Hot, festival and cold: see workload.go and load.go.
//
// Run returns an error when cfg is invalid or, in direct mode, the cells cannot
// be found; and ctx.Err() with the partial report (no audit) when ctx ends
// first. Failed requests never make it return an error: they are counted in
// the report; see Report.OK.
//
// With cfg.RouterPprof (and not direct), the router's CPU is profiled for
// about cfg.Duration from the start, and Report.RouterProfile has the summary.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.RouterPprof == "" || cfg.Direct {
		return runWorkload(ctx, cfg)
	}
	prof := profileDuring(ctx, cfg.RouterPprof, cfg.Duration)
	rep, err := runWorkload(ctx, cfg)
	p := <-prof
	p.perRequest(rep.requestsPerSec())
	rep.RouterProfile = &p
	return rep, err
}

// runWorkload is Run without the router's profile.
func runWorkload(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Workload != "" && cfg.Workload != WorkloadSmoke {
		return runLoad(ctx, cfg)
	}
	start := time.Now()
	if cfg.RunID == "" {
		cfg.RunID = newRunID(start)
	}
	c, cells, err := connect(cfg, cfg.Senders+cfg.Openers+balanceReaders)
	if err != nil {
		return Report{}, err
	}
	defer c.hc.CloseIdleConnections()
	r := newRun(cfg, c, start)
	r.cells = cells

	loadCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	stopProgress := startProgress(cfg.Progress, cfg.Label, start, cfg.Duration, r.progress)
	var wg sync.WaitGroup
	for i := range cfg.Senders {
		wg.Go(func() { r.sender(ctx, loadCtx, i) })
	}
	for j := range cfg.Openers {
		wg.Go(func() { r.opener(ctx, loadCtx, j) })
	}
	wg.Wait()
	cancel()
	end := time.Now()
	elapsed := end.Sub(start)
	stopProgress()

	rep := r.report(elapsed)
	rep.Timeline = r.rec[opOpen].tl.finish(end)
	if err := interrupted(ctx, cfg, &rep); err != nil {
		return rep, err
	}
	r.resolveUncertain(ctx)
	rep.ClaimedCents, rep.ResolvedOpens = r.claimedCents.Load(), r.resolved.Load()
	r.settle(ctx, &rep)
	return rep, nil
}

func newRun(cfg Config, c *client, start time.Time) *run {
	return &run{
		requester:  newRequester(c, start),
		cfg:        cfg,
		ring:       newRecent(recentSize, min(int64(cfg.Openers), cfg.PacketCount)),
		seed:       uint64(start.UnixNano()),
		liveTarget: min(max(2*cfg.Openers, 8), recentSize/2),
		claimedBy:  make([]int64, cfg.Openers),
		uncertain:  make([][]string, cfg.Openers),
	}
}

// connect returns the client of a run sized for conns concurrent requests and
// how many cells the router lists (0 if it could not say). In direct mode the
// client sends to the cells themselves, and a router that cannot list them, or
// a shard no cell owns, is an error.
func connect(cfg Config, conns int) (*client, int, error) {
	c := newClient(cfg.RouterURL, conns, cfg.APIKey, cfg.ClusterSecret)
	c.real = cfg.Real
	cells, uncovered, err := discoverCells(c)
	if !cfg.Direct {
		return c, len(cells), nil // the count is informational; err only loses it
	}
	if err != nil {
		return nil, 0, err
	}
	if uncovered > 0 {
		return nil, 0, fmt.Errorf("bench: direct mode: the router sees %d shards without a live cell", uncovered)
	}
	if c.cells, err = newCellTable(cells); err != nil {
		return nil, 0, err
	}
	c.apiKey = "" // the key is the router's business; cells trust the signature
	return c, len(cells), nil
}

// Workers get two contexts: load ends when the load phase does and stops their
// loops; ctx is Run's and bounds the retries of a request already started, so
// that an answer lost at the end of the load is still resolved by its repeat
// (otherwise the claim is in the cluster but not in the report).

// sender i deposits once, then sends packets until load ends or its balance
// runs out, publishing each new packet into the ring.
func (r *run) sender(ctx, load context.Context, i int) {
	act := fmt.Sprintf("%s-s%d", r.cfg.RunID, i)
	if !r.deposit(ctx, act, fmt.Sprintf("%s-dep-%d", r.cfg.RunID, i)) {
		return
	}
	for n := 1; load.Err() == nil; n++ {
		for r.ring.liveCount() >= r.liveTarget {
			if !sleepCtx(load, idleWait) {
				return
			}
		}
		id, res := r.send(ctx, act, fmt.Sprintf("%s-snd-%d-%d", r.cfg.RunID, i, n))
		switch res.code {
		case "":
			r.ring.add(id)
		case model.ErrInsufficientBalance.Code:
			return // spent the deposit: the run has sent enough
		default:
			// Recorded; back off a little so a failing cluster is not hammered.
			if !sleepCtx(load, idleWait) {
				return
			}
		}
	}
}

func (r *run) deposit(ctx context.Context, act, orderNo string) bool {
	amount := r.cfg.depositCents()
	var out model.Deposit
	res := r.do(ctx, time.Time{}, opDeposit, http.MethodPost, api.DepositPath(act),
		api.DepositRequest{Amount: amount, OrderNo: orderNo}, &out,
		func() (bool, string) {
			if out.ActID != act || int64(out.Amount) != amount || out.Balance < out.Amount {
				return out.Repeat, fmt.Sprintf("deposit answer %+v does not match %s %d", out, act, amount)
			}
			return out.Repeat, ""
		})
	if res.code != "" {
		return false
	}
	r.depositedCents.Add(amount)
	return true
}

// send sends one packet and returns its ID when res.code is "".
func (r *run) send(ctx context.Context, act, orderNo string) (string, result) {
	var out api.SendResponse
	res := r.do(ctx, time.Time{}, opSend, http.MethodPost, api.SendPath,
		sendRequest(act, orderNo, r.cfg.PacketAmount, r.cfg.PacketCount), &out,
		func() (bool, string) {
			if _, err := model.ParsePacketID(out.PacketID); err != nil {
				return out.Repeat, "send answer: " + err.Error()
			}
			if out.Sender != act || out.Amount != r.cfg.PacketAmount || out.Count != r.cfg.PacketCount {
				return out.Repeat, fmt.Sprintf("send answer %+v does not match the request", out)
			}
			return out.Repeat, ""
		})
	if res.code != "" {
		return "", res
	}
	r.sentCents.Add(out.Amount)
	return out.PacketID, res
}

// opener j opens packets from the ring, each at most once, until load ends.
// About half the time it asks grab first and skips packets grab says are gone.
func (r *run) opener(ctx, load context.Context, j int) {
	act := fmt.Sprintf("%s-o%d", r.cfg.RunID, j)
	rnd := rand.New(rand.NewPCG(r.seed, uint64(j)))
	opened := map[uint64]struct{}{} // sequence numbers in the ring this opener tried
	for load.Err() == nil {
		seq, id, ok := r.ring.pick(rnd, opened)
		if !ok {
			if !sleepCtx(load, idleWait) {
				return
			}
			continue
		}
		opened[seq] = struct{}{}
		if len(opened) > 2*recentSize {
			r.ring.prune(opened)
		}
		if rnd.IntN(2) == 0 && !r.grab(ctx, act, id) {
			r.ring.retire(seq)
			continue
		}
		r.openOne(ctx, j, act, seq, id)
	}
}

// grab asks whether packet id may still have a share. It returns false only
// when the answer says the packet is gone; a failed grab is no reason to skip
// the open, since grab is just a hint.
func (r *run) grab(ctx context.Context, act, id string) bool {
	var out api.GrabResponse
	res := r.do(ctx, time.Time{}, opGrab, http.MethodPost, api.GrabPath(id), api.ActRequest{ActID: act}, &out,
		func() (bool, string) {
			if out.PacketID != id || out.Remaining < 0 || out.Remaining > r.cfg.PacketCount {
				return false, fmt.Sprintf("grab answer %+v does not match packet %s", out, id)
			}
			return false, ""
		})
	switch res.code {
	case "":
		return out.Available
	case model.ErrSoldOut.Code, model.ErrExpired.Code, model.ErrNotFound.Code:
		return false
	}
	return true
}

// openOne opens packet id (ring sequence seq) as opener j and counts the claim.
func (r *run) openOne(ctx context.Context, j int, act string, seq uint64, id string) {
	var out api.OpenResponse
	res := r.do(ctx, time.Time{}, opOpen, http.MethodPost, api.OpenPath(id), api.ActRequest{ActID: act}, &out,
		func() (bool, string) {
			if out.PacketID != id || out.ActID != act || out.Amount < 1 || out.Amount > r.cfg.PacketAmount ||
				out.Seq < 1 || out.Seq > r.cfg.PacketCount {
				return out.Repeat, fmt.Sprintf("open answer %+v breaks the contract for %s by %s", out, id, act)
			}
			return out.Repeat, ""
		})
	switch res.code {
	case "":
		// A repeat here is the answer to a retry whose first try was lost: the
		// claim is this opener's, counted once because it opens id only once.
		r.claimedCents.Add(out.Amount)
		r.claimedBy[j] += out.Amount
		if out.Seq == r.cfg.PacketCount {
			r.ring.retire(seq) // took the last share (seq is the share's place, 1..count)
		} else {
			r.ring.attempted(seq)
		}
	case model.ErrSoldOut.Code, model.ErrExpired.Code, model.ErrNotFound.Code:
		r.ring.retire(seq)
	default:
		// Any other final answer may follow an earlier attempt that timed out
		// after committing: ask again after the load.
		r.uncertain[j] = append(r.uncertain[j], id)
		r.ring.attempted(seq)
	}
}

// resolveUncertain asks again for every open whose outcome was unknown and
// counts the claims that did commit, so claimed cents match the rows.
func (r *run) resolveUncertain(ctx context.Context) {
	for j, ids := range r.uncertain {
		act := fmt.Sprintf("%s-o%d", r.cfg.RunID, j)
		for _, id := range ids {
			var out api.OpenResponse
			if ctx.Err() != nil {
				return
			}
			if res := r.c.call(http.MethodPost, api.OpenPath(id), api.ActRequest{ActID: act}, &out); res.code == "" && out.ActID == act {
				r.claimedCents.Add(out.Amount)
				r.claimedBy[j] += out.Amount
				r.resolved.Add(1)
			}
		}
		r.uncertain[j] = nil
	}
}

// settle waits for this run's credits and the audit; see settle.
func (r *run) settle(ctx context.Context, rep *Report) {
	acts := make([]string, r.cfg.Openers)
	for j := range acts {
		acts[j] = fmt.Sprintf("%s-o%d", r.cfg.RunID, j)
	}
	rep.BalanceSample = len(acts)
	settle(ctx, r.cfg.Audit, func() (balanceCheck, error) { return r.c.checkAccounts(acts, r.claimedBy) },
		r.claimedCents.Load() == 0, rep)
}

func (r *run) report(elapsed time.Duration) Report {
	rep := Report{
		RunID:          r.cfg.RunID,
		Label:          r.cfg.Label,
		Workload:       WorkloadSmoke,
		Mode:           modeClosed,
		Direct:         r.cfg.Direct,
		Real:           r.cfg.Real,
		Cells:          r.cells,
		AllowShed:      r.cfg.AllowShed,
		RouterURL:      r.cfg.RouterURL,
		Senders:        r.cfg.Senders,
		Openers:        r.cfg.Openers,
		DurationMS:     r.cfg.Duration.Milliseconds(),
		PacketAmount:   r.cfg.PacketAmount,
		PacketCount:    r.cfg.PacketCount,
		ElapsedMS:      elapsed.Milliseconds(),
		Deposit:        r.rec[opDeposit].stats(),
		Send:           r.rec[opSend].stats(),
		Grab:           r.rec[opGrab].stats(),
		Open:           r.rec[opOpen].stats(),
		DepositedCents: r.depositedCents.Load(),
		SentCents:      r.sentCents.Load(),
		ClaimedCents:   r.claimedCents.Load(),
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.OpensPerSec = float64(rep.Open.OK) / s
		rep.SendsPerSec = float64(rep.Send.OK) / s
	}
	return rep
}

// progress is what the progress line shows of a smoke run.
func (r *run) progress() progressSnapshot {
	var errs int64
	for _, rec := range r.rec {
		errs += rec.errorCount()
	}
	return progressSnapshot{opens: r.rec[opOpen].okCount(), errors: errs,
		extra: fmt.Sprintf("sends %d  claimed %d cents", r.rec[opSend].okCount(), r.claimedCents.Load())}
}

// sleepCtx sleeps for d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// interrupted reports ctx's error when the run was cut short; the audit was
// then not run, and the report says so.
func interrupted(ctx context.Context, cfg Config, rep *Report) error {
	err := ctx.Err()
	if err != nil && cfg.Audit != nil {
		rep.AuditError = "not run: " + err.Error()
	}
	return err
}
