// Package admin is a cell's admin port: the open strategy, the degrade
// switches, the audit of the cell's own books, the shard map as the cell sees
// it, the reward activities (read and reload), and GET /metrics. It is built from those parts (each behind the narrow
// interface it needs), never from the cell's server; it shares no port with
// the public API and trusts only its bearer token.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
)

// Admin errors.
var (
	// ErrAdminDisabled: no admin token is configured, so the admin port refuses everything.
	ErrAdminDisabled = &model.Error{Code: "ADMIN_DISABLED", Message: "no admin token is configured"}
	// ErrUnauthenticated: the bearer token is missing or wrong.
	ErrUnauthenticated = model.ErrUnauthenticated
)

// Strategy reads and switches how the cell runs opens.
type Strategy interface {
	Strategy() api.StrategySetting
	// SetStrategy errors: ErrInvalidArgument.
	SetStrategy(api.StrategySetting) error
}

// Switches reads and sets the degrade switches (cell/degrade.Switches).
type Switches interface {
	Setting() api.DegradeSetting
	// Set errors: ErrInvalidArgument.
	Set(api.DegradeSetting) error
}

// Auditor audits the cell's own books without waiting for an audit that runs
// (cell/audit.Auditor). space is "real", "shadow" or "" for both.
type Auditor interface {
	TryAudit(ctx context.Context, space string) (api.AuditResponse, error)
}

// Activities reads and reloads the reward activities (cell/activity).
type Activities interface {
	Activities() api.ActivitiesResponse
	// ReloadActivities errors: ErrInvalidArgument (the file is invalid;
	// the loaded tree stays), ErrNotFound (no file configured).
	ReloadActivities() (api.ActivitiesResponse, error)
}

// Coupons reads and reloads the coupon batches (cell/couponbatch).
type Coupons interface {
	CouponBatches() api.CouponBatchesResponse
	// ReloadCoupons errors: ErrInvalidArgument (the file is invalid, or a
	// batch would fall below what it issued; the loaded batches stay).
	ReloadCoupons() (api.CouponBatchesResponse, error)
	// SetCoupons errors: ErrInvalidArgument.
	SetCoupons(api.CouponSetting) (api.CouponBatchesResponse, error)
}

// Withdrawals reads and sets the gray release of withdrawals.
type Withdrawals interface {
	WithdrawRelease() api.WithdrawRelease
	// SetWithdrawRelease errors: ErrInvalidArgument.
	SetWithdrawRelease(api.WithdrawRelease) (api.WithdrawRelease, error)
}

// Moves runs the cell's steps of a database move (api.MoveStep).
type Moves interface {
	MovesState(ctx context.Context) (api.MovesState, error)
	// MoveStep errors: ErrInvalidArgument (an unknown op or database),
	// ErrWrongCell (freeze, thaw or release of a database the cell does not
	// own), ErrOverloaded (the freeze did not drain in time; it thawed),
	// ErrDBUnavailable (the ownership could not be saved; nothing changed).
	MoveStep(ctx context.Context, step api.MoveStep) (api.MoveAnswer, error)
}

// Failover switches the cell's database back to its primary after a
// failover (storage.Failover).
type Failover interface {
	// SwitchBack errors: ErrInvalidArgument (the cell serves from its
	// primary, or the primary does not replicate from the standby yet),
	// ErrDBUnavailable (a step failed; the cell serves as before).
	SwitchBack(ctx context.Context) (api.FailoverAnswer, error)
}

// Peers is the cluster's shard map as this cell sees it (sharding/membership.Node).
type Peers interface {
	Map() *sharding.Map
}

// Config is what the admin port is built from. Listen empty: no admin port.
// Token empty: every request but GET /metrics is refused. Peers may be nil.
type Config struct {
	Listen   string        // host:port
	Token    string        // the bearer token every /admin route requires
	Cell     string        // this cell's name
	Shards   func() string // the shard ranges the cell owns now
	Peers    Peers
	Strategy Strategy
	Switches Switches
	Auditor  Auditor
	// Activities may be nil: the activity routes answer NOT_FOUND.
	Activities Activities
	// Withdrawals may be nil: the withdrawal release routes answer NOT_FOUND.
	Withdrawals Withdrawals
	// Coupons may be nil: the coupon batch routes answer NOT_FOUND.
	Coupons Coupons
	// Moves may be nil: the move routes answer NOT_FOUND.
	Moves Moves
	// Failover may be nil (no standby): POST /admin/failover answers NOT_FOUND.
	Failover Failover
	Shadow   ShadowCleanup           // may be nil: POST /admin/shadow/cleanup answers NOT_FOUND
	Metrics  fasthttp.RequestHandler // GET /metrics
	Log      *slog.Logger
}

