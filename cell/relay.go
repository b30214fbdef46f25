package cell

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/incident"
	"redcell/model"
)

// relay delivers claims to the claimants' wallets: at least once from the
// outbox, applied exactly once by the receiving side (the claim ID is the order
// number). Fresh claims come straight from the open workers; a periodic scan of
// the outbox picks up whatever that missed (a crash, a full or paused lane, a
// peer down, a locked row).
//
// Both hand credits to dispatch, which splits them by destination, the cell
// that owns the claimant's wallet, into lanes (lane.go): the local lane for
// this cell's own shards, which applies them in its store and never waits on
// the network, and one lane per other cell. Nothing that hands credits over
// ever blocks: what a lane cannot take stays in the outbox for the scan.
type relay struct {
	s      *Server
	sp     *space // the namespace whose outbox this relay drains
	log    *slog.Logger
	client *fasthttp.Client
	// send posts credits to the cell at addr and returns the claim IDs it
	// deferred (post; tests replace it).
	send func(ctx context.Context, addr string, cs []model.Credit) (deferred []string, err error)

	mu       sync.Mutex       // guards local, remote, stopping
	local    *lane            // nil until the first local credit, or after it retired
	remote   map[string]*lane // by cell name; at most lanesMax
	stopping bool             // the cell stops: no lane is made

	stop    chan struct{}      // closed when the cell stops: lanes flush and exit
	flushBy atomic.Int64       // Unix ns when the flush after stop ends (no attempt runs past it); 0 while serving
	life    context.Context    // parent of every delivery and mark; ends relayFlushMax after stop
	endLife context.CancelFunc // ends life
	lanesWG sync.WaitGroup     // lane goroutines

	failures  *incident.Set     // failed deliveries, per destination
	deferrals *incident.Set     // credits deferred again and again, per destination
	marking   *incident.Tracker // outbox marks that failed
	scanning  *incident.Tracker // outbox reads that failed
}

// The relay's limits. None is settable: docs/config.md lists them.
const (
	// relayBatchMax is the most credits one delivery carries: one transaction
	// at the receiver, one HTTP call for another cell.
	relayBatchMax = 500
	// relayLinger is how long a lane waits for a batch to fill; it adds at most
	// this much to the time a claimant waits for the credit.
	relayLinger = 20 * time.Millisecond
	// relayAttemptTimeout bounds one delivery to another cell, which gets it
	// as its deadline. A healthy delivery of a full batch takes well under a
	// second, but the receiver creates a shard's tables on their first use
	// (the shadow tables of a bench, say): seconds on a busy server, which a
	// 2 s bound turned into failed attempts and retries. A lane that waits on
	// a hung cell delays only that cell's credits.
	relayAttemptTimeout = 5 * time.Second
	// relayLocalTimeout bounds one delivery of the local lane: a transaction
	// on this cell's own database, which on a shard's first use creates its
	// tables first (seconds for a batch on a busy server without the warm-up).
	relayLocalTimeout = 5 * time.Second
	// relayDBTimeout bounds each outbox read (scan) and mark.
	relayDBTimeout = 2 * time.Second
	// relayBackoffMin and relayBackoffMax bound a lane's pause after a failed
	// delivery (doubling from the first to the second; a success ends it) and
	// a deferred credit's wait before it is tried again (doubling per deferral).
	relayBackoffMin = 100 * time.Millisecond
	relayBackoffMax = 5 * time.Second
	// laneDepthMax is the most credits one lane holds (queued, in flight or
	// waiting to be tried again): a few seconds of a busy lane's deliveries.
	laneDepthMax = 8192
	// lanesMax is the most lanes to other cells per space: above the 100 cells
	// a cluster can have (a cell owns at least one database of 100). Credits
	// for a cell beyond it wait in the outbox until a lane retires.
	lanesMax = 128
	// laneIdleStop: a lane that held nothing this long stops (the cell it
	// served may have left the map); the next credit for it starts it again.
	laneIdleStop = time.Minute
	// relayFlushMax bounds how long the lanes deliver what they hold when the
	// cell stops.
	relayFlushMax = 5 * time.Second
	// deferralsLong: a credit deferred this many times (about 11 s with the
	// backoff above) is logged: its wallet row has been locked for long.
	deferralsLong = 8
)

func newRelay(s *Server, sp *space) *relay {
	log := s.log.With("space", spaceName(sp))
	r := &relay{s: s, sp: sp, log: log, remote: map[string]*lane{}, stop: make(chan struct{}),
		client: &fasthttp.Client{
			Name: "redcell-relay", ReadTimeout: internalTimeout, WriteTimeout: internalTimeout, MaxConnsPerHost: 16,
		},
		failures:  incident.NewSet(log, "relay delivery", "dest", incident.DefaultEvery, lanesMax+1),
		deferrals: incident.NewSet(log, "relay credit deferred for long", "dest", incident.DefaultEvery, lanesMax+1),
		marking:   incident.New(log, "relay outbox marking", incident.DefaultEvery),
		scanning:  incident.New(log, "outbox scan", incident.DefaultEvery),
	}
	r.life, r.endLife = context.WithCancel(context.Background())
	r.send = r.post
	return r
}

