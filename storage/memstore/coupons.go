package memstore

import (
	"context"
	"slices"
	"sort"
	"strings"

	"redcell/internal/invariant"
	"redcell/model"
	"redcell/storage"
)

// Coupons in memory, as db_XX.t_coupon_req holds them (an issued request
// is its coupon): requests by database, app and serial; coupons by ID (one
// per request).
// The store's one lock stands for the person rows' locks.

type couponReqKey struct {
	db          int
	app, serial string
}

func reqKeyOf(r model.CouponRequest) couponReqKey {
	return couponReqKey{r.Shard.DB(), r.App, r.Serial}
}

// accept stages a group's AcceptOp as AcceptCoupon decides one: a serial
// stored before, or by an earlier op of the group, answers the stored
// request (model.ReplayCouponRequest); a new one is stored accepted, at the
// group's time when the request carries none.
func (g *group) accept(op *storage.AcceptOp) {
	r := op.Coupon
	if op.Err = model.ValidateCouponRequest(r); op.Err != nil {
		return
	}
	k := reqKeyOf(r)
	prior, ok := g.s.couponRq[k]
	if !ok {
		prior, ok = g.accepted[k]
	}
	if ok {
		op.Replay(*prior)
		return
	}
	if r.AcceptedMS == 0 {
		r.AcceptedMS = g.now
	}
	r = model.AcceptedForm(r)
	c := r
	if g.accepted == nil {
		g.accepted = map[couponReqKey]*model.CouponRequest{}
	}
	g.accepted[k] = &c
	op.Accepted = r
	g.writes = append(g.writes, func() { g.s.couponRq[k] = &c })
}