// Server is the admin port.
type Server struct {
	cfg Config
	ctx context.Context // long work (an audit) stops when it ends
}

// New builds the admin port; it does no I/O.
func New(cfg Config) *Server { return &Server{cfg: cfg, ctx: context.Background()} }

// Serve starts the admin port when one is configured and returns a func that
// stops it. An audit asked for through it runs within ctx (the cell's
// background work, canceled when the cell has drained its public port).
func (s *Server) Serve(ctx context.Context) (stop func(), err error) {
	if s.cfg.Listen == "" {
		return func() {}, nil
	}
	s.ctx = ctx
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return func() {}, fmt.Errorf("cell: admin listen %s: %w", s.cfg.Listen, err)
	}
	// WriteTimeout counts from the end of the handler, so a long audit is fine.
	srv := &fasthttp.Server{Handler: s.Handle, Name: "redcell-admin", MaxRequestBodySize: 64 << 10,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, ErrorHandler: api.ProtocolError,
		Logger: api.Logger{Log: s.cfg.Log}}
	go func() { _ = srv.Serve(ln) }()
	s.cfg.Log.Info("admin port", "addr", ln.Addr().String(), "token_set", s.cfg.Token != "")
	return func() { _ = srv.Shutdown() }, nil
}

// Handle serves one admin request. Every request but GET /metrics requires
// "Authorization: Bearer <Token>"; with no token configured it refuses them all.
func (s *Server) Handle(rc *fasthttp.RequestCtx) {
	// GET /metrics needs no token: a Prometheus scraper should not hold the
	// token that switches strategies, and the counters reveal no user data
	// (no act_ids, no amounts per user). Only GET; anything else goes on to the
	// token check like every /admin route.
	parts, pathOK := api.PathSegments(rc.URI().PathOriginal())
	if rt, _, err := api.MatchAdmin(api.PortCellAdmin, string(rc.Method()), parts); pathOK && err == nil && rt.ID == api.RouteMetrics {
		s.cfg.Metrics(rc)
		return
	}
	if s.cfg.Token == "" {
		writeRefusal(rc, http.StatusForbidden, ErrAdminDisabled)
		return
	}
	got, ok := strings.CutPrefix(string(rc.Request.Header.Peek("Authorization")), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) != 1 {
		writeRefusal(rc, http.StatusUnauthorized, ErrUnauthenticated)
		return
	}
	method := string(rc.Method())
	rt, _, err := api.MatchAdmin(api.PortCellAdmin, method, parts)
	if !pathOK || err != nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "no admin route for %s %s", method, rc.Path()))
		return
	}
	h := routes[rt.ID]
	if h == nil { // a route of the table this port does not serve
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "no admin route for %s %s", method, rc.Path()))
		return
	}
	h(s, rc, rt.ID)
}

// handler serves one admin route; id is the route it was matched to.
type handler func(s *Server, rc *fasthttp.RequestCtx, id api.RouteID)

// routes are the admin port's handlers by route of api's route table
// (api.PortCellAdmin), past the token check. GET /metrics is served before
// it (Handle).
var routes = map[api.RouteID]handler{
	api.RouteStrategyGet:      (*Server).strategyGet,
	api.RouteStrategyPut:      (*Server).strategyPut,
	api.RouteDegradeGet:       (*Server).degradeGet,
	api.RouteDegradePut:       (*Server).degradePut,
	api.RouteAudit:            (*Server).audit,
	api.RouteShards:           func(s *Server, rc *fasthttp.RequestCtx, _ api.RouteID) { s.writeJSON(rc, s.shardMap()) },
	api.RouteShadowCleanup:    func(s *Server, rc *fasthttp.RequestCtx, _ api.RouteID) { s.shadowCleanup(rc) },
	api.RouteMovesGet:         (*Server).moves,
	api.RouteMovesPost:        (*Server).moves,
	api.RouteFailoverPost:     (*Server).failover,
	api.RouteActivities:       (*Server).activities,
	api.RouteActivitiesReload: (*Server).activities,
	api.RouteCouponBatches:    (*Server).coupons,
	api.RouteCouponsReload:    (*Server).coupons,
	api.RouteCouponsPut:       (*Server).coupons,
	api.RouteWithdrawGet:      (*Server).withdraw,
	api.RouteWithdrawPut:      (*Server).withdraw,
}

