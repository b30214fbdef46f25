// Package coupons is a cell's side of the coupon drop (cell.Config.Coupons),
// as Douyin Pay ran its Spring Festival one: a request is stored in the
// person's cell and answered 202 at once; each space's engine (cell/couponq)
// decides it behind, in two layers of local queues paced by cluster-wide
// limits (internal/climit), deducting each batch's stock once per merge from
// the batch's home cell. A batch's stock is a budget row (couponq.StockKey)
// in its home shard (sharding.BudgetShard), deducted by leases with no
// reserve under the holder name Drop.Holder, so that a lease whose issue
// lost its answer is settled by counting its coupons, never by reward rows.
//
// A Drop is built from what it uses: each space's stores (Store), the
// budgets' homes and settlement (Budgets, cell/budgets.Keeper), the cell's
// ownership (Ownership), the group committer's submit for accepts
// (Config.Submit), the cell-to-cell client (Client), the shard map (Peers),
// the cell's answer writer (Answers), a clock, a logger and a metrics
// registry; it knows nothing of the cell's server. It serves the coupon
// routes (Serve) and the admin port's coupon routes (admin.Coupons).
package coupons

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api/cellclient"
	"redcell/cell/budget"
	"redcell/cell/couponbatch"
	"redcell/cell/couponq"
	"redcell/internal/climit"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Store is the part of a space's store the drop reads and writes: the
// budget ops and queries of the batches' stock rows (storage/ops_budgets.go)
// and the coupon ops and queries (storage/ops_coupons.go; couponq.Store).
type Store interface {
	storage.Grouper
	storage.Reader
}

// Budgets is the cell's part in the budgets (cell/budgets.Keeper) as the
// drop uses it: a batch's stock row is a budget homed in its home shard.
type Budgets interface {
	// Home is the budget.Home of every budget key as space (0 real, 1
	// shadow) reaches it: this cell's rows or the owning cell's.
	Home(space int) budget.Home
	// OwnerOf is the address of the live cell owning shard sh. Errors:
	// model.ErrCellUnavailable.
	OwnerOf(sh model.ShardID) (string, error)
	// HomeShard is the home shard of budget key when this cell serves it.
	// Errors: model.ErrInvalidArgument, model.ErrWrongCell, model.ErrMoving.
	HomeShard(key string) (model.ShardID, error)
	// SettleExpired settles holder's leases of key that their home marked
	// expired, returning what spent says each did not spend.
	SettleExpired(ctx context.Context, space int, key, holder string, spent func(leaseID string) (int64, error))
}

