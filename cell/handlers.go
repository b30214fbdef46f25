package cell

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/admission"
	"redcell/cell/degrade"
	"redcell/cell/recon"
	"redcell/cell/relay"
	"redcell/model"
	"redcell/storage"
)

// handle routes a request. Paths are the public API's (the router forwards them
// unchanged) plus the cell-to-cell /internal/credits and /internal/recon: the
// main port's routes of api.Match. Every request but GET /healthz must be
// signed with the cluster secret (see serveRoute).
func (s *Server) handle(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	if path == api.HealthPath {
		s.healthz(rc)
		return
	}
	if path == api.LivePath {
		rc.SetContentType("application/json")
		rc.SetBody(s.noopBody) // {"cell": name}: answered, nothing read
		return
	}
	start := s.clock.Now()
	// Segments of the path as sent, each decoded on its own: an escaped slash
	// stays inside its act_id, which then fails validation (400), as at the router.
	parts, ok := api.PathSegments(rc.URI().PathOriginal())
	rt, key := api.RouteOther, ""
	if ok {
		// A known path with another method is no route here either (404,
		// labelled other), as before the route table.
		if r, p, err := api.Match(string(rc.Method()), parts); err == nil {
			rt, key = r.ID, p.Key
		}
	}
	s.serveRoute(rc, rt, key)
	s.metrics.requests.ObserveCode(int(rt), rc.Response.StatusCode(), api.ResponseCode(&rc.Response.Header), s.clock.Now().Sub(start))
}

// serveRoute answers a request of route rt; key is its path parameter (an
// act_id or a packet ID, as sent).
func (s *Server) serveRoute(rc *fasthttp.RequestCtx, rt api.RouteID, key string) {
	if s.draining.Load() {
		s.answers.err(rc, model.ErrShuttingDown)
		return
	}
	// Only routers and other cells may call a cell: each signs its calls with
	// the cluster secret (api.Signer). The check comes before anything else
	// reads the request (decoding, the store) and before the rate limit, so
	// that unsigned calls cannot spend the tokens of signed ones. It covers
	// unknown routes too: a caller without the secret learns nothing.
	if !s.signer.VerifyRequest(&rc.Request, s.clock.Now()) {
		s.answers.err(rc, errUnsigned)
		return
	}
	// The cell's own rate limit binds every public request; relayed credits
	// are exempt: they are money already claimed, bounded by the relay's
	// batches; so are reconciliation calls, a few a minute from each cell.
	if api.RouteOf(rt).Public() && !s.limiter.AllowN(s.clock.Now(), 1) {
		s.metrics.limited[rt].Inc()
		api.WriteErrorBody(rc, http.StatusTooManyRequests, model.ErrCellRateLimited.Code, s.refusal)
		rc.Response.Header.Set("Retry-After", "1")
		rc.Response.Header.Set(api.HeaderCell, s.cfg.Name)
		return
	}
	// A request that writes is work a move's freeze waits for
	// (ownership.enter): its check of the shard happens inside it. Reads
	// (GET, and a grab, which reads a packet's state) write nothing, and an
	// open's writes are its worker's batch, which enters on its own: none
	// holds a freeze up while it waits (an open may wait in its packet's
	// queue for up to a second). A send, a deposit and relayed credits
	// write only through the committer, whose groups enter themselves
	// (commitGroup).
	if string(rc.Method()) != fasthttp.MethodGet && !entersOnItsOwn(rt) {
		leave := s.own.enter()
		defer leave()
	}
	ctx, cancel := s.deadline(rc)
	defer cancel()
	defer func() {
		if rc.Response.StatusCode() < 500 {
			s.inc.request.OK() // one atomic load unless requests were failing
		}
	}()
	sp := s.spaceOf(rc)
	if !s.enterSpace(rc, rt, sp) { // a shadow cleanup refuses stress requests while it drops (shadow.go)
		return
	}
	defer s.leaveSpace(sp)
	if h := routes[rt]; h != nil {
		h(s, ctx, rc, sp, rt, key)
		return
	}
	s.answers.err(rc, model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path()))
}

// routeHandler serves one route of a cell's public or internal port: ctx
// carries the request's deadline, sp is its space, rt the route matched and
// key the route's key (an act_id, a packet ID, a serial; "" for routes
// keyed by their body).
type routeHandler func(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, rt api.RouteID, key string)

