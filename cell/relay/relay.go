// Package relay delivers claims to the claimants' wallets: at least once from
// a cell's outbox, applied exactly once by the receiving side (the claim ID is
// the order number). It is built from what it uses: the outbox and the wallets
// of one money space (Store), a client for calls to other cells (Client), the
// shard map (Peers), a clock and a logger; it knows nothing of the cell's
// server.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/sharding"
)

// Store is the part of a cell's store the relay uses (storage.Outbox and
// storage.Wallets): outbox rows to deliver (and where they go), wallets to
// credit for this cell's own claimants.
type Store interface {
	PendingCredits(ctx context.Context, db int, beforeMS, afterMS int64, afterID string, limit int) (credits []model.Credit, next model.OutboxPos, err error)
	MarkDelivered(ctx context.Context, credits []model.Credit) (skipped int, err error)
	ApplyCredits(ctx context.Context, credits []model.Credit) (applied int, deferred []string, err error)
	SendTo(ctx context.Context, credits []model.Credit, dest string) error
}

// Client delivers credits to another cell (POST /internal/credits, signed,
// marked as stress traffic when the space is the shadow one). The call ends
// when ctx does, and sends ctx's deadline to the receiver. The answer lists
// the claim IDs the receiver deferred (a wallet row was locked).
type Client interface {
	Credits(ctx context.Context, addr string, cs []model.Credit) (api.CreditsResponse, error)
	// ReconCopy asks the cell at addr which of cs it has credited in its own
	// copy of their claimants' databases, served now or handed over (POST
	// /internal/recon, api.ReconRequest.Copy).
	ReconCopy(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error)
}

// Peers tells which cell owns a shard (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// Config is what a Relay is built from. Every field is required but Clock
// (nil: the system clock), Busy and CreditLag (nil: none).
type Config struct {
	Cell     string                   // this cell's name: the local lane's destination
	Space    string                   // the money space, "real" or "shadow", for logs
	Interval time.Duration            // how often the outbox is scanned (RelayInterval)
	DBs      func() []int             // the databases whose outboxes are scanned: those the cell serves now, read each scan
	Owns     func(model.ShardID) bool // whether this cell serves a shard now (its claimants are credited locally)
	// Enter, when set, registers a delivery to this cell's wallets or a
	// marking of its outbox as work that writes databases dbs (those of the
	// credits' shards, or of their packets'); the relay calls the returned
	// leave when the write is done, and checks Owns after Enter. A move's
	// freeze of one of dbs waits for such work (cell.ownership). nil: none.
	Enter  func(dbs []int) (leave func())
	Off    func() bool // the relay degrade switch: true while switched off
	Store  Store       // the space's outbox and wallets
	Client Client      // calls to other cells, for this space
	Peers  Peers       // the shard map
	Clock  clock.Clock // nil: clock.Real
	Log    *slog.Logger
	// Busy tells whether the cell is loaded with opens (its load probe; nil:
	// never). While it is, the lanes yield: each delivers only full batches
	// (BatchMax), or a smaller one once its lane has held it back for
	// YieldMax, and catches up with full batches when the load drops. Called
	// from the lanes' goroutines, often: it must be cheap and safe for
	// concurrent use.
	Busy func() bool
	// CreditLag observes, for every credit a delivery acknowledged (applied
	// now or found applied before), the time from its claim's creation
	// (Credit.CreatedMS; credits without one are not observed) to the
	// acknowledgement, on the relay's clock; local tells the lane kind. A
	// credit delivered again (its outbox mark was skipped or lost) is
	// observed again, with its longer lag. nil: not observed. Called from
	// the lanes' goroutines.
	CreditLag func(local bool, lag time.Duration)
}

