package cell

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/budget"
	"redcell/cell/couponbatch"
	"redcell/cell/couponq"
	"redcell/cell/degrade"
	"redcell/internal/climit"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// The coupon drop (Config.Coupons), as Douyin Pay ran its Spring Festival
// one: a request is stored in the person's cell and answered 202 at once;
// each space's engine (cell/couponq) decides it behind, in two layers of
// local queues paced by cluster-wide limits (internal/climit), deducting each
// batch's stock once per merge from the batch's home cell. A batch's stock
// is a budget row (couponq.StockKey) in its home shard
// (sharding.BudgetShard), deducted by leases with no reserve under the
// holder name couponHolder, so that a lease whose issue lost its answer is
// settled by counting its coupons, never by reward rows.

// coupons is the cell's coupon state; nil on the Server when no batches
// file is configured.
type coupons struct {
	path    string
	holder  couponbatch.Holder
	stores  [2]couponq.Store // by space index
	engines [2]*couponq.Engine
	limits  [2][2]*climit.Limiter // [space][layer]
	metrics *couponMetrics
}

// couponHolder is the lease holder name of this cell's coupon deductions.
func (s *Server) couponHolder() string { return s.cfg.Name + "/coupons" }

// couponLeaseTTL is how long a deduction's lease lives at its home if its
// holder never returns it (an issue whose COMMIT lost its answer): the
// reward leases' TTL, but never less than two coupon steps past the
// oldest a held lease is deducted from (couponq.HeldMaxAge). A step (the
// grant, the issue and the return) ends within couponq.StepTimeout of its
// start, so no issue can still be writing coupons of a lease its holder
// settles (budgets.SettleGrace past the lease's expiry at its home).
func (s *Server) couponLeaseTTL() time.Duration {
	return max(s.cfg.BudgetLeaseTTL, couponq.HeldMaxAge+2*couponq.StepTimeout)
}

// newCoupons loads the batches file and builds an engine per space. The
// file is read once here: an invalid one stops the cell.
func (s *Server) newCoupons(stores [2]couponq.Store, reg *prometheus.Registry) (*coupons, error) {
	cp := &coupons{path: s.cfg.Coupons, stores: stores}
	if _, err := cp.holder.Reload(cp.path, s.clock.Now(), nil); err != nil {
		return nil, err
	}
	cp.metrics = newCouponMetrics(reg, cp)
	cells := func() int {
		if s.peers != nil {
			if m := s.peers.Map(); m != nil {
				return max(len(m.Cells()), 1)
			}
		}
		return 1
	}
	for i, sp := range s.spaces {
		prefix := "rc:lim:"
		if sp.stress {
			prefix = "s:rc:lim:"
		}
		for layer := range 2 {
			l, err := climit.New(climit.Config{Name: fmt.Sprintf("coupon-layer%d", layer+1), Prefix: prefix, Rate: s.cfg.CouponRates[layer],
				Cells: cells}, s.cfg.CouponMemcache, s.clock)
			if err != nil {
				return nil, err
			}
			cp.limits[i][layer] = l
		}
		accept := func(ctx context.Context, r model.CouponRequest) (model.CouponRequest, bool, error) {
			return s.acceptGrouped(ctx, sp, r)
		}
		e, err := couponq.New(couponq.Config{Store: movingCoupons{Store: stores[i], own: s.own}, Accept: accept, Stock: couponStock{s: s, sp: sp}, Catalog: cp.holder.Catalog,
			Layer1: cp.limits[i][0], Layer2: cp.limits[i][1], DBs: s.own.dbs, QueueLen: s.cfg.CouponQueueLen,
			Gather: s.cfg.CouponGather, MergeMax: s.cfg.CouponMergeMax, Prefetch: int64(s.cfg.CouponPrefetch), StaleAfter: s.cfg.CouponStaleAfter, Observe: cp.metrics.observer(sp.name),
			Paused: func() bool { return s.switches.Off(degrade.CouponIssue) },
			Levels: couponStock{s: s, sp: sp}.Levels,
			Clock:  s.clock, Log: s.log.With("space", sp.name)})
		if err != nil {
			return nil, err
		}
		cp.engines[i] = e
	}
	return cp, nil
}

