package cell

import (
	"context"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/relay"
	"redcell/model"
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
		rc.SetBody(s.gate.noopBody) // {"cell": name}: answered, nothing read
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
	if s.gate.draining.Load() {
		s.answers.err(rc, model.ErrShuttingDown)
		return
	}
	// Only routers and other cells may call a cell: each signs its calls with
	// the cluster secret (api.Signer). The check comes before anything else
	// reads the request (decoding, the store) and before the rate limit, so
	// that unsigned calls cannot spend the tokens of signed ones. It covers
	// unknown routes too: a caller without the secret learns nothing.
	if !s.gate.signer.VerifyRequest(&rc.Request, s.clock.Now()) {
		s.answers.err(rc, errUnsigned)
		return
	}
	// The cell's own rate limit binds every public request; relayed credits
	// are exempt: they are money already claimed, bounded by the relay's
	// batches; so are reconciliation calls, a few a minute from each cell.
	if api.RouteOf(rt).Public() && !s.gate.limiter.AllowN(s.clock.Now(), 1) {
		s.metrics.limited[rt].Inc()
		api.WriteErrorBody(rc, http.StatusTooManyRequests, model.ErrCellRateLimited.Code, s.gate.refusal)
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
	sp := s.spaces.of(rc)
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
	api.RouteAccount:      keyedBy(accountsOf, (*accounts).getAccount),
	api.RouteDeposit:      keyedBy(accountsOf, (*accounts).deposit),
	api.RouteSend:         bodiedBy(packetsOf, (*packets).send),
	api.RouteDetail:       keyedBy(packetsOf, (*packets).detail),
	api.RouteGrab:         keyedBy(packetsOf, (*packets).grab),
	api.RouteOpen:         keyed((*Server).open),
	api.RouteNoop:         noop,
	api.RouteIdentity:     keyedBy(accountsOf, (*accounts).bindIdentity),
	api.RouteReward:       rewardRoute,
	api.RouteRewards:      walletRoute,
	api.RouteWallet:       walletRoute,
	api.RouteFlow:         walletRoute,
	api.RouteWithdraw:     walletRoute,
	api.RouteTokens:       rewardRoute,
	api.RouteBook:         walletRoute,
	api.RouteIssued:       rewardRoute,
	api.RouteCouponIssue:  couponRoute,
	api.RouteCouponState:  couponRoute,
	api.RouteCoupons:      couponRoute,
	api.RouteCredits:      bodiedBy(creditsOf, (*creditRoutes).credits),
	api.RouteRecon:        bodiedBy(creditsOf, (*creditRoutes).reconAnswer),
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

// keyedBy adapts a handler of a route keyed by its path that a part of the
// Server serves: part picks the part out of the Server.
func keyedBy[P any](part func(*Server) P, h func(P, context.Context, *fasthttp.RequestCtx, *space, string)) routeHandler {
	return func(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, _ api.RouteID, key string) {
		h(part(s), ctx, rc, sp, key)
	}
}

// bodiedBy adapts a handler of a route keyed by its body that a part of the
// Server serves: part picks the part out of the Server.
func bodiedBy[P any](part func(*Server) P, h func(P, context.Context, *fasthttp.RequestCtx, *space)) routeHandler {
	return func(s *Server, ctx context.Context, rc *fasthttp.RequestCtx, sp *space, _ api.RouteID, _ string) {
		h(part(s), ctx, rc, sp)
	}
}

// The parts that serve routes, as keyedBy and bodiedBy pick them.
func accountsOf(s *Server) *accounts    { return s.parts.accounts }
func packetsOf(s *Server) *packets      { return s.parts.packets }
func creditsOf(s *Server) *creditRoutes { return s.parts.credits }

// noop is the HTTP ceiling: routed like an account request, no storage
// touched.
func noop(s *Server, _ context.Context, rc *fasthttp.RequestCtx, _ *space, _ api.RouteID, key string) {
	if _, err := s.own.account(key); err != nil {
		s.answers.err(rc, err)
		return
	}
	rc.SetStatusCode(http.StatusOK)
	rc.SetContentType("application/json")
	rc.SetBody(s.gate.noopBody)
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
	if s.gate.draining.Load() {
		status, code = "draining", http.StatusServiceUnavailable
	}
	s.answers.json(rc, code, map[string]any{
		"status": status, "cell": s.cfg.Name, "shards": s.own.rangesString(), "strategy": s.opens.strategy.Strategy().Strategy,
		"schema_ready": s.parts.warmer.ready.Load(), "active_packets": s.opens.queue.Keys(),
		"opens": s.opens.stats.opens.Load(), "open_batches": s.opens.stats.openBatches.Load(), "shed": s.opens.stats.shed.Load(),
		"refunds": s.parts.expiry.refunds.Load(), "relayed": relayTotal(s.spaces, func(st *relay.Stats) int64 { return st.Relayed.Load() }),
		"relay_errors":   relayTotal(s.spaces, func(st *relay.Stats) int64 { return st.Errors.Load() }),
		"rewards_booked": s.parts.rewards.Booked(),
	})
}
