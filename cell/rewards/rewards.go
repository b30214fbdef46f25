// Package rewards is a cell's side of the reward wallet's rewards, as
// Douyin ran it for Spring Festival 2022: a reward is issued at once — a
// row in the person's home shard, pending, and a signed token answered to
// the caller — and booked behind by the booker, in bulk and at its own rate
// (Config.BookingRate), so issuance can run far above what the ledger
// books. Budgets never overrun: a scene that controls its stock spends
// leases taken from the scene's home (cell/budget, through Budgets). A
// withdrawal books the person's pending rewards first (BookPending; the
// wallet's routes are cell/wallet's).
//
// An Issuer is built from what it uses: the loaded activities (Activities),
// the token key ring, each space's store (Space), the cell's ownership
// (Ownership), the budgets (Budgets, cell/budgets.Keeper), the group
// committer's submits (Config.Submit, Config.SubmitTake), the degrade
// switches (Switches), the shard map (Peers), the cell's answer writer
// (Answers), a clock, a logger and a metrics registry; it knows nothing of
// the cell's server. It serves the reward routes (Serve), runs each space's
// booker and reward reconciliation and the issued counters' flushes (Run),
// and keeps the reward wallet's metrics.
package rewards

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/cell/degrade"
	"redcell/cell/issued"
	"redcell/cell/rewardtoken"
	"redcell/cell/scenelimit"
	"redcell/internal/climit"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Budgets is the cell's part in the budgets (cell/budgets.Keeper) as the
// rewards use it.
type Budgets interface {
	// Pool is the lease pool of space (0 real, 1 shadow): an issue of a
	// scene that controls its stock Takes from it, and Gives back what it
	// did not store.
	Pool(space int) *budget.Pool
	// SceneTotal is the budget or stock of the scene budget key names in
	// the loaded activities; false when no scene controlling its stock has
	// that key.
	SceneTotal(key string) (int64, bool)
	// Sync sets the budgets this cell homes to a reloaded tree's totals.
	Sync(t *activity.Tree)
	// Issued is the floor of a reload's check of a scene's total
	// (activity.Issued).
	Issued(parent, child, scene string) int64
}

// Switches are the degrade switches (cell/degrade.Switches): the rewards
// read degrade.Booking and degrade.TokenRestore.
type Switches interface {
	Off(sw degrade.Switch) bool
}

// Peers tells which cells are live (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// Answers writes a route's answer: the cell's one answer writer, which
// names the cell in every answer and counts failures.
type Answers interface {
	// JSON answers status with v as its JSON body.
	JSON(rc *fasthttp.RequestCtx, status int, v any)
	// Error answers err with its code's status (api.WriteError).
	Error(rc *fasthttp.RequestCtx, err error)
}

// Ownership is the cell's ownership of shards and databases as the rewards
// read it; every field is required.
type Ownership struct {
	// Account validates an act_id and checks the cell serves its shard.
	// Errors: model.ErrInvalidArgument, model.ErrWrongCell, model.ErrMoving.
	Account func(actID string) (model.ShardID, error)
	// DBs lists the databases the cell serves now, ascending.
	DBs func() []int
	// ServesDB reports whether the cell serves database db now.
	ServesDB func(db int) bool
	// Enter registers background work about to write a database the cell
	// serves, so that a move's freeze waits for it; leave ends it.
	Enter func() (leave func())
}

// Space is one money space of the cell: real money or the shadow tables.
type Space struct {
	Name   string // "real" or "shadow": metric labels and logs
	Stress bool   // its tokens say so (rewardtoken.StatusIssuedStress)
	// Store reads the space's reward rows, wallets and books (the reward
	// queries of storage/ops_rewards.go); its writes go through Submit.
	Store storage.Reader
}

// Config is what an Issuer is built from. Every field is required but
// Ring (nil: no key file, issuing answers NOT_FOUND), IssuedMemcache (nil:
// the issued counters count this cell's issues only), SceneMemcache (nil:
// each cell takes a scene's rate/N), Peers (nil: this cell is the only
// one) and Clock (nil: the system clock).
type Config struct {
	Activities *Activities       // the loaded activities (LoadActivities)
	Ring       *rewardtoken.Ring // signs and checks the tokens (cell.Config.RewardKeys)
	Spaces     [2]Space          // [0] real money, [1] stress traffic
	Own        Ownership         // the cell's shards and databases
	Budgets    Budgets           // the scenes' leases (cell/budgets.Keeper)
	Switches   Switches          // degrade.Booking, degrade.TokenRestore
	Peers      Peers             // the live cells: the scene limits' N without memcached
	Answers    Answers           // writes the answers of the reward routes (Serve)
	Reg        prometheus.Registerer
	Clock      clock.Clock
	Log        *slog.Logger
	// TokenTTL, CashMax (cents), BookingRate (rewards/s), BookingBatch and
	// BookingInterval are the cell's (cell.RewardConfig).
	TokenTTL        time.Duration
	CashMax         int64
	BookingRate     int
	BookingBatch    int
	BookingInterval time.Duration
	// BookTimeout bounds one batch of the booker: its read and its op in
	// the commit lane (the committer's own commit timeout).
	BookTimeout time.Duration
	// IssuedMemcache keeps the issued counters cluster-wide (cell/issued);
	// SceneMemcache keeps each scene's rate limit (cell/scenelimit).
	IssuedMemcache issued.Memcache
	SceneMemcache  climit.CASMemcache
	// Submit runs op (storage.IssueOp, storage.BookOp of given rewards) in
	// the commit lane of database db of space (0 real, 1 shadow) and
	// returns its error; a group still committing when ctx ends wraps
	// storage.ErrCommitUnknown (the op stores under an order number: a
	// retry settles it).
	Submit func(ctx context.Context, space, db int, op storage.MoneyOp) error
	// SubmitTake runs the booker's op (a storage.BookOp with a
	// storage.RewardTake) in the commit lane of database db of space and
	// returns the committer's error as it is (groupcommit.ErrInFlight
	// when ctx ends while its group commits).
	SubmitTake func(ctx context.Context, space, db int, op storage.MoneyOp) error
}

