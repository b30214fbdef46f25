// Package relay delivers claims to the claimants' wallets: at least once,
// applied exactly once by the receiving side (the claim ID is the order
// number). A claim is its own outbox row: the relay takes committed claims
// from the open workers in memory, holds each until a delivery is
// acknowledged, and keeps per database a durable position below which every
// claim is credited, read back after a restart (or when the cell gains the
// database) to deliver the claims past it again. It is built from what it
// uses: the claims and wallets of one money space (Store), a client for
// calls to other cells (Client), the shard map (Peers), a clock and a
// logger; it knows nothing of the cell's server.
package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Store is the part of a cell's store the relay uses (the relay's queries
// and ops of package storage, and the wallets): the claims to read again
// past a position, the positions, where a credit went (storage.SendTo), and
// wallets to credit for this cell's own claimants.
type Store interface {
	storage.Reader  // storage.ClaimsAfterQuery, storage.RelayPositionsQuery
	storage.Grouper // storage.SetRelayPositions, storage.RecordDest
	ApplyCredits(ctx context.Context, credits []model.Credit) (applied int, deferred []string, err error)
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
	Interval time.Duration            // how often the relay offers again what no lane took, reads claims it must and saves positions (RelayInterval)
	DBs      func() []int             // the databases whose claims it delivers: those the cell serves now, read every Interval
	Owns     func(model.ShardID) bool // whether this cell serves a shard now (its claimants are credited locally)
	// Enter, when set, registers a delivery to this cell's wallets or a
	// save of positions as work that writes databases dbs (those of the
	// credits' shards, or the positions'); the relay calls the returned
	// leave when the write is done, and checks Owns after Enter. A move's
	// freeze of one of dbs waits for such work (cell.ownership). nil: none.
	Enter  func(dbs []int) (leave func())
	Off    func() bool // the relay degrade switch: true while switched off
	Store  Store       // the space's claims and wallets
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
	// credit delivered again (read again after a restart) is observed
	// again, with its longer lag. nil: not observed. Called from
	// the lanes' goroutines.
	CreditLag func(local bool, lag time.Duration)
}

// Stats are the relay's counters since the start (the cell's metrics and
// /healthz read them).
type Stats struct {
	Relayed  atomic.Int64 // credits whose delivery was acknowledged (applied now or before)
	Dropped  atomic.Int64 // fresh claims no lane took at once (held, and offered again 2 to 3 Intervals later)
	Errors   atomic.Int64 // failed reads, position saves and deliveries, and claims with no live owner
	Deferred atomic.Int64 // credits the receiver deferred (each deferral)
	Reads    atomic.Int64 // pages of claims read again from the store (after a start, a gained database, an unknown commit)
	Saves    atomic.Int64 // position saves written
	Scans    atomic.Int64 // Intervals worked (tick): offers again, reads, saves
	Yields   atomic.Int64 // times a lane began to hold back a batch because the cell was loaded (Config.Busy)
	// Elsewhere counts credits not delivered because the cell they were sent
	// to has them applied in its copy of the claimant's database, which
	// another cell serves now: reported, never booked a second time.
	Elsewhere atomic.Int64
	// Held counts credits kept back, once per attempt, because the cell
	// they were sent to could not be asked whether it applied them (the
	// question failed, or that cell holds the claim with another account or
	// amount) or their new destination could not be recorded.
	Held atomic.Int64
	// Unasked counts credits delivered to another cell without the question,
	// because the cell they were sent to is not in the map (removed, or
	// down): applied once there only if their database moved with its rows.
	Unasked atomic.Int64
}

// Relay delivers the claims of one money space. Fresh claims come straight
// from the open workers (Enqueue) and are held in memory until a delivery
// is acknowledged; what a lane could not take is offered again every
// Interval. Claims it never saw (committed before a crash, an unknown
// commit's, those of a database it gains) it reads from the store past the
// database's saved position.
//
// Credits go to dispatch, which splits them by destination, the cell that
// owns the claimant's wallet, into lanes (lane.go): the local lane for this
// cell's own shards, which applies them in its store and never waits on the
// network, and one lane per other cell. Nothing that hands credits over ever
// blocks.
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
	life    context.Context    // parent of every delivery and save; ends relayFlushMax after stop
	endLife context.CancelFunc // ends life
	lanesWG sync.WaitGroup     // lane goroutines

	saveMu   sync.Mutex       // one savePositions at a time (a tick's, Redrive's, the stop's)
	trackMu  sync.Mutex       // guards dbs, held, lastSave, readAcks
	dbs      map[int]*dbTrack // by database of the packets' shards: what the relay holds of its claims
	held     int              // credits held over every database: Σ len(pending), 0..heldMax (checkHeldLocked, reoffer)
	heldMax  int              // HeldMax (lower in tests)
	lastSave time.Time        // when positions were last saved
	// readAcks holds, while a tick runs (nil between ticks), the claim IDs
	// acknowledged since it began: its read of claims does not hold them
	// again (a lane let them go after the read began: lane.released).
	readAcks map[string]bool

	failures  *incident.Set     // failed deliveries, per destination
	deferrals *incident.Set     // credits deferred again and again, per destination
	saving    *incident.Tracker // position saves (and reads) that failed
	reading   *incident.Tracker // claim reads that failed
	asking    *incident.Set     // credits held: their last destination could not be asked, per that cell
	unasked   *incident.Set     // credits delivered unasked: their last destination left the map, per that cell
}