// Client sends a signed call to another cell (api/cellclient.Client): the
// stock route of a batch's home. Errors: *cellclient.Error.
type Client interface {
	Send(ctx context.Context, call cellclient.Call) error
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

// Ownership is the cell's ownership of shards and databases as the drop
// reads it; every field is required.
type Ownership struct {
	// Owns reports whether the cell serves shard sh now.
	Owns func(sh model.ShardID) bool
	// Check is Owns with the reason: nil, model.ErrWrongCell or
	// model.ErrMoving.
	Check func(sh model.ShardID) error
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
	Name   string // "real" or "shadow": logs and metric labels
	Stress bool   // calls to other cells for it are stress traffic (api.HeaderStress)
	// Store is the space's store, where the batches' stock rows are.
	Store Store
	// Coupons holds the space's coupon requests and coupons, over the same
	// databases.
	Coupons Store
}

// Config is what a Drop is built from. Every field is required but Peers
// (nil: this cell is the only one the layer limits count), Memcache (nil:
// each layer limits at its rate/N locally), Paused (nil: never) and Clock
// (nil: the system clock).
type Config struct {
	Cell string // this cell's name: its deductions' holder is Cell + "/coupons"
	Path string // the batches file (cell/couponbatch), read by New and each reload
	// LeaseTTL is the cell's reward leases' TTL (cell.Config.BudgetLeaseTTL);
	// a deduction's lease lives at least that long (LeaseTTL).
	LeaseTTL time.Duration
	Spaces   [2]Space // [0] real money, [1] stress traffic
	// Rates are the cluster-wide rates of the two layers, requests/s.
	Rates [2]int
	// QueueLen, Gather, MergeMax, Prefetch (units) and StaleAfter are each
	// space's engine's (couponq.Config).
	QueueLen   int
	Gather     [2]time.Duration
	MergeMax   int
	Prefetch   int64
	StaleAfter time.Duration
	// Memcache keeps the layers' cluster-wide token pools.
	Memcache climit.Memcache
	Own      Ownership
	Budgets  Budgets
	// Submit runs op in the commit lane of database db of space (0 real, 1
	// shadow) and returns its error; a group still committing when ctx
	// ends wraps storage.ErrCommitUnknown.
	Submit func(ctx context.Context, space, db int, op storage.MoneyOp) error
	Peers  Peers
	Client Client
	// Answers writes the answers of the coupon routes (Serve).
	Answers Answers
	// Paused reports whether the coupon_issue switch is off: requests are
	// accepted and wait.
	Paused func() bool
	Reg    prometheus.Registerer
	Clock  clock.Clock
	Log    *slog.Logger
}

// Drop is one cell's coupon drop: the batches file, an engine and the two
// layer limiters per space, and the metrics. Create it with New, run it
// with Run; its methods are safe for concurrent use.
type Drop struct {
	cfg     Config
	clock   clock.Clock
	holder  couponbatch.Holder
	engines [2]*couponq.Engine
	limits  [2][2]*climit.Limiter // [space][layer]
	metrics *metrics
}

// New loads the batches file and builds an engine per space; it reads
// nothing else. Errors: the file's (an invalid one stops the cell), and a
// layer limiter's (a rate below 1).
func New(cfg Config) (*Drop, error) {
	d := &Drop{cfg: cfg, clock: clock.Or(cfg.Clock)}
	if _, err := d.holder.Reload(cfg.Path, d.clock.Now(), nil); err != nil {
		return nil, err
	}
	d.metrics = newMetrics(cfg.Reg, d)
	for i, sp := range cfg.Spaces {
		prefix := "rc:lim:"
		if sp.Stress {
			prefix = "s:rc:lim:"
		}
		for layer := range 2 {
			l, err := climit.New(climit.Config{Name: fmt.Sprintf("coupon-layer%d", layer+1), Prefix: prefix, Rate: cfg.Rates[layer],
				Cells: d.cells}, cfg.Memcache, d.clock)
			if err != nil {
				return nil, err
			}
			d.limits[i][layer] = l
		}
		accept := func(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error) {
			return d.accept(ctx, i, r)
		}
		st := stock{d: d, space: i}
		e, err := couponq.New(couponq.Config{Store: moving{Store: sp.Coupons, own: cfg.Own}, Accept: accept, Stock: st, Catalog: d.holder.Catalog,
			Layer1: d.limits[i][0], Layer2: d.limits[i][1], DBs: cfg.Own.DBs, QueueLen: cfg.QueueLen,
			Gather: cfg.Gather, MergeMax: cfg.MergeMax, Prefetch: cfg.Prefetch, StaleAfter: cfg.StaleAfter, Observe: d.metrics.observer(sp.Name),
			Paused: cfg.Paused, Levels: st.Levels, Clock: d.clock, Log: cfg.Log.With("space", sp.Name)})
		if err != nil {
			return nil, err
		}
		d.engines[i] = e
	}
	return d, nil
}

// cells is the number of live cells the layer limits split their rates by:
// the shard map's, at least 1.
func (d *Drop) cells() int {
	if d.cfg.Peers != nil {
		if m := d.cfg.Peers.Map(); m != nil {
			return max(len(m.Cells()), 1)
		}
	}
	return 1
}

// Holder is the lease holder name of this cell's coupon deductions.
func (d *Drop) Holder() string { return d.cfg.Cell + "/coupons" }

// LeaseTTL is how long a deduction's lease lives at its home if its
// holder never returns it (an issue whose COMMIT lost its answer): the
// reward leases' TTL (Config.LeaseTTL), but never less than two coupon
// steps past the oldest a held lease is deducted from
// (couponq.HeldMaxAge). A step (the grant, the issue and the return) ends
// within couponq.StepTimeout of its start, so no issue can still be writing
// coupons of a lease its holder settles (budgets.SettleGrace past the
// lease's expiry at its home).
func (d *Drop) LeaseTTL() time.Duration {
	return max(d.cfg.LeaseTTL, couponq.HeldMaxAge+2*couponq.StepTimeout)
}

// accept stores a coupon request of space, whatever the open strategy, as
// one op of its database's commit lane (storage.AcceptOp: the accepts of
// many people share one multi-row INSERT per database and one COMMIT; an
// accept alone is its INSERT in autocommit). Its answers are
// AcceptCoupon's; a group still committing when ctx ends leaves the outcome
// unknown, as a lost COMMIT answer does (ErrCommitUnknown: a retry with the
// serial settles it).
func (d *Drop) accept(ctx context.Context, space int, r model.CouponRequest) (model.CouponRequest, bool, error) {
	op := &storage.AcceptOp{Coupon: r}
	if err := d.cfg.Submit(ctx, space, r.Shard.DB(), op); err != nil {
		return model.CouponRequest{}, false, err
	}
	return op.Accepted, op.Repeat, nil
}

// StockTotal is the stock (pieces) of the batch whose stock row is key,
// from the loaded batches file (budgets.Keeper.Home's Grant makes the home
// row from it); false when key names none. A nil Drop (no coupon drop) has
// none.
func (d *Drop) StockTotal(key string) (int64, bool) {
	id, ok := strings.CutPrefix(key, model.CouponStockPrefix)
	if !ok || d == nil {
		return 0, false
	}
	cat := d.holder.Catalog()
	if cat == nil {
		return 0, false
	}
	b, ok := cat.Batch(id)
	return b.Stock, ok
}

// StockKeys lists the stock keys of the loaded batches; none for a nil
// Drop.
func (d *Drop) StockKeys() []string {
	if d == nil {
		return nil
	}
	cat := d.holder.Catalog()
	if cat == nil {
		return nil
	}
	var keys []string
	for _, b := range cat.Batches() {
		keys = append(keys, couponq.StockKey(b.ID))
	}
	return keys
}

// syncStock sets the stock rows this cell homes to the file's stock, in
// both spaces; a stock below what is out is refused by the store and
// logged. It waits at most 10 s in all.
func (d *Drop) syncStock(cat *couponbatch.Catalog) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range cat.Batches() {
		key := couponq.StockKey(b.ID)
		sh := sharding.BudgetShard(key)
		if !d.cfg.Own.Owns(sh) {
			continue
		}
		for _, sp := range d.cfg.Spaces {
			if _, err := storage.SetBudget(ctx, sp.Store, sh, key, b.Stock); err != nil {
				d.cfg.Log.Warn("coupons: stock not set from the batches file", "batch", b.ID, "stock", b.Stock, "space", sp.Name, "err", err)
			}
		}
	}
}

