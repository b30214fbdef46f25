package cell

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
)

// Admin errors.
var (
	// ErrAdminDisabled: no admin token is configured, so the admin port refuses everything.
	ErrAdminDisabled = &model.Error{Code: "ADMIN_DISABLED", Message: "no admin token is configured"}
	// ErrUnauthenticated: the bearer token is missing or wrong.
	ErrUnauthenticated = model.ErrUnauthenticated
)

// Strategy returns how opens run now.
func (s *Server) Strategy() api.StrategySetting { return *s.strategy.Load() }

// SetStrategy switches how opens run, for opens that start from now on: the
// strategy (naive, serial, batched), the batch size and the batch wait. Opens
// already queued run under the new batch settings. Errors: ErrInvalidArgument.
func (s *Server) SetStrategy(st api.StrategySetting) error {
	switch st.Strategy {
	case StrategyNaive, StrategySerial, StrategyBatched:
	default:
		return model.Invalidf("strategy must be naive, serial or batched")
	}
	if st.BatchMax < 1 || st.BatchMax > 4096 || st.BatchWaitMS < 0 || st.BatchWaitMS > 1000 {
		return model.Invalidf("batch_max must be 1..4096 and batch_wait_ms 0..1000")
	}
	batch, wait := st.BatchMax, time.Duration(st.BatchWaitMS)*time.Millisecond
	if st.Strategy != StrategyBatched {
		batch, wait = 1, 0 // serial: one open per transaction; naive bypasses the queue
	}
	s.queue.SetBatch(batch, wait)
	s.strategy.Store(&st)
	s.log.Info("open strategy set", "strategy", st.Strategy, "batch_max", st.BatchMax, "batch_wait_ms", st.BatchWaitMS)
	return nil
}

// serveAdmin starts the admin port when one is configured; the returned func
// stops it. The admin port requires "Authorization: Bearer <AdminToken>" on every
// request but GET /metrics; with no token configured it refuses everything else.
func (s *Server) serveAdmin() (stop func(), err error) {
	if s.cfg.AdminListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		return func() {}, fmt.Errorf("cell: admin listen %s: %w", s.cfg.AdminListen, err)
	}
	// WriteTimeout counts from the end of the handler, so a long audit is fine.
	s.admin = &fasthttp.Server{Handler: s.handleAdmin, Name: "redcell-admin", MaxRequestBodySize: 64 << 10,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, ErrorHandler: api.ProtocolError,
		Logger: api.Logger{Log: s.log}}
	go func() { _ = s.admin.Serve(ln) }()
	s.log.Info("admin port", "addr", ln.Addr().String(), "token_set", s.cfg.AdminToken != "")
	return func() { _ = s.admin.Shutdown() }, nil
}

func (s *Server) handleAdmin(rc *fasthttp.RequestCtx) {
	// GET /metrics needs no token: a Prometheus scraper should not hold the
	// token that switches strategies, and the counters reveal no user data
	// (no act_ids, no amounts per user). Only GET; anything else goes on to the
	// token check like every /admin route.
	if string(rc.Path()) == "/metrics" && string(rc.Method()) == http.MethodGet {
		s.metrics.serve(rc)
		return
	}
	if s.cfg.AdminToken == "" {
		s.writeAdminErr(rc, http.StatusForbidden, ErrAdminDisabled)
		return
	}
	got, ok := strings.CutPrefix(string(rc.Request.Header.Peek("Authorization")), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.AdminToken)) != 1 {
		s.writeAdminErr(rc, http.StatusUnauthorized, ErrUnauthenticated)
		return
	}
	switch path, method := string(rc.Path()), string(rc.Method()); {
	case path == "/admin/strategy" && method == http.MethodGet:
		s.writeJSON(rc, http.StatusOK, s.Strategy())
	case path == "/admin/strategy" && method == http.MethodPut:
		st := s.Strategy()
		if err := json.Unmarshal(rc.PostBody(), &st); err != nil {
			s.writeErr(rc, model.Invalidf("malformed JSON body"))
			return
		}
		if err := s.SetStrategy(st); err != nil {
			s.writeErr(rc, err)
			return
		}
		s.writeJSON(rc, http.StatusOK, s.Strategy())
	case path == "/admin/degrade" && method == http.MethodGet:
		s.writeJSON(rc, http.StatusOK, s.Degraded())
	case path == "/admin/degrade" && method == http.MethodPut:
		var d api.DegradeSetting
		if err := decodeStrict(rc.PostBody(), &d); err != nil {
			s.writeErr(rc, err)
			return
		}
		if err := s.SetDegrade(d); err != nil {
			s.writeErr(rc, err)
			return
		}
		s.writeJSON(rc, http.StatusOK, s.Degraded())
	case path == "/admin/audit" && method == http.MethodPost:
		s.adminAudit(rc)
	case path == "/admin/shards" && method == http.MethodGet:
		s.writeJSON(rc, http.StatusOK, s.shardMap())
	default:
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "no admin route for %s %s", method, path))
	}
}

// adminAudit runs the audit of the cell's own books now: both spaces, or the
// one ?space= names (real, shadow). It answers when the audit is done (it
// reads every money row, so it may take minutes on a large cell); a failed
// audit is still 200, with "ok": false and its problems.
func (s *Server) adminAudit(rc *fasthttp.RequestCtx) {
	spaces := s.spaces[:]
	switch v := string(rc.QueryArgs().Peek("space")); v {
	case "":
	case "real":
		spaces = s.spaces[:1]
	case "shadow":
		spaces = s.spaces[1:]
	default:
		s.writeErr(rc, model.Invalidf("space must be real or shadow, got %q", v))
		return
	}
	// One audit at a time, and none queued behind it: a second request is
	// told to come back rather than hold an admin connection for minutes.
	if !s.auditor.mu.TryLock() {
		s.writeErr(rc, model.Errorf(model.ErrOverloaded, "an audit of this cell is running; retry when it is done"))
		return
	}
	defer s.auditor.mu.Unlock()
	rep, err := s.audit(s.bgContext(), spaces...)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, http.StatusOK, rep)
}

func (s *Server) writeAdminErr(rc *fasthttp.RequestCtx, status int, e *model.Error) {
	b, _ := json.Marshal(api.ErrorBody{Error: api.ErrorDetail{Code: e.Code, Message: e.Message}})
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(b)
}

// shardMap is the answer of GET /admin/shards: the shards this cell owns and
// the cluster's shard map as this cell sees it through memberlist.
func (s *Server) shardMap() api.ShardMapResponse {
	out := api.ShardMapResponse{Cell: s.cfg.Name, Shards: s.cfg.Shards.String(), Cells: []api.ShardMapCell{}}
	if s.peers == nil {
		return out
	}
	m := s.peers.Map()
	if m == nil {
		return out
	}
	out.Version, out.Uncovered = m.Version, m.Uncovered()
	for _, c := range m.Cells() {
		out.Cells = append(out.Cells, api.ShardMapCell{Name: c.Name, Addr: c.Addr, Shards: c.Shards.String(), StartedMS: c.Started})
	}
	return out
}