// dbTrack is what the relay knows of the claims of one database (of the
// packets' shards) it serves.
type dbTrack struct {
	pending map[string]*tracked // claims not yet known credited, by claim ID
	loaded  bool                // saved was read from the store
	saved   int64               // the position last saved or read (Unix ms); -1: none stored
	moved   bool                // claims came or went since the last save
	read    bool                // claims past from must be read from the store
	from    int64               // where that reading starts (Unix ms)
	cursor  model.ClaimPos      // how far it has got (zero: not begun)
	again   int64               // a reading asked for while one was under way, from this (Unix ms), to run when it ends; -1: none
	againAt time.Time           // when again was last asked for
	began   time.Time           // the start of the pass that read the reading's first page
}

// tracked is a credit the relay holds until a delivery is acknowledged.
type tracked struct {
	c       model.Credit
	offered time.Time // when last offered to a lane; zero: never, or let go since
}

// The relay's limits that the simulation (package sim) models with the same
// values. None is settable: docs/config.md lists them.
const (
	// BatchMax is the most credits one delivery carries, and one page of
	// claims read from the store: one transaction at the receiver, one HTTP
	// call for another cell.
	BatchMax = 500
	// Linger is how long a lane waits for a batch to fill, at a time: a
	// lone credit waits this long, and a lane whose credits keep coming
	// (LingerFlow or more in one Linger) waits again, up to LingerMax from
	// its oldest credit's claim. A batch of a lane's flow of credits then
	// holds several claimants of one shard table, whose credits share that
	// table's flow INSERT and balance upsert: at 1,000 credits a second
	// over a cell's 500 shards, a batch of 200 ms books them in about 1.65
	// statements each where one of 20 ms needs about 2.
	Linger = 20 * time.Millisecond
	// LingerFlow is how many credits one Linger must bring for the lane to
	// wait another (a flow of 400 a second).
	LingerFlow = 8
	// LingerMax bounds a lane's waits for its batch to fill, counted from
	// its oldest fresh credit's claim (or, for credits a scan found, from
	// the first wait): under the cell's bound for shedding opens for
	// credits (cell.Config.CreditShedFrom, 400 ms), with room for a
	// delivery to a loaded cell.
	LingerMax = 200 * time.Millisecond
	// ScanPagesMax is the most pages of BatchMax claims one Interval reads
	// per database: the rest waits for the next.
	ScanPagesMax = 10
	// YieldMax is the longest a lane holds back a batch smaller than
	// BatchMax while the cell is loaded (Config.Busy), counted from the
	// yield's start and, for a fresh credit, from its claim's creation, the
	// earlier bound winning: under load a claimant waits at most this much
	// more for the credit, below the bound from which the cell sheds opens
	// for credits (cell.Config.CreditShedFrom, 400 ms), and a lane still
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
	// relayDBTimeout bounds each read of claims or positions, and each save.
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
	// for a cell beyond it wait, held, until a lane retires.
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

// The relay's positions. None is settable: docs/config.md lists them.
const (
	// PositionEvery is how often the relay saves, per database whose claims
	// came or went since, the position below which every claim is credited.
	// After a crash the claims past it are read and delivered again (the
	// receivers refuse them as repeats): about Slack + PositionEvery of
	// claims, more when a credit was held for longer.
	PositionEvery = 5 * time.Second
	// Slack is how far behind now a position stays even when nothing is
	// held: a claim is stamped (created_ms) before its group commits and
	// reaches the relay, normally within milliseconds. A group still
	// committing when its open's deadline passed hands its claims over when
	// it ends (cell's writer.openGrouped), up to the commit bound (5 s, as Slack)
	// later; one whose outcome stays unknown has them read back
	// (MarkDB). A claim handed over later than Slack and lost in a crash
	// before its delivery is read back only by reconciliation, after its
	// settle time.
	Slack = 5 * time.Second
	// HeldMax is the most credits the relay holds over every database (a
	// destination down for long); past it, claims of a database are read
	// from the store again later instead of being held.
	HeldMax = 200_000
	// reofferIntervals: a held credit is offered again at the first
	// Interval at least this many Intervals after its last offer (2 to 3
	// Intervals later); a lane that holds it skips it.
	reofferIntervals = 2
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
// relay keeps its credits). Safe for concurrent use; it reads each lane's
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
	r := &Relay{cfg: cfg, clock: clock.Or(cfg.Clock), log: log, remote: map[string]*lane{}, stop: make(chan struct{}), dbs: map[int]*dbTrack{}, heldMax: HeldMax,
		failures:  incident.NewSet(log, "relay delivery", "dest", incident.DefaultEvery, lanesMax+1),
		deferrals: incident.NewSet(log, "relay credit deferred for long", "dest", incident.DefaultEvery, lanesMax+1),
		saving:    incident.New(log, "relay position", incident.DefaultEvery),
		reading:   incident.New(log, "relay claims read", incident.DefaultEvery),
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

// Off reports whether the relay's degrade switch is off (Config.Off).
func (r *Relay) Off() bool { return r.cfg.Off() }

// Enqueue takes fresh claims from the open workers (committed) and hands
// them to their lanes without blocking; the relay holds each until a
// delivery is acknowledged, and offers again, 2 to 3 Intervals later, what
// no lane took (or everything, once the relay is switched back on).
func (r *Relay) Enqueue(credits []model.Credit) {
	credits, _ = r.hold(credits, r.clock.Now(), false)
	if len(credits) == 0 || r.cfg.Off() {
		return
	}
	if left := r.dispatch(credits, time.Time{}); left > 0 {
		r.Stats.Dropped.Add(int64(left))
	}
}

// Reset forgets every credit the relay holds and every database's position
// (read again at the next Interval): the shadow space's tables were dropped
// (cell.shadowCleaner), and what the relay held of them must never be
// delivered. It leaves the lanes alone: call it while the relay is switched
// off, when they let go of whatever they hold (the cleaner waits until they
// hold nothing).
func (r *Relay) Reset() {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.dbs, r.held = map[int]*dbTrack{}, 0
}

// Now is the relay's clock's time.
func (r *Relay) Now() time.Time { return r.clock.Now() }

// Run works every Interval until ctx ends (tick), then stops the lanes: each
// delivers what it holds, all within relayFlushMax (every attempt's context
// ends by then, and the client's call with it); then it saves the positions
// once more (within relayDBTimeout), and the claims left are read again past
// them at the next start. Run returns when the lanes have exited and the
// save is done.
func (r *Relay) Run(ctx context.Context) {
	clock.Every(ctx, r.clock, r.cfg.Interval, func(int) { r.tick(ctx) })
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
	// What the flush delivered moves the positions: the next start reads
	// back only what is left.
	sctx, cancel := context.WithTimeout(context.Background(), relayDBTimeout)
	r.savePositions(sctx, r.clock.Now())
	cancel()
}

// tick is one Interval's work: follow the databases the cell serves, read
// the saved positions of those new to it, read claims where it must
// (readClaims), offer again what no lane holds (reoffer), and every
// PositionEvery save the positions (savePositions). While the relay is
// switched off it only follows the databases and saves.
func (r *Relay) tick(ctx context.Context) {
	now := r.clock.Now()
	r.trackMu.Lock()
	r.readAcks = map[string]bool{}
	r.trackMu.Unlock()
	for _, l := range r.lanes() {
		l.scanBegins(now)
	}
	r.follow()
	r.loadPositions(ctx)
	if !r.cfg.Off() {
		r.readClaims(ctx, now)
		r.reoffer(now)
	}
	r.trackMu.Lock()
	r.readAcks = nil
	due := now.Sub(r.lastSave) >= PositionEvery
	r.trackMu.Unlock()
	if due {
		r.savePositions(ctx, now)
	}
	r.Stats.Scans.Add(1)
}

// follow tracks every database the cell serves and forgets those it no
// longer does: their new owner reads their claims past the saved position
// (a lane still holding one of them delivers it; the receiver refuses the
// repeat).
func (r *Relay) follow() {
	all := r.cfg.DBs()
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	served := make(map[int]bool, len(all))
	for _, db := range all {
		served[db] = true
		r.trackLocked(db)
	}
	for db, t := range r.dbs {
		if !served[db] {
			r.held -= len(t.pending)
			delete(r.dbs, db)
		}
	}
	r.checkHeldLocked()
}

var (
	errDestGone = errors.New("the cell is not in the shard map")
	errConflict = errors.New("the cell holds the claim credited to another account or amount")
)
