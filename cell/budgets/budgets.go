// Package budgets is a cell's part in the budgets of the scenes that
// control their stock and in the coupon batches' stock (cell/budget is the
// lease pool it builds on).
//
// A budget's row lives in its home shard (sharding.BudgetShard of
// parent/child/scene, or couponq.StockKey of a batch); the cell owning that
// shard is the budget's home. Each space of each cell holds a budget.Pool:
// it spends leases taken from the homes — from its own store when it owns
// the home shard, else over POST /internal/budget/lease from the owner — and
// gives back what is left when a lease expires (Run's sweep, once a second)
// or the cell drains. As a home, a Keeper answers the three budget routes
// (Serve), marks its rows' leases expired past their TTL, and sets its rows
// from the loaded activities (Sync). As a holder, it settles its leases
// that their homes marked expired, counting what its reward rows spent.
//
// A Keeper is built from what it uses: each space's store (Store), the
// cell-to-cell client (Client), the shard map (Peers), the cell's ownership
// (Config.Owns, Check, Enter, DBs), the loaded activities (Config.Tree), the
// coupon drop's stock (Config.CouponTotal, CouponKeys), a clock and a
// logger; it knows nothing of the cell's server.
package budgets

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/internal/invariant"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// Store is the part of a space's store the budgets read and write: the
// budget ops and queries of package storage (storage/ops_budgets.go).
type Store interface {
	storage.Grouper // storage.SetBudgetTotal, GrantBudgetLease, ReturnBudgetLease, ExpireBudgetLeases
	storage.Reader  // storage.BudgetQuery, HolderLeasesQuery, LeaseSpentQuery
}

// Client sends a signed call to another cell (api/cellclient.Client): the
// budget routes of a home cell. Errors: *cellclient.Error.
type Client interface {
	Send(ctx context.Context, call cellclient.Call) error
}

// Peers tells which cell owns a shard (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// Space is one money space of the cell: real money or the shadow tables.
type Space struct {
	Name   string // "real" or "shadow": logs
	Stress bool   // calls to other cells for it are stress traffic (api.HeaderStress)
	Store  Store
}

// Config is what a Keeper is built from. Every field is required but
// LeaseTTL (0: the pool's default, 60 s), Peers (nil: no other cell is
// known, so budgets homed elsewhere are CELL_UNAVAILABLE), CouponTotal and
// CouponKeys (nil: no coupon drop), SettleMore (nil: nothing more to settle)
// and Clock (nil: the system clock).
type Config struct {
	Cell string // this cell's name: the holder of its reward leases (model.ValidateLeaseHolder)
	// LeaseTTL is how long a pool spends from one lease (the cell's
	// BudgetLeaseTTL; PoolConfig).
	LeaseTTL time.Duration
	Spaces   [2]Space // [0] real money, [1] stress traffic
	// Owns reports whether the cell serves shard sh now (a home shard
	// frozen by a move is not served).
	Owns func(sh model.ShardID) bool
	// Check is Owns with the reason: nil, or model.ErrWrongCell (another
	// cell owns sh) or model.ErrMoving (sh's database is frozen by a move).
	Check func(sh model.ShardID) error
	// Enter registers background work about to write a database the cell
	// serves, so that a move's freeze waits for it; leave ends it.
	Enter func() (leave func())
	// DBs lists the databases the cell serves now, where its reward rows
	// (and so what its leases spent) are.
	DBs    func() []int
	Peers  Peers
	Client Client
	// Answers writes the answers of the budget routes (Serve).
	Answers Answers
	// Tree is the loaded reward activities (nil: none loaded).
	Tree func() *activity.Tree
	// Issued is what the real space's "issued so far" counter of budget
	// key reads (cents or pieces): the floor of a reload's check (Issued).
	Issued func(key string) int64
	// CouponTotal is the stock (pieces) of the coupon batch whose stock row
	// is key, from the loaded batches file; false when key names none.
	CouponTotal func(key string) (int64, bool)
	// CouponKeys lists the stock keys of the loaded coupon batches.
	CouponKeys func() []string
	// SettleMore runs after each pass that settles the cell's own reward
	// leases (the coupon deductions' settlement, SettleExpired).
	SettleMore func(ctx context.Context)
	Clock      clock.Clock
	Log        *slog.Logger
}