// routes are the cell's handlers by route of api's route table (the cell's
// ports); a route of the table without one answers NOT_FOUND. serveRoute
// checks the signature, the rate limit and the space first.
var routes = [api.RouteCount]routeHandler{
	api.RouteAccount:  keyed((*Server).getAccount),
	api.RouteDeposit:  keyed((*Server).deposit),
	api.RouteSend:     bodied((*Server).send),
	api.RouteDetail:   keyed((*Server).detail),
	api.RouteGrab:     keyed((*Server).grab),
	api.RouteOpen:     keyed((*Server).open),
	api.RouteNoop:     noop,
	api.RouteIdentity: keyed((*Server).bindIdentity),
	api.RouteReward:   rewardRoute,
	api.RouteRewards:  walletRoute,
	api.RouteWallet:   walletRoute,
	api.RouteFlow:     walletRoute,
	api.RouteWithdraw: walletRoute,
	api.RouteTokens:   rewardRoute,
	api.RouteBook:     walletRoute,
	api.RouteIssued:   rewardRoute,

	api.RouteCouponIssue:  couponRoute,
	api.RouteCouponState:  couponRoute,
	api.RouteCoupons:      couponRoute,
	api.RouteCredits:      bodied((*Server).credits),
	api.RouteRecon:        bodied((*Server).reconAnswer),
	api.RouteBudgetLease:  budgetRoute,
	api.RouteBudgetReturn: budgetRoute,
	api.RouteBudgetLeases: budgetRoute,
	api.RouteCouponStock:  couponRoute,
}

// keyed adapts a handler of a route keyed by its path.
func keyed(h func(*Server, context.Context, *fasthttp.RequestCtx, *space, string)) routeHandler {
	return func(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, _ api.RouteID, key string) {
		h(s, ctx, rc, sp, key)
	}
}

// bodied adapts a handler of a route keyed by its body.
func bodied(h func(*Server, context.Context, *fasthttp.RequestCtx, *space)) routeHandler {
	return func(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, _ api.RouteID, _ string) {
		h(s, ctx, rc, sp)
	}
}

// noop is the HTTP ceiling: routed like an account request, no storage
// touched.
func noop(s *Server, _ context.Context, rc *fasthttp.RequestCtx, _ *space, _ api.RouteID, key string) {
	if _, err := s.own.account(key); err != nil {
		s.answers.err(rc, err)
		return
	}
	rc.SetStatusCode(http.StatusOK)
	rc.SetContentType("application/json")
	rc.SetBody(s.noopBody)
}

// budgetRoute serves the three budget routes (cell/budgets).
func budgetRoute(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, rt api.RouteID, _ string) {
	s.budgets.Serve(ctx, rc, rt, sp.index())
}

// entersOnItsOwn reports whether a request of route rt writes nothing
// (grab) or registers its writes with the ownership itself (open, send,
// deposit, credits), rather than as work that may write any database.
func entersOnItsOwn(rt api.RouteID) bool {
	switch rt {
	case api.RouteOpen, api.RouteGrab, api.RouteSend, api.RouteDeposit, api.RouteCredits:
		return true
	}
	return false
}

// errUnsigned answers a call without a valid signature (401 UNAUTHENTICATED).
var errUnsigned = model.Errorf(model.ErrUnauthenticated,
	"a cell accepts only calls signed with the cluster secret (X-Redcell-Timestamp, X-Redcell-Signature) within %s", api.SignatureWindow)

func (s *Server) healthz(rc *fasthttp.RequestCtx) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	status, code := "ok", http.StatusOK
	if err := s.spaces[0].store.Ping(ctx); err != nil {
		status, code = "db_unreachable", http.StatusServiceUnavailable
	}
	if s.draining.Load() {
		status, code = "draining", http.StatusServiceUnavailable
	}
	s.answers.json(rc, code, map[string]any{
		"status": status, "cell": s.cfg.Name, "shards": s.own.rangesString(), "strategy": s.strategy.Strategy().Strategy,
		"schema_ready": s.warmer.ready.Load(), "active_packets": s.queue.Keys(),
		"opens": s.stats.opens.Load(), "open_batches": s.stats.openBatches.Load(), "shed": s.stats.shed.Load(),
		"refunds": s.expiry.refunds.Load(), "relayed": relayTotal(s.spaces, func(st *relay.Stats) int64 { return st.Relayed.Load() }),
		"relay_errors":   relayTotal(s.spaces, func(st *relay.Stats) int64 { return st.Errors.Load() }),
		"rewards_booked": s.rw.Booked(),
	})
}

func (s *Server) getAccount(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	a, err := storage.Account(ctx, sp.store, sh, actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, a)
}

func (s *Server) deposit(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	// The deposit writes its account's database only (entersOnItsOwn),
	// through the committer, which registers the write and checks the shard
	// (commitGroup).
	sh, err := s.own.account(actID)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var req api.DepositRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.answers.err(rc, err)
		return
	}
	if err := validateDeposit(req); err != nil {
		s.answers.err(rc, err)
		return
	}
	d, err := s.depositGrouped(ctx, sp, sh, actID, req.OrderNo, model.Cents(req.Amount))
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, d)
}