// Stats are the relay's counters since the start (the cell's metrics and
// /healthz read them).
type Stats struct {
	Relayed     atomic.Int64 // credits delivered and marked in the outbox
	Dropped     atomic.Int64 // fresh claims no lane took (the outbox scan delivers them)
	Errors      atomic.Int64 // failed scans, deliveries and marks, and claims with no live owner
	Deferred    atomic.Int64 // credits the receiver deferred (each deferral)
	MarkSkipped atomic.Int64 // delivered credits left pending because their row was locked
	Scans       atomic.Int64 // outbox scans finished
	Yields      atomic.Int64 // times a lane began to hold back a batch because the cell was loaded (Config.Busy)
	// Elsewhere counts credits not delivered because the cell they were sent
	// to has them applied in its copy of the claimant's database, which
	// another cell serves now: reported, never booked a second time.
	Elsewhere atomic.Int64
	// Held counts credits kept in the outbox, once per attempt, because the
	// cell they were sent to could not be asked whether it applied them (the
	// question failed, or that cell holds the claim with another account or
	// amount) or their new destination could not be recorded.
	Held atomic.Int64
	// Unasked counts credits delivered to another cell without the question,
	// because the cell they were sent to is not in the map (removed, or
	// down): applied once there only if their database moved with its rows.
	Unasked atomic.Int64
}

// Relay delivers the claims of one money space. Fresh claims come straight
// from the open workers (Enqueue); a periodic scan of the outbox picks up
// whatever that missed (a crash, a full or paused lane, a peer down, a locked
// row).
//
// Both hand credits to dispatch, which splits them by destination, the cell
// that owns the claimant's wallet, into lanes (lane.go): the local lane for
// this cell's own shards, which applies them in its store and never waits on
// the network, and one lane per other cell. Nothing that hands credits over
// ever blocks: what a lane cannot take stays in the outbox for the scan.
//
// Lifecycle: New, then Run until its ctx ends; Enqueue may be called at any
// time from any goroutine (after Run ends it takes nothing).
type Relay struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger
	Stats Stats

	mu       sync.Mutex       // guards local, remote, stopping
	local    *lane            // nil until the first local credit, or after it retired
	remote   map[string]*lane // by cell name; at most lanesMax
	stopping bool             // the cell stops: no lane is made

	stop    chan struct{}      // closed when the cell stops: lanes flush and exit
	flushBy atomic.Int64       // Unix ns when the flush after stop ends (no attempt runs past it); 0 while serving
	life    context.Context    // parent of every delivery and mark; ends relayFlushMax after stop
	endLife context.CancelFunc // ends life
	lanesWG sync.WaitGroup     // lane goroutines

	// What the scans read (see scan): between sweeps of every database,
	// only those whose outbox may hold rows no lane took.
	scanMu    sync.Mutex
	dirty     map[int]time.Time // database → when it was last marked
	lastSweep time.Time         // start of the last sweep that read every database; zero: none yet
	swept     []int             // the databases of that sweep
	wasOff    bool              // a scan found the relay switched off since the last sweep

	failures  *incident.Set     // failed deliveries, per destination
	deferrals *incident.Set     // credits deferred again and again, per destination
	marking   *incident.Tracker // outbox marks that failed
	scanning  *incident.Tracker // outbox reads that failed
	asking    *incident.Set     // credits held: their last destination could not be asked, per that cell
	unasked   *incident.Set     // credits delivered unasked: their last destination left the map, per that cell
}

// The relay's limits that the simulation (package sim) models with the same
// values. None is settable: docs/config.md lists them.
const (
	// BatchMax is the most credits one delivery carries, and one page of an
	// outbox scan: one transaction at the receiver, one HTTP call for another
	// cell.
	BatchMax = 500
	// Linger is how long a lane waits for a batch to fill; it adds at most
	// this much to the time a claimant waits for the credit.
	Linger = 20 * time.Millisecond
	// ScanPagesMax is the most pages of BatchMax rows one scan reads per
	// database: the rest waits for the next scan.
	ScanPagesMax = 10
	// YieldMax is the longest a lane holds back a batch smaller than
	// BatchMax while the cell is loaded (Config.Busy), counted from the
	// yield's start and, for a fresh credit, from its claim's creation, the
	// earlier bound winning: under load a claimant waits at most this much
	// more for the credit, below the bound from which the cell sheds opens
	// for credits (cell.Config.CreditShedFrom, 300 ms), and a lane still
	// delivers at least four batches a second.
	YieldMax = 250 * time.Millisecond
)

