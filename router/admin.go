package router

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
	"redcell/router/apikey"
	"redcell/router/rules"
)

// ErrAdminDisabled answers every admin route but /metrics when the router has
// no admin token (403 ADMIN_DISABLED).
var ErrAdminDisabled = &model.Error{Code: "ADMIN_DISABLED", Message: "admin routes are disabled: no admin_token is configured"}

// KeyRequest is the body of POST /admin/keys: the app a new key is for and
// the scopes it grants (apikey.Scopes; "all" is not taken here).
type KeyRequest struct {
	App    string         `json:"app"`
	Scopes []apikey.Scope `json:"scopes"`
}

// KeyResponse answers POST /admin/keys: the entry and the key itself, which
// is shown this once and stored nowhere.
type KeyResponse struct {
	apikey.Key
	APIKey string `json:"api_key"`
}

// KeysResponse answers GET /admin/keys: every entry of the key file, revoked
// ones included, without hashes.
type KeysResponse struct {
	Keys []apikey.Key `json:"keys"`
}

// handleAdmin serves the admin port: GET /metrics without a token (a scraper
// should not hold the token that makes keys), and with
// "Authorization: Bearer <admin_token>" GET and POST /admin/keys and DELETE
// /admin/keys/{id}. Without a configured token every admin route is 403
// ADMIN_DISABLED; a missing or wrong token is 401 UNAUTHENTICATED (compared in
// constant time).
func (r *Router) handleAdmin(rc *fasthttp.RequestCtx) {
	path, method := string(rc.Path()), string(rc.Method())
	parts, pathOK := api.PathSegments(rc.URI().PathOriginal())
	rt, params, err := api.MatchAdmin(api.PortRouterAdmin, method, parts)
	matched := pathOK && err == nil
	if matched && rt.ID == api.RouteMetrics {
		r.metrics.serve(rc)
		return
	}
	if r.cfg.AdminToken == "" {
		r.writeAdminErr(rc, http.StatusForbidden, ErrAdminDisabled)
		return
	}
	tok := bearer(&rc.Request.Header)
	if tok == nil || subtle.ConstantTimeCompare(tok, []byte(r.cfg.AdminToken)) != 1 {
		r.writeAdminErr(rc, http.StatusUnauthorized, model.Errorf(model.ErrUnauthenticated, "admin routes need Authorization: Bearer <admin_token>"))
		return
	}
	if !matched {
		r.writeErr(rc, model.Errorf(model.ErrNotFound, "no admin route for %s %s", method, path))
		return
	}
	h, ok := adminHandlers[rt.ID]
	if !ok { // a route of the table this port does not serve
		r.writeErr(rc, model.Errorf(model.ErrNotFound, "no admin route for %s %s", method, path))
		return
	}
	h(r, rc, rt, params)
}

// adminHandler serves one admin route once handleAdmin has checked the
// token; rt is the route matched and params its path's parameters.
type adminHandler func(r *Router, rc *fasthttp.RequestCtx, rt api.Route, params api.Params)

// adminHandlers are the admin routes the router serves behind the token, by
// route.
var adminHandlers = map[api.RouteID]adminHandler{
	api.RouteKeysList:    (*Router).adminKeysList,
	api.RouteKeysAdd:     (*Router).adminKeysAdd,
	api.RouteKeysRevoke:  (*Router).adminKeysRevoke,
	api.RouteCellsGet:    (*Router).adminCells,
	api.RouteCellsPost:   (*Router).adminCells,
	api.RouteRulesGet:    (*Router).adminRules,
	api.RouteRulesReload: (*Router).adminRules,
}

// adminKeysList serves GET /admin/keys: every entry of the key file.
func (r *Router) adminKeysList(rc *fasthttp.RequestCtx, _ api.Route, _ api.Params) {
	keys, err := r.keys.List()
	if err != nil {
		r.adminFailed(rc, err)
		return
	}
	if keys == nil {
		keys = []apikey.Key{}
	}
	r.writeAdminJSON(rc, KeysResponse{Keys: keys})
}

// adminKeysAdd serves POST /admin/keys: makes a key and answers it once.
func (r *Router) adminKeysAdd(rc *fasthttp.RequestCtx, _ api.Route, _ api.Params) {
	var req KeyRequest
	if err := decodeAdmin(rc, &req); err != nil {
		r.writeErr(rc, err)
		return
	}
	key, k, err := r.keys.Add(req.App, req.Scopes, time.Now())
	if err != nil {
		r.adminFailed(rc, err)
		return
	}
	r.log.Info("API key added", "id", k.ID, "app", k.App, "scopes", k.Scopes)
	r.writeAdminJSON(rc, KeyResponse{Key: k, APIKey: key})
}