// couponRequestOf answers storage.CouponRequestQuery.
func (s *Store) couponRequestOf(ctx context.Context, sh model.ShardID, app, serial string) (model.CouponRequest, error) {
	if err := ctx.Err(); err != nil {
		return model.CouponRequest{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.couponRq[couponReqKey{sh.DB(), app, serial}]
	if !ok {
		return model.CouponRequest{}, model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", serial, app)
	}
	return *r, nil
}

// takeCouponRequests runs storage.CouponTake.
func (s *Store) takeCouponRequests(ctx context.Context, dbs []int, staleMS int64, limit int) ([]model.CouponRequest, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs []*model.CouponRequest
	for k, r := range s.couponRq {
		if slices.Contains(dbs, k.db) && (r.State == model.CouponAccepted || r.State == model.CouponDeciding && staleMS >= 0 && r.TakenMS <= staleMS) {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b *model.CouponRequest) int { return model.CompareCouponRequests(*a, *b) })
	rs = rs[:min(len(rs), limit)]
	if len(rs) == 0 {
		return nil, nil
	}
	now := s.nowMS()
	write, err := s.commitLocked("take coupon requests")
	out := make([]model.CouponRequest, len(rs))
	for i, r := range rs {
		if write {
			r.State, r.TakenMS = model.CouponDeciding, now
		}
		out[i] = *r
		out[i].State, out[i].TakenMS = model.CouponDeciding, now
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// holdingLocked is actID's holding in database db.
func (s *Store) holdingLocked(db int, actID string) *model.CouponHolding {
	h := &model.CouponHolding{ByBatch: map[string]int{}, Groups: map[string]string{}}
	for _, c := range s.coupons {
		if c.ActID == actID && c.Shard.DB() == db {
			h.ByBatch[c.Batch]++
			if c.Group != "" {
				h.Groups[c.Group] = c.Batch
			}
		}
	}
	return h
}

// issueCoupons runs storage.CouponIssue.
func (s *Store) issueCoupons(ctx context.Context, rule model.CouponRule, leaseID string, granted int64, reqs []model.CouponRequest) ([]model.CouponDecision, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	invariant.That(granted >= 0, "granted >= 0")
	if granted > 0 && leaseID == "" {
		return nil, 0, model.Invalidf("a coupon issue with units needs the lease they came from")
	}
	if len(reqs) == 0 {
		return nil, granted, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var asks []model.CouponAsk
	var open []*model.CouponRequest
	hs := map[string]*model.CouponHolding{}
	seen := map[couponReqKey]bool{}
	for _, r := range reqs {
		invariant.That(r.Batch == rule.Batch, "every request of an issue is of its batch")
		cur, ok := s.couponRq[reqKeyOf(r)]
		if !ok {
			return nil, 0, model.Errorf(model.ErrNotFound, "no coupon request %s of app %q", r.Serial, r.App)
		}
		if cur.State.Final() || seen[reqKeyOf(r)] { // a copy of one already asked for is decided with it
			continue
		}
		seen[reqKeyOf(r)] = true
		if hs[cur.ActID] == nil {
			hs[cur.ActID] = s.holdingLocked(cur.Shard.DB(), cur.ActID)
		}
		asks = append(asks, model.CouponAsk{Serial: cur.App + "\x00" + cur.Serial, ActID: cur.ActID, Rule: rule})
		open = append(open, cur)
	}
	units := min(granted, int64(len(asks)))
	ds, left := model.AssignCoupons(units, asks, hs)
	unused := granted - units + left
	now := s.nowMS()
	write, err := s.commitLocked("issue coupons")
	out := make([]model.CouponDecision, len(ds))
	for i, d := range ds {
		r := open[i]
		d.Serial, d.App = r.Serial, r.App
		out[i] = d
		if !write {
			continue
		}
		if d.Issued {
			id := model.CouponID(r.App, r.Serial, r.ActID)
			s.coupons[id] = &model.Coupon{ID: id, ActID: r.ActID, Shard: r.Shard, Batch: r.Batch, Group: rule.Group, App: r.App,
				Serial: r.Serial, LeaseID: leaseID, IssuedMS: now}
			r.State, r.CouponID, r.DecidedMS = model.CouponIssued, id, now
		} else {
			r.State, r.Reason, r.DecidedMS = model.CouponRefused, d.Reason, now
		}
	}
	if err != nil {
		return nil, 0, err
	}
	return out, unused, nil
}

// refuseCoupons runs storage.CouponRefusal.
func (s *Store) refuseCoupons(ctx context.Context, reqs []model.CouponRequest, reason model.CouponReason) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	invariant.That(reason != "", "a refusal has a reason")
	s.mu.Lock()
	defer s.mu.Unlock()
	write, err := s.commitLocked("refuse coupons")
	if write {
		now := s.nowMS()
		for _, r := range reqs {
			if cur, ok := s.couponRq[reqKeyOf(r)]; ok && !cur.State.Final() {
				cur.State, cur.Reason, cur.DecidedMS = model.CouponRefused, reason, now
			}
		}
	}
	return err
}

// releaseCouponRequests runs storage.CouponRelease.
func (s *Store) releaseCouponRequests(ctx context.Context, reqs []model.CouponRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	write, err := s.commitLocked("release coupon requests")
	if write {
		for _, r := range reqs {
			if cur, ok := s.couponRq[reqKeyOf(r)]; ok && cur.State == model.CouponDeciding {
				cur.State, cur.TakenMS = model.CouponAccepted, 0
			}
		}
	}
	return err
}

// holdingOf answers storage.HoldingQuery.
func (s *Store) holdingOf(ctx context.Context, sh model.ShardID, actID string) (model.CouponHolding, error) {
	if err := ctx.Err(); err != nil {
		return model.CouponHolding{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.holdingLocked(sh.DB(), actID), nil
}

// holdingsOf answers storage.HoldingsQuery.
func (s *Store) holdingsOf(ctx context.Context, reqs []model.CouponRequest) (map[string]model.CouponHolding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]model.CouponHolding{}
	for _, r := range reqs {
		out[r.ActID] = *s.holdingLocked(r.Shard.DB(), r.ActID)
	}
	return out, nil
}

// couponsOf answers storage.CouponsQuery.
func (s *Store) couponsOf(ctx context.Context, sh model.ShardID, actID string, after model.FlowCursor, limit int) ([]model.Coupon, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []model.Coupon
	for _, c := range s.coupons {
		older := after == (model.FlowCursor{}) || c.IssuedMS < after.CreatedMS || (c.IssuedMS == after.CreatedMS && c.ID < after.ID)
		if c.ActID == actID && c.Shard.DB() == sh.DB() && older {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].IssuedMS != out[j].IssuedMS {
			return out[i].IssuedMS > out[j].IssuedMS
		}
		return out[i].ID > out[j].ID
	})
	return out[:min(len(out), limit)], nil
}

// couponLeaseSpent answers storage.CouponLeaseSpentQuery.
func (s *Store) couponLeaseSpent(ctx context.Context, dbs []int, leaseID string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, c := range s.coupons {
		for _, db := range dbs {
			if c.LeaseID == leaseID && c.Shard.DB() == db {
				n++
			}
		}
	}
	return n, nil
}

// couponRowsLocked is the ledger's coupon part, as storage.MySQL's
// ledgerCoupons reads it from the tables.
func (s *Store) couponRowsLocked() model.CouponRows {
	c := model.CouponRows{Requests: map[model.CouponState]int64{}, ByBatch: map[string]int64{}, LeaseSpent: map[string]int64{}}
	for _, r := range s.couponRq {
		c.Requests[r.State]++
		if r.State == model.CouponRefused && r.Reason == "" {
			c.RefusedNoReason++
		}
		if !r.State.Final() && (c.OldestOpenMS == 0 || r.AcceptedMS < c.OldestOpenMS) {
			c.OldestOpenMS = r.AcceptedMS
		}
		if r.State == model.CouponDeciding && (c.OldestTakenMS == 0 || r.TakenMS < c.OldestTakenMS) {
			c.OldestTakenMS = r.TakenMS
		}
		if r.State == model.CouponIssued {
			if cp, ok := s.coupons[r.CouponID]; !ok || cp.App != r.App || cp.Serial != r.Serial {
				c.IssuedNoCoupon++
			}
		}
	}
	type pair struct{ act, batch string }
	held := map[pair]int64{}
	groups := map[[2]string]map[string]bool{}
	for _, cp := range s.coupons {
		c.ByBatch[cp.Batch]++
		c.LeaseSpent[cp.LeaseID]++
		held[pair{cp.ActID, cp.Batch}]++
		if r, ok := s.couponRq[couponReqKey{cp.Shard.DB(), cp.App, cp.Serial}]; !ok || r.State != model.CouponIssued || r.CouponID != cp.ID ||
			r.ActID != cp.ActID || r.Batch != cp.Batch {
			c.CouponNoRequest++
		}
		if cp.Group != "" {
			k := [2]string{cp.ActID, cp.Group}
			if groups[k] == nil {
				groups[k] = map[string]bool{}
			}
			groups[k][cp.Batch] = true
		}
	}
	for p, n := range held {
		if n > 1 {
			c.Multi = append(c.Multi, model.CouponCount{ActID: p.act, Batch: p.batch, N: n})
		}
	}
	for k, bs := range groups {
		if len(bs) > 1 {
			names := make([]string, 0, len(bs))
			for b := range bs {
				names = append(names, b)
			}
			sort.Strings(names)
			c.GroupClash = append(c.GroupClash, k[0]+" holds batches "+strings.Join(names, ",")+" of group "+k[1])
		}
	}
	sort.Slice(c.Multi, func(i, j int) bool { return c.Multi[i].ActID+c.Multi[i].Batch < c.Multi[j].ActID+c.Multi[j].Batch })
	sort.Strings(c.GroupClash)
	return c
}