// acceptGrouped stores a coupon request, whatever the open strategy, as one
// op of its database's commit lane (storage.AcceptOp: the accepts of many people share one multi-row
// INSERT per database and one COMMIT; an accept alone is its INSERT in autocommit). Its answers are AcceptCoupon's; a
// group still committing when ctx ends leaves the outcome unknown, as a lost
// COMMIT answer does (ErrCommitUnknown: a retry with the serial settles it).
func (s *Server) acceptGrouped(ctx context.Context, sp *space, r model.CouponRequest) (model.CouponRequest, bool, error) {
	op := &storage.AcceptOp{Coupon: r}
	if err := s.submitStore(ctx, sp, r.Shard.DB(), op); err != nil {
		return model.CouponRequest{}, false, err
	}
	return op.Accepted, op.Repeat, nil
}

// couponStock is couponq.Stock for space sp: the deduction is a lease of
// the batch's stock row at its home, this cell's or another's
// (budgets.Keeper.Home), with no reserve.
type couponStock struct {
	s  *Server
	sp *space
}

func (c couponStock) home(batch string) (budget.Home, string) {
	return c.s.budgets.Home(c.sp.index()), couponq.StockKey(batch)
}

// Grant implements couponq.Stock: none left is 0 units, no error.
func (c couponStock) Grant(ctx context.Context, batch string, want int64) (string, int64, error) {
	h, key := c.home(batch)
	l, err := h.Grant(ctx, key, c.s.couponHolder(), want, 0, c.s.couponLeaseTTL())
	if errors.Is(err, model.ErrBudgetExhausted) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	return l.ID, l.Amount, nil
}

// Return implements couponq.Stock.
func (c couponStock) Return(ctx context.Context, batch, leaseID string, unused int64) error {
	h, key := c.home(batch)
	return h.Return(ctx, key, leaseID, unused)
}

// couponStockMax bounds the batches of one POST /internal/coupons/stock.
const couponStockMax = 1000