// adminKeysRevoke serves DELETE /admin/keys/{id}.
func (r *Router) adminKeysRevoke(rc *fasthttp.RequestCtx, _ api.Route, params api.Params) {
	k, err := r.keys.Revoke(params.Key, time.Now())
	if err != nil {
		r.adminFailed(rc, err)
		return
	}
	r.log.Info("API key revoked", "id", k.ID, "app", k.App)
	r.writeAdminJSON(rc, k)
}

// adminCells serves GET /admin/cells (the last change of the cells) and
// POST /admin/cells (starts one: add or remove a cell, move a database);
// 404 when the router runs no cluster changes.
func (r *Router) adminCells(rc *fasthttp.RequestCtx, rt api.Route, _ api.Params) {
	if r.cfg.Cells == nil {
		r.writeErr(rc, model.Errorf(model.ErrNotFound, "this router runs no cluster changes"))
		return
	}
	if rt.ID == api.RouteCellsGet {
		r.writeAdminJSON(rc, r.cfg.Cells.Job())
		return
	}
	var req api.CellsRequest
	if err := decodeAdmin(rc, &req); err != nil {
		r.writeErr(rc, err)
		return
	}
	job, err := r.cfg.Cells.Start(req)
	if err != nil {
		r.writeErr(rc, err)
		return
	}
	r.log.Info("cluster change started", "op", req.Op, "name", req.Name, "db", req.DB, "to", req.To)
	r.writeAdminJSON(rc, job)
}

// adminRules serves GET /admin/rules and POST /admin/rules/reload (which
// reads the rules file again first); 404 when the router has no rules file.
func (r *Router) adminRules(rc *fasthttp.RequestCtx, rt api.Route, _ api.Params) {
	if r.rules == nil {
		r.writeErr(rc, model.Errorf(model.ErrNotFound, "this router has no rules file (router.rules_file)"))
		return
	}
	if rt.ID == api.RouteRulesReload {
		changed, err := r.rules.Reload()
		if err != nil {
			r.log.Warn("rules reload refused; the rules in force stay", "err", err)
			// The table in force stays; the answer says why the file was refused.
			r.writeErr(rc, model.Invalidf("%v (the rules in force stay)", err))
			return
		}
		r.log.Info("rules reloaded", "changed", changed, "version", r.rules.Table().Version)
	}
	r.writeAdminJSON(rc, RulesResponse{File: r.rules.Path(), Summary: r.rules.Table().Summary(ruleRoutes), LastError: r.rules.LastError()})
}

// RulesResponse answers GET /admin/rules and POST /admin/rules/reload: the
// rules file, the table in force (degrade switches below 100 %, answers
// dropped per route, the rules with the requests each refused since the
// table was loaded) and the last load's error ("" when it went well; the
// watch of the file reports there too).
type RulesResponse struct {
	File string `json:"file"`
	rules.Summary
	LastError string `json:"last_error"`
}

// decodeAdmin decodes a JSON admin body strictly into v.
func decodeAdmin(rc *fasthttp.RequestCtx, v any) error {
	if !api.MediaTypeJSON(rc.Request.Header.ContentType()) {
		return errMediaType
	}
	dec := json.NewDecoder(strings.NewReader(string(rc.PostBody())))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return model.Invalidf("the body must be one JSON object of the documented fields")
	}
	return nil
}

// adminFailed answers an error of the key file: an error with a code (a bad
// request, an unknown id) as it is; anything else, which the file's I/O
// returns, as 500 INTERNAL, logged.
func (r *Router) adminFailed(rc *fasthttp.RequestCtx, err error) {
	if code, _ := model.CodeOf(err); code == model.ErrInternal.Code {
		r.log.Error("API key file", "err", err)
	}
	r.writeErr(rc, err)
}

func (r *Router) writeAdminJSON(rc *fasthttp.RequestCtx, v any) {
	b, _ := json.Marshal(v)
	rc.SetStatusCode(http.StatusOK)
	rc.SetContentType("application/json")
	rc.SetBody(b)
}

func (r *Router) writeAdminErr(rc *fasthttp.RequestCtx, status int, err error) {
	api.WriteErrorStatus(rc, status, err)
}
