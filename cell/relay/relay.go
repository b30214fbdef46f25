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
	"cmp"
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
	"redcell/internal/invariant"
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
	// it ends (cell.openGrouped), up to the commit bound (5 s, as Slack)
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

// hold adds cs to what the relay holds, each under its packet's database,
// offered at offered (zero: not yet), and returns those it did not hold
// already. Past HeldMax a database's claims are left to a read from the
// store instead (its position stays below them); leftMS is the creation
// time (Unix ms) of the first credit of cs left out so, -1 when none. read
// tells that cs were read from the store by the running tick (readClaims):
// those acknowledged since it began are not held again. It asserts the
// held count's bounds before and after (checkHeldLocked).
func (r *Relay) hold(cs []model.Credit, offered time.Time, read bool) (out []model.Credit, leftMS int64) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.checkHeldLocked()
	defer r.checkHeldLocked()
	out, leftMS = cs[:0:0], -1
	for _, c := range cs {
		ref, err := model.ParsePacketID(string(c.PacketID))
		if err != nil {
			continue
		}
		t := r.trackLocked(ref.Shard.DB())
		if _, ok := t.pending[c.ClaimID]; ok {
			continue
		}
		if read && r.readAcks[c.ClaimID] {
			continue // delivered while it was read
		}
		if r.held >= r.heldMax {
			r.rereadLocked(t, c.CreatedMS)
			if leftMS < 0 {
				leftMS = c.CreatedMS
			}
			continue
		}
		t.pending[c.ClaimID] = &tracked{c: c, offered: offered}
		t.moved = true
		r.held++
		out = append(out, c)
	}
	return out, leftMS
}

// Came notes claims of database db (their packets') credited in their
// opens' own transactions (model.OpenResult.Credited): the relay holds
// nothing for them, but the database's claims came, so its next save of
// positions moves db's past them, as it would past delivered ones.
func (r *Relay) Came(db int) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.trackLocked(db).moved = true
}

// trackLocked is database db's track, made when missing (its saved
// position not read yet: it reads the claims past it). r.trackMu is held.
func (r *Relay) trackLocked(db int) *dbTrack {
	t, ok := r.dbs[db]
	if !ok {
		t = &dbTrack{pending: map[string]*tracked{}, saved: -1, read: true, again: -1}
		r.dbs[db] = t
	}
	return t
}

// rereadLocked makes t's claims from fromMS on be read from the store
// again: a reading is begun, or the one under way starts again from
// fromMS when that is further back, or else one more follows it (again).
// r.trackMu is held.
func (r *Relay) rereadLocked(t *dbTrack, fromMS int64) {
	t.moved = true // a save must not pass what this is for: it sees the reading (positionLocked)
	switch {
	case !t.read:
		t.read, t.from, t.cursor = true, fromMS, model.ClaimPos{}
	case t.loaded && fromMS < max(t.from, t.cursor.CreatedMS):
		t.from, t.cursor = fromMS, model.ClaimPos{} // the reading under way starts again, further back
	default:
		// The reading under way may have read past these claims' place
		// before they were committed, or stop before them: one more
		// reading follows it unless every page of it began after this ask
		// (readClaims).
		if t.again < 0 || fromMS < t.again {
			t.again = fromMS
		}
		t.againAt = r.clock.Now()
	}
}

// acked forgets credits whose delivery was acknowledged. It asserts the
// held count's bounds after (checkHeldLocked: a credit forgotten twice takes
// it below zero).
func (r *Relay) acked(cs []model.Credit) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	defer r.checkHeldLocked()
	for _, c := range cs {
		if r.readAcks != nil {
			r.readAcks[c.ClaimID] = true
		}
		if t, p := r.heldLocked(c); p != nil {
			delete(t.pending, c.ClaimID)
			t.moved = true
			r.held--
		}
	}
	r.Stats.Relayed.Add(int64(len(cs)))
}

// checkHeldLocked asserts the bounds of the held count: never below zero
// (each credit held is counted once and forgotten once), never above
// HeldMax (hold leaves the rest to a read from the store). r.trackMu is held.
func (r *Relay) checkHeldLocked() {
	invariant.That(r.held >= 0 && r.held <= r.heldMax, "relay: credits held outside 0..HeldMax (held counts each pending credit once)")
}