// bindIdentity answers PUT /v1/identities/{app}/{app_user_id} {"phone"?}: the
// app account's actID, bound now or before (model.Bind). The phone is used
// only to derive the actID and its keyed hash; no answer, error or log line
// repeats it.
func (s *Server) bindIdentity(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, key string) {
	sh, app, appUserID, err := s.own.identity(key)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	if s.cfg.IdentityKey == "" {
		s.answers.err(rc, model.ErrIdentityDisabled)
		return
	}
	var req api.IdentityRequest
	if body := rc.PostBody(); len(bytes.TrimSpace(body)) > 0 {
		if err := decodeStrict(body, &req); err != nil {
			s.answers.err(rc, err)
			return
		}
	}
	idKey := []byte(s.cfg.IdentityKey)
	var phone model.Phone
	if req.Phone != nil {
		if phone, err = model.ParsePhone(*req.Phone, s.cfg.IdentityDefaultRegion); err != nil {
			s.answers.err(rc, err)
			return
		}
	}
	// Keyed on the number's E.164 form; a binding stored before numbers were
	// parsed holds the hash of a legacy form and keeps its actID.
	want := model.NewBinding(idKey, app, appUserID, phone.E164, s.clock.Now().UnixMilli())
	b, repeat, err := storage.BindIdentity(ctx, sp.store, sh, want, model.LegacyPhoneHashes(idKey, phone)...)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	s.answers.json(rc, http.StatusOK, api.NewIdentityResponse(b, repeat))
}

func (s *Server) send(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var body api.SendRequest
	if err := decodeStrict(rc.PostBody(), &body); err != nil {
		s.answers.err(rc, err)
		return
	}
	req, sh, err := validateSend(body, s.cfg.Limits)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	// The send writes its sender's database only (entersOnItsOwn): the
	// debit, the flow and the packet, whose ID carries the sender's shard;
	// through the committer, which registers the write and checks the shard
	// again (commitGroup).
	if err := s.own.check(sh); err != nil {
		s.answers.err(rc, err)
		return
	}
	now := s.clock.Now()
	id, expiresMS := model.NewPacketID(sh, now), now.Add(s.cfg.PacketExpiry).UnixMilli()
	p, repeat, err := s.sendGrouped(ctx, sp, sh, req, id, expiresMS)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	if !repeat {
		s.cache.set(sp, p)
	}
	s.answers.json(rc, http.StatusOK, api.NewSendResponse(p, repeat))
}

// statusOf names a packet's state at time now (model.StatusAt).
func statusOf(st model.PacketStatus, remaining int64, expiresMS int64, now time.Time) string {
	return model.StatusAt(st, remaining, expiresMS, now.UnixMilli())
}

// packetAndActor reads what grab and open share: the packet ID from the path
// (owned by this cell) and the act_id from the body, both validated. On failure
// it has written the error answer and ok is false.
func (s *Server) packetAndActor(rc *fasthttp.RequestCtx, id string) (ref model.PacketRef, actID string, ok bool) {
	ref, err := s.own.packetRef(id)
	if err == nil {
		actID, err = decodeActID(rc.PostBody())
	}
	if err == nil {
		err = model.ValidateActID(actID)
	}
	if err != nil {
		s.answers.err(rc, err)
		return ref, "", false
	}
	return ref, actID, true
}

// grab answers whether a share may still be there: memcached's copy first, the
// database on a miss (and always while the grab_cache switch is off). It never
// reserves anything.
func (s *Server) grab(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, _, ok := s.packetAndActor(rc, id)
	if !ok {
		return
	}
	rem, ok := admission.Remaining{}, false
	source := "cache"
	useCache := s.cache != nil && !s.switches.Off(degrade.GrabCache)
	if useCache {
		rem, ok = s.cache.get(sp, ref.ID)
	}
	if ok && rem.Local {
		source = "local"
	}
	if !ok {
		p, err := storage.Packet(ctx, sp.store, ref)
		if err != nil {
			s.answers.err(rc, err)
			return
		}
		if useCache {
			s.cache.fill(sp, p)
		}
		rem, source = remainingOf(p), "db"
	}
	st := statusOf(model.PacketStatus(rem.Status), rem.Count, rem.ExpiresMS, s.clock.Now())
	s.answers.json(rc, http.StatusOK, api.NewGrabResponse(id, st, rem.Count, source))
}

