package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/model"
)

// Run modes, as Report.Mode says.
const (
	modeClosed = "closed" // Openers workers, each sends when its last request ended
	modeOpen   = "open"   // requests start on schedule at Rate, MaxInFlight at most
)

// Limits of the hot, festival and cold engine.
const (
	// uncertainMax bounds the opens whose outcome is unknown (a timeout, a lost
	// connection) that a run asks about again after the load; beyond it they are
	// only counted (Report.UnresolvedOpens).
	uncertainMax = 10_000
	// queueMax bounds the opens a festival or cold run holds before they are due
	// (about Rate × the open window in open-loop mode).
	queueMax = 1_000_000
	// lagMax: closed-loop senders pause while the openers are further behind
	// than this, so the queue of due opens stays short.
	lagMax = 100 * time.Millisecond
)

// loadRun is the state of one hot, festival or cold run, shared by its
// goroutines. Each open is by an act_id whose claims the run tracks only for
// a sample of accounts; the audit covers the rest.
type loadRun struct {
	requester
	cfg   Config
	seed  uint64
	cells int
	start time.Time // Run was called

	senders []*senderAccount
	hot     *packetState      // hot: the one packet
	rr      []*packetState    // hot: the one packet; roundrobin: the packets opened in turn
	queue   *taskQueue        // festival, cold: opens not yet due
	endLoad func()            // ends the load phase early (hot: sold out)
	loadAt  time.Time         // start of the load phase
	soldOut atomic.Int64      // hot: ms into the load when SOLD_OUT was first answered, 0: never
	next    atomic.Int64      // hot: next act number; festival, cold: next packet number
	book    claimBook         // claims of the sampled accounts
	unsure  uncertainOpenList // opens to ask about again

	depositedCents atomic.Int64
	sentCents      atomic.Int64
	claimedCents   atomic.Int64
	overClaims     atomic.Int64 // claims that took their packet above its amount or count
	resolved       atomic.Int64
	started, due   atomic.Int64 // open-loop: what the schedule started and what fell due (Report.Started, Due)

	// Festival opens again, split by the packet's group size, so a report shows
	// what queueing on the hot packets does to the cold ones' latency.
	openHot, openCold *opRecorder
}

// hotGroupMin is the group size from which a festival packet counts as hot.
const hotGroupMin = 200

// senderAccount is one sender of a hot, festival or cold run. Safe for
// concurrent use.
type senderAccount struct {
	act string
	i   int

	deposits   atomic.Int64 // deposits made so far
	depositing atomic.Bool  // a deposit is in flight; others do not start one
}

// runLoad runs a hot, festival or cold workload: a setup phase (deposits; hot:
// the packet), the load phase of cfg.Duration, then the checks. See Run.
func runLoad(ctx context.Context, cfg Config) (Report, error) {
	start := time.Now()
	if cfg.RunID == "" {
		cfg.RunID = newRunID(start)
	}
	conns := cfg.Openers + cfg.Senders + balanceReaders
	if cfg.Rate > 0 {
		conns = 2*cfg.inFlight() + balanceReaders // opens and sends each up to the bound
	}
	c, cells, err := connect(cfg, conns)
	if err != nil {
		return Report{}, err
	}
	defer c.hc.CloseIdleConnections()
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(start.UnixNano())
	}
	r := &loadRun{cfg: cfg, seed: seed, cells: cells, start: start, book: claimBook{byAct: map[string]int64{}},
		openHot: newOpRecorder(), openCold: newOpRecorder()}
	r.requester = newRequester(c, start) // the timeline restarts with the load, below

	if cfg.Work != nil {
		cfg.Work.measureIdle(ctx) // before the setup's requests
	}
	ready := r.setup(ctx)
	var work0 workSnap
	if cfg.Work != nil {
		work0 = cfg.Work.begin(ctx)
	}
	r.loadAt = time.Now()
	r.rec[opOpen].tl = newTimeline(r.loadAt)
	if ready {
		r.load(ctx)
	}
	end := time.Now()
	rep := r.report(end)
	if err := interrupted(ctx, cfg, &rep); err != nil {
		return rep, err
	}
	if cfg.Work != nil {
		rep.Work = cfg.Work.end(ctx, work0, rep.Open.OK-rep.Open.Repeats, "open")
	}
	r.resolveUncertain(ctx)
	rep.ClaimedCents, rep.ResolvedOpens = r.claimedCents.Load(), r.resolved.Load()
	rep.OverClaimedPackets = r.overClaims.Load()
	acts, want := r.book.snapshot()
	rep.BalanceSample = len(acts)
	sctx := ctx
	if cfg.SettleTimeout > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, cfg.SettleTimeout)
		defer cancel()
	}
	settle(sctx, cfg.Audit, func() (balanceCheck, error) { return r.c.checkAccounts(acts, want) }, r.claimedCents.Load() == 0, &rep)
	return rep, nil
}