// enqueue hands fresh claims from the open workers to their lanes without
// blocking; what the lanes cannot take, or everything while the relay is
// switched off, waits in the outbox for a later scan.
func (r *relay) enqueue(credits []model.Credit) {
	if r.s.isDegraded(switchRelay) {
		return
	}
	if left := r.dispatch(credits, time.Time{}); left > 0 {
		r.s.stats.relayDropped.Add(int64(left))
	}
}

// dispatch offers each credit to the lane of its destination and returns how
// many no lane took: its lane is full, backing off or stopping, no room is
// left for another lane, or no live cell owns the claimant's shard. Those stay
// in the outbox. scanStart is when the scan that read them began (zero for
// fresh claims; see lane.offer). It never blocks.
func (r *relay) dispatch(credits []model.Credit, scanStart time.Time) (left int) {
	m := r.s.peers.Map()
	local, remote := []model.Credit{}, map[string][]model.Credit{}
	for _, c := range credits {
		if r.s.Owns(c.Shard) {
			local = append(local, c)
			continue
		}
		owner, ok := m.Owner(c.Shard)
		if !ok {
			r.s.stats.relayErrors.Add(1) // no live owner now: the outbox keeps it
			left++
			continue
		}
		remote[owner.Name] = append(remote[owner.Name], c)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	offer := func(l *lane, cs []model.Credit) int {
		if l == nil {
			return len(cs)
		}
		return len(cs) - l.offer(cs, now, scanStart)
	}
	if len(local) > 0 {
		left += offer(r.laneLocked("", true), local)
	}
	for name, cs := range remote {
		left += offer(r.laneLocked(name, false), cs)
	}
	return left
}

// laneLocked returns the lane of a destination, starting it if needed; nil
// while the relay stops, or when lanesMax lanes to other cells run. r.mu must
// be held.
func (r *relay) laneLocked(name string, local bool) *lane {
	if r.stopping {
		return nil
	}
	if local {
		if r.local == nil {
			r.local = r.startLocked(newLane(r, r.s.cfg.Name, true))
		}
		return r.local
	}
	if l, ok := r.remote[name]; ok {
		return l
	}
	if len(r.remote) >= lanesMax {
		return nil
	}
	l := r.startLocked(newLane(r, name, false))
	r.remote[name] = l
	return l
}

// startLocked starts l's goroutine. r.mu must be held.
func (r *relay) startLocked(l *lane) *lane {
	r.lanesWG.Add(1)
	go l.run()
	return l
}

// retire removes l if it holds nothing, so that its goroutine may exit; a
// later credit for its destination starts a new lane.
func (r *relay) retire(l *lane) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) > 0 {
		return false
	}
	l.retired = true
	if l.local {
		r.local = nil
	} else {
		delete(r.remote, l.dest)
	}
	return true
}

// lanes returns the running lanes (the metrics).
func (r *relay) lanes() []*lane {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*lane, 0, len(r.remote)+1)
	if r.local != nil {
		out = append(out, r.local)
	}
	for _, l := range r.remote {
		out = append(out, l)
	}
	return out
}

// run scans the outbox every RelayInterval until ctx ends, then stops the
// lanes: each delivers what it holds, all within relayFlushMax; the outbox
// keeps the rest for the next start.
func (r *relay) run(ctx context.Context) {
	every(ctx, r.s.cfg.RelayInterval, func(int) {
		if !r.s.isDegraded(switchRelay) {
			r.scan(ctx)
		}
	})
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	r.flushBy.Store(time.Now().Add(relayFlushMax).UnixNano())
	close(r.stop)
	deadline := time.AfterFunc(relayFlushMax, r.endLife)
	r.lanesWG.Wait()
	deadline.Stop()
	r.endLife()
}

// scan hands the lanes the outbox rows older than two relay intervals, page
// by page by (created_ms, claim_id), so rows that cannot be delivered now
// (their cell is down) do not hide newer ones. A lane skips the credits it
// already holds; one that is full or backing off takes none, and they wait
// for a later scan.
func (r *relay) scan(ctx context.Context) {
	start := time.Now()
	for _, l := range r.lanes() {
		l.scanBegins(start)
	}
	before := r.s.now().Add(-2 * r.s.cfg.RelayInterval).UnixMilli()
	ok := true
	for _, db := range r.s.ownedDBs() {
		var after model.OutboxPos
		for page := 0; page < 10 && ctx.Err() == nil; page++ {
			pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
			credits, next, err := r.sp.store.PendingCredits(pctx, db, before, after.CreatedMS, after.ClaimID, relayBatchMax)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					ok = false
					r.s.stats.relayErrors.Add(1)
					r.scanning.Fail(err, "db", db)
				}
				break
			}
			r.dispatch(credits, start)
			if len(credits) < relayBatchMax {
				break
			}
			after = next
		}
	}
	if ok {
		r.scanning.OK()
	}
}