// Keeper is one cell's part in the budgets: a lease pool per space, the
// home side of the budgets it homes, and the settlement of its leases.
// Create it with New; its methods are safe for concurrent use.
type Keeper struct {
	cfg   Config
	clock clock.Clock
	pools [2]*budget.Pool
	// leaseExp: a home marking its leases expired; leaseList: a holder
	// listing its expired leases at their home. Per space.
	leaseExp, leaseList [2]*incident.Tracker
}

// SettleGrace is how long past its expiry a lease is settled: longer than a
// request's deadline and the clocks' skew between cells.
const SettleGrace = 10 * time.Second

// settleDelay is how long after start a cell first settles expired leases
// (Recover): time for memberlist to list the other cells.
const settleDelay = 3 * time.Second

// PoolConfig is the lease pool's configuration for a lease TTL (0: the
// default): a lease's fetch is bounded by half its life at most.
func PoolConfig(ttl time.Duration) budget.Config {
	c := budget.Config{TTL: ttl}
	if ttl > 0 {
		c.FetchTimeout = min(budget.DefaultConfig().FetchTimeout, ttl/2)
	}
	return c
}

// New builds a Keeper and its pools; it does no I/O. It panics when
// cfg.Cell is not a valid lease holder or PoolConfig(cfg.LeaseTTL) fails
// Validate (the cell's Config.Validate checks both first).
func New(cfg Config) *Keeper {
	k := &Keeper{cfg: cfg, clock: clock.Or(cfg.Clock)}
	every := incident.DefaultEvery
	for i, sp := range cfg.Spaces {
		l := cfg.Log.With("space", sp.Name)
		k.leaseExp[i] = incident.New(l, "budget lease expiry", every)
		k.leaseList[i] = incident.New(l, "budget: listing expired leases (they stay out meanwhile)", every)
		pc := PoolConfig(cfg.LeaseTTL)
		pc.Reserve = k.sceneReserve
		k.pools[i] = budget.NewPool(cfg.Cell, func(string) budget.Home { return k.Home(i) }, k.clock, pc)
	}
	return k
}

// Pool is the lease pool of space (0 real, 1 shadow): the reward issues
// Take from it and Give back to it.
func (k *Keeper) Pool(space int) *budget.Pool { return k.pools[space] }

// Home is the budget.Home of every budget key as space (0 real, 1 shadow)
// reaches it: this cell's own rows when it owns the key's home shard, else
// the owning cell over the budget routes.
func (k *Keeper) Home(space int) budget.Home {
	invariant.That(space == 0 || space == 1, "budgets: space must be 0 or 1")
	return home{k: k, sp: space}
}

// sceneReserve is budget.Config.Reserve: the reserve_percent of the scene
// key names in the loaded activities (a reload counts from the next lease),
// or the default share when the scene is gone from the file.
func (k *Keeper) sceneReserve(key string, total int64) int64 {
	if t := k.cfg.Tree(); t != nil {
		if sc := t.SceneByKey(key); sc != nil {
			return sc.Reserve(total)
		}
	}
	return (&activity.Scene{}).Reserve(total)
}

// SceneTotal is the budget (cents, cash) or stock (pieces, coupon kinds) of
// the scene budget key names in the loaded activities; false when no scene
// of them that controls its stock has that key.
func (k *Keeper) SceneTotal(key string) (int64, bool) {
	t := k.cfg.Tree()
	if t == nil {
		return 0, false
	}
	sc := t.SceneByKey(key)
	if sc == nil || !sc.ControlStock {
		return 0, false
	}
	return sc.Total(), true
}

// total is the total of budget key from this cell's files: a scene's, else
// a coupon batch's stock.
func (k *Keeper) total(key string) (int64, bool) {
	if total, ok := k.SceneTotal(key); ok {
		return total, true
	}
	if k.cfg.CouponTotal == nil {
		return 0, false
	}
	return k.cfg.CouponTotal(key)
}