// Issuer is one cell's rewards: issuing and restoring them, their booker
// and reconciliation, the issued counters and scene limits, and the
// metrics. Create it with New, run it with Run; its methods are safe for
// concurrent use.
type Issuer struct {
	cfg      Config
	clock    clock.Clock
	acts     *Activities
	scenes   [2]*scenelimit.Limits // each scene's rate_limit, for the whole cluster, per space
	counters [2]*issued.Counters
	dirty    [2]dirtyDBs // databases with rewards issued here since the booker's last pass
	booked   [2]atomic.Int64
	// booking: the booker's takes and bookings; reads: reward
	// reconciliation's reads. Per space.
	booking, reads [2]*incident.Tracker
	metrics        *metrics
	recon          *reconMetrics
}

// New builds an Issuer and registers its metrics with cfg.Reg; it does no
// I/O. From now on a reload of cfg.Activities checks a scene's total
// against Budgets.Issued and, once swapped in, syncs the budgets and the
// scene limits to the file.
func New(cfg Config) *Issuer {
	clk := clock.Or(cfg.Clock)
	i := &Issuer{cfg: cfg, clock: clk, acts: cfg.Activities}
	every := incident.DefaultEvery
	for n, sp := range cfg.Spaces {
		l := cfg.Log.With("space", sp.Name)
		i.booking[n] = incident.New(l, "reward booking", every)
		i.reads[n] = incident.New(l, "reward reconciliation read", every)
	}
	i.counters[0] = issued.New(cfg.IssuedMemcache, "rc:iss:", cfg.Log)
	i.counters[1] = issued.New(cfg.IssuedMemcache, "s:rc:iss:", cfg.Log)
	i.scenes[0] = scenelimit.New(cfg.SceneMemcache, "rc:scene:", i.liveCells, clk)
	i.scenes[1] = scenelimit.New(cfg.SceneMemcache, "s:rc:scene:", i.liveCells, clk)
	i.acts.issued = cfg.Budgets.Issued
	i.acts.loaded = i.activitiesLoaded
	i.recon = newReconMetrics(cfg.Reg)
	i.metrics = newMetrics(cfg.Reg, i)
	return i
}

// Run runs each space's booker and reward reconciliation, and the issued
// counters' flushes when they have a memcached, until ctx ends; it returns
// once they all have.
func (i *Issuer) Run(ctx context.Context) {
	loops := []func(context.Context){i.booker(0), i.booker(1), i.reconciler(0), i.reconciler(1)}
	if i.cfg.IssuedMemcache != nil {
		for _, c := range i.counters {
			loops = append(loops, func(ctx context.Context) { c.Run(ctx, i.clock) })
		}
	}
	var wg sync.WaitGroup
	for _, run := range loops {
		wg.Go(func() { run(ctx) })
	}
	wg.Wait()
}

// Booked is how many rewards the bookers and forced bookings booked since
// the start, both spaces.
func (i *Issuer) Booked() int64 { return i.booked[0].Load() + i.booked[1].Load() }

// Issued is what space's (0 real, 1 shadow) "issued so far" counter of
// budget key reads (cents or pieces; cell/issued.Counter.Read).
func (i *Issuer) Issued(space int, key string) int64 { return i.counter(space, key).Read() }

// counter is space's issued counter of budget key.
func (i *Issuer) counter(space int, key string) *issued.Counter {
	c, err := i.counters[space].Counter(key)
	if err != nil { // a name the tree's ID rules cannot make
		panic(err)
	}
	return c
}

// activitiesLoaded follows a reload: the budgets this cell homes take the
// file's, and the scene limits forget the scenes the file no longer has
// (a scene's new rate needs nothing: each request reads it from its tree).
func (i *Issuer) activitiesLoaded(t *activity.Tree) {
	i.cfg.Budgets.Sync(t)
	keep := func(key string) bool { return t.SceneByKey(key) != nil }
	for _, l := range i.scenes {
		l.Keep(keep)
	}
}

// liveCells is how many cells the cluster map lists (at least 1): the N of
// the scene limits' fallback, rate/N each while memcached does not answer.
func (i *Issuer) liveCells() int {
	if i.cfg.Peers != nil {
		if m := i.cfg.Peers.Map(); m != nil {
			return max(len(m.Cells()), 1)
		}
	}
	return 1
}

// dirtyDBs is a set of database indexes, taken whole by the booker.
type dirtyDBs struct {
	mu sync.Mutex
	m  map[int]bool
}

func (d *dirtyDBs) mark(db int) {
	d.mu.Lock()
	if d.m == nil {
		d.m = map[int]bool{}
	}
	d.m[db] = true
	d.mu.Unlock()
}

func (d *dirtyDBs) take() map[int]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.m
	d.m = nil
	return m
}