// heldLocked is c's entry among what the relay holds, with its database's
// track; nil when it is not held. r.trackMu is held.
func (r *Relay) heldLocked(c model.Credit) (*dbTrack, *tracked) {
	ref, err := model.ParsePacketID(string(c.PacketID))
	if err != nil {
		return nil, nil
	}
	t, ok := r.dbs[ref.Shard.DB()]
	if !ok {
		return nil, nil
	}
	return t, t.pending[c.ClaimID]
}

// letGo marks held credits a lane gave up (the relay switched off, the
// claimant's cell changed) to be offered again at the next Interval.
func (r *Relay) letGo(cs []model.Credit) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, c := range cs {
		if _, p := r.heldLocked(c); p != nil {
			p.offered = time.Time{}
		}
	}
}

// MarkDB makes the claims of database db made since since be read from
// the store at the next Interval: a commit whose outcome is unknown may
// have made claims no one handed over (the cell's open path calls it with
// when its batch began, less a margin). The receivers refuse those among
// them that were credited already.
func (r *Relay) MarkDB(db int, since time.Time) {
	from := min(since.UnixMilli(), r.clock.Now().UnixMilli())
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	r.rereadLocked(r.trackLocked(db), from)
}

// Redrive hands the relay claims reconciliation found uncredited past
// their settle time: held (when not held already) and offered at the next
// Interval, whatever a lane did with them before.
func (r *Relay) Redrive(cs []model.Credit) {
	r.hold(cs, time.Time{}, false)
	r.letGo(cs)
	// Saved now, before reconciliation moves its own position past them: a
	// crash before the next save would otherwise leave them below both.
	r.savePositions(r.life, r.clock.Now())
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

// Held reports how many credits the relay holds (not yet known credited)
// and the creation time (Unix ms) of the oldest; 0 when none. For
// redcell_cell_credits_pending.
func (r *Relay) Held() (n int, oldestMS int64) {
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, t := range r.dbs {
		for _, p := range t.pending {
			if ms := p.c.CreatedMS; ms > 0 && (oldestMS == 0 || ms < oldestMS) {
				oldestMS = ms
			}
		}
	}
	return r.held, oldestMS
}

// dispatch offers each credit to the lane of its destination and returns how
// many no lane took: its lane is full, backing off or stopping, no room is
// left for another lane, or no live cell owns the claimant's shard. The
// relay holds those and offers them again. scanStart is when the read or
// offer that found them began (zero for fresh claims; see lane.offer). It
// never blocks.
func (r *Relay) dispatch(credits []model.Credit, scanStart time.Time) (left int) {
	local, remote, noOwner := r.cfg.Peers.Map().GroupByOwner(credits, r.cfg.Owns)
	if noOwner > 0 {
		r.Stats.Errors.Add(int64(noOwner)) // no live owner now: held, offered again
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

// loadPositions reads the saved position of each database whose position
// is not known yet, in one call; the claims past it are to be read
// (readClaims). A database without one is read from its first claim.
func (r *Relay) loadPositions(ctx context.Context) {
	r.trackMu.Lock()
	var dbs []int
	for db, t := range r.dbs {
		if !t.loaded {
			dbs = append(dbs, db)
		}
	}
	r.trackMu.Unlock()
	if len(dbs) == 0 {
		return
	}
	slices.Sort(dbs)
	pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	pos, err := storage.RelayPositions(pctx, r.cfg.Store, dbs)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.Stats.Errors.Add(1)
			r.saving.Fail(err, "reading", len(dbs))
		}
		return
	}
	// A read that works ends an incident a failed read began: with the
	// positions read back, nothing may be left to save that would end it.
	r.saving.OK()
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	for _, db := range dbs {
		t, ok := r.dbs[db]
		if !ok || t.loaded {
			continue
		}
		t.loaded, t.saved = true, -1
		from := int64(0)
		if p, ok := pos[db]; ok {
			t.saved, from = p, p
		}
		if !t.read || from < max(t.from, t.cursor.CreatedMS) || t.cursor == (model.ClaimPos{}) {
			t.read, t.from, t.cursor = true, from, model.ClaimPos{}
		}
	}
}

// readClaims reads, for each database whose claims must be read, up to
// ScanPagesMax pages of BatchMax claims past where its reading has got,
// created up to now, holds those it does not hold yet and offers them to
// the lanes; a page not full ends the database's reading. It stops reading
// while the relay holds HeldMax credits.
func (r *Relay) readClaims(ctx context.Context, now time.Time) {
	type job struct {
		db     int
		from   int64
		cursor model.ClaimPos
	}
	var jobs []job
	r.trackMu.Lock()
	for db, t := range r.dbs {
		if t.loaded && t.read {
			jobs = append(jobs, job{db, t.from, t.cursor})
		}
	}
	r.trackMu.Unlock()
	slices.SortFunc(jobs, func(a, b job) int { return a.db - b.db })
	ok := true
	for _, j := range jobs {
		for page := 0; page < ScanPagesMax && ctx.Err() == nil; page++ {
			r.trackMu.Lock()
			full := r.held >= r.heldMax
			r.trackMu.Unlock()
			if full {
				break
			}
			pctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
			cs, next, err := storage.ClaimsAfter(pctx, r.cfg.Store, j.db, j.from, j.cursor, now.UnixMilli(), BatchMax)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					ok = false
					r.Stats.Errors.Add(1)
					r.reading.Fail(err, "db", j.db)
				}
				break
			}
			r.Stats.Reads.Add(1)
			fresh, leftMS := r.hold(cs, now, true)
			if len(fresh) > 0 {
				r.dispatch(fresh, now)
			}
			done := len(cs) < BatchMax
			r.trackMu.Lock()
			t, same := r.dbs[j.db]
			same = same && t.read && t.from == j.from && t.cursor == j.cursor
			if same {
				if j.cursor == (model.ClaimPos{}) {
					t.began = now // the reading's first page: read after now
				}
				switch {
				case leftMS >= 0: // HeldMax: read again from the first claim left out, once there is room
					t.from, t.cursor = leftMS, model.ClaimPos{}
				case done && t.again >= 0 && !(t.againAt.Before(t.began) && t.again >= t.from):
					// Another reading was asked for meanwhile, for claims
					// committed by then, and some page of this one may
					// have been read before: it runs from there.
					t.from, t.cursor, t.again = t.again, model.ClaimPos{}, -1
				case done:
					// Every ask came before this reading's first page,
					// whose pass began after them: its pages saw those
					// claims (committed by then, stamped before).
					t.read, t.cursor, t.again = false, model.ClaimPos{}, -1
				default:
					t.cursor = next
				}
			}
			r.trackMu.Unlock()
			if done || !same || leftMS >= 0 { // !same: a reading from further back began meanwhile, at the next Interval
				break
			}
			j.cursor = next
		}
	}
	if ok {
		r.reading.OK()
	}
}