// DeferralBackoff is how long a credit the receiver deferred for the
// deferrals-th time (1, 2, ...; its wallet row was locked) waits before it is
// tried again: relayBackoffMin doubling per deferral, at most relayBackoffMax
// (100 ms, 200 ms, ... 3.2 s, then 5 s). deferrals < 1 is taken as 1.
func DeferralBackoff(deferrals int) time.Duration {
	return min(relayBackoffMin<<min(max(deferrals, 1)-1, 16), relayBackoffMax)
}

// The relay's other limits, its own. None is settable: docs/config.md lists them.
const (
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
	// batchMin is the smallest batch a lane shrinks to after attempts that
	// ran out of time (see lane.attempt): a destination so loaded that it
	// cannot book 16 credits in an attempt's time is down for the relay.
	batchMin = 16
	// yieldPoll is how often a yielding lane asks whether the load has
	// dropped: it catches up within this much of the drop.
	yieldPoll = 25 * time.Millisecond
)

// Behind is how far the relay is behind at now with the credits this
// cell's opens make: the age (from its claim's creation, as the credit lag
// counts it) of the oldest fresh credit (handed over by an open, Enqueue)
// among those that wait on a lane itself (in flight, or queued and never
// deferred: lane.oldest), over the local lane and every lane to another
// cell whose last delivery did not fail and whose attempt in flight, if
// any, has not stalled (remoteStall); 0 when none holds such a credit or the
// relay is switched off. The cell sheds opens while it grows (cell.creditShedShare): a lane's database
// work competes with the opens' for the same servers, one connection
// against dozens, and without a bounded share of them credits fall seconds
// behind under overload. A lane backing off after failures is not counted:
// its destination is down or hung, which shedding here does not mend (the
// outbox keeps its credits). Safe for concurrent use; it reads each lane's
// queue under its lock (up to laneDepthMax credits).
func (r *Relay) Behind(now time.Time) time.Duration {
	if r.cfg.Off() {
		return 0
	}
	var first time.Time
	for _, l := range r.lanes() {
		if o := l.oldest(now); !o.IsZero() && (first.IsZero() || o.Before(first)) {
			first = o
		}
	}
	if first.IsZero() {
		return 0
	}
	return max(now.Sub(first), 0)
}

// New builds a relay; it does no I/O and starts nothing (see Run).
func New(cfg Config) *Relay {
	log := cfg.Log.With("space", cfg.Space)
	r := &Relay{cfg: cfg, clock: clock.Or(cfg.Clock), log: log, remote: map[string]*lane{}, stop: make(chan struct{}), dirty: map[int]time.Time{},
		failures:  incident.NewSet(log, "relay delivery", "dest", incident.DefaultEvery, lanesMax+1),
		deferrals: incident.NewSet(log, "relay credit deferred for long", "dest", incident.DefaultEvery, lanesMax+1),
		marking:   incident.New(log, "relay outbox marking", incident.DefaultEvery),
		scanning:  incident.New(log, "outbox scan", incident.DefaultEvery),
		asking:    incident.NewSet(log, "relay credit held: where it went cannot be asked or recorded", "sent_to", incident.DefaultEvery, lanesMax+1),
		unasked:   incident.NewSet(log, "relay credit delivered without asking the cell it was sent to, which is not in the map", "sent_to", incident.DefaultEvery, lanesMax+1),
	}
	r.life, r.endLife = context.WithCancel(context.Background())
	return r
}

// NewCredits lists the credits an open batch's results owe their claimants:
// one per claim made now (not for errors, nor for repeats, whose credit was
// owed when the claim was made), in results' order, with the claimant's shard
// (sharding.ShardOfAct). A user listed twice in a row in a batch shares one
// result: it is credited once.
func NewCredits(results []model.OpenResult) []model.Credit {
	var credits []model.Credit
	for i, r := range results {
		if r.Err != nil || r.Repeat {
			continue
		}
		if i > 0 && results[i-1].Claim.ID == r.Claim.ID {
			continue
		}
		credits = append(credits, model.Credit{ClaimID: r.Claim.ID, PacketID: r.Claim.PacketID, ActID: r.Claim.ActID,
			Shard: sharding.ShardOfAct(r.Claim.ActID), Amount: r.Claim.Amount, CreatedMS: r.Claim.CreatedMS})
	}
	return credits
}

