package cell

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/admission"
	"redcell/model"
	"redcell/sharding"
)

// handle routes a request. Paths are the public API's (the router forwards them
// unchanged) plus /internal/credits for cell-to-cell relay. Every request but
// GET /healthz must be signed with the cluster secret (see serveRoute).
func (s *Server) handle(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	if path == "/healthz" {
		s.healthz(rc)
		return
	}
	start := time.Now()
	method := string(rc.Method())
	// Segments of the path as sent, each decoded on its own: an escaped slash
	// stays inside its act_id, which then fails validation (400), as at the router.
	parts, ok := api.PathSegments(rc.URI().PathOriginal())
	rt := routeOther
	if ok {
		rt = routeOf(method, parts)
	}
	s.serveRoute(rc, rt, parts)
	s.metrics.requests.Observe(int(rt), rc.Response.StatusCode(), rc.Response.Body(), time.Since(start))
}

// routeOf names the route of a request from its method and path segments; a
// known path with another method is routeOther.
func routeOf(method string, parts []string) route {
	v1 := len(parts) >= 2 && parts[0] == "v1"
	internal := len(parts) == 2 && parts[0] == "internal"
	switch {
	case v1 && len(parts) == 3 && parts[1] == "accounts" && method == http.MethodGet:
		return routeAccount
	case v1 && len(parts) == 4 && parts[1] == "accounts" && parts[3] == "deposit" && method == http.MethodPost:
		return routeDeposit
	case v1 && len(parts) == 2 && parts[1] == "packets" && method == http.MethodPost:
		return routeSend
	case v1 && len(parts) == 3 && parts[1] == "packets" && method == http.MethodGet:
		return routeDetail
	case v1 && len(parts) == 4 && parts[1] == "packets" && parts[3] == "grab" && method == http.MethodPost:
		return routeGrab
	case v1 && len(parts) == 4 && parts[1] == "packets" && parts[3] == "open" && method == http.MethodPost:
		return routeOpen
	case v1 && len(parts) == 3 && parts[1] == "noop" && method == http.MethodPost:
		return routeNoop
	case internal && parts[1] == "credits" && method == http.MethodPost:
		return routeCredits
	case internal && parts[1] == "recon" && method == http.MethodPost:
		return routeRecon
	}
	return routeOther
}

func (s *Server) serveRoute(rc *fasthttp.RequestCtx, rt route, parts []string) {
	if s.draining.Load() {
		s.writeErr(rc, model.ErrShuttingDown)
		return
	}
	// Only routers and other cells may call a cell: each signs its calls with
	// the cluster secret (api.Signer). The check comes before anything else
	// reads the request (decoding, the store) and before the rate limit, so
	// that unsigned calls cannot spend the tokens of signed ones. It covers
	// unknown routes too: a caller without the secret learns nothing.
	if !s.signer.VerifyRequest(&rc.Request, s.now()) {
		s.writeErr(rc, errUnsigned)
		return
	}
	// The cell's own rate limit binds every public request; relayed credits
	// are exempt: they are money already claimed, bounded by the relay's
	// batches; so are reconciliation calls, a few a minute from each cell.
	if rt != routeCredits && rt != routeRecon && rt != routeOther && !s.limiter.AllowN(s.now(), 1) {
		s.metrics.limited[rt].Inc()
		rc.SetStatusCode(http.StatusTooManyRequests)
		rc.SetContentType("application/json")
		rc.Response.Header.Set("Retry-After", "1")
		rc.Response.Header.Set(api.HeaderCell, s.cfg.Name)
		rc.Response.Header.Set(api.HeaderCode, model.ErrCellRateLimited.Code)
		rc.SetBody(s.refusal)
		return
	}
	ctx, cancel := s.deadline(rc)
	defer cancel()
	defer func() {
		if rc.Response.StatusCode() < 500 {
			s.inc.request.OK() // one atomic load unless requests were failing
		}
	}()
	sp := s.spaceOf(rc)
	switch rt {
	case routeAccount:
		s.getAccount(ctx, rc, sp, parts[2])
	case routeDeposit:
		s.deposit(ctx, rc, sp, parts[2])
	case routeSend:
		s.send(ctx, rc, sp)
	case routeDetail:
		s.detail(ctx, rc, sp, parts[2])
	case routeGrab:
		s.grab(ctx, rc, sp, parts[2])
	case routeOpen:
		s.open(ctx, rc, sp, parts[2])
	case routeNoop:
		// The HTTP ceiling: routed like an account request, no storage touched.
		if _, err := s.account(parts[2]); err != nil {
			s.writeErr(rc, err)
			return
		}
		rc.SetStatusCode(http.StatusOK)
		rc.SetContentType("application/json")
		rc.SetBody(s.noopBody)
	case routeCredits:
		s.credits(ctx, rc, sp)
	case routeRecon:
		s.reconHandler(ctx, rc, sp)
	default:
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "no route for %s %s", rc.Method(), rc.Path()))
	}
}