// reoffer offers the lanes again every held credit not offered for
// reofferIntervals Intervals (no lane took it, or a lane gave it up); a lane
// that holds it already skips it. As it walks every held credit anyway, it
// asserts that the held count is what is pending: held = Σ len(pending).
func (r *Relay) reoffer(now time.Time) {
	cutoff := now.Add(-reofferIntervals * r.cfg.Interval)
	var cs []model.Credit
	r.trackMu.Lock()
	pending := 0
	for _, t := range r.dbs {
		pending += len(t.pending)
		for _, p := range t.pending {
			if p.offered.IsZero() || !p.offered.After(cutoff) {
				p.offered = now
				cs = append(cs, p.c)
			}
		}
	}
	invariant.That(pending == r.held, "relay: the held count differs from the credits pending (held = Σ len(pending) over the databases)")
	r.trackMu.Unlock()
	if len(cs) > 0 {
		slices.SortFunc(cs, func(a, b model.Credit) int { return cmp.Compare(a.CreatedMS, b.CreatedMS) })
		r.dispatch(cs, now)
	}
}

// positionLocked is database t's position at now: Slack before now, and
// never past a claim the relay holds or one a reading under way has not
// reached. r.trackMu is held.
func positionLocked(t *dbTrack, now time.Time) int64 {
	p := now.Add(-Slack).UnixMilli()
	if t.read {
		p = min(p, max(t.from, t.cursor.CreatedMS))
	}
	if t.again >= 0 {
		p = min(p, t.again)
	}
	for _, c := range t.pending {
		p = min(p, c.c.CreatedMS)
	}
	return p
}