// Enqueue hands fresh claims from the open workers to their lanes without
// blocking; what the lanes cannot take, or everything while the relay is
// switched off, waits in the outbox for a later scan.
func (r *Relay) Enqueue(credits []model.Credit) {
	if r.cfg.Off() {
		r.markDirty(credits)
		return
	}
	if left := r.dispatch(credits, time.Time{}); left > 0 {
		r.Stats.Dropped.Add(int64(left))
		r.markDirty(credits) // which of them is not known: their databases are read again
	}
}

// SweepIntervals: every this many Intervals a scan reads every database's
// outbox (and at the first scan, after the relay was switched off, and when
// the databases the cell serves change). The scans between read only the
// databases whose outboxes may hold rows no lane took (markDirty): an idle
// cell reads each outbox once a sweep, not every Interval.
const SweepIntervals = 10

// markDirty marks the outboxes of cs's claims (their packets' databases) to
// be read by the next scans: rows no lane took, or given back to the outbox.
// A mark stays until a scan that sees rows as old as the mark finds none.
func (r *Relay) markDirty(cs []model.Credit) {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	now := r.clock.Now() // under the lock: marks only move forward
	for _, c := range cs {
		if ref, err := model.ParsePacketID(string(c.PacketID)); err == nil {
			r.markLocked(ref.Shard.DB(), now)
		}
	}
}

// MarkDB marks database db's outbox to be read by the next scans: a commit
// whose outcome is unknown may have left claims there that no lane was
// handed (the cell's open path calls it).
func (r *Relay) MarkDB(db int) {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	r.markLocked(db, r.clock.Now())
}

// markLocked marks db as of at, never earlier than a mark it has: a later
// mark is for rows a scan as old as the earlier one could not see. scanMu
// must be held.
func (r *Relay) markLocked(db int, at time.Time) {
	if was, ok := r.dirty[db]; !ok || was.Before(at) {
		r.dirty[db] = at
	}
}

// scanList is what the scan that starts at start reads: every database the
// cell serves (a sweep) or only the marked ones among them.
func (r *Relay) scanList(start time.Time) (dbs []int, sweep bool) {
	all := r.cfg.DBs()
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	if r.lastSweep.IsZero() || r.wasOff || start.Sub(r.lastSweep) >= SweepIntervals*r.cfg.Interval || !slices.Equal(all, r.swept) {
		return all, true
	}
	for _, db := range all {
		if _, ok := r.dirty[db]; ok {
			dbs = append(dbs, db)
		}
	}
	return dbs, false
}

// scanned records what a scan that started at start (reading rows created
// up to before, Unix ms) found in db: rows keep it marked; none clears a
// mark made by then, when the scan could see the rows it was made for.
func (r *Relay) scanned(db int, found bool, start time.Time, before int64) {
	r.scanMu.Lock()
	defer r.scanMu.Unlock()
	if found {
		r.markLocked(db, start)
		return
	}
	if at, ok := r.dirty[db]; ok && at.UnixMilli() <= before {
		delete(r.dirty, db)
	}
}

// dispatch offers each credit to the lane of its destination and returns how
// many no lane took: its lane is full, backing off or stopping, no room is
// left for another lane, or no live cell owns the claimant's shard. Those stay
// in the outbox. scanStart is when the scan that read them began (zero for
// fresh claims; see lane.offer). It never blocks.
func (r *Relay) dispatch(credits []model.Credit, scanStart time.Time) (left int) {
	local, remote, noOwner := r.cfg.Peers.Map().GroupByOwner(credits, r.cfg.Owns)
	if noOwner > 0 {
		r.Stats.Errors.Add(int64(noOwner)) // no live owner now: the outbox keeps them
		left += noOwner
	}
	now := r.clock.Now()
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
	for _, g := range remote {
		left += offer(r.laneLocked(g.Cell.Name, false), g.Credits)
	}
	return left
}

