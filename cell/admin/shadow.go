package admin

import (
	"context"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
)

// ShadowCleanup drops the cell's shadow space: the stress traffic's shadow
// databases of the databases it owns (the cell's shadow cleaner).
type ShadowCleanup interface {
	// CleanShadow drops them, holding stress traffic off meanwhile, and
	// answers what it dropped; again with nothing left, it drops nothing.
	// Errors: ErrNotFound (the cell has no shadow databases it can drop),
	// ErrOverloaded (stress requests, the shadow relay or an audit did not
	// finish in time; nothing was dropped), or the database's.
	CleanShadow(ctx context.Context) (api.ShadowCleanupResponse, error)
}

// shadowCleanup serves POST /admin/shadow/cleanup. It answers when the drop
// is done (seconds: it waits for the stress requests and relay deliveries in
// flight, then drops); the cell logs what it dropped.
func (s *Server) shadowCleanup(rc *fasthttp.RequestCtx) {
	if s.cfg.Shadow == nil {
		s.writeErr(rc, model.Errorf(model.ErrNotFound, "this cell has no shadow databases it can drop"))
		return
	}
	out, err := s.cfg.Shadow.CleanShadow(s.ctx)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	s.writeJSON(rc, out)
}