// Levels is couponq.Config.Levels for space sp: the batches this cell homes
// read from its store, the others asked of their home cells, one call per
// home, side by side. A batch with no stock row yet, or whose home did not
// answer, is left out; the errors are joined.
func (c couponStock) Levels(ctx context.Context, batches []string) (map[string]couponq.Level, error) {
	out := map[string]couponq.Level{}
	byHome := map[string][]string{}
	var errs []error
	for _, b := range batches {
		key := couponq.StockKey(b)
		sh := sharding.BudgetShard(key)
		if !c.s.Owns(sh) {
			owner, err := c.s.budgets.OwnerOf(sh)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			byHome[owner] = append(byHome[owner], b)
			continue
		}
		l, ok, err := c.s.couponLevel(ctx, c.sp, b)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			out[b] = couponq.Level{Left: l.Left, Held: l.Held}
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for home, bs := range byHome {
		for len(bs) > 0 {
			part := bs[:min(len(bs), couponStockMax)]
			bs = bs[len(part):]
			wg.Go(func() {
				var resp api.CouponStockResponse
				err := c.s.calls.Send(ctx, cellclient.Call{Addr: home, Path: api.CouponStockPath, Stress: c.sp.stress,
					Body: api.CouponStockRequest{Batches: part}, Out: &resp})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("stock of %d batches at %s: %w", len(part), home, err))
					return
				}
				for _, l := range resp.Stock {
					out[l.Batch] = couponq.Level{Left: l.Left, Held: l.Held}
				}
			})
		}
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// couponLevel reads batch's stock at this cell, its home: false when it
// has no stock row yet.
func (s *Server) couponLevel(ctx context.Context, sp *space, batch string) (api.CouponStockLevel, bool, error) {
	key := couponq.StockKey(batch)
	b, held, err := storage.BudgetLevel(ctx, sp.store, sharding.BudgetShard(key), key)
	if errors.Is(err, model.ErrNotFound) {
		return api.CouponStockLevel{}, false, nil
	}
	if err != nil {
		return api.CouponStockLevel{}, false, err
	}
	return api.CouponStockLevel{Batch: batch, Total: b.Total, Left: b.Available(0), Held: held}, true, nil
}

// couponStockAnswer answers POST /internal/coupons/stock: the stock of the
// asked batches this cell homes and has a row of; the others are left out
// (the asker's map may be older than a move). Errors: INVALID_ARGUMENT
// (more than couponStockMax batches, or a malformed ID), the store's.
func (s *Server) couponStockAnswer(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var req api.CouponStockRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if len(req.Batches) > couponStockMax {
		s.answers.err(rc, model.Invalidf("at most %d batches per call, got %d", couponStockMax, len(req.Batches)))
		return
	}
	out := api.CouponStockResponse{Stock: make([]api.CouponStockLevel, 0, len(req.Batches))}
	for _, b := range req.Batches {
		if _, err := s.budgets.HomeShard(couponq.StockKey(b)); errors.Is(err, model.ErrInvalidArgument) {
			s.answers.err(rc, err)
			return
		} else if err != nil {
			continue // not homed here, or frozen by a move
		}
		l, ok, err := s.couponLevel(ctx, sp, b)
		if err != nil {
			s.answers.err(rc, err)
			return
		}
		if ok {
			out.Stock = append(out.Stock, l)
		}
	}
	s.answers.json(rc, http.StatusOK, out)
}

// couponTotal is the stock of the batch whose stock row is key, from the
// loaded batches file (budgets.Keeper.Home's Grant makes the home row from
// it).
func (s *Server) couponTotal(key string) (int64, bool) {
	id, ok := strings.CutPrefix(key, model.CouponStockPrefix)
	if !ok || s.cp == nil {
		return 0, false
	}
	cat := s.cp.holder.Catalog()
	if cat == nil {
		return 0, false
	}
	b, ok := cat.Batch(id)
	return b.Stock, ok
}

// couponKeys lists the stock keys of the loaded batches.
func (s *Server) couponKeys() []string {
	if s.cp == nil {
		return nil
	}
	cat := s.cp.holder.Catalog()
	if cat == nil {
		return nil
	}
	var keys []string
	for _, b := range cat.Batches() {
		keys = append(keys, couponq.StockKey(b.ID))
	}
	return keys
}

// syncCouponStock sets the stock rows this cell homes to the file's
// stock, in both spaces; a stock below what is out is refused by the store
// and logged.
func (s *Server) syncCouponStock(cat *couponbatch.Catalog) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range cat.Batches() {
		key := couponq.StockKey(b.ID)
		sh := sharding.BudgetShard(key)
		if !s.Owns(sh) {
			continue
		}
		for _, sp := range s.spaces {
			if _, err := storage.SetBudget(ctx, sp.store, sh, key, b.Stock); err != nil {
				s.log.Warn("coupons: stock not set from the batches file", "batch", b.ID, "stock", b.Stock, "space", sp.name, "err", err)
			}
		}
	}
}

// couponIssued is couponbatch.Issued for a reload's check: for a batch
// whose stock this cell homes, what its deductions hold or spent; 0
// elsewhere (the home cell's check is the one that binds).
func (s *Server) couponIssued(batch string) int64 {
	key := couponq.StockKey(batch)
	sh := sharding.BudgetShard(key)
	if !s.Owns(sh) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, _, err := storage.Budget(ctx, s.spaces[0].store, sh, key)
	if err != nil {
		return 0
	}
	return b.Outstanding()
}