// OwnerOf is the address ("host:port") of the live cell owning shard sh.
// Errors: model.ErrCellUnavailable when the shard map lists none.
func (k *Keeper) OwnerOf(sh model.ShardID) (string, error) {
	if k.cfg.Peers != nil {
		if m := k.cfg.Peers.Map(); m != nil {
			if c, ok := m.Owner(sh); ok {
				return c.Addr, nil
			}
		}
	}
	return "", model.Errorf(model.ErrCellUnavailable, "no live cell owns shard %d (a budget's home)", sh)
}

// HomeShard is the home shard of budget key when this cell serves it.
// Errors: model.ErrInvalidArgument (a malformed key), model.ErrWrongCell,
// model.ErrMoving.
func (k *Keeper) HomeShard(key string) (model.ShardID, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return 0, err
	}
	sh := sharding.BudgetShard(key)
	if err := k.cfg.Check(sh); err != nil {
		return 0, err
	}
	return sh, nil
}

// grantLocal grants a lease from this cell's own budget row in store st,
// making the row from req.Total when it has none.
func (k *Keeper) grantLocal(ctx context.Context, st Store, req api.BudgetLeaseRequest) (model.Lease, error) {
	sh := sharding.BudgetShard(req.Key)
	expires := k.clock.Now().Add(time.Duration(req.TTLMS) * time.Millisecond).UnixMilli()
	l, err := storage.GrantLease(ctx, st, sh, req.Key, req.Holder, req.Want, req.Reserve, expires)
	if errors.Is(err, model.ErrNotFound) {
		if _, err := storage.SetBudget(ctx, st, sh, req.Key, req.Total); err != nil {
			return model.Lease{}, err
		}
		l, err = storage.GrantLease(ctx, st, sh, req.Key, req.Holder, req.Want, req.Reserve, expires)
	}
	return l, err
}

// home is the budget.Home of space sp of this cell (Keeper.Home).
type home struct {
	k  *Keeper
	sp int
}

// Grant implements budget.Home. The asking cell's total makes the row when
// the home has none (its activities file may not be loaded yet, or the
// scene was just added): the home row is then set from the file that
// issues against it. Errors: model.ErrNotFound (no scene or coupon batch of
// this cell's files controls key), model.ErrCellUnavailable (no live owner
// of the home shard), the home's (model.ErrBudgetExhausted, ...).
func (h home) Grant(ctx context.Context, key, holder string, want, reserve int64, ttl time.Duration) (model.Lease, error) {
	total, ok := h.k.total(key)
	if !ok {
		return model.Lease{}, model.Errorf(model.ErrNotFound, "no scene or coupon batch controls budget %s in this cell's files", key)
	}
	sp := h.k.cfg.Spaces[h.sp]
	req := api.BudgetLeaseRequest{Key: key, Holder: holder, Want: want, Reserve: reserve, TTLMS: ttl.Milliseconds(), Total: total}
	sh := sharding.BudgetShard(key)
	if h.k.cfg.Owns(sh) {
		return h.k.grantLocal(ctx, sp.Store, req)
	}
	owner, err := h.k.OwnerOf(sh)
	if err != nil {
		return model.Lease{}, err
	}
	var out api.BudgetLease
	err = h.k.cfg.Client.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetLeasePath, Stress: sp.Stress, Body: req, Out: &out})
	if err != nil {
		return model.Lease{}, err
	}
	return model.Lease{ID: out.ID, Key: out.Key, Holder: out.Holder, Amount: out.Amount, State: model.LeaseOpen,
		CreatedMS: out.CreatedMS, ExpiresMS: out.ExpiresMS}, nil
}

// Return implements budget.Home. Errors: model.ErrCellUnavailable (no live
// owner of the home shard), the home's.
func (h home) Return(ctx context.Context, key, leaseID string, unspent int64) error {
	sp := h.k.cfg.Spaces[h.sp]
	sh := sharding.BudgetShard(key)
	if h.k.cfg.Owns(sh) {
		_, err := storage.ReturnLease(ctx, sp.Store, sh, leaseID, unspent)
		return err
	}
	owner, err := h.k.OwnerOf(sh)
	if err != nil {
		return err
	}
	return h.k.cfg.Client.Send(ctx, cellclient.Call{Addr: owner, Path: api.BudgetReturnPath, Stress: sp.Stress,
		Body: api.BudgetReturnRequest{Key: key, LeaseID: leaseID, Unspent: unspent}})
}