// deliver applies cs at l's destination within ctx and sorts them:
// delivered (applied now or before), deferred (a wallet row was locked); any
// other credit of cs is no longer l's to deliver (the shard map changed) and
// goes back to the outbox. An error means nothing is known to be applied.
func (r *relay) deliver(ctx context.Context, l *lane, cs []model.Credit) (delivered, deferred []model.Credit, err error) {
	if l.local {
		_, ids, err := r.sp.store.ApplyCredits(ctx, cs)
		if err != nil {
			return nil, nil, err
		}
		delivered, deferred = splitDeferred(cs, ids)
		return delivered, deferred, nil
	}
	m := r.s.peers.Map()
	var mine []model.Credit
	addr := ""
	for _, c := range cs {
		if owner, ok := m.Owner(c.Shard); ok && owner.Name == l.dest && !r.s.Owns(c.Shard) {
			mine, addr = append(mine, c), owner.Addr
		}
	}
	if len(mine) == 0 {
		return nil, nil, nil
	}
	ids, err := r.send(ctx, addr, mine)
	if err != nil {
		return nil, nil, err
	}
	delivered, deferred = splitDeferred(mine, ids)
	return delivered, deferred, nil
}

// splitDeferred splits cs into the credits whose claim IDs are not in ids and
// those that are. IDs that name no credit of cs are ignored.
func splitDeferred(cs []model.Credit, ids []string) (rest, deferred []model.Credit) {
	if len(ids) == 0 {
		return cs, nil
	}
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	for _, c := range cs {
		if in[c.ClaimID] {
			deferred = append(deferred, c)
		} else {
			rest = append(rest, c)
		}
	}
	return rest, deferred
}

// markDelivered marks delivered credits in the outbox within relayDBTimeout.
// Rows it cannot mark (locked by another transaction, or the database
// failing) stay pending: the scan delivers them again, which the receiver
// ignores.
func (r *relay) markDelivered(cs []model.Credit) {
	ctx, cancel := context.WithTimeout(r.life, relayDBTimeout)
	defer cancel()
	skipped, err := r.sp.store.MarkDelivered(ctx, cs)
	if err != nil {
		r.s.stats.relayErrors.Add(1)
		r.marking.Fail(err, "credits", len(cs))
		return
	}
	r.marking.OK()
	r.s.stats.relayed.Add(int64(len(cs) - skipped))
	r.s.stats.relayMarkSkipped.Add(int64(skipped))
}

// failed records a failed delivery of n credits by l.
func (r *relay) failed(l *lane, n int, err error) {
	r.s.stats.relayErrors.Add(1)
	r.failures.Of(l.dest).Fail(err, "credits", n, "local", l.local)
}

// succeeded records a delivery that l made.
func (r *relay) succeeded(l *lane) { r.failures.Of(l.dest).OK() }

// deferredCredits records that one delivery of l had n credits deferred;
// longest is the one deferred most often (nil: none), long how many credits l
// holds that were deferred deferralsLong times or more. Such a credit's wallet
// row has been locked for long: an incident of the lane, logged while one is
// held (incident.Tracker: when it starts, every 10 s, when it ends).
func (r *relay) deferredCredits(l *lane, n int, longest *queued, long int) {
	r.s.stats.relayDeferred.Add(int64(n))
	t := r.deferrals.Of(l.dest)
	switch {
	case longest != nil && longest.deferrals >= deferralsLong:
		t.Fail(errWalletLocked, "claim", longest.c.ClaimID, "act_id", longest.c.ActID, "deferrals", longest.deferrals, "credits_deferred_long", long)
	case long == 0:
		t.OK()
	}
}

var errWalletLocked = errors.New("a wallet row the credit needs is locked by another transaction")

// post sends one batch of credits to a cell's /internal/credits within ctx
// (its deadline goes to the receiver) and returns the claim IDs the receiver
// deferred.
func (r *relay) post(ctx context.Context, addr string, cs []model.Credit) ([]string, error) {
	body, err := json.Marshal(api.CreditsRequest{Credits: cs})
	if err != nil {
		return nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(relayAttemptTimeout)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/internal/credits")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	req.Header.Set(api.HeaderPartial, "1") // this relay reads the deferred list
	if r.sp.stress {
		req.Header.Set(api.HeaderStress, "1") // shadow claims go to shadow wallets
	}
	r.s.signer.SignRequest(req, r.s.now()) // last: it covers the target, the stress flag and the body
	if err := r.client.DoDeadline(req, resp, deadline); err != nil {
		return nil, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("cell answered %d: %s", resp.StatusCode(), resp.Body())
	}
	var out api.CreditsResponse
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return nil, fmt.Errorf("cell answered %q: %w", resp.Body(), err)
	}
	return out.Deferred, nil
}