// laneLocked returns the lane of a destination, starting it if needed; nil
// while the relay stops, or when lanesMax lanes to other cells run. r.mu must
// be held.
func (r *Relay) laneLocked(name string, local bool) *lane {
	if r.stopping {
		return nil
	}
	if local {
		if r.local == nil {
			r.local = r.startLocked(newLane(r, r.cfg.Cell, true))
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
func (r *Relay) startLocked(l *lane) *lane {
	r.lanesWG.Add(1)
	go l.run()
	return l
}

// retire removes l if it holds nothing, so that its goroutine may exit; a
// later credit for its destination starts a new lane.
func (r *Relay) retire(l *lane) bool {
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

// LaneState is what one lane holds and its backoff (the metrics).
type LaneState struct {
	Dest    string        // the destination cell's name
	Local   bool          // the lane of this cell's own claimants
	Held    int           // credits queued, in flight or waiting to be tried again
	Backoff time.Duration // pause after failed deliveries; 0 after a success
}

// Lanes reports the running lanes: at most lanesMax+1.
func (r *Relay) Lanes() []LaneState {
	var out []LaneState
	for _, l := range r.lanes() {
		held, backoff := l.state()
		out = append(out, LaneState{Dest: l.dest, Local: l.local, Held: held, Backoff: backoff})
	}
	return out
}

// lanes returns the running lanes.
func (r *Relay) lanes() []*lane {
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

// Run scans the outbox every Interval until ctx ends, then stops the lanes:
// each delivers what it holds, all within relayFlushMax (every attempt's
// context ends by then, and the client's call with it); the outbox keeps the
// rest for the next start. Run returns when the lanes have exited.
func (r *Relay) Run(ctx context.Context) {
	clock.Every(ctx, r.clock, r.cfg.Interval, func(int) {
		if r.cfg.Off() {
			r.scanMu.Lock()
			r.wasOff = true // rows piled up unread: the next scan reads every database
			r.scanMu.Unlock()
			return
		}
		r.scan(ctx)
	})
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	r.flushBy.Store(r.clock.Now().Add(relayFlushMax).UnixNano())
	close(r.stop)
	lanesDone := make(chan struct{})
	go func() { r.lanesWG.Wait(); close(lanesDone) }()
	select {
	case <-lanesDone:
	case <-r.clock.After(relayFlushMax):
		r.endLife() // a lane still flushing: its attempt's context ends now
		<-lanesDone
	}
	r.endLife()
}

// scan hands the lanes the outbox rows older than two relay intervals, page
// by page by (created_ms, claim_id), so rows that cannot be delivered now
// (their cell is down) do not hide newer ones. A lane skips the credits it
// already holds; one that is full or backing off takes none, and they wait
// for a later scan. It reads every database in a sweep, else only those
// marked (scanList).
func (r *Relay) scan(ctx context.Context) {
	start := r.clock.Now()
	for _, l := range r.lanes() {
		l.scanBegins(start)
	}
	before := start.Add(-2 * r.cfg.Interval).UnixMilli()
	dbs, sweep := r.scanList(start)
	ok := true
	defer r.Stats.Scans.Add(1)
	for _, db := range dbs {
		var after model.OutboxPos
		found, read := false, true
		for page := 0; page < ScanPagesMax && ctx.Err() == nil; page++ {
			pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
			credits, next, err := r.cfg.Store.PendingCredits(pctx, db, before, after.CreatedMS, after.ClaimID, BatchMax)
			cancel()
			if err != nil {
				read = false
				if ctx.Err() == nil {
					ok = false
					r.Stats.Errors.Add(1)
					r.scanning.Fail(err, "db", db)
				}
				break
			}
			found = found || len(credits) > 0
			r.dispatch(credits, start)
			if len(credits) < BatchMax {
				break
			}
			after = next
		}
		if ctx.Err() != nil {
			return
		}
		r.scanned(db, found || !read, start, before)
	}
	if ok {
		r.scanning.OK()
		if sweep {
			all := slices.Clone(dbs)
			r.scanMu.Lock()
			if r.lastSweep.IsZero() || r.wasOff || !slices.Equal(all, r.swept) {
				// A sweep for an event (the start, the relay back on, databases
				// come or gone) read rows up to two intervals old only; those
				// younger, left by an earlier process, a previous owner or
				// while the relay was off, are read by the scans to come.
				for _, db := range all {
					r.markLocked(db, start)
				}
			}
			r.lastSweep, r.swept, r.wasOff = start, all, false
			r.scanMu.Unlock()
		}
	}
}

// deliver applies cs at l's destination within ctx and sorts them:
// delivered (applied now or before, each with the Dest to mark it with),
// deferred (a wallet row was locked); any other credit of cs is no longer
// l's to deliver now (the shard map changed, or a question about where it
// went could not be answered: askElsewhere) and goes back to the outbox. An
// error means nothing is known to be applied.
func (r *Relay) deliver(ctx context.Context, l *lane, cs []model.Credit) (delivered, deferred []model.Credit, err error) {
	if l.local {
		// Asked before Enter: a move's freeze of these databases waits for
		// the write, not for questions to other cells.
		cs, done := r.askElsewhere(ctx, l.dest, cs)
		if len(cs) == 0 {
			return done, nil, nil
		}
		if r.cfg.Enter != nil {
			dbs := make([]int, len(cs))
			for i, c := range cs {
				dbs[i] = c.Shard.DB()
			}
			leave := r.cfg.Enter(dbs)
			defer leave()
		}
		// A wallet's database may have moved (or be moving) since the credit
		// was dispatched here: only those still served are applied; the
		// others go back to the outbox and a later scan sends them on.
		mine := cs[:0:0]
		for _, c := range cs {
			if r.cfg.Owns(c.Shard) {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			return done, nil, nil
		}
		_, ids, err := r.cfg.Store.ApplyCredits(ctx, mine)
		if err != nil {
			return nil, nil, err
		}
		delivered, deferred = SplitDeferred(mine, ids)
		return append(sentTo(delivered, l.dest), done...), deferred, nil
	}
	m := r.cfg.Peers.Map()
	var mine []model.Credit
	addr := ""
	for _, c := range cs {
		if owner, ok := m.Owner(c.Shard); ok && owner.Name == l.dest && !r.cfg.Owns(c.Shard) {
			mine, addr = append(mine, c), owner.Addr
		}
	}
	mine, done := r.askElsewhere(ctx, l.dest, mine)
	if len(mine) == 0 {
		return done, nil, nil
	}
	resp, err := r.cfg.Client.Credits(ctx, addr, mine)
	if err != nil {
		return nil, nil, err
	}
	delivered, deferred = SplitDeferred(mine, resp.Deferred)
	return append(sentTo(delivered, l.dest), done...), deferred, nil
}

// sentTo sets every credit's Dest to dest, the cell that applied it (the
// outbox mark records it).
func sentTo(cs []model.Credit, dest string) []model.Credit {
	for i := range cs {
		cs[i].Dest = dest
	}
	return cs
}

// askTimeout bounds one question of askElsewhere, so that a hung cell
// delays the credits it is asked about, not the lane's batch.
const askTimeout = 2 * time.Second

// askElsewhere makes a credit applied at most once across the cluster, not
// only per database: before cs are delivered to cell to, it asks about each
// credit that went to another cell before (Credit.Dest, as its outbox row
// records it) that cell's copy of the claimant's database (Client.ReconCopy;
// this cell's own copies too, through the same call). A database handed over
// without its rows would otherwise take the credit a second time.
//
//   - Not found there: recorded as sent to to (Store.SendTo, so a lost mark
//     still leaves the row naming where it may be applied) and returned in
//     deliver.
//   - Found there, and to has it too (the database moved with its rows):
//     returned in done with Dest to, to be marked delivered.
//   - Found there but not at to: returned in done with that Dest, to be
//     marked delivered; logged at ERROR and counted (Stats.Elsewhere): the
//     money sits in a copy no cell serves; never booked again.
//   - That cell not in the map: nobody to ask (removed, or down; a move
//     needs its source up, so the database came to to by a move that copied
//     its rows): delivered unasked (Stats.Unasked, an incident per cell).
//   - A question that fails (within askTimeout), a record that fails, or a
//     claim held there under another account or amount: in neither; the
//     credit stays in the outbox (Stats.Held, an incident) and is asked
//     about again.
func (r *Relay) askElsewhere(ctx context.Context, to string, cs []model.Credit) (deliver, done []model.Credit) {
	if !slices.ContainsFunc(cs, func(c model.Credit) bool { return c.Dest != "" && c.Dest != to }) {
		return cs, nil // the common case: nothing went anywhere else
	}
	byDest := map[string][]model.Credit{}
	for _, c := range cs {
		if c.Dest == "" || c.Dest == to {
			deliver = append(deliver, c)
		} else {
			byDest[c.Dest] = append(byDest[c.Dest], c)
		}
	}
	cells := r.cfg.Peers.Map().Cells()
	addrOf := func(name string) (string, bool) {
		i := slices.IndexFunc(cells, func(c sharding.Cell) bool { return c.Name == name })
		if i < 0 {
			return "", false
		}
		return cells[i].Addr, true
	}
	held := func(dest string, cs []model.Credit, err error) {
		r.Stats.Held.Add(int64(len(cs)))
		r.asking.Of(dest).Fail(err, "credits", len(cs), "claim", cs[0].ClaimID, "deliver_to", to)
	}
	for _, dest := range slices.Sorted(maps.Keys(byDest)) {
		asked := byDest[dest]
		addr, ok := addrOf(dest)
		if !ok {
			r.Stats.Unasked.Add(int64(len(asked)))
			r.unasked.Of(dest).Fail(errDestGone, "credits", len(asked), "claim", asked[0].ClaimID, "deliver_to", to)
			if err := r.sendTo(ctx, asked, to); err != nil {
				held(dest, asked, err)
				continue
			}
			deliver = append(deliver, asked...)
			continue
		}
		r.unasked.Of(dest).OK()
		missing, found, err := r.askCopy(ctx, addr, asked)
		if err != nil {
			held(dest, asked, err)
			continue
		}
		if len(missing) > 0 {
			if err := r.sendTo(ctx, missing, to); err != nil {
				held(dest, missing, err)
				continue // found ones are asked about again with them
			}
			deliver = append(deliver, missing...)
		}
		if len(found) == 0 {
			r.asking.Of(dest).OK()
			continue
		}
		// Found where it went. Does to, which serves the database now, have
		// it too (its rows moved with it)?
		toAddr, ok := addrOf(to)
		if !ok {
			held(dest, found, errDestGone)
			continue
		}
		notHere, here, err := r.askCopy(ctx, toAddr, found)
		if err != nil {
			held(to, found, err)
			continue
		}
		r.asking.Of(dest).OK()
		done = append(done, sentTo(here, to)...)
		if len(notHere) > 0 {
			r.Stats.Elsewhere.Add(int64(len(notHere)))
			r.log.Error("relay credits found applied at a cell that no longer serves the claimants' database, and not where it is served now: not delivered again, marked with where they were applied",
				"credits", len(notHere), "claim", notHere[0].ClaimID, "act_id", notHere[0].ActID, "amount", notHere[0].Amount,
				"db", notHere[0].Shard.DB(), "applied_at", dest, "served_by", to)
			done = append(done, notHere...)
		}
	}
	return deliver, done
}

// askCopy asks the cell at addr, within askTimeout, which of cs its copy of
// the claimants' databases holds credited as claimed: missing are not
// there, found are; a claim held there under another account or amount is
// an error (errConflict), as is an answer that does not account for every
// claim.
func (r *Relay) askCopy(ctx context.Context, addr string, cs []model.Credit) (missing, found []model.Credit, err error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	resp, err := r.cfg.Client.ReconCopy(ctx, addr, cs)
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Mismatched) > 0 {
		return nil, nil, fmt.Errorf("%w: %s", errConflict, resp.Mismatched[0])
	}
	isMissing := setOf(resp.Missing)
	for _, c := range cs {
		if isMissing[c.ClaimID] {
			missing = append(missing, c)
		} else {
			found = append(found, c)
		}
	}
	if int64(len(found)) != resp.Matched {
		return nil, nil, fmt.Errorf("the cell accounted for %d of %d claims", resp.Matched+int64(len(resp.Missing)), len(cs))
	}
	return missing, found, nil
}

// sendTo records, within relayDBTimeout, that cs are about to be delivered
// to cell to (Store.SendTo).
func (r *Relay) sendTo(ctx context.Context, cs []model.Credit, to string) error {
	ctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	defer cancel()
	return r.cfg.Store.SendTo(ctx, cs, to)
}

func setOf(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

var (
	errDestGone = errors.New("the cell is not in the shard map")
	errConflict = errors.New("the cell holds the claim credited to another account or amount")
)

// SplitDeferred splits cs into the credits whose claim IDs are not in ids and
// those that are (the IDs a receiver's ApplyCredits deferred), each in cs's
// order. IDs that name no credit of cs are ignored; with no ids, rest is cs.
func SplitDeferred(cs []model.Credit, ids []string) (rest, deferred []model.Credit) {
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

// observeLag reports the credit lag of the credits a delivery by a lane of
// kind local acknowledged at now (Config.CreditLag).
func (r *Relay) observeLag(local bool, cs []model.Credit, now time.Time) {
	f := r.cfg.CreditLag
	if f == nil {
		return
	}
	for _, c := range cs {
		if c.CreatedMS > 0 {
			f(local, max(now.Sub(time.UnixMilli(c.CreatedMS)), 0))
		}
	}
}

// markDelivered marks delivered credits in the outbox within relayDBTimeout.
// Rows it cannot mark (locked by another transaction, or the database
// failing) stay pending: the scan delivers them again, which the receiver
// ignores.
func (r *Relay) markDelivered(cs []model.Credit) {
	ctx, cancel := context.WithTimeout(r.life, relayDBTimeout)
	defer cancel()
	if r.cfg.Enter != nil {
		dbs := make([]int, 0, len(cs))
		for _, c := range cs {
			if ref, err := model.ParsePacketID(string(c.PacketID)); err == nil {
				dbs = append(dbs, ref.Shard.DB())
			}
		}
		leave := r.cfg.Enter(dbs)
		defer leave()
	}
	// An outbox row lives with its packet: a packet whose database moved away
	// since the scan keeps its row pending here, and its new owner's relay
	// delivers the credit again, which the receiver ignores.
	kept := cs[:0:0]
	for _, c := range cs {
		if ref, err := model.ParsePacketID(string(c.PacketID)); err == nil && r.cfg.Owns(ref.Shard) {
			kept = append(kept, c)
		}
	}
	if cs = kept; len(cs) == 0 {
		return
	}
	skipped, err := r.cfg.Store.MarkDelivered(ctx, cs)
	if err != nil || skipped > 0 {
		r.markDirty(cs) // left pending: read again, delivered again (the receiver ignores it)
	}
	if err != nil {
		r.Stats.Errors.Add(1)
		r.marking.Fail(err, "credits", len(cs))
		return
	}
	r.marking.OK()
	r.Stats.Relayed.Add(int64(len(cs) - skipped))
	r.Stats.MarkSkipped.Add(int64(skipped))
}

// failed records a failed delivery of n credits by l.
func (r *Relay) failed(l *lane, n int, err error) {
	r.Stats.Errors.Add(1)
	r.failures.Of(l.dest).Fail(err, "credits", n, "local", l.local)
}

// succeeded records a delivery that l made.
func (r *Relay) succeeded(l *lane) { r.failures.Of(l.dest).OK() }

// deferredCredits records that one delivery of l had n credits deferred;
// longest is the one deferred most often (nil: none), long how many credits l
// holds that were deferred deferralsLong times or more. Such a credit's wallet
// row has been locked for long: an incident of the lane, logged while one is
// held (incident.Tracker: when it starts, every 10 s, when it ends).
func (r *Relay) deferredCredits(l *lane, n int, longest *queued, long int) {
	r.Stats.Deferred.Add(int64(n))
	t := r.deferrals.Of(l.dest)
	switch {
	case longest != nil && longest.deferrals >= deferralsLong:
		t.Fail(errWalletLocked, "claim", longest.c.ClaimID, "act_id", longest.c.ActID, "deferrals", longest.deferrals, "credits_deferred_long", long)
	case long == 0:
		t.OK()
	}
}

var errWalletLocked = errors.New("a wallet row the credit needs is locked by another transaction")