// setup deposits for every sender and, for hot, sends the packet. It reports
// whether the load can start.
func (r *loadRun) setup(ctx context.Context) bool {
	n := r.cfg.Senders
	if r.cfg.Workload == WorkloadHot {
		n = 1
	}
	r.senders = make([]*senderAccount, n)
	var ok atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // deposits at once
	for i := range r.senders {
		s := &senderAccount{act: fmt.Sprintf("%s-s%d", r.cfg.RunID, i), i: i}
		r.senders[i] = s
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if r.redeposit(ctx, s, 0) {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() == 0 || ctx.Err() != nil {
		return false
	}
	switch r.cfg.Workload {
	case WorkloadHot:
		p, res := r.send(ctx, time.Time{}, r.senders[0], 1, r.cfg.PacketAmount, r.cfg.PacketCount)
		r.hot, r.rr = p, []*packetState{p}
		return res.code == ""
	case WorkloadRoundRobin:
		return r.sendRoundRobin(ctx)
	}
	return true
}

// sendRoundRobin sends a roundrobin run's packets before its load, 64 at a
// time, sender by sender in turn. The load opens the packets that were sent:
// a send shed on a busy machine (counted in the report's sends) leaves the
// run one packet fewer, not unmade. It reports whether any was sent.
func (r *loadRun) sendRoundRobin(ctx context.Context) bool {
	pkts := make([]*packetState, r.cfg.Packets)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range pkts {
		s := r.senders[i%len(r.senders)]
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if p, res := r.send(ctx, time.Time{}, s, int64(i+1), r.cfg.PacketAmount, r.cfg.PacketCount); res.code == "" {
				pkts[i] = p
			}
		})
	}
	wg.Wait()
	for _, p := range pkts {
		if p != nil {
			r.rr = append(r.rr, p)
		}
	}
	return len(r.rr) > 0 && ctx.Err() == nil
}

// rrPackets is how many packets a roundrobin run opened in turn: those its
// setup sent (0 for the other workloads).
func (r *loadRun) rrPackets() int {
	if r.cfg.Workload != WorkloadRoundRobin {
		return 0
	}
	return len(r.rr)
}

// redeposit makes sender s's next deposit if s has made exactly seen so far
// and no deposit of s is in flight (so that of many sends finding the balance
// spent, one deposits), and fewer than depositsMax. It reports whether the
// deposit was made or made unnecessary by another.
func (r *loadRun) redeposit(ctx context.Context, s *senderAccount, seen int64) bool {
	if s.deposits.Load() != seen || !s.depositing.CompareAndSwap(false, true) {
		return true // another goroutine deposited, or is depositing
	}
	defer s.depositing.Store(false)
	if s.deposits.Load() != seen {
		return true
	}
	if seen >= depositsMax {
		return false
	}
	amount := r.cfg.depositCents()
	if r.cfg.Workload == WorkloadFestival {
		amount = int64(model.DefaultLimits().MaxAmount) // packets of up to 1500 shares of 1 CNY
	}
	orderNo := fmt.Sprintf("%s-dep-%d-%d", r.cfg.RunID, s.i, seen+1)
	var out model.Deposit
	res := r.do(ctx, time.Time{}, opDeposit, http.MethodPost, api.DepositPath(s.act),
		api.DepositRequest{Amount: amount, OrderNo: orderNo}, &out,
		func() (bool, string) {
			if out.ActID != s.act || int64(out.Amount) != amount || out.Balance < out.Amount {
				return out.Repeat, fmt.Sprintf("deposit answer %+v does not match %s %d", out, s.act, amount)
			}
			return out.Repeat, ""
		})
	if res.code != "" {
		return false
	}
	s.deposits.Add(1)
	r.depositedCents.Add(amount)
	return true
}