// strategyGet answers the open strategy in force.
func (s *Server) strategyGet(rc *fasthttp.RequestCtx, _ api.RouteID) {
	s.writeJSON(rc, s.cfg.Strategy.Strategy())
}

// strategyPut changes the open strategy: the body's fields over the
// current ones.
func (s *Server) strategyPut(rc *fasthttp.RequestCtx, _ api.RouteID) {
	st := s.cfg.Strategy.Strategy()
	if err := json.Unmarshal(rc.PostBody(), &st); err != nil {
		s.writeErr(rc, model.Invalidf("malformed JSON body"))
		return
	}
	if err := s.cfg.Strategy.SetStrategy(st); err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, s.cfg.Strategy.Strategy())
}

// degradeGet answers the degrade switches.
func (s *Server) degradeGet(rc *fasthttp.RequestCtx, _ api.RouteID) {
	s.writeJSON(rc, s.cfg.Switches.Setting())
}

// degradePut sets the degrade switches the body names.
func (s *Server) degradePut(rc *fasthttp.RequestCtx, _ api.RouteID) {
	set := func(d api.DegradeSetting) (struct{}, error) { return struct{}{}, s.cfg.Switches.Set(d) }
	if _, ok := putBody(s, rc, set); ok {
		s.writeJSON(rc, s.cfg.Switches.Setting())
	}
}

// audit runs the cell's audit: both spaces, or the one ?space= names
// (real, shadow). It answers when the audit is done (it reads every money
// row, so it may take minutes on a large cell); a failed audit is still
// 200, with "ok": false and its problems.
func (s *Server) audit(rc *fasthttp.RequestCtx, _ api.RouteID) {
	rep, err := s.cfg.Auditor.TryAudit(s.ctx, string(rc.QueryArgs().Peek("space")))
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, rep)
}

// failover switches the cell's database back to its primary (op
// "switchback"). 404 without a standby.
func (s *Server) failover(rc *fasthttp.RequestCtx, _ api.RouteID) {
	if s.cfg.Failover == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell's database has no standby"))
		return
	}
	var step api.FailoverStep
	if err := strictjson.Decode(rc.PostBody(), &step); err != nil {
		s.writeErr(rc, err)
		return
	}
	if step.Op != "switchback" {
		s.writeErr(rc, model.Invalidf("unknown op %q (switchback)", step.Op))
		return
	}
	ans, err := s.cfg.Failover.SwitchBack(s.ctx)
	if err != nil && ans.Serving == "" {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, ans)
}

// activities answers the reward activities loaded, or reloads them
// (RouteActivitiesReload; a file that does not load leaves the loaded
// ones). 404 without activities.
func (s *Server) activities(rc *fasthttp.RequestCtx, id api.RouteID) {
	if s.cfg.Activities == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell runs no reward activities"))
		return
	}
	if id == api.RouteActivities {
		s.writeJSON(rc, s.cfg.Activities.Activities())
		return
	}
	reload(s, rc, "activities", s.cfg.Activities.ReloadActivities, func(a api.ActivitiesResponse) (string, string) { return a.Path, a.Version })
}

// reload answers a reload of a file the cell loads (what names it in the
// logs): the new file's description, or, when it does not load, the error,
// the loaded one staying.
func reload[T any](s *Server, rc *fasthttp.RequestCtx, what string, load func() (T, error), of func(T) (path, version string)) {
	got, err := load()
	if err != nil {
		s.cfg.Log.Warn(what+" reload refused; the loaded ones stay", "err", err)
		s.writeErr(rc, err)
		return
	}
	path, version := of(got)
	s.cfg.Log.Info(what+" reloaded", "path", path, "version", version)
	s.writeJSON(rc, got)
}

// coupons answers the coupon batches loaded, sets the merge bound
// (RouteCouponsPut) or reloads the batches (RouteCouponsReload; a file
// that does not load leaves the loaded ones). 404 without coupons.
func (s *Server) coupons(rc *fasthttp.RequestCtx, id api.RouteID) {
	if s.cfg.Coupons == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell runs no coupon batches"))
		return
	}
	switch id {
	case api.RouteCouponBatches:
		s.writeJSON(rc, s.cfg.Coupons.CouponBatches())
	case api.RouteCouponsPut:
		if c, ok := putBody(s, rc, s.cfg.Coupons.SetCoupons); ok {
			s.cfg.Log.Info("coupon merge bound set", "merge_max", c.MergeMax)
			s.writeJSON(rc, c)
		}
	default:
		reload(s, rc, "coupon batches", s.cfg.Coupons.ReloadCoupons, func(c api.CouponBatchesResponse) (string, string) { return c.Path, c.Version })
	}
}