// issued is couponbatch.Issued for a reload's check: for a batch whose
// stock this cell homes, what its deductions hold or spent (pieces); 0
// elsewhere (the home cell's check is the one that binds), and when its row
// cannot be read within 2 s.
func (d *Drop) issued(batch string) int64 {
	key := couponq.StockKey(batch)
	sh := sharding.BudgetShard(key)
	if !d.cfg.Own.Owns(sh) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, _, err := storage.Budget(ctx, d.cfg.Spaces[0].Store, sh, key)
	if err != nil {
		return 0
	}
	return b.Outstanding()
}

// SettleLeases returns what this cell's coupon deductions that their homes
// marked expired did not spend, counting their coupons
// (storage.CouponLeaseSpentQuery over the cell's databases): a deduction
// whose issue lost its answer, or whose holder died between the grant and
// the return, gives back its rest once it is budgets.SettleGrace past its
// expiry, when no issue can still spend it. A nil Drop settles nothing.
func (d *Drop) SettleLeases(ctx context.Context) {
	if d == nil {
		return
	}
	dbs := d.cfg.Own.DBs()
	for i, sp := range d.cfg.Spaces {
		st := sp.Coupons
		for _, key := range d.StockKeys() {
			d.cfg.Budgets.SettleExpired(ctx, i, key, d.Holder(), func(id string) (int64, error) { return storage.CouponLeaseSpent(ctx, st, dbs, id) })
		}
	}
}

// Run runs the engines until ctx ends (they release what is queued), after
// setting the stock rows this cell homes from the loaded file.
func (d *Drop) Run(ctx context.Context) {
	if cat := d.holder.Catalog(); cat != nil {
		d.syncStock(cat)
	}
	done := make(chan struct{}, 2)
	for _, e := range d.engines {
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	<-done
	<-done
}