// errUnsigned answers a call without a valid signature (401 UNAUTHENTICATED).
var errUnsigned = model.Errorf(model.ErrUnauthenticated,
	"a cell accepts only calls signed with the cluster secret (X-Redcell-Timestamp, X-Redcell-Signature) within %s", api.SignatureWindow)

// account validates an act_id from the path and checks this cell owns its shard.
func (s *Server) account(actID string) (model.ShardID, error) {
	if err := model.ValidateActID(actID); err != nil {
		return 0, err
	}
	sh := sharding.ShardOfAct(actID)
	if !s.Owns(sh) {
		return 0, model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", sh, s.cfg.Name)
	}
	return sh, nil
}

// packetRef parses a packet ID from the path and checks this cell owns its shard.
func (s *Server) packetRef(id string) (model.PacketRef, error) {
	ref, err := model.ParsePacketID(id)
	if err != nil {
		return ref, err
	}
	if !s.Owns(ref.Shard) {
		return ref, model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", ref.Shard, s.cfg.Name)
	}
	return ref, nil
}

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
	s.writeJSON(rc, code, map[string]any{
		"status": status, "cell": s.cfg.Name, "shards": s.cfg.Shards.String(), "strategy": s.Strategy().Strategy,
		"schema_ready": s.schemaReady.Load(), "active_packets": s.queue.Keys(),
		"opens": s.stats.opens.Load(), "open_batches": s.stats.openBatches.Load(), "shed": s.stats.shed.Load(),
		"refunds": s.stats.refunds.Load(), "relayed": s.stats.relayed.Load(), "relay_errors": s.stats.relayErrors.Load(),
	})
}

func (s *Server) getAccount(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.account(actID)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	a, err := sp.store.Account(ctx, sh, actID)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, http.StatusOK, a)
}

func (s *Server) deposit(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := s.account(actID)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	var req api.DepositRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		s.writeErr(rc, err)
		return
	}
	if err := validateDeposit(req); err != nil {
		s.writeErr(rc, err)
		return
	}
	d, err := sp.store.Deposit(ctx, sh, actID, req.OrderNo, model.Cents(req.Amount))
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, http.StatusOK, d)
}