// settleCouponLeases returns what this cell's coupon deductions that their
// homes marked expired did not spend, counting their coupons
// (storage.CouponLeaseSpentQuery over the cell's databases): a
// deduction whose issue lost its answer, or whose holder died between the
// grant and the return, gives back its rest once it is budgets.SettleGrace
// past its expiry, when no issue can still spend it.
func (s *Server) settleCouponLeases(ctx context.Context) {
	if s.cp == nil {
		return
	}
	dbs := s.own.dbs()
	for i, st := range s.cp.stores {
		for _, key := range s.couponKeys() {
			s.budgets.SettleExpired(ctx, i, key, s.couponHolder(), func(id string) (int64, error) { return storage.CouponLeaseSpent(ctx, st, dbs, id) })
		}
	}
}

// runCoupons runs the engines until ctx ends (they release what is queued),
// after setting the stock rows this cell homes.
func (s *Server) runCoupons(ctx context.Context) {
	if cat := s.cp.holder.Catalog(); cat != nil {
		s.syncCouponStock(cat)
	}
	done := make(chan struct{}, 2)
	for _, e := range s.cp.engines {
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	<-done
	<-done
}

// CouponBatches implements admin.Coupons.
func (s *Server) CouponBatches() api.CouponBatchesResponse {
	return s.describeCoupons(s.cp.holder.Catalog())
}

// ReloadCoupons implements admin.Coupons: an invalid file, or one that
// lowers a batch below what it issued, is INVALID_ARGUMENT with every
// problem, and the loaded batches stay.
func (s *Server) ReloadCoupons() (api.CouponBatchesResponse, error) {
	cat, err := s.cp.holder.Reload(s.cp.path, s.clock.Now(), s.couponIssued)
	if err != nil {
		return api.CouponBatchesResponse{}, model.Errorf(model.ErrInvalidArgument, "%v (the loaded batches stay)", err)
	}
	s.syncCouponStock(cat)
	s.cp.metrics.seed(cat)
	return s.describeCoupons(cat), nil
}

// SetCoupons implements admin.Coupons.
func (s *Server) SetCoupons(set api.CouponSetting) (api.CouponBatchesResponse, error) {
	if set.MergeMax < 1 || set.MergeMax > 1000 {
		return api.CouponBatchesResponse{}, model.Invalidf("merge_max must be 1..1000, got %d", set.MergeMax)
	}
	if set.Prefetch != nil && (*set.Prefetch < 0 || *set.Prefetch > 10000) {
		return api.CouponBatchesResponse{}, model.Invalidf("prefetch must be 0..10000, got %d", *set.Prefetch)
	}
	for _, e := range s.cp.engines {
		e.SetMergeMax(set.MergeMax)
		if set.Prefetch != nil {
			e.SetPrefetch(int64(*set.Prefetch))
		}
	}
	return s.describeCoupons(s.cp.holder.Catalog()), nil
}

func (s *Server) describeCoupons(cat *couponbatch.Catalog) api.CouponBatchesResponse {
	out := api.CouponBatchesResponse{Batches: []api.CouponBatch{}}
	e := s.cp.engines[0]
	out.Accepted, out.Issued, out.Refused = e.Stats.Accepted.Load(), e.Stats.Issued.Load(), e.Stats.Refused.Load()
	out.Queue1, out.Queue2 = e.Depths()
	out.MergeMax, out.Prefetch = e.MergeMax(), int(e.Prefetch())
	if cat == nil {
		return out
	}
	out.Loaded, out.Path, out.Version, out.LoadedMS = true, cat.Path, cat.Version, cat.Loaded.UnixMilli()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, b := range cat.Batches() {
		cb := api.CouponBatch{ID: b.ID, Stock: b.Stock, FaceValue: b.FaceValue, PerPersonLimit: b.PerPersonLimit, Group: b.Group}
		if b.Start != nil {
			cb.StartMS = b.Start.UnixMilli()
		}
		if b.End != nil {
			cb.EndMS = b.End.UnixMilli()
		}
		key := couponq.StockKey(b.ID)
		if sh := sharding.BudgetShard(key); s.Owns(sh) {
			cb.Home = true
			if row, ls, err := storage.Budget(ctx, s.spaces[0].store, sh, key); err == nil {
				out := row.Outstanding()
				for _, l := range ls {
					if l.State == model.LeaseOpen || l.State == model.LeaseExpired {
						cb.Out += l.Amount
					}
				}
				cb.Spent = out - cb.Out
				cb.Left = row.Total - out
			}
		}
		out.Batches = append(out.Batches, cb)
	}
	return out
}

// couponsOff answers a coupon route on a cell without batches.
var couponsOff = model.Errorf(model.ErrCouponsDisabled, "this cluster runs no coupon batches (cell.coupons in the config)")

// couponApp is the calling app of a coupon request, as the router set it
// from the caller's API key (api.HeaderApp); "" when none was set.
func couponApp(rc *fasthttp.RequestCtx) string { return string(rc.Request.Header.Peek(api.HeaderApp)) }

// couponIssue answers POST /v1/coupons/issue: the request is stored
// (accepted) and answered 202, or with its final state (200) on the green
// channel and for a repeat of a serial. Errors: COUPONS_DISABLED,
// INVALID_ARGUMENT, NOT_FOUND (no such batch), ORDER_CONFLICT (the serial
// was used for another person or batch), WRONG_CELL, and the store's.
func (s *Server) couponIssue(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	if s.cp == nil {
		s.answers.err(rc, couponsOff)
		return
	}
	var req api.CouponIssueRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	sh, err := s.own.account(req.ActID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	r := model.CouponRequest{App: couponApp(rc), Serial: req.SerialNo, ActID: req.ActID, Shard: sh, Batch: req.BatchID,
		Green: req.Green, DeviceID: req.DeviceID, ClientIP: req.ClientIP}
	if err := model.ValidateCouponRequest(r); err != nil {
		s.answers.err(rc, err)
		return
	}
	if cat := s.cp.holder.Catalog(); cat == nil {
		s.answers.err(rc, couponsOff)
		return
	} else if _, ok := cat.Batch(req.BatchID); !ok {
		s.answers.err(rc, model.Errorf(model.ErrNotFound, "no coupon batch %q", req.BatchID))
		return
	}
	got, repeat, err := s.cp.engines[sp.index()].Accept(ctx, r)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	status := http.StatusAccepted
	if repeat || req.Green || got.State.Final() {
		status = http.StatusOK
	}
	out := couponState(got)
	out.Repeat = &repeat
	s.answers.json(rc, status, out)
}

func couponState(r model.CouponRequest) api.CouponRequestState {
	return api.CouponRequestState{SerialNo: r.Serial, ActID: r.ActID, BatchID: r.Batch, State: string(r.State), Reason: string(r.Reason),
		CouponID: r.CouponID, AcceptedMS: r.AcceptedMS, DecidedMS: r.DecidedMS}
}

// couponRequestState answers GET /v1/coupons/issue/{serial_no}?act_id=.
// Errors: COUPONS_DISABLED, INVALID_ARGUMENT, NOT_FOUND (no request of this
// app with the serial for the act_id), WRONG_CELL.
func (s *Server) couponRequestState(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, serial string) {
	if s.cp == nil {
		s.answers.err(rc, couponsOff)
		return
	}
	actID := string(rc.QueryArgs().Peek("act_id"))
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	app := couponApp(rc)
	// The serial is checked as a request's would be (the batch is no part of it).
	if err := model.ValidateCouponRequest(model.CouponRequest{App: app, Serial: serial, ActID: actID, Shard: sh, Batch: "x"}); err != nil {
		s.answers.err(rc, err)
		return
	}
	got, err := storage.CouponRequestOf(ctx, s.cp.stores[sp.index()], sh, app, serial)
	if err == nil && got.ActID != actID {
		err = model.ErrNotFound
	}
	if errors.Is(err, model.ErrNotFound) {
		s.answers.err(rc, model.Errorf(model.ErrNotFound, "no coupon request %s for act_id %s", serial, actID))
		return
	}
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, couponState(got))
}

// couponsOf answers GET /v1/accounts/{act_id}/coupons[?cursor=&limit=]:
// the person's coupons, newest first, at most ?limit= (1..100, default
// 100), after ?cursor= (a next_cursor this route gave); next_cursor is set
// while more are left. Errors: COUPONS_DISABLED, INVALID_ARGUMENT (act_id,
// cursor, limit), WRONG_CELL, and the store's.
func (s *Server) couponsOf(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	if s.cp == nil {
		s.answers.err(rc, couponsOff)
		return
	}
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	after, err := model.ParseFlowCursor(string(rc.QueryArgs().Peek("cursor")))
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	limit := 100
	if v := rc.QueryArgs().Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > 100 {
			s.answers.err(rc, model.Invalidf("limit must be 1..100"))
			return
		}
		limit = n
	}
	// One more than asked: whether a next page exists.
	cs, err := storage.CouponsOf(ctx, s.cp.stores[sp.index()], sh, actID, after, limit+1)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	cat := s.cp.holder.Catalog()
	out := api.CouponsResponse{ActID: actID, Coupons: make([]api.Coupon, 0, min(len(cs), limit))}
	if len(cs) > limit {
		cs = cs[:limit]
		last := cs[limit-1]
		out.NextCursor = model.FlowCursor{CreatedMS: last.IssuedMS, ID: last.ID}.String()
	}
	for _, c := range cs {
		item := api.Coupon{CouponID: c.ID, BatchID: c.Batch, BatchGroup: c.Group, SerialNo: c.Serial, IssuedMS: c.IssuedMS}
		if cat != nil {
			if b, ok := cat.Batch(c.Batch); ok {
				item.FaceValue = b.FaceValue
			}
		}
		out.Coupons = append(out.Coupons, item)
	}
	s.answers.json(rc, http.StatusOK, out)
}