// send sends packet number n of sender s; start is when it was scheduled (zero:
// now). It returns the packet when res.code is "".
func (r *loadRun) send(ctx context.Context, start time.Time, s *senderAccount, n, amount, count int64) (*packetState, result) {
	seen := s.deposits.Load()
	var out api.SendResponse
	res := r.do(ctx, start, opSend, http.MethodPost, api.SendPath,
		sendRequest(s.act, fmt.Sprintf("%s-snd-%d-%d", r.cfg.RunID, s.i, n), amount, count), &out,
		func() (bool, string) {
			if _, err := model.ParsePacketID(out.PacketID); err != nil {
				return out.Repeat, "send answer: " + err.Error()
			}
			if out.Sender != s.act || out.Amount != amount || out.Count != count {
				return out.Repeat, fmt.Sprintf("send answer %+v does not match the request", out)
			}
			return out.Repeat, ""
		})
	switch res.code {
	case "":
		r.sentCents.Add(amount)
		return &packetState{id: out.PacketID, amount: amount, count: count}, res
	case model.ErrInsufficientBalance.Code:
		r.redeposit(ctx, s, seen) // the next send of s finds the money
	}
	return nil, res
}

// open makes one open task; start is when it was scheduled (zero: now).
func (r *loadRun) open(ctx context.Context, start time.Time, t openTask) {
	p := t.pkt
	var out api.OpenResponse
	res := r.do(ctx, start, opOpen, http.MethodPost, api.OpenPath(p.id), api.ActRequest{ActID: t.act}, &out,
		func() (bool, string) {
			if out.PacketID != p.id || out.ActID != t.act || out.Amount < 1 || out.Amount > p.amount ||
				out.Seq < 1 || out.Seq > p.count {
				return out.Repeat, fmt.Sprintf("open answer %+v breaks the contract for %s by %s", out, p.id, t.act)
			}
			return out.Repeat, ""
		})
	if r.cfg.Workload == WorkloadFestival {
		rec := r.openCold
		if p.hot {
			rec = r.openHot
		}
		rec.record(res, out.Repeat)
	}
	switch res.code {
	case "":
		r.claim(t, out.Amount)
	case model.ErrSoldOut.Code:
		if p == r.hot && r.soldOut.CompareAndSwap(0, max(1, time.Since(r.loadAt).Milliseconds())) {
			r.endLoad() // every later open would only hear SOLD_OUT
		}
	case model.ErrExpired.Code, model.ErrNotFound.Code:
	default:
		// The open may have committed before its answer was lost: ask again
		// after the load (open is idempotent).
		r.unsure.add(t)
	}
}

// claim counts one claim of t and checks its packet's amount and count.
func (r *loadRun) claim(t openTask, cents int64) {
	r.claimedCents.Add(cents)
	if t.sampled {
		r.book.add(t.act, cents)
	}
	if t.pkt.claimedCents.Add(cents) > t.pkt.amount || t.pkt.claims.Add(1) > t.pkt.count {
		r.overClaims.Add(1)
	}
}