// detail answers GET /v1/packets/{id}?after=SEQ&limit=N with the packet and one
// page of its claims (limit 1..100, default 20).
func (s *Server) detail(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, err := s.own.packetRef(id)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	after, limit := int64(0), 20
	if v := rc.QueryArgs().Peek("after"); len(v) > 0 {
		if after, err = strconv.ParseInt(string(v), 10, 64); err != nil || after < 0 {
			s.answers.err(rc, model.Invalidf("after must be a claim seq >= 0"))
			return
		}
	}
	if v := rc.QueryArgs().Peek("limit"); len(v) > 0 {
		if limit, err = strconv.Atoi(string(v)); err != nil || limit < 1 || limit > 100 {
			s.answers.err(rc, model.Invalidf("limit must be 1..100"))
			return
		}
	}
	p, err := storage.Packet(ctx, sp.store, ref)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var claims []model.Claim
	degraded := s.switches.Off(degrade.ClaimsList)
	if !degraded {
		if claims, err = storage.Claims(ctx, sp.store, ref, after, limit); err != nil {
			s.answers.err(rc, err)
			return
		}
	}
	out := api.PacketResponse{ClaimsDegraded: degraded,
		PacketID: string(p.ID), Sender: p.Sender, Kind: string(p.Kind), Greeting: p.Greeting, Amount: int64(p.Amount),
		Count: p.Count, RemainingAmount: int64(p.RemainingAmount), RemainingCount: p.RemainingCount,
		RefundAmount: int64(p.RefundAmount), Status: statusOf(p.Status, p.RemainingCount, p.ExpiresMS, s.clock.Now()),
		CreatedMS: p.CreatedMS, ExpiresMS: p.ExpiresMS, Claims: claims,
		ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC().Format(time.RFC3339Nano),
	}
	if out.Claims == nil {
		out.Claims = []model.Claim{}
	}
	if len(claims) == limit {
		out.NextAfter = claims[len(claims)-1].Seq
	}
	s.answers.json(rc, http.StatusOK, out)
}

// creditsPerCallMax bounds the claims one /internal/credits or /internal/recon
// call may carry (the relay sends at most relay.BatchMax).
const creditsPerCallMax = 10_000

// credits applies claims relayed from other cells (signed, as every call:
// serveRoute checked); a credit seen before is a no-op. Credits whose wallet
// row another transaction holds are deferred, not waited for: the answer
// lists them to a sender that reads the list (api.HeaderPartial), and is a
// retryable 503 to one that does not; what was applied stays applied.
func (s *Server) credits(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	// The credits may write any of the cell's databases (entersOnItsOwn),
	// through the committer, which registers the writes and checks each
	// shard (commitGroup).
	credits, err := s.own.decodeCredits(rc.PostBody())
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	applied, deferred, err := s.applyCreditsGrouped(ctx, sp, credits)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	if len(deferred) > 0 && string(rc.Request.Header.Peek(api.HeaderPartial)) != "1" {
		s.answers.err(rc, model.Errorf(model.ErrOverloaded, "%d of %d credits deferred: their wallet rows are locked; retry later", len(deferred), len(credits)))
		return
	}
	s.answers.json(rc, http.StatusOK, api.CreditsResponse{Applied: applied, Deferred: deferred})
}

// reconAnswer serves POST /internal/recon: which of the claims another cell
// delivered here are credited as claimed (recon.Answer). serveRoute has
// checked its signature, as for every call; it reads only.
func (s *Server) reconAnswer(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	credits, copied, err := s.own.decodeRecon(rc.PostBody())
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	var absent []string // copy: claims of databases this cell keeps no copy of
	if copied {
		if credits, absent, err = s.inCopies(ctx, credits); err != nil {
			s.answers.err(rc, err)
			return
		}
	}
	out, err := recon.Answer(ctx, sp.store, credits)
	if err != nil {
		s.answers.err(rc, err)
		return
	}
	out.Missing = append(out.Missing, absent...)
	s.answers.json(rc, http.StatusOK, out)
}

// inCopies splits credits into those whose claimant's database this cell
// keeps a copy of (it serves it, or handed it over and has not dropped its
// copy: a moved-out record) and the claim IDs of the rest.
func (s *Server) inCopies(ctx context.Context, credits []model.Credit) (kept []model.Credit, absent []string, err error) {
	copies := map[int]bool{}
	dbs, err := s.moves.Copies(ctx)
	if err != nil {
		return nil, nil, model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	for _, db := range dbs {
		copies[db] = true
	}
	for _, c := range credits {
		if db := c.Shard.DB(); copies[db] || s.own.holdsDB(db) {
			kept = append(kept, c)
		} else {
			absent = append(absent, c.ClaimID)
		}
	}
	return kept, absent, nil
}