// movingCoupons is the coupon engine's store, kept off databases a move froze
// or handed over: each coupon op (storage.CouponTake, CouponIssue,
// CouponRefusal, CouponRelease) is work the freeze waits for
// (ownership.enter), and an issue, refusal or release writes nothing when
// one of its requests' shards is not served (ErrMoving; the engine parks
// those requests, and the new owner takes them again once stale); a take
// takes only from the databases served now. The engine's queues may hold
// requests taken before the freeze. Every other op, and every read, passes
// through.
type movingCoupons struct {
	couponq.Store
	own *ownership
}

func (m movingCoupons) served(reqs []model.CouponRequest) error {
	for _, r := range reqs {
		if err := m.own.check(r.Shard); err != nil {
			return err
		}
	}
	return nil
}

// CommitGroup runs the coupon ops as the type's comment says.
func (m movingCoupons) CommitGroup(ctx context.Context, list []storage.Op) error {
	if len(list) != 1 {
		return m.Store.CommitGroup(ctx, list)
	}
	var reqs []model.CouponRequest
	switch op := list[0].(type) {
	case *storage.CouponTake:
		leave := m.own.enter()
		defer leave()
		dbs := op.DBs
		defer func() { op.DBs = dbs }()
		op.DBs = slices.DeleteFunc(slices.Clone(dbs), func(db int) bool { return !m.own.servesDB(db) })
		if len(op.DBs) == 0 {
			op.Taken = nil
			return nil
		}
		return m.Store.CommitGroup(ctx, list)
	case *storage.CouponIssue:
		reqs = op.Reqs
	case *storage.CouponRefusal:
		reqs = op.Reqs
	case *storage.CouponRelease:
		reqs = op.Reqs
	default:
		return m.Store.CommitGroup(ctx, list)
	}
	leave := m.own.enter()
	defer leave()
	if err := m.served(reqs); err != nil {
		return err
	}
	return m.Store.CommitGroup(ctx, list)
}