// savePositions saves, in one call, the position of every database whose
// position is known and whose claims came or went since the last save
// (never of a database without claims: a save would make its tables),
// inside Config.Enter for those databases (a move's freeze waits for it),
// and only of those the cell still serves then.
func (r *Relay) savePositions(ctx context.Context, now time.Time) {
	r.saveMu.Lock() // one save at a time: a later one never lands before an earlier one
	defer r.saveMu.Unlock()
	pos := map[int]int64{}
	r.trackMu.Lock()
	r.lastSave = now
	for db, t := range r.dbs {
		if t.loaded && t.moved { // a database whose claims never came or went keeps what it has (or none: it is read from its first claim, of which it has none)
			if p := positionLocked(t, now); p != t.saved {
				pos[db] = p
			}
			t.moved = false
		}
	}
	r.trackMu.Unlock()
	if len(pos) == 0 {
		return
	}
	dbs := slices.Sorted(maps.Keys(pos))
	if r.cfg.Enter != nil {
		leave := r.cfg.Enter(dbs)
		defer leave()
	}
	var skipped []int
	for _, db := range dbs {
		if !r.cfg.Owns(model.ShardID(db * 10)) {
			delete(pos, db)
			skipped = append(skipped, db)
		}
	}
	if len(skipped) > 0 { // frozen for a move, say: saved once served again (follow forgets it if it goes)
		r.trackMu.Lock()
		for _, db := range skipped {
			if t, ok := r.dbs[db]; ok {
				t.moved = true
			}
		}
		r.trackMu.Unlock()
	}
	if len(pos) == 0 {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	err := storage.SaveRelayPositions(sctx, r.cfg.Store, pos)
	cancel()
	r.trackMu.Lock()
	defer r.trackMu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			r.Stats.Errors.Add(1)
			r.saving.Fail(err, "databases", len(pos))
		}
		for db := range pos {
			if t, ok := r.dbs[db]; ok {
				t.moved = true // saved at the next try
			}
		}
		return
	}
	r.saving.OK()
	r.Stats.Saves.Add(1)
	for db, p := range pos {
		if t, ok := r.dbs[db]; ok {
			t.saved = p
		}
	}
}

// deliver applies cs at l's destination within ctx and sorts them:
// delivered (applied now or before, each with the Dest to mark it with),
// deferred (a wallet row was locked); any other credit of cs is no longer
// l's to deliver now (the shard map changed, or a question about where it
// went could not be answered: askElsewhere): the relay holds it and offers
// it again. An error means nothing is known to be applied.
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
		// others are offered again, to their new owner.
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

// sentTo sets every credit's Dest to dest, the cell that applied it.
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
// credit that went to another cell before (Credit.Dest, as its claim row
// records it; a row that names no cell gets to recorded first, storage.RecordDest) that cell's copy of the claimant's database (Client.ReconCopy;
// this cell's own copies too, through the same call). A database handed over
// without its rows would otherwise take the credit a second time.
//
//   - Not found there: recorded as sent to to (storage.RecordDest, so that the
//     claim row names where it may be applied) and returned in deliver.
//   - Found there, and to has it too (the database moved with its rows):
//     returned in done with Dest to, acknowledged.
//   - Found there but not at to: returned in done with that Dest,
//     acknowledged; logged at ERROR and counted (Stats.Elsewhere): the
//     money sits in a copy no cell serves; never booked again.
//   - That cell not in the map: nobody to ask (removed, or down; a move
//     needs its source up, so the database came to to by a move that copied
//     its rows): delivered unasked (Stats.Unasked, an incident per cell).
//   - A question that fails (within askTimeout), a record that fails, or a
//     claim held there under another account or amount: in neither; the
//     relay holds the credit (Stats.Held, an incident) and asks about it
//     again.
func (r *Relay) askElsewhere(ctx context.Context, to string, cs []model.Credit) (deliver, done []model.Credit) {
	if !slices.ContainsFunc(cs, func(c model.Credit) bool { return c.Dest != to }) {
		return cs, nil // the common case: each row names to already
	}
	byDest := map[string][]model.Credit{}
	var unnamed []model.Credit // rows that name no cell (no owner when made, an earlier version's): recorded first
	for _, c := range cs {
		switch c.Dest {
		case to:
			deliver = append(deliver, c)
		case "":
			unnamed = append(unnamed, c)
		default:
			byDest[c.Dest] = append(byDest[c.Dest], c)
		}
	}
	if len(unnamed) > 0 {
		if err := r.sendTo(ctx, unnamed, to); err != nil {
			r.Stats.Held.Add(int64(len(unnamed)))
			r.asking.Of("").Fail(err, "credits", len(unnamed), "claim", unnamed[0].ClaimID, "deliver_to", to)
		} else {
			deliver = append(deliver, unnamed...)
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
			r.log.Error("relay credits found applied at a cell that no longer serves the claimants' database, and not where it is served now: not delivered again",
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
// to cell to (storage.RecordDest).
func (r *Relay) sendTo(ctx context.Context, cs []model.Credit, to string) error {
	ctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	defer cancel()
	return storage.SendTo(ctx, r.cfg.Store, cs, to)
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