func (s *Server) send(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var body api.SendRequest
	if err := decodeStrict(rc.PostBody(), &body); err != nil {
		s.writeErr(rc, err)
		return
	}
	req, sh, err := validateSend(body, s.cfg.Limits)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	if !s.Owns(sh) {
		s.writeErr(rc, model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", sh, s.cfg.Name))
		return
	}
	now := s.now()
	p, repeat, err := sp.store.Send(ctx, sh, req, model.NewPacketID(sh, now), now.Add(s.cfg.PacketExpiry).UnixMilli())
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	if !repeat {
		s.cacheRemaining(sp, p)
	}
	s.writeJSON(rc, http.StatusOK, api.SendResponse{
		PacketID: string(p.ID), Sender: p.Sender, Amount: int64(p.Amount), Count: p.Count, Kind: string(p.Kind),
		ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC().Format(time.RFC3339Nano), ExpiresMS: p.ExpiresMS, Repeat: repeat,
	})
}

// statusOf names a packet's state at time now: an open packet past its expiry
// is "expired" until the refund turns it "refunded".
func statusOf(st model.PacketStatus, remaining int64, expiresMS int64, now time.Time) string {
	if st == model.StatusOpen && now.UnixMilli() >= expiresMS {
		return "expired"
	}
	if st == model.StatusOpen && remaining == 0 {
		return model.StatusSoldOut.String()
	}
	return st.String()
}

// cacheRemaining writes the packet's state as a commit left it.
func (s *Server) cacheRemaining(sp *space, p model.Packet) {
	if s.cache == nil || p.ID == "" {
		return
	}
	s.cache.Set(sp.cacheKey(p.ID), remainingOf(p), time.Until(time.UnixMilli(p.ExpiresMS))+time.Hour)
}

func remainingOf(p model.Packet) admission.Remaining {
	return admission.Remaining{Count: p.RemainingCount, Status: int8(p.Status), ExpiresMS: p.ExpiresMS}
}

// packetAndActor reads what grab and open share: the packet ID from the path
// (owned by this cell) and the act_id from the body, both validated. On failure
// it has written the error answer and ok is false.
func (s *Server) packetAndActor(rc *fasthttp.RequestCtx, id string) (ref model.PacketRef, actID string, ok bool) {
	ref, err := s.packetRef(id)
	if err == nil {
		actID, err = decodeActID(rc.PostBody())
	}
	if err == nil {
		err = model.ValidateActID(actID)
	}
	if err != nil {
		s.writeErr(rc, err)
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
	useCache := s.cache != nil && !s.isDegraded(switchGrabCache)
	if useCache {
		rem, ok = s.cache.Get(sp.cacheKey(ref.ID))
	}
	if ok && rem.Local {
		source = "local"
	}
	if !ok {
		p, err := sp.store.Packet(ctx, ref)
		if err != nil {
			s.writeErr(rc, err)
			return
		}
		if useCache {
			s.cache.Fill(sp.cacheKey(ref.ID), remainingOf(p), time.Until(time.UnixMilli(p.ExpiresMS))+time.Hour)
		}
		rem, source = remainingOf(p), "db"
	}
	st := statusOf(model.PacketStatus(rem.Status), rem.Count, rem.ExpiresMS, s.now())
	if st == "expired" || st == "refunded" {
		rem.Count = 0
	}
	s.writeJSON(rc, http.StatusOK, api.GrabResponse{PacketID: id, Available: st == "open" && rem.Count > 0, Remaining: rem.Count, Status: st, Source: source})
}

// detail answers GET /v1/packets/{id}?after=SEQ&limit=N with the packet and one
// page of its claims (limit 1..100, default 20).
func (s *Server) detail(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, err := s.packetRef(id)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	after, limit := int64(0), 20
	if v := rc.QueryArgs().Peek("after"); len(v) > 0 {
		if after, err = strconv.ParseInt(string(v), 10, 64); err != nil || after < 0 {
			s.writeErr(rc, model.Invalidf("after must be a claim seq >= 0"))
			return
		}
	}
	if v := rc.QueryArgs().Peek("limit"); len(v) > 0 {
		if limit, err = strconv.Atoi(string(v)); err != nil || limit < 1 || limit > 100 {
			s.writeErr(rc, model.Invalidf("limit must be 1..100"))
			return
		}
	}
	p, err := sp.store.Packet(ctx, ref)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	var claims []model.Claim
	degraded := s.isDegraded(switchClaimsList)
	if !degraded {
		if claims, err = sp.store.Claims(ctx, ref, after, limit); err != nil {
			s.writeErr(rc, err)
			return
		}
	}
	out := api.PacketResponse{ClaimsDegraded: degraded,
		PacketID: string(p.ID), Sender: p.Sender, Kind: string(p.Kind), Greeting: p.Greeting, Amount: int64(p.Amount),
		Count: p.Count, RemainingAmount: int64(p.RemainingAmount), RemainingCount: p.RemainingCount,
		RefundAmount: int64(p.RefundAmount), Status: statusOf(p.Status, p.RemainingCount, p.ExpiresMS, s.now()),
		CreatedMS: p.CreatedMS, ExpiresMS: p.ExpiresMS, Claims: claims,
		ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC().Format(time.RFC3339Nano),
	}
	if out.Claims == nil {
		out.Claims = []model.Claim{}
	}
	if len(claims) == limit {
		out.NextAfter = claims[len(claims)-1].Seq
	}
	s.writeJSON(rc, http.StatusOK, out)
}

// creditsPerCallMax bounds the claims one /internal/credits or /internal/recon
// call may carry (the relay sends at most relayBatchMax).
const creditsPerCallMax = 10_000

// decodeCredits reads the body of /internal/credits and /internal/recon
// ({"credits": [...]}, strict) and checks every credit. Errors:
// ErrInvalidArgument.
func (s *Server) decodeCredits(body []byte) ([]model.Credit, error) {
	var req api.CreditsRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if len(req.Credits) > creditsPerCallMax {
		return nil, model.Invalidf("at most %d credits per call", creditsPerCallMax)
	}
	for _, c := range req.Credits {
		if err := s.validCredit(c); err != nil {
			return nil, err
		}
	}
	return req.Credits, nil
}

// credits applies claims relayed from other cells (signed, as every call:
// serveRoute checked); a credit seen before is a no-op. Credits whose wallet
// row another transaction holds are deferred, not waited for: the answer
// lists them to a sender that reads the list (api.HeaderPartial), and is a
// retryable 503 to one that does not; what was applied stays applied.
func (s *Server) credits(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	credits, err := s.decodeCredits(rc.PostBody())
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	applied, deferred, err := sp.store.ApplyCredits(ctx, credits)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	if len(deferred) > 0 && string(rc.Request.Header.Peek(api.HeaderPartial)) != "1" {
		s.writeErr(rc, model.Errorf(model.ErrOverloaded, "%d of %d credits deferred: their wallet rows are locked; retry later", len(deferred), len(credits)))
		return
	}
	s.writeJSON(rc, http.StatusOK, api.CreditsResponse{Applied: applied, Deferred: deferred})
}

func (s *Server) validCredit(c model.Credit) error {
	ref, _, err := model.ParseClaimID(c.ClaimID)
	if err != nil {
		return err
	}
	if ref.ID != c.PacketID {
		return model.Invalidf("claim %s does not belong to packet %s", c.ClaimID, c.PacketID)
	}
	if err := model.ValidateActID(c.ActID); err != nil {
		return err
	}
	if sharding.ShardOfAct(c.ActID) != c.Shard {
		return model.Invalidf("credit shard %d does not match act_id", c.Shard)
	}
	if !s.Owns(c.Shard) {
		return model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", c.Shard, s.cfg.Name)
	}
	if c.Amount < 1 {
		return model.Invalidf("credit amount must be >= 1")
	}
	return nil
}