// resolveUncertain asks again (balanceReaders at a time) for every open whose
// outcome was unknown and counts the claims that did commit.
func (r *loadRun) resolveUncertain(ctx context.Context) {
	r.unsure.mu.Lock()
	tasks := r.unsure.tasks
	r.unsure.tasks = nil
	r.unsure.mu.Unlock()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(balanceReaders, len(tasks)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(tasks) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				t := tasks[i]
				var out api.OpenResponse
				res := r.c.call(http.MethodPost, api.OpenPath(t.pkt.id), api.ActRequest{ActID: t.act}, &out)
				if res.code == "" && out.ActID == t.act && out.PacketID == t.pkt.id {
					r.claim(t, out.Amount)
					r.resolved.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// load runs the load phase: until cfg.Duration passes, ctx ends or (hot) the
// packet sells out.
func (r *loadRun) load(ctx context.Context) {
	load, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()
	r.endLoad = cancel
	stop := startProgress(r.cfg.Progress, r.progressLabel(), r.loadAt, r.cfg.Duration, r.progress)
	defer stop()
	switch {
	case (r.cfg.Workload == WorkloadHot || r.cfg.Workload == WorkloadRoundRobin) && r.cfg.Rate > 0:
		r.hotOpenLoop(ctx, load)
	case r.cfg.Workload == WorkloadHot || r.cfg.Workload == WorkloadRoundRobin:
		r.hotClosedLoop(ctx, load)
	case r.cfg.Rate > 0:
		r.queue = newTaskQueue(queueMax)
		r.groupOpenLoop(ctx, load)
	default:
		r.queue = newTaskQueue(queueMax)
		r.groupClosedLoop(ctx, load)
	}
}

func (r *loadRun) progressLabel() string {
	if r.cfg.Label != "" {
		return r.cfg.Label
	}
	return r.cfg.Workload
}

// progress is what the progress line shows.
func (r *loadRun) progress() progressSnapshot {
	var errs int64
	for _, rec := range r.rec {
		errs += rec.errorCount()
	}
	s := progressSnapshot{opens: r.rec[opOpen].okCount(), errors: errs}
	if r.cfg.Workload != WorkloadHot && r.cfg.Workload != WorkloadRoundRobin {
		s.extra = fmt.Sprintf("sends %d", r.rec[opSend].okCount())
	}
	return s
}

// report builds the report of the run so far; end is when the load phase ended.
func (r *loadRun) report(end time.Time) Report {
	elapsed := end.Sub(r.loadAt)
	rep := Report{
		RunID:          r.cfg.RunID,
		Label:          r.cfg.Label,
		Workload:       r.cfg.Workload,
		Mode:           modeClosed,
		Direct:         r.cfg.Direct,
		Real:           r.cfg.Real,
		Cells:          r.cells,
		AllowShed:      r.cfg.AllowShed,
		RouterURL:      r.cfg.RouterURL,
		Senders:        len(r.senders),
		Openers:        r.cfg.Openers,
		Users:          r.cfg.Users,
		DurationMS:     r.cfg.Duration.Milliseconds(),
		PacketAmount:   r.cfg.PacketAmount,
		PacketCount:    r.cfg.PacketCount,
		Packets:        r.rrPackets(),
		SetupMS:        r.loadAt.Sub(r.start).Milliseconds(),
		ElapsedMS:      elapsed.Milliseconds(),
		Deposit:        r.rec[opDeposit].stats(),
		Send:           r.rec[opSend].stats(),
		Grab:           r.rec[opGrab].stats(),
		Open:           r.rec[opOpen].stats(),
		OpenHot:        r.classStats(r.openHot),
		OpenCold:       r.classStats(r.openCold),
		DepositedCents: r.depositedCents.Load(),
		SentCents:      r.sentCents.Load(),
		ClaimedCents:   r.claimedCents.Load(),
		SoldOutAtMS:    r.soldOut.Load(),
		Timeline:       r.rec[opOpen].tl.finish(end),
	}
	if r.cfg.Rate > 0 {
		rep.Mode, rep.Rate, rep.MaxInFlight = modeOpen, r.cfg.Rate, r.cfg.inFlight()
		rep.Started, rep.Due = r.started.Load(), r.due.Load()
	}
	if r.hot != nil {
		rep.HotPacketID = r.hot.id
	}
	if r.queue != nil {
		rep.OpensPending = int64(r.queue.len())
	}
	r.unsure.mu.Lock()
	rep.UnresolvedOpens = r.unsure.over
	r.unsure.mu.Unlock()
	if s := elapsed.Seconds(); s > 0 {
		rep.OpensPerSec = float64(rep.Open.OK) / s
		rep.SendsPerSec = float64(rep.Send.OK) / s
	}
	return rep
}

// classStats reports a festival class recorder, nil for other workloads.
func (r *loadRun) classStats(rec *opRecorder) *OpStats {
	if r.cfg.Workload != WorkloadFestival {
		return nil
	}
	st := rec.stats()
	return &st
}