// withdraw answers the gray release of withdrawals, or sets it
// (RouteWithdrawPut). 404 without withdrawals.
func (s *Server) withdraw(rc *fasthttp.RequestCtx, id api.RouteID) {
	if s.cfg.Withdrawals == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell runs no withdrawals"))
		return
	}
	if id == api.RouteWithdrawGet {
		s.writeJSON(rc, s.cfg.Withdrawals.WithdrawRelease())
		return
	}
	if got, ok := putBody(s, rc, s.cfg.Withdrawals.SetWithdrawRelease); ok {
		s.writeJSON(rc, got)
	}
}

// putBody decodes rc's body strictly (cell/strictjson) into a T and hands
// it to set; a body that does not decode, or an error of set, is answered
// here and ok is false.
func putBody[T, R any](s *Server, rc *fasthttp.RequestCtx, set func(T) (R, error)) (out R, ok bool) {
	var in T
	if err := strictjson.Decode(rc.PostBody(), &in); err != nil {
		s.writeErr(rc, err)
		return out, false
	}
	out, err := set(in)
	if err != nil {
		s.writeErr(rc, err)
		return out, false
	}
	return out, true
}

// shardMap is the answer of GET /admin/shards: the shards this cell owns and
// the cluster's shard map as this cell sees it through memberlist.
func (s *Server) shardMap() api.ShardMapResponse {
	out := api.ShardMapResponse{Cell: s.cfg.Cell, Shards: s.cfg.Shards(), Cells: []api.ShardMapCell{}}
	if s.cfg.Peers == nil {
		return out
	}
	m := s.cfg.Peers.Map()
	if m == nil {
		return out
	}
	out.Version, out.Uncovered = m.Version, m.Uncovered()
	for _, c := range m.Cells() {
		out.Cells = append(out.Cells, api.ShardMapCell{Name: c.Name, Addr: c.Addr, Shards: c.Shards.String(), StartedMS: c.Started})
	}
	return out
}

func (s *Server) writeJSON(rc *fasthttp.RequestCtx, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.writeErr(rc, fmt.Errorf("cell: encode answer: %w", err))
		return
	}
	rc.SetStatusCode(http.StatusOK)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(api.HeaderCell, s.cfg.Cell)
	rc.SetBody(b)
}

// writeErr answers err through api.WriteError (its code in api.HeaderCode).
func (s *Server) writeErr(rc *fasthttp.RequestCtx, err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		err = model.ErrTimeout
	}
	if code, _ := model.CodeOf(err); api.Status(code) >= 500 {
		s.cfg.Log.Warn("admin request failed", "path", string(rc.Path()), "err", err)
	}
	api.WriteError(rc, err)
	rc.Response.Header.Set(api.HeaderCell, s.cfg.Cell)
}

// writeRefusal answers a request the token check refused, with status (the
// code ADMIN_DISABLED has no status of its own in the table).
func writeRefusal(rc *fasthttp.RequestCtx, status int, e *model.Error) {
	api.WriteErrorStatus(rc, status, e)
}

// movesStateWait bounds how long GET /admin/moves waits for a move step
// under way before it answers TIMEOUT.
const movesStateWait = 20 * time.Second

// moves serves GET and POST /admin/moves.
func (s *Server) moves(rc *fasthttp.RequestCtx, rt api.RouteID) {
	if s.cfg.Moves == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell does not take part in moves"))
		return
	}
	if rt == api.RouteMovesGet {
		ctx, cancel := context.WithTimeout(s.ctx, movesStateWait)
		defer cancel()
		st, err := s.cfg.Moves.MovesState(ctx)
		if err != nil {
			s.writeErr(rc, err)
			return
		}
		s.writeJSON(rc, st)
		return
	}
	var step api.MoveStep
	if err := strictjson.Decode(rc.PostBody(), &step); err != nil {
		s.writeErr(rc, err)
		return
	}
	ans, err := s.cfg.Moves.MoveStep(s.ctx, step)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, ans)
}
